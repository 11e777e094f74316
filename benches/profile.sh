#!/usr/bin/env bash
# Where taskgate's CPU goes per request, counted in instructions (issue 15): taskgate runs under
# valgrind's callgrind, the bench upstream and loadgen drive one scenario through it, and the
# counters cover only the measured part (zeroed after a warm-up, dumped after the run). Unlike
# CPU time, instruction counts hardly move with the machine's load, so two binaries can be
# compared on a busy shared machine; they do not show time spent waiting in the kernel.
#
#   bash benches/profile.sh [small|sse|lifecycle|modern-lifecycle] [TASKGATE_BIN]
#   (sse: 100 progress events and the result sent at once; sse-apart: the same 1 ms apart, one
#   event per upstream read; per request = per stream)
#   COUNT=500 TOP=30 bash benches/profile.sh lifecycle /work/bins/taskgate-old
#   TOOL=strace bash benches/profile.sh small BIN   # system calls per request instead (strace -f -c)
#   TOOL=perf CONC=16 bash benches/profile.sh small BIN   # CPU samples, kernel included (perf record)
#   CONC=64 bash benches/profile.sh small BIN   # callgrind with 64 clients (small, sse, sse-apart:
#                                  # the window opens once their sessions are open, see below)
#   CACHESIM=1 CONC=64 bash benches/profile.sh small BIN   # and simulated L1/LL cache misses per request
#   PERF_CALLGRAPH=dwarf TOOL=perf ...   # call chains through code built without frame pointers
#   TOOL=perf PERF_EVENT=syscalls:sys_enter_futex KEEP=/tmp/f.data bash benches/profile.sh lifecycle BIN
#                                                          # who makes a system call, with call chains
#   bash benches/profile.sh small benches/loadgen/target/release/hyperproxy   # the hyper floor
#   KEEP=/tmp/small.cg bash benches/profile.sh small BIN   # keep the callgrind dump (perf.data with TOOL=perf)
#
# CONC (default 1) is the number of concurrent clients for every TOOL. With callgrind and CONC > 1
# (small, sse, sse-apart), the measured part is the middle of one long run: its clients open their
# sessions first (each initialize costs far more than a call, and the session store's write at
# initialize runs on other threads), so the counters are zeroed LEAD seconds (default 5) into the
# run and dumped 20 seconds later, and the requests are the bench upstream's count between the two.
# CACHESIM=1 adds valgrind's cache simulation (--cache-sim=yes: first-level and last-level misses
# per request; a model of one cache shared by all threads, no coherence between cores).
# TOOL=strace counts taskgate's system calls (all threads, warm-up and measured part together)
# per request: futex and the eventfd `write` are the cross-thread wake-ups CPU time hides.
# TOOL=perf samples taskgate's CPU (user and kernel, all threads) over the measured part at CONC
# concurrent clients (default 1) and prints the share of user and kernel time, the CPU per
# request, and the TOP symbols by their own samples; it needs perf (linux-perf) and a
# perf_event_paranoid that allows it (root does).
#
# Prints: requests measured, instructions per request (taskgate, all threads), the same with
# the idle cost subtracted (IDLE=5 seconds of no requests measured first; IDLE=0 skips), and the TOP
# functions by inclusive instructions per request. Needs valgrind (callgrind_control,
# callgrind_annotate). Everything started here stops on exit.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
SCENARIO=${1:-small}
TASKGATE=${2:-}
COUNT=${COUNT:-300}
TOP=${TOP:-25}
TOOL=${TOOL:-callgrind}
CONC=${CONC:-1}
case $TOOL in
  callgrind) command -v callgrind_control >/dev/null || { echo "needs valgrind (apt-get install valgrind)" >&2; exit 2; } ;;
  strace) command -v strace >/dev/null || { echo "needs strace (apt-get install strace)" >&2; exit 2; } ;;
  perf) command -v perf >/dev/null || { echo "needs perf (apt-get install linux-perf)" >&2; exit 2; } ;;
  *) echo "TOOL: callgrind, strace or perf" >&2; exit 2 ;;
esac
if [ -z "$TASKGATE" ]; then
  (cd "$ROOT" && cargo build --release --quiet --bin taskgate)
  TASKGATE="$ROOT/target/release/taskgate"
fi
(cd "$HERE/loadgen" && CARGO_TARGET_DIR="$HERE/loadgen/target" cargo build --release --quiet)
LG="$HERE/loadgen/target/release/loadgen"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/taskgate-profile.XXXXXX")
# shellcheck source=lib.sh
source "$HERE/lib.sh"
trap bench_exit EXIT
field() { json_field "$@"; }

"$LG" spawn-ready --stdout "$WORK/up.out" --stderr "$WORK/up.err" --label upstream \
  -- "$HERE/loadgen/target/release/upstream" --listen 127.0.0.1:0 --threads 1 > "$WORK/up.json"
PIDS+=("$(field "$WORK/up.json" pid)")
taskgate_toml "$WORK/tg.toml" "$WORK/store" "" "$(field "$WORK/up.json" addr)"
if [ "$TOOL" = strace ]; then
  wrap=(strace -f -c -o "$WORK/strace.txt")
elif [ "$TOOL" = perf ]; then
  wrap=()
else
  wrap=(valgrind --tool=callgrind --callgrind-out-file="$WORK/cg.%p")
  [ "${CACHESIM:-0}" = 1 ] && wrap+=(--cache-sim=yes)
fi
serve=(serve --config "$WORK/tg.toml")
# benches/loadgen's hyperproxy (the hyper floor, see run.sh's FLOOR) profiles the same way.
[ "$(basename "$TASKGATE")" = hyperproxy ] && serve=(--upstream "$(field "$WORK/up.json" addr)")
"$LG" spawn-ready --stdout "$WORK/tg.out" --stderr "$WORK/tg.err" --label taskgate \
  -- "${wrap[@]}" "$TASKGATE" "${serve[@]}" > "$WORK/tg.json"
TG_PID=$(field "$WORK/tg.json" pid); PIDS+=("$TG_PID")
URL="http://$(field "$WORK/tg.json" gateway)/mcp"
[ "$(basename "$TASKGATE")" = hyperproxy ] && URL="http://$(field "$WORK/tg.json" addr)/mcp"
conc=$CONC
args=(--url "$URL" --target taskgate --case profile --rep 1 --concurrency "$conc")
case $SCENARIO in
  small) warm=(--scenario small --duration 2 --warmup 0); measured=(--scenario small --duration 20 --warmup 0) ;;
  sse) warm=(--scenario sse --duration 2 --warmup 0); measured=(--scenario sse --duration 10 --warmup 0) ;;
  sse-apart) warm=(--scenario sse --interval-ms 1 --duration 2 --warmup 0)
    measured=(--scenario sse --interval-ms 1 --duration 10 --warmup 0) ;;
  lifecycle | modern-lifecycle) warm=(--scenario "$SCENARIO" --count 10); measured=(--scenario "$SCENARIO" --count "$COUNT") ;;
  *) echo "scenario: small, sse, sse-apart, lifecycle or modern-lifecycle" >&2; exit 2 ;;
esac
"$LG" run "${args[@]}" "${warm[@]}" --json-out "$WORK/warm.jsonl" > /dev/null
idle_rate=0
if [ "$TOOL" = callgrind ] && [ "${IDLE:-5}" -gt 0 ]; then
  # What taskgate runs with no request at all (timers, the sweeper, sled's flusher), per
  # second: subtracted below, so runs at different request rates (valgrind under a busy
  # machine) compare. Without it the per-request figure moved by 2-5 % between runs.
  callgrind_control -z "$TG_PID" > /dev/null 2>&1
  t0=$(date +%s.%N); sleep "${IDLE:-5}"
  callgrind_control -d "$TG_PID" > /dev/null 2>&1; t1=$(date +%s.%N)
  idle_dump=$(ls -t "$WORK"/cg.* | head -1)
  idle_total=$(callgrind_annotate "$idle_dump" 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(/,/, "", $1); print $1; exit }' || true)
  idle_rate=$(awk -v n="${idle_total:-0}" -v a="$t0" -v b="$t1" 'BEGIN { printf "%.0f", n / (b - a) }')
fi
# The window in the middle of one run (CONC > 1 under callgrind, timed scenarios; see the header).
midrun=0
if [ "$TOOL" = callgrind ] && [ "$conc" -gt 1 ]; then
  case $SCENARIO in small | sse | sse-apart) midrun=1 ;; esac
fi
upstream_requests() { curl -s "http://$(field "$WORK/up.json" addr)/stats" | sed -n 's/.*"requests":\([0-9]*\).*/\1/p'; }
[ "$TOOL" = callgrind ] && [ "$midrun" = 0 ] && callgrind_control -z "$TG_PID" > /dev/null 2>&1
run_t0=$(date +%s.%N)
if [ "$TOOL" = perf ]; then
  # PERF_EVENT=syscalls:sys_enter_futex (say) samples every such event instead of the CPU.
  if [ -n "${PERF_EVENT:-}" ]; then ev=(-e "$PERF_EVENT" -c 1); else ev=(-F 2999); fi
  perf record -q "${ev[@]}" --call-graph "${PERF_CALLGRAPH:-fp}" -p "$TG_PID" -o "$WORK/perf.data" 2> "$WORK/perf.err" &
  PERF_PID=$!
  for _ in $(seq 100); do
    [ -s "$WORK/perf.data" ] && break
    if ! kill -0 "$PERF_PID" 2>/dev/null; then
      echo "perf record could not run (perf_event_paranoid, or not root?):" >&2
      cat "$WORK/perf.err" >&2
      exit 2
    fi
    sleep 0.05
  done
fi
if [ "$midrun" = 1 ]; then
  lead=${LEAD:-5}
  long=() prev=""  # the measured arguments with --duration: lead-in, window, tail
  for a in "${measured[@]}"; do
    [ "$prev" = --duration ] && a=$((lead + 20 + 5))
    long+=("$a"); prev=$a
  done
  "$LG" run "${args[@]}" "${long[@]}" --json-out "$WORK/run.jsonl" > /dev/null &
  LG_RUN=$!
  sleep "$lead"
  up0=$(upstream_requests); callgrind_control -z "$TG_PID" > /dev/null 2>&1; run_t0=$(date +%s.%N)
  sleep 20
  callgrind_control -d "$TG_PID" > /dev/null 2>&1; run_t1=$(date +%s.%N); up1=$(upstream_requests)
  wait "$LG_RUN"
else
  "$LG" run "${args[@]}" "${measured[@]}" --cpu-pid "$TG_PID" --json-out "$WORK/run.jsonl" > /dev/null
fi
if [ "$TOOL" = perf ]; then
  kill -INT "$PERF_PID" 2>/dev/null || true; wait "$PERF_PID" 2>/dev/null || true
  [ -n "${KEEP:-}" ] && cp "$WORK/perf.data" "$KEEP"
  run_n=$(sed -n 's/.*"requests":\([0-9]*\).*/\1/p' "$WORK/run.jsonl" | tail -1)
  cpu=$(sed -n 's/.*"cpu_us_per_req":\([0-9.]*\).*/\1/p' "$WORK/run.jsonl" | tail -1)
  echo "binary:       $TASKGATE"
  echo "scenario:     $SCENARIO, c=$CONC"
  echo "requests:     $run_n; taskgate CPU per request (utime+stime): ${cpu:-?} µs"
  perf report -i "$WORK/perf.data" --no-children --sort dso -q -g none 2>/dev/null | head -8 |
    awk '{ printf "  %s\n", $0 }'
  echo
  echo "top $TOP symbols by their own samples (% of taskgate's samples):"
  perf report -i "$WORK/perf.data" --no-children --sort sym -q -g none 2>/dev/null |
    grep -v '^$' | head -"$TOP" | cut -c1-150
  exit 0
fi
if [ "$TOOL" = strace ]; then
  # strace writes its table when taskgate exits (SIGTERM: a graceful stop).
  warm_n=$(sed -n 's/.*"requests":\([0-9]*\).*/\1/p' "$WORK/warm.jsonl" | tail -1)
  run_n=$(sed -n 's/.*"requests":\([0-9]*\).*/\1/p' "$WORK/run.jsonl" | tail -1)
  kill -TERM "$(pgrep -P "$TG_PID" | head -1)" 2>/dev/null || true
  for _ in $(seq 500); do [ -s "$WORK/strace.txt" ] && grep -q total "$WORK/strace.txt" && break; sleep 0.02; done
  echo "binary:       $TASKGATE"
  echo "scenario:     $SCENARIO, c=$conc"
  echo "requests:     $((warm_n + run_n)) (warm-up and measured; start and stop included)"
  echo "system calls per request (all threads):"
  awk -v n=$((warm_n + run_n)) '$1 ~ /^[0-9.]+$/ && NF >= 5 { name = $NF; calls = (NF == 6) ? $4 : $4;
    printf "%10.2f  %s\n", calls / n, name }' "$WORK/strace.txt" | sort -rn | head -"$TOP"
  exit 0
fi
if [ "$midrun" = 1 ]; then
  requests=$((up1 - up0))
else
  callgrind_control -d "$TG_PID" > /dev/null 2>&1
  run_t1=$(date +%s.%N)
  requests=$(sed -n 's/.*"requests":\([0-9]*\).*/\1/p' "$WORK/run.jsonl" | tail -1)
fi
dump=$(ls -t "$WORK"/cg.* | head -1)
# KEEP=FILE keeps the callgrind dump for callgrind_annotate --tree=caller or kcachegrind.
[ -n "${KEEP:-}" ] && cp "$dump" "$KEEP"
total=$(callgrind_annotate "$dump" 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(/,/, "", $1); print $1; exit }' || true)
echo "binary:       $TASKGATE"
echo "scenario:     $SCENARIO, c=$conc"
echo "requests:     $requests"
echo "instructions: $total ($((total / requests)) per request)"
if [ "${CACHESIM:-0}" = 1 ]; then
  # Every event of the dump per request (Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw), no idle subtracted.
  callgrind_annotate "$dump" 2>/dev/null | awk -v n="$requests" '
    /^Events shown/ { for (i = 3; i <= NF; i++) ev[i - 2] = $i }
    /PROGRAM TOTALS/ { k = 0; line = "";
      for (i = 1; i <= NF; i++) if ($i ~ /^[0-9,]+$/) { v = $i; gsub(/,/, "", v); k++;
        line = line sprintf(" %s %.1f", ev[k], v / n) }
      print "per request: " line; exit }'
fi
if [ "$idle_rate" != 0 ]; then
  awk -v t="$total" -v r="$idle_rate" -v a="$run_t0" -v b="$run_t1" -v n="$requests" 'BEGIN {
    printf "idle-corrected: %.0f per request (idle %.0f per second subtracted over %.1f s)\n",
      (t - r * (b - a)) / n, r, b - a }'
fi
# One line per function: instructions per request, then the function without its file path.
per_request() {
  # (Without --inclusive, callgrind_annotate 3.19 still lists the thread-start chain with the
  # whole cost; lines at 95 % or more of the total are those and are skipped.)
  awk -v n="$requests" -v top="$TOP" -v total="$total" -v own="${own:-0}" '
    /^-+$/ { sep++; next }
    sep >= 3 && /^ *[0-9,]+ / { v = $1; gsub(/,/, "", v); if (own && v >= 0.95 * total) next;
      $1 = ""; sub(/\(.*%\) */, "");
      sub(/^ *[^ ]*:/, ""); sub(/ \[[^]]*\]$/, "");
      printf "%10.0f  %s\n", v / n, substr($0, 1, 140); if (++k >= top) exit }'
}
echo
echo "top $TOP functions by their own instructions per request:"
callgrind_annotate --threshold=100 "$dump" 2>/dev/null | own=1 per_request || true
echo
echo "top $TOP functions by inclusive instructions per request (callees included):"
callgrind_annotate --inclusive=yes --threshold=100 "$dump" 2>/dev/null | per_request || true
