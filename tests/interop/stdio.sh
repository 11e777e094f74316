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
# and, with TASKGATE_INTEROP_RMCP=1 (the default), a second taskgate ([upgrade] enabled) with
#   rmcp-stdio       rmcp-server/ --stdio (rmcp 3.11.0, dual-era: 2025-11-25 and 2026-07-28)
#   rmcp-stdio-pure  rmcp-server/ --stdio --modern-only (2026-07-28 only; never sent initialize)
# Steps (each must pass):
#   stdio-ts-client       task-client.mjs on ts-stdio; its checks equal the ts-http run's, check
#                         by check (the 2025 task lifecycle through taskgate is the same over stdio)
#   stdio-py-client       py_task_client.py on py-stdio, and task-client.mjs on py-stdio
#   stdio-everything      stdio-check.mjs everything: tools, a plain call, a task to its end
#   stdio-killed          stdio-check.mjs killed: the child killed mid-task → task failed, restart
#   stdio-no-orphans      after SIGTERM to taskgate, none of its children is left
# On each rmcp upstream U (rmcp-stdio, rmcp-stdio-pure), all through taskgate, every check must
# pass (there is no direct run of a stdio server to compare with; the clients' checks are the
# 2026-07-28 spec's, and rmcp's own HTTP server is compared with taskgate by modern.sh):
#   stdio-U-raw-client    modern-raw-client.mjs (the raw 2026-07-28 wire, 39 checks) and, at the
#   stdio-U-fastmcp-client  same time on the same child, modern_fastmcp_client.py (fastmcp.Client
#                         4.1.4 + fastmcp-tasks, 13 checks; skipped without .venv-modern)
#   stdio-U-bridge-client bridge-client.mjs (the TS SDK 1.32.2 2025-11-25 task client through
#                         taskgate's bridge, 17 checks; on rmcp-stdio-pure taskgate holds its
#                         sessions, and MRTR in a plain call and its GET stream as
#                         subscriptions/listen make 19), alone on the child (it counts every
#                         tasks/cancel the child logs)
#   stdio-U-lifecycle     stdio-modern-check.mjs: server/discover, a task-augmented tools/call
#                         answered resultType "task", tasks/get polled to completed with the
#                         result inline, 20 concurrent tasks/cancel of a running task -> one on
#                         the child, cancelled, both audit facts in the record and /metrics, two
#                         clients at once with colliding ids, kill -9 of the child mid-task ->
#                         failed with a statusMessage naming the restart, the next call works
#   stdio-rmcp-no-orphans after SIGTERM to that taskgate, none of its children is left
# The two upstreams' steps run at the same time, each in the order above.
#
# Results: DIR/stdio/results.txt, one `PASS|FAIL step` line each; exit 0 only when all passed.
# Environment: INTEROP_WORK=DIR (logs; default a new /tmp dir), INTEROP_SKIP_PYTHON=1,
# INTEROP_VENV=DIR (the Python venv run.sh makes; default tests/interop/.venv),
# TASKGATE_INTEROP_RMCP=0|1 (the rmcp steps; default 1). rmcp-server/ is built with
# `cargo build --locked`: in a suite run modern.sh (step g, before this step) built it already, so
# this is cargo's up-to-date check (about a second); run alone, it builds it (about 2 min).
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

HTTP_PID="" TG_PID="" RMCP_TG_PID=""
cleanup() {
    [[ -n "$TG_PID" ]] && kill -TERM "$TG_PID" 2>/dev/null
    [[ -n "$RMCP_TG_PID" ]] && kill -TERM "$RMCP_TG_PID" 2>/dev/null
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
# no_orphans NAME PID: SIGTERM to taskgate PID; NAME passes when none of its children is left.
no_orphans() {
    local name=$1 tg=$2 children left="" pid
    children=$(pgrep -P "$tg" | tr '\n' ' ')
    kill -TERM "$tg"
    for _ in $(seq 1 150); do
        kill -0 "$tg" 2>/dev/null || break
        sleep 0.1
    done
    for pid in $children; do
        if [[ -e /proc/$pid ]] && ! grep -q '^State:.*Z' "/proc/$pid/status" 2>/dev/null; then
            left+="$pid "
        fi
    done
    echo "children: $children left: $left" >"$WORK/$name.out"
    [[ -z "$children" ]] && left="(no children seen)"
    result "$name" "$([[ -z "$left" ]] && echo 0 || echo 1)"
}
no_orphans stdio-no-orphans "$TG_PID"
TG_PID=""

# ---- rmcp 3.11 over stdio: 2026-07-28 tasks (TASKGATE_INTEROP_RMCP=1) ------------------------------
RMCP=${TASKGATE_INTEROP_RMCP:-1}
RMCP_BIN="$HERE/rmcp-server/target/debug/taskgate-interop-rmcp-server"
MODERN_PY="$HERE/.venv-modern/bin/python"
if [[ $RMCP == 1 ]]; then
    RMCP_START=$SECONDS
    if ! timeout 1200 cargo build --locked --quiet --manifest-path "$HERE/rmcp-server/Cargo.toml" >"$WORK/rmcp-build.log" 2>&1; then
        log "building rmcp-server failed:"
        tail -n 30 "$WORK/rmcp-build.log"
        result stdio-rmcp-build 1
        RMCP=0
    else
        log "rmcp-server (rmcp 3.11.0) built or up to date in $((SECONDS - RMCP_START)) s"
    fi
else
    log "SKIP the rmcp stdio steps (TASKGATE_INTEROP_RMCP=$RMCP)"
fi
if [[ $RMCP == 1 ]]; then
    : >"$WORK/rmcp-stdio.received"
    : >"$WORK/rmcp-stdio-pure.received"
    {
        printf '[gateway]\nlisten = "127.0.0.1:0"\n\n[admin]\nlisten = "127.0.0.1:0"\n\n[store]\npath = "%s"\n\n[auth]\nmode = "none"\n' "$WORK/rmcp-store"
        # [upgrade] for bridge-client.mjs's plain client (2025 requests only).
        printf '\n[upgrade]\nenabled = true\n'
        printf '\n[[upstream]]\nname = "rmcp-stdio"\ncommand = [%s, "--stdio", "--received", %s]\n' "$(q "$RMCP_BIN")" "$(q "$WORK/rmcp-stdio.received")"
        printf '\n[[upstream]]\nname = "rmcp-stdio-pure"\ncommand = [%s, "--stdio", "--modern-only", "--received", %s]\n' "$(q "$RMCP_BIN")" "$(q "$WORK/rmcp-stdio-pure.received")"
    } >"$WORK/rmcp-taskgate.toml"
    RUST_LOG=${RUST_LOG:-info} "$BIN" serve --config "$WORK/rmcp-taskgate.toml" >"$WORK/rmcp-taskgate.out" 2>"$WORK/rmcp-taskgate.err" &
    RMCP_TG_PID=$!
    LINE=""
    for _ in $(seq 1 100); do
        LINE=$(head -1 "$WORK/rmcp-taskgate.out" 2>/dev/null)
        [[ -n "$LINE" ]] && break
        sleep 0.1
    done
    RGW=$(sed -n 's/.*"gateway":"\([^"]*\)".*/\1/p' <<<"$LINE")
    RADMIN=$(sed -n 's/.*"admin":"\([^"]*\)".*/\1/p' <<<"$LINE")
    for _ in $(seq 1 300); do
        curl -fsS "http://$RADMIN/readyz" >"$WORK/rmcp-readyz.json" 2>/dev/null && break
        sleep 0.1
    done
    if [[ -z "$RGW" ]] || ! curl -fsS "http://$RADMIN/readyz" >"$WORK/rmcp-readyz.json"; then
        log "the rmcp taskgate never got ready:"
        tail -n 20 "$WORK/rmcp-taskgate.err"
        result stdio-rmcp-taskgate 1
    else
        log "taskgate $RGW (admin $RADMIN) with rmcp 3.11 stdio children: $(cat "$WORK/rmcp-readyz.json")"
        # rmcp_steps U: the steps on upstream U, in order; `PASS|FAIL step` lines in
        # $WORK/rmcp-U.results, what they print in $WORK/rmcp-U.log. The two upstreams' steps run
        # at the same time (one child each, its own --received file).
        rmcp_steps() {
            local up=$1 url="http://$RGW/mcp/$1" raw fast="" rc
            local results="$WORK/rmcp-$1.results"
            : >"$results"
            step() { echo "$([[ $2 == 0 ]] && echo PASS || echo FAIL) $1" >>"$results"; }
            # Two real 2026-07-28 clients at once on the one child.
            timeout 180 "$NODE" "$HERE/modern-raw-client.mjs" "$url" --label "stdio-$up" --json "$WORK/stdio-$up-raw-client.json" \
                >"$WORK/stdio-$up-raw-client.log" 2>&1 &
            raw=$!
            if [[ -x "$MODERN_PY" ]]; then
                timeout 180 "$MODERN_PY" "$HERE/modern_fastmcp_client.py" "$url" --label "stdio-$up" --json "$WORK/stdio-$up-fastmcp-client.json" \
                    >"$WORK/stdio-$up-fastmcp-client.log" 2>&1 &
                fast=$!
            fi
            wait "$raw"
            step "stdio-$up-raw-client" $?
            log "  modern-raw-client: $(tail -n 1 "$WORK/stdio-$up-raw-client.log")"
            if [[ -n $fast ]]; then
                wait "$fast"
                step "stdio-$up-fastmcp-client" $?
                log "  modern_fastmcp_client: $(tail -n 1 "$WORK/stdio-$up-fastmcp-client.log")"
            else
                log "  SKIP stdio-$up-fastmcp-client (no $HERE/.venv-modern: modern.sh installs it)"
            fi
            # Alone on the child: it counts every tasks/cancel the child logs while it runs.
            local bridge_args=()
            [[ $up == rmcp-stdio-pure ]] && bridge_args=(--mrtr-plain --listen)
            run "stdio-$up-bridge-client" "$NODE" "$HERE/bridge-client.mjs" "$url" --label "stdio-$up" \
                --received "$WORK/$up.received" "${bridge_args[@]}"
            step "stdio-$up-bridge-client" $?
            log "  bridge-client: $("$NODE" -e 'const s=JSON.parse(require("fs").readFileSync(process.argv[1],"utf8"));console.log(`${s.passed}/${s.total}`+(s.failed.length?` (failed: ${s.failed.join(", ")})`:""))' "$WORK/stdio-$up-bridge-client.json" 2>/dev/null || echo "no summary")"
            # Last on this child: it is killed mid-task.
            pgrep -P "$RMCP_TG_PID" -f -- "--received $WORK/$up.received" >"$WORK/$up.pid"
            timeout 180 "$NODE" "$HERE/stdio-modern-check.mjs" "$url" --admin "$RADMIN" --upstream "$up" \
                --received "$WORK/$up.received" --pid-file "$WORK/$up.pid" --label "stdio-$up" --json "$WORK/stdio-$up-lifecycle.json" \
                >"$WORK/stdio-$up-lifecycle.log" 2>&1
            rc=$?
            step "stdio-$up-lifecycle" $rc
            log "  stdio-modern-check: $(tail -n 1 "$WORK/stdio-$up-lifecycle.log")"
            grep '^FAIL' "$WORK/stdio-$up-lifecycle.log" | sed 's/^/    /'
        }
        RMCP_UPS=(rmcp-stdio rmcp-stdio-pure)
        pids=()
        for up in "${RMCP_UPS[@]}"; do
            rmcp_steps "$up" >"$WORK/rmcp-$up.log" 2>&1 &
            pids+=($!)
        done
        wait "${pids[@]}"
        for up in "${RMCP_UPS[@]}"; do
            log "$up:"
            sed 's/^/  /' "$WORK/rmcp-$up.log"
            while read -r status name; do
                result "$name" "$([[ $status == PASS ]] && echo 0 || echo 1)"
            done <"$WORK/rmcp-$up.results"
        done
        no_orphans stdio-rmcp-no-orphans "$RMCP_TG_PID"
    fi
    RMCP_TG_PID=""
    log "rmcp stdio steps: $((SECONDS - RMCP_START)) s"
fi

if ((${#FAILED[@]})); then
    log "stdio: FAILED ${FAILED[*]}"
    exit 1
fi
log "stdio: all steps passed"
