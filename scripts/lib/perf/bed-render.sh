#!/usr/bin/env bash
# scripts/lib/perf/bed-render.sh WORK REPS: the Markdown section and the split plot of the bed's
# figures (scripts/lib/perf/bed.sh), from WORK/records.tsv: medians per (section, label, size).
set -euo pipefail
work=$1 reps=$2
medians=$work/medians.tsv
awk -F'\t' '
  function median(list,    v, n, i, j, t) {
    n = split(list, v, " ")
    for (i = 2; i <= n; i++) { t = v[i]; for (j = i - 1; j >= 1 && v[j] + 0 > t + 0; j--) v[j + 1] = v[j]; v[j + 1] = t }
    return (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
  }
  { k = $1 "\t" $2 "\t" $3; if (!(k in g)) order[++n] = k; g[k] = g[k] " " $5 }
  END { for (i = 1; i <= n; i++) printf "%s\t%.4f\n", order[i], median(g[order[i]]) }' \
  "$work/records.tsv" > "$medians"
value() { awk -F'\t' -v s="$1" -v l="$2" -v z="$3" '$1 == s && $2 == l && $3 == z { print $4 }' "$medians"; }
verdict() { awk -v r="$1" -v t="$2" 'BEGIN { print (r + 0 >= t + 0) ? "met" : "missed" }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", (b > 0) ? a / b : 0 }'; }
{
  echo "## The tcp fabric on the two-host bed"
  echo
  echo "\`MPIB_FABRIC=tcp\` between two network namespaces joined by two veth pairs (\`mpib-bed\`, driver/src/harness/bed.rs),"
  echo "sender and receiver in separate processes (\`mpib-perf --listen/--peer\`), shaped by \`tc tbf\`;"
  echo "GB/s = 1e9 B/s, medians of $reps repetitions, each row measured side by side in one run"
  echo "(\`scripts/lib/perf/bed.sh\`, run by \`scripts/perf\`). Both processes share this machine's 2 cores."
  echo
  echo "Reading: the shaped rows are the verdicts (the wire is the limit, as on a NIC). Unshaped, the"
  echo "limit is the CPU: each side runs a busy-polling proxy thread (mpib-perf's, as NCCL's) and one"
  echo "fabric thread per rail on 2 shared cores, where iperf3 runs one thread per side; the ceiling"
  echo "row says how far above the shaped rates the fabric itself goes on this machine, not a target."
  echo
  for section in rail ceiling; do
    if [ $section = rail ]; then
      echo "One rail (SOUT, 2 QPs) shaped to 2 Gbit/s, against iperf3 on the same veth with the same number of streams (target ≥ 0.9 at ≥ 1 MiB):"
    else
      echo "The same rail unshaped: the fabric's own ceiling against iperf3's on this machine:"
    fi
    echo
    echo "| size | mpib-perf GB/s | iperf3 -P 2 GB/s | ratio | iperf3 -P 1 GB/s | verdict |"
    echo "|---:|---:|---:|---:|---:|---|"
    ip2=$(value "bed-$section" "iperf3 -P 2" -) ip1=$(value "bed-$section" "iperf3 -P 1" -)
    for size in $(awk -F'\t' -v s="bed-$section" '$1 == s && $2 == "mpib-perf SOUT" { print $3 }' "$medians"); do
      mp=$(value "bed-$section" "mpib-perf SOUT" "$size")
      r=$(ratio "$mp" "$ip2")
      v=$([ $section = rail ] && verdict "$r" 0.9 || echo "-")
      echo "| $((size / 1048576)) MiB | $mp | $ip2 | $r | $ip1 | $v |"
    done
    echo
  done
  sout=$(value bed-split "sup_bw 0" 4194304) sup=$(value bed-split "sup_bw 1024" 4194304)
  sum=$(awk -v a="$sout" -v b="$sup" 'BEGIN { printf "%.4f", a + b }')
  echo "Both rails, SOUT 1 Gbit/s + SUP 2 Gbit/s, 4 MiB transfers, advanced mode with mpib-perf's test"
  echo "agent setting the SUP share; Σ = SOUT alone ($sout) + SUP alone ($sup) = $sum GB/s (target: the"
  echo "rate-proportional split 683/1024 ≥ 0.95 × Σ). Plot: [bed-split.png](bed-split.png)."
  echo
  echo "| SUP share /1024 | GB/s | × Σ | verdict |"
  echo "|---:|---:|---:|---|"
  awk -F'\t' '$1 == "bed-split" { sub("sup_bw ", "", $2); print $2 "\t" $4 }' "$medians" | sort -n |
    while IFS=$'\t' read -r share gbps; do
      r=$(ratio "$gbps" "$sum")
      v=$([ "$share" = 683 ] && verdict "$r" 0.95 || echo "-")
      echo "| $share | $gbps | $r | $v |"
    done
  echo
  if grep -q '^bed-agent' "$medians"; then
    echo "The policy agent across processes, same rails: 2 and 4 sender processes at once (4 MiB, each to"
    echo "its own receiver process) through one \`mpib-agent --policy adaptive --interval-ms 500\`, against"
    echo "the same processes each at the fixed rate-proportional split 683; the bytes all of them moved"
    echo "while all ran, from 8 s after the last one's first row, over that time, on the wall clock"
    echo "(\`unix_ms\`; target with 4 processes: adaptive ≥ 0.95 × fixed):"
    echo
    echo "| processes | adaptive GB/s | fixed 683 GB/s | adaptive / fixed | verdict |"
    echo "|---:|---:|---:|---:|---|"
    for n in 2 4; do
      a=$(value bed-agent "adaptive $n processes" 4194304) f=$(value bed-agent "static $n processes" 4194304)
      r=$(ratio "$a" "$f")
      v=$([ "$n" = 4 ] && verdict "$r" 0.95 || echo "-")
      echo "| $n | $a | $f | $r | $v |"
    done
    echo
    echo "How the agent sees a flow of several connections: each connection publishes its parts in flight"
    echo "per rail (probes 2.2, \`rail_in_flight\`), the agent samples them about every 500 µs between"
    echo "decisions, and the flow's rail is busy while any of its connections, in any process, has a part"
    echo "on it (docs/AGENT.md). Summing the connections' own busy times instead counted an instant once per"
    echo "connection busy in it, more often on the bottleneck rail than on the other: 4 processes reached"
    echo "0.758 of the fixed split that way (2 processes 0.977), and capping the sum at the interval (0.934"
    echo "here) halved the loopback \`comms8\` case, where 8 connections are busy together. Each process's"
    echo "\`at_ms\` counts from its own first row, and adaptive runs start all-SOUT, where a process can be"
    echo "starved for seconds: summing per-process medians over \`at_ms\` windows added rates from"
    echo "different times (up to 1.25 × the rails' sum, or no rows at all in the window, a failed case)."
    echo
  fi
  if grep -q '^bed-ranks' "$medians"; then
    echo "A collective the way NCCL's transport layer drives the plugin: \`mpib-ranks\`, a ring all-reduce"
    echo "(uint32 sum, every result checked on both ranks) of 2 ranks, one per host, 2 channels, NCCL's"
    echo "Simple protocol (4 MiB connection buffers, 1 MiB slices, 4 in flight), in advanced mode through"
    echo "\`mpib-agent\` with the capacity policy told the rails' rates (the split 683); bus bandwidth as"
    echo "nccl-tests reports it (for 2 ranks: what each rank sends per second, both ways at once) against"
    echo "Σ = $sum GB/s, the two rails alone summed, as above (target ≥ 0.9 × Σ at ≥ 16 MiB). Between two"
    echo "all-reduces the ranks wait for each other, and tbf's bucket (10 ms at the rate) refills meanwhile:"
    echo "an all-reduce that fits in the buckets (1 MiB) reads far above the wire, one of tens of"
    echo "milliseconds up to a fifth above it; the largest size is the fair comparison:"
    echo
    echo "| size | busbw GB/s | × Σ | verdict |"
    echo "|---:|---:|---:|---|"
    awk -F'\t' '$1 == "bed-ranks" { print $3 "\t" $4 }' "$medians" | sort -n |
      while IFS=$'\t' read -r size gbps; do
        r=$(ratio "$gbps" "$sum")
        v=$([ "$size" -ge 16777216 ] && verdict "$r" 0.9 || echo "-")
        echo "| $((size / 1048576)) MiB | $gbps | $r | $v |"
      done
    echo
  fi
  if grep -q '^bed-failover' "$medians"; then
    # lost HOW: "N P50 MAX" of the time lost to the cuts made that way.
    lost() {
      awk -F'\t' -v l="time lost ms, $1" '$1 == "bed-failover" && $2 == l { print $5 }' "$work/records.tsv" | sort -g |
        awk '{ v[++n] = $1 } END { if (n) printf "%d %.0f %.0f", n, (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2, v[n] }'
    }
    read -r down_cuts down_p50 down_max <<< "$(lost "link down")"
    read -r drop_cuts drop_p50 drop_max <<< "$(lost "packets dropped")"
    read -r dog_cuts dog_p50 dog_max <<< "$(lost "packets dropped, watchdog")"
    split=$(value bed-failover "split before the cut" -)
    after=$(value bed-failover "SOUT alone after it" -)
    alone=$(value bed-failover "SOUT alone from the start" -)
    r=$(ratio "$after" "$alone")
    echo "A rail that fails mid-run (docs/PROTOCOL.md §10): the same rails at the split 683, SUP cut"
    echo "about 2 s into a run of 8 MiB rows and mended after it: its link set down ($down_cuts cuts;"
    echo "the tcp fabric's port event: src/fabric/tcp/link_state.rs), or every packet host A"
    echo "sends on it dropped ($drop_cuts cuts; no event: the QPs' retries find it, \`MPIB_IB_TIMEOUT=14\` and 6"
    echo "retries, a budget of 4.096 µs × 2^14 × 7 = 0.47 s), and dropped again ($dog_cuts cuts) with the"
    echo "progress watchdog on (\`MPIB_FAILOVER_WATCHDOG_MS=100\`: SUP's parts completing nothing for 100 ms"
    echo "while SOUT's complete). Time lost: how much longer the row across the cut took than a row"
    echo "after it (detection, the failover, the replays). Targets: SOUT alone after the failover ≥"
    echo "0.95 × SOUT alone from the start (\`--sup-bw 0\`); a port event acted on within 100 ms."
    echo
    echo "| split before the cut GB/s | time lost p50 / max ms, link down | … packets dropped | … dropped, watchdog 100 ms | SOUT alone after it GB/s | SOUT alone from the start GB/s | after / from the start | verdict |"
    echo "|---:|---:|---:|---:|---:|---:|---:|---|"
    echo "| $split | $down_p50 / $down_max | $drop_p50 / $drop_max | $dog_p50 / $dog_max | $after | $alone | $r | $(verdict "$r" 0.95) |"
    echo
  fi
} > "$work/bed.md"
awk -F'\t' '$1 == "bed-split" { sub("sup_bw ", "", $2); print $2, $4 }' "$medians" | sort -n > "$work/split.dat"
if command -v gnuplot > /dev/null && [ -s "$work/split.dat" ]; then
  gnuplot <<PLOT || echo "bed perf: gnuplot could not draw the split sweep" >&2
set terminal png size 720,440
set output "$work/bed-split.png"
set title "tcp fabric, two-host bed: SOUT 1 Gbit/s + SUP 2 Gbit/s, 4 MiB, medians of $reps"
set xlabel "SUP share (parts per 1024)"
set ylabel "GB/s"
set xrange [0:1024]
set yrange [0:*]
set xtics 128
set key bottom right
set grid
plot "$work/split.dat" using 1:2 with linespoints lw 2 pt 7 title "mpib-perf", \
     "$work/split.dat" using 1:(\$2 * 0 + $sum) with lines dt 2 lw 2 title "SOUT alone + SUP alone"
PLOT
fi
# The convergence run (first repetition): time series and a two-panel plot.
if [ -f "$work/converge.csv" ] && [ -f "$work/converge.start" ]; then
  start=$(cat "$work/converge.start")
  slowed=$(awk -v s="$start" '{ printf "%.2f", $1 - s }' "$work/converge.slowed" 2> /dev/null || echo 12)
  awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
    { printf "%.3f %s %s\n", $(c["at_ms"]) / 1000, $(c["gbps"]), $(c["sup_share"]) }' \
    "$work/converge.csv" > "$work/converge-rows.dat"
  awk -v s="$start" '/^[0-9]+\.[0-9]+$/ { t = $1 - s; next }
    / 10\.100\.0\.1->10\.100\.0\.2 / && t > 0 { printf "%.3f %s\n", t, $4 }' \
    "$work/converge-status.log" > "$work/converge-asked.dat"
  {
    echo "The agent over time: one pair through a fresh \`mpib-agent --policy adaptive --interval-ms 500\`,"
    echo "SOUT 1 Gbit/s + SUP 2 Gbit/s, SUP slowed to 0.5 Gbit/s ${slowed} s in (the rate-proportional"
    echo "share moves from 683 to 341): the share the agent asked (its status, four times a second),"
    echo "the share the bytes took and the throughput per row of 16 MiB"
    echo "([bed-converge.png](bed-converge.png), first repetition):"
    echo
    echo "![the agent's convergence on the bed](bed-converge.png)"
    echo
  } >> "$work/bed.md"
  if command -v gnuplot > /dev/null; then
    gnuplot <<PLOT || echo "bed perf: gnuplot could not draw the convergence" >&2
set terminal png size 720,560
set output "$work/bed-converge.png"
set multiplot layout 2,1 title "tcp fabric, two-host bed: mpib-agent adaptive, SUP slowed at ${slowed} s"
set grid
set xrange [0:*]
set arrow 1 from $slowed, graph 0 to $slowed, graph 1 nohead dt 3
set ylabel "SUP share /1024"
set yrange [0:1024]
set key bottom left
plot "$work/converge-asked.dat" using 1:2 with steps lw 2 title "asked (agent)", \
     "$work/converge-rows.dat" using 1:3 with lines title "applied (bytes)", \
     "$work/converge-rows.dat" using 1:(\$1 < $slowed ? 683 : 341) with lines dt 2 title "rate-proportional"
set ylabel "GB/s"
set xlabel "seconds"
set yrange [0:0.45]
plot "$work/converge-rows.dat" using 1:2 with lines title "throughput", \
     "$work/converge-rows.dat" using 1:(\$1 < $slowed ? 0.375 : 0.1875) with lines dt 2 title "wire: SOUT + SUP"
unset multiplot
PLOT
  fi
fi
echo "bed perf: wrote $work/bed.md"
