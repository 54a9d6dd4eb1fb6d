#!/usr/bin/env bash
# scripts/rig/suite.sh: the cross-process verbs suite on two real Soft-RoCE rails.
#
# Builds on the host (`cargo build --release -p mpib -p mpib-driver -p mpib-collector`, plus the
# verbs device test binaries in the debug profile), then boots the rxe rig ONCE (scripts/rxe-vm/run.sh) and runs
# inside it, for the ncclNetPlugin_v12 and _v8 tables, a receiver process with host B's rails
# (rxe_b0 + rxe_b1, 10.100.0.2) and a sender process with host A's (rxe_a0 + rxe_a1, 10.100.0.1)
# in parallel (target/release/mpib-xfer), walking the shared conformance cases
# (driver/src/cases.rs, scaled to the rig) byte-exact:
#   vanilla intra-island   sizes, larger receives, grouped n=1..8, 256 in flight, pipeline: all SUP
#   vanilla inter-island   the same with MPIB_ISLAND_PREFIX_LEN=32: no SUP QPs, all SOUT
#   advanced sup_bw=N      N = 0, 256, 512, 1024 through the test agent: both rails, split checked
#   grouped receives       grouped n=1..8 and 256 in flight at sup_bw 512 (both rails)
#   fault                  a rail's wire cut mid-run (SUP, SOUT; vanilla, advanced): the sender's
#                          error names the rail, the collector shows the error completions
#   flap                   a rail's wire down 2.5 s with the default retries: every byte arrives
#   killed                 one side SIGKILLed mid-run: the survivor's calls return an error
#   impaired               1 % loss, 1 % corruption, 10 ms delay on either rail: every byte arrives
#   devices                two NIC pairs per host (rxe_a2 + rxe_a3 beside the first two): device 1,
#                          then device 0, each seen only in its own NICs' hardware packet counters
#   ranks                  mpib-ranks: ring all-reduce and all-to-all over 4 rank processes, 2 per
#                          host, every result checked on every rank
# plus the verbs device tests (tests/verbs_device.rs, `fabric::verbs` lib tests marked ignored)
# and the main job, `mpib-demo --fabric verbs`. Each side checks the bytes per rail from its probes
# file against the split rule, so SRQ receives and WRITE_WITH_IMM really happen on both rails.
#
# Prints `PASS name: ...` / `FAIL name: why` per case and `rig: N passed, M failed ...`; exits
# non-zero if anything failed, including a rig that cannot boot (no qemu, no packages): it never
# passes silently. Logs of the last run: target/rig/last/.
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
  W=$RIG_WORK
  bin=target/release
  results=$W/results
  : > "$results"
  only=${RIG_ONLY:-}
  pair_timeout=${RIG_PAIR_TIMEOUT:-240}
  # Every case gets exactly its own MPIB_* settings, whatever the caller had exported.
  for v in $(compgen -e); do
    case $v in MPIB_*) unset "$v" ;; esac
  done
  # retry_cnt 6: rxe treats 7 as "retry forever", so a broken wire would hang instead of failing.
  # Probes on, in the guest's RAM: every process checks its bytes per rail.
  export MPIB_FABRIC=verbs MPIB_IB_RETRY_CNT=6 MPIB_PROBES=1 MPIB_PROBES_DIR=/tmp/rig/probes
  mkdir -p /tmp/rig/probes
  A=(MPIB_HCA_SOUT=rxe_a0 MPIB_HCA_SUP=rxe_a1 MPIB_OOB_ADDR=10.100.0.1)
  B=(MPIB_HCA_SOUT=rxe_b0 MPIB_HCA_SUP=rxe_b1 MPIB_OOB_ADDR=10.100.0.2)

  record() { # record PASS|FAIL NAME DETAIL
    echo "$1 $2${3:+: $3}"
    echo "$1 $2${3:+: $3}" >> "$results"
  }
  wanted() { [ -z "$only" ] || [[ $1 =~ $only ]]; }
  slug() { echo "$1" | tr -c 'a-zA-Z0-9=_.-' '_' | sed 's/_*$//'; }
  show_tail() { # show_tail LABEL FILE
    echo "  --- $1 (last 15 lines of $2)"
    tail -n 15 "$2" 2>/dev/null | sed 's/^/  | /'
  }
  # The bytes per rail that a side's `ok` lines report, summed: "SOUT x B, SUP y B".
  rails_of() {
    awk '/: ok / && /rails SOUT/ {
           for (i = 1; i <= NF; i++) { if ($i == "SOUT") s += $(i + 1); if ($i == "SUP") u += $(i + 1) }
           n++ }
         END { if (n) printf "%d case(s), rails SOUT %d B / SUP %d B", n, s, u; else printf "no case" }' "$1"
  }

  # launch DIR TMP VERSION CASES "EXTRA K=V..." [mpib-xfer ARGS...]: starts the receiver (host B)
  # and the sender (host A) in the background; sets rp and sp. The arrays recv_args and send_args
  # add arguments for one role.
  recv_args=() send_args=()
  launch() {
    local d=$1 tmp=$2 version=$3 cases=$4 extra=$5 role
    shift 5
    # Every case starts with empty neighbour tables, like the first connection of a boot: the
    # handshake must resolve the peers' MACs across calls, never inside ibv_modify_qp, whose
    # ARP wait would take about a second (the slowest-call check below catches it).
    ip neigh flush all
    for role in recv send; do
      local host=("${B[@]}") more=("${recv_args[@]}")
      [ $role = recv ] || host=("${A[@]}") more=("${send_args[@]}")
      # shellcheck disable=SC2086  # $extra is a list of K=V words
      env "${host[@]}" $extra MPIB_AGENT_SOCKET="$tmp/agent.sock" MPIB_HINT_PATH="$tmp/hints" \
        timeout -k 5 "$pair_timeout" "$bin/mpib-xfer" --role $role --version "$version" \
        --handle-file "$tmp/handle" --cases "$cases" --plugin "$bin/libnccl-net-mpib.so" "$@" \
        "${more[@]}" > "$d/$role.log" 2>&1 &
      if [ $role = recv ]; then rp=$!; else sp=$!; fi
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
      (sleep 10; kill "$other" 2>/dev/null) &
      killer=$!
    fi
    wait "$other"
    rc2=$?
    [ -z "$killer" ] || { kill "$killer" 2>/dev/null; wait "$killer" 2>/dev/null; }
    if [ "$first" = "$rp" ]; then rr=$rc1 sr=$rc2; else rr=$rc2 sr=$rc1; fi
  }
  # slowest_call DIR: the slowest exported call either side made, the slowest connection call
  # (handshakes, registrations, closes) and the slowest data call (isend, irecv, test), from
  # mpib-xfer's last lines ("slowest call init 242.7 ms (host B), connection accept 41.2 ms
  # (host B), data isend 61.0 ms (host A)"). `verdict` fails a case whose slowest connection call
  # took RIG_MAX_CALL_MS or more: 500 ms by default, far above what the emulated CPUs make of a
  # call that does not wait (15-174 ms over one run; RELIABILITY.md) and far below the ~1 s of a
  # call that waits for ARP inside ibv_modify_qp. `init` runs once per process before NCCL's
  # proxy thread exists and cannot be resumed; the data calls include the work rxe does inside
  # ibv_post_send, the NIC's on real hardware: both are reported, not judged.
  max_call_ms=${RIG_MAX_CALL_MS:-500}
  slowest_of() { # slowest_of LABEL DIR -> "NAME MS ms (host X)"
    awk -v label=": $1: " 'index($0, label) { n = split(substr($0, index($0, label) + length(label)), f, " ")
           if (f[2] + 0 >= best) { best = f[2] + 0; what = f[1] " " f[2] " ms (" (FILENAME ~ /recv/ ? "host B" : "host A") ")" } }
         END { print (what == "" ? "none" : what) }' "$2/recv.log" "$2/send.log"
  }
  slowest_call() {
    echo "slowest call $(slowest_of "slowest call" "$1"), connection $(slowest_of "slowest connection call" "$1"), data $(slowest_of "slowest data call" "$1")"
  }
  # over_limit DIR: prints the slowest connection call when it took RIG_MAX_CALL_MS or more.
  over_limit() {
    local what ms
    what=$(slowest_of "slowest connection call" "$1")
    ms=$(echo "$what" | awk '{ print $2 + 0 }')
    awk -v ms="$ms" -v max="$max_call_ms" 'BEGIN { exit !(ms >= max) }' && echo "$what"
  }
  verdict() { # verdict NAME DIR PASS-DETAIL
    local slow
    slow=$(over_limit "$2")
    if [ "$rr" = 0 ] && [ "$sr" = 0 ] && [ -z "$slow" ] && [ "$impaired_ok" = yes ]; then
      record PASS "$1" "$3"
    else
      local why
      why=$(grep -h -m1 'FAILED' "$2/recv.log" "$2/send.log" | head -n 1)
      [ -z "$slow" ] || why="a call took $slow, over RIG_MAX_CALL_MS=$max_call_ms; $why"
      [ "$impaired_ok" = yes ] || why="tc could not impair the wire, so nothing was tested; $why"
      record FAIL "$1" "receiver rc=$rr, sender rc=$sr (124: timed out, 143: stopped after the peer failed); ${why:-no FAILED line}"
      show_tail "receiver (host B)" "$2/recv.log"
      show_tail "sender (host A)" "$2/send.log"
    fi
    impaired_ok=yes   # for the next case
  }

  # pair NAME VERSION CASES "EXTRA K=V..." [mpib-xfer ARGS...]
  pair() {
    local name=$1 s d tmp t
    wanted "$name" || return 0
    s=$(slug "$name")
    d=$W/$s tmp=/tmp/rig/$s
    mkdir -p "$d" "$tmp"
    t=$(now)
    launch "$d" "$tmp" "${@:2}"
    reap
    verdict "$name" "$d" "$(rails_of "$d/recv.log") verified by the receiver, $(slowest_call "$d"), $(since "$t") s"
  }

  # first_case_done DIR: waits (120 s at most) until the sender has passed its first case, or
  # either side of the pair launched last has ended.
  first_case_done() {
    local i
    for ((i = 0; i < 600; i++)); do
      grep -q ': ok ' "$1/send.log" 2>/dev/null && return 0
      { kill -0 "$rp" && kill -0 "$sp"; } 2>/dev/null || return 0
      sleep 0.2
    done
  }

  # fault NAME VERSION DEV [CASE EXTRA]: a pair (by default vanilla intra-island, all SUP; else
  # ten CASEs with the K=V words EXTRA) whose wire DEV (host A's end, so A->B packets are lost)
  # drops every packet once the sender has passed its first case.
  # The sender must get the error from the plugin (ncclRemoteError / ncclSystemError); the
  # receiver too, or, when it had nothing in flight on the wire (an RC QP cannot see an error
  # then), its requests simply never complete and the run ends at its 20 s data deadline. Nothing
  # may hang. MPIB_IB_TIMEOUT=14 with retry_cnt 6: the error comes about 0.5 s after the cut.
  # With BYSTANDER=1, a second pair runs beside it on the SOUT rail only (vanilla inter-island)
  # from before the cut (of SUP) to after it, and must pass byte-exact: other comms go on.
  fault() {
    local name=$1 version=$2 dev=$3 case=${4:-sizes} extra=${5:-MPIB_ISLAND_PREFIX_LEN=24} s d tmp t tcut
    local bystander=${6:-} by_r='' by_s='' by_d by_live=no
    wanted "$name" || return 0
    s=$(slug "$name")
    d=$W/$s tmp=/tmp/rig/$s
    mkdir -p "$d" "$tmp"
    t=$(now)
    if [ -n "$bystander" ]; then
      by_d=$d/bystander
      mkdir -p "$by_d" "$tmp/bystander"
      launch "$by_d" "$tmp/bystander" "$version" "$(printf 'sizes,%.0s' $(seq 30) | sed 's/,$//')" \
        "MPIB_ISLAND_PREFIX_LEN=32" --expect-class inter
      by_r=$rp by_s=$sp
    fi
    recv_args=(--expect-error bounded --data-timeout 20)
    send_args=(--expect-error plugin --data-timeout 60 --linger 4)
    launch "$d" "$tmp" "$version" "$(printf '%s,' "$case" "$case" "$case" "$case" "$case" \
      "$case" "$case" "$case" "$case" "$case" | sed 's/,$//')" "$extra MPIB_IB_TIMEOUT=14"
    recv_args=() send_args=()
    first_case_done "$d"
    impair "$dev" loss 100%
    tcut=$(now)
    [ -z "$by_s" ] || ! kill -0 "$by_s" 2>/dev/null || by_live=yes
    local how rail=sup seen=''
    [ "$dev" != veth_a0 ] || rail=sout
    # The collector, as an operator runs it, must show the cut while it happens: the sender's
    # error completions on the cut rail (the series the MpibErrorCompletions alert watches).
    # The sender lingers 4 s after its error so that a pass can read its probes file.
    # Only the sender's own series count (the receiver's, or a file an earlier case left, would not).
    local xpid
    xpid=$(pgrep -P "$sp" mpib-xfer || echo none)
    while [ -z "$seen" ] && kill -0 "$sp" 2>/dev/null; do
      seen=$("$bin/mpib-collector" --probes-dir /tmp/rig/probes --once 2>/dev/null |
        awk -v rail="rail=\"$rail\"" -v pid="pid=\"$xpid\"" '/^mpib_rail_error_completions_total\{/ && index($0, rail) && index($0, pid) && $NF + 0 > 0 { print $NF; exit }')
      [ -n "$seen" ] || sleep 0.3
    done
    reap
    tc qdisc del dev "$dev" root 2>/dev/null
    how="sender: $(grep -h -o 'returned nccl[A-Za-z]*Error' "$d/send.log" | head -n 1)"
    # The error must name the rail that was cut (the plugin's message: "sup rail (rxe_a1) QP ...").
    if grep -q "$rail rail (" "$d/send.log"; then
      how+=" naming the $rail rail"
    else
      how+=" NOT naming the $rail rail"; sr=99
    fi
    if [ -n "$seen" ]; then
      how+=", the collector showed $seen error completion(s) on the $rail rail"
    else
      how+=", the collector NEVER showed an error completion on the $rail rail"; sr=98
    fi
    if [ -n "$bystander" ]; then
      wait "$by_r"; local brr=$?
      wait "$by_s"; local bsr=$?
      if [ "$brr" = 0 ] && [ "$bsr" = 0 ] && [ "$by_live" = yes ]; then
        how+=", the SOUT-only pair beside it went on ($(rails_of "$by_d/recv.log") verified)"
      else
        how+=", the SOUT-only pair beside it FAILED (rc $brr/$bsr, running at the cut: $by_live)"
        sr=97
        show_tail "bystander receiver" "$by_d/recv.log"
        show_tail "bystander sender" "$by_d/send.log"
      fi
    fi
    if grep -q 'reported the failure as expected' "$d/recv.log"; then
      how+=", receiver: $(grep -h -o 'returned nccl[A-Za-z]*Error' "$d/recv.log" | head -n 1)"
    else
      how+=", receiver: nothing in flight, stopped at its deadline"
    fi
    verdict "$name" "$d" "$how; both exited $(since "$tcut") s after the cut, $(since "$t") s in all"
  }

  # survive NAME DEV CASE EXTRA: a v12 pair running ten CASEs (K=V words EXTRA) whose wire DEV
  # (host A's end) drops every packet once the sender has passed its first case, until both have
  # ended. With failover (docs/PROTOCOL.md §10) every case must pass byte-exact over the other
  # rail, and both sides must say they failed the cut rail over. The bytes per rail follow the
  # split only until then, so they are not checked against it.
  survive() {
    local name=$1 dev=$2 case=$3 extra=$4 s d tmp t tcut how rail=sup
    wanted "$name" || return 0
    s=$(slug "$name")
    d=$W/$s tmp=/tmp/rig/$s
    mkdir -p "$d" "$tmp"
    t=$(now)
    launch "$d" "$tmp" v12 "$(printf "$case,%.0s" $(seq 10) | sed 's/,$//')" \
      "$extra MPIB_IB_TIMEOUT=14" --data-timeout 60 --no-rail-check
    first_case_done "$d"
    impair "$dev" loss 100%
    tcut=$(now)
    reap
    tc qdisc del dev "$dev" root 2>/dev/null
    [ "$dev" != veth_a0 ] || rail=sout
    how="$(grep -c ': ok ' "$d/recv.log") case(s) verified byte-exact by the receiver, done $(since "$tcut") s after the cut"
    # The plugin's warning: "... sup rail ...; going on over the sout rail alone (failover)".
    if grep -q "$rail rail.*rail alone (failover)" "$d/send.log" &&
      grep -q "$rail rail.*rail alone (failover)" "$d/recv.log"; then
      how+=", both sides failed over from the $rail rail"
    else
      how+=", NOT failed over from the $rail rail on both sides"; [ "$sr" != 0 ] || sr=98
    fi
    verdict "$name" "$d" "$how, $(since "$t") s in all"
  }

  # failback NAME DEV: an advanced pair at sup_bw=512 running 30 cases whose wire DEV drops every
  # packet for 1 s once the sender has passed its first case (no port event: the QPs' retries
  # find it), then carries them again while the cases go on. Every case must pass byte-exact,
  # both sides must fail the rail over and then bring it back (docs/PROTOCOL.md §11), each
  # logging the return: the sender once a write on each new QP was acknowledged, the receiver at
  # the first IMM on the rail, so the sender split over it again.
  failback() {
    local name=$1 dev=$2 s d tmp tcut how rail=sup
    wanted "$name" || return 0
    s=$(slug "$name")
    d=$W/$s tmp=/tmp/rig/$s
    mkdir -p "$d" "$tmp"
    launch "$d" "$tmp" v12 "$(printf "split-512,%.0s" $(seq 30) | sed 's/,$//')" \
      "MPIB_MODE=1 MPIB_ISLAND_PREFIX_LEN=24 MPIB_IB_TIMEOUT=14 MPIB_IB_RETRY_CNT=6 NCCL_DEBUG=INFO" \
      --data-timeout 60 \
      --no-rail-check
    first_case_done "$d"
    impair "$dev" loss 100%
    tcut=$(now)
    sleep 1
    tc qdisc del dev "$dev" root 2>/dev/null
    reap
    [ "$dev" != veth_a0 ] || rail=sout
    how="$(grep -c ': ok ' "$d/recv.log") case(s) verified byte-exact by the receiver, done $(since "$tcut") s after the cut"
    if grep -q "$rail rail.*rail alone (failover)" "$d/send.log" "$d/recv.log"; then
      how+=", failed over from the $rail rail"
    else
      how+=", NOT failed over from the $rail rail"; [ "$sr" != 0 ] || sr=98
    fi
    if grep -q "the $rail rail is back" "$d/send.log" && grep -q "the $rail rail is back" "$d/recv.log"; then
      how+=", both sides brought it back and split over it again"
    else
      how+=", NOT back on both sides"; [ "$sr" != 0 ] || sr=98
    fi
    verdict "$name" "$d" "$how"
  }

  # flap NAME DEV SECONDS: an advanced pair at sup_bw=512 (both rails carry data) with the
  # plugin's default retry count and timeout (MPIB_IB_RETRY_CNT and MPIB_IB_TIMEOUT unset: 7
  # retries of 4.3 s on hardware; rxe treats 7 as "retry forever") whose wire DEV drops every
  # packet for SECONDS once the sender has passed its first case. Every byte must still arrive
  # and no call may fail: the QPs retransmit after the flap, and the control connection (on
  # the SOUT wire) only stalls.
  flap() {
    local name=$1 dev=$2 seconds=$3 s d tmp tcut before
    wanted "$name" || return 0
    s=$(slug "$name")
    d=$W/$s tmp=/tmp/rig/$s
    mkdir -p "$d" "$tmp"
    before=$(nic_counters)
    unset MPIB_IB_RETRY_CNT   # the processes started by `launch` inherit the default
    launch "$d" "$tmp" v12 "split-512,split-512,split-512,split-512,split-512,split-512" \
      "MPIB_MODE=1 MPIB_ISLAND_PREFIX_LEN=24" --expect-class intra --data-timeout 60
    export MPIB_IB_RETRY_CNT=6
    first_case_done "$d"
    impair "$dev" loss 100%
    tcut=$(now)
    sleep "$seconds"
    tc qdisc del dev "$dev" root 2>/dev/null
    reap
    verdict "$name" "$d" "$(rails_of "$d/recv.log") verified by the receiver after a ${seconds} s flap; NIC counters: $(counter_delta "$before" "$(nic_counters)"), done $(since "$tcut") s after the flap began"
  }

  # The NICs' packet counters, `rxe_a0=N` per line (sent + received RoCE packets; the control
  # connection's TCP is not counted there).
  nic_packets() {
    local dir dev sent rcvd
    for dir in /sys/class/infiniband/rxe_*; do
      dev=${dir##*/}
      read -r sent < "$dir/ports/1/hw_counters/sent_pkts" || sent=0
      read -r rcvd < "$dir/ports/1/hw_counters/rcvd_pkts" || rcvd=0
      echo "$dev=$((sent + rcvd))"
    done
  }
  # packets_moved BEFORE AFTER NIC: how many packets NIC sent and received in between.
  packets_moved() {
    local b a
    b=$(echo "$1" | awk -F= -v n="$3" '$1 == n { print $2 }')
    a=$(echo "$2" | awk -F= -v n="$3" '$1 == n { print $2 }')
    echo $(( ${a:-0} - ${b:-0} ))
  }

  # devices NAME: two NIC pairs per host (RXE_VM_RAILS=4), so two fused devices
  # (rxe_a0+rxe_a1 and rxe_a2+rxe_a3); the conformance cases (sizes, larger receives, grouped,
  # 256 in flight, pipeline) at sup_bw=512, so both rails of the device carry data, on device 1,
  # then on device 0, byte-exact. Each device's traffic must show in its own four NICs' hardware
  # packet counters (both hosts) and in none of the other device's.
  devices() {
    local name=$1 s d tmp t dev before after nic moved own detail='' bad=''
    wanted "$name" || return 0
    if [ ! -e /sys/class/infiniband/rxe_a3 ]; then
      record FAIL "$name" "no rxe_a3: the rig booted with RXE_VM_RAILS=${RXE_VM_RAILS:-2}, not 4"
      return 0
    fi
    local saved_a=("${A[@]}") saved_b=("${B[@]}")
    A=(MPIB_HCA_SOUT=rxe_a0,rxe_a2 MPIB_HCA_SUP=rxe_a1,rxe_a3 MPIB_OOB_ADDR=10.100.0.1)
    B=(MPIB_HCA_SOUT=rxe_b0,rxe_b2 MPIB_HCA_SUP=rxe_b1,rxe_b3 MPIB_OOB_ADDR=10.100.0.2)
    t=$(now)
    for dev in 1 0; do
      s=$(slug "$name device $dev")
      d=$W/$s tmp=/tmp/rig/$s
      mkdir -p "$d" "$tmp"
      before=$(nic_packets)
      launch "$d" "$tmp" v12 "sizes@512,larger@512,grouped@512,outstanding@512,pipeline@512" \
        "MPIB_MODE=1 MPIB_ISLAND_PREFIX_LEN=24" --expect-class intra --dev "$dev"
      reap
      after=$(nic_packets)
      [ "$rr" = 0 ] && [ "$sr" = 0 ] || bad+=" device $dev: receiver rc=$rr, sender rc=$sr;"
      own="rxe_a$((2 * dev)) rxe_a$((2 * dev + 1)) rxe_b$((2 * dev)) rxe_b$((2 * dev + 1))"
      detail+=" device $dev:"
      for nic in rxe_a0 rxe_a1 rxe_a2 rxe_a3 rxe_b0 rxe_b1 rxe_b2 rxe_b3; do
        moved=$(packets_moved "$before" "$after" "$nic")
        if [[ " $own " == *" $nic "* ]]; then
          detail+=" $nic+$moved"
          [ "$moved" -gt 0 ] || bad+=" device $dev moved nothing on its $nic;"
        elif [ "$moved" != 0 ]; then
          bad+=" device $dev moved $moved packets on $nic, another device's NIC;"
        fi
      done
      if [ -n "$bad" ]; then
        show_tail "receiver (host B)" "$d/recv.log"
        show_tail "sender (host A)" "$d/send.log"
      fi
    done
    A=("${saved_a[@]}") B=("${saved_b[@]}")
    if [ -z "$bad" ]; then
      record PASS "$name" "the conformance cases on each device, packets on its own NICs only:$detail; $(since "$t") s"
    else
      record FAIL "$name" "$bad (packets:$detail)"
    fi
  }

  # killed NAME ROLE: SIGKILL the ROLE process (recv: host B, send: host A) of an advanced pair
  # at sup_bw=512 with the default timeout once the sender has passed its first case. The
  # survivor's calls must return an error (the plugin sees the peer's control connection closed
  # by the kernel, or a QP retry error) well before its 60 s data deadline: no hang.
  killed() {
    local name=$1 role=$2 s d tmp t tkill victim survivor
    wanted "$name" || return 0
    s=$(slug "$name")
    d=$W/$s tmp=/tmp/rig/$s
    mkdir -p "$d" "$tmp"
    t=$(now)
    if [ "$role" = recv ]; then survivor=send; else survivor=recv; fi
    eval "${survivor}_args=(--expect-error plugin --data-timeout 60)"
    launch "$d" "$tmp" v12 "split-512,split-512,split-512,split-512,split-512,split-512" \
      "MPIB_MODE=1 MPIB_ISLAND_PREFIX_LEN=24"
    recv_args=() send_args=()
    first_case_done "$d"
    if [ "$role" = recv ]; then victim=$rp; else victim=$sp; fi
    # mpib-xfer runs under `timeout`: kill the process itself, not the wrapper. It must still be
    # running (a side that ended on its own proves nothing).
    local xpid alive=no
    xpid=$(pgrep -P "$victim" mpib-xfer) && kill -0 "$xpid" 2>/dev/null && alive=yes
    [ "$alive" = no ] || kill -KILL "$xpid"
    tkill=$(now)
    reap
    local how
    how="$survivor: $(grep -h -o 'returned nccl[A-Za-z]*Error' "$d/$survivor.log" | head -n 1)"
    if grep -q 'control connection' "$d/$survivor.log"; then
      how+=" (the peer's control connection closed)"
    fi
    # The killed side must have died of the kill (137: `timeout` passes SIGKILL on); then only the
    # survivor's status is judged.
    local victim_rc
    if [ "$role" = recv ]; then victim_rc=$rr; else victim_rc=$sr; fi
    if [ "$alive" = yes ] && [ "$victim_rc" = 137 ]; then
      if [ "$role" = recv ]; then rr=0; else sr=0; fi
    else
      how+="; the $role process was not killed mid-run (running: $alive, status $victim_rc)"
    fi
    verdict "$name" "$d" "$how; it exited $(since "$tkill") s after the kill, $(since "$t") s in all"
  }

  # impair DEV NETEM...: netem on DEV (replacing any qdisc); a failure is recorded in $impaired_ok
  # so that a case whose wire was never touched cannot pass.
  impair() {
    local dev=$1
    shift
    if tc qdisc replace dev "$dev" root netem "$@"; then impaired_ok=yes; else impaired_ok=no; fi
  }
  impaired_ok=yes

  # The NICs' own counters, `rxe_a0.name=value` per line (hw_counters of every rxe device).
  nic_counters() {
    local f dev
    for f in /sys/class/infiniband/rxe_*/ports/1/hw_counters/*; do
      [ -r "$f" ] || continue
      dev=${f#/sys/class/infiniband/}; dev=${dev%%/*}
      printf '%s.%s=%s\n' "$dev" "${f##*/}" "$(cat "$f")"
    done
  }
  # counter_delta BEFORE AFTER: the retry, sequence and error counters that grew
  # ("rxe_b1.out_of_seq_request+3").
  # (Passed as variables: the guest has no /dev/fd for process substitution.)
  counter_delta() {
    awk -v before="$1" -v after="$2" 'BEGIN {
      n = split(before, lines, "\n"); for (i = 1; i <= n; i++) { split(lines[i], kv, "="); a[kv[1]] = kv[2] }
      n = split(after, lines, "\n")
      for (i = 1; i <= n; i++) { split(lines[i], kv, "=")
        if (kv[1] ~ /retry|seq|duplicate|rnr|drop|_err$/ && kv[2] - a[kv[1]] > 0) { printf "%s%s+%d", sep, kv[1], kv[2] - a[kv[1]]; sep = " " } }
      if (sep == "") printf "none grew" }'
  }

  # impaired NAME DEV NETEM...: an advanced pair at sup_bw=512 (both rails carry data, default
  # retry settings) whose wire DEV (host A's end: A->B packets) netem impairs for the whole
  # run. Every byte must still arrive; the NICs' retry counters show what it cost.
  impaired() {
    local name=$1 dev=$2 s d tmp t before
    shift 2
    wanted "$name" || return 0
    s=$(slug "$name")
    d=$W/$s tmp=/tmp/rig/$s
    mkdir -p "$d" "$tmp"
    impair "$dev" "$@"
    before=$(nic_counters)
    t=$(now)
    launch "$d" "$tmp" v12 split-512 "MPIB_MODE=1 MPIB_ISLAND_PREFIX_LEN=24" --expect-class intra
    reap
    tc qdisc del dev "$dev" root 2>/dev/null
    verdict "$name" "$d" "$(rails_of "$d/recv.log") verified by the receiver; NIC counters: $(counter_delta "$before" "$(nic_counters)"), $(since "$t") s"
  }

  # unit NAME LOG TIMEOUT CMD...: a test binary of the verbs device tests.
  unit() {
    local name=$1 log=$2 tmo=$3 t rc n
    shift 3
    wanted "$name" || return 0
    t=$(now)
    MPIB_TEST_DEVICE_A=rxe_a0 MPIB_TEST_DEVICE_B=rxe_b0 timeout -k 5 "$tmo" "$@" > "$log" 2>&1
    rc=$?
    n=$(grep -o 'test result: ok\. [0-9]* passed' "$log" | awk '{ s += $4 } END { print s + 0 }')
    if [ "$rc" = 0 ] && grep -q 'test result: ok' "$log" && ! grep -q 'test result: FAILED' "$log"; then
      record PASS "$name" "$n test(s) passed, $(since "$t") s"
    else
      record FAIL "$name" "rc=$rc (124: timed out): $(grep -m3 -E '^test .* FAILED|panicked at' "$log" | tr '\n' ' ')"
      show_tail "$name" "$log"
    fi
  }

  echo "rig guest: $(nproc) vCPU(s), kernel $(uname -r), uptime $(cut -d' ' -f1 /proc/uptime) s"
  if [ -n "${RIG_DEVTEST_BIN-}" ]; then
    unit "verbs device tests (tests/verbs_device.rs)" "$W/verbs_device.log" 300 \
      "$RIG_DEVTEST_BIN" --ignored --test-threads=1
  fi
  if [ -n "${RIG_LIBTEST_BIN-}" ]; then
    unit "verbs unit tests (lib fabric::verbs, ignored)" "$W/verbs_lib.log" 300 \
      "$RIG_LIBTEST_BIN" fabric::verbs --ignored --test-threads=1
  fi
  vanilla=sizes,larger,grouped,outstanding,pipeline
  for v in v12 v8; do
    pair "$v vanilla intra-island" "$v" "$vanilla" "MPIB_ISLAND_PREFIX_LEN=24" --expect-class intra
    pair "$v vanilla inter-island" "$v" "$vanilla" "MPIB_ISLAND_PREFIX_LEN=32" --expect-class inter
    for bw in 0 256 512 1024; do
      pair "$v advanced sup_bw=$bw" "$v" "split-$bw" "MPIB_MODE=1 MPIB_ISLAND_PREFIX_LEN=24" \
        --expect-class intra
    done
    pair "$v grouped receives (advanced, sup_bw=512)" "$v" "grouped@512,outstanding@512" \
      "MPIB_MODE=1 MPIB_ISLAND_PREFIX_LEN=24" --expect-class intra
  done
  survive "v12 failover: SUP wire cut mid-run (netem loss 100% on veth_a1), vanilla intra-island" \
    veth_a1 sizes MPIB_ISLAND_PREFIX_LEN=24
  survive "v12 failover: SUP wire cut mid-run, advanced sup_bw=512 (veth_a1)" veth_a1 split-512 \
    "MPIB_MODE=1 MPIB_ISLAND_PREFIX_LEN=24"
  survive "v12 failover: SOUT wire cut mid-run, advanced sup_bw=512, control link on it (veth_a0)" \
    veth_a0 split-512 "MPIB_MODE=1 MPIB_ISLAND_PREFIX_LEN=24"
  fault "v12 fault: SUP wire cut mid-run, MPIB_FAILOVER=0 (netem loss 100% on veth_a1), a SOUT-only pair beside it" \
    v12 veth_a1 sizes "MPIB_ISLAND_PREFIX_LEN=24 MPIB_FAILOVER=0" 1
  fault "v12 fault: SOUT wire cut mid-run, vanilla inter-island: no rail survives (veth_a0)" v12 \
    veth_a0 sizes "MPIB_ISLAND_PREFIX_LEN=32"
  fault "v12 fault: SOUT wire cut mid-run, MPIB_FAILOVER=0, advanced sup_bw=512 (veth_a0)" v12 \
    veth_a0 split-512 "MPIB_MODE=1 MPIB_ISLAND_PREFIX_LEN=24 MPIB_FAILOVER=0"
  failback "v12 failback: SUP wire cut 1 s mid-run, then back, advanced sup_bw=512 (veth_a1)" veth_a1
  flap "v12 flap: SUP wire down 2.5 s, default retries (veth_a1)" veth_a1 2.5
  flap "v12 flap: SOUT wire down 2.5 s, default retries (veth_a0)" veth_a0 2.5
  killed "v12 killed: receiver process SIGKILLed mid-run" recv
  killed "v12 killed: sender process SIGKILLed mid-run" send
  for rail in 0 1; do
    label=SOUT; [ $rail = 0 ] || label=SUP
    impaired "v12 impaired: 1 % loss on $label (veth_a$rail)" "veth_a$rail" loss 1%
    impaired "v12 impaired: 1 % corruption on $label (veth_a$rail)" "veth_a$rail" corrupt 1%
    impaired "v12 impaired: 10 ms delay on $label (veth_a$rail)" "veth_a$rail" delay 10ms
  done
  devices "v12 devices: two NIC pairs per host, each device's traffic on its own NICs"
  # ranks NAME OP: mpib-ranks, OP over 4 rank processes on the rxe NICs (even ranks with host A's,
  # odd ones with host B's), 2 channels, vanilla intra-island, every result checked on every rank.
  ranks() {
    local name=$1 op=$2 s d rank host pids=() rc=0 t
    wanted "$name" || return 0
    s=$(slug "$name") t=$(now)
    d=$W/$s
    mkdir -p "$d" "/tmp/rig/$s"
    ip neigh flush all
    for rank in 0 1 2 3; do
      host=("${A[@]}")
      ((rank % 2 == 0)) || host=("${B[@]}")
      env "${host[@]}" MPIB_ISLAND_PREFIX_LEN=24 timeout -k 5 "$pair_timeout" "$bin/mpib-ranks" \
        --plugin "$bin/libnccl-net-mpib.so" --op "$op" --ranks 4 --rank "$rank" \
        --rendezvous "/tmp/rig/$s" --channels 2 --min-size 4K --max-size 4M --step-factor 32 \
        --iters 2 --timeout 120 > "$d/rank$rank.log" 2>&1 &
      pids+=($!)
    done
    for rank in 0 1 2 3; do wait "${pids[$rank]}" || rc=$((rc + 1)); done
    if [ "$rc" = 0 ]; then
      record PASS "$name" "4 of 4 ranks exact on every size; largest: $(awk '$3 == "uint32" { l = $1 " B, busbw " $7 " GB/s" } END { print l }' "$d/rank0.log"), $(since "$t") s"
    else
      record FAIL "$name" "$rc of 4 rank(s) failed: $(grep -h -m1 'FAILED' "$d"/rank*.log | head -n 1)"
      for rank in 0 1 2 3; do show_tail "rank $rank" "$d/rank$rank.log"; done
    fi
  }
  ranks "v12 ranks: ring all-reduce over 4 rank processes, 2 per host" allreduce
  ranks "v12 ranks: all-to-all over 4 rank processes, 2 per host" alltoall
  name="mpib-demo --fabric verbs (the main job)"
  if wanted "$name"; then
    t=$(now)
    timeout -k 5 600 "$bin/mpib-demo" --fabric verbs --iterations 2 --max-size $((16 << 20)) \
      --plugin "$bin/libnccl-net-mpib.so" > "$W/demo.log" 2>&1
    rc=$?
    sed 's/^/  | /' "$W/demo.log"
    if [ "$rc" = 0 ] && grep -q '^all [0-9]* transfers verified' "$W/demo.log"; then
      record PASS "$name" "$(grep -o '^all [0-9]* transfers verified' "$W/demo.log"), $(since "$t") s"
    else
      record FAIL "$name" "rc=$rc (124: timed out): $(grep -m1 'FAILED' "$W/demo.log")"
    fi
  fi
  ! grep -q '^FAIL' "$results"
  exit $?
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
