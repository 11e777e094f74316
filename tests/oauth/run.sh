#!/usr/bin/env bash
# OAuth run (issue 14): a real authorization server (oidc-provider, pinned) issues JWT access
# tokens with client_credentials + resource indicators; the TypeScript SDK 1.32.2 client gets them
# through its own OAuth support (discovering taskgate's RFC 9728 metadata from the 401) and reaches
# a task server (tests/interop/task-server.mjs) through taskgate in `[auth] mode = "oauth"`.
#
#   tests/oauth/run.sh TASKGATE_BIN        e.g. tests/oauth/run.sh target/debug/taskgate
#
# Needs node + npm: `npm ci` runs here (and in tests/interop, for the task server) when
# node_modules is missing; Node 22 from tests/interop/node_modules is used when present.
# Everything listens on 127.0.0.1; every process started here stops on exit. Exit 0 only when
# every check passed.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
INTEROP="$HERE/../interop"
BIN=${1:?usage: $0 TASKGATE_BIN}
[[ "$BIN" == /* ]] || BIN="$PWD/$BIN"
[[ -x "$BIN" ]] || { echo "taskgate binary not found: $BIN" >&2; exit 2; }

for dir in "$HERE" "$INTEROP"; do
    if [[ ! -d "$dir/node_modules" ]]; then
        (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error) || exit 1
    fi
done
NODE=node
[[ -x "$INTEROP/node_modules/node/bin/node" ]] && NODE="$INTEROP/node_modules/node/bin/node"

WORK=$(mktemp -d /tmp/taskgate-oauth.XXXXXX)
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null; done
}
trap cleanup EXIT

# first_line NAME: the first stdout line of NAME, once written (30 s at most).
first_line() {
    local name=$1 deadline=$((SECONDS + 30))
    until [[ -s "$WORK/$name.out" ]]; do
        if (( SECONDS > deadline )); then
            echo "$name did not start; its stderr:" >&2; cat "$WORK/$name.err" >&2; exit 1
        fi
        sleep 0.1
    done
    head -n1 "$WORK/$name.out"
}
# start NAME CMD...: runs CMD in the background, stdout to $WORK/NAME.out; stopped on exit.
start() {
    local name=$1; shift
    "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" </dev/null &
    PIDS+=($!)
}

start tasks "$NODE" "$INTEROP/task-server.mjs" --mode stateful --port 0
UP=$(first_line tasks | sed -E 's/.*"listening":"([^"]+)".*/\1/')
GW_PORT=$("$NODE" -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})')
RESOURCE="http://127.0.0.1:$GW_PORT/mcp"
start idp "$NODE" "$HERE/idp.mjs" --resource "$RESOURCE"
ISSUER=$(first_line idp | sed -E 's/.*"issuer":"([^"]+)".*/\1/')

cat >"$WORK/taskgate.toml" <<TOML
[gateway]
listen = "127.0.0.1:$GW_PORT"
[admin]
listen = "127.0.0.1:0"
[store]
path = "$WORK/store"
[auth]
mode = "oauth"
[auth.oauth]
issuer = "$ISSUER"
audience = "$RESOURCE"
required_scopes = ["mcp"]
[limits]
requests_per_second = 200
max_in_flight = 32
[[upstream]]
name = "default"
url = "$UP"
TOML
start taskgate "$BIN" serve --config "$WORK/taskgate.toml"
deadline=$((SECONDS + 30))
ready='fetch(process.argv[1]).then(r => process.exit(r.ok ? 0 : 1), () => process.exit(1))'
until "$NODE" -e "$ready" "http://127.0.0.1:$GW_PORT/.well-known/oauth-protected-resource"; do
    (( SECONDS > deadline )) && { echo "taskgate did not start:" >&2; cat "$WORK/taskgate.err" >&2; exit 1; }
    sleep 0.1
done

echo "== oauth: oidc-provider at $ISSUER, taskgate at $RESOURCE, task server at $UP"
"$NODE" "$HERE/client.mjs" --url "$RESOURCE" --issuer "$ISSUER" | tee "$WORK/client.json"
status=${PIPESTATUS[0]}
if [[ $status != 0 ]]; then
    echo "== oauth run FAILED; logs in $WORK" >&2
    tail -n 20 "$WORK/taskgate.out" "$WORK/taskgate.err" "$WORK/idp.err" >&2
else
    rm -rf "$WORK"
fi
exit "$status"
