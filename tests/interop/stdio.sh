#!/usr/bin/env bash
# stdio upstreams (issue 31): real MCP servers started by taskgate as `command` children, reached
# through taskgate with Streamable HTTP clients. run.sh calls it (step stdio); it also runs alone:
#
#   tests/interop/stdio.sh TASKGATE_BIN
#
# Upstreams of one taskgate (auth none):
#   ts-http      task-server.mjs --mode stateful over HTTP (the reference run)
#   ts-stdio     task-server.mjs --mode stdio (TypeScript SDK 1.32.2, StdioServerTransport)
#   ts-kill      the same, for the kill -9 step
#   py-stdio     py_task_server.py --stdio (Python mcp 1.30.0; skipped with INTEROP_SKIP_PYTHON=1)
#   everything   @modelcontextprotocol/server-everything 2026.8.31 in stdio mode
# Steps (each must pass):
#   stdio-ts-client       task-client.mjs on ts-stdio; its checks equal the ts-http run's, check
#                         by check (the 2025 task lifecycle through taskgate is the same over stdio)
#   stdio-py-client       py_task_client.py on py-stdio, and task-client.mjs on py-stdio
#   stdio-everything      stdio-check.mjs everything: tools, a plain call, a task to its end
#   stdio-killed          stdio-check.mjs killed: the child killed mid-task → task failed, restart
#   stdio-no-orphans      after SIGTERM to taskgate, none of its children is left
#
# Results: DIR/stdio/results.txt, one `PASS|FAIL step` line each; exit 0 only when all passed.
# Environment: INTEROP_WORK=DIR (logs; default a new /tmp dir), INTEROP_SKIP_PYTHON=1,
# INTEROP_VENV=DIR (the Python venv run.sh makes; default tests/interop/.venv).
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BIN=${1:-}
if [[ -z "$BIN" || "$BIN" == none ]]; then
    echo "stdio.sh needs a taskgate binary (there is no direct run of a stdio upstream)" >&2
    exit 0
fi
[[ "$BIN" == /* ]] || BIN="$PWD/$BIN"
WORK=${INTEROP_WORK:-$(mktemp -d /tmp/taskgate-interop-stdio.XXXXXX)}
WORK="$WORK/stdio"
mkdir -p "$WORK"
NODE=$(command -v node)
[[ -x "$HERE/node_modules/node/bin/node" ]] && NODE="$HERE/node_modules/node/bin/node"
VENV=${INTEROP_VENV:-$HERE/.venv}
PYTHON_ON=1
[[ "${INTEROP_SKIP_PYTHON:-0}" == 1 || ! -x "$VENV/bin/python" ]] && PYTHON_ON=0

log() { printf '%s %s\n' "$(date +%H:%M:%S)" "$*"; }
FAILED=()
: >"$WORK/results.txt"
result() { # result NAME STATUS; also a `PASS|FAIL NAME` line in results.txt, as modern.sh and tier.sh write
    if [[ $2 == 0 ]]; then log "PASS $1"; else log "FAIL $1 (see $WORK/$1.*)"; FAILED+=("$1"); fi
    echo "$([[ $2 == 0 ]] && echo PASS || echo FAIL) $1" >>"$WORK/results.txt"
}

HTTP_PID="" TG_PID=""
cleanup() {
    [[ -n "$TG_PID" ]] && kill -TERM "$TG_PID" 2>/dev/null
    [[ -n "$HTTP_PID" ]] && kill -TERM "$HTTP_PID" 2>/dev/null
    wait 2>/dev/null
}
trap cleanup EXIT

# ---- the HTTP reference server ------------------------------------------------------------------
"$NODE" "$HERE/task-server.mjs" --mode stateful --port 0 >"$WORK/ts-http.out" 2>"$WORK/ts-http.err" &
HTTP_PID=$!
for _ in $(seq 1 100); do
    HTTP_URL=$(sed -n 's/.*"listening":"\([^"]*\)".*/\1/p' "$WORK/ts-http.out" | head -1)
    [[ -n "$HTTP_URL" ]] && break
    sleep 0.1
done
[[ -n "${HTTP_URL:-}" ]] || { log "task-server.mjs (HTTP) did not start"; exit 1; }

# ---- taskgate with the stdio upstreams -----------------------------------------------------------
q() { printf '"%s"' "$1"; }
{
    printf '[gateway]\nlisten = "127.0.0.1:0"\n\n[admin]\nlisten = "127.0.0.1:0"\n\n[store]\npath = "%s"\n\n[auth]\nmode = "none"\n' "$WORK/store"
    printf '\n[[upstream]]\nname = "ts-http"\nurl = "%s"\n' "$HTTP_URL"
    printf '\n[[upstream]]\nname = "ts-stdio"\ncommand = [%s, %s, "--mode", "stdio"]\n' "$(q "$NODE")" "$(q "$HERE/task-server.mjs")"
    # `--port 9` is unused in stdio mode: it tells this child apart for pgrep (stdio-killed).
    printf '\n[[upstream]]\nname = "ts-kill"\ncommand = [%s, %s, "--mode", "stdio", "--port", "9"]\n' "$(q "$NODE")" "$(q "$HERE/task-server.mjs")"
    if [[ $PYTHON_ON == 1 ]]; then
        printf '\n[[upstream]]\nname = "py-stdio"\ncommand = [%s, %s, "--stdio"]\n' "$(q "$VENV/bin/python")" "$(q "$HERE/py_task_server.py")"
    fi
    printf '\n[[upstream]]\nname = "everything"\ncommand = [%s, %s, "stdio"]\ncwd = %s\n' "$(q "$NODE")" "$(q "$HERE/node_modules/@modelcontextprotocol/server-everything/dist/index.js")" "$(q "$WORK")"
} >"$WORK/taskgate.toml"
"$BIN" check-config "$WORK/taskgate.toml" >"$WORK/check-config.out" 2>&1 || { log "check-config failed"; cat "$WORK/check-config.out"; exit 1; }
RUST_LOG=${RUST_LOG:-info} "$BIN" serve --config "$WORK/taskgate.toml" >"$WORK/taskgate.out" 2>"$WORK/taskgate.err" &
TG_PID=$!
for _ in $(seq 1 100); do
    LINE=$(head -1 "$WORK/taskgate.out" 2>/dev/null)
    [[ -n "$LINE" ]] && break
    sleep 0.1
done
GW=$(sed -n 's/.*"gateway":"\([^"]*\)".*/\1/p' <<<"${LINE:-}")
ADMIN=$(sed -n 's/.*"admin":"\([^"]*\)".*/\1/p' <<<"${LINE:-}")
[[ -n "$GW" ]] || { log "taskgate did not start"; cat "$WORK/taskgate.err"; exit 1; }
for _ in $(seq 1 300); do
    curl -fsS "http://$ADMIN/readyz" >"$WORK/readyz.json" 2>/dev/null && break
    sleep 0.1
done
curl -fsS "http://$ADMIN/readyz" >"$WORK/readyz.json" || { log "taskgate never ready"; cat "$WORK/readyz.json"; exit 1; }
log "taskgate $GW (admin $ADMIN), children live: $(cat "$WORK/readyz.json")"

# ---- steps ---------------------------------------------------------------------------------------
run() { # run NAME CMD...: stdout to NAME.json, stderr to NAME.err
    local name=$1
    shift
    timeout 180 "$@" >"$WORK/$name.json" 2>"$WORK/$name.err"
}

run stdio-ts-client-http "$NODE" "$HERE/task-client.mjs" "http://$GW/mcp/ts-http" --label http
HTTP_RC=$?
run stdio-ts-client "$NODE" "$HERE/task-client.mjs" "http://$GW/mcp/ts-stdio" --label stdio
RC=$?
# The same checks with the same outcome as over HTTP.
"$NODE" -e '
const fs = require("fs");
const [a, b] = process.argv.slice(1).map(f => JSON.parse(fs.readFileSync(f, "utf8")));
const view = s => s.checks.map(c => `${c.name}=${c.ok}`).sort().join("\n");
if (view(a) !== view(b)) { console.error("checks differ:\n--- http\n" + view(a) + "\n--- stdio\n" + view(b)); process.exit(1); }
' "$WORK/stdio-ts-client-http.json" "$WORK/stdio-ts-client.json" 2>"$WORK/stdio-ts-client.diff"
SAME=$?
result stdio-ts-client $(( HTTP_RC || RC || SAME ))

if [[ $PYTHON_ON == 1 ]]; then
    run stdio-py-client "$VENV/bin/python" "$HERE/py_task_client.py" "http://$GW/mcp/py-stdio" --label py-stdio
    result stdio-py-client $?
    run stdio-ts-client-py-server "$NODE" "$HERE/task-client.mjs" "http://$GW/mcp/py-stdio" --label ts-on-py-stdio
    result stdio-ts-client-py-server $?
else
    log "SKIP stdio-py-client (no $VENV or INTEROP_SKIP_PYTHON=1)"
fi

run stdio-everything "$NODE" "$HERE/stdio-check.mjs" everything "http://$GW/mcp/everything"
result stdio-everything $?

pgrep -P "$TG_PID" -f "task-server.mjs --mode stdio --port 9" >"$WORK/ts-kill.pid"
run stdio-killed "$NODE" "$HERE/stdio-check.mjs" killed "http://$GW/mcp/ts-kill" "http://$ADMIN" "$WORK/ts-kill.pid"
result stdio-killed $?

# ---- no orphans after SIGTERM --------------------------------------------------------------------
CHILDREN=$(pgrep -P "$TG_PID" | tr '\n' ' ')
kill -TERM "$TG_PID"
for _ in $(seq 1 150); do
    kill -0 "$TG_PID" 2>/dev/null || break
    sleep 0.1
done
LEFT=""
for pid in $CHILDREN; do
    if [[ -e /proc/$pid ]] && ! grep -q '^State:.*Z' "/proc/$pid/status" 2>/dev/null; then
        LEFT+="$pid "
    fi
done
TG_PID=""
echo "children: $CHILDREN left: $LEFT" >"$WORK/stdio-no-orphans.out"
[[ -z "$CHILDREN" ]] && LEFT="(no children seen)"
result stdio-no-orphans $([[ -z "$LEFT" ]] && echo 0 || echo 1)

if ((${#FAILED[@]})); then
    log "stdio: FAILED ${FAILED[*]}"
    exit 1
fi
log "stdio: all steps passed"
