#!/usr/bin/env bash
# Issue 37 against real 2026-07-28 servers: routing headers (items 1 and 2) and the upgraded call
# orphaned by a kill -9 (item 3), through taskgate. modern.sh runs it as its step
# modern-routing-orphan; it also runs alone:
#
#   tests/interop/routing-orphan.sh TASKGATE_BIN
#
# Needs what modern.sh installs (.venv-modern from requirements-modern.txt, node_modules). Starts
# modern_task_server.py (FastMCP 4.1.4 + fastmcp-tasks 4.1.4, upstream `modern`), with
# TASKGATE_INTEROP_RMCP=1 (the default, as in modern.sh) also rmcp-server/ --modern-only (rmcp
# 3.11.0, pure 2026-07-28: taskgate holds the 2025 sessions; upstream `rmcp-pure`; built here if
# modern.sh has not), and one taskgate in front of them (auth none, [upgrade] enabled, listeners on
# port 0). Then:
#   routing-headers   routing-headers.mjs on `modern`: requests whose Mcp-Method/Mcp-Name disagree
#                     with the body (tools/call naming another tool, tasks/get|cancel naming another
#                     task, another method, malformed base64) get 400 -32020 from taskgate and are not
#                     in the fixture's request log (GET /requests); a tasks/get without Mcp-Name (as
#                     fastmcp.Client 4.1.4 sends it) works and reaches the fixture with both headers
#   orphan-restart    orphan-restart.mjs, once per upstream: a plain 2025-11-25 tools/call of
#                     slow_required becomes an upgraded call; kill -9 of taskgate while it is open;
#                     taskgate started again on the same store; the server itself then says the task
#                     is `cancelled`, it received one tasks/cancel for it, taskgate's record is
#                     `cancelled`, and taskgate's log says it cancelled the orphan (no refusal)
#
# Environment: INTEROP_WORK=DIR (default a new /tmp dir), TASKGATE_INTEROP_RMCP=0 (FastMCP only).
# Writes DIR/results.txt (`PASS name` / `FAIL name`, read by modern.sh). Exit 0 only when all
# passed. About 10 s (plus the rmcp-server build when it is missing).
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BIN=${1:-}
if [[ -z "$BIN" ]]; then
    echo "usage: $0 TASKGATE_BIN" >&2
    exit 2
fi
[[ "$BIN" == /* ]] || BIN="$PWD/$BIN"
[[ -x "$BIN" ]] || {
    echo "taskgate binary not found or not executable: $BIN" >&2
    exit 2
}
NODE22="$HERE/node_modules/node/bin/node"
PYTHON="$HERE/.venv-modern/bin/python"
[[ -x "$NODE22" && -x "$PYTHON" ]] || {
    echo "missing $NODE22 or $PYTHON: run modern.sh (or run.sh) once, it installs them" >&2
    exit 2
}
WORK=${INTEROP_WORK:-$(mktemp -d /tmp/taskgate-routing-orphan.XXXXXX)}
mkdir -p "$WORK"
: >"$WORK/results.txt"

# shellcheck source=procs.sh
source "$HERE/procs.sh"
show() { grep -v '^PASS' "$1" | sed 's/^/  /'; }

# ---- the fixtures and taskgate -------------------------------------------------------------------
start fixture "$PYTHON" "$HERE/modern_task_server.py" --port 0
RMCP=${TASKGATE_INTEROP_RMCP:-1}
RMCP_BIN="$HERE/rmcp-server/target/debug/taskgate-interop-rmcp-server"
if [[ $RMCP == 1 ]]; then
    # modern.sh built it already; alone, this builds it (its own target dir, ~2 CPU-minutes once).
    run_fg timeout 1200 cargo build --locked --quiet --manifest-path "$HERE/rmcp-server/Cargo.toml" >"$WORK/rmcp-build.log" 2>&1 || {
        echo "building rmcp-server failed:" >&2
        tail -n 30 "$WORK/rmcp-build.log" >&2
        exit 1
    }
    start rmcp-pure "$RMCP_BIN" --port 0 --modern-only
fi
wait_ready fixture 90 || exit 1
[[ $RMCP == 1 ]] && { wait_ready rmcp-pure 30 || exit 1; }
declare -A DIRECT=() RECEIVED=() PEER=()
DIRECT[modern]=$(field fixture listening)
RECEIVED[modern]=$(field fixture received)
PEER[modern]="FastMCP $(field fixture version)"
ORPHAN_UPSTREAMS=(modern)
if [[ $RMCP == 1 ]]; then
    DIRECT[rmcp-pure]=$(field rmcp-pure listening)
    RECEIVED[rmcp-pure]="$WORK/rmcp-pure.out"
    PEER[rmcp-pure]="rmcp $(field rmcp-pure version) --modern-only"
    ORPHAN_UPSTREAMS+=(rmcp-pure)
fi
{
    printf '[gateway]\nlisten = "127.0.0.1:0"\ndrain_timeout_ms = 1000\n\n[admin]\nlisten = "127.0.0.1:0"\n\n'
    printf '[store]\npath = "%s"\n\n[auth]\nmode = "none"\n\n[upgrade]\nenabled = true\n' "$WORK/taskgate-store"
    for name in "${ORPHAN_UPSTREAMS[@]}"; do
        printf '\n[[upstream]]\nname = "%s"\nurl = "%s"\n' "$name" "${DIRECT[$name]}"
    done
} >"$WORK/taskgate.toml"
start taskgate "$BIN" serve --config "$WORK/taskgate.toml"
wait_ready taskgate 60 || exit 1
GW=$(field taskgate listening.gateway)
log "routing-orphan work dir: $WORK; taskgate $GW ($BIN)"
for name in "${ORPHAN_UPSTREAMS[@]}"; do log "  upstream $name: ${PEER[$name]} ${DIRECT[$name]}"; done

# ---- routing-headers (issue 37 #1, #2) -----------------------------------------------------------
log "routing-headers: mismatched Mcp-Method/Mcp-Name refused at taskgate, missing Mcp-Name added upstream"
run_fg timeout 120 "$NODE22" "$HERE/routing-headers.mjs" "http://$GW/mcp/modern" --direct "${DIRECT[modern]}" --requests "$(field fixture requests)" \
    --json "$WORK/routing-headers.json" >"$WORK/routing-headers.log" 2>&1
rc=$?
show "$WORK/routing-headers.log"
result "routing-headers: header/body mismatches refused by taskgate, never reach ${PEER[modern]}; a tasks/get without Mcp-Name gets it upstream" $rc

# ---- orphan-restart (issue 37 #3), once per upstream -----------------------------------------------
for name in "${ORPHAN_UPSTREAMS[@]}"; do
    log "orphan-restart $name: upgraded plain call of slow_required, kill -9 taskgate, restart on the same store"
    GW=$(field taskgate listening.gateway)
    run_fg timeout 60 "$NODE22" "$HERE/orphan-restart.mjs" "http://$GW/mcp/$name" --phase before-restart --upstream "$name" \
        --admin "$(field taskgate listening.admin)" --direct "${DIRECT[$name]}" --kill "${PID[taskgate]}" --state "$WORK/orphan-$name.json" \
        >"$WORK/orphan-$name-before.log" 2>&1
    rc=$?
    show "$WORK/orphan-$name-before.log"
    # The client killed it (SIGKILL) while its call was open; if it could not, this does.
    kill -KILL "${PID[taskgate]}" 2>/dev/null
    { wait "${PID[taskgate]}"; } 2>/dev/null
    mv "$WORK/taskgate.err" "$WORK/taskgate-before-restart-$name.err"
    # (wait_ready must not find the killed one's line: start truncates the file only in the child.)
    rm -f "$WORK/taskgate.out"
    start taskgate "$BIN" serve --config "$WORK/taskgate.toml"
    wait_ready taskgate 60 || exit 1
    if [[ $rc == 0 ]]; then
        run_fg timeout 90 "$NODE22" "$HERE/orphan-restart.mjs" "http://$(field taskgate listening.gateway)/mcp/$name" --phase after-restart \
            --upstream "$name" --admin "$(field taskgate listening.admin)" --direct "${DIRECT[$name]}" --received "${RECEIVED[$name]}" \
            --log "$WORK/taskgate.err" --state "$WORK/orphan-$name.json" >"$WORK/orphan-$name-after.log" 2>&1
        rc=$?
        show "$WORK/orphan-$name-after.log"
    fi
    result "orphan-restart: upgraded call orphaned by kill -9 cancelled on ${PEER[$name]} after the restart, and logged so" $rc
done

for name in "${!PID[@]}"; do
    if ! kill -0 "${PID[$name]}" 2>/dev/null; then
        echo "FAIL $name exited during the run; stderr tail:"
        tail -n 20 "$WORK/$name.err"
        result "$name still running" 1
    fi
done
echo
echo "== routing-orphan (issue 37) summary (logs: $WORK) =="
cat "$WORK/results.txt"
exit $STATUS
