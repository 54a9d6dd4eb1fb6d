# scripts/bed/lib.sh: the two-host bed of network namespaces, shared by the bed's suite
# (scripts/bed/suite.sh) and its performance figures (scripts/lib/perf/bed.sh). Source it with
# NA and NB set to the two namespaces' names: host A has veth_a0 10.100.0.1/24 (rail 0, SOUT)
# and veth_a1 10.100.1.1/24 (rail 1, SUP), host B the same with .2. NC, if set, names a third
# host, the stranger (build_stranger).
# shellcheck shell=bash

# teardown: kills what still runs in our namespaces (only processes this script started there)
# and deletes them; deleting a namespace deletes its veth ends, and so the pairs.
teardown() {
  local ns pids
  for ns in "$NA" "$NB" ${NC:+"$NC"}; do
    [ -e "/run/netns/$ns" ] || continue
    pids=$(ip netns pids "$ns" 2> /dev/null | tr '\n' ' ')
    # shellcheck disable=SC2086  # a list of pids
    [ -z "$pids" ] || kill -KILL $pids 2> /dev/null
    ip netns del "$ns" 2> /dev/null
  done
}

# The veth ends are created inside their namespaces: the names never exist in the caller's.
build_bed() {
  local r
  ip netns add "$NA" || return 1
  ip netns add "$NB" || return 1
  for r in 0 1; do
    ip link add "veth_a$r" netns "$NA" type veth peer name "veth_b$r" netns "$NB" || return 1
    ip -n "$NA" addr add "10.100.$r.1/24" dev "veth_a$r" || return 1
    ip -n "$NB" addr add "10.100.$r.2/24" dev "veth_b$r" || return 1
    ip -n "$NA" link set "veth_a$r" up || return 1
    ip -n "$NB" link set "veth_b$r" up || return 1
  done
  ip -n "$NA" link set lo up && ip -n "$NB" link set lo up
}

# build_stranger: the third host NC, linked to host B alone (veth_c 10.100.2.3/24 <-> veth_bc
# 10.100.2.2 in B) and routed to B's rail addresses, which B answers on any of its links: a
# stranger who reaches the job's ports and nothing else (no view of the rails' traffic).
build_stranger() {
  [ ! -e "/run/netns/$NC" ] || return 0
  ip netns add "$NC" || return 1
  ip link add veth_c netns "$NC" type veth peer name veth_bc netns "$NB" || return 1
  ip -n "$NC" addr add 10.100.2.3/24 dev veth_c || return 1
  ip -n "$NB" addr add 10.100.2.2/24 dev veth_bc || return 1
  ip -n "$NC" link set veth_c up && ip -n "$NB" link set veth_bc up && ip -n "$NC" link set lo up ||
    return 1
  ip -n "$NC" route add 10.100.0.0/23 via 10.100.2.2
}

# shape RAIL RATE: tbf at RATE on both ends of a rail (both directions, like a wire); empty or 0:
# unshaped. The burst holds 10 ms at RATE (at least 64 KiB, one GSO packet).
shape() {
  local r=$1 rate=${2:-} burst end ns dev rc=0
  burst=$(awk -v r="$rate" 'BEGIN { u = tolower(r); sub(/^[0-9.]+/, "", u)
    m = u == "kbit" ? 1e3 : u == "mbit" ? 1e6 : u == "gbit" ? 1e9 : u == "tbit" ? 1e12 : 1
    b = (r + 0) * m / 8 / 100; printf "%d", b < 65536 ? 65536 : b }')
  for end in "$NA veth_a$r" "$NB veth_b$r"; do
    read -r ns dev <<< "$end"
    tc -n "$ns" qdisc del dev "$dev" root 2> /dev/null
    if [ -n "$rate" ] && [ "$rate" != 0 ]; then
      tc -n "$ns" qdisc add dev "$dev" root tbf rate "$rate" burst "$burst" latency 50ms || rc=1
    fi
  done
  return "$rc"
}
