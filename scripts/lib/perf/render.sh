#!/bin/bash
# scripts/lib/perf/render.sh WORK OUT STARTED REPS COMMAND: writes docs/PERFORMANCE.md (OUT) from
# the records scripts/perf left in WORK (loopback/records.tsv, rig/records.tsv, cost/bench.log).
# Records: section, label, size, rep, GB/s, p50 us, loss-counter deltas (tab-separated).
set -euo pipefail
work=$1 out=$2 started=$3 reps=$4 command=$5
here=$(cd "$(dirname "$(readlink -f "$0")")" && pwd)
medians=$work/medians.tsv

# Medians per (section, label, size): GB/s, p50, repetitions, and how many had any loss.
for f in "$work"/loopback/records.tsv "$work"/rig/records.tsv; do [ ! -f "$f" ] || cat "$f"; done | awk -F'\t' '
  function median(list,    v, n, i, j, t) {
    n = split(list, v, " ")
    for (i = 2; i <= n; i++) { t = v[i]; for (j = i - 1; j >= 1 && v[j] + 0 > t + 0; j--) v[j + 1] = v[j]; v[j + 1] = t }
    if (n == 0) return "-"
    return (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
  }
  { k = $1 "\t" $2 "\t" $3
    if (!(k in seen)) { seen[k] = 1; order[++keys] = k }
    runs[k]++
    if ($5 != "fail" && $5 != "error" && $5 != "-") g[k] = g[k] " " $5
    if ($5 == "fail") failed[k]++
    if ($5 == "error") errors[k]++
    if ($6 != "-" && $6 != "fail") p[k] = p[k] " " $6
    if ($7 != "none" && $7 != "-") { lossy[k]++; if (!(k in example)) example[k] = $7 }
  }
  # Spread: (max - min) / median of the GB/s values, in percent ("-" with fewer than 2).
  function spread(list,    v, n, i, lo, hi, m) {
    n = split(list, v, " "); if (n < 2) return "-"
    lo = hi = v[1] + 0
    for (i = 2; i <= n; i++) { if (v[i] + 0 < lo) lo = v[i] + 0; if (v[i] + 0 > hi) hi = v[i] + 0 }
    m = median(list); return (m + 0 == 0) ? "-" : sprintf("%.1f", 100 * (hi - lo) / m)
  }
  END { for (i = 1; i <= keys; i++) { k = order[i]
          mg = median(g[k]); mp = median(p[k])
          printf "%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s\t%d\n", k, (mg == "-") ? mg : sprintf("%.6f", mg),
                 (mp == "-") ? mp : sprintf("%.1f", mp), runs[k], failed[k] + 0, lossy[k] + 0,
                 (k in example) ? example[k] : "none", spread(g[k]), errors[k] + 0 } }' > "$medians"

med() { awk -F'\t' -v s="$1" -v l="$2" -v z="$3" -v c="${4:-4}" '$1 == s && $2 == l && $3 == z { print $c; exit }' "$medians"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || a == "-" || b == "-" || b + 0 == 0) print "-"; else printf "%.3f", a / b }'; }
sum() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || a == "-" || b == "-") print "-"; else printf "%.6f", a + b }'; }
verdict() { awk -v r="$1" -v t="$2" 'BEGIN { if (r == "-") print "not measured"; else if (r + 0 >= t) print "met"; else print "**gap**" }'; }
human() { awk -v b="$1" 'BEGIN { if (b >= 1048576) printf "%g MiB", b / 1048576; else if (b >= 1024) printf "%g KiB", b / 1024; else printf "%d B", b }'; }
gbs() { awk -v v="$1" 'BEGIN { if (v == "" || v == "-") print "-"; else if (v < 0.1) printf "%.2f MB/s", v * 1000; else printf "%.3f GB/s", v }'; }

sizes_of() { awk -F'\t' -v s="$1" '$1 == s { print $3 }' "$medians" | sort -n -u; }
labels_of() { awk -F'\t' -v s="$1" '$1 == s && !seen[$2]++ { print $2 }' "$medians"; }

# A split sweep as a table: one row per label, one GB/s column per size.
sweep_table() { # sweep_table SECTION
  local sizes label z line
  mapfile -t sizes < <(sizes_of "$1")
  line="| split |"; for z in "${sizes[@]}"; do line+=" $(human "$z") |"; done; echo "$line"
  line="|---|"; for z in "${sizes[@]}"; do line+="---:|"; done; echo "$line"
  while IFS= read -r label; do
    line="| $label |"
    for z in "${sizes[@]}"; do
      local spread; spread=$(med "$1" "$label" "$z" 10); [ "$spread" != - ] || spread=
      line+=" $(gbs "$(med "$1" "$label" "$z")")${spread:+ (±$spread %)} |"
    done
    echo "$line"
  done < <(labels_of "$1")
}

# The best sup_bw row of a loopback case at SIZE: "label GB/s"; with a third argument, only the
# splits that use both rails (sup_bw 1 ... 1023).
best_split() {
  awk -F'\t' -v s="$1" -v z="$2" -v both="${3-}" '
    $1 == s && $3 == z && $4 != "-" && !(both != "" && ($2 == "sup_bw 0" || $2 == "sup_bw 1024")) &&
      $4 + 0 > b + 0 { b = $4; l = $2 }
    END { print l "\t" b }' "$medians"
}

loopback_verdicts() {
  local size=$1 sout sup best bl bv
  sout=$(med loopback-independent "sup_bw 0" "$size"); sup=$(med loopback-independent "sup_bw 1024" "$size")
  IFS=$'\t' read -r bl bv < <(best_split loopback-independent "$size")
  local r; r=$(ratio "$bv" "$(sum "$sout" "$sup")")
  echo "| Loopback 2 + 4 GB/s, $(human "$size"): best split ($bl) vs SOUT alone + SUP alone | $(gbs "$bv") vs $(gbs "$(sum "$sout" "$sup")") | $r | ≥ 0.95 | $(verdict "$r" 0.95) |"
  local msout msup mbest ml mv
  msout=$(med loopback-mixed "sup_bw 0" "$size"); msup=$(med loopback-mixed "sup_bw 1024" "$size")
  mbest=$(awk -v a="$msout" -v b="$msup" 'BEGIN { print (a + 0 > b + 0) ? a : b }')
  # The model must show the penalty: every split that uses both rails below the best single rail
  # (choosing that rail is the agent's job, issue 9; a sweep that includes 0 and 1024 always
  # contains the best single rail itself, so comparing against it could not fail).
  IFS=$'\t' read -r ml mv < <(best_split loopback-mixed "$size" both)
  r=$(ratio "$mv" "$mbest")
  local shown=met
  if [ "$r" = - ]; then shown="not measured"; elif awk -v r="$r" 'BEGIN { exit !(r + 0 >= 1) }'; then shown="**gap**"; fi
  echo "| Loopback mixing penalty, $(human "$size"): best two-rail split ($ml) vs best single rail | $(gbs "$mv") vs $(gbs "$mbest") | $r | < 1 (the penalty is modelled) | $shown |"
}

rig_verdicts() {
  local z a b r
  for z in $(sizes_of single); do
    for rail in sout sup; do
      local bw=0; [ $rail = sout ] || bw=1024
      a=$(med single "mpib-perf $rail (sup_bw $bw)" "$z"); b=$(med single "ib_write_bw $rail" "$z")
      r=$(ratio "$a" "$b")
      echo "| Rig, $rail rail alone, $(human "$z"): mpib-perf vs ib_write_bw | $(gbs "$a") vs $(gbs "$b") | $r | ≥ 0.95 | $(verdict "$r" 0.95) |"
    done
  done
  for z in $(sizes_of both); do
    a=$(awk -F'\t' -v z="$z" '$1 == "both" && $3 == z && $2 ~ /^mpib-perf/ { print $4; exit }' "$medians")
    b=$(med both "ib_write_bw x2 (sum)" "$z")
    r=$(ratio "$a" "$b")
    echo "| Rig, both rails, $(human "$z"): mpib-perf at the rate-proportional split vs two ib_write_bw at once | $(gbs "$a") vs $(gbs "$b") | $r | ≥ 0.95 at ≥ 4 MiB | $(verdict "$r" 0.95) |"
    b=$(sum "$(med single "ib_write_bw sout" "$z")" "$(med single "ib_write_bw sup" "$z")")
    r=$(ratio "$a" "$b")
    echo "| Rig, both rails, $(human "$z"): the same vs each rail's ib_write_bw alone, summed (stricter: no CPU contention in the yardstick) | $(gbs "$a") vs $(gbs "$b") | $r | (≥ 0.95) | $(verdict "$r" 0.95) |"
  done
}

rig_table() { # rig_table SECTION: label, size, GB/s, p50, runs, runs with loss and an example
  echo "| measurement | size | median | spread | p50 µs | runs | runs with loss (example counters) |"
  echo "|---|---:|---:|---:|---:|---:|---|"
  awk -F'\t' -v s="$1" '$1 == s' "$medians" | while IFS=$'\t' read -r _ label z g p n f l ex sp er; do
    local note="$l"; [ "$l" = 0 ] || note="$l: \`$ex\`"; [ "$f" = 0 ] || note+=" ($f failed)"
    [ "$er" = 0 ] || note+=" ($er ended with an error from the plugin: retries exhausted)"
    local spread="$sp %"; [ "$sp" != - ] || spread=-
    echo "| $label | $(human "$z") | $(gbs "$g") | $spread | $p | $n | $note |"
  done
}

cost_table() {
  echo "| size | transfers/s, probes off | probes on | on/off | CPU ns/transfer, off | on | heap allocations/transfer |"
  echo "|---:|---:|---:|---:|---:|---:|---:|"
  sed -n 's/^row //p' "$work/cost/bench.log" | while read -r line; do
    declare -A f=()
    for kv in $line; do f[${kv%%=*}]=${kv#*=}; done
    echo "| $(human "${f[size]}") | ${f[off]} | ${f[on]} | ${f[ratio]} | ${f[cpu_ns_off]} | ${f[cpu_ns_on]} | ${f[allocs_per_transfer]} |"
  done
}

{
  sed -e "s|@STARTED@|$started|" -e "s|@REPS@|$reps|" -e "s|@COMMAND@|$command|" \
      -e "s|@MACHINE@|$(nproc) cores, $(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo), load average $(cut -d' ' -f1-3 /proc/loadavg) at the end|" \
      "$here/PERFORMANCE.head.md"
  echo
  echo "## Verdicts"
  echo
  echo "Each ratio compares two medians measured side by side in this run."
  echo
  echo "| what | measured | ratio | target | |"
  echo "|---|---|---:|---|---|"
  for z in $(sizes_of loopback-independent); do loopback_verdicts "$z"; done
  [ ! -s "$work/rig/records.tsv" ] || rig_verdicts
  allocs=$(sed -n 's/^row .*allocs_per_transfer=\([0-9.]*\).*/\1/p' "$work/cost/bench.log" | sort -n | tail -1)
  echo "| Heap allocations per transfer (loopback, probes on and off, 64 B ... 64 KiB) | ${allocs:--} | | 0 | $(awk -v a="${allocs:-x}" 'BEGIN { print (a == "x") ? "not measured" : (a + 0 == 0 ? "met" : "**gap**") }') |"
  echo
  echo "## Loopback rate model"
  echo
  echo "\`mpib-perf\` in one process (\`MPIB_FABRIC=loopback\`), window 8, GB/s (1e9 B/s), median of $reps"
  echo "(± the run-to-run spread: (max - min) / median)."
  echo
  echo "### Independent rails: \`sout=2GB/s,sup=4GB/s,latency=5us\`"
  echo
  sweep_table loopback-independent
  echo
  echo "### A shared cap on both rails: \`...,shared=4.5GB/s\`"
  echo
  sweep_table loopback-shared
  echo
  echo "### The mixing penalty: \`...,mixed=1.5GB/s\` (both rails together slower than SUP alone)"
  echo
  sweep_table loopback-mixed
  echo
  if [ -s "$work/rig/records.tsv" ]; then
    echo "## Shaped Soft-RoCE rails (the rig)"
    echo
    echo "Two processes (receiver on host B, sender on host A), rails shaped with \`tc tbf\` on A's"
    echo "veths: SOUT 80 Mbit/s, SUP 160 Mbit/s, deep shaper queues, in-order delivery. Loss columns"
    echo "are the deltas over each run of the shaper's drops (\`shaper_drop\`, netem's included), the"
    echo "veths' and the kernel backlog's drops, IP and UDP discards, packets rxe sent on A but B"
    echo "never received (\`wire_lost\`) and rxe's retry counters (scripts/lib/perf/shape.sh)."
    echo
    echo "### One rail at a time"
    echo
    rig_table single
    echo
    echo "### Both rails"
    echo
    rig_table both
    echo
    echo "### Split sweep"
    echo
    rig_table sweep
    echo
    echo "### Knobs: a shorter ACK timeout, one QP per rail"
    echo
    rig_table knobs
    echo
    echo "### Reordering: per-CPU receive in the rig (the perf rails deliver in order)"
    echo
    rig_table reorder
    echo
    echo "### The lossy case: 0.1 % of packets lost on each rail's wire (netem under the shaper)"
    echo
    rig_table lossy
    echo
    echo "### Small messages"
    echo
    echo "Unshaped rails, SOUT only. \`ib_write_lat\` reports half a ping-pong round trip (one way);"
    echo "\`mpib-perf\` with one request in flight reports an \`isend\` from its post to the \`test\` that"
    echo "finds it done, which takes the receiver's clear-to-send reaching the sender, the data"
    echo "reaching the receiver and its acknowledgement coming back: about three one-way trips, plus"
    echo "two processes' polling under emulation."
    echo
    rig_table latency
    echo
  fi
  echo "## The plugin's own cost"
  echo
  echo "\`cargo bench --bench transfer\`: \`isend\` + \`irecv\` + \`test\` through the v12 table on the loopback"
  echo "fabric (no rates), window 8, one thread; medians of interleaved rounds."
  echo
  cost_table
  echo
  cat "$here/PERFORMANCE.tail.md"
} > "$out.tmp"
mv "$out.tmp" "$out"
