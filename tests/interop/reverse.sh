#!/usr/bin/env bash
# The reverse bridge (issue 33): 2026-07-28 clients on 2025-11-25 task servers, direct and
# through taskgate. run.sh calls it (step j); it also runs alone:
#
#   tests/interop/reverse.sh TASKGATE_BIN      direct (recorded, never required), then through
#                                              taskgate (auth none) and, for the TS server,
#                                              taskgate (bearer, two principals)
#   tests/interop/reverse.sh none              direct only
#
# Upstreams (2025-11-25 tasks, sessions), one process per server and route, so what one route
# leaves running (a 60 s task) cannot disturb another:
#   ts   task-server.mjs --mode stateful (TypeScript SDK 1.32.2)
#   py   py_task_server.py (Python mcp==1.30.0, in .venv from requirements.txt)
# Clients (2026-07-28):
#   raw      reverse-client.mjs (raw wire, 12 steps: discover, the tasks extension offered,
#            tools/list, a plain call, a task call, polls to completed, the result inline, a tool
#            error's content kept, cancel acked, the task cancelled, the cancel of a terminal task
#            acked; subscriptions/listen (a task's end as notifications/tasks); on ts also input
#            via tasks/update, and with bearer a second principal's tasks/get and tasks/cancel
#            refused -32602 and its listen naming the task acknowledged without it)
#   fastmcp  reverse_fastmcp_client.py (fastmcp.Client 4.1.4 + fastmcp-tasks 4.1.4, in .venv-modern
#            from requirements-modern.txt; 11 checks: the era it picks, tools, a plain call, a task
#            run transparently, a task handle to its result, a failed task's content, cancel)
#   restart  reverse-restart.mjs (raw wire, on its own ts server and taskgate): ask_task until its
#            elicitation shows in inputRequests, kill -9 of taskgate, taskgate again on the same
#            store: the request shown again from the task's record (the SDK sends it once),
#            answered with tasks/update, the task completed with the answer
#   rmcp     rmcp-client/ (rmcp 3.11.0's client, ClientLifecycleMode::Auto, the tasks extension
#            declared; 10 checks: the era, tools, a plain call, a task call, polls to completed,
#            the result inline, a failed task's content, cancel acked, cancelled, the cancel of a
#            terminal task acked). Built here with `cargo build --locked` in its own target dir
#            (about 1.5 min with the crates already downloaded); TASKGATE_INTEROP_RMCP=0 leaves it out.
# Conformance (conformance-next, 0.2.0-alpha.12, Node 22): its tasks-* server scenarios, one run per
# scenario, against the 2026 fixture direct (modern_task_server.py, FastMCP 4.1.4 + fastmcp-tasks)
# and through taskgate against reverse-fixture.mjs (the same tools as 2025-11-25 tasks on the
# TypeScript SDK 1.32.2). Every check must have the direct status, except those listed in
# reverse-conformance-differences.txt (`check-id  # why`), which must fail through taskgate
# (reverse-conformance-compare.py; a listed check that passes fails the step: remove it then).
#
# Directly a 1.x server refuses every stateless request (no Mcp-Session-Id) and FastMCP falls back
# to a 2025 session whose tasks its client cannot use: the direct counts are written to
# DIR/reverse/counts.txt, step by step beside the route through taskgate
# (DIR/reverse/steps.txt), and not required. Through taskgate every check must pass.
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
: >"$WORK/steps.txt"

# shellcheck source=procs.sh
source "$HERE/procs.sh"

# ---- install: the two venvs, as run.sh and modern.sh install them ---------------------------------
venv() { # venv DIR REQUIREMENTS: (re)installs DIR when missing or built from another file
    local dir=$1 req=$2 sum
    sum=$(sha256sum "$req" | cut -d' ' -f1)
    [[ -x "$dir/bin/python" && "$(cat "$dir/.requirements.sha256" 2>/dev/null)" == "$sum" ]] && return 0
    log "installing $(basename "$req") into $dir"
    { { [[ -x "$dir/bin/python" ]] || python3 -m venv "$dir"; } &&
        "$dir/bin/pip" install --disable-pip-version-check -q -r "$req" &&
        "$dir/bin/pip" check --disable-pip-version-check; } >"$WORK/pip-$(basename "$dir").log" 2>&1 || {
        echo "installing $req failed:" >&2
        tail -n 30 "$WORK/pip-$(basename "$dir").log" >&2
        rm -rf "$dir"
        return 1
    }
    echo "$sum" >"$dir/.requirements.sha256"
}
venv "$HERE/.venv" "$HERE/requirements.txt" || exit 1
venv "$HERE/.venv-modern" "$HERE/requirements-modern.txt" || exit 1
PY="$HERE/.venv/bin/python"
PY_MODERN="$HERE/.venv-modern/bin/python"
CLIENTS=(raw fastmcp)
RMCP_CLIENT="$HERE/rmcp-client/target/debug/taskgate-interop-rmcp-client"
if [[ ${TASKGATE_INTEROP_RMCP:-1} == 1 ]]; then
    log "building rmcp-client (rmcp 3.11.0)"
    run_fg timeout 1200 cargo build --locked --quiet --manifest-path "$HERE/rmcp-client/Cargo.toml" >"$WORK/rmcp-client-build.log" 2>&1 || {
        echo "building rmcp-client failed:" >&2
        tail -n 30 "$WORK/rmcp-client-build.log" >&2
        exit 1
    }
    CLIENTS+=(rmcp)
fi

# ---- upstreams and gateways ----------------------------------------------------------------------
SERVERS=(ts py)
CONFORMANCE="$HERE/node_modules/conformance-next/dist/index.js"
ROUTES=(direct)
[[ "$BIN" != none ]] && ROUTES+=(via)
declare -A URL=()
server_cmd() { # server_cmd SERVER: the command line of that 2025 task server
    case $1 in
        ts) echo "$NODE22" "$HERE/task-server.mjs" --mode stateful --port 0 ;;
        py) echo "$PY" "$HERE/py_task_server.py" --port 0 ;;
    esac
}
PAIRS=()
for s in "${SERVERS[@]}"; do
    for route in "${ROUTES[@]}"; do PAIRS+=("$s-$route"); done
done
[[ "$BIN" != none ]] && PAIRS+=(ts-bearer)
for pair in "${PAIRS[@]}"; do
    # shellcheck disable=SC2046
    start "up-$pair" $(server_cmd "${pair%%-*}")
done
if [[ "$BIN" != none ]]; then
    start fixture-2026 "$PY_MODERN" "$HERE/modern_task_server.py" --port 0
    start fixture-2025 "$NODE22" "$HERE/reverse-fixture.mjs" --port 0
fi
for pair in "${PAIRS[@]}"; do
    wait_ready "up-$pair" 60 || exit 1
done
for s in "${SERVERS[@]}"; do URL[$s-direct]=$(field "up-$s-direct" listening); done

config() { # config NAME AUTH_BLOCK UPSTREAM_URL
    printf '[gateway]\nlisten = "127.0.0.1:0"\ndrain_timeout_ms = 1000\n\n[admin]\nlisten = "127.0.0.1:0"\n\n'
    printf '[store]\npath = "%s"\n\n%s\n' "$WORK/$1-store" "$2"
    printf '[[upstream]]\nname = "up"\nurl = "%s"\n' "$3"
}
TOKEN_A=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
TOKEN_B=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
if [[ "$BIN" != none ]]; then
    for s in "${SERVERS[@]}"; do
        config "taskgate-$s" $'[auth]\nmode = "none"\n' "$(field "up-$s-via" listening)" >"$WORK/taskgate-$s.toml"
        start "taskgate-$s" "$BIN" serve --config "$WORK/taskgate-$s.toml"
    done
    config taskgate-bearer "$(printf '[auth]\nmode = "bearer"\n\n[[auth.token]]\nprincipal = "alice"\nsha256 = "%s"\n\n[[auth.token]]\nprincipal = "bob"\nsha256 = "%s"\n' \
        "$(printf %s "$TOKEN_A" | sha256sum | cut -d' ' -f1)" "$(printf %s "$TOKEN_B" | sha256sum | cut -d' ' -f1)")" \
        "$(field up-ts-bearer listening)" >"$WORK/taskgate-bearer.toml"
    start taskgate-bearer "$BIN" serve --config "$WORK/taskgate-bearer.toml"
    for s in "${SERVERS[@]}"; do
        wait_ready "taskgate-$s" 60 || exit 1
        URL[$s-via]="http://$(field "taskgate-$s" listening.gateway)/mcp/up"
    done
    wait_ready taskgate-bearer 60 || exit 1
    URL[ts-bearer]="http://$(field taskgate-bearer listening.gateway)/mcp/up"
    wait_ready fixture-2026 90 || exit 1
    wait_ready fixture-2025 60 || exit 1
    config taskgate-conformance $'[auth]\nmode = "none"\n' "$(field fixture-2025 listening)" >"$WORK/taskgate-conformance.toml"
    start taskgate-conformance "$BIN" serve --config "$WORK/taskgate-conformance.toml"
    wait_ready taskgate-conformance 60 || exit 1
    URL[conformance-direct]=$(field fixture-2026 listening)
    URL[conformance-via]="http://$(field taskgate-conformance listening.gateway)/mcp/up"
fi

# ---- clients --------------------------------------------------------------------------------------
# run_client CLIENT SERVER ROUTE: one client against one server on one route
run_client() {
    local client=$1 s=$2 route=$3 label="$1 $2 $3" rc
    local json="$WORK/$client-$s-$route.json" args=()
    case $client in
        raw)
            args=("$NODE22" "$HERE/reverse-client.mjs" "${URL[$s-$route]}" --label "$label" --json "$json")
            [[ $s == py ]] && args+=(--skip-input)
            # Both SDKs send notifications/tasks/status on the session's GET stream.
            args+=(--listen)
            [[ $route == bearer ]] && args+=(--bearer "$TOKEN_A" --foreign-bearer "$TOKEN_B")
            ;;
        fastmcp) args=("$PY_MODERN" "$HERE/reverse_fastmcp_client.py" "${URL[$s-$route]}" --label "$label" --json "$json") ;;
        rmcp) args=("$RMCP_CLIENT" "${URL[$s-$route]}" --label "$label" --json "$json") ;;
    esac
    log "$label: ${URL[$s-$route]}"
    run_fg timeout 180 "${args[@]}" >"$WORK/$client-$s-$route.log" 2>&1
    rc=$?
    sed 's/^/  /' "$WORK/$client-$s-$route.log"
    tail -n 1 "$WORK/$client-$s-$route.log" >>"$WORK/counts.txt"
    # Directly a 2025-11-25 server cannot serve a 2026-07-28 client: recorded, not required.
    [[ $route == direct ]] || result "reverse $client client (2026-07-28) on the $s 2025-11-25 task server, $route" $rc
}
for s in "${SERVERS[@]}"; do
    for client in "${CLIENTS[@]}"; do
        for route in "${ROUTES[@]}"; do run_client "$client" "$s" "$route"; done
        # Step by step: direct beside through taskgate.
        if [[ "$BIN" != none ]]; then
            python3 - "$client $s" "$WORK/$client-$s-direct.json" "$WORK/$client-$s-via.json" >>"$WORK/steps.txt" <<'EOF'
import json, sys
label, direct, via = sys.argv[1], sys.argv[2], sys.argv[3]
def load(path):
    try:
        return {c["name"]: c["ok"] for c in json.load(open(path))["checks"]}
    except Exception:
        return {}
d, v = load(direct), load(via)
print(f"{label}: step  direct  via-taskgate")
for name in list(dict.fromkeys([*v, *d])):
    show = lambda m: "-" if name not in m else ("pass" if m[name] else "FAIL")
    print(f"  {name:32} {show(d):6} {show(v)}")
print(f"  total {sum(d.values())}/{len(d)} direct, {sum(v.values())}/{len(v)} through taskgate")
EOF
        fi
    done
done
[[ "$BIN" != none ]] && run_client raw ts bearer

# ---- a captured input request answered across a restart (ts) -------------------------------------
# The TypeScript SDK 1.32.2 sends a task's elicitation/create once, on one tasks/result stream (its
# Protocol dequeues it; a later tasks/result gets nothing more), but takes the response by its id
# on any POST of the session. taskgate stores the captured request in the task's record: after
# kill -9 of the taskgate that captured it, the restarted one shows it, sends the answer, and the
# task completes with it; nothing is cancelled.
if [[ "$BIN" != none ]]; then
    # shellcheck disable=SC2046
    start up-ts-restart $(server_cmd ts)
    wait_ready up-ts-restart 60 || exit 1
    config taskgate-restart $'[auth]\nmode = "none"\n' "$(field up-ts-restart listening)" >"$WORK/taskgate-restart.toml"
    start taskgate-restart "$BIN" serve --config "$WORK/taskgate-restart.toml"
    wait_ready taskgate-restart 60 || exit 1
    rc=1
    log "reverse restart: ask_task through $(field taskgate-restart listening.gateway), kill -9, restart"
    if run_fg timeout 60 "$NODE22" "$HERE/reverse-restart.mjs" ask "http://$(field taskgate-restart listening.gateway)/mcp/up" \
        >"$WORK/restart-ask.json" 2>"$WORK/restart.log"; then
        kill -KILL "${PID[taskgate-restart]}"
        wait "${PID[taskgate-restart]}" 2>/dev/null
        unset 'PID[taskgate-restart]'
        start taskgate-restarted "$BIN" serve --config "$WORK/taskgate-restart.toml"
        wait_ready taskgate-restarted 60 || exit 1
        run_fg timeout 60 "$NODE22" "$HERE/reverse-restart.mjs" answer "http://$(field taskgate-restarted listening.gateway)/mcp/up" \
            "$("$NODE22" "$HERE/harness.mjs" json-field "$WORK/restart-ask.json" taskId)" \
            "$("$NODE22" "$HERE/harness.mjs" json-field "$WORK/restart-ask.json" key)" >>"$WORK/restart.log" 2>&1 &&
            ! grep -q 'input request was lost' "$WORK/taskgate-restarted.err" &&
            rc=0
        if grep -q 'input request was lost' "$WORK/taskgate-restarted.err"; then
            echo "FAIL the restarted taskgate failed the task as lost" >>"$WORK/restart.log"
        fi
    fi
    sed 's/^/  /' "$WORK/restart.log"
    result "reverse raw client: a captured input request answered after a kill -9 of taskgate, the task completed (ts)" $rc
fi

# ---- conformance-next tasks-* through the reverse bridge -----------------------------------------
if [[ "$BIN" != none ]]; then
    mapfile -t SCENARIOS < <("$NODE22" "$CONFORMANCE" list --server 2>/dev/null | sed -n 's/^ *- \(tasks-[a-z0-9-]*\).*/\1/p')
    for route in direct via; do
        for scenario in "${SCENARIOS[@]}"; do
            log "conformance $scenario: $route ${URL[conformance-$route]}"
            run_fg timeout 120 "$NODE22" "$CONFORMANCE" server --url "${URL[conformance-$route]}" --scenario "$scenario" \
                >"$WORK/conformance-$route-$scenario.log" 2>&1
        done
    done
    python3 "$HERE/reverse-conformance-compare.py" "$WORK" "$HERE/reverse-conformance-differences.txt" "${SCENARIOS[@]}" \
        >"$WORK/conformance-report.txt"
    rc=$?
    sed 's/^/  /' "$WORK/conformance-report.txt"
    result "conformance-next tasks-* through the reverse bridge = the 2026 fixture direct (differences explained)" $rc
fi

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
cat "$WORK/steps.txt"
[[ -f "$WORK/conformance-report.txt" ]] && cat "$WORK/conformance-report.txt"
cat "$WORK/results.txt"
exit $STATUS
