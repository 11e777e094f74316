# Shared by the benchmark scripts (sourced, not run): the processes they start and stop, the
# fields of loadgen's JSON lines, taskgate's configuration for the bench upstream.
#
# A script sets WORK (its temp directory) and appends every PID it starts to PIDS; `bench_exit`
# (its EXIT trap, or called from one) stops them all and removes WORK unless KEEP=1.

PIDS=()

# Whether process $1 is gone (a zombie counts as gone).
gone() { [ ! -e "/proc/$1" ] || grep -q ') Z' "/proc/$1/stat" 2>/dev/null; }

# SIGTERM, wait up to 10 s, then SIGKILL.
stop_pid() {
  local pid=$1 i
  kill -TERM "$pid" 2>/dev/null || return 0
  for i in $(seq 1000); do gone "$pid" && return 0; sleep 0.01; done
  kill -KILL "$pid" 2>/dev/null || true
}

# Stops every process in PIDS and removes WORK (kept with KEEP=1).
bench_exit() {
  local pid
  for pid in "${PIDS[@]}"; do stop_pid "$pid"; done
  if [ "${KEEP:-0}" = 1 ]; then echo "kept $WORK" >&2; else rm -rf "$WORK"; fi
}

# Field $2 of the first JSON line of file $1 (loadgen's spawn-ready and run output).
json_field() { sed -n "s/.*\"$2\":\"\{0,1\}\([^\",}]*\).*/\1/p" "$1" | head -1; }

# taskgate's TOML for the bench upstream at $4 (host:port): file $1, sled store directory $2,
# extra [tasks] lines $3; both listeners on ephemeral 127.0.0.1 ports.
taskgate_toml() {
  cat > "$1" <<EOT
[gateway]
listen = "127.0.0.1:0"

[admin]
listen = "127.0.0.1:0"

[store]
path = "$2"

[tasks]
$3

[[upstream]]
name = "bench"
url = "http://$4/mcp"
EOT
}

# CPU ticks (utime + stime, USER_HZ) of process $1 per thread name, digits dropped so a pool
# counts as one ("sled-io-3" → "sled-io-"): lines "name ticks", sorted by name.
thread_ticks() {
  local t
  for t in /proc/"$1"/task/*; do
    awk '{ s = $0; sub(/^[^(]*\(/, "", s); name = s; sub(/\).*$/, "", name);
           sub(/^.*\) /, "", s); split(s, f, " "); gsub(/[0-9]+/, "", name); gsub(/ /, "_", name);
           print name, f[12] + f[13] }' "$t/stat" 2>/dev/null || true  # a thread that ended meanwhile
  done | awk '{ n[$1] += $2 } END { for (k in n) print k, n[k] }' | sort
}

# Per thread name, CPU µs per request between two `thread_ticks` outputs $1 and $2 for $3
# requests: "name=µs" pairs on one line, largest first.
thread_cpu_per_req() {
  local hz; hz=$(getconf CLK_TCK)
  join -a 2 -e 0 -o 0,1.2,2.2 "$1" "$2" | awk -v hz="$hz" -v n="$3" '
    { d = ($3 - $2) * 1e6 / hz / n; if (d > 0) printf "%s %.1f\n", $1, d }' |
    sort -k2 -rn | awk '{ printf "%s%s=%s", (NR > 1 ? " " : ""), $1, $2 } END { print "" }'
}

# Starts benches/otlp_receiver.py (an OTLP/HTTP receiver answering 200, counting exports and
# bytes into $1/received-$2) and waits for its port: sets RX_PID and RX (its base URL). The
# caller adds RX_PID to PIDS (or stops it itself).
start_otlp_receiver() {
  local dir=$1 name=$2 here
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  : > "$dir/rx-$name.port"
  python3 "$here/otlp_receiver.py" "$dir/received-$name" > "$dir/rx-$name.port" 2> "$dir/rx-$name.err" &
  RX_PID=$!
  for _ in $(seq 200); do [ -s "$dir/rx-$name.port" ] && break; sleep 0.05; done
  [ -s "$dir/rx-$name.port" ] || { cat "$dir/rx-$name.err" >&2; echo "the OTLP receiver did not start" >&2; return 1; }
  RX="http://127.0.0.1:$(head -1 "$dir/rx-$name.port")"
}
