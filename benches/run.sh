#!/usr/bin/env bash
# taskgate benchmark: the direct path, nginx and taskgate side by side, in one run (issue 7),
# with repeated runs (issue 15).
#
#   bash benches/run.sh                       # everything; adds the report to benches/RESULTS.md
#   DURATION=2 RECORDS=20000 bash benches/run.sh
#   SCENARIOS="1 3" REPEAT=5 bash benches/run.sh   # small calls and SSE only, 5 runs per cell
#
# Builds taskgate (--release) and benches/loadgen (--release, its own target dir
# benches/loadgen/target), starts on 127.0.0.1 ephemeral ports the bench upstream, taskgate (temp
# store) and nginx (plain reverse proxy; installed from Debian when missing and root, else
# skipped), runs scenarios 1-8 and prints one table per scenario (7: OAuth, needs openssl and
# python3; 8: scenario 4's task lifecycle under MCP 2026-07-28, the tasks extension: create,
# 10 × tasks/get with the result inline, no session; 9: scenario 4's 2025 lifecycle bridged by
# taskgate to the 2026 tasks extension, beside the same-era path; 10: task creation and scenario
# 4's lifecycle with the registry on PostgreSQL beside sled; 11: a stdio upstream, the small call
# and scenario 4's lifecycle at c=1/16/64 through taskgate beside the server's own stdio client and
# supergateway, see scenario11 below; 12: scenario 8's 2026 lifecycle reverse-bridged by taskgate
# onto a 2025-11-25 upstream session, beside the same-era path; 13: scenario 4's lifecycle of a
# gateway-owned task (issue 32: `upstream.tasks = "gateway"` in front of `upstream --no-tasks`,
# a server without tasks; taskgate runs the task, the server gets a plain call), beside scenario
# 4's upstream-task path; 14: scenario 4's lifecycle through a tier, three replicas on one
# PostgreSQL behind nginx round-robin with no stickiness (issue 35), beside the sidecar on sled;
# 15: scenario 1's small call at c=16 through a taskgate exporting every request's spans
# (`[telemetry]`, `sample_ratio = 1.0`, OTLP/HTTP to benches/otlp_receiver.py) beside the one
# without, issue 34's cost in the same run as nginx; 16: scenario 1's small call at c=16 to an
# `https://` upstream (the bench upstream with TLS, the test-only certificate of tests/fixtures/tls):
# taskgate verifying it against `upstream.ca_file` beside nginx's `proxy_pass https://` with
# `proxy_ssl_verify on`, each beside its own plain-HTTP path).
# Everything started here is killed on exit.
#
# Scenario 10's and 14's PostgreSQL: TASKGATE_BENCH_DATABASE_URL (or TASKGATE_TEST_DATABASE_URL) names a
# server where a database of its own is created; else a throwaway cluster is started as the tests
# do (tests/pg/cluster.sh: Debian's postgresql, loopback port, `synchronous_commit` and `fsync`
# on) and stopped on exit; without either, scenario 10 is skipped with a message.
#
# Repeats (issue 15): scenarios 1-5 and 8 run REPEAT times, interleaved: direct, nginx, taskgate,
# then again, so a slow spell of the machine hits every path. Tables show the median and the
# min–max spread; every run's numbers are kept under "Raw runs". Each run
# records the CPU that other processes used meanwhile (/proc/stat minus the benchmark's own
# processes) and the load average; past QUIET_PCT % of one core RESULTS says "machine not quiet".
#
# FLOOR=1 adds a path `hyper` to scenarios 1-5 and 8: benches/loadgen's `hyperproxy`, a reverse
# proxy on hyper and tokio alone, built like taskgate's data path (issue 15: the floor a
# hyper-based proxy cannot go below); the report then has a table "The hyper floor".
#
# TASKGATE_BIN=PATH runs that taskgate binary instead of building this checkout (for a before/after
# pair of runs of two revisions).
#
# Settings (environment): DURATION (s per timed case, default 2), WARMUP (s, 0.5), REPEAT (runs
# per case and path in scenarios 1-5, 8-13 and 15, default 3), QUIET_PCT (10),
# LIFECYCLE_TASKS (1000, scenarios 4, 8, 9 and 10), STDIO_TASKS (500, scenario 11's lifecycle, per
# concurrency and path: supergateway takes ~15 s for 1000 at ~800 req/s), CANCELS (1000), RECORDS (100000), SCENARIOS (which
# ones, default "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16"), RESULTS (output file, benches/RESULTS.md: the new report goes under the file's "a new report goes below this line" marker, after the goals table, or first under the title when there is no marker; every earlier section stays below it; "-" for none), KEEP=1 keeps the temp
# directory (logs, configs, raw JSON).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
DURATION=${DURATION:-2}
WARMUP=${WARMUP:-0.5}
REPEAT=${REPEAT:-3}
QUIET_PCT=${QUIET_PCT:-10}
LIFECYCLE_TASKS=${LIFECYCLE_TASKS:-1000}
CANCELS=${CANCELS:-1000}
RECORDS=${RECORDS:-100000}
RESULTS=${RESULTS:-$HERE/RESULTS.md}
STDIO_TASKS=${STDIO_TASKS:-500}
SCENARIOS=${SCENARIOS:-1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16}
want() { case " $SCENARIOS " in *" $1 "*) return 0 ;; esac; return 1; }
COMMAND="bash benches/run.sh"
ENVSET=""
for v in DURATION WARMUP REPEAT QUIET_PCT LIFECYCLE_TASKS STDIO_TASKS CANCELS RECORDS SCENARIOS FLOOR; do
  case " $(env | cut -d= -f1 | tr '\n' ' ') " in *" $v "*) ENVSET="$ENVSET$v='${!v}' " ;; esac
done
COMMAND="${ENVSET}${COMMAND}"
export CLK_TCK=$(getconf CLK_TCK)
# Trace export only where a scenario asks for it (15): the standard variables would turn it on
# for every taskgate started here.
unset OTEL_EXPORTER_OTLP_ENDPOINT OTEL_EXPORTER_OTLP_TRACES_ENDPOINT OTEL_TRACES_SAMPLER \
  OTEL_TRACES_SAMPLER_ARG OTEL_SERVICE_NAME

say() { printf '\n== %s\n' "$*" >&2; }

# ---- build ------------------------------------------------------------------------------------
if [ -n "${TASKGATE_BIN:-}" ]; then
  # Another build of taskgate (an older revision, for a before/after pair of runs).
  TASKGATE=$TASKGATE_BIN
  say "taskgate: $TASKGATE (TASKGATE_BIN, not built here)"
else
  say "building taskgate (release)"
  (cd "$ROOT" && cargo build --release --quiet --bin taskgate)
  TASKGATE="${CARGO_TARGET_DIR:-$ROOT/target}/release/taskgate"
fi
say "building benches/loadgen (release, target dir benches/loadgen/target)"
(cd "$HERE/loadgen" && CARGO_TARGET_DIR="$HERE/loadgen/target" cargo build --release --quiet)
LG="$HERE/loadgen/target/release/loadgen"
UPSTREAM_BIN="$HERE/loadgen/target/release/upstream"

# ---- nginx ------------------------------------------------------------------------------------
NGINX_BIN=$(command -v nginx || true)
[ -z "$NGINX_BIN" ] && [ -x /usr/sbin/nginx ] && NGINX_BIN=/usr/sbin/nginx
if [ -z "$NGINX_BIN" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  say "nginx missing: apt-get install -y nginx"
  if DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx >/dev/null 2>&1 ||
     { apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx >/dev/null 2>&1; }; then
    NGINX_BIN=$(command -v nginx || echo /usr/sbin/nginx)
  fi
fi
if [ -n "$NGINX_BIN" ] && [ -x "$NGINX_BIN" ]; then
  NGINX_VERSION=$("$NGINX_BIN" -v 2>&1 | sed 's/^nginx version: //')
else
  NGINX_BIN=""
  NGINX_VERSION="not available"
  say "nginx is not installed (and could not be installed): nginx is skipped"
fi

# ---- processes --------------------------------------------------------------------------------
LOAD_AT_START=$(cut -d' ' -f1-3 /proc/loadavg)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/taskgate-bench.XXXXXX")
RAW="$WORK/results.jsonl"
# shellcheck source=lib.sh
source "$HERE/lib.sh"
OWN_PG=0
PG_SETTINGS="not run"
cleanup() {
  if [ "$OWN_PG" = 1 ]; then pg_stop; fi
  bench_exit
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say "starting the bench upstream"
"$LG" spawn-ready --stdout "$WORK/upstream.out" --stderr "$WORK/upstream.err" --label upstream \
  -- "$UPSTREAM_BIN" --listen 127.0.0.1:0 --threads 1 > "$WORK/upstream.json"
UP_PID=$(json_field "$WORK/upstream.json" pid); PIDS+=("$UP_PID")
UP_ADDR=$(json_field "$WORK/upstream.json" addr)
echo "upstream $UP_ADDR (pid $UP_PID)" >&2
# Scenario 16: the same upstream with TLS (one more process, started only when it runs).
TLS_FIXTURES="$ROOT/tests/fixtures/tls"
UPS_PID=""; UPS_ADDR=""
if want 16; then
  "$LG" spawn-ready --stdout "$WORK/upstream-tls.out" --stderr "$WORK/upstream-tls.err" --label upstream-tls \
    -- "$UPSTREAM_BIN" --listen 127.0.0.1:0 --threads 1 \
    --tls-cert "$TLS_FIXTURES/local.pem" --tls-key "$TLS_FIXTURES/local.key" > "$WORK/upstream-tls.json"
  UPS_PID=$(json_field "$WORK/upstream-tls.json" pid); PIDS+=("$UPS_PID")
  UPS_ADDR=$(json_field "$WORK/upstream-tls.json" addr)
  echo "upstream (TLS) $UPS_ADDR (pid $UPS_PID)" >&2
fi

taskgate_config() { taskgate_toml "$1" "$2" "$3" "$UP_ADDR"; } # $1 file, $2 store dir, $3 extra [tasks] lines
start_taskgate() { # $1 config, $2 label, $3 json out, [$4 ready json out]
  # sets TG_PID TG_ADDR TG_ADMIN; logs in $3 with .out / .err for .json
  local log=${3%.json}
  "$LG" spawn-ready --stdout "$log.out" --stderr "$log.err" --label "$2" \
    ${4:+--json-out "$4"} -- "$TASKGATE" serve --config "$1" > "$3"
  TG_PID=$(json_field "$3" pid); PIDS+=("$TG_PID")
  TG_ADDR=$(json_field "$3" gateway); TG_ADMIN=$(json_field "$3" admin)
}

say "starting taskgate"
taskgate_config "$WORK/taskgate.toml" "$WORK/store" ""
start_taskgate "$WORK/taskgate.toml" taskgate "$WORK/taskgate.json"
echo "taskgate $TG_ADDR admin $TG_ADMIN (pid $TG_PID)" >&2
TGP_PID=$TG_PID; TGP_ADDR=$TG_ADDR

NG_ADDR=""; NG_CPU=""
if [ -n "$NGINX_BIN" ]; then
  say "starting nginx ($NGINX_VERSION)"
  NG_PORT=$("$LG" free-port)
  NGS_PORT=""; NGS_SERVER=""
  if [ -n "$UPS_ADDR" ]; then
    # Scenario 16: nginx to the TLS upstream, verifying its certificate as taskgate does.
    NGS_PORT=$("$LG" free-port)
    NGS_SERVER="
  upstream mcps {
    server $UPS_ADDR;
    keepalive 256;
    keepalive_requests 1000000;
  }
  server {
    listen 127.0.0.1:$NGS_PORT;
    keepalive_requests 1000000;
    location / {
      proxy_pass https://mcps;
      proxy_http_version 1.1;
      proxy_set_header Connection \"\";
      proxy_buffering off;
      proxy_ssl_verify on;
      proxy_ssl_trusted_certificate $TLS_FIXTURES/ca.pem;
      proxy_ssl_name localhost;
      proxy_ssl_server_name on;
      proxy_ssl_session_reuse on;
    }
  }"
  fi
  mkdir -p "$WORK/nginx"
  USER_LINE=""; [ "$(id -u)" = 0 ] && USER_LINE="user root;"
  cat > "$WORK/nginx/nginx.conf" <<EOF
$USER_LINE
worker_processes auto;
pid $WORK/nginx/nginx.pid;
error_log $WORK/nginx/error.log warn;
events { worker_connections 8192; }
http {
  access_log off;
  client_body_temp_path $WORK/nginx/body;
  proxy_temp_path $WORK/nginx/proxy;
  fastcgi_temp_path $WORK/nginx/fastcgi;
  uwsgi_temp_path $WORK/nginx/uwsgi;
  scgi_temp_path $WORK/nginx/scgi;
  upstream mcp {
    server $UP_ADDR;
    keepalive 256;
    keepalive_requests 1000000;
  }
  server {
    listen 127.0.0.1:$NG_PORT;
    keepalive_requests 1000000;
    location / {
      proxy_pass http://mcp;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }
  }$NGS_SERVER
}
EOF
  "$NGINX_BIN" -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" -g 'daemon off;' \
    > "$WORK/nginx/stdout" 2>&1 &
  NG_MASTER=$!; PIDS+=("$NG_MASTER")
  for _ in $(seq 400); do
    (exec 3<>"/dev/tcp/127.0.0.1/$NG_PORT") 2>/dev/null && break
    gone "$NG_MASTER" && { cat "$WORK/nginx/error.log" "$WORK/nginx/stdout" >&2; exit 1; }
    sleep 0.025
  done
  sleep 0.2
  NG_CPU=$(echo "$NG_MASTER" $(ps -o pid= --ppid "$NG_MASTER") | tr -s ' ' ',')
  NG_ADDR="127.0.0.1:$NG_PORT"
  NGS_ADDR=${NGS_PORT:+127.0.0.1:$NGS_PORT}
  echo "nginx $NG_ADDR${NGS_ADDR:+, to the TLS upstream $NGS_ADDR} (master and workers: $NG_CPU)" >&2
fi

# ---- the hyper floor (FLOOR=1) ------------------------------------------------------------------
HP_ADDR=""; HP_PID=""
if [ "${FLOOR:-0}" = 1 ]; then
  say "starting hyperproxy (the hyper floor)"
  "$LG" spawn-ready --stdout "$WORK/hyperproxy.out" --stderr "$WORK/hyperproxy.err" --label hyper \
    -- "$HERE/loadgen/target/release/hyperproxy" --upstream "$UP_ADDR" > "$WORK/hyperproxy.json"
  HP_PID=$(json_field "$WORK/hyperproxy.json" pid); PIDS+=("$HP_PID")
  HP_ADDR=$(json_field "$WORK/hyperproxy.json" addr)
  echo "hyperproxy $HP_ADDR (pid $HP_PID)" >&2
fi

# ---- scenarios 1-5 ----------------------------------------------------------------------------
# Every process of the benchmark (their CPU is not "other processes'" CPU).
TGB_PID=""; TGB_ADDR=""; TGG_PID=""; TGG_ADDR=""; UPN_PID=""; TGT_PID=""; TGT_ADDR=""; RX_PID=""
TGS_PID=""; TGS_ADDR=""
bench_pids() { echo "$UP_PID" $UPS_PID $TG_PID $TGB_PID $TGG_PID $TGT_PID $TGS_PID $RX_PID $UPN_PID $HP_PID ${NG_CPU//,/ } | tr -s ' ' ','; }
# run CASE TARGET REP ARGS..: one loadgen run against one path.
run() {
  local case=$1 target=$2 rep=$3 url cpu=""
  shift 3
  case $target in
    direct) url="http://$UP_ADDR/mcp" ;;
    nginx) url="http://$NG_ADDR/mcp"; cpu=$NG_CPU ;;
    nginx-https) url="http://$NGS_ADDR/mcp"; cpu=$NG_CPU ;;
    taskgate-https) url="http://$TGS_ADDR/mcp"; cpu=$TGS_PID ;;
    hyper) url="http://$HP_ADDR/mcp"; cpu=$HP_PID ;;
    taskgate) url="http://$TG_ADDR/mcp"; cpu=$TG_PID ;;
    taskgate-bridged) url="http://$TGB_ADDR/mcp"; cpu=$TGB_PID ;;
    taskgate-reverse) url="http://$TGB_ADDR/mcp"; cpu=$TGB_PID ;;
    taskgate-gateway) url="http://$TGG_ADDR/mcp"; cpu=$TGG_PID ;;
    taskgate-traced) url="http://$TGT_ADDR/mcp"; cpu=$TGT_PID ;;
  esac
  "$LG" run --url "$url" --target "$target" --case "$case" ${cpu:+--cpu-pid "$cpu"} \
    --rep "$rep" --bench-pids "$(bench_pids)" --json-out "$RAW" "$@" > /dev/null
}
targets() {
  echo direct; [ -n "$NG_ADDR" ] && echo nginx; [ -n "$HP_ADDR" ] && echo hyper; echo taskgate
}
each() { # each CASE ARGS..: the case against every path, REPEAT times, interleaved
  local case=$1 t rep
  shift
  say "$case"
  for rep in $(seq "$REPEAT"); do
    printf '  run %s:' "$rep" >&2
    for t in $(targets); do run "$case" "$t" "$rep" "$@"; printf ' %s' "$t" >&2; done
    echo >&2
  done
}
TIMED=(--duration "$DURATION" --warmup "$WARMUP")

want 1 && for c in 1 16 64; do
  each "1. small tools/call (~1 KiB JSON answer), c=$c" --scenario small --concurrency "$c" "${TIMED[@]}"
done
want 2 && each "2. large tools/call (~1 MiB JSON answer), c=4" --scenario big --concurrency 4 "${TIMED[@]}"
want 3 && each "3. SSE answer, 100 progress events + result sent at once, c=1" --scenario sse --concurrency 1 "${TIMED[@]}"
want 3 && each "3. SSE answer, 100 progress events + result sent at once, c=16" --scenario sse --concurrency 16 "${TIMED[@]}"
want 3 && each "3. SSE answer, 100 progress events 1 ms apart + result, c=16" --scenario sse --concurrency 16 --interval-ms 1 "${TIMED[@]}"
want 4 && each "4. task lifecycle (create, 10 × tasks/get, tasks/result), $LIFECYCLE_TASKS tasks, c=16" \
  --scenario lifecycle --concurrency 16 --count "$LIFECYCLE_TASKS"
want 8 && each "8. task lifecycle, 2026-07-28 (create, 10 × tasks/get with the result inline), $LIFECYCLE_TASKS tasks, c=16" \
  --scenario modern-lifecycle --concurrency 16 --count "$LIFECYCLE_TASKS"
# Scenario 9 (issue 12): scenario 4's 2025-11-25 lifecycle through a second taskgate whose
# upstream.protocol is "2026-07-28", so every task request is bridged to the tasks extension (the
# bench upstream serves both eras), beside the same-era path `taskgate`; interleaved like the others.
if want 9; then
  say "starting taskgate-bridged (upstream.protocol = \"2026-07-28\")"
  taskgate_config "$WORK/taskgate-br.toml" "$WORK/store-br" ""
  printf 'protocol = "2026-07-28"\n' >> "$WORK/taskgate-br.toml"
  start_taskgate "$WORK/taskgate-br.toml" taskgate-bridged "$WORK/taskgate-br.json"
  TGB_PID=$TG_PID; TGB_ADDR=$TG_ADDR; TG_PID=$TGP_PID; TG_ADDR=$TGP_ADDR
  case9="9. task lifecycle, 2025-11-25 client: same era (taskgate) and bridged to a 2026-07-28 upstream (taskgate-bridged), $LIFECYCLE_TASKS tasks, c=16"
  say "$case9"
  for rep in $(seq "$REPEAT"); do
    for t in direct taskgate taskgate-bridged; do
      run "$case9" "$t" "$rep" --scenario lifecycle --concurrency 16 --count "$LIFECYCLE_TASKS"
    done
  done
fi
# Scenario 12 (issue 33): scenario 8's 2026-07-28 lifecycle through a third taskgate whose
# upstream.protocol is "2025-11-25", so every request is reverse-bridged onto a 2025 session it holds
# (the task call as a 2025 task, tasks/get with one tasks/result at the end), beside the same-era path
# `taskgate` (2026 passed through; the bench upstream serves both eras); interleaved like the others.
if want 12; then
  say "starting taskgate-reverse (upstream.protocol = \"2025-11-25\")"
  taskgate_config "$WORK/taskgate-rv.toml" "$WORK/store-rv" ""
  printf 'protocol = "2025-11-25"\n' >> "$WORK/taskgate-rv.toml"
  TGP12_PID=$TG_PID; TGP12_ADDR=$TG_ADDR
  start_taskgate "$WORK/taskgate-rv.toml" taskgate-reverse "$WORK/taskgate-rv.json"
  TGB_PID=$TG_PID; TGB_ADDR=$TG_ADDR; TG_PID=$TGP12_PID; TG_ADDR=$TGP12_ADDR
  case12="12. task lifecycle, 2026-07-28 client: same era (taskgate) and reverse-bridged to a 2025-11-25 upstream (taskgate-reverse), $LIFECYCLE_TASKS tasks, c=16"
  say "$case12"
  for rep in $(seq "$REPEAT"); do
    for t in direct taskgate taskgate-reverse; do
      run "$case12" "$t" "$rep" --scenario modern-lifecycle --concurrency 16 --count "$LIFECYCLE_TASKS"
    done
  done
fi
# Scenario 13 (issue 32): scenario 4's 2025-11-25 lifecycle (create, 10 × tasks/get, tasks/result)
# of a gateway-owned task: a second bench upstream started with --no-tasks (no capabilities.tasks,
# no tasks extension) behind a taskgate with `tasks = "gateway"`, which records the task, answers
# the CreateTaskResult, sends the server a plain tools/call and serves tasks/get and tasks/result
# itself; beside scenario 4's path `taskgate` (the upstream's own tasks). No direct path: the
# server has no tasks. Proxy CPU is taskgate's alone.
if want 13; then
  say "starting the bench upstream without tasks, and taskgate-gateway (upstream.tasks = \"gateway\")"
  "$LG" spawn-ready --stdout "$WORK/upstream-nt.out" --stderr "$WORK/upstream-nt.err" --label upstream-no-tasks \
    -- "$UPSTREAM_BIN" --listen 127.0.0.1:0 --threads 1 --no-tasks > "$WORK/upstream-nt.json"
  UPN_PID=$(json_field "$WORK/upstream-nt.json" pid); PIDS+=("$UPN_PID")
  taskgate_toml "$WORK/taskgate-gt.toml" "$WORK/store-gt" "" "$(json_field "$WORK/upstream-nt.json" addr)"
  printf 'tasks = "gateway"\n' >> "$WORK/taskgate-gt.toml"
  TGP13_PID=$TG_PID; TGP13_ADDR=$TG_ADDR
  start_taskgate "$WORK/taskgate-gt.toml" taskgate-gateway "$WORK/taskgate-gt.json"
  TGG_PID=$TG_PID; TGG_ADDR=$TG_ADDR; TG_PID=$TGP13_PID; TG_ADDR=$TGP13_ADDR
  case13="13. task lifecycle (create, 10 × tasks/get, tasks/result): the upstream's own tasks (taskgate) and gateway-owned tasks on a server without tasks (taskgate-gateway), $LIFECYCLE_TASKS tasks, c=16"
  say "$case13"
  for rep in $(seq "$REPEAT"); do
    for t in taskgate taskgate-gateway; do
      run "$case13" "$t" "$rep" --scenario lifecycle --concurrency 16 --count "$LIFECYCLE_TASKS"
    done
  done
fi
# Scenario 15 (issues 34, 36): scenario 1's small call at c=16 through a second taskgate that
# exports every request's SERVER and CLIENT span (`[telemetry]`, `sample_ratio = 1.0`) as OTLP/HTTP
# protobuf to benches/otlp_receiver.py, beside `taskgate` (no export), direct and nginx,
# interleaved. Proxy CPU is taskgate's alone (its export thread included; the receiver's CPU is
# the benchmark's own). The report's header says how many spans failed or were dropped (both
# should be 0: a figure with dropped spans is flattered).
TRACED_NOTE="not run"
if want 15; then
  say "starting an OTLP receiver and taskgate-traced ([telemetry] sample_ratio = 1.0)"
  start_otlp_receiver "$WORK" traced; PIDS+=("$RX_PID")
  taskgate_config "$WORK/taskgate-tr.toml" "$WORK/store-tr" ""
  printf '\n[telemetry]\notlp_endpoint = "%s"\nsample_ratio = 1.0\n' "$RX" >> "$WORK/taskgate-tr.toml"
  TGP15_PID=$TG_PID; TGP15_ADDR=$TG_ADDR; TGP15_ADMIN=$TG_ADMIN
  start_taskgate "$WORK/taskgate-tr.toml" taskgate-traced "$WORK/taskgate-tr.json"
  TGT_PID=$TG_PID; TGT_ADDR=$TG_ADDR; TGT_ADMIN=$TG_ADMIN
  TG_PID=$TGP15_PID; TG_ADDR=$TGP15_ADDR; TG_ADMIN=$TGP15_ADMIN
  case15="15. small tools/call (~1 KiB JSON answer), c=16: trace export off (taskgate) and on (taskgate-traced, sample_ratio 1.0)"
  say "$case15"
  for rep in $(seq "$REPEAT"); do
    printf '  run %s:' "$rep" >&2
    for t in direct nginx taskgate taskgate-traced; do
      [ "$t" = nginx ] && [ -z "$NG_ADDR" ] && continue
      run "$case15" "$t" "$rep" --scenario small --concurrency 16 "${TIMED[@]}"; printf ' %s' "$t" >&2
    done
    echo >&2
  done
  sleep 6  # the export thread sends what is left at most 5 s after a span ends
  TRACED_NOTE=$(curl -s "http://$TGT_ADMIN/metrics" | awk -v rx="$(cat "$WORK/received-traced" 2>/dev/null)" '
    /^taskgate_trace_export_failures_total/ { f = $2 } /^taskgate_trace_spans_dropped_total/ { d = $2 }
    END { split(rx, r, " "); printf "the receiver got %d exports, %d bytes; spans whose export failed: %s, dropped at a full queue: %s", r[1], r[2], f, d }')
fi
# Scenario 16: scenario 1's small call at c=16 to an https:// upstream (the bench upstream with
# TLS): a taskgate of its own whose upstream is `https://` with `ca_file` (the test CA), beside
# `taskgate` (plain), nginx (plain) and nginx's `proxy_pass https://` (`proxy_ssl_verify on`, the
# same CA), interleaved. The TLS cost of each proxy is its https path ÷ its plain one; the
# connections are kept alive, so the handshakes are a warm-up cost, not a per-request one.
if want 16; then
  say "starting taskgate-https (an https:// upstream, ca_file = the test CA)"
  taskgate_toml "$WORK/taskgate-https.toml" "$WORK/store-https" "" "$UPS_ADDR"
  sed -i "s|^url = \"http://$UPS_ADDR/mcp\"|url = \"https://$UPS_ADDR/mcp\"\nca_file = \"$TLS_FIXTURES/ca.pem\"|" "$WORK/taskgate-https.toml"
  TGP16_PID=$TG_PID; TGP16_ADDR=$TG_ADDR; TGP16_ADMIN=$TG_ADMIN
  start_taskgate "$WORK/taskgate-https.toml" taskgate-https "$WORK/taskgate-https.json"
  TGS_PID=$TG_PID; TGS_ADDR=$TG_ADDR
  TG_PID=$TGP16_PID; TG_ADDR=$TGP16_ADDR; TG_ADMIN=$TGP16_ADMIN
  case16="16. small tools/call (~1 KiB JSON answer), c=16, to an https:// upstream: taskgate-https and nginx-https beside their plain paths"
  say "$case16"
  for rep in $(seq "$REPEAT"); do
    printf '  run %s:' "$rep" >&2
    for t in direct nginx nginx-https taskgate taskgate-https; do
      case $t in nginx*) [ -z "$NG_ADDR" ] && continue ;; esac
      run "$case16" "$t" "$rep" --scenario small --concurrency 16 "${TIMED[@]}"; printf ' %s' "$t" >&2
    done
    echo >&2
  done
fi
want 5 && each "5. cancel storm: $CANCELS concurrent identical tasks/cancel for one task" \
  --scenario cancel --concurrency "$CANCELS" --stats-url "http://$UP_ADDR/stats"

# ---- scenario 7: OAuth (issue 14): a JWT on every request against auth none ---------------------
# A static authorization server (python3 http.server: OpenID configuration + a JWK Set with one
# RSA-2048 key made by openssl), one RS256 access token minted with openssl, and a taskgate of its
# own in `[auth] mode = "oauth"`; the small tools/call at c=16 through it and through the
# `auth none` taskgate, interleaved. CPU per request is the figure to compare (the key is cached:
# each request pays one RS256 verification and the claim checks).
scenario7() {
  local idp="$WORK/idp" port case rep jwt
  say "7. small tools/call, c=16: auth none against oauth (a JWT on every request)"
  mkdir -p "$idp/.well-known"
  port=$("$LG" free-port)
  openssl genrsa -out "$WORK/idp.key" 2048 2>/dev/null
  python3 - "$WORK/idp.key" "$idp" "$port" > "$WORK/jwt" <<'PY'
import base64, json, subprocess, sys, time
key, d, port = sys.argv[1:]
b64 = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=").decode()
out = subprocess.run(["openssl", "rsa", "-in", key, "-noout", "-modulus"], capture_output=True, text=True, check=True)
modulus = bytes.fromhex(out.stdout.strip().split("=", 1)[1])
iss = f"http://127.0.0.1:{port}"
json.dump({"issuer": iss, "jwks_uri": f"{iss}/jwks"}, open(f"{d}/.well-known/openid-configuration", "w"))
jwk = {"kty": "RSA", "kid": "bench", "alg": "RS256", "use": "sig", "n": b64(modulus), "e": "AQAB"}
json.dump({"keys": [jwk]}, open(f"{d}/jwks", "w"))
now = int(time.time())
head = b64(json.dumps({"alg": "RS256", "kid": "bench", "typ": "at+jwt"}).encode())
claims = b64(json.dumps({"iss": iss, "aud": "http://bench/mcp", "sub": "bench", "scope": "mcp",
                         "iat": now, "exp": now + 86400}).encode())
sig = subprocess.run(["openssl", "dgst", "-sha256", "-sign", key], input=f"{head}.{claims}".encode(),
                     capture_output=True, check=True).stdout
print(f"{head}.{claims}.{b64(sig)}")
PY
  python3 -m http.server "$port" --bind 127.0.0.1 --directory "$idp" > "$WORK/idp.log" 2>&1 &
  PIDS+=("$!")
  for _ in $(seq 400); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.025; done
  taskgate_config "$WORK/taskgate7.toml" "$WORK/store7" "
[auth]
mode = \"oauth\"
[auth.oauth]
issuer = \"http://127.0.0.1:$port\"
audience = \"http://bench/mcp\"
required_scopes = [\"mcp\"]"
  start_taskgate "$WORK/taskgate7.toml" "7. taskgate, auth oauth" "$WORK/tg7.json"
  local TG7_PID=$TG_PID TG7_ADDR=$TG_ADDR
  TG_PID=$TGP_PID; TG_ADDR=$TGP_ADDR
  jwt=$(cat "$WORK/jwt")
  case="7. small tools/call (~1 KiB JSON answer), c=16, auth none vs oauth (RS256 JWT on every request)"
  for rep in $(seq "$REPEAT"); do
    printf '  run %s: taskgate' "$rep" >&2
    "$LG" run --url "http://$TG_ADDR/mcp" --target taskgate --case "$case" --scenario small \
      --concurrency 16 "${TIMED[@]}" --cpu-pid "$TG_PID" --rep "$rep" \
      --bench-pids "$(bench_pids),$TG7_PID" --json-out "$RAW" > /dev/null
    printf ' taskgate-oauth\n' >&2
    LOADGEN_AUTHORIZATION="Bearer $jwt" "$LG" run --url "http://$TG7_ADDR/mcp" --target taskgate-oauth \
      --case "$case" --scenario small --concurrency 16 "${TIMED[@]}" --cpu-pid "$TG7_PID" --rep "$rep" \
      --bench-pids "$(bench_pids),$TG7_PID" --json-out "$RAW" > /dev/null
  done
  stop_pid "$TG7_PID"
}
want 7 && scenario7

# ---- scenario 6: registry scale (a taskgate of its own, fresh store) --------------------------
scenario6() {
say "6a. task creation: durable record before the reply, against a plain tools/call"
stop_pid "$TG_PID"
# A taskgate of its own, so scenario 6 below measures exactly $RECORDS records.
taskgate_config "$WORK/taskgate6a.toml" "$WORK/store6a" "max_live_tasks_per_owner = 10000000"
start_taskgate "$WORK/taskgate6a.toml" "6a. taskgate for creations" "$WORK/tg6a.json"
# Issue 3's creation cost: a task creation (record written and fdatasync'ed before the reply)
# against a plain tools/call through the same taskgate, at 1 and 64 concurrent clients.
for c in 1 64; do
  for t in direct taskgate; do
    url="http://$UP_ADDR/mcp"; cpu=""
    [ "$t" = taskgate ] && { url="http://$TG_ADDR/mcp"; cpu="$TG_PID"; }
    "$LG" run --url "$url" --target "$t" --case "6a. task creation (durable record before the reply), c=$c" \
      --scenario create --concurrency "$c" "${TIMED[@]}" --session-file "$WORK/session6a-$t-$c" \
      ${cpu:+--cpu-pid "$cpu"} --bench-pids "$(bench_pids)" --json-out "$RAW" > /dev/null
    "$LG" run --url "$url" --target "$t" --case "6a. plain tools/call on the same taskgate, c=$c" \
      --scenario small --concurrency "$c" "${TIMED[@]}" ${cpu:+--cpu-pid "$cpu"} \
      --bench-pids "$(bench_pids)" --json-out "$RAW" > /dev/null
  done
done
stop_pid "$TG_PID"
say "6. registry scale: $RECORDS task records"
taskgate_config "$WORK/taskgate6.toml" "$WORK/store6" "max_live_tasks_per_owner = 10000000"
start_taskgate "$WORK/taskgate6.toml" "6. fresh start, empty store" "$WORK/tg6.json"
SESSION6="$WORK/session6"
"$LG" mem --pid "$TG_PID" --label "6. fresh taskgate, empty store" --json-out "$RAW" > /dev/null
"$LG" run --url "http://$TG_ADDR/mcp" --target taskgate --case "6. create $RECORDS tasks on one session" \
  --scenario create --concurrency 64 --count "$RECORDS" --session-file "$SESSION6" \
  --cpu-pid "$TG_PID" --bench-pids "$(bench_pids)" --json-out "$RAW" > /dev/null
echo "  created" >&2
"$LG" mem --pid "$TG_PID" --label "6. after creating $RECORDS records" --json-out "$RAW" > /dev/null
"$LG" run --url "http://$TG_ADDR/mcp" --target taskgate --case "6. tasks/list first page, before restart" \
  --scenario list --concurrency 1 --duration 2 --warmup 0.2 --session-file "$SESSION6" \
  --cpu-pid "$TG_PID" --bench-pids "$(bench_pids)" --json-out "$RAW" > /dev/null
T0=$(date +%s%N); stop_pid "$TG_PID"; T1=$(date +%s%N)
echo "  stopped in $(( (T1 - T0) / 1000000 )) ms" >&2
start_taskgate "$WORK/taskgate6.toml" "6. restart on the same store ($RECORDS records)" "$WORK/tg6b.json" "$RAW"
echo "  restarted: $(cat "$WORK/tg6b.json")" >&2
"$LG" mem --pid "$TG_PID" --label "6. after restart" --json-out "$RAW" > /dev/null
"$LG" run --url "http://$TG_ADDR/mcp" --target taskgate --case "6. tasks/list first page, after restart" \
  --scenario list --concurrency 1 --duration 2 --warmup 0.2 --session-file "$SESSION6" \
  --cpu-pid "$TG_PID" --bench-pids "$(bench_pids)" --json-out "$RAW" > /dev/null
"$LG" run --url "http://$TG_ADDR/mcp" --target taskgate --case "6. tasks/list, every page (nextCursor walk)" \
  --scenario list-walk --session-file "$SESSION6" --cpu-pid "$TG_PID" --bench-pids "$(bench_pids)" --json-out "$RAW" > /dev/null
"$LG" mem --pid "$TG_PID" --label "6. after restart and the full list walk" --json-out "$RAW" > /dev/null
}
want 6 && scenario6

# ---- scenario 10: the task registry on PostgreSQL beside sled (issue 13) -----------------------------
# Two taskgates of their own on the same upstream, one per store; task creation (the record is
# committed, fdatasync'ed on sled, before the CreateTaskResult) at 1 and 16 clients, and scenario
# 4's lifecycle; interleaved direct, taskgate-sled, taskgate-pg, REPEAT times.
# pg_database N NAME: a database NAME of its own for scenario N, its URL exported as
# TASKGATE_DATABASE_URL and its server's settings in PG_SETTINGS. The server is
# TASKGATE_BENCH_DATABASE_URL's (or TASKGATE_TEST_DATABASE_URL's), else a throwaway cluster
# (started once, stopped on exit). Returns 1 (said) when there is none.
pg_database() {
  local n=$1 db=$2 base="${TASKGATE_BENCH_DATABASE_URL:-${TASKGATE_TEST_DATABASE_URL:-}}" psql
  if [ -z "$base" ]; then
    if ! compgen -G '/usr/lib/postgresql/*/bin/initdb' > /dev/null; then
      say "$n. skipped: no PostgreSQL (apt-get install postgresql, or set TASKGATE_BENCH_DATABASE_URL)"
      PG_SETTINGS="not available: scenario $n skipped"
      return 1
    fi
    say "$n. starting a throwaway PostgreSQL (tests/pg/cluster.sh)"
    # shellcheck source=../tests/pg/cluster.sh
    source "$ROOT/tests/pg/cluster.sh" >&2 || { say "$n. skipped: the PostgreSQL cluster did not start"; return 1; }
    OWN_PG=1
    base=$TASKGATE_TEST_DATABASE_URL
  fi
  psql="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)/psql"
  "$psql" -q -v ON_ERROR_STOP=1 "$base" -c "CREATE DATABASE $db" >&2
  export TASKGATE_DATABASE_URL="${base%/*}/$db"
  PG_SETTINGS=$("$psql" -At "$TASKGATE_DATABASE_URL" -c "SELECT 'PostgreSQL ' || current_setting('server_version') || ' on 127.0.0.1, synchronous_commit=' || current_setting('synchronous_commit') || ', fsync=' || current_setting('fsync') || ', wal_sync_method=' || current_setting('wal_sync_method') || ', shared_buffers=' || current_setting('shared_buffers') || ', data directory on ' || '$(df -PT "${PG_DIR:-/}" | awk 'NR==2 {print $2}')'")
  say "$n. $PG_SETTINGS"
}

scenario10() {
  local pids9 rep t url cpu c
  pg_database 10 "taskgate_bench_$$" || return 0
  taskgate_config "$WORK/taskgate10s.toml" "$WORK/store9s" "max_live_tasks_per_owner = 10000000"
  start_taskgate "$WORK/taskgate10s.toml" "10. taskgate, sled" "$WORK/tg10s.json"
  local S_PID=$TG_PID S_ADDR=$TG_ADDR
  taskgate_config "$WORK/taskgate10p.toml" "unused" "max_live_tasks_per_owner = 10000000"
  sed -i 's|^path = "unused"$|backend = "postgres"\nurl_env = "TASKGATE_DATABASE_URL"\npool_size = 16|' "$WORK/taskgate10p.toml"
  start_taskgate "$WORK/taskgate10p.toml" "10. taskgate, PostgreSQL" "$WORK/tg10p.json"
  local P_PID=$TG_PID P_ADDR=$TG_ADDR
  TG_PID=$TGP_PID; TG_ADDR=$TGP_ADDR
  pids9="$(bench_pids),$S_PID,$P_PID"
  ten() { # ten CASE ARGS..: direct, taskgate-sled, taskgate-pg, REPEAT times, interleaved
    local case=$1
    shift
    say "$case"
    for rep in $(seq "$REPEAT"); do
      printf '  run %s:' "$rep" >&2
      for t in direct taskgate-sled taskgate-pg; do
        case $t in
          direct) url="http://$UP_ADDR/mcp"; cpu="" ;;
          taskgate-sled) url="http://$S_ADDR/mcp"; cpu=$S_PID ;;
          taskgate-pg) url="http://$P_ADDR/mcp"; cpu=$P_PID ;;
        esac
        "$LG" run --url "$url" --target "$t" --case "$case" ${cpu:+--cpu-pid "$cpu"} --rep "$rep" \
          --bench-pids "$pids9" --json-out "$RAW" "$@" --session-file "$WORK/session9-$t" > /dev/null
        printf ' %s' "$t" >&2
      done
      echo >&2
    done
  }
  for c in 1 16; do
    ten "10. task creation (record committed before the reply), c=$c" --scenario create --concurrency "$c" "${TIMED[@]}"
  done
  ten "10. task lifecycle (create, 10 × tasks/get, tasks/result), $LIFECYCLE_TASKS tasks, c=16" \
    --scenario lifecycle --concurrency 16 --count "$LIFECYCLE_TASKS"
  stop_pid "$S_PID"
  stop_pid "$P_PID"
}
want 10 && scenario10

# ---- scenario 14: scenario 4's lifecycle through a tier (issue 35) ------------------------------
# Three taskgates of their own on one PostgreSQL database (`backend = "postgres"`, `pool_size = 8`
# each) behind an nginx of their own, round-robin, no stickiness: the upstream's 2025-11-25
# sessions are in the store, so every replica serves every request of every session (loadgen's one
# connection per client reaches nginx, which spreads its requests). Beside the sidecar on sled
# (path `taskgate`, the main one). Scenario 4's lifecycle, c=16, interleaved REPEAT times. The
# tier's proxy CPU is its three replicas' together; its nginx's and PostgreSQL's are not in it
# (said apart: TIER_CPU, CPU seconds over the scenario).
scenario14() {
  local rep t url cpu i r_pids="" r_addrs="" servers="" ng14_port ng14_pid ng14_cpu pids14 pg_pids ticks0 ticks1
  pg_database 14 "taskgate_bench14_$$" || { TIER_CPU="not run: no PostgreSQL"; return 0; }
  [ -n "$NGINX_BIN" ] || { say "14. skipped: no nginx"; TIER_CPU="not run: no nginx"; return 0; }
  for i in 1 2 3; do
    taskgate_config "$WORK/taskgate14-$i.toml" "unused" "max_live_tasks_per_owner = 10000000"
    sed -i 's|^path = "unused"$|backend = "postgres"\nurl_env = "TASKGATE_DATABASE_URL"\npool_size = 8|' "$WORK/taskgate14-$i.toml"
    start_taskgate "$WORK/taskgate14-$i.toml" "14. replica $i" "$WORK/tg14-$i.json"
    r_pids="$r_pids${r_pids:+,}$TG_PID"
    r_addrs="$r_addrs $TG_ADDR"
    servers="$servers    server $TG_ADDR;
"
  done
  TG_PID=$TGP_PID; TG_ADDR=$TGP_ADDR
  ng14_port=$("$LG" free-port)
  mkdir -p "$WORK/nginx14"
  cat > "$WORK/nginx14/nginx.conf" <<NGINX14
$USER_LINE
worker_processes auto;
pid $WORK/nginx14/nginx.pid;
error_log $WORK/nginx14/error.log warn;
events { worker_connections 8192; }
http {
  access_log off;
  client_body_temp_path $WORK/nginx14/body;
  proxy_temp_path $WORK/nginx14/proxy;
  fastcgi_temp_path $WORK/nginx14/fastcgi;
  uwsgi_temp_path $WORK/nginx14/uwsgi;
  scgi_temp_path $WORK/nginx14/scgi;
  upstream tier {
$servers    keepalive 256;
    keepalive_requests 1000000;
  }
  server {
    listen 127.0.0.1:$ng14_port;
    keepalive_requests 1000000;
    location / {
      proxy_pass http://tier;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host 127.0.0.1;
      proxy_buffering off;
    }
  }
}
NGINX14
  "$NGINX_BIN" -p "$WORK/nginx14" -c "$WORK/nginx14/nginx.conf" -g 'daemon off;' \
    > "$WORK/nginx14/stdout" 2>&1 &
  ng14_pid=$!; PIDS+=("$ng14_pid")
  for _ in $(seq 400); do
    (exec 3<>"/dev/tcp/127.0.0.1/$ng14_port") 2>/dev/null && break
    gone "$ng14_pid" && { cat "$WORK/nginx14/error.log" "$WORK/nginx14/stdout" >&2; return 1; }
    sleep 0.025
  done
  sleep 0.2
  ng14_cpu=$(echo "$ng14_pid" $(ps -o pid= --ppid "$ng14_pid") | tr -s ' ' ',')
  say "14. tier: replicas$r_addrs (pids $r_pids) behind nginx 127.0.0.1:$ng14_port"
  pids14="$(bench_pids),$r_pids,$ng14_cpu"
  pg_pids=$(pgrep -d, -x postgres || true)
  ticks() { local p t=0 v; for p in ${1//,/ }; do v=$(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null || echo 0); t=$((t + v)); done; echo "$t"; }
  local case14="14. task lifecycle (create, 10 × tasks/get, tasks/result) through a tier (3 replicas on PostgreSQL, nginx round-robin) beside the sidecar on sled, $LIFECYCLE_TASKS tasks, c=16"
  say "$case14"
  ticks0="$(ticks "$ng14_cpu") $(ticks "$pg_pids")"
  for rep in $(seq "$REPEAT"); do
    printf '  run %s:' "$rep" >&2
    for t in taskgate tier; do
      case $t in
        taskgate) url="http://$TGP_ADDR/mcp"; cpu=$TGP_PID ;;
        tier) url="http://127.0.0.1:$ng14_port/mcp"; cpu=$r_pids ;;
      esac
      "$LG" run --url "$url" --target "$t" --case "$case14" --cpu-pid "$cpu" --rep "$rep" \
        --bench-pids "$pids14" --json-out "$RAW" --scenario lifecycle --concurrency 16 \
        --count "$LIFECYCLE_TASKS" > /dev/null
      printf ' %s' "$t" >&2
    done
    echo >&2
  done
  ticks1="$(ticks "$ng14_cpu") $(ticks "$pg_pids")"
  TIER_CPU=$(echo "$ticks0 $ticks1" | awk -v hz="$CLK_TCK" \
    '{ printf "nginx %.2f s, PostgreSQL (every postgres process) %.2f s of CPU over the scenario", ($3 - $1) / hz, ($4 - $2) / hz }')
  say "14. $TIER_CPU; load average now $(cut -d' ' -f1-3 /proc/loadavg)"
  for i in ${r_pids//,/ }; do stop_pid "$i"; done
  stop_pid "$ng14_pid"
}
TIER_CPU="not run"
want 14 && scenario14

# ---- scenario 11: a stdio upstream (issue 31) --------------------------------------------------------
# The bench upstream run as a stdio MCP server (`upstream --stdio`: the same answers as over HTTP,
# newline-delimited JSON-RPC on stdin/stdout), reached three ways, interleaved REPEAT times:
#   direct        loadgen's own stdio client: one child, every worker's requests on its pipe (the
#                 floor: no HTTP, no proxy);
#   taskgate      a taskgate of its own whose upstream is `command = [upstream, --stdio]` (one
#                 shared child, the default `process`);
#   supergateway  supergateway (npm, the version pinned in benches/stdio/package-lock.json, npm ci
#                 there when missing) `--outputTransport streamableHttp --stateful --logLevel none`:
#                 one child per MCP session, each answer sent as SSE; skipped when node or npm is
#                 missing or npm ci fails.
# Cases: the small tools/call and scenario 4's 2025-11-25 task lifecycle, each at c=1, 16 and 64.
# Every worker opens its MCP session before the clock starts (--open-first: supergateway starts a
# child per session, outside the measured window) and ends it with DELETE after the run; proxy CPU
# is the proxy's own process (taskgate; supergateway's node), not its children.
scenario11() {
  local rep t url cpu c pids11 sg_bin="" sg_port="" SG_PID="" i
  local -a path_args
  say "11. starting taskgate with a stdio upstream (command = [upstream, --stdio])"
  cat > "$WORK/taskgate11.toml" <<EOT
[gateway]
listen = "127.0.0.1:0"

[admin]
listen = "127.0.0.1:0"

[store]
path = "$WORK/store11"

[tasks]

[[upstream]]
name = "bench"
command = ["$UPSTREAM_BIN", "--stdio"]
EOT
  start_taskgate "$WORK/taskgate11.toml" "11. taskgate, stdio upstream" "$WORK/tg11.json"
  local S_PID=$TG_PID S_ADDR=$TG_ADDR
  TG_PID=$TGP_PID; TG_ADDR=$TGP_ADDR
  if command -v node > /dev/null && command -v npm > /dev/null; then
    sg_bin="$HERE/stdio/node_modules/supergateway/dist/index.js"
    # The version package-lock.json pins (npm ci again when node_modules holds another).
    local pinned installed
    pinned=$(sed -n '/"node_modules\/supergateway": {/,/}/s/^ *"version": *"\([^"]*\)".*/\1/p' "$HERE/stdio/package-lock.json" | head -1)
    installed=$(sed -n 's/^ *"version": *"\([^"]*\)".*/\1/p' "$HERE/stdio/node_modules/supergateway/package.json" 2>/dev/null | head -1 || true)
    if [ ! -f "$sg_bin" ] || [ "$pinned" != "$installed" ]; then
      say "11. npm ci in benches/stdio (supergateway)"
      (cd "$HERE/stdio" && npm ci --no-audit --no-fund --loglevel=error) > "$WORK/npm-ci.log" 2>&1 ||
        { tail -20 "$WORK/npm-ci.log" >&2; sg_bin=""; }
    fi
  fi
  if [ -n "$sg_bin" ] && [ -f "$sg_bin" ]; then
    SG_VERSION=$(sed -n 's/^ *"version": *"\([^"]*\)".*/\1/p' "$HERE/stdio/node_modules/supergateway/package.json" | head -1)
    SG_VERSION="supergateway $SG_VERSION on node $(node --version)"
    sg_port=$("$LG" free-port)
    say "11. starting $SG_VERSION"
    node "$sg_bin" --stdio "$UPSTREAM_BIN --stdio" --outputTransport streamableHttp --stateful \
      --port "$sg_port" --logLevel none > "$WORK/supergateway.out" 2> "$WORK/supergateway.err" &
    SG_PID=$!; PIDS+=("$SG_PID")
    for i in $(seq 1200); do
      (exec 3<>"/dev/tcp/127.0.0.1/$sg_port") 2>/dev/null && break
      gone "$SG_PID" && break
      sleep 0.025
    done
    if gone "$SG_PID" || ! (exec 3<>"/dev/tcp/127.0.0.1/$sg_port") 2>/dev/null; then
      cat "$WORK/supergateway.err" >&2
      say "11. supergateway did not start: its path is skipped"
      SG_PID=""; SG_VERSION="did not start: skipped"
    fi
  else
    SG_VERSION="not available (node, npm or npm ci in benches/stdio missing): skipped"
    say "11. supergateway $SG_VERSION"
  fi
  pids11="$(bench_pids),$S_PID${SG_PID:+,$SG_PID}"
  eleven() { # eleven CASE ARGS..: direct, taskgate, supergateway, REPEAT times, interleaved
    local case=$1
    shift
    say "$case"
    for rep in $(seq "$REPEAT"); do
      printf '  run %s:' "$rep" >&2
      for t in direct taskgate supergateway; do
        case $t in
          direct) url=""; cpu="" ;;
          taskgate) url="http://$S_ADDR/mcp"; cpu=$S_PID ;;
          supergateway) [ -n "$SG_PID" ] || continue; url="http://127.0.0.1:$sg_port/mcp"; cpu=$SG_PID ;;
        esac
        if [ -z "$url" ]; then
          path_args=(--stdio "$UPSTREAM_BIN --stdio")
        else
          path_args=(--url "$url" --cpu-pid "$cpu")
        fi
        "$LG" run "${path_args[@]}" --target "$t" --case "$case" --rep "$rep" --open-first --close-sessions \
          --bench-pids "$pids11" --json-out "$RAW" "$@" > /dev/null
        printf ' %s' "$t" >&2
      done
      echo >&2
    done
  }
  for c in 1 16 64; do
    eleven "11. stdio upstream: small tools/call (~1 KiB JSON answer), c=$c" --scenario small --concurrency "$c" "${TIMED[@]}"
  done
  for c in 1 16 64; do
    eleven "11. stdio upstream: task lifecycle (create, 10 × tasks/get, tasks/result), $STDIO_TASKS tasks, c=$c" \
      --scenario lifecycle --concurrency "$c" --count "$STDIO_TASKS"
  done
  stop_pid "$S_PID"
  [ -n "$SG_PID" ] && stop_pid "$SG_PID"
  return 0
}
SG_VERSION="not run"
want 11 && scenario11

# ---- report -----------------------------------------------------------------------------------
REPORT=$("$LG" report --in "$RAW" --quiet-pct "$QUIET_PCT")
MEM_GIB=$(awk '/^MemTotal:/ {printf "%.1f", $2 / 1048576}' /proc/meminfo)
CPU_MODEL=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
REV=$(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo unknown)
DIRTY=$(cd "$ROOT" && git status --porcelain -- src vendor Cargo.toml Cargo.lock 2>/dev/null | wc -l)
[ "$DIRTY" != 0 ] && REV="$REV + uncommitted changes in src/"
# A binary given with TASKGATE_BIN is not this checkout's: say which file it was.
[ -n "${TASKGATE_BIN:-}" ] && REV="TASKGATE_BIN=$TASKGATE_BIN (the checkout is $REV)"
STORE_FS=$(df -PT "$WORK" | awk 'NR==2 {print $2 " (" $1 ")"}')
TITLE="# taskgate benchmark results"
HEADER="## Full report: $(date -u '+%Y-%m-%d %H:%M UTC'), $REV

Produced by \`$COMMAND\` (from the repository root) on $(date -u '+%Y-%m-%d %H:%M UTC').

| machine | |
|---|---|
| cores (nproc) | $(nproc) ($CPU_MODEL) |
| memory (MemTotal) | $MEM_GIB GiB |
| kernel | $(uname -sr) |
| load average (1, 5, 15 min) | $LOAD_AT_START at the start, $(cut -d' ' -f1-3 /proc/loadavg) at the end |
| taskgate | $REV, release build, default log level (info, to a file) |
| nginx | $NGINX_VERSION, \`worker_processes auto\`, \`proxy_buffering off\`, \`proxy_http_version 1.1\`, keepalive pool of 256 |
| upstream | benches/loadgen \`upstream\`, 1 tokio worker thread |
| load generator | benches/loadgen \`loadgen\`, 1 thread, one keep-alive HTTP/1.1 connection per concurrent client, each with its own MCP session (scenarios 1-4; 8 is 2026-07-28, sessionless) |
| timed cases | ${WARMUP} s warm-up, then ${DURATION} s measured |
| repeats | scenarios 1-5, 8-13, 15 and 16: $REPEAT runs per case and path, interleaved (direct, nginx, taskgate, then again); scenario 6: one |
| task store | temp directory on $STORE_FS (sled); scenario 10's \`taskgate-pg\`: $PG_SETTINGS, \`pool_size = 16\` |
| tier (scenario 14) | three replicas (\`pool_size = 8\` each) on $PG_SETTINGS, behind an nginx of their own (round-robin, keepalive 256, no stickiness); proxy CPU = the three replicas'; outside it: $TIER_CPU |
| traces (scenario 15) | \`taskgate-traced\`: a taskgate of its own with \`[telemetry] otlp_endpoint\` (benches/otlp_receiver.py, python3, answers 200) and \`sample_ratio = 1.0\`; $TRACED_NOTE |
| https upstream (scenario 16) | the bench upstream with TLS (rustls, the test-only certificate of tests/fixtures/tls, \`http/1.1\` by ALPN); \`taskgate-https\`: a taskgate of its own, \`url = "https://…"\`, \`ca_file\` = the test CA; \`nginx-https\`: the same nginx, \`proxy_pass https://\` with \`proxy_ssl_verify on\`, \`proxy_ssl_session_reuse on\` and a keepalive pool of 256 |
| stdio (scenario 11) | server: benches/loadgen \`upstream --stdio\` (the same answers over stdin/stdout); \`direct\`: loadgen's own stdio client, one child; \`taskgate\`: a taskgate of its own, \`command = [upstream, --stdio]\`, one shared child; \`supergateway\`: $SG_VERSION, \`--outputTransport streamableHttp --stateful --logLevel none\`, one child per session; each client session opened before the clock starts and ended with DELETE after the run; proxy CPU = the proxy process alone, not its children |

Everything runs on this one machine: load generator, proxy and upstream share the cores, so
absolute numbers move with the machine's load; compare the rows of one table (measured side by side,
interleaved, in the same run). Each cell is the median over the runs with the min–max spread in
parentheses; ratios and differences are of medians; errors are summed over the runs. See
*Machine quietness* for the CPU other processes used meanwhile. *p50/p99* are per request (scenario 3: per stream; scenario 4:
per task lifecycle of 12 requests; scenario 8: of 11). *added p50* = p50 − the direct path's p50. *proxy CPU µs/req* =
(utime + stime of the proxy process(es), from /proc/PID/stat, over the measured window) / requests;
for nginx the master and all workers are summed; /proc counts in ${CLK_TCK} Hz ticks, so a short
case (scenario 5 takes tens of ms) has a coarse CPU figure. Scenario 6 uses a taskgate of its own on
a fresh store, with \`tasks.max_live_tasks_per_owner\` raised (all records belong to one session).
"
printf '%s\n\n%s\n%s\n' "$TITLE" "$HEADER" "$REPORT"
if [ "$RESULTS" != "-" ]; then
  # The history stays. A file with the marker (benches/RESULTS.md: the goals table, then the
  # latest run) gets the new report right below the marker, everything else where it was; a file
  # without it gets the new report first, the earlier sections (everything after the title line)
  # following it.
  NEW="$WORK/results.md"
  MARKER='<!-- benches/run.sh: a new report goes below this line; earlier sections stay below it -->'
  if [ -s "$RESULTS" ] && grep -qxF -- "$MARKER" "$RESULTS"; then
    awk -v m="$MARKER" '{ print } $0 == m { exit }' "$RESULTS" > "$NEW"
    printf '\n%s\n%s\n\n' "$HEADER" "$REPORT" >> "$NEW"
    awk -v m="$MARKER" 'seen { print } $0 == m { seen = 1 }' "$RESULTS" | sed '/./,$!d' >> "$NEW"
  else
    printf '%s\n\n%s\n%s\n\n' "$TITLE" "$HEADER" "$REPORT" > "$NEW"
    if [ -s "$RESULTS" ]; then
      if [ "$(head -1 "$RESULTS")" = "$TITLE" ]; then tail -n +2 "$RESULTS"; else cat "$RESULTS"; fi |
        sed '/./,$!d' >> "$NEW"
    fi
  fi
  cp "$NEW" "$RESULTS"
  say "added to $RESULTS (earlier sections kept below)"
fi
if [ "${KEEP:-0}" = 1 ]; then cp "$RAW" "$WORK/results-copy.jsonl"; fi
