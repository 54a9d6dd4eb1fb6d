#!/bin/bash
# scripts/rxe-vm/selftest.sh [--full]
#
# Checks the rig end to end in ONE boot: builds listdev.c and imm_srq_test.c (this dir) on the
# host with gcc -libverbs into a temp dir, then inside the VM:
#   env        the caller's environment reaches the command
#   listdev    4 devices rxe_a0 rxe_a1 rxe_b0 rxe_b1, ports ACTIVE, active_mtu, RoCE v2 GID 1
#   rail0      imm_srq_test rxe_a0 -> rxe_b0: RDMA_WRITE_WITH_IMM into an SRQ, 64 KiB
#   rail1      imm_srq_test rxe_a1 -> rxe_b1, the same
# and back on the host:
#   rw-mount   a file the guest wrote into $PWD is on the host
#   exit-code  run.sh passed the guest's exit code back
# --full adds two more boots: `exit 7` must give 7, and RXE_VM_TIMEOUT=3 must give 124.
# Prints PASS/FAIL per case; exits non-zero if any failed. Env: SELFTEST_ITERS (500).
set -uo pipefail
here=$(cd "$(dirname "$(readlink -f "$0")")" && pwd)

if [ "${1-}" = --guest ]; then   # ---------------------------------------- inside the VM
  fails=0
  pass() { echo "PASS $1${2:+: $2}"; }
  fail() { echo "FAIL $1: $2"; fails=$((fails + 1)); }
  if [ "${RXE_SELFTEST_TOKEN-}" = "$RXE_SELFTEST_EXPECT" ]; then pass env
  else fail env "RXE_SELFTEST_TOKEN='${RXE_SELFTEST_TOKEN-}' did not arrive"; fi

  mtu=${RXE_VM_MTU:-9000} active=1024
  [ "$mtu" -lt 4200 ] || active=4096
  [ "$mtu" -ge 4200 ] || [ "$mtu" -lt 2200 ] || active=2048
  out=$(timeout 60 ./listdev 2>&1); rc=$?
  echo "$out" | sed 's/^/  | /'
  why=
  [ $rc = 0 ] || why="listdev rc=$rc"
  echo "$out" | grep -q '^4 device(s)$' || why="${why:+$why; }expected 4 devices"
  for d in rxe_a0 rxe_a1 rxe_b0 rxe_b1; do
    echo "$out" | grep -q "^$d: .* port1 state=4 active_mtu=$active " ||
      why="${why:+$why; }$d missing, not ACTIVE or active_mtu != $active"
  done
  [ "$(echo "$out" | grep -c '^  gid\[1\] RoCEv2 0000:0000:0000:0000:0000:ffff:0a64:')" = 4 ] ||
    why="${why:+$why; }gid[1] is not the RoCE v2 IPv4 GID on all 4"
  if [ -z "$why" ]; then pass listdev; else fail listdev "$why"; fi

  iters=${SELFTEST_ITERS:-500}
  for r in 0 1; do
    # retry_cnt 6, not 7: rxe treats 7 as "retry forever" (README "Known limits"), so a broken wire
    # would hang instead of failing. timeout 120 caps a hang anyway.
    out=$(timeout 120 ./imm_srq_test rxe_a$r rxe_b$r 1 "$iters" 65536 14 6 2>&1); rc=$?
    echo "$out" | sed 's/^/  | /'
    if [ $rc = 0 ] && echo "$out" | grep -q ": $iters RDMA_WRITE_WITH_IMM x 65536 B via SRQ, 0 errors"; then
      pass rail$r "$(echo "$out" | grep -o '[0-9.]* MB/s')"
    else
      fail rail$r "imm_srq_test rc=$rc (124: timed out)"
    fi
  done
  echo "written by the guest" > rw-check
  exit $((fails > 0 ? 1 : 0))
fi

# ------------------------------------------------------------------------------ host side
full=; [ "${1-}" = --full ] && full=1
"$here/run.sh" --prepare || { echo "FAIL prepare: run.sh --prepare failed"; exit 1; }
if ! command -v gcc >/dev/null; then
  echo "selftest: installing gcc" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gcc libc6-dev >&2 ||
    { echo "FAIL build: no gcc and cannot install it"; exit 1; }
fi
tmp=$(mktemp -d /tmp/mpib-rxe-selftest.XXXXXX); trap 'rm -rf "$tmp"' EXIT
for p in listdev imm_srq_test; do
  gcc -O2 -Wall -o "$tmp/$p" "$here/$p.c" -libverbs ||
    { echo "FAIL build: gcc $p.c -libverbs"; exit 1; }
done
echo "PASS build"

fails=0
cd "$tmp" || exit 1   # the VM's CWD: mounted read-write, so the guest can leave rw-check here
t0=$(date +%s.%N)
RXE_SELFTEST_TOKEN=tok$$ RXE_SELFTEST_EXPECT=tok$$ "$here/run.sh" "$here/selftest.sh" --guest | tee "$tmp/out"
rc=${PIPESTATUS[0]}
echo "(one boot with all guest cases: $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') s)"
fails=$((fails + $(grep -c '^FAIL ' "$tmp/out")))
for c in env listdev rail0 rail1; do
  grep -q "^PASS $c" "$tmp/out" || grep -q "^FAIL $c" "$tmp/out" ||
    { echo "FAIL $c: no result (the VM died? run.sh rc=$rc)"; fails=$((fails + 1)); }
done
if [ "$(cat rw-check 2>/dev/null)" = "written by the guest" ]; then echo "PASS rw-mount"
else echo "FAIL rw-mount: the guest's file did not reach the host"; fails=$((fails + 1)); fi
want=$(( $(grep -c '^FAIL ' "$tmp/out") > 0 ? 1 : 0 ))
if [ "$rc" = "$want" ]; then echo "PASS exit-code: $rc"
else echo "FAIL exit-code: run.sh returned $rc, the guest exited $want"; fails=$((fails + 1)); fi

if [ -n "$full" ]; then
  "$here/run.sh" sh -c 'exit 7' > "$tmp/log" 2>&1; rc=$?
  if [ $rc = 7 ]; then echo "PASS exit-7"
  else echo "FAIL exit-7: got $rc"; sed 's/^/  | /' "$tmp/log"; fails=$((fails + 1)); fi
  RXE_VM_TIMEOUT=3 "$here/run.sh" sleep 60 > "$tmp/log" 2>&1; rc=$?
  if [ $rc = 124 ]; then echo "PASS timeout-124"
  else echo "FAIL timeout-124: got $rc"; sed 's/^/  | /' "$tmp/log"; fails=$((fails + 1)); fi
fi

if [ $fails = 0 ]; then echo "selftest: ALL PASS"; else echo "selftest: $fails FAILED"; fi
[ $fails = 0 ]
