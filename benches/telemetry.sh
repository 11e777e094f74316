#!/usr/bin/env bash
# What traces cost (issue 34): taskgate's CPU (utime + stime, all its threads, the export thread
# included) per small `tools/call` at CONC concurrent clients, with `[telemetry]` off and on
# (`sample_ratio = 1.0`: every request's SERVER and CLIENT span exported as OTLP/HTTP protobuf to
# a local receiver). One binary, one run, the two modes alternating REPS times; prints each run
# and the medians.
#
#   bash benches/telemetry.sh [TASKGATE_BIN]        # CONC=16 DURATION=10 REPS=3
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
if [ -z "$TASKGATE" ]; then
  (cd "$ROOT" && cargo build --profile profiling --quiet --bin taskgate)
  TASKGATE="$ROOT/target/profiling/taskgate"
fi
(cd "$HERE/loadgen" && CARGO_TARGET_DIR="$HERE/loadgen/target" cargo build --release --quiet)
LG="$HERE/loadgen/target/release/loadgen"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/taskgate-telemetry.XXXXXX")
# shellcheck source=lib.sh
source "$HERE/lib.sh"
trap bench_exit EXIT

"$LG" spawn-ready --stdout "$WORK/up.out" --stderr "$WORK/up.err" --label upstream \
  -- "$HERE/loadgen/target/release/upstream" --listen 127.0.0.1:0 --threads 1 > "$WORK/up.json"
PIDS+=("$(json_field "$WORK/up.json" pid)")
UP=$(json_field "$WORK/up.json" addr)

# The OTLP/HTTP receiver: 200 to every POST, its body counted (requests and bytes in a file).
cat > "$WORK/receiver.py" <<'PY'
import http.server, sys
stats = sys.argv[1]
got = [0, 0]
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        n = int(self.headers.get("content-length", 0))
        self.rfile.read(n)
        got[0] += 1; got[1] += n
        with open(stats, "w") as f:
            f.write(f"{got[0]} {got[1]}\n")
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()
    def log_message(self, *a):
        pass
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
PY
python3 "$WORK/receiver.py" "$WORK/received" > "$WORK/rx.port" 2> "$WORK/rx.err" &
PIDS+=("$!")
for _ in $(seq 200); do [ -s "$WORK/rx.port" ] && break; sleep 0.05; done
RX="http://127.0.0.1:$(cat "$WORK/rx.port")"

run_one() { # mode rep → prints "cpu_us_per_req rps"
  local mode=$1 rep=$2 toml="$WORK/tg-$1-$2.toml" pid
  taskgate_toml "$toml" "$WORK/store-$mode-$rep" "" "$UP"
  if [ "$mode" = on ]; then
    printf '\n[telemetry]\notlp_endpoint = "%s"\nsample_ratio = 1.0\n' "$RX" >> "$toml"
  fi
  "$LG" spawn-ready --stdout "$WORK/tg-$mode-$rep.out" --stderr "$WORK/tg-$mode-$rep.err" \
    --label taskgate -- env -u OTEL_EXPORTER_OTLP_ENDPOINT -u OTEL_EXPORTER_OTLP_TRACES_ENDPOINT \
    "$TASKGATE" serve --config "$toml" > "$WORK/tg-$mode-$rep.json"
  pid=$(json_field "$WORK/tg-$mode-$rep.json" pid); PIDS+=("$pid")
  local url="http://$(json_field "$WORK/tg-$mode-$rep.json" gateway)/mcp"
  local args=(--url "$url" --target taskgate --case "telemetry-$mode" --rep "$rep" --concurrency "$CONC")
  "$LG" run "${args[@]}" --scenario small --duration 2 --warmup 0 --json-out "$WORK/warm.jsonl" > /dev/null
  "$LG" run "${args[@]}" --scenario small --duration "$DURATION" --warmup 0 --cpu-pid "$pid" \
    --json-out "$WORK/run-$mode-$rep.jsonl" > /dev/null
  local admin failures
  admin=$(json_field "$WORK/tg-$mode-$rep.json" admin)
  failures=$(curl -s "http://$admin/metrics" | awk '/^taskgate_trace_export_failures_total/ { print $2 }')
  stop_pid "$pid"
  echo "$(json_field "$WORK/run-$mode-$rep.jsonl" cpu_us_per_req) $(json_field "$WORK/run-$mode-$rep.jsonl" req_per_s) ${failures:-?}"
}

median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo "binary: $TASKGATE; small tools/call, c=$CONC, ${DURATION}s per run, $REPS runs per mode"
: > "$WORK/off"; : > "$WORK/on"
for rep in $(seq "$REPS"); do
  for mode in off on; do
    read -r cpu rps failures < <(run_one "$mode" "$rep")
    echo "  run $rep $mode: ${cpu} µs CPU per request, ${rps} requests/s, export failures ${failures}"
    echo "$cpu" >> "$WORK/$mode"
  done
done
off=$(median < "$WORK/off"); on=$(median < "$WORK/on")
echo "median CPU per request: off ${off} µs, on ${on} µs ($(awk -v a="$off" -v b="$on" 'BEGIN { printf "%+.1f %%", (b - a) * 100 / a }'))"
[ -s "$WORK/received" ] && echo "receiver: $(cut -d' ' -f1 "$WORK/received") exports, $(cut -d' ' -f2 "$WORK/received") bytes"
