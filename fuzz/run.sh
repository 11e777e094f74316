#!/usr/bin/env bash
# A short bounded fuzzing run: SECONDS_PER_TARGET (default 60) per target with cargo-fuzz
# (libFuzzer). Nightly is not needed: the stable toolchain builds it with RUSTC_BOOTSTRAP=1
# (cargo-fuzz's `-Zsanitizer` and `-Cpasses` flags are nightly-only otherwise). Without
# cargo-fuzz it runs the same properties on seeded random inputs with `cargo test --lib props`
# instead, and says so. Targets: the arguments, else all. Prints the executions per target.
# Exit 1 on a finding.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
secs="${SECONDS_PER_TARGET:-60}"
targets=(envelope sse_decoder sse_roundtrip config status_rewrite modern_task bridge_translate
    chunked_framing bridge_legacy held_request held_answer held_initialize held_record
    routing_headers listen_mrtr)
if [ "$#" -gt 0 ]; then
    targets=("$@")
fi
export RUSTC_BOOTSTRAP=1
if cargo fuzz --version >/dev/null 2>&1; then
    cd "$here"
    cargo fuzz build
    summary=()
    for t in "${targets[@]}"; do
        echo "fuzz: $t for ${secs}s"
        mkdir -p "corpus/$t"
        log="$(mktemp)"
        cargo fuzz run "$t" "corpus/$t" -- -max_total_time="$secs" -rss_limit_mb=2048 \
            >"$log" 2>&1 || true
        grep -E "^(#[0-9]+ *DONE|==[0-9]+==|SUMMARY|Done)" "$log" || true
        execs="$(grep -oE "^Done [0-9]+ runs" "$log" | grep -oE "[0-9]+" || echo "?")"
        crashes="$(ls -A "artifacts/$t" 2>/dev/null | wc -l)"
        summary+=("$t $execs $crashes")
        rm -f "$log"
        if [ "$crashes" -gt 0 ]; then
            echo "fuzz: $t found a crash: $here/artifacts/$t" >&2
            printf '%s\n' "${summary[@]}"
            exit 1
        fi
    done
    echo "fuzz: target executions crashes"
    printf 'fuzz: %s\n' "${summary[@]}"
    echo "fuzz: ${#targets[@]} targets, no findings"
else
    echo "fuzz: cargo-fuzz not found (cargo install cargo-fuzz --locked);"
    echo "fuzz: running the same properties as property tests instead"
    cd "$here/.."
    cargo test --locked --lib props
fi
