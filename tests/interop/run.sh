#!/usr/bin/env bash
# Interop harness: real third-party MCP peers, direct and through taskgate.
#
#   tests/interop/run.sh TASKGATE_BIN      e.g. tests/interop/run.sh target/debug/taskgate
#   tests/interop/run.sh none              direct only (no gateway): checks the peers and fixtures
#
# Needs node + npm (Node 22 for the conformance suite comes from node_modules, `npm ci` runs here
# when node_modules is missing) and python3 (a venv under tests/interop/.venv is created from
# requirements.txt when missing, and brought up to date when requirements.txt changed since).
# Everything listens on 127.0.0.1 (server-everything, which takes a port from $PORT, binds every
# interface); every process started here is stopped on exit. Two gateways run: `taskgate`
# ([upgrade] disabled) for steps a-d and f and `taskgate-upgrade` ([upgrade] enabled) for step e.
# Steps g-k (modern.sh, tier.sh, stdio.sh, reverse.sh, gateway-tasks.sh: fixtures, gateways, ports
# and work dirs of their own) start first and run in the background, at the same time as each
# other and as steps a-f here (a-d and f one after the other on `taskgate`, e beside them on
# `taskgate-upgrade`); the log of each is printed whole when it has ended, with its exit status
# and wall time, and the summary keeps the step order (issue 30).
# Exit 0 only when every step passed.
#
# Environment:
#   INTEROP_WORK=DIR            keep logs and results there (default: a new /tmp/taskgate-interop.* dir)
#   INTEROP_CHECK_LEVEL=report  conformance: only report per-check status differences (default strict:
#                               any SUCCESS/FAILURE/WARNING check whose status through the gateway
#                               differs from direct fails the run, besides the scenario pass sets)
#   INTEROP_SKIP_PYTHON=1       skip the Python task peers (mcp 1.30.0, fastmcp 3.4.11)
#   INTEROP_RACE_ROUNDS=N       rounds of the cancel-vs-completion race (step f; default 30)
#   INTEROP_TRACE=1             task clients record every HTTP exchange in their JSON summaries
#   TASKGATE_INTEROP_MODERN=0|1|report  step g, the 2026-07-28 peers (modern.sh; default 1: strict)
#   TASKGATE_INTEROP_RMCP=0|1   step g also builds and runs rmcp-server/ (rmcp 3.11.0) as a second upstream,
#                               and step i runs it as a stdio child with 2026-07-28 tasks (default 1)
#   TASKGATE_INTEROP_TIER=0|1   step h, a tier of three replicas on PostgreSQL behind nginx (tier.sh; default 1)
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TLS_FIXTURES=$(cd "$HERE/../fixtures/tls" && pwd)
BIN=${1:-}
if [[ -z "$BIN" ]]; then
    echo "usage: $0 TASKGATE_BIN|none" >&2
    exit 2
fi
if [[ "$BIN" != none ]]; then
    [[ "$BIN" == /* ]] || BIN="$PWD/$BIN"
    if [[ ! -x "$BIN" ]]; then
        echo "taskgate binary not found or not executable: $BIN" >&2
        exit 2
    fi
fi

WORK=${INTEROP_WORK:-$(mktemp -d /tmp/taskgate-interop.XXXXXX)}
mkdir -p "$WORK"
NODE22="$HERE/node_modules/node/bin/node"
CONFORMANCE="$HERE/node_modules/@modelcontextprotocol/conformance/dist/index.js"
VENV="$HERE/.venv"
TRACE_FLAG=()
[[ "${INTEROP_TRACE:-0}" == 1 ]] && TRACE_FLAG=(--trace)

# shellcheck source=procs.sh
source "$HERE/procs.sh"

# wait_port NAME PORT SECONDS: waits until 127.0.0.1:PORT accepts connections (for peers that print
# no listening line)
wait_port() {
    local name=$1 port=$2 secs=$3 i
    for ((i = 0; i < secs * 10; i++)); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            return 0
        fi
        if ! kill -0 "${PID[$name]}" 2>/dev/null; then
            echo "$name exited before it listened on $port; stderr:" >&2
            tail -n 20 "$WORK/$name.err" >&2
            return 1
        fi
        sleep 0.1
    done
    echo "$name not listening on $port after ${secs}s; stderr:" >&2
    tail -n 20 "$WORK/$name.err" >&2
    return 1
}

# alive NAME: true while NAME runs; otherwise says so, with the end of its stderr
alive() {
    kill -0 "${PID[$1]}" 2>/dev/null && return 0
    echo "FAIL $1 (pid ${PID[$1]}) is gone; results that used it are void. stderr tail:"
    tail -n 5 "$WORK/$1.err" | sed 's/^/     /'
    return 1
}

# ---- results ----------------------------------------------------------------------------------
PASSED=()
FAILED=()
result() { # result NAME STATUS
    if [[ $2 == 0 ]]; then PASSED+=("$1"); else FAILED+=("$1"); fi
}

# ---- install ----------------------------------------------------------------------------------
if [[ ! -x "$NODE22" || ! -f "$CONFORMANCE" ]]; then
    log "npm ci in $HERE"
    (cd "$HERE" && npm ci --no-audit --no-fund) >"$WORK/npm-ci.log" 2>&1 || {
        echo "npm ci failed:" >&2
        tail -n 30 "$WORK/npm-ci.log" >&2
        exit 1
    }
fi
if [[ ! -x "$NODE22" ]] || ! "$NODE22" --version | grep -q '^v22\.'; then
    echo "Node 22 missing at $NODE22 after npm ci (the npm package 'node' installs it in a preinstall script)" >&2
    exit 1
fi

PYTHON_ON=1
[[ "${INTEROP_SKIP_PYTHON:-0}" == 1 ]] && PYTHON_ON=0
# Step g. (modern.sh): TASKGATE_INTEROP_MODERN (see the header and step g. below).
case "${TASKGATE_INTEROP_MODERN:-1}" in
1 | strict) MODERN_LEVEL=strict ;;
report) MODERN_LEVEL=report ;;
*) MODERN_LEVEL="" ;;
esac
# install_venv DIR REQUIREMENTS LOG: (re)installs the venv DIR when it is missing or was built from
# another REQUIREMENTS (it remembers the file's sha256); pip's output in $WORK/LOG.
install_venv() {
    local dir=$1 req=$2 out="$WORK/$3" sum
    sum=$(sha256sum "$req" | cut -d' ' -f1)
    [[ -x "$dir/bin/python" && "$(cat "$dir/.requirements.sha256" 2>/dev/null)" == "$sum" ]] && return 0
    log "installing $(basename "$req") into $dir"
    { { [[ -x "$dir/bin/python" ]] || python3 -m venv "$dir"; } &&
        "$dir/bin/pip" install --disable-pip-version-check -q -r "$req" &&
        "$dir/bin/pip" check --disable-pip-version-check; } >"$out" 2>&1 || {
        echo "installing $req failed:" >&2
        tail -n 30 "$out" >&2
        rm -rf "$dir"
        return 1
    }
    echo "$sum" >"$dir/.requirements.sha256"
}
# Both venvs here, at the same time (pip mostly waits on the network), before the scripts of steps
# g.-k. start: they install the same venvs when run alone, and must not race each other here.
# .venv: the Python task peers (and reverse.sh's); .venv-modern: modern.sh, tier.sh, reverse.sh and
# gateway-tasks.sh (FastMCP 4).
VENV_JOBS=()
if [[ $PYTHON_ON == 1 || "$BIN" != none ]]; then
    install_venv "$VENV" "$HERE/requirements.txt" pip.log &
    VENV_JOBS+=($!)
fi
if [[ -n $MODERN_LEVEL || "$BIN" != none ]]; then
    install_venv "$HERE/.venv-modern" "$HERE/requirements-modern.txt" pip-modern.log &
    VENV_JOBS+=($!)
fi
for job in "${VENV_JOBS[@]}"; do
    wait "$job" || exit 1
done

log "work dir: $WORK"
log "node $("$NODE22" --version) for the harness; gateway: $BIN"

# ---- g.-k. start now, in the background ----------------------------------------------------------
# modern.sh, tier.sh, stdio.sh, reverse.sh and gateway-tasks.sh each start their own fixtures and
# taskgates on ports the kernel picks (port 0; tier.sh's fixed ones from INTEROP_PORT_RANGE, a
# range of its own), with their own work dirs and stores (tier.sh: its own database), so they run
# at the same time as each other and as steps a.-f. here. Most of their time is spent waiting on
# peers (a 2 s task, a conformance scenario's timeout), which overlaps; the one CPU-bound part, the
# rmcp 3.11 builds (modern.sh: rmcp-server, which stdio.sh waits for on cargo's lock; reverse.sh:
# rmcp-client), overlaps with those waits. Each one's output goes to $WORK/NAME.log and is printed
# whole when it has ended and steps a.-f. are done, with its exit status and wall time; the
# summary lists the results in step order.
LANES=()
declare -A LANE_PID=() LANE_LABEL=()
# lane_run NAME CMD...: CMD's output in $WORK/NAME.log; `EXIT_STATUS SECONDS` in $WORK/NAME.lane
lane_run() {
    local name=$1 start child rc
    shift
    start=$(date +%s)
    "$@" >"$WORK/$name.log" 2>&1 &
    child=$!
    trap 'kill -TERM "$child" 2>/dev/null; exit 143' TERM
    wait "$child"
    rc=$?
    echo "$rc $(($(date +%s) - start))" >"$WORK/$name.lane"
    return $rc
}
# after_rmcp_server CMD...: CMD (a program) once rmcp-server/ is built, by modern.sh or here (cargo's
# lock on its target dir makes the second build wait for the first, then find it up to date)
after_rmcp_server() {
    cargo build --locked --quiet --manifest-path "$HERE/rmcp-server/Cargo.toml" >"$WORK/rmcp-server-build.log" 2>&1
    exec "$@"
}
lane() { # lane NAME LABEL CMD...: starts CMD in the background (stopped with this script)
    local name=$1 label=$2
    shift 2
    log "$label: started (its log follows when it ends)"
    lane_run "$name" "$@" &
    LANES+=("$name")
    LANE_PID[$name]=$!
    LANE_LABEL[$name]=$label
    PID[lane-$name]=$!
}
# g. modern (2026-07-28): the tasks extension with real 2026-era peers (modern.sh).
# FastMCP 4.1.4 + fastmcp-tasks 4.1.4, conformance 0.2.0-alpha.12, a raw wire client and
# fastmcp.Client 4, direct and through taskgate (auth none; bearer behind bearer-hop.mjs), compared
# check by check (issue 11), on by default:
#   TASKGATE_INTEROP_MODERN=1       run, strict: any check that differs through taskgate fails
#   TASKGATE_INTEROP_MODERN=report  run, print the differences as notes (direct failures still fail)
#   0                               skipped (default: 1)
if [[ -n $MODERN_LEVEL ]]; then
    lane modern "g. modern (2026-07-28) steps, level $MODERN_LEVEL" \
        timeout 900 env MODERN_LEVEL="$MODERN_LEVEL" INTEROP_WORK="$WORK/modern" bash "$HERE/modern.sh" "$BIN"
else
    log "g. modern (2026-07-28) steps skipped: TASKGATE_INTEROP_MODERN=1 runs them (strict), =report only reports"
fi
# h. a tier: three taskgate replicas on one PostgreSQL behind nginx (issue 13, tier.sh):
# conformance tasks-* through nginx round-robin = direct (FastMCP 4.1.4), and the TS SDK task
# client's 2025-11-25 lifecycle through nginx round-robin; strict. PostgreSQL from
# TASKGATE_TEST_DATABASE_URL (tests/run-all.sh starts one), else tier.sh starts its own.
#   TASKGATE_INTEROP_TIER=0   skipped (default: 1)
# Its replicas' and nginx's ports come from harness.mjs free-port in 20000 up to the ephemeral
# range; this script's own (server-everything's) from 10000-19999.
if [[ "$BIN" != none && ${TASKGATE_INTEROP_TIER:-1} == 1 ]]; then
    lane tier "h. tier: 3 replicas, PostgreSQL, nginx" \
        timeout 900 env INTEROP_WORK="$WORK/tier" INTEROP_PORT_RANGE=20000-65535 bash "$HERE/tier.sh" "$BIN"
else
    log "h. tier steps skipped"
fi
if [[ "$BIN" != none ]]; then
    # i. stdio upstreams: real peers as taskgate's children (stdio.sh): TS SDK, Python mcp and
    # server-everything as 2025-11-25 children, and (TASKGATE_INTEROP_RMCP=1) rmcp 3.11 over stdio
    # with 2026-07-28 tasks, dual-era and --modern-only (rmcp-server/, built by step g.; cargo's
    # lock makes stdio.sh wait for that build, or build it itself when g. is off).
    lane stdio "i. stdio upstreams (stdio.sh)" \
        timeout 900 env INTEROP_WORK="$WORK" INTEROP_VENV="$VENV" bash "$HERE/stdio.sh" "$BIN"
    # j. the reverse bridge: a 2026-07-28 client on a 2025-11-25 task server (reverse.sh). It
    # builds rmcp-client/ first thing: that waits until rmcp-server/ is built, as two builds at
    # once would each take twice as long, and step g. (the longest) needs rmcp-server/ first.
    REVERSE=(timeout 900 env INTEROP_WORK="$WORK" bash "$HERE/reverse.sh" "$BIN")
    if [[ ${TASKGATE_INTEROP_RMCP:-1} == 1 ]]; then
        lane reverse "j. reverse bridge (reverse.sh)" after_rmcp_server "${REVERSE[@]}"
    else
        lane reverse "j. reverse bridge (reverse.sh)" "${REVERSE[@]}"
    fi
    # k. gateway-owned tasks: task clients on a server without tasks (gateway-tasks.sh).
    lane gateway-tasks "k. gateway-owned tasks (gateway-tasks.sh)" \
        timeout 300 env INTEROP_WORK="$WORK" INTEROP_VENV="$VENV" bash "$HERE/gateway-tasks.sh" "$BIN"
fi
STEPS_START=$(date +%s)

# ---- upstream fixtures ------------------------------------------------------------------------
start conformance-server "$NODE22" "$HERE/conformance-server.mjs" --port 0
MODES=(stateful stateless json)
for mode in "${MODES[@]}"; do
    start "ts-$mode" "$NODE22" "$HERE/task-server.mjs" --mode "$mode" --port 0
done
# Without capabilities.tasks (step f): the SDK as it is, and one that ignores params.task.
start ts-notasks "$NODE22" "$HERE/task-server.mjs" --mode notasks --port 0
start ts-legacy "$NODE22" "$HERE/task-server.mjs" --mode legacy --port 0
if [[ $PYTHON_ON == 1 ]]; then
    start py-stateful "$VENV/bin/python" "$HERE/py_task_server.py" --port 0
    # The same server over TLS (uvicorn's own), its certificate from the test-only CA of
    # tests/fixtures/tls: taskgate's https:// upstreams, with upstream.ca_file.
    start py-tls "$VENV/bin/python" "$HERE/py_task_server.py" --port 0 \
        --tls-cert "$TLS_FIXTURES/local.pem" --tls-key "$TLS_FIXTURES/local.key"
    start fastmcp "$VENV/bin/python" "$HERE/fastmcp_task_server.py" --port 0
fi

# A real HTTP proxy (tinyproxy, Debian's package) with Basic credentials, for taskgate's
# upstream.proxy: the py-tls server reached through its CONNECT tunnel (step d.).
PROXY_ON=0
if [[ $PYTHON_ON == 1 ]] && command -v tinyproxy >/dev/null 2>&1; then
    PROXY_PORT=$(INTEROP_PORT_RANGE=20000-29999 "$NODE22" "$HERE/harness.mjs" free-port)
    printf 'Port %s\nListen 127.0.0.1\nAllow 127.0.0.1\nTimeout 60\nMaxClients 64\nLogLevel Connect\nLogFile "%s"\nBasicAuth taskgate interop-proxy-secret\n' \
        "$PROXY_PORT" "$WORK/tinyproxy.log" >"$WORK/tinyproxy.conf"
    start tinyproxy tinyproxy -d -c "$WORK/tinyproxy.conf"
    PROXY_ON=1
fi

# server-everything takes its port from $PORT and does not report what it bound (PORT=0 would be
# lost), so it gets an ephemeral port picked by binding 127.0.0.1:0; it listens on every interface.
EVERYTHING_PORT=$(INTEROP_PORT_RANGE=10000-19999 "$NODE22" "$HERE/harness.mjs" free-port)
start everything env PORT="$EVERYTHING_PORT" "$NODE22" "$HERE/node_modules/@modelcontextprotocol/server-everything/dist/index.js" streamableHttp

UPSTREAMS=(conformance-server "${MODES[@]/#/ts-}" ts-notasks ts-legacy)
[[ $PYTHON_ON == 1 ]] && UPSTREAMS+=(py-stateful py-tls fastmcp)
declare -A DIRECT=()
# Up to 90 s: at the start of a run the fixtures of steps g.-k. import their SDKs at the same time
# (a Python fixture has taken 50 s on a busy 2-core machine).
for name in "${UPSTREAMS[@]}"; do
    wait_ready "$name" 90 || exit 1
    DIRECT[$name]=$(field "$name" listening)
    log "$name: ${DIRECT[$name]}"
done
wait_port everything "$EVERYTHING_PORT" 30 || exit 1
if [[ $PROXY_ON == 1 ]]; then
    wait_port tinyproxy "$PROXY_PORT" 30 || exit 1
    # The same server as py-tls; through taskgate by way of the proxy.
    DIRECT[py-tls-proxy]=${DIRECT[py-tls]}
    # Its liveness is the server's (the proxy's shows in the tunnels it logged).
    PID[py-tls-proxy]=${PID[py-tls]}
    log "tinyproxy: 127.0.0.1:$PROXY_PORT (Basic credentials)"
fi
DIRECT[everything]="http://127.0.0.1:$EVERYTHING_PORT/mcp"
log "everything: ${DIRECT[everything]}"

# ---- taskgate ---------------------------------------------------------------------------------
declare -A VIA=()
if [[ "$BIN" != none ]]; then
    CONFIG="$WORK/taskgate.toml"
    {
        printf '[gateway]\nlisten = "127.0.0.1:0"\ndrain_timeout_ms = 1000\n\n'
        printf '[admin]\nlisten = "127.0.0.1:0"\n\n'
        printf '[store]\npath = "%s"\n\n' "$WORK/taskgate-store"
        printf '[auth]\nmode = "none"\n\n[upgrade]\nenabled = false\n'
        for name in "${UPSTREAMS[@]}"; do
            printf '\n[[upstream]]\nname = "%s"\nurl = "%s"\n' "$name" "${DIRECT[$name]}"
            [[ "${DIRECT[$name]}" == https://* ]] && printf 'ca_file = "%s"\n' "$TLS_FIXTURES/ca.pem"
        done
        if [[ $PROXY_ON == 1 ]]; then
            printf '\n[[upstream]]\nname = "py-tls-proxy"\nurl = "%s"\nca_file = "%s"\n' "${DIRECT[py-tls]}" "$TLS_FIXTURES/ca.pem"
            # The password from the environment, as a user would keep it out of the file.
            printf 'proxy = "http://taskgate:${INTEROP_PROXY_PASSWORD}@127.0.0.1:%s"\n' "$PROXY_PORT"
        fi
    } >"$CONFIG"
    start taskgate env INTEROP_PROXY_PASSWORD=interop-proxy-secret "$BIN" serve --config "$CONFIG"
    wait_ready taskgate 60 || exit 1
    GW=$(field taskgate listening.gateway)
    ADMIN=$(field taskgate listening.admin)
    log "taskgate: gateway $GW, admin $ADMIN"
    for name in "${UPSTREAMS[@]}"; do
        VIA[$name]="http://$GW/mcp/$name"
    done
    [[ $PROXY_ON == 1 ]] && VIA[py-tls-proxy]="http://$GW/mcp/py-tls-proxy"
fi

# A second taskgate, with [upgrade] enabled, for the upgrade steps (e.): the first one must leave
# plain calls alone, which the lifecycle clients check.
UPGRADE_UPSTREAMS=(ts-stateful everything)
declare -A UPGRADE_VIA=()
if [[ "$BIN" != none ]]; then
    UPGRADE_CONFIG="$WORK/taskgate-upgrade.toml"
    {
        printf '[gateway]\nlisten = "127.0.0.1:0"\ndrain_timeout_ms = 1000\n\n'
        printf '[admin]\nlisten = "127.0.0.1:0"\n\n'
        printf '[store]\npath = "%s"\n\n' "$WORK/taskgate-upgrade-store"
        printf '[auth]\nmode = "none"\n\n[upgrade]\nenabled = true\n'
        for name in "${UPGRADE_UPSTREAMS[@]}"; do
            printf '\n[[upstream]]\nname = "%s"\nurl = "%s"\n' "$name" "${DIRECT[$name]}"
        done
    } >"$UPGRADE_CONFIG"
    start taskgate-upgrade "$BIN" serve --config "$UPGRADE_CONFIG"
    wait_ready taskgate-upgrade 60 || exit 1
    UPGRADE_GW=$(field taskgate-upgrade listening.gateway)
    UPGRADE_ADMIN=$(field taskgate-upgrade listening.admin)
    log "taskgate-upgrade ([upgrade] enabled): gateway $UPGRADE_GW, admin $UPGRADE_ADMIN"
    for name in "${UPGRADE_UPSTREAMS[@]}"; do
        UPGRADE_VIA[$name]="http://$UPGRADE_GW/mcp/$name"
    done
fi

# ---- e. upgrade of plain calls: clients without capabilities.tasks call required tools ----------
# Step e. talks to taskgate-upgrade only (its own gateway and store; the upstreams ts-stateful, on
# sessions of its own, and server-everything, which no other step uses), so it runs in the
# background from here, beside steps a.-d. and f. on taskgate; its log is printed whole, and its
# results take their place after d.'s, once f. is done.
# run_upgrade LABEL UPSTREAM TOOL ARGS_JSON STATUS "VIA_CHECKS" CLIENT...
#   direct: CLIENT --expect error --list=false URL TOOL ARGS_JSON: the server's own refusal;
#   via taskgate-upgrade: CLIENT VIA_CHECKS URL TOOL ARGS_JSON must succeed (VIA_CHECKS: the
#   client's --expect/--min-*/--text options, no spaces inside values), and taskgate's newest
#   record for TOOL must be origin=upgraded with STATUS.
run_upgrade() {
    local label=$1 upstream=$2 tool=$3 args=$4 status=$5 checks
    read -ra checks <<<"$6"
    shift 6
    log "$label: direct ${DIRECT[$upstream]}"
    run_fg timeout 120 "$@" --expect error --list=false --label "$label direct" "${DIRECT[$upstream]}" "$tool" "$args" >"$WORK/upgrade-$label-direct.json" 2>"$WORK/upgrade-$label-direct.err"
    local hargs=(--label "$label" --direct "$WORK/upgrade-$label-direct.json")
    if [[ -n "${UPGRADE_VIA[$upstream]:-}" ]]; then
        log "$label: via ${UPGRADE_VIA[$upstream]}"
        run_fg timeout 120 "$@" "${checks[@]}" --label "$label via" "${UPGRADE_VIA[$upstream]}" "$tool" "$args" >"$WORK/upgrade-$label-via.json" 2>"$WORK/upgrade-$label-via.err"
        hargs+=(--via "$WORK/upgrade-$label-via.json" --admin "$UPGRADE_ADMIN" --upstream "$upstream" --tool "$tool" --status "$status")
    fi
    "$NODE22" "$HERE/harness.mjs" upgrade "${hargs[@]}" | tee "$WORK/upgrade-$label-report.txt"
    local rc=${PIPESTATUS[0]}
    alive "$upstream" || rc=1
    [[ -n "${UPGRADE_VIA[$upstream]:-}" ]] && { alive taskgate-upgrade || rc=1; }
    result "$label$([[ -n "${UPGRADE_VIA[$upstream]:-}" ]] && echo ' direct fails + via taskgate upgrades' || echo ' direct')" "$rc"
}
upgrade_steps() {
    # Results to a file: this runs in a subshell.
    result() { echo "$2 $1" >>"$WORK/upgrade-results.txt"; }
    trap '[[ -n "$FG" ]] && kill -TERM "$FG" 2>/dev/null; exit 143' TERM
    TS_UPGRADE=("$NODE22" "$HERE/upgrade-client.mjs")
    PY_UPGRADE=("$VENV/bin/python" "$HERE/py_upgrade_client.py")
    SLOW='{"duration_ms":1500,"steps":5}'
    RESEARCH='{"topic":"python"}'
    AMBIGUOUS='{"topic":"python","ambiguous":true}'
    run_upgrade upgrade-ts-client-ts-server ts-stateful slow_task "$SLOW" completed \
        "--min-progress 2 --text ^slow_task.done" "${TS_UPGRADE[@]}"
    run_upgrade upgrade-ts-client-everything everything simulate-research-query "$RESEARCH" completed \
        "--min-progress 2 --text Research.Report:.python" "${TS_UPGRADE[@]}"
    run_upgrade upgrade-ts-client-everything-elicit everything simulate-research-query "$AMBIGUOUS" completed \
        "--min-progress 2 --min-elicitations 1 --text Clarification" "${TS_UPGRADE[@]}" --elicit accept
    run_upgrade upgrade-ts-client-ts-server-elicit ts-stateful ask_task '{}' completed \
        "--min-elicitations 1 --text ^ask_task:.accept" "${TS_UPGRADE[@]}" --elicit accept
    run_upgrade upgrade-ts-client-ts-server-no-elicitation ts-stateful ask_task '{}' cancelled \
        "--expect error --error-text capabilities\.elicitation.*cancelled" "${TS_UPGRADE[@]}"
    if [[ $PYTHON_ON == 1 ]]; then
        run_upgrade upgrade-py-client-ts-server ts-stateful slow_task "$SLOW" completed \
            "--min-progress 2 --text ^slow_task.done" "${PY_UPGRADE[@]}"
        run_upgrade upgrade-py-client-everything everything simulate-research-query "$RESEARCH" completed \
            "--min-progress 2 --text Research.Report:.python" "${PY_UPGRADE[@]}"
        run_upgrade upgrade-py-client-everything-elicit everything simulate-research-query "$AMBIGUOUS" completed \
            "--min-progress 2 --min-elicitations 1 --text Clarification" "${PY_UPGRADE[@]}" --elicit accept
        run_upgrade upgrade-py-client-ts-server-elicit ts-stateful ask_task '{}' completed \
            "--min-elicitations 1 --text ^ask_task:.accept" "${PY_UPGRADE[@]}" --elicit accept
        run_upgrade upgrade-py-client-ts-server-no-elicitation ts-stateful ask_task '{}' cancelled \
            "--expect error --error-text capabilities\.elicitation.*cancelled" "${PY_UPGRADE[@]}"
    fi
}
: >"$WORK/upgrade-results.txt"
UPGRADE_START=$(date +%s)
log "e. upgrade steps: started (their log follows after f.)"
upgrade_steps >"$WORK/upgrade-steps.log" 2>&1 &
PID[upgrade-steps]=$!

# ---- a. conformance server scenarios ----------------------------------------------------------
"$NODE22" "$CONFORMANCE" list --server >"$WORK/conformance-scenarios.txt" 2>&1
run_conformance() { # run_conformance LABEL URL
    log "conformance --suite all against $2 ($1)"
    run_fg timeout 600 "$NODE22" "$CONFORMANCE" server --url "$2" --suite all -o "$WORK/conformance-$1" >"$WORK/conformance-$1.log" 2>&1
    local rc=$?
    [[ $rc == 124 ]] && echo "conformance run $1 timed out after 600 s" >>"$WORK/conformance-$1.log"
    return 0
}
run_conformance direct "${DIRECT[conformance-server]}"
CONF_ARGS=(--scenarios "$WORK/conformance-scenarios.txt" --expected "$HERE/conformance-expected-failures.txt"
    --direct-log "$WORK/conformance-direct.log" --direct-dir "$WORK/conformance-direct"
    --check-level "${INTEROP_CHECK_LEVEL:-strict}")
if [[ "$BIN" != none ]]; then
    run_conformance via "${VIA[conformance-server]}"
    CONF_ARGS+=(--via-log "$WORK/conformance-via.log" --via-dir "$WORK/conformance-via")
fi
"$NODE22" "$HERE/harness.mjs" conformance "${CONF_ARGS[@]}" | tee "$WORK/conformance-report.txt"
result "conformance$([[ "$BIN" != none ]] && echo ' direct = via taskgate' || echo ' direct')" "${PIPESTATUS[0]}"

# ---- client runs, direct and via taskgate -----------------------------------------------------
run_pair() { # run_pair LABEL UPSTREAM CLIENT...: CLIENT URL --label L, direct then via taskgate
    local label=$1 upstream=$2
    shift 2
    log "$label: direct ${DIRECT[$upstream]}"
    run_fg timeout 120 "$@" "${DIRECT[$upstream]}" --label "$label direct" "${TRACE_FLAG[@]}" >"$WORK/tasks-$label-direct.json" 2>"$WORK/tasks-$label-direct.err"
    local args=(--label "$label" --direct "$WORK/tasks-$label-direct.json")
    if [[ -n "${VIA[$upstream]:-}" ]]; then
        log "$label: via ${VIA[$upstream]}"
        run_fg timeout 120 "$@" "${VIA[$upstream]}" --label "$label via" "${TRACE_FLAG[@]}" >"$WORK/tasks-$label-via.json" 2>"$WORK/tasks-$label-via.err"
        args+=(--via "$WORK/tasks-$label-via.json")
    fi
    "$NODE22" "$HERE/harness.mjs" tasks "${args[@]}" | tee "$WORK/tasks-$label-report.txt"
    local rc=${PIPESTATUS[0]}
    alive "$upstream" || rc=1
    [[ -n "${VIA[$upstream]:-}" ]] && { alive taskgate || rc=1; }
    result "$label$([[ -n "${VIA[$upstream]:-}" ]] && echo ' direct + via taskgate' || echo ' direct')" "$rc"
}

# ---- b. SSE resumption (priming event, retry, Last-Event-ID), which the suite does not reach -----
run_pair sse-resume conformance-server "$NODE22" "$HERE/sse-resume-check.mjs"

# ---- c. task lifecycle, TypeScript SDK client against TypeScript SDK servers -------------------
for mode in "${MODES[@]}"; do
    run_pair "ts-client-ts-$mode" "ts-$mode" "$NODE22" "$HERE/task-client.mjs"
done

# ---- d. task lifecycle with the Python SDK (mcp 1.30.0), and across SDKs ------------------------
if [[ $PYTHON_ON == 1 ]]; then
    run_pair py-client-py-server py-stateful "$VENV/bin/python" "$HERE/py_task_client.py"
    run_pair ts-client-py-server py-stateful "$NODE22" "$HERE/task-client.mjs"
    run_pair py-client-ts-server ts-stateful "$VENV/bin/python" "$HERE/py_task_client.py"
    # The Python SDK server over TLS: direct, the client trusts the test CA (httpx reads
    # SSL_CERT_FILE); through taskgate, taskgate does (upstream.ca_file) and the client talks
    # plain HTTP to it.
    run_pair py-client-py-tls-server py-tls env SSL_CERT_FILE="$TLS_FIXTURES/ca.pem" "$VENV/bin/python" "$HERE/py_task_client.py"
    # The same through a real proxy (tinyproxy, Basic credentials): taskgate's connections to
    # the server are CONNECT tunnels (upstream.proxy), TLS inside them; the proxy's log must show
    # them and taskgate's must not show the password.
    if [[ $PROXY_ON == 1 ]]; then
        run_pair py-client-py-tls-server-via-proxy py-tls-proxy env SSL_CERT_FILE="$TLS_FIXTURES/ca.pem" "$VENV/bin/python" "$HERE/py_task_client.py"
        target=${DIRECT[py-tls]#https://}
        tunnels=$(grep -c "CONNECT ${target%%/*} " "$WORK/tinyproxy.log" 2>/dev/null || true)
        tunnels=${tunnels:-0}
        leaked=$(cat "$WORK/taskgate.out" "$WORK/taskgate.err" | grep -c "interop-proxy-secret" || true)
        log "py-tls-proxy: $tunnels CONNECT tunnel(s) in tinyproxy's log; the password in taskgate's log ${leaked:-0} time(s)"
        result "tinyproxy carries taskgate's tunnels, no password logged" "$([[ $tunnels -ge 1 && ${leaked:-0} == 0 ]] && echo 0 || echo 1)"
    fi
fi

# ---- e. (running since before a.): its log and results, in their place -------------------------
E_AT_PASSED=${#PASSED[@]} E_AT_FAILED=${#FAILED[@]}

# ---- f. cancellation (issue 4) against real task servers ----------------------------------------
# run_cancel LABEL UPSTREAM SCENARIO "VIA_ARGS" [ARGS...]: cancel-check.mjs SCENARIO, direct against
#   the server (with ARGS), then through taskgate with --admin/--upstream (taskgate's /metrics and
#   registry are checked too) plus VIA_ARGS (no spaces inside values); compared by harness.mjs
#   tasks, which fails when an info key named by --same differs between the two runs.
CANCEL_CHECK=("$NODE22" "$HERE/cancel-check.mjs")
run_cancel() {
    local label=$1 upstream=$2 scenario=$3 via_args same=""
    read -ra via_args <<<"$4"
    shift 4
    [[ $scenario == no-capability ]] && same=answer
    log "$label: direct ${DIRECT[$upstream]}"
    run_fg timeout 180 "${CANCEL_CHECK[@]}" "$scenario" "${DIRECT[$upstream]}" --label "$label direct" "$@" >"$WORK/$label-direct.json" 2>"$WORK/$label-direct.err"
    local args=(--label "$label" --direct "$WORK/$label-direct.json")
    [[ -n $same ]] && args+=(--same "$same")
    if [[ -n "${VIA[$upstream]:-}" ]]; then
        log "$label: via ${VIA[$upstream]}"
        run_fg timeout 180 "${CANCEL_CHECK[@]}" "$scenario" "${VIA[$upstream]}" --label "$label via" --admin "$ADMIN" --upstream "$upstream" "${via_args[@]}" "$@" >"$WORK/$label-via.json" 2>"$WORK/$label-via.err"
        args+=(--via "$WORK/$label-via.json")
    fi
    "$NODE22" "$HERE/harness.mjs" tasks "${args[@]}" | tee "$WORK/$label-report.txt"
    local rc=${PIPESTATUS[0]}
    alive "$upstream" || rc=1
    [[ -n "${VIA[$upstream]:-}" ]] && { alive taskgate || rc=1; }
    result "$label$([[ -n "${VIA[$upstream]:-}" ]] && echo ' direct + via taskgate' || echo ' direct')" "$rc"
}
# The seed's four paths with the TypeScript SDK 1.32.2 task server (stateful).
run_cancel cancel-ts-notasks-no-task ts-notasks no-capability ""
run_cancel cancel-ts-legacy-no-task ts-legacy no-capability ""
run_cancel cancel-ts-working ts-stateful cancel-working ""
run_cancel cancel-ts-completed ts-stateful cancel-completed ""
run_cancel cancel-ts-race ts-stateful race "" --rounds "${INTEROP_RACE_ROUNDS:-30}"
# fastmcp 3.4.11 accepts tasks/cancel of a completed task (the spec says -32602): direct that is
# what it answers; through taskgate the cancel is refused and never reaches it.
if [[ $PYTHON_ON == 1 ]]; then
    FASTMCP_RECEIVED=$(field fastmcp received)
    run_cancel cancel-fastmcp-completed fastmcp fastmcp-terminal "--direct-url ${DIRECT[fastmcp]}" --received "$FASTMCP_RECEIVED"
    # The same peer when taskgate has not seen the completion (a client without a GET stream): the
    # cancel goes upstream, fastmcp accepts it, and taskgate keeps `cancelled` against fastmcp's
    # later `completed`.
    run_cancel cancel-fastmcp-unseen-completion fastmcp fastmcp-unseen-completion "" --received "$FASTMCP_RECEIVED"
fi

wait "${PID[upgrade-steps]}"
unset "PID[upgrade-steps]"
log "e. upgrade steps (run beside a.-d. and f.), done in $(($(date +%s) - UPGRADE_START)) s:"
cat "$WORK/upgrade-steps.log"
E_PASSED=() E_FAILED=()
while read -r rc name; do
    if [[ $rc == 0 ]]; then E_PASSED+=("$name"); else E_FAILED+=("$name"); fi
done <"$WORK/upgrade-results.txt"
PASSED=("${PASSED[@]:0:E_AT_PASSED}" "${E_PASSED[@]}" "${PASSED[@]:E_AT_PASSED}")
FAILED=("${FAILED[@]:0:E_AT_FAILED}" "${E_FAILED[@]}" "${FAILED[@]:E_AT_FAILED}")
log "steps a.-f. done in $(($(date +%s) - STEPS_START)) s"

# ---- g.-k.: each one's log, whole, in the order they end ------------------------------------------
lane_show() { # lane_show NAME: what the lane printed, as run.sh has always shown it
    case $1 in
        tier) grep -v '^  note' "$WORK/tier.log" | sed 's/^/  | /' ;;
        reverse) sed -n '/^== reverse bridge/,$p' "$WORK/reverse.log" | sed 's/^/  | /' ;;
        gateway-tasks) sed -n '/^== gateway-owned tasks/,$p' "$WORK/gateway-tasks.log" | sed 's/^/  | /' ;;
        *) sed 's/^/  | /' "$WORK/$1.log" ;;
    esac
}
declare -A LANE_RC=() LANE_SECS=()
WAITING=("${LANES[@]}")
while ((${#WAITING[@]})); do
    pids=()
    for name in "${WAITING[@]}"; do pids+=("${LANE_PID[$name]}"); done
    ended=""
    wait -n -p ended "${pids[@]}"
    rc=$?
    left=()
    for name in "${WAITING[@]}"; do
        if [[ ${LANE_PID[$name]} == "$ended" ]]; then
            unset "PID[lane-$name]"
            read -r "LANE_RC[$name]" "LANE_SECS[$name]" <"$WORK/$name.lane" 2>/dev/null ||
                { LANE_RC[$name]=$rc LANE_SECS[$name]="?"; }
            log "${LANE_LABEL[$name]}: $([[ ${LANE_RC[$name]} == 0 ]] && echo PASS || echo "FAIL (exit ${LANE_RC[$name]})") in ${LANE_SECS[$name]} s"
            lane_show "$name"
        else
            left+=("$name")
        fi
    done
    WAITING=("${left[@]}")
done

# lane_results NAME LABEL: the PASS/FAIL lines of $WORK/NAME/results.txt as results
lane_results() {
    local name=$1 label=$2 rc=${LANE_RC[$1]}
    if [[ -s "$WORK/$name/results.txt" ]]; then
        while read -r status step; do
            result "$step" "$([[ $status == PASS ]] && echo 0 || echo 1)"
        done <"$WORK/$name/results.txt"
        [[ $rc != 0 ]] && ! grep -q '^FAIL' "$WORK/$name/results.txt" && result "$label exit status $rc" 1
    else
        result "$label (no results, exit $rc; see $WORK/$name.log)" 1
    fi
}
for name in "${LANES[@]}"; do
    case $name in
        modern) lane_results modern modern.sh ;;
        tier) lane_results tier tier.sh ;;
        stdio) lane_results stdio stdio.sh ;;
        reverse) result "reverse bridge: reverse.sh (see $WORK/reverse/results.txt)" "${LANE_RC[reverse]}" ;;
        gateway-tasks) result "gateway-owned tasks: gateway-tasks.sh (see $WORK/gateway-tasks/results.txt)" "${LANE_RC[gateway-tasks]}" ;;
    esac
done

# ---- gateway health after all of it ---------------------------------------------------------
if [[ "$BIN" != none ]]; then
    for gw in taskgate taskgate-upgrade; do
        if ! kill -0 "${PID[$gw]}" 2>/dev/null; then
            echo "FAIL $gw exited during the run; stderr tail:"
            tail -n 30 "$WORK/$gw.err"
            result "$gw still running" 1
        else
            result "$gw still running" 0
        fi
    done
    curl -fsS "http://$ADMIN/metrics" >"$WORK/taskgate-metrics.txt" 2>/dev/null || true
    curl -fsS "http://$UPGRADE_ADMIN/metrics" >"$WORK/taskgate-upgrade-metrics.txt" 2>/dev/null || true
    grep '^taskgate_upgraded_calls_total' "$WORK/taskgate-upgrade-metrics.txt" 2>/dev/null | grep -v ' 0$' | sed 's/^/  /'
    grep '^taskgate_cancel_requests_total' "$WORK/taskgate-metrics.txt" 2>/dev/null | grep -v ' 0$' | sed 's/^/  /'
fi

# ---- summary ----------------------------------------------------------------------------------
echo
echo "== interop summary (logs: $WORK) =="
for name in "${PASSED[@]}"; do echo "PASS $name"; done
for name in "${FAILED[@]}"; do echo "FAIL $name"; done
echo "interop: ${#PASSED[@]} passed, ${#FAILED[@]} failed"
[[ ${#FAILED[@]} == 0 ]]
