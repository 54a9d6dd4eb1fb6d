#!/usr/bin/env bash
# Every check of the probes crate: fmt, clippy, tests (unit, cross-process, doc), loom, miri,
# and the counter benchmark. Run from anywhere; uses its own target directories.
#   probes/check.sh            all of it
#   probes/check.sh quick      fmt, clippy, tests only
set -euo pipefail
cd "$(dirname "$0")/.."
T=${CARGO_TARGET_DIR:-/tmp/tgt-probes}

cargo fmt -p mpib-probes -- --check
CARGO_TARGET_DIR=$T cargo clippy -p mpib-probes --all-targets -- -D warnings
CARGO_TARGET_DIR=$T cargo test -p mpib-probes
[[ ${1:-} == quick ]] && exit 0

# Loom: one writer and one reader over ring wraparound, and the histogram seqlock.
# LOOM_MAX_PREEMPTIONS defaults to 4 in the test (about 1 s); 10 takes about 20 s.
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=$T-loom \
    cargo test -p mpib-probes --test loom --release

# Miri (nightly + miri component): the heap-backed ring and histogram, then the connection
# table and encodings (those read the clock, hence -Zmiri-disable-isolation). The file-backed
# tests cannot run: Miri does not support file-backed memory mappings.
if cargo +nightly miri --version >/dev/null 2>&1; then
    MIRIFLAGS="-Zmiri-strict-provenance" CARGO_TARGET_DIR=$T-miri \
        cargo +nightly miri test -p mpib-probes --lib -- ring:: histogram:: tests::disabled_handles
    MIRIFLAGS="-Zmiri-strict-provenance -Zmiri-disable-isolation" CARGO_TARGET_DIR=$T-miri \
        cargo +nightly miri test -p mpib-probes --lib -- conn:: types::
else
    echo "miri: skipped (rustup component add --toolchain nightly miri rust-src)"
fi

CARGO_TARGET_DIR=$T cargo bench -p mpib-probes --bench counters
