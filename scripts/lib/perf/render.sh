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

# The agent's records (case, metric, rep, value): median, spread and runs per (case, metric).
agent_medians=$work/agent-medians.tsv
if [ -f "$work/agent/records.tsv" ] || [ -f "$work/rig/agent.tsv" ]; then
  for f in "$work/agent/records.tsv" "$work/rig/agent.tsv"; do [ ! -f "$f" ] || cat "$f"; done | awk -F'\t' '
    { k = $1 "\t" $2; if (!(k in seen)) { seen[k] = 1; order[++n] = k }
      runs[k]++; if ($4 == "fail") failed[k]++; else if ($4 == "never") never[k]++; else v[k] = v[k] " " $4 }
    function median(list,    a, m, i, j, t) {
      m = split(list, a, " "); if (m == 0) return "-"
      for (i = 2; i <= m; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] + 0 > t + 0; j--) a[j + 1] = a[j]; a[j + 1] = t }
      return (m % 2) ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2 }
    function spread(list,    a, m, i, lo, hi, md) {
      m = split(list, a, " "); if (m < 2) return "-"
      lo = hi = a[1] + 0; for (i = 2; i <= m; i++) { if (a[i] + 0 < lo) lo = a[i] + 0; if (a[i] + 0 > hi) hi = a[i] + 0 }
      md = median(list); return (md + 0 == 0) ? "-" : sprintf("%.1f", 100 * (hi - lo) / md) }
    # A median with "never"s counted as the longest: "never" when they are at least half.
    END { for (i = 1; i <= n; i++) { k = order[i]; m = median(v[k])
          if (never[k] + 0 > 0 && 2 * never[k] >= runs[k] - failed[k]) m = "never"
          printf "%s\t%s\t%s\t%d\t%d\n", k, m, spread(v[k]), runs[k], failed[k] + 0 } }
  ' > "$agent_medians"
else
  : > "$agent_medians"
fi
amed() { awk -F'\t' -v c="$1" -v m="$2" -v f="${3:-3}" '$1 == c && $2 == m { print $f; exit }' "$agent_medians"; }
ms_shown() { case "${1:--}" in never) echo "never within the run" ;; -) echo - ;; *) echo "$1 ms" ;; esac; }
at_most() { awk -v v="$1" -v t="$2" 'BEGIN { if (v == "" || v == "-") print "not measured"; else if (v == "never") print "**gap** (never within the run)"; else if (v + 0 <= t) print "met"; else print "**gap**" }'; }

BALANCED_SHOWN=683
agent_verdicts() {
  local a b r
  a=$(amed independent steady) b=$(amed independent sum_single) r=$(ratio "$a" "$b")
  echo "| Agent \`adaptive\`, loopback 2 + 4 GB/s, 4 MiB, from all-SOUT: median after 2 s vs SOUT alone + SUP alone | $(gbs "$a") vs $(gbs "$b") | $r | ≥ 0.95 | $(verdict "$r" 0.95) |"
  a=$(amed independent reach_ms)
  echo "| … time to reach 0.95 × that sum | $(ms_shown "$a") | | ≤ 2000 ms | $(at_most "$a" 2000) |"
  a=$(amed degraded steady_after) b=$(amed degraded best_after) r=$(ratio "$a" "$b")
  echo "| SUP slowed to 0.5 GB/s at 3 s: median from 2 s after vs the new best (SOUT alone + slowed SUP alone) | $(gbs "$a") vs $(gbs "$b") | $r | ≥ 0.9 | $(verdict "$r" 0.9) |"
  a=$(amed degraded recover_ms)
  echo "| … time from the first slowed row to 0.9 × the new best, for good | $(ms_shown "$a") | | ≤ 2000 ms | $(at_most "$a" 2000) |"
  b=$(amed mixed best_single)
  a=$(amed mixed adaptive) r=$(ratio "$a" "$b")
  echo "| Mixing penalty (\`mixed=1.5GB/s\`): \`adaptive\` (second half of its run) vs the best single rail | $(gbs "$a") vs $(gbs "$b") | $r | ≥ 0.95 | $(verdict "$r" 0.95) |"
  for p in capacity static512; do
    a=$(amed mixed "$p") r=$(ratio "$a" "$b")
    local name="\`capacity\`"; [ "$p" = capacity ] || name="a static 512"
    echo "| … $name beside it, vs the same | $(gbs "$a") vs $(gbs "$b") | $r | (reported) | |"
  done
  a=$(amed comms8 steady) b=$(amed comms8 sum_single) r=$(ratio "$a" "$b")
  echo "| 8 connections in one process through one agent, 2 + 4 GB/s: aggregate after 2 s vs the single rails summed (8 connections each) | $(gbs "$a") vs $(gbs "$b") | $r | ≥ 0.95 | $(verdict "$r" 0.95) |"
  device_verdicts
  ranks_verdicts
  [ -n "$(amed rig-adaptive steady)" ] || return 0
  # The rig's agent cases run at the smallest size (rig.sh: rows of about a second).
  local z; z=$(sizes_of both | head -n 1)
  local ib; ib=$(med both "ib_write_bw x2 (sum)" "$z")
  a=$(amed rig-adaptive steady) r=$(ratio "$a" "$ib")
  echo "| Rig, shaped rails 1:2, $(human "$z"): \`adaptive\` from all-SOUT, median row after 20 s vs two ib_write_bw at once | $(gbs "$a") vs $(gbs "$ib") | $r | ≥ 0.9 | $(verdict "$r" 0.9) |"
  b=$(amed rig-static steady) r=$(ratio "$a" "$b")
  echo "| … vs the same rows at the fixed split sup_bw $BALANCED_SHOWN (each row pays the window's fill and drain alike) | $(gbs "$a") vs $(gbs "$b") | $r | (≥ 0.95) | $(verdict "$r" 0.95) |"
  local s0 s1 best
  s0=$(med single "mpib-perf sout (sup_bw 0)" "$z") s1=$(med single "mpib-perf sup (sup_bw 1024)" "$z")
  best=$(awk -v a="$s0" -v b="$s1" 'BEGIN { if (a == "" || b == "") print "-"; else print (a + 0 > b + 0) ? a : b }')
  a=$(amed rig-adaptive slowest_row) r=$(ratio "$a" "$best")
  echo "| … its slowest row (24 MiB: 0.9 to 1.2 s) after 5 s vs the best single rail | $(gbs "$a") vs $(gbs "$best") | $r | ≥ 1 | $(verdict "$r" 1) |"
  a=$(amed rig-slowdown move_ms)
  echo "| … SUP slowed to 40 Mbit/s by tc mid-run: time until the share the agent asks (its status, read four times a second) is within 64 of the new balance (341) | $(ms_shown "$a") | | ≤ 3000 ms | $(at_most "$a" 3000) |"
  a=$(amed rig-two-processes sum) r=$(ratio "$a" "$ib")
  echo "| … two sender processes through one agent: their sum vs two ib_write_bw at once | $(gbs "$a") vs $(gbs "$ib") | $r | ≥ 0.9 | $(verdict "$r" 0.9) |"
  b=$(amed rig-two-processes-static sum) r=$(ratio "$a" "$b")
  echo "| … the same two processes at the fixed split sup_bw $BALANCED_SHOWN (four busy-polling processes on the rig's two emulated CPUs, both ways) | $(gbs "$a") vs $(gbs "$b") | $r | (≥ 0.95) | $(verdict "$r" 0.95) |"
}

# Several fused devices at once (scripts/lib/perf/devices.sh).
device_verdicts() {
  local a b r pairs
  [ -n "$(amed pairs2 slowest_device)" ] || return 0
  for pairs in 2 4; do
    a=$(amed "pairs$pairs" slowest_device) b=$(amed "pairs$pairs" rails_sum) r=$(ratio "$a" "$b")
    echo "| $pairs devices (NIC pairs) at once, loopback 1 + 2 GB/s per pair, sup_bw 683: the slowest device vs one device's rails each alone, summed | $(gbs "$a") vs $(gbs "$b") | $r | ≥ 0.95 | $(verdict "$r" 0.95) |"
  done
  b=$(amed shared static512)
  a=$(amed shared capacity) r=$(ratio "$a" "$b")
  echo "| 2 devices sharing one SUP NIC (SOUT 1 + 1 GB/s, SUP 2 GB/s): agent \`capacity\`, total after 2 s vs the best static split (512) | $(gbs "$a") vs $(gbs "$b") | $r | ≥ 0.95 | $(verdict "$r" 0.95) |"
  a=$(amed shared adaptive) r=$(ratio "$a" "$b")
  echo "| … agent \`adaptive\` (each flow's loop on its own measured rates), vs the same | $(gbs "$a") vs $(gbs "$b") | $r | (reported) | |"
  a=$(amed shared static683) r=$(ratio "$a" "$b")
  echo "| … the split each device's rails alone would give (683), vs the same | $(gbs "$a") vs $(gbs "$b") | $r | (reported) | |"
}

# Collectives over many ranks in one process (scripts/lib/perf/ranks.sh): the bytes all ranks sent
# per second against the SUP rail they all share (vanilla intra-island), reported.
ranks_verdicts() {
  local a r
  [ -n "$(amed ranks-alltoall12 wire)" ] || return 0
  a=$(amed ranks-alltoall12 wire) r=$(ratio "$a" 4)
  echo "| \`mpib-ranks\` all-to-all over 12 ranks in one process (132 connections each way, set up in one batch), loopback: the bytes all ranks sent per second vs the SUP rail (4 GB/s) they share | $(gbs "$a") vs 4.000 GB/s | $r | (reported) | |"
  a=$(amed ranks-allreduce8 wire) r=$(ratio "$a" 4)
  echo "| … ring all-reduce over 8 ranks, 2 channels, the same | $(gbs "$a") vs 4.000 GB/s | $r | (reported) | |"
}

agent_table() {
  echo "| case | metric | median | spread | runs |"
  echo "|---|---|---:|---:|---:|"
  while IFS=$'\t' read -r c m v sp n f; do
    local shown
    if [ "$v" = never ]; then shown="never (within the run)"
    elif [[ $m == *_ms ]]; then shown="$v ms"; else shown=$(gbs "$v"); fi
    local spread="$sp %"; [ "$sp" != - ] || spread=-
    [ "$f" = 0 ] || shown+=" ($f failed)"
    echo "| $c | $m | $shown | $spread | $n |"
  done < "$agent_medians"
}

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

# The scale bench's `row` lines as a table, and its verdicts at the largest N.
scale_field() { # scale_field LINE NAME
  sed -n "s/.* $2=\([^ ]*\).*/\1/p" <<<" $1"
}
scale_table() { # scale_table LOG
  echo "| pairs | connect p50 | p99 | all pairs | resident per pair | descriptors per pair | transfer per pair (all in flight) | \`test\` beside N-1 idle | vs 1 pair | kept after closing | after \`malloc_trim\` |"
  echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  sed -n 's/^row //p' "$1" | while read -r line; do
    f() { scale_field "$line" "$1"; }
    echo "| $(f pairs) | $(f connect_p50_ms) ms | $(f connect_p99_ms) ms | $(f connect_total_s) s | $(f rss_per_pair_kb) kB | $(f fds_per_pair) | $(f transfer_us) µs | $(f test_ns) ns | $(f test_vs_one) | $(f closed_mb) MB | $(f trimmed_mb) MB |"
  done
}
scale_verdicts() {
  local last; last=$(sed -n 's/^row //p' "$work/cost/scale.log" | tail -1)
  [ -n "$last" ] || return 0
  local n p50 ratio rss trimmed base
  n=$(scale_field "$last" pairs); p50=$(scale_field "$last" connect_p50_ms)
  local opened; opened=$(scale_field "$last" opened)
  echo "| Connection pairs opened in one process (loopback) | ${opened:-?} of $n | | all | $([ "${opened:-0}" = "$n" ] && echo met || echo "**gap**") |"
  ratio=$(scale_field "$last" test_vs_one); rss=$(scale_field "$last" rss_per_pair_kb)
  trimmed=$(scale_field "$last" trimmed_mb); base=$(scale_field "$last" baseline_mb)
  verdict() { awk -v v="$1" -v t="$2" 'BEGIN { print (v + 0 <= t + 0) ? "met" : "**gap**" }'; }
  echo "| $n connection pairs in one process (loopback): connect p50 | $p50 ms | | ≤ 1 ms | $(verdict "$p50" 1) |"
  echo "| \`test\` on one pending receive beside $n idle pairs vs beside none | | $ratio | ≤ 1.1 | $(verdict "$ratio" 1.1) |"
  echo "| Resident memory per pair, fabric model included ($n pairs, one transfer each) | $rss kB | | ≤ 300 kB | $(verdict "$rss" 300) |"
  echo "| Kept after closing all $n and \`malloc_trim(0)\` (baseline $base MB) | $trimmed MB | $(awk -v t="$trimmed" -v b="$base" 'BEGIN { printf "%.3f", (b + t) / b }') | ≤ 1.05 | $(verdict "$(awk -v t="$trimmed" -v b="$base" 'BEGIN { print (b + t) / b }')" 1.05) |"
}

registrations_table() {
  echo "| comms | buffer | regMr p50 | p99 | all comms | deregMr p50 | MRs held per NIC (SOUT/SUP) |"
  echo "|---:|---:|---:|---:|---:|---:|---:|"
  sed -n 's/^row //p' "$work/cost/registrations.log" | while read -r line; do
    f() { scale_field "$line" "$1"; }
    echo "| $(f comms) | $(human "$(f size)") | $(f reg_p50_us) µs | $(f reg_p99_us) µs | $(f reg_total_ms) ms | $(f dereg_p50_us) µs | $(f mrs_per_nic) |"
  done
}

connections_table() {
  echo "| connections | claim | file memory | snapshot | snapshot, no mark (3.1 reader) | agent sample | agent sample, no mark | agent CPU at 2,000 samples/s |"
  echo "|---:|---:|---:|---:|---:|---:|---:|---:|"
  sed -n 's/^row //p' "$work/cost/connections.log" | while read -r line; do
    f() { scale_field "$line" "$1"; }
    echo "| $(f connections) | $(f claim_ns) ns | $(f file_kib) KiB | $(f snapshot_us) µs | $(f snapshot_full_us) µs | $(f sample_us) µs | $(f sample_full_us) µs | $(f agent_cpu_percent) % |"
  done
}

batched_verdicts() {
  local last; last=$(sed -n 's/^row //p' "$work/cost/scale-batched.log" | tail -1)
  [ -n "$last" ] || return 0
  local n p50 fds
  n=$(scale_field "$last" pairs); p50=$(scale_field "$last" connect_p50_ms); fds=$(scale_field "$last" fds_per_pair)
  echo "| $n pairs in NCCL's batch order (loopback): connect per pair | $p50 ms | | ≤ 1 ms | $(awk -v v="$p50" 'BEGIN { print (v + 0 <= 1) ? "met" : "**gap**" }') |"
  echo "| $n pairs in NCCL's batch order: descriptors per connected pair | $fds | | < 0.1 | $(awk -v v="$fds" 'BEGIN { print (v + 0 < 0.1) ? "met" : "**gap**" }') |"
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
  [ ! -s "$agent_medians" ] || agent_verdicts
  [ ! -s "$work/rig/records.tsv" ] || rig_verdicts
  [ ! -s "$work/cost/scale.log" ] || scale_verdicts
  [ ! -s "$work/cost/scale-batched.log" ] || batched_verdicts
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
  if [ -s "$agent_medians" ]; then
    echo "## The policy agent"
    echo
    echo "Loopback cases (\`scripts/lib/perf/agent.sh\`): a fresh \`mpib-agent\` (default interval 100 ms) per run, \`mpib-perf\`"
    echo "in advanced mode printing a row every 64 messages of 4 MiB (\`--repeat\`, \`at_ms\`), medians of"
    echo "$reps. \`sum_single\`, \`best_after\` and \`best_single\` are the same rails measured at fixed shares"
    echo "0 and 1024 in the same repetition; \`steady\` the median row after 2 s; \`reach_ms\` the first row"
    echo "at 0.95 of \`sum_single\`; \`recover_ms\` from the first row the slowdown shows in to the first"
    echo "row after the last one under 0.9 of \`best_after\`. The \`rig-*\` cases come from the rig boot"
    echo "(\`scripts/lib/perf/rig.sh\`, shaped rails, one agent at a 500 ms interval for both processes):"
    echo "rows of 24 MiB in 1 MiB messages, \`steady\` the median row after 20 s (\`rig-static\`: the same rows at a fixed"
    echo "683, after 3 s), \`slowest_row\` the slowest row after 5 s, \`move_ms\` from the \`tc\` change to the"
    echo "first status (read four times a second) whose asked share is within 64 of the new balance, \`sum\` two sender processes' medians added (\`rig-two-processes-static\`: the same two at the fixed split)."
    echo
    agent_table
    echo
  fi
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
  if [ -s "$work/cost/scale.log" ]; then
    echo "## Thousands of connections in one process"
    echo
    echo "\`cargo bench --bench scale\`: N connection pairs through the v12 table on the loopback fabric"
    echo "(advanced mode, probes on), one verified 64 KiB transfer on every pair with all in flight,"
    echo "then everything closed; each figure the median over the cycles (what changed and the rig's"
    echo "figures: \"Thousands of connections: what each costs\" below)."
    echo
    scale_table "$work/cost/scale.log"
    echo
  fi
  if [ -s "$work/cost/scale-batched.log" ]; then
    echo "### In NCCL's batch order"
    echo
    echo "\`cargo bench --bench scale -- --order batched\`: the same, with the pairs set up as NCCL sets up a"
    echo "batch (\`ncclTransportP2pSetup\`: every \`listen\` first, then \`connect\` and \`accept\` polled"
    echo "round-robin, \`closeListen\` after each \`accept\`); a pair's connect time is the batch's over its pairs."
    echo
    scale_table "$work/cost/scale-batched.log"
    echo
  fi
  if [ -s "$work/cost/registrations.log" ]; then
    echo "## One buffer registered through many comms"
    echo
    echo "\`cargo bench --bench registrations\`: one buffer \`regMr\`'d through every comm of N/2 pairs"
    echo "(send and receive) on the loopback fabric, then \`deregMr\`'d; medians over the rounds. The MRs"
    echo "are what the probes count on each NIC while every handle is live (one per page range)."
    echo
    registrations_table
    echo
  fi
  if [ -s "$work/cost/connections.log" ]; then
    echo "## The connection table at NCCL's counts"
    echo
    echo "\`cargo bench -p mpib-probes --bench connections\`: N connections claimed in a row in a fresh probes"
    echo "file under /dev/shm (as NCCL's setup makes them), then what a reader pays per look: \`snapshot\`"
    echo "(the collector and \`mpib-top\`, once an interval) and \`sample_in_flight\` (the agent, every"
    echo "500 µs), up to the table's high-water mark and, beside it, over every one of the 16,384 slots"
    echo "as a 3.1 reader does; the file's memory is its allocated blocks. Medians over the rounds."
    echo
    connections_table
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
