#!/usr/bin/env bash
# A profile-guided (PGO) release build of taskgate (issue 36: the small call's instruction-cache
# and data-cache misses): builds an instrumented release binary (-Cprofile-generate), trains it
# on the bench scenarios, merges the profiles (llvm-profdata) and rebuilds the release binary
# with them (-Cprofile-use). Prints the PGO binary's path on stdout (progress goes to stderr).
#
#   bash benches/pgo.sh                      # builds, trains, prints .../pgo-use/<host>/release/taskgate
#   TRAIN_COUNT=5000 bash benches/pgo.sh     # requests per timed scenario (default 4000)
#   PROFDATA=/tmp/tg.profdata bash benches/pgo.sh   # also keep the merged profile there
#
# Training (all at c=16, through a taskgate with benches/lib.sh's config in front of the bench
# upstream, both on 127.0.0.1 ephemeral ports): TRAIN_COUNT small tools/calls (scenario 1),
# TRAIN_COUNT/10 task lifecycles of the 2025 era (scenario 4: create, 10 × tasks/get,
# tasks/result) and of the 2026 tasks extension (scenario 8), and TRAIN_COUNT/10 SSE answers of
# 100 progress events (scenario 3); then, through a second taskgate with trace export on
# (every span sampled, to benches/otlp_receiver.py), TRAIN_COUNT/2 small calls and TRAIN_COUNT/20
# lifecycles of each era. Startup, session opening and the graceful stop are in the profile too.
# Everything started here stops on exit.
#
# Time on a 2-core machine: two fat-LTO release builds from scratch (instrumented, then optimised;
# 7 and 4.5 min measured on a shared machine) plus under a minute of training (the instrumented
# binary is slower). The builds use their
# own target directories under ${CARGO_TARGET_DIR:-target} (pgo-gen, pgo-use), so the ordinary
# release build's cache is left alone. RUSTFLAGS apply to every crate of the binary (tokio,
# hyper, serde_json too) but not to build scripts and proc macros (cargo --target).
#
# Needs llvm-profdata of the same LLVM as rustc: `rustup component add llvm-tools` (it is looked
# up in the active toolchain's sysroot, then on PATH). A profile is tied to the toolchain and to
# the source: a profile from another LLVM is refused, and functions changed since training build
# without profile data (LLVM may warn about hash mismatches); so retrain on every build.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
TRAIN_COUNT=${TRAIN_COUNT:-4000}
TARGET_BASE=${CARGO_TARGET_DIR:-$ROOT/target}
HOST=$(rustc -vV | sed -n 's/^host: //p')
say() { printf '== %s\n' "$*" >&2; }

PROFDATA_TOOL="$(rustc --print sysroot)/lib/rustlib/$HOST/bin/llvm-profdata"
[ -x "$PROFDATA_TOOL" ] || PROFDATA_TOOL=$(command -v llvm-profdata || true)
[ -n "$PROFDATA_TOOL" ] || { echo "needs llvm-profdata: rustup component add llvm-tools" >&2; exit 2; }
# Checked before the builds: one of another LLVM (Debian's, on PATH) refuses the profiles only
# after the instrumented build and the training ("unsupported instrumentation profile format
# version", seen on a new machine without llvm-tools).
RUSTC_LLVM=$(rustc -vV | sed -n 's/^LLVM version: \([0-9]*\).*/\1/p')
# (`merge --version`: an older llvm-profdata refuses a top-level `--version`.)
TOOL_LLVM=$("$PROFDATA_TOOL" merge --version 2>/dev/null | sed -n 's/.*LLVM version \([0-9]*\).*/\1/p' | head -1 || true)
if [ -n "$RUSTC_LLVM" ] && [ "$TOOL_LLVM" != "$RUSTC_LLVM" ]; then
  echo "$PROFDATA_TOOL is LLVM ${TOOL_LLVM:-?}, rustc is LLVM $RUSTC_LLVM: rustup component add llvm-tools" >&2
  exit 2
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/taskgate-pgo.XXXXXX")
# shellcheck source=lib.sh
source "$HERE/lib.sh"
trap bench_exit EXIT
trap 'exit 130' INT TERM

# The bench tools (their own target directory, as run.sh and profile.sh build them).
(cd "$HERE/loadgen" && CARGO_TARGET_DIR="$HERE/loadgen/target" nice cargo build --release --quiet)
LG="$HERE/loadgen/target/release/loadgen"

build() { # $1 target subdirectory, $2 RUSTFLAGS; prints the binary's path
  local t0=$SECONDS
  (cd "$ROOT" && CARGO_TARGET_DIR="$TARGET_BASE/$1" RUSTFLAGS="$2" \
    nice cargo build --release --locked --quiet --bin taskgate --target "$HOST" >&2) || return 1
  say "$1 build: $((SECONDS - t0)) s"
  echo "$TARGET_BASE/$1/$HOST/release/taskgate"
}

say "building the instrumented binary"
RAW="$WORK/profraw"
GEN_BIN=$(build pgo-gen "${RUSTFLAGS:-} -Cprofile-generate=$RAW")

say "training"
"$LG" spawn-ready --stdout "$WORK/up.out" --stderr "$WORK/up.err" --label upstream \
  -- "$HERE/loadgen/target/release/upstream" --listen 127.0.0.1:0 --threads 1 > "$WORK/up.json"
PIDS+=("$(json_field "$WORK/up.json" pid)")
start_taskgate() { # $1 name (its config is $WORK/$1.toml) → sets TG_PID and URL
  "$LG" spawn-ready --stdout "$WORK/$1.out" --stderr "$WORK/$1.err" --label taskgate \
    -- env -u OTEL_EXPORTER_OTLP_ENDPOINT -u OTEL_EXPORTER_OTLP_TRACES_ENDPOINT -u LLVM_PROFILE_FILE \
    "$GEN_BIN" serve --config "$WORK/$1.toml" > "$WORK/$1.json"
  TG_PID=$(json_field "$WORK/$1.json" pid)
  PIDS+=("$TG_PID")
  URL="http://$(json_field "$WORK/$1.json" gateway)/mcp"
}
taskgate_toml "$WORK/tg.toml" "$WORK/store" "" "$(json_field "$WORK/up.json" addr)"
start_taskgate tg
train() { # $1 scenario, $2 count
  local t0=$SECONDS
  # loadgen appends to --json-out: a file per run, so that its own errors are the ones read.
  rm -f "$WORK/train-$1.jsonl"
  "$LG" run --url "$URL" --target taskgate --case pgo --rep 1 --concurrency 16 \
    --scenario "$1" --count "$2" --json-out "$WORK/train-$1.jsonl" > /dev/null
  # A training whose requests failed profiles the error paths, not the ones users run.
  local errors
  errors=$(json_field "$WORK/train-$1.jsonl" errors)
  [ "$errors" = 0 ] || { echo "training $1: $errors of $2 requests failed" >&2; exit 1; }
  say "  $1 × $2 at c=16: $((SECONDS - t0)) s"
}
# The profile is written when taskgate exits normally: SIGTERM is its graceful stop (drain up to
# 10 s by default). A taskgate still running after 60 s is killed and its profile lost: fail.
stop_training() { # $1 pid
  local i
  kill -TERM "$1" 2>/dev/null || { echo "taskgate $1 was gone before its stop: no profile" >&2; exit 1; }
  for i in $(seq 6000); do gone "$1" && return 0; sleep 0.01; done
  kill -KILL "$1" 2>/dev/null || true
  echo "taskgate $1 did not stop within 60 s of SIGTERM: its profile is lost" >&2
  exit 1
}
train small "$TRAIN_COUNT"
train lifecycle $((TRAIN_COUNT / 10))
train modern-lifecycle $((TRAIN_COUNT / 10))
train sse $((TRAIN_COUNT / 10))
stop_training "$TG_PID"
# Then with trace export on (`[telemetry]`, every span sampled, to benches/otlp_receiver.py):
# without it the span and export code was cold in the profile, and export on cost +19.4 % CPU
# per small call on the PGO binary against +12.2 % on the plain one (benches/telemetry.sh,
# 5 pairs each, 2026-12-05). The profiles of both processes merge.
start_otlp_receiver "$WORK" pgo
PIDS+=("$RX_PID")
taskgate_toml "$WORK/traced.toml" "$WORK/store-traced" "" "$(json_field "$WORK/up.json" addr)"
printf '\n[telemetry]\notlp_endpoint = "%s"\nsample_ratio = 1.0\n' "$RX" >> "$WORK/traced.toml"
start_taskgate traced
train small $((TRAIN_COUNT / 2))
train lifecycle $((TRAIN_COUNT / 20))
train modern-lifecycle $((TRAIN_COUNT / 20))
stop_training "$TG_PID"
# Nothing stays up through the second build (and no pid is signalled again at exit).
for pid in "${PIDS[@]}"; do stop_pid "$pid"; done
PIDS=()
ls "$RAW"/*.profraw > /dev/null 2>&1 || { echo "no profile written (taskgate did not exit cleanly?)" >&2; exit 1; }

MERGED="$WORK/merged.profdata"
"$PROFDATA_TOOL" merge -o "$MERGED" "$RAW"
say "merged $(ls "$RAW" | wc -l) profile(s): $(du -h "$MERGED" | cut -f1)"
[ -n "${PROFDATA:-}" ] && cp "$MERGED" "$PROFDATA"

say "building the PGO binary"
# -Cprofile-use needs the file while building only; the binary does not refer to it.
build pgo-use "${RUSTFLAGS:-} -Cprofile-use=$MERGED"
