#!/usr/bin/env bash
# scripts/bed/suite.sh: the harness's cases on the bed (`mpib-harness --topology bed`; every case
# is defined once in driver/src/harness/catalog.rs, the bed in driver/src/harness/bed.rs): hosts
# made of network namespaces running MPIB_FABRIC=tcp, two cabled back to back (host A
# ${BED_PREFIX}_a sends, host B _b receives; rail 0 SOUT veth_a0 10.100.0.1/24 <-> veth_b0
# 10.100.0.2, rail 1 SUP veth_a1 10.100.1.1 <-> veth_b1 10.100.1.2), then three on a switch per
# rail for the collectives across more hosts, and a stranger host linked to B alone. Conformance
# pairs for every table, failover, faults, flaps, failbacks, killed processes, collectives over
# rank processes, the stranger: docs/TESTING.md lists them. Nothing may hang: every process has a
# deadline. The bed is torn down on exit, Ctrl-C or failure; a stale one from a killed run is
# removed first.
#
# Usage: sudo scripts/bed/suite.sh [--build]. Build first (`cargo build --release -p mpib -p
# mpib-driver`, what --build runs). Without root or `ip netns` it fails, or prints `SKIPPED: why`
# and exits 0 when BED_ALLOW_SKIP=1. Prints `PASS name: detail` / `FAIL name: why` (and the logs'
# tails) per case, then `bed: N passed, M failed in S s`; exits non-zero if anything failed.
# Logs and records (results.jsonl, one JSON object per case) of the last run: target/bed/last/.
# Settings, each passed to mpib-harness as its flag: BED_ONLY (--only, a regular expression: the
# cases to run), BED_PAIR_TIMEOUT (--process-limit, 60 s a process), BED_SCALE (--scale:
# loopback, sizes up to 64 MiB; rig: 4 MiB), BED_RATE_SOUT / BED_RATE_SUP (--rate-sout/--rate-sup,
# tbf rate of a rail, e.g. 1gbit; unset: unshaped), BED_FAULT_RATE (--fault-rate, 200mbit; 0:
# unshaped), BED_MAX_CALL_MS (--max-call-ms, 500; 0: off), BED_PREFIX (--prefix, mpib_bed),
# BED_BIN (--bin, ${CARGO_TARGET_DIR:-target}/release), BED_MPIB (--mpib, K=V words: MPIB_*
# settings added to every case's own, e.g. BED_MPIB=MPIB_FAILOVER_WATCHDOG_MS=100; the cases'
# own come after them and win).
set -uo pipefail

root=$(cd "$(dirname "$(readlink -f "$0")")/../.." && pwd)
cd "$root" || exit 1
# A bed that cannot be built must never pass silently: skipping is an explicit choice.
unavailable() {
  if [ "${BED_ALLOW_SKIP:-0}" = 1 ]; then echo "SKIPPED: $1"; exit 0; fi
  echo "FAIL bed: $1 (BED_ALLOW_SKIP=1 skips instead)"
  exit 1
}
[[ ${1-} =~ ^(--build)?$ ]] || { echo "usage: $0 [--build]" >&2; exit 2; }
[ "$(id -u)" = 0 ] || unavailable "not root: network namespaces need root (run with sudo)"
if ! command -v ip > /dev/null || ! ip netns list > /dev/null 2>&1; then
  unavailable "\`ip netns\` is unavailable (iproute2)"
fi
if [ "${1-}" = --build ]; then
  # shellcheck disable=SC1091  # ensure_rust: cargo on PATH, or a clear message
  . scripts/lib/setup.sh
  ensure_rust
  echo "==> bed: cargo build --release -p mpib -p mpib-driver"
  cargo build --release --locked -p mpib -p mpib-driver 2>&1 | tail -n 3
  [ "${PIPESTATUS[0]}" = 0 ] || { echo "FAIL bed: cargo build --release -p mpib -p mpib-driver failed"; exit 1; }
fi
bin=${BED_BIN:-${CARGO_TARGET_DIR:-$root/target}/release}
[[ $bin == /* ]] || bin=$root/$bin
for f in mpib-harness mpib-xfer mpib-ranks libnccl_net_mpib.so; do
  [ -f "$bin/$f" ] || { echo "FAIL bed: $bin/$f missing: build first (cargo build --release -p mpib -p mpib-driver) or pass --build"; exit 1; }
done
[ -z "${BED_FULL_VERSIONS+set}" ] ||
  { echo "FAIL bed: BED_FULL_VERSIONS is gone: the catalog (driver/src/harness/catalog.rs) says which tables run"; exit 2; }
echo "bed: $(nproc) CPU(s), kernel $(uname -r)"
"$bin/mpib-harness" --topology bed --bin "$bin" --work "$root/target/bed/last" \
  --only "${BED_ONLY:-}" --process-limit "${BED_PAIR_TIMEOUT:-60}" --scale "${BED_SCALE:-loopback}" \
  --rate-sout "${BED_RATE_SOUT:-}" --rate-sup "${BED_RATE_SUP:-}" \
  --fault-rate "${BED_FAULT_RATE:-200mbit}" --max-call-ms "${BED_MAX_CALL_MS:-500}" \
  --prefix "${BED_PREFIX:-mpib_bed}" --mpib "${BED_MPIB:-}"
rc=$?
# 3: this machine cannot build the bed (no case ran).
[ "$rc" != 3 ] || unavailable "the harness could not build the bed (its FAIL line above says why)"
exit "$rc"
