#!/usr/bin/env bash
# A short bounded fuzzing run: SECONDS_PER_TARGET (default 60) per target with cargo-fuzz on
# nightly. Without cargo-fuzz or nightly it runs the same properties on seeded random inputs
# with `cargo test --lib props` instead, and says so. Exit 1 on a finding.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
secs="${SECONDS_PER_TARGET:-60}"
targets=(envelope sse_decoder sse_roundtrip config status_rewrite modern_task bridge_translate chunked_framing)
if cargo +nightly fuzz --version >/dev/null 2>&1; then
    cd "$here"
    for t in "${targets[@]}"; do
        echo "fuzz: $t for ${secs}s"
        mkdir -p "corpus/$t"
        cargo +nightly fuzz run "$t" "corpus/$t" -- -max_total_time="$secs" -rss_limit_mb=2048 2>&1 \
            | grep -E "^(#[0-9]+ *DONE|==[0-9]+==|SUMMARY|Done)" || true
        if [ -n "$(ls -A "artifacts/$t" 2>/dev/null)" ]; then
            echo "fuzz: $t found a crash: $here/artifacts/$t" >&2
            exit 1
        fi
    done
    echo "fuzz: ${#targets[@]} targets, no findings"
else
    echo "fuzz: cargo-fuzz on nightly not found (cargo install cargo-fuzz; rustup toolchain install nightly);"
    echo "fuzz: running the same properties as property tests instead"
    cd "$here/.."
    cargo test --locked --lib props
fi
