#!/usr/bin/env bash
# The registry's store work in the task lifecycle, per binary (issue 15): group commits per task
# (`taskgate_store_write_duration_seconds_count` before and after), bytes written per task
# (`wchar` of /proc/PID/io: the log, the sockets' writes included) and taskgate's CPU per
# request, alternating the binaries ROUNDS times, at c=16 and c=1. Also the start-up of a store
# holding RECORDS records: CPU (perf stat task-clock, when perf is there) and time to /readyz.
#
#   bash benches/store_ab.sh BIN_A BIN_B ...
#   ROUNDS=5 COUNT=3000 RECORDS=0 bash benches/store_ab.sh /work/bins/old target/release/taskgate
#
# Settings: ROUNDS (3), COUNT (tasks per c=16 run, 1500; c=1 runs COUNT/4), RECORDS (100000;
# 0 skips the start-up part; the store is made once with the first binary), THREADS=1 (also
# print each run's CPU per request by thread name: serving threads, tokio's blocking pool, sled's
# I/O pool, the committer). Prints one line per run; compare medians. Everything started here stops on exit.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROUNDS=${ROUNDS:-3}; COUNT=${COUNT:-1500}; RECORDS=${RECORDS:-100000}
[ $# -ge 1 ] || { echo "usage: $0 BIN [BIN ...]" >&2; exit 2; }
(cd "$HERE/loadgen" && CARGO_TARGET_DIR="$HERE/loadgen/target" cargo build --release --quiet)
LG="$HERE/loadgen/target/release/loadgen"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/taskgate-store-ab.XXXXXX")
# shellcheck source=lib.sh
source "$HERE/lib.sh"
trap bench_exit EXIT
field() { json_field "$@"; }
stop() { stop_pid "$1"; }
"$LG" spawn-ready --stdout "$WORK/up.out" --stderr "$WORK/up.err" --label upstream \
  -- "$HERE/loadgen/target/release/upstream" --listen 127.0.0.1:0 --threads 1 > "$WORK/up.json"
PIDS+=("$(field "$WORK/up.json" pid)")
config() { # $1 file, $2 store dir
  taskgate_toml "$1" "$2" "max_live_tasks_per_owner = 10000000" "$(field "$WORK/up.json" addr)"
}
commits() { curl -s "$1/metrics" | awk '/^taskgate_store_write_duration_seconds_count/ { printf "%d", $2 }'; }
lifecycle() { # $1 binary, $2 concurrency, $3 tasks
  local dir="$WORK/run" tg
  rm -rf "$dir"; mkdir -p "$dir"; config "$dir/tg.toml" "$dir/store"
  "$LG" spawn-ready --stdout "$dir/tg.out" --stderr "$dir/tg.err" --label taskgate \
    -- "$1" serve --config "$dir/tg.toml" > "$dir/tg.json"
  tg=$(field "$dir/tg.json" pid); PIDS+=("$tg")
  local url="http://$(field "$dir/tg.json" gateway)/mcp" admin="http://$(field "$dir/tg.json" admin)"
  local args=(--url "$url" --target taskgate --case store-ab --rep 1 --scenario lifecycle --concurrency "$2")
  "$LG" run "${args[@]}" --count 50 --json-out "$dir/warm.jsonl" > /dev/null
  local before; before=$(commits "$admin")
  thread_ticks "$tg" > "$dir/ticks.before"
  local wrote; wrote=$(awk '/^wchar/ { print $2 }' "/proc/$tg/io")
  "$LG" run "${args[@]}" --count "$3" --cpu-pid "$tg" --json-out "$dir/run.jsonl" > /dev/null
  thread_ticks "$tg" > "$dir/ticks.after"
  wrote=$(awk -v b="$wrote" -v n="$3" '/^wchar/ { printf "%.0f", ($2 - b) / n }' "/proc/$tg/io")
  local after; after=$(commits "$admin")
  stop "$tg"
  printf '%-28s c=%-3s commits/task %5.2f  bytes written/task %6s  CPU us/req %7.1f  tasks/s %7.1f\n' \
    "$(basename "$1")" "$2" \
    "$(awk -v a="$after" -v b="$before" -v n="$3" 'BEGIN { print (a - b) / n }')" "$wrote" \
    "$(sed -n 's/.*"cpu_us_per_req":\([0-9.]*\).*/\1/p' "$dir/run.jsonl" | tail -1)" \
    "$(sed -n 's/.*"ops_per_s":\([0-9.]*\).*/\1/p' "$dir/run.jsonl" | tail -1)"
  [ "${THREADS:-0}" = 1 ] && echo "    by thread, CPU us/req: $(thread_cpu_per_req "$dir/ticks.before" "$dir/ticks.after" $(($3 * 12)))"
  return 0
}
echo "== task lifecycle (create, 10 x tasks/get, tasks/result): $ROUNDS rounds, alternating"
for r in $(seq "$ROUNDS"); do
  for bin in "$@"; do lifecycle "$bin" 16 "$COUNT"; lifecycle "$bin" 1 $((COUNT / 4)); done
done
[ "$RECORDS" -gt 0 ] || exit 0
echo "== start-up on a store of $RECORDS records: $ROUNDS rounds, alternating"
S="$WORK/big"; mkdir -p "$S"; config "$S/tg.toml" "$S/store"
"$LG" spawn-ready --stdout "$S/tg.out" --stderr "$S/tg.err" --label taskgate \
  -- "$1" serve --config "$S/tg.toml" > "$S/tg.json"
tg=$(field "$S/tg.json" pid); PIDS+=("$tg")
"$LG" run --url "http://$(field "$S/tg.json" gateway)/mcp" --target taskgate --case make --rep 1 \
  --scenario create --concurrency 64 --count "$RECORDS" --session-file "$S/session" \
  --json-out "$S/make.jsonl" > /dev/null
stop "$tg"
for r in $(seq "$ROUNDS"); do
  for bin in "$@"; do
    wrap=(); command -v perf > /dev/null && wrap=(perf stat -x, -e task-clock -o "$S/stat")
    rm -f "$S/stat"
    "$LG" spawn-ready --stdout "$S/tg.out" --stderr "$S/tg.err" --label taskgate \
      -- "${wrap[@]}" "$bin" serve --config "$S/tg.toml" > "$S/tg.json"
    p=$(field "$S/tg.json" pid); PIDS+=("$p")
    # perf stat's child is taskgate: stop it, perf then writes its count and exits.
    child=$(pgrep -P "$p" | head -1 || true); stop "${child:-$p}"
    for _ in $(seq 1000); do gone "$p" && break; sleep 0.01; done  # perf writes its count
    stop "$p"
    cpu=$(sed -n 's/^\([0-9.]*\),msec,task-clock.*/\1/p' "$S/stat" 2>/dev/null | head -1)
    printf '%-28s ready %7.1f ms  start-up CPU %s ms\n' "$(basename "$bin")" \
      "$(field "$S/tg.json" ready_ms)" "${cpu:-?}"
  done
done
