#!/usr/bin/env bash
# Before/after of taskgate binaries in one run, interleaved (issues 10 and 15): for each round,
# every binary runs the chosen scenarios of benches/run.sh once (direct and nginx alongside), in
# turn, so a slow spell of a shared machine hits every binary. Prints one line per run and, per
# binary, the median and spread of taskgate's CPU µs per request and of its throughput.
#
#   bash benches/ab.sh NAME=PATH NAME=PATH ...          # e.g. before=/tmp/tg-old after=target/release/taskgate
#   ROUNDS=5 SCENARIOS=4 bash benches/ab.sh before=... after=...
#
# Settings (environment): ROUNDS (default 5), SCENARIOS (default "4"), KEEP=DIR (keep every run's
# report and log there instead of a deleted temp directory), and anything benches/run.sh reads
# (DURATION, LIFECYCLE_TASKS, ...). REPEAT is 1 per call (the rounds are the repeats).
#
# nginx runs beside every binary in every round (run.sh's `nginx` path): its rows are gathered
# under the name `nginx`, and each binary's medians are also printed divided by nginx's median of
# the same case (issue 36's goals are such ratios).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROUNDS=${ROUNDS:-5}
SCENARIOS=${SCENARIOS:-4}
(($# >= 1)) || { echo "usage: bash benches/ab.sh NAME=PATH [NAME=PATH ...]" >&2; exit 2; }
if [[ -n ${KEEP:-} ]]; then
  OUT=$KEEP; mkdir -p "$OUT"; : >"$OUT/all.tsv"
else
  OUT=$(mktemp -d "${TMPDIR:-/tmp}/taskgate-ab.XXXXXX")
  trap 'rm -rf "$OUT"' EXIT
fi

for round in $(seq "$ROUNDS"); do
  for pair in "$@"; do
    name=${pair%%=*} bin=${pair#*=}
    REPEAT=1 SCENARIOS="$SCENARIOS" TASKGATE_BIN="$bin" RESULTS="$OUT/$name-$round.md" \
      bash "$HERE/run.sh" >/dev/null 2>"$OUT/$name-$round.log" ||
      { echo "run $name round $round failed: $OUT/$name-$round.log" >&2; cat "$OUT/$name-$round.log" >&2; exit 1; }
    # Each scenario table's taskgate rows: | taskgate | ops/s | ... | proxy CPU µs/req | errors |
    # (scenario 10 has two, `taskgate-sled` and `taskgate-pg`, and scenario 14 `tier` beside
    # `taskgate`: the path is added to the case).
    awk -v n="$name" -v r="$round" '
      /^#+ [0-9]/ { scen = $0; sub(/^#+ /, "", scen) }
      /^\| (taskgate(-[a-z]+)?|tier|nginx) \|/ && scen != "" { k = split($0, f, "|"); path = f[2]; gsub(/ /, "", path);
                          case_ = (path == "taskgate" || path == "nginx") ? scen : scen " [" path "]";
                          who = (path == "nginx") ? "nginx" : n;
                          gsub(/ /, "", f[3]); gsub(/ /, "", f[k-2]);
                          printf "%s\tround %s\t%s\tops/s %s\tCPU µs/req %s\n", who, r, case_, f[3], f[k-2] }
    ' "$OUT/$name-$round.md" | tee -a "$OUT/all.tsv"
  done
done

echo
echo "medians over $ROUNDS rounds (min–max):"
python3 - "$OUT/all.tsv" <<'PY'
import sys, statistics, collections
rows = collections.defaultdict(lambda: ([], []))
for line in open(sys.argv[1]):
    name, _, scen, ops, cpu = line.rstrip("\n").split("\t")
    num = lambda s: float(s.split()[-1].split("(")[0])
    rows[(scen, name)][0].append(num(ops)); rows[(scen, name)][1].append(num(cpu))
for (scen, name), (ops, cpu) in sorted(rows.items()):
    print(f"{scen} | {name} | ops/s {statistics.median(ops):.0f} ({min(ops):.0f}–{max(ops):.0f})"
          f" | CPU µs/req {statistics.median(cpu):.1f} ({min(cpu):.1f}–{max(cpu):.1f})")
ratios = [(scen, name, ops, cpu) for (scen, name), (ops, cpu) in sorted(rows.items())
          if name != "nginx" and (scen, "nginx") in rows]
if ratios:
    print()
    print("each binary's medians ÷ nginx's medians of the same case (all rounds):")
for scen, name, ops, cpu in ratios:
    n_ops, n_cpu = rows[(scen, "nginx")]
    if statistics.median(n_ops) > 0 and statistics.median(n_cpu) > 0:
        print(f"{scen} | {name} | ops/s ×{statistics.median(ops) / statistics.median(n_ops):.2f}"
              f" | CPU µs/req ×{statistics.median(cpu) / statistics.median(n_cpu):.2f}")
PY
