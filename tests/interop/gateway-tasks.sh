#!/usr/bin/env bash
# Gateway-owned tasks (issue 32): real task clients against a real server WITHOUT task support,
# through taskgate with `tasks = "gateway"` (taskgate runs the tasks itself). run.sh calls it
# (step k); it also runs alone:
#
#   tests/interop/gateway-tasks.sh TASKGATE_BIN
#
# Upstream: gateway-task-server.mjs (TypeScript SDK 1.32.2 low-level Server, no
# capabilities.tasks: `slow` streams progress and honours the abort signal, `fail` answers a
# JSON-RPC error, `oops` an isError result, `stats` counts started/aborted/finished calls, `ask`
# asks the client by elicitation/create during the call).
# Clients, one after the other on one taskgate: gateway-task-client.mjs (TypeScript SDK 1.32.2)
# and py_gateway_task_client.py (Python mcp 1.30.0; skipped with INTEROP_SKIP_PYTHON=1): the whole
# 2025-11-25 lifecycle (capabilities, optional taskSupport, create, tasks/get with the progress
# message, tasks/list, tasks/result blocking, failed on a JSON-RPC error, completed on isError,
# cancel: cancelled at once and the server's handler aborted, -32602 afterwards; the TS client
# also input: `ask` makes the task input_required, the elicitation reaches the client on the
# tasks/result stream with related-task _meta, its answer reaches the server). Then
# taskgate's /metrics must show every cancelled task released (taskgate_tasks_cancelled_unreleased
# back to 0, one taskgate_cancelled_to_released_seconds sample per client's cancel).
#
# Then gateway_task_fastmcp_client.py (fastmcp 4.1.4 + fastmcp-tasks 4.1.4, a 2026-07-28 client,
# in .venv-modern; skipped with INTEROP_SKIP_PYTHON=1): the 2026 lifecycle through taskgate and
# its reverse bridge (create, tasks/get, result, failed, input as inputRequests answered by
# tasks/update, cancel reaching the server's handler).
#
# Results: DIR/gateway-tasks/results.txt, `PASS|FAIL step` lines; exit 0 only when all passed.
# Environment: INTEROP_WORK=DIR (logs; default a new /tmp dir), INTEROP_SKIP_PYTHON=1,
# INTEROP_VENV=DIR (the Python venv run.sh makes; default tests/interop/.venv), INTEROP_VENV_MODERN=DIR
# (the fastmcp 4 venv run.sh makes from requirements-modern.txt; default tests/interop/.venv-modern).
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BIN=${1:-}
if [[ -z "$BIN" || "$BIN" == none ]]; then
    echo "usage: $0 TASKGATE_BIN (gateway-owned tasks only exist through taskgate)" >&2
    exit 2
fi
[[ "$BIN" == /* ]] || BIN="$PWD/$BIN"
[[ -x "$BIN" ]] || {
    echo "taskgate binary not found or not executable: $BIN" >&2
    exit 2
}
WORK=${INTEROP_WORK:-$(mktemp -d /tmp/taskgate-interop-gateway-tasks.XXXXXX)}
WORK="$WORK/gateway-tasks"
mkdir -p "$WORK"
NODE22="$HERE/node_modules/node/bin/node"
[[ -x "$NODE22" ]] || NODE22=$(command -v node)
VENV=${INTEROP_VENV:-$HERE/.venv}
PYTHON_ON=1
[[ "${INTEROP_SKIP_PYTHON:-0}" == 1 || ! -x "$VENV/bin/python" ]] && PYTHON_ON=0
VENV_MODERN=${INTEROP_VENV_MODERN:-$HERE/.venv-modern}
MODERN_ON=1
[[ "${INTEROP_SKIP_PYTHON:-0}" == 1 || ! -x "$VENV_MODERN/bin/python" ]] && MODERN_ON=0
: >"$WORK/results.txt"

# shellcheck source=procs.sh
source "$HERE/procs.sh"

start server "$NODE22" "$HERE/gateway-task-server.mjs" --port 0
wait_ready server 30 || exit 1
{
    printf '[gateway]\nlisten = "127.0.0.1:0"\ndrain_timeout_ms = 1000\n\n[admin]\nlisten = "127.0.0.1:0"\n\n'
    printf '[store]\npath = "%s"\n\n[auth]\nmode = "none"\n\n[tasks]\nrelease_quiet_ms = 200\n\n' "$WORK/store"
    printf '[[upstream]]\nname = "legacy"\nurl = "%s"\ntasks = "gateway"\n' "$(field server listening)"
} >"$WORK/taskgate.toml"
start taskgate "$BIN" serve --config "$WORK/taskgate.toml"
wait_ready taskgate 60 || exit 1
URL="http://$(field taskgate listening.gateway)/mcp/legacy"
ADMIN=$(field taskgate listening.admin)

cancels=0
log "gateway-task-client (TypeScript SDK 1.32.2): $URL"
run_fg timeout 120 "$NODE22" "$HERE/gateway-task-client.mjs" "$URL" --label ts >"$WORK/ts-client.json" 2>"$WORK/ts-client.err"
rc=$?
cat "$WORK/ts-client.err"
result "gateway-task-client (TS SDK 1.32.2 task client, TS SDK server without tasks, tasks = \"gateway\")" $rc
cancels=$((cancels + 1))
if [[ $PYTHON_ON == 1 ]]; then
    log "py_gateway_task_client (Python mcp 1.30.0): $URL"
    run_fg timeout 120 "$VENV/bin/python" "$HERE/py_gateway_task_client.py" "$URL" --label py >"$WORK/py-client.json" 2>"$WORK/py-client.err"
    rc=$?
    cat "$WORK/py-client.err"
    result "py_gateway_task_client (Python mcp 1.30.0 task client, TS SDK server without tasks, tasks = \"gateway\")" $rc
    cancels=$((cancels + 1))
else
    log "SKIP py_gateway_task_client (no $VENV or INTEROP_SKIP_PYTHON=1)"
fi
if [[ $MODERN_ON == 1 ]]; then
    log "gateway_task_fastmcp_client (fastmcp 4.1.4 + fastmcp-tasks 4.1.4, 2026-07-28): $URL"
    run_fg timeout 180 "$VENV_MODERN/bin/python" "$HERE/gateway_task_fastmcp_client.py" "$URL" --label fastmcp --json "$WORK/fastmcp-client.json" >"$WORK/fastmcp-client.out" 2>"$WORK/fastmcp-client.err"
    rc=$?
    cat "$WORK/fastmcp-client.out"
    [[ $rc == 0 ]] || tail -n 20 "$WORK/fastmcp-client.err"
    result "gateway_task_fastmcp_client (fastmcp 4.1.4 + fastmcp-tasks 4.1.4 2026-07-28 client, TS SDK server without tasks, tasks = \"gateway\")" $rc
    cancels=$((cancels + 1))
else
    log "SKIP gateway_task_fastmcp_client (no $VENV_MODERN or INTEROP_SKIP_PYTHON=1)"
fi

# Every cancelled task is released once the server's aborted handler has answered (bounded wait).
released=0
for _ in $(seq 1 50); do
    curl -fsS "http://$ADMIN/metrics" >"$WORK/metrics.txt" 2>/dev/null || true
    unreleased=$(awk '$1 == "taskgate_tasks_cancelled_unreleased" {print $2}' "$WORK/metrics.txt")
    samples=$(awk '$1 == "taskgate_cancelled_to_released_seconds_count" {print $2}' "$WORK/metrics.txt")
    if [[ "$unreleased" == 0 && "${samples:-0}" -ge $cancels ]]; then
        released=1
        break
    fi
    sleep 0.2
done
echo "  metrics: cancelled_unreleased=${unreleased:-?} cancelled_to_released samples=${samples:-?} (cancels: $cancels)"
result "every cancelled gateway task released (metrics)" $((1 - released))

for name in "${!PID[@]}"; do
    if ! kill -0 "${PID[$name]}" 2>/dev/null; then
        echo "FAIL $name exited during the run; stderr tail:"
        tail -n 20 "$WORK/$name.err"
        result "$name still running" 1
    fi
done
echo
echo "== gateway-owned tasks (issue 32) =="
cat "$WORK/results.txt"
exit $STATUS
