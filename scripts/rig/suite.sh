#!/usr/bin/env bash
# scripts/rig/suite.sh: the cross-process verbs suite on two real Soft-RoCE rails.
#
# Builds on the host (`cargo build --release -p mpib -p mpib-driver -p mpib-collector`, plus the
# verbs device test binaries in the debug profile), then boots the rxe rig ONCE
# (scripts/rxe-vm/run.sh) and runs the harness's rig cases inside it (`mpib-harness --topology
# rig`; each case is defined once in driver/src/harness/catalog.rs, docs/TESTING.md lists them):
# host A's rails rxe_a0 + rxe_a1 (10.100.0.1), host B's rxe_b0 + rxe_b1 (10.100.0.2), pairs of
# mpib-xfer processes walking the conformance cases of v12 and v8 byte-exact, wires cut, flapped
# and impaired with netem, processes killed, two fused devices per host told apart by their
# NICs' counters, collectives over rank processes, the verbs device tests and the main job
# (`mpib-demo --fabric verbs`). Each side checks the bytes per rail from its probes file against
# the split rule, so SRQ receives and WRITE_WITH_IMM really happen on both rails.
#
# Prints `PASS name: ...` / `FAIL name: why` per case and `rig: N passed, M failed ...`; exits
# non-zero if anything failed, including a rig that cannot boot (no qemu, no packages): it never
# passes silently. Logs and records (results.jsonl, one JSON object per case) of the last run:
# target/rig/last/.
#
# Settings: RXE_VM_TIMEOUT (900 s for the whole boot), RIG_PAIR_TIMEOUT (240 s per process pair),
# RIG_ONLY (a regular expression: run only the cases whose name matches), RIG_MAX_CALL_MS (500:
# a case fails when a connection call (handshake, registration, close) took longer), and those of
# scripts/rxe-vm/run.sh (RXE_VM_CPUS, ...).
set -uo pipefail

here=$(cd "$(dirname "$(readlink -f "$0")")" && pwd)
root=$(cd "$here/../.." && pwd)
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# ================================================================================ in the VM
if [ "${1-}" = --guest ]; then
  # The cases are the harness's (driver/src/harness/catalog.rs, those on the rig); the rig itself
  # (hosts, netem on the wires, the NICs' counters) is driver/src/harness/rig.rs.
  args=(--topology rig --bin target/release --work "$RIG_WORK" --only "${RIG_ONLY:-}"
    --process-limit "${RIG_PAIR_TIMEOUT:-240}" --max-call-ms "${RIG_MAX_CALL_MS:-500}")
  [ -z "${RIG_DEVTEST_BIN-}" ] || args+=(--device-tests "$RIG_DEVTEST_BIN")
  [ -z "${RIG_LIBTEST_BIN-}" ] || args+=(--library-tests "$RIG_LIBTEST_BIN")
  echo "rig guest: $(nproc) vCPU(s), kernel $(uname -r), uptime $(cut -d' ' -f1 /proc/uptime) s"
  exec target/release/mpib-harness "${args[@]}"
fi

# ================================================================================ on the host
cd "$root" || exit 1
t0=$(now)
. scripts/lib/setup.sh
ensure_rust
passed=0 failed=0
fail() { echo "FAIL $1: $2"; failed=$((failed + 1)); }
finish() {
  # A failed case again at the end, with its logs' last lines: a run's tail (all that CI shows
  # of a long log) must say which case failed and how.
  if [ -f "${RIG_WORK:-/nonexistent}/results" ] && grep -q '^FAIL' "$RIG_WORK/results"; then
    echo "==> rig: the failed cases again"
    grep '^FAIL' "$RIG_WORK/results" | while read -r _ line; do
      echo "FAIL $line" | cut -c1-800
      # The case's directory is its name's slug: the longest one the line's slug starts with.
      line_slug=$(echo "$line" | tr -c 'a-zA-Z0-9=_.-' '_') case_dir=
      for dir in "$RIG_WORK"/*/; do
        dir=${dir%/}
        [[ $line_slug == "${dir##*/}"* ]] && [ ${#dir} -gt ${#case_dir} ] && case_dir=$dir
      done
      for log in ${case_dir:+"$case_dir"/*.log}; do
        [ -f "$log" ] || continue
        echo "  --- ${log#"$root"/} (last 8 lines)"
        tail -n 8 "$log" | cut -c1-400 | sed 's/^/  | /'
      done
    done
  fi
  echo "rig: $passed passed, $failed failed in $(since "$t0") s (logs: target/rig/last/)"
  [ "$failed" = 0 ] && [ "$passed" -gt 0 ]
  exit $?
}

echo "==> rig: cargo build --release -p mpib -p mpib-driver -p mpib-collector"
if ! cargo build --release --locked -p mpib -p mpib-driver -p mpib-collector 2>&1 | tail -n 3 ||
   [ ! -f target/release/mpib-xfer ] || [ ! -f target/release/libnccl_net_mpib.so ] ||
   [ ! -f target/release/mpib-collector ]; then
  fail build "cargo build --release -p mpib -p mpib-driver -p mpib-collector failed"
  finish
fi
ln -sf libnccl_net_mpib.so target/release/libnccl-net-mpib.so

# The verbs device tests are built here (debug, as `cargo test` builds them) and run in the VM.
test_exe() { # test_exe CARGO-TEST-ARGS...: the path of the test binary cargo builds
  cargo test --locked --no-run --message-format=json "$@" 2>/dev/null |
    sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1
}
export RIG_DEVTEST_BIN='' RIG_LIBTEST_BIN=''
echo "==> rig: verbs device test binaries (cargo test --no-run)"
if [ -f tests/verbs_device.rs ]; then
  RIG_DEVTEST_BIN=$(test_exe -p mpib --test verbs_device)
  [ -n "$RIG_DEVTEST_BIN" ] || { fail "build verbs_device" "cargo test --no-run --test verbs_device failed"; }
fi
lib=$(test_exe -p mpib --lib)
if [ -n "$lib" ] && [ "$("$lib" --list --ignored fabric::verbs 2>/dev/null | grep -c ': test$')" -gt 0 ]; then
  RIG_LIBTEST_BIN=$lib
fi
echo "    tests/verbs_device.rs: ${RIG_DEVTEST_BIN:-none}; ignored lib tests fabric::verbs: ${RIG_LIBTEST_BIN:-none}"

export RIG_WORK=$root/target/rig/last
rm -rf "$RIG_WORK"
mkdir -p "$RIG_WORK"
export RXE_VM_TIMEOUT=${RXE_VM_TIMEOUT:-900}
# Four rails per host: the first two carry every case as before; the `devices` case fuses the
# other two into a second device.
export RXE_VM_RAILS=${RXE_VM_RAILS:-4}
echo "==> rig: one boot of scripts/rxe-vm/run.sh (RXE_VM_TIMEOUT=$RXE_VM_TIMEOUT s)"
tv=$(now)
"$root/scripts/rxe-vm/run.sh" "$here/suite.sh" --guest
rc=$?
echo "==> rig: the VM ran $(since "$tv") s (exit $rc)"
if [ -f "$RIG_WORK/results" ]; then
  while read -r verdict _; do
    case $verdict in
      PASS) passed=$((passed + 1)) ;;
      FAIL) failed=$((failed + 1)) ;;
    esac
  done < "$RIG_WORK/results"
fi
case $rc in
  0) [ "$passed" -gt 0 ] || fail rig "the guest reported no case" ;;
  1) [ "$failed" -gt 0 ] || fail rig "run.sh exited 1 without a failed case (qemu or packages missing? see its ERROR above)" ;;
  124) fail rig "TIMEOUT: the VM was killed after RXE_VM_TIMEOUT=$RXE_VM_TIMEOUT s; cases not reported did not run" ;;
  255) fail rig "the VM died (see run.sh's message above)" ;;
  *) fail rig "run.sh exited $rc" ;;
esac
finish
