#!/usr/bin/env bash
# scripts/bed/suite.sh: the cross-process suite over MPIB_FABRIC=tcp on a two-host bed made of
# network namespaces (no qemu, no RDMA device): host A (${BED_PREFIX}_a, the sender) and host B
# (_b, the receiver), rail 0 SOUT veth_a0 10.100.0.1/24 <-> veth_b0 10.100.0.2, rail 1 SUP veth_a1
# 10.100.1.1/24 <-> veth_b1 10.100.1.2. Each side is mpib-xfer (driver/src/bin/mpib-xfer.rs) under
# `ip netns exec` with its host's MPIB_HCA_SOUT/SUP and MPIB_OOB_ADDR; handle, agent socket, hints
# and probes live in a temp dir both see (namespaces isolate neither files nor unix sockets).
# Cases, as in scripts/rig/suite.sh:
#   vanilla intra-island (PREFIX_LEN=24: all SUP) and inter-island (32: all SOUT): sizes, larger,
#     grouped, outstanding, pipeline; advanced sup_bw=N (split-N, N = 0 256 512 1024, MPIB_MODE=1:
#     the sender serves the test agent); grouped receives at sup_bw 512. All of them for the
#     tables in BED_FULL_VERSIONS (v12 v8); intra and sup_bw=512 for v11 v10 v9 v7.
#   fault: a rail's link set down mid-run (SUP, SOUT; vanilla, advanced), or cut one way (every
#     packet host A sends on it dropped, as the rig's netem loss 100%): the sender gets the
#     plugin's error naming the rail, as an RC QP would after MPIB_IB_TIMEOUT=14
#     MPIB_IB_RETRY_CNT=6 (4.096 us x 2^14 x 7 = 0.47 s). A SOUT cut also cuts the control
#     connection, which runs over the SOUT address.
#   flap: a rail's link down 2.5 s with the default retries (34 s): every byte arrives.
#   killed: one side SIGKILLed mid-run: the survivor's call returns the plugin's error.
#   ring: mpib-ranks, a ring all-reduce over 4 rank processes, 2 per host, every result checked
#     on every rank; and with SUP's link down mid-collective, exact over SOUT (failover).
#   stranger: a third host (namespace _c, linked to host B alone) scans, floods and sends forged
#     hellos to the receiver's ports mid-run: every byte still arrives, a few throttled WARNs.
# Every side that passes its cases then unloads the plugin as NCCL does (dlclose, with no
# finalize before v11) and fails if a plugin thread outlived it (mpib-xfer).
# Nothing may hang: every process runs under `timeout`. This kernel has no netem qdisc, so unlike
# the rig there are no loss, corruption or delay cases. Fault, flap and killed cases shape both
# rails with tbf (BED_FAULT_RATE) so that the run outlasts the fault whatever the CPU.
# The bed is torn down on exit, Ctrl-C or failure; a stale one from a killed run is removed first.
#
# Usage: sudo scripts/bed/suite.sh [--build]. Build first (`cargo build --release -p mpib -p
# mpib-driver`, what --build runs). Without root or `ip netns` it fails, or prints `SKIPPED: why`
# and exits 0 when BED_ALLOW_SKIP=1. Prints `PASS name: detail` / `FAIL name: why` (and both logs'
# tails) per case, then `bed: N passed, M failed in S s`; exits non-zero if anything failed.
# Logs of the last run: target/bed/last/. Settings: BED_ONLY (regular expression: the cases to
# run), BED_PAIR_TIMEOUT (60 s a process), BED_SCALE (loopback: sizes up to 64 MiB; rig: 4 MiB),
# BED_RATE_SOUT / BED_RATE_SUP (tbf rate of a rail, e.g. 1gbit; unset: unshaped), BED_FAULT_RATE
# (200mbit; 0: unshaped), BED_FULL_VERSIONS, BED_MAX_CALL_MS (500; 0: off), BED_PREFIX (mpib_bed),
# BED_BIN (${CARGO_TARGET_DIR:-target}/release), BED_MPIB (K=V words: MPIB_* settings added to
# every case's own, e.g. BED_MPIB=MPIB_FAILOVER_WATCHDOG_MS=100 to run every case with the
# watchdog; the cases' own come after them and win).
set -uo pipefail

here=$(cd "$(dirname "$(readlink -f "$0")")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root" || exit 1
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
t0=$(now) passed=0 failed=0
finish() {
  echo "bed: $passed passed, $failed failed in $(since "$t0") s (logs: target/bed/last/)"
  [ "$failed" = 0 ] && [ "$passed" -gt 0 ]
  exit $?
}
die() { echo "FAIL bed: $1"; failed=1; finish; }
# A bed that cannot be built must never pass silently: skipping is an explicit choice.
unavailable() {
  if [ "${BED_ALLOW_SKIP:-0}" = 1 ]; then echo "SKIPPED: $1"; exit 0; fi
  die "$1 (BED_ALLOW_SKIP=1 skips instead)"
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
  [ "${PIPESTATUS[0]}" = 0 ] || die "cargo build --release -p mpib -p mpib-driver failed"
fi
bin=${BED_BIN:-${CARGO_TARGET_DIR:-$root/target}/release}
[[ $bin == /* ]] || bin=$root/$bin
for f in mpib-xfer mpib-ranks libnccl_net_mpib.so; do
  [ -f "$bin/$f" ] || die "$bin/$f missing: build first (cargo build --release -p mpib -p mpib-driver) or pass --build"
done

prefix=${BED_PREFIX:-mpib_bed}
NA=${prefix}_a NB=${prefix}_b NC=${prefix}_c
only=${BED_ONLY:-} pair_timeout=${BED_PAIR_TIMEOUT:-60} scale=${BED_SCALE:-loopback}
fault_rate=${BED_FAULT_RATE:-200mbit} max_call_ms=${BED_MAX_CALL_MS:-500}
W=$root/target/bed/last
# Two runs with the same prefix would tear down each other's namespaces: one at a time. (The
# processes this script starts get the lock's fd 9 closed, so none can outlive it holding it.)
# shellcheck source=scripts/bed/lib.sh
. "$here/lib.sh"
exec 9> "/tmp/$prefix.lock"
flock -n 9 || die "another run holds /tmp/$prefix.lock (set BED_PREFIX to run beside it)"

T=''
cleanup() {
  local j
  # Only the suite's own shell tears the bed down. A subshell it started (reap's delayed kill)
  # that is killed before it has reset the traps it inherited runs them: that was the bed whose
  # namespaces vanished before a late case (a pair failing at once on both sides starts the
  # delayed kill and kills it again at once).
  [ "$BASHPID" = "$$" ] || exit 143
  trap - EXIT INT TERM
  # Our own background jobs (the `timeout`s, reap's delayed kill), then the namespaces.
  for j in $(jobs -p); do kill "$j" 2> /dev/null; done
  teardown
  [ -z "$T" ] || rm -rf "$T"
}
trap cleanup EXIT
trap '[ "$BASHPID" = "$$" ] || exit 130; echo "FAIL bed: interrupted"; failed=$((failed + 1)); finish' INT
trap 'exit 143' TERM
teardown   # a stale bed from a killed run, and its temp dir (the lock says none is in use)
find /tmp -maxdepth 1 -type d -name "$prefix.??????" -exec rm -rf {} +

T=$(mktemp -d "/tmp/$prefix.XXXXXX")
build_bed 2> "$T/bed.err" || unavailable "cannot build the bed: $(tr '\n' ' ' < "$T/bed.err")"
# Reachability per rail without ping: a connect to a closed port is refused only if B answered.
for r in 0 1; do
  answer=$(ip netns exec "$NA" timeout 3 bash -c "exec 3<>/dev/tcp/10.100.$r.2/9" 2>&1)
  [[ $answer == *refused* ]] || unavailable "rail $r: 10.100.$r.1 cannot reach 10.100.$r.2: $answer"
done

normal_rates() { shape 0 "${BED_RATE_SOUT:-}" && shape 1 "${BED_RATE_SUP:-}"; }
normal_rates || unavailable "tc could not shape the rails (BED_RATE_SOUT/BED_RATE_SUP)"

rm -rf "$W"
mkdir -p "$W" "$T/probes" "$T/lib"
# The plugin by its NCCL name, as NCCL and the rig load it; cargo names it libnccl_net_mpib.so.
plugin=$T/lib/libnccl-net-mpib.so
ln -s "$bin/libnccl_net_mpib.so" "$plugin"
# Every case gets exactly its own MPIB_* settings (and BED_MPIB's), whatever the caller had
# exported.
for v in $(compgen -e); do [[ $v != MPIB_* ]] || unset "$v"; done
every_case=${BED_MPIB:-}
# Probes on, private to this run: every process checks its bytes per rail from its probes file.
export MPIB_FABRIC=tcp MPIB_PROBES=1 MPIB_PROBES_DIR=$T/probes
A=(MPIB_HCA_SOUT=veth_a0 MPIB_HCA_SUP=veth_a1 MPIB_OOB_ADDR=10.100.0.1)
B=(MPIB_HCA_SOUT=veth_b0 MPIB_HCA_SUP=veth_b1 MPIB_OOB_ADDR=10.100.0.2)

record() { # record PASS|FAIL NAME DETAIL
  echo "$1 $2${3:+: $3}" | tee -a "$W/results"
  if [ "$1" = PASS ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
}
wanted() { [ -z "$only" ] || [[ $1 =~ $only ]]; }
show_tail() { echo "  --- $1 (last 15 lines of $2)"; tail -n 15 "$2" 2> /dev/null | sed 's/^/  | /'; }
# The bytes per rail that a side's `ok` lines report, summed: "SOUT x B, SUP y B".
rails_of() {
  awk '/: ok / && /rails SOUT/ {
         for (i = 1; i <= NF; i++) { if ($i == "SOUT") s += $(i + 1); if ($i == "SUP") u += $(i + 1) }
         n++ }
       END { if (n) printf "%d case(s), rails SOUT %d B / SUP %d B", n, s, u; else printf "no case" }' "$1"
}
ncase=0
newcase() { # newcase NAME: sets d (its logs) and tmp (short, for the agent's socket path)
  # Rarely the namespaces are gone before a case (not found yet): say so at the case it hits,
  # with what /run/netns holds, instead of a bare "Cannot open network namespace".
  if [ ! -e "/run/netns/$NA" ] || [ ! -e "/run/netns/$NB" ]; then
    echo "bed: the namespaces vanished before \"$1\" (/run/netns holds: $(ls /run/netns 2> /dev/null | tr '\n' ' '))"
  fi
  ncase=$((ncase + 1))
  d=$W/$(echo "$1" | tr -c 'a-zA-Z0-9=_.-' '_' | sed 's/_*$//') tmp=$T/c$ncase
  mkdir -p "$d" "$tmp"
}
repeat() { yes "$2" | head -n "$1" | paste -s -d, -; } # repeat N CASE: "CASE,CASE,..."

# launch DIR TMP VERSION CASES "EXTRA K=V..." [mpib-xfer ARGS...]: starts the receiver (host B)
# and the sender (host A) in the background; sets rp and sp, the pids of their `timeout`, whose
# child is mpib-xfer (`ip netns exec` and `env` exec, they do not fork). recv_args and send_args
# add arguments for one role.
recv_args=() send_args=()
launch() {
  local d=$1 tmp=$2 version=$3 cases=$4 extra=$5 role
  shift 5
  for role in recv send; do
    local host=("${B[@]}") more=("${recv_args[@]}") ns=$NB
    [ "$role" = recv ] || { host=("${A[@]}"); more=("${send_args[@]}"); ns=$NA; }
    # shellcheck disable=SC2086  # $extra is a list of K=V words
    ip netns exec "$ns" env "${host[@]}" $every_case $extra MPIB_AGENT_SOCKET="$tmp/agent.sock" \
      MPIB_HINT_PATH="$tmp/hints" timeout -k 5 "$pair_timeout" "$bin/mpib-xfer" --role "$role" \
      --version "$version" --scale "$scale" --handle-file "$tmp/handle" --cases "$cases" \
      --plugin "$plugin" --handle-timeout 20 --connect-timeout 20 "$@" "${more[@]}" \
      > "$d/$role.log" 2>&1 9>&- &
    if [ "$role" = recv ]; then rp=$!; else sp=$!; fi
  done
}
# reap: waits for both; if one fails, the other gets 10 s to finish before it is stopped.
# Sets rr and sr (the receiver's and the sender's exit status).
reap() {
  local first rc1 other rc2 killer=''
  wait -n -p first "$rp" "$sp"
  rc1=$?
  if [ "$first" = "$rp" ]; then other=$sp; else other=$rp; fi
  if [ "$rc1" != 0 ]; then
    (exec 9>&-; sleep 10; kill "$other" 2> /dev/null) &
    killer=$!
  fi
  wait "$other"
  rc2=$?
  [ -z "$killer" ] || { kill "$killer" 2> /dev/null; wait "$killer" 2> /dev/null; }
  if [ "$first" = "$rp" ]; then rr=$rc1 sr=$rc2; else rr=$rc2 sr=$rc1; fi
}
# slowest_of LABEL DIR -> "NAME MS ms (host X)": the slowest call of a kind either side made,
# from mpib-xfer's last lines. A connection call (handshake, registration, close) that took
# BED_MAX_CALL_MS or more fails the case: NCCL's proxy thread must never wait inside one.
slowest_of() {
  awk -v label=": $1: " 'index($0, label) { n = split(substr($0, index($0, label) + length(label)), f, " ")
         if (f[2] + 0 >= best) { best = f[2] + 0; what = f[1] " " f[2] " ms (" (FILENAME ~ /recv/ ? "host B" : "host A") ")" } }
       END { print (what == "" ? "none" : what) }' "$2/recv.log" "$2/send.log"
}
shaped_ok=yes
verdict() { # verdict NAME DIR PASS-DETAIL
  local slow why
  slow=$(slowest_of "slowest connection call" "$2")
  awk -v ms="$(echo "$slow" | awk '{ print $2 + 0 }')" -v max="$max_call_ms" \
    'BEGIN { exit !(max > 0 && ms >= max) }' || slow=''
  if [ "$rr" = 0 ] && [ "$sr" = 0 ] && [ -z "$slow" ] && [ "$shaped_ok" = yes ]; then
    record PASS "$1" "$3"
  else
    why=$(grep -h -m1 'FAILED' "$2/recv.log" "$2/send.log" | head -n 1)
    [ -z "$slow" ] || why="a call took $slow, over BED_MAX_CALL_MS=$max_call_ms; $why"
    [ "$shaped_ok" = yes ] || why="tc or ip could not shape or cut the rails; $why"
    record FAIL "$1" "receiver rc=$rr, sender rc=$sr (124: timed out, 143: stopped after the peer failed); ${why:-no FAILED line}"
    show_tail "receiver (host B)" "$2/recv.log"
    show_tail "sender (host A)" "$2/send.log"
  fi
  shaped_ok=yes
}

# pair NAME VERSION CASES "EXTRA K=V..." [mpib-xfer ARGS...]
pair() {
  local name=$1 t
  wanted "$name" || return 0
  newcase "$name"
  t=$(now)
  launch "$d" "$tmp" "${@:2}"
  reap
  verdict "$name" "$d" "$(rails_of "$d/recv.log") verified by the receiver, slowest call $(slowest_of "slowest call" "$d"), connection $(slowest_of "slowest connection call" "$d"), $(since "$t") s"
}
# first_case_done DIR: waits (60 s at most) until the sender has passed its first case, or
# either side of the pair launched last has ended.
first_case_done() {
  local i
  for ((i = 0; i < 600; i++)); do
    grep -q ': ok ' "$1/send.log" 2> /dev/null && return 0
    { kill -0 "$rp" && kill -0 "$sp"; } 2> /dev/null || return 0
    sleep 0.1
  done
}
# cut DEV down|drop|up: host A's end of a rail. down: the link (B's end loses its carrier: both
# directions die, like a pulled cable); drop: a token bucket too small for any packet, so every
# packet A sends is dropped while B's still arrive and the carrier stays up (the rig's netem
# loss 100%, without netem); up: both undone, the rail back at its BED_RATE_* shaping.
cut() {
  case $2 in
    down) ip -n "$NA" link set "$1" down ;;
    drop) tc -n "$NA" qdisc replace dev "$1" root tbf rate 8bit burst 16 limit 1 ;;
    up) ip -n "$NA" link set "$1" up && normal_rates ;;
  esac || shaped_ok=no
}
fault_rates() { shape 0 "$fault_rate" || shaped_ok=no; shape 1 "$fault_rate" || shaped_ok=no; }

# fault NAME DEV down|drop CASE "EXTRA" [BYSTANDER]: a v12 pair running ten CASEs at rig scale
# whose rail DEV is cut (see `cut`) once the sender has passed its first case. The sender must
# get the plugin's error naming the cut rail; the receiver too, or, with nothing in flight, its
# run ends at its 6 s data deadline (`bounded`). The rail is restored once the sender has ended,
# so that the receiver can see the sender's sockets close.
# With BYSTANDER, a SOUT-only pair (vanilla inter-island) runs beside it from before the cut (of
# SUP) to after it and must pass byte-exact: the other comms go on.
fault() {
  local name=$1 dev=$2 mode=$3 case=$4 extra=$5 bystander=${6:-} t tcut tsend rail=sup how brr bsr
  local by_r='' by_s='' by_d by_live=no
  wanted "$name" || return 0
  newcase "$name"
  t=$(now)
  fault_rates
  if [ -n "$bystander" ]; then
    by_d=$d/bystander
    mkdir -p "$by_d" "$tmp/by"
    launch "$by_d" "$tmp/by" v12 "$(repeat 12 sizes)" MPIB_ISLAND_PREFIX_LEN=32 --scale rig \
      --expect-class inter
    by_r=$rp by_s=$sp
  fi
  recv_args=(--expect-error bounded --data-timeout 6)
  send_args=(--expect-error plugin --data-timeout 30)
  launch "$d" "$tmp" v12 "$(repeat 10 "$case")" "$extra MPIB_IB_TIMEOUT=14 MPIB_IB_RETRY_CNT=6" \
    --scale rig
  recv_args=() send_args=()
  first_case_done "$d"
  cut "$dev" "$mode"
  tcut=$(now)
  [ -z "$by_s" ] || ! kill -0 "$by_s" 2> /dev/null || by_live=yes
  wait "$sp"; sr=$?
  tsend=$(since "$tcut")
  cut "$dev" up
  wait "$rp"; rr=$?
  [ "$dev" != veth_a0 ] || rail=sout
  how="sender: $(grep -h -o 'returned nccl[A-Za-z]*Error' "$d/send.log" | head -n 1) $tsend s after the cut"
  # The plugin's error names the rail: "... sup rail (veth_a1) ...".
  if grep -q "$rail rail (" "$d/send.log"; then
    how+=", naming the $rail rail"
  else
    how+=", NOT naming the $rail rail"; [ "$sr" != 0 ] || sr=99
  fi
  if [ -n "$bystander" ]; then
    wait "$by_r"; brr=$?
    wait "$by_s"; bsr=$?
    if [ "$brr" = 0 ] && [ "$bsr" = 0 ] && [ "$by_live" = yes ]; then
      how+=", the SOUT-only pair beside it went on ($(rails_of "$by_d/recv.log") verified)"
    else
      how+=", the SOUT-only pair beside it FAILED (rc $brr/$bsr, running at the cut: $by_live)"
      sr=97
      show_tail "bystander receiver" "$by_d/recv.log"
      show_tail "bystander sender" "$by_d/send.log"
    fi
  fi
  how+=", receiver: $(grep -h -o 'returned nccl[A-Za-z]*Error' "$d/recv.log" | head -n 1)"
  grep -q 'reported the failure as expected' "$d/recv.log" || how+="nothing in flight, stopped at its deadline"
  verdict "$name" "$d" "$how; both exited $(since "$tcut") s after the cut, $(since "$t") s in all"
}

# survive NAME DEV down|drop CASE "EXTRA": a v12 pair running ten CASEs at rig scale whose rail
# DEV is cut (see `cut`) once the sender has passed its first case and stays cut until both have
# ended. With failover (docs/PROTOCOL.md §10) every case must pass byte-exact over the other rail
# and both sides must say they failed the cut rail over. Restored afterwards.
survive() {
  local name=$1 dev=$2 mode=$3 case=$4 extra=$5 t tcut rail=sup how
  wanted "$name" || return 0
  newcase "$name"
  t=$(now)
  fault_rates
  # The bytes per rail follow the split only until the failover: the receiver checks every
  # byte, the logs say which rail failed over.
  launch "$d" "$tmp" v12 "$(repeat 10 "$case")" "$extra MPIB_IB_TIMEOUT=14 MPIB_IB_RETRY_CNT=6" \
    --scale rig --data-timeout 30 --no-rail-check
  first_case_done "$d"
  cut "$dev" "$mode"
  tcut=$(now)
  reap
  cut "$dev" up
  [ "$dev" != veth_a0 ] || rail=sout
  how="$(grep -c ': ok ' "$d/recv.log") case(s) verified byte-exact by the receiver, done $(since "$tcut") s after the cut"
  # The plugin's warning: "... sup rail ...; going on over the sout rail alone (failover)".
  if grep -q "$rail rail.*rail alone (failover)" "$d/send.log" \
    && grep -q "$rail rail.*rail alone (failover)" "$d/recv.log"; then
    how+=", both sides failed over from the $rail rail"
  elif grep -q "rail alone (failover)" "$d/send.log" "$d/recv.log"; then
    how+=", failed over NOT from the $rail rail on both sides"; [ "$sr" != 0 ] || sr=98
  else
    how+=", NOT failed over on both sides"; [ "$sr" != 0 ] || sr=98
  fi
  verdict "$name" "$d" "$how, $(since "$t") s in all"
}

# flap NAME DEV SECONDS: an advanced pair at sup_bw=512 (both rails carry data) with the default
# MPIB_IB_TIMEOUT and MPIB_IB_RETRY_CNT (a 34 s TCP user timeout) whose link DEV is down for
# SECONDS once the sender has passed its first case. Every byte must still arrive and no call
# may fail: the link-down event fails the rail over (the tcp fabric's port is its interface's
# link: src/fabric/tcp/link_state.rs), where TCP's retransmits would only have stalled it; the
# control connection (SOUT) only stalls. The bytes per rail follow the split only until then.
flap() {
  local name=$1 dev=$2 seconds=$3 tcut how
  wanted "$name" || return 0
  newcase "$name"
  fault_rates
  launch "$d" "$tmp" v12 "$(repeat 8 split-512)" "MPIB_MODE=1 MPIB_ISLAND_PREFIX_LEN=24" \
    --scale rig --expect-class intra --data-timeout 40 --no-rail-check
  first_case_done "$d"
  cut "$dev" down
  tcut=$(now)
  sleep "$seconds"
  cut "$dev" up
  reap
  how="$(grep -c ': ok ' "$d/recv.log") case(s) verified byte-exact by the receiver after a ${seconds} s flap"
  if grep -q 'reported PortDown; going on over' "$d/send.log"; then
    how+=", failed over at the link-down event"
  fi
  verdict "$name" "$d" "$how, done $(since "$tcut") s after it began"
}

# failback NAME DEV MODE: an advanced pair at sup_bw=512 (both rails carry data) whose rail DEV is
# cut (see `cut`: down, or drop with no port event) for 1 s once the sender has passed its first
# case, then restored while the cases go on. Every byte must arrive; both sides must fail the
# rail over and then bring it back (docs/PROTOCOL.md §11), each logging the return: the sender
# once a write on each new queue pair was acknowledged, the receiver at the first IMM on the
# rail (so the sender split over it again). 120 cases (about 7 s here) outlast the cut, the
# hold-down and the return. Reports how long after the rail was restored the sender had it back.
failback() {
  local name=$1 dev=$2 mode=$3 tup back='' i how rail=sup
  wanted "$name" || return 0
  newcase "$name"
  fault_rates
  launch "$d" "$tmp" v12 "$(repeat 120 split-512)" \
    "MPIB_MODE=1 MPIB_ISLAND_PREFIX_LEN=24 MPIB_IB_TIMEOUT=14 MPIB_IB_RETRY_CNT=6 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=NET" \
    --scale rig --expect-class intra --data-timeout 40 --no-rail-check
  first_case_done "$d"
  cut "$dev" "$mode"
  sleep 1
  cut "$dev" up
  tup=$(now)
  [ "$dev" != veth_a0 ] || rail=sout
  for ((i = 0; i < 300; i++)); do
    grep -q "the $rail rail is back" "$d/send.log" 2> /dev/null && { back=$(since "$tup"); break; }
    { kill -0 "$rp" && kill -0 "$sp"; } 2> /dev/null || break
    sleep 0.02
  done
  reap
  how="$(grep -c ': ok ' "$d/recv.log") case(s) verified byte-exact by the receiver"
  if ! grep -q "$rail rail.*rail alone (failover)" "$d/send.log" "$d/recv.log"; then
    how+=", NOT failed over"; [ "$sr" != 0 ] || sr=98
  fi
  if grep -q "the $rail rail is back" "$d/send.log" && grep -q "the $rail rail is back" "$d/recv.log"; then
    how+=", both sides brought the $rail rail back and split over it again (the sender ${back:-?} s after it was restored)"
  else
    how+=", the $rail rail NOT back on both sides"; [ "$sr" != 0 ] || sr=98
  fi
  verdict "$name" "$d" "$how"
}

# stranger NAME: an advanced pair at sup_bw=512 running 60 cases while a third host (build_stranger:
# linked to host B alone) hammers every port host B's receiver listens on, both rails' and the
# control listener's, for 4 s (scripts/bed/stranger.py: silent connections past what a rail
# keeps, port scans, junk, hellos with guessed QP numbers and secrets). Every case must pass
# byte-exact with its split, no call may wait, and the receiver must say it dropped them in a
# few WARNs with their counts, not one per connection (issue 34).
stranger() {
  local name=$1 ports warns how
  wanted "$name" || return 0
  newcase "$name"
  if ! build_stranger 2> "$d/stranger.err"; then
    record FAIL "$name" "cannot build the third host: $(tr '\n' ' ' < "$d/stranger.err")"
    return
  fi
  fault_rates
  launch "$d" "$tmp" v12 "$(repeat 60 split-512)" "MPIB_MODE=1 MPIB_ISLAND_PREFIX_LEN=24" \
    --scale rig --expect-class intra --data-timeout 40
  first_case_done "$d"
  ports=$(ip netns exec "$NB" ss -Htln | awk '{ print $4 }' | grep -E '^10\.100\.[01]\.2:')
  # shellcheck disable=SC2086  # a list of ADDRESS:PORT words
  ip netns exec "$NC" timeout 30 python3 "$here/stranger.py" 4 $ports > "$d/stranger.log" 2>&1
  local stranger_rc=$? during=no
  # The pair must still run when the stranger stops: everything it did landed mid-run.
  { kill -0 "$rp" && kill -0 "$sp"; } 2> /dev/null && during=yes
  reap
  warns=$(grep -c 'dropped a connection' "$d/recv.log")
  how="$(grep -c ': ok ' "$d/recv.log") case(s) verified byte-exact by the receiver; $(tail -n 1 "$d/stranger.log"); $warns throttled WARN(s)"
  [ "$stranger_rc" = 0 ] || { how+=", the stranger failed (rc $stranger_rc)"; [ "$sr" != 0 ] || sr=97; }
  [ "$during" = yes ] || { how+=", the pair ended before the stranger did"; [ "$sr" != 0 ] || sr=95; }
  if [ "$warns" -lt 1 ] || [ "$warns" -gt 6 ]; then
    how+=", expected 1 to 6 WARNs about dropped connections"; [ "$sr" != 0 ] || sr=96
  fi
  verdict "$name" "$d" "$how"
}

# ring NAME RANKS DEV: a ring all-reduce over RANKS rank processes (mpib-ranks), even ranks on
# host A and odd ones on host B so that every connection crosses between the hosts, 2 channels,
# vanilla intra-island (every byte on SUP), sizes 4 B to 8 MiB, each result checked on every
# rank. With DEV, 20 all-reduces of 4 MiB whose rail DEV goes down 3 s in and stays down: they
# must still end exact on every rank (failover), and the ranks' logs say they failed it over.
ring() {
  local name=$1 ranks=$2 dev=${3:-} rank ns host pids=() rc=0 how
  local sizes=(--min-size 4 --max-size 8M --step-factor 8 --iters 3)
  [ -z "$dev" ] || sizes=(--min-size 4M --max-size 4M --iters 20)
  wanted "$name" || return 0
  newcase "$name"
  mkdir -p "$tmp/ring"
  fault_rates
  for ((rank = 0; rank < ranks; rank++)); do
    if ((rank % 2 == 0)); then ns=$NA host=("${A[@]}"); else ns=$NB host=("${B[@]}"); fi
    # shellcheck disable=SC2086  # $every_case is a list of K=V words
    ip netns exec "$ns" env "${host[@]}" $every_case MPIB_ISLAND_PREFIX_LEN=24 MPIB_IB_TIMEOUT=14 \
      MPIB_IB_RETRY_CNT=6 timeout -k 5 "$pair_timeout" "$bin/mpib-ranks" --plugin "$plugin" \
      --ranks "$ranks" --rank "$rank" --rendezvous "$tmp/ring" --channels 2 "${sizes[@]}" \
      --timeout 40 > "$d/rank$rank.log" 2>&1 9>&- &
    pids+=($!)
  done
  if [ -n "$dev" ]; then
    # The ring is up within a second (every handle written, then connect and accept); the cut
    # lands a few all-reduces into the 20 of 4 MiB (about 10 s at the fault rates).
    sleep 3
    cut "$dev" down
  fi
  for rank in "${!pids[@]}"; do wait "${pids[$rank]}" || rc=$((rc + 1)); done
  [ -z "$dev" ] || cut "$dev" up
  how="$(grep -l 'PASS' "$d"/rank*.log 2> /dev/null | wc -l) of $ranks rank(s) exact on every size"
  how+=", largest: $(awk '$3 == "uint32" { line = $1 " B " $6 " GB/s algbw, " $7 " GB/s busbw" } END { print line }' "$d/rank0.log")"
  if [ -n "$dev" ]; then
    local over
    over=$(grep -l 'rail alone (failover)' "$d"/rank*.log 2> /dev/null | wc -l)
    how+=", $over rank(s) failed the cut rail over"
    [ "$over" -gt 0 ] || rc=$((rc + 1))
  fi
  # verdict's pair variables: every rank's status folded into the two it reads.
  rr=$rc sr=0
  cp "$d/rank0.log" "$d/recv.log"; cp "$d/rank1.log" "$d/send.log"
  verdict "$name" "$d" "$how"
}

# killed NAME ROLE: SIGKILL the ROLE process (recv: host B, send: host A) of an advanced pair at
# sup_bw=512 with the default timeout once the sender has passed its first case. The survivor's
# calls must return the plugin's error (its sockets closed by the kernel, or the peer's control
# connection closed) well before its 20 s data deadline: no hang.
killed() {
  local name=$1 role=$2 dev=${3:-} t tkill victim survivor=recv xpid alive=no victim_rc how i
  local extra="MPIB_MODE=1 MPIB_ISLAND_PREFIX_LEN=24"
  wanted "$name" || return 0
  newcase "$name"
  t=$(now)
  fault_rates
  if [ "$role" = recv ]; then survivor=send send_args=(--expect-error plugin --data-timeout 20)
  else recv_args=(--expect-error plugin --data-timeout 20); fi
  [ -z "$dev" ] || extra+=" MPIB_IB_TIMEOUT=14 MPIB_IB_RETRY_CNT=6"
  launch "$d" "$tmp" v12 "$(repeat 12 split-512)" "$extra" --scale rig --no-rail-check
  recv_args=() send_args=()
  first_case_done "$d"
  if [ -n "$dev" ]; then
    # The control connection's rail goes first: once the survivor has failed over, only its
    # probes on the other rail can tell that the peer died.
    cut "$dev" down
    for ((i = 0; i < 100; i++)); do
      grep -q '(failover)' "$d/$survivor.log" && break
      sleep 0.1
    done
  fi
  if [ "$role" = recv ]; then victim=$rp; else victim=$sp; fi
  # Kill mpib-xfer itself, not its `timeout`; it must still be running (a side that ended on its
  # own proves nothing).
  xpid=$(pgrep -P "$victim" mpib-xfer) && kill -0 "$xpid" 2> /dev/null && alive=yes
  # (Without stderr: bash's "Killed" notice of the victim's job, which is expected.)
  { [ "$alive" = no ] || kill -KILL "$xpid"; tkill=$(now); reap; } 2> /dev/null
  [ -z "$dev" ] || cut "$dev" up
  normal_rates
  how="$survivor: $(grep -h -o 'returned nccl[A-Za-z]*Error' "$d/$survivor.log" | head -n 1)"
  if grep -q 'control connection' "$d/$survivor.log"; then how+=" (the peer's control connection closed)"; fi
  # The victim must have died of the kill (137: `timeout` passes SIGKILL on); then only the
  # survivor's status is judged.
  if [ "$role" = recv ]; then victim_rc=$rr rr=0; else victim_rc=$sr sr=0; fi
  if [ "$alive" != yes ] || [ "$victim_rc" != 137 ]; then
    how+="; the $role process was not killed mid-run (running: $alive, status $victim_rc)"
    if [ "$role" = recv ]; then rr=96; else sr=96; fi   # it proves nothing: a failure
  fi
  verdict "$name" "$d" "$how; it exited $(since "$tkill") s after the kill, $(since "$t") s in all"
}

# preflight: host B's side alone must load the plugin, initialise MPIB_FABRIC=tcp on its veths
# and listen (mpib-xfer describes the net only then); if not, every case would fail the same way.
preflight() {
  local name="preflight: MPIB_FABRIC=tcp initialises and listens on host B"
  newcase preflight
  ip netns exec "$NB" env "${B[@]}" timeout -k 5 30 "$bin/mpib-xfer" --role recv \
    --handle-file "$tmp/handle" --plugin "$plugin" --connect-timeout 0.5 > "$d/recv.log" 2>&1 9>&-
  if grep -q 'MPIB_FABRIC=tcp MPIB_HCA_SOUT=veth_b0' "$d/recv.log"; then
    record PASS "$name" "$(grep -o 'device "[^)]*' "$d/recv.log" | head -n 1)"
  else
    record FAIL "$name" "$(grep -m1 'FAILED' "$d/recv.log")"
    show_tail "receiver (host B)" "$d/recv.log"
    finish
  fi
}

echo "bed: $NA (host A, sender) and $NB (host B, receiver); rails SOUT ${BED_RATE_SOUT:-unshaped}, SUP ${BED_RATE_SUP:-unshaped}; scale $scale; $(nproc) CPU(s), kernel $(uname -r)"
preflight
vanilla=sizes,larger,grouped,outstanding,pipeline
full=" ${BED_FULL_VERSIONS:-v12 v8} "
for v in v12 v11 v10 v9 v8 v7; do
  pair "$v vanilla intra-island" "$v" "$vanilla" MPIB_ISLAND_PREFIX_LEN=24 --expect-class intra
  if [[ $full != *" $v "* ]]; then
    pair "$v advanced sup_bw=512" "$v" split-512 "MPIB_MODE=1 MPIB_ISLAND_PREFIX_LEN=24" \
      --expect-class intra
    continue
  fi
  pair "$v vanilla inter-island" "$v" "$vanilla" MPIB_ISLAND_PREFIX_LEN=32 --expect-class inter
  for bw in 0 256 512 1024; do
    pair "$v advanced sup_bw=$bw" "$v" "split-$bw" "MPIB_MODE=1 MPIB_ISLAND_PREFIX_LEN=24" \
      --expect-class intra
  done
  pair "$v grouped receives (advanced, sup_bw=512)" "$v" "grouped@512,outstanding@512" \
    "MPIB_MODE=1 MPIB_ISLAND_PREFIX_LEN=24" --expect-class intra
done
survive "v12 failover: SUP link down mid-run, vanilla intra-island (veth_a1)" veth_a1 down sizes \
  MPIB_ISLAND_PREFIX_LEN=24
survive "v12 failover: SUP link down mid-run, advanced sup_bw=512 (veth_a1)" veth_a1 down \
  split-512 "MPIB_MODE=1 MPIB_ISLAND_PREFIX_LEN=24"
survive "v12 failover: SOUT link down mid-run, advanced sup_bw=512, control connection on it (veth_a0)" \
  veth_a0 down split-512 "MPIB_MODE=1 MPIB_ISLAND_PREFIX_LEN=24"
survive "v12 failover: SUP cut one way mid-run (A's packets dropped), advanced sup_bw=512 (veth_a1)" \
  veth_a1 drop split-512 "MPIB_MODE=1 MPIB_ISLAND_PREFIX_LEN=24"
fault "v12 fault: SUP link down mid-run, MPIB_FAILOVER=0, vanilla intra-island (veth_a1), a SOUT-only pair beside it" \
  veth_a1 down sizes "MPIB_ISLAND_PREFIX_LEN=24 MPIB_FAILOVER=0" 1
fault "v12 fault: SOUT link down mid-run, MPIB_FAILOVER=0, advanced sup_bw=512 (veth_a0)" \
  veth_a0 down split-512 "MPIB_MODE=1 MPIB_ISLAND_PREFIX_LEN=24 MPIB_FAILOVER=0"
fault "v12 fault: SOUT link down mid-run, vanilla inter-island: no rail survives (veth_a0)" veth_a0 \
  down sizes MPIB_ISLAND_PREFIX_LEN=32
fault "v12 fault: SOUT cut one way mid-run (A's packets dropped), vanilla inter-island (veth_a0)" \
  veth_a0 drop sizes MPIB_ISLAND_PREFIX_LEN=32
flap "v12 flap: SUP link down 2.5 s, default retries (veth_a1)" veth_a1 2.5
flap "v12 flap: SOUT link down 2.5 s, default retries (veth_a0)" veth_a0 2.5
failback "v12 failback: SUP link down 1 s, back while cases go on (veth_a1)" veth_a1 down
failback "v12 failback: SOUT link down 1 s, control connection on it (veth_a0)" veth_a0 down
failback "v12 failback: SUP packets dropped 1 s, no port event (veth_a1)" veth_a1 drop
ring "v12 ring all-reduce: 4 ranks, 2 per host, 2 channels" 4
ring "v12 ring all-reduce: 4 ranks, SUP link down mid-collective (veth_a1)" 4 veth_a1
stranger "v12 stranger: a third host scans, floods and forges hellos at the receiver's ports mid-run"
killed "v12 killed: receiver process SIGKILLed mid-run" recv
killed "v12 killed after failover: SOUT link down (the control connection's), then the sender SIGKILLed" \
  send veth_a0
killed "v12 killed after failover: SOUT link down (the control connection's), then the receiver SIGKILLed" \
  recv veth_a0
killed "v12 killed: sender process SIGKILLed mid-run" send
finish
