# Shaped Soft-RoCE rails for performance work: sourced inside the rig's guest (scripts/rxe-vm),
# never on the host.
#
# Why: under qemu's software emulation both rxe rails share one CPU, so two rails together move
# about what one moves and no split can be judged (docs/PERFORMANCE.md). A token-bucket shaper on
# each rail's sending veth, well under that ceiling, gives rails whose rates are stable and add up.
#
# The shaper sits on host A's side (veth_a0 = SOUT, veth_a1 = SUP): data flows A -> B, ACKs and
# CTS writes flow back unshaped. Its queue is deep (SHAPE_LIMIT, 64 MB by default), so that the
# shaper itself never drops a packet of a burst: a dropped RC packet costs a retransmission, and
# one that is not followed by others (nothing to trigger a NAK) waits for the QP's ACK timeout
# (4.096 us x 2^MPIB_IB_TIMEOUT: 4.3 s at the default 20). `shape_lossy` is the separate, named
# case with the kernel's default-sized queue (tbf latency 100 ms) that does drop.

SHAPE_LIMIT=${SHAPE_LIMIT:-64mb}
SHAPE_BURST=${SHAPE_BURST:-64kb}

# shape_rail RAIL RATE: RAIL 0 (SOUT) or 1 (SUP); RATE in tc's units (80mbit, 10mbps, ...) or
# `off`. Safe to call during a run: `tc qdisc replace` swaps the shaper in place.
shape_rail() {
  local dev=veth_a$1
  if [ "$2" = off ]; then
    tc qdisc del dev "$dev" root 2>/dev/null || true
  else
    tc qdisc replace dev "$dev" root handle 1: tbf rate "$2" burst "$SHAPE_BURST" limit "$SHAPE_LIMIT"
  fi
}

# receive_in_order on|off: with `on`, every veth hands its received packets to CPU 0's backlog
# (RPS mask 1). Why: without it veth queues each packet on the backlog of the CPU that sent it,
# and tbf's dequeue runs on whichever CPU its timer or the next sender is on, so two packets of one
# QP can reach the receiver's rxe out of order. rxe takes the first one out of order as a lost
# packet: it NAKs and drops everything until the retransmission, and the sender goes back N.
# Measured: no packet is lost on the wire (sent = received), yet rcvd_seq_err, completer_retry_err,
# out_of_seq_request and duplicate_request rise (docs/PERFORMANCE.md, "reorder" case). A NIC on a
# real wire sees one FIFO link, so the perf rails use `on`.
receive_in_order() {
  local mask=0 r d; [ "$1" = off ] || mask=1
  for r in 0 1; do for d in "veth_a$r" "veth_b$r"; do
    echo "$mask" > "/sys/class/net/$d/queues/rx-0/rps_cpus"
  done; done
}

# shape_lossy RAIL RATE LOSS: the same shaped rail, losing LOSS (e.g. 0.1%) of its packets at
# random on the wire: netem under the shaper. Why netem and not a short shaper queue: a packet the
# sender's own qdisc refuses comes back to rxe at once (NET_XMIT_DROP), and rxe simply sends the
# same packet again (send_err, no retransmission): measured, a 128 KB tbf queue dropped thousands
# of packets with no retry counter moving. netem's loss reports success, like a switch dropping.
shape_lossy() {
  shape_rail "$1" "$2"
  tc qdisc replace dev "veth_a$1" parent 1:1 handle 10: netem loss "$3" limit 100000
}

# loss_snapshot: one line of every counter that shows a lost or retransmitted packet, both rails:
# the shaper's drops, the veths' drops, the kernel backlog's drops, and rxe's retry counters on
# both hosts. `loss_delta BEFORE AFTER` turns two snapshots into "name=delta" for those that moved.
loss_snapshot() {
  local r dev c f v out=""
  for r in 0 1; do
    v=$(tc -s qdisc show dev "veth_a$r" 2>/dev/null | sed -n 's/.*dropped \([0-9]*\).*/\1/p' | head -1)
    out+=" r$r.shaper_drop=${v:-0}"
    for dev in "veth_a$r" "veth_b$r"; do
      v=$(awk '{print $1}' "/sys/class/net/$dev/statistics/tx_dropped" 2>/dev/null)
      out+=" r$r.${dev}_txdrop=${v:-0}"
      v=$(awk '{print $1}' "/sys/class/net/$dev/statistics/rx_dropped" 2>/dev/null)
      out+=" r$r.${dev}_rxdrop=${v:-0}"
    done
    # Data packets rxe sent on A's end and received on B's: their difference is what the wire
    # (shaper, veth, backlog) lost in between.
    v=0; f=/sys/class/infiniband/rxe_a$r/ports/1/hw_counters/sent_pkts; [ -r "$f" ] && read -r v < "$f"
    out+=" r$r.a_sent_pkts=$v"
    v=0; f=/sys/class/infiniband/rxe_b$r/ports/1/hw_counters/rcvd_pkts; [ -r "$f" ] && read -r v < "$f"
    out+=" r$r.b_rcvd_pkts=$v"
    for dev in "rxe_a$r" "rxe_b$r"; do
      for c in completer_retry_err rcvd_seq_err retry_exceeded_err rcvd_rnr_err send_rnr_err \
               duplicate_request out_of_seq_request; do
        f=/sys/class/infiniband/$dev/ports/1/hw_counters/$c
        v=0; [ -r "$f" ] && read -r v < "$f"
        out+=" r$r.$dev.$c=$v"
      done
    done
  done
  # IP and UDP discards (rxe's RoCE v2 packets are UDP, port 4791).
  v=$(awk '/^Ip: [0-9]/ { print $9 + $12 }' /proc/net/snmp 2>/dev/null); out+=" ip_discards=${v:-0}"
  v=$(awk '/^Udp: [0-9]/ { print $4 + $6 }' /proc/net/snmp 2>/dev/null); out+=" udp_errors=${v:-0}"
  # Column 2 of softnet_stat: packets dropped because a CPU's backlog queue was full (hex).
  # (bash arithmetic: Debian's default awk, mawk, has no strtonum).
  local processed dropped rest sum=0
  while read -r processed dropped rest; do sum=$((sum + 16#$dropped)); done < /proc/net/softnet_stat
  echo "${out# } backlog_drop=$sum"
}

loss_delta() {
  awk -v a="$1" -v b="$2" 'BEGIN {
    n = split(a, x, " "); for (i = 1; i <= n; i++) { split(x[i], kv, "="); before[kv[1]] = kv[2] }
    n = split(b, y, " "); out = ""
    for (i = 1; i <= n; i++) {
      split(y[i], kv, "="); d = kv[2] - before[kv[1]]
      # Packet totals always move: only their difference (the wire loss) is reported.
      if (kv[1] ~ /_pkts$/) { pk[kv[1]] = d; continue }
      if (d != 0) out = out (out == "" ? "" : " ") kv[1] "=" d
    }
    for (r = 0; r < 2; r++) {
      lost = pk["r" r ".a_sent_pkts"] - pk["r" r ".b_rcvd_pkts"]
      if (lost != 0) out = out (out == "" ? "" : " ") "r" r ".wire_lost=" lost
    }
    print (out == "" ? "none" : out) }'
}
