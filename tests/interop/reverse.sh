#!/usr/bin/env bash
# The reverse bridge (issue 33): a 2026-07-28 client on a 2025-11-25 task server, direct and
# through taskgate. run.sh calls it (step j); it also runs alone:
#
#   tests/interop/reverse.sh TASKGATE_BIN      direct (recorded, never required), then through
#                                              taskgate (auth none) and taskgate (bearer, two principals)
#   tests/interop/reverse.sh none              direct only
#
# Upstream: task-server.mjs --mode stateful (TypeScript SDK 1.32.2, 2025-11-25 tasks, sessions),
# one process per route. Client: reverse-client.mjs (raw 2026-07-28 wire, 12 steps: discover, the
# tasks extension offered, tools/list, a plain call, a task call, polls to completed, the result
# inline, a tool error's content kept, cancel acked, the task cancelled, the cancel of a terminal
# task acked). Directly the server refuses every stateless request (no Mcp-Session-Id): the
# direct count is written to DIR/reverse/counts.txt and not required. Through taskgate every step
# must pass; with bearer auth the client also checks that a second principal
# (--foreign-bearer) gets -32602 for the first one's task on tasks/get and tasks/cancel.
#
# Results: DIR/reverse/results.txt, `PASS|FAIL step` lines; exit 0 only when all passed.
# Environment: INTEROP_WORK=DIR (logs; default a new /tmp dir).
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BIN=${1:-}
if [[ -z "$BIN" ]]; then
    echo "usage: $0 TASKGATE_BIN|none" >&2
    exit 2
fi
if [[ "$BIN" != none ]]; then
    [[ "$BIN" == /* ]] || BIN="$PWD/$BIN"
    [[ -x "$BIN" ]] || {
        echo "taskgate binary not found or not executable: $BIN" >&2
        exit 2
    }
fi
WORK=${INTEROP_WORK:-$(mktemp -d /tmp/taskgate-interop-reverse.XXXXXX)}
WORK="$WORK/reverse"
mkdir -p "$WORK"
NODE22="$HERE/node_modules/node/bin/node"
[[ -x "$NODE22" ]] || NODE22=$(command -v node)
: >"$WORK/results.txt"
: >"$WORK/counts.txt"

# shellcheck source=procs.sh
source "$HERE/procs.sh"

ROUTES=(direct)
[[ "$BIN" != none ]] && ROUTES+=(via bearer)
for route in "${ROUTES[@]}"; do
    start "ts-$route" "$NODE22" "$HERE/task-server.mjs" --mode stateful --port 0
done
for route in "${ROUTES[@]}"; do
    wait_ready "ts-$route" 30 || exit 1
done
declare -A URL=()
URL[direct]=$(field ts-direct listening)

config() { # config NAME AUTH_BLOCK UPSTREAM_URL
    printf '[gateway]\nlisten = "127.0.0.1:0"\ndrain_timeout_ms = 1000\n\n[admin]\nlisten = "127.0.0.1:0"\n\n'
    printf '[store]\npath = "%s"\n\n%s\n' "$WORK/$1-store" "$2"
    printf '[[upstream]]\nname = "ts"\nurl = "%s"\n' "$3"
}
TOKEN_A=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
TOKEN_B=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
if [[ "$BIN" != none ]]; then
    config taskgate-none $'[auth]\nmode = "none"\n' "$(field ts-via listening)" >"$WORK/taskgate-none.toml"
    config taskgate-bearer "$(printf '[auth]\nmode = "bearer"\n\n[[auth.token]]\nprincipal = "alice"\nsha256 = "%s"\n\n[[auth.token]]\nprincipal = "bob"\nsha256 = "%s"\n' \
        "$(printf %s "$TOKEN_A" | sha256sum | cut -d' ' -f1)" "$(printf %s "$TOKEN_B" | sha256sum | cut -d' ' -f1)")" \
        "$(field ts-bearer listening)" >"$WORK/taskgate-bearer.toml"
    start taskgate-none "$BIN" serve --config "$WORK/taskgate-none.toml"
    start taskgate-bearer "$BIN" serve --config "$WORK/taskgate-bearer.toml"
    wait_ready taskgate-none 60 || exit 1
    wait_ready taskgate-bearer 60 || exit 1
    URL[via]="http://$(field taskgate-none listening.gateway)/mcp/ts"
    URL[bearer]="http://$(field taskgate-bearer listening.gateway)/mcp/ts"
fi

for route in "${ROUTES[@]}"; do
    args=("${URL[$route]}" --label "reverse $route" --json "$WORK/client-$route.json")
    [[ $route == bearer ]] && args+=(--bearer "$TOKEN_A" --foreign-bearer "$TOKEN_B")
    log "reverse-client: $route ${URL[$route]}"
    run_fg timeout 120 "$NODE22" "$HERE/reverse-client.mjs" "${args[@]}" >"$WORK/client-$route.log" 2>&1
    rc=$?
    sed 's/^/  /' "$WORK/client-$route.log"
    echo "$(tail -n 1 "$WORK/client-$route.log")" >>"$WORK/counts.txt"
    # Directly the 2025-11-25 server cannot serve a 2026-07-28 client: recorded, not required.
    [[ $route == direct ]] || result "reverse-client (2026-07-28 client, TS SDK 1.32.2 task server) $route" $rc
done

for name in "${!PID[@]}"; do
    if ! kill -0 "${PID[$name]}" 2>/dev/null; then
        echo "FAIL $name exited during the run; stderr tail:"
        tail -n 20 "$WORK/$name.err"
        result "$name still running" 1
    fi
done
echo
echo "== reverse bridge (issue 33) =="
cat "$WORK/counts.txt"
cat "$WORK/results.txt"
exit $STATUS
