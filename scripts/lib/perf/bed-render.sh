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
  echo "\`MPIB_FABRIC=tcp\` between two network namespaces joined by two veth pairs (scripts/bed/lib.sh),"
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
} > "$work/bed.md"
awk -F'\t' '$1 == "bed-split" { sub("sup_bw ", "", $2); print $2, $4 }' "$medians" | sort -n > "$work/split.dat"
if command -v gnuplot > /dev/null; then
  gnuplot <<PLOT
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
echo "bed perf: wrote $work/bed.md"
