#!/bin/bash
# PID 1 of the rxe-vm guest (started by initramfs-init.sh through switch_root; never run it
# on the host). Builds the two rails, runs the command in the caller's environment, records
# its exit code in the shared state dir and powers the VM off, whatever happens.
state=/run/rxe-vm
phase() { echo "$1" > $state/phase; }
# PID 1 must never just exit (the kernel would panic instead of stopping qemu); poweroff
# also when setup fails half-way (README pitfall 7).
trap 'echo 0 > /proc/sys/kernel/printk; /bin/busybox poweroff -f' EXIT

phase setup
. $state/boot                                  # KVER KMODS GUEST CWD RW_N RW_*
. $state/env                                   # the caller's environment
. $state/cmd                                   # set -- CMD ARGS...

# Runs in a subshell; every step checks its own status. (`set -e` would be no help: bash
# ignores it inside a function whose caller tests the result, as `( rails ) || ...` does.)
bad() { echo "rxe-vm guest: rail setup failed: $*"; exit 1; }
rails() {
  # RXE_VM_DEBUG=1: trace the setup with guest uptime stamps.
  [ -z "${RXE_VM_DEBUG-}" ] || { PS4='+ [$(cut -d" " -f1 /proc/uptime)] '; set -x; }
  modprobe rdma_rxe || bad "modprobe rdma_rxe"
  modprobe sch_netem || bad "modprobe sch_netem"   # for fault injection with tc; cheap
  # Every fork+exec costs tens of ms under TCG, so the ip and rdma commands go through one
  # batch (`ip -batch`, `rdma -b`) process each (about 1 s saved at each boot).
  # RXE_VM_RAILS=4: two more rails per host (rxe_a2, rxe_a3, ...): two NIC pairs, as a node
  # with one fused device per pair has.
  local mtu=${RXE_VM_MTU:-9000} rails=${RXE_VM_RAILS:-2} r a b ipa ipb ipcmds='' rdmacmds='' sysctls=''
  case $rails in 2|4) ;; *) bad "RXE_VM_RAILS=$rails (expected 2 or 4)" ;; esac
  for ((r = 0; r < rails; r++)); do
    a=veth_a$r b=veth_b$r ipa=10.100.$r.1 ipb=10.100.$r.2
    # MTU 9000 makes rxe report active_mtu 4096 like real RoCE; 1500 gives 1024 and is
    # slower (README pitfall 3).
    ipcmds+="link add $a mtu $mtu type veth peer name $b mtu $mtu
addr add $ipa/24 dev $a
addr add $ipb/24 dev $b
link set $a up
link set $b up
"
    # Both "hosts" live in one kernel, so the route A->B is a local one: the packet goes via
    # lo, and rxe drops what arrives on lo; ibv_modify_qp(RTR) then fails in address
    # resolution (README pitfall 2). Fix: policy rules that send locally generated A<->B
    # traffic out through the rail's own veth, placed before the `local` table (moved below).
    ipcmds+="rule add pref $((10 + 2 * r)) iif lo from $ipa to $ipb table $((100 + 2 * r))
rule add pref $((11 + 2 * r)) iif lo from $ipb to $ipa table $((101 + 2 * r))
route add $ipb dev $a src $ipa table $((100 + 2 * r))
route add $ipa dev $b src $ipb table $((101 + 2 * r))
"
    # The packet then arrives on the other veth with a local source address: accept it.
    sysctls+=" net.ipv4.conf.$a.accept_local=1 net.ipv4.conf.$a.rp_filter=0"
    sysctls+=" net.ipv4.conf.$b.accept_local=1 net.ipv4.conf.$b.rp_filter=0"
    rdmacmds+="link add rxe_a$r type rxe netdev $a
link add rxe_b$r type rxe netdev $b
"
  done
  ipcmds+="link set lo up
rule add pref 1000 table local
rule del pref 0
"                                              # the local table goes after the rail rules
  ip -batch - <<< "$ipcmds" || bad "ip -batch (veths, addresses, rules, routes)"
  # shellcheck disable=SC2086  # $sysctls is a list of words
  sysctl -qw net.ipv4.conf.all.rp_filter=0 $sysctls || bad "sysctl"
  rdma -b - <<< "$rdmacmds" || bad "rdma link add"
  # The ports come up with the veths; make sure all of them say ACTIVE (builtins only; up to
  # 20 s, as a starved TCG guest can be very slow).
  local f st n
  shopt -s nullglob
  for _ in {1..200}; do
    n=0
    for f in /sys/class/infiniband/rxe_*/ports/1/state; do
      read -r st < "$f" || true; [[ $st == *ACTIVE ]] && n=$((n + 1))
    done
    [ $n = $((2 * rails)) ] && return 0
    sleep 0.1
  done
  echo "rxe-vm guest: only $n of $((2 * rails)) rxe ports are ACTIVE"; return 1
}
diagnose() {
  echo "rxe-vm guest: state after the failed setup:"
  rdma link 2>&1; ip -br link 2>&1; ip rule 2>&1
}

if [ -z "${RXE_VM_NO_RAILS-}" ]; then
  ( rails ) || { diagnose; exit 1; }            # phase stays "setup": run.sh reports it
fi
cd "$CWD" || exit 1
# Uptime at the start of CMD: run.sh prints it with RXE_VM_VERBOSE=1.
read -r up _ < /proc/uptime; echo "$up" > $state/uptime
phase running
"$@"
echo $? > $state/rc
phase "done"
