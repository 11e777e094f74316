#!/usr/bin/env bash
# What traces cost (issue 34): taskgate's CPU (utime + stime, all its threads, the export thread
# included) per small `tools/call` at CONC concurrent clients, with `[telemetry]` off and on
# (`sample_ratio = 1.0`: every request's SERVER and CLIENT span exported as OTLP/HTTP protobuf to
# a local receiver). One binary, one run, the two modes alternating REPS times; prints each run
# and the medians.
#
#   bash benches/telemetry.sh [TASKGATE_BIN]        # CONC=16 DURATION=10 REPS=3
#   TOOL=callgrind bash benches/telemetry.sh [BIN]  # instructions per request instead (valgrind)
#   RATIO=0.0 TOOL=callgrind bash benches/telemetry.sh [BIN]  # on = export on, no root sampled
#
# TOOL=callgrind runs taskgate under callgrind (threads serialised: the count hardly moves with
# the machine's load, unlike CPU time), sends COUNT requests (default 8000) per run, and counts
# its instructions, all threads, over the
# measured run and the SETTLE seconds after it (default 6: the export thread exports what is
# left at most 5 s after a span ends), minus what it runs idle (IDLE seconds measured first);
# per request, off and on, medians of REPS.
#
# Without TASKGATE_BIN it builds the `profiling` profile (release code without the whole-program
# step: an A/B of one binary needs no fat-LTO build). The receiver (python3, standard library)
# answers every POST 200 and counts the bytes it got. Everything started here stops on exit.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
TASKGATE=${1:-}
CONC=${CONC:-16}
DURATION=${DURATION:-10}
REPS=${REPS:-3}
# `sample_ratio` of the "on" runs: 1.0 every span exported; below it the spans not sampled
# make no record (their context still goes upstream, sampled flag off).
RATIO=${RATIO:-1.0}
if [ -z "$TASKGATE" ]; then
  (cd "$ROOT" && cargo build --profile profiling --quiet --bin taskgate)
  TASKGATE="$ROOT/target/profiling/taskgate"
fi
(cd "$HERE/loadgen" && CARGO_TARGET_DIR="$HERE/loadgen/target" cargo build --release --quiet)
LG="$HERE/loadgen/target/release/loadgen"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/taskgate-telemetry.XXXXXX")
# shellcheck source=lib.sh
source "$HERE/lib.sh"
# taskgate and the receivers are started inside `< <(run_one …)` subshells, whose PIDS+= the
# parent never sees: each also leaves its pid in a file, stopped here on any exit.
trap 'for f in "$WORK"/pid-*; do [ -f "$f" ] && stop_pid "$(cat "$f")"; done; bench_exit' EXIT

"$LG" spawn-ready --stdout "$WORK/up.out" --stderr "$WORK/up.err" --label upstream \
  -- "$HERE/loadgen/target/release/upstream" --listen 127.0.0.1:0 --threads 1 > "$WORK/up.json"
PIDS+=("$(json_field "$WORK/up.json" pid)")
UP=$(json_field "$WORK/up.json" addr)

# The OTLP/HTTP receiver is benches/otlp_receiver.py (200 to every POST, bodies counted).
# A receiver of its own for each "on" run, stopped with it, so no run inherits another's receiver
# (R25's "on" runs rose run after run with one receiver for all; a run with one receiver per run
# rose as much, so the receiver is not shown to be the cause). Each run prints the spans whose
# export failed and those dropped at a full export queue (a receiver too slow): both should be 0.
RX_PID=
start_receiver() { # rep → sets RX
  start_otlp_receiver "$WORK" "$1"; echo "$RX_PID" > "$WORK/pid-rx-$1"; PIDS+=("$RX_PID")
}

run_one() { # mode rep → prints "cpu_us_per_req rps"
  local mode=$1 rep=$2 toml="$WORK/tg-$1-$2.toml" pid
  taskgate_toml "$toml" "$WORK/store-$mode-$rep" "" "$UP"
  if [ "$mode" = on ]; then
    start_receiver "$rep"
    printf '\n[telemetry]\notlp_endpoint = "%s"\nsample_ratio = %s\n' "$RX" "$RATIO" >> "$toml"
  fi
  "$LG" spawn-ready --stdout "$WORK/tg-$mode-$rep.out" --stderr "$WORK/tg-$mode-$rep.err" \
    --label taskgate -- env -u OTEL_EXPORTER_OTLP_ENDPOINT -u OTEL_EXPORTER_OTLP_TRACES_ENDPOINT \
    "$TASKGATE" serve --config "$toml" > "$WORK/tg-$mode-$rep.json"
  pid=$(json_field "$WORK/tg-$mode-$rep.json" pid); PIDS+=("$pid"); echo "$pid" > "$WORK/pid-tg-$mode-$rep"
  local url="http://$(json_field "$WORK/tg-$mode-$rep.json" gateway)/mcp"
  local args=(--url "$url" --target taskgate --case "telemetry-$mode" --rep "$rep" --concurrency "$CONC")
  "$LG" run "${args[@]}" --scenario small --duration 2 --warmup 0 --json-out "$WORK/warm.jsonl" > /dev/null
  "$LG" run "${args[@]}" --scenario small --duration "$DURATION" --warmup 0 --cpu-pid "$pid" \
    --json-out "$WORK/run-$mode-$rep.jsonl" > /dev/null
  local admin failures
  admin=$(json_field "$WORK/tg-$mode-$rep.json" admin)
  failures=$(curl -s "http://$admin/metrics" | awk '/^taskgate_trace_export_failures_total/ { f = $2 }
    /^taskgate_trace_spans_dropped_total/ { d = $2 } END { printf "%s/%s", f, d }')
  stop_pid "$pid"
  [ "$mode" = on ] && stop_pid "$RX_PID"
  echo "$(json_field "$WORK/run-$mode-$rep.jsonl" cpu_us_per_req) $(json_field "$WORK/run-$mode-$rep.jsonl" req_per_s) ${failures:-?}"
}

run_callgrind() { # mode rep → prints "instructions_per_req requests"
  local mode=$1 rep=$2 toml="$WORK/tg-$1-$2.toml" pid dump total idle_total idle_rate t0 t1 requests
  taskgate_toml "$toml" "$WORK/store-$mode-$rep" "" "$UP"
  if [ "$mode" = on ]; then
    start_receiver "$rep"
    printf '\n[telemetry]\notlp_endpoint = "%s"\nsample_ratio = %s\n' "$RX" "$RATIO" >> "$toml"
  fi
  "$LG" spawn-ready --stdout "$WORK/tg-$mode-$rep.out" --stderr "$WORK/tg-$mode-$rep.err" \
    --label taskgate -- env -u OTEL_EXPORTER_OTLP_ENDPOINT -u OTEL_EXPORTER_OTLP_TRACES_ENDPOINT \
    valgrind --tool=callgrind --callgrind-out-file="$WORK/cg-$mode-$rep.%p" \
    "$TASKGATE" serve --config "$toml" > "$WORK/tg-$mode-$rep.json"
  pid=$(json_field "$WORK/tg-$mode-$rep.json" pid); PIDS+=("$pid"); echo "$pid" > "$WORK/pid-tg-$mode-$rep"
  local url="http://$(json_field "$WORK/tg-$mode-$rep.json" gateway)/mcp"
  local args=(--url "$url" --target taskgate --case "telemetry-$mode" --rep "$rep" --concurrency "$CONC")
  "$LG" run "${args[@]}" --scenario small --duration 2 --warmup 0 --json-out "$WORK/warm.jsonl" > /dev/null
  sleep "$SETTLE"  # the warm-up's spans exported
  callgrind_control -z "$pid" > /dev/null 2>&1
  t0=$(date +%s.%N); sleep "$IDLE"
  callgrind_control -d "$pid" > /dev/null 2>&1; t1=$(date +%s.%N)
  dump=$(ls -t "$WORK"/cg-"$mode-$rep".* | head -1)
  idle_total=$(callgrind_annotate "$dump" 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(/,/, "", $1); print $1; exit }' || true)
  idle_rate=$(awk -v n="${idle_total:-0}" -v a="$t0" -v b="$t1" 'BEGIN { printf "%.0f", n / (b - a) }')
  callgrind_control -z "$pid" > /dev/null 2>&1
  t0=$(date +%s.%N)
  "$LG" run "${args[@]}" --scenario small --count "$COUNT" --warmup 0 \
    --json-out "$WORK/run-$mode-$rep.jsonl" > /dev/null
  sleep "$SETTLE"
  callgrind_control -d "$pid" > /dev/null 2>&1; t1=$(date +%s.%N)
  dump=$(ls -t "$WORK"/cg-"$mode-$rep".* | head -1)
  [ -n "${KEEP:-}" ] && cp "$dump" "$KEEP-$mode-$rep"
  total=$(callgrind_annotate "$dump" 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(/,/, "", $1); print $1; exit }' || true)
  requests=$(json_field "$WORK/run-$mode-$rep.jsonl" requests)
  stop_pid "$pid"
  [ "$mode" = on ] && stop_pid "$RX_PID"
  awk -v t="$total" -v r="$idle_rate" -v a="$t0" -v b="$t1" -v n="$requests" 'BEGIN {
    printf "%.0f %d\n", (t - r * (b - a)) / n, n }'
}

received() { cat "$WORK"/received-* 2>/dev/null | awk '{ n += $1; b += $2 } END { if (NR) printf "receivers: %d exports, %d bytes\n", n, b }'; }

median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

if [ "${TOOL:-}" = callgrind ]; then
  command -v callgrind_control > /dev/null || { echo "needs valgrind (apt-get install valgrind)" >&2; exit 2; }
  SETTLE=${SETTLE:-6}; IDLE=${IDLE:-5}
  # A fixed number of requests per run, not a duration: under callgrind a 10 s run served 5,000
  # to 19,000 requests as the machine's load moved, and the per-request share of what runs once
  # per run or per export batch moved with it (±250 instructions between runs of one binary).
  COUNT=${COUNT:-8000}
  echo "binary: $TASKGATE; callgrind; small tools/call, c=$CONC, $COUNT requests per run, $REPS runs per mode, on: sample_ratio $RATIO"
  : > "$WORK/off"; : > "$WORK/on"
  for rep in $(seq "$REPS"); do
    for mode in off on; do
      read -r ins n < <(run_callgrind "$mode" "$rep")
      echo "  run $rep $mode: ${ins} instructions per request (idle-corrected, export included), ${n} requests"
      echo "$ins" >> "$WORK/$mode"
    done
  done
  off=$(median < "$WORK/off"); on=$(median < "$WORK/on")
  echo "median instructions per request: off ${off}, on ${on} ($(awk -v a="$off" -v b="$on" 'BEGIN { printf "%+.1f %%", (b - a) * 100 / a }'))"
  received
  exit 0
fi
echo "binary: $TASKGATE; small tools/call, c=$CONC, ${DURATION}s per run, $REPS runs per mode, on: sample_ratio $RATIO"
: > "$WORK/off"; : > "$WORK/on"
for rep in $(seq "$REPS"); do
  for mode in off on; do
    read -r cpu rps failures < <(run_one "$mode" "$rep")
    echo "  run $rep $mode: ${cpu} µs CPU per request, ${rps} requests/s, spans failed/dropped ${failures}"
    echo "$cpu" >> "$WORK/$mode"
  done
done
off=$(median < "$WORK/off"); on=$(median < "$WORK/on")
echo "median CPU per request: off ${off} µs, on ${on} µs ($(awk -v a="$off" -v b="$on" 'BEGIN { printf "%+.1f %%", (b - a) * 100 / a }'))"
received
