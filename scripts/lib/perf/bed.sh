#!/usr/bin/env bash
# scripts/lib/perf/bed.sh WORK BIN REPS [quick]: the tcp fabric's figures on the two-host bed of
# network namespaces (mpib-bed: the harness's bed, driver/src/harness/bed.rs), medians of REPS repetitions, side by side in one run:
#   rail      one rail (SOUT) shaped to 2 Gbit/s by tbf: mpib-perf (inter-island: every byte on
#             SOUT, over its 2 QPs) vs iperf3 with as many streams, at 1, 4 and 16 MiB
#   ceiling   the same unshaped: the fabric's own ceiling against iperf3's on this machine
#   split     SOUT 1 Gbit/s + SUP 2 Gbit/s, advanced mode, mpib-perf's test agent sweeping the SUP
#             share; the rate-proportional split (683/1024) against the sum of the two rails alone
#   agent     the same rails, 2 and 4 sender processes (each to its own receiver) at once through
#             one mpib-agent (adaptive policy), against the same processes at the fixed split 683:
#             the sum of their rates over the time all ran settled (from 8 s on, wall clock)
#   converge  (first repetition) one pair through a fresh mpib-agent, SUP slowed from 2 to 0.5
#             Gbit/s 12 s in: the share the agent asks (its status, 4 times a second), the share
#             the bytes took and the throughput over time, plotted (WORK/bed-converge.png)
#   ranks     the same rails, mpib-ranks' ring all-reduce of 2 ranks (one per host, advanced mode
#             through mpib-agent's capacity policy told the rails' rates): its bus bandwidth per size
#             against the sum of the two rails alone (target ≥ 0.9 at ≥ 16 MiB)
#   failover  the same rails at the split 683, SUP cut about 2 s into a run, 4 times a repetition
#             each way (MPIB_IB_TIMEOUT=14 with 6 retries: a 0.47 s retry budget): its link set
#             down (a port event) or every packet host A sends on it dropped (tbf; no event, the
#             QPs' retries find it), and dropped again with the progress watchdog on
#             (MPIB_FAILOVER_WATCHDOG_MS=100): the time the cut cost the stream (the row across it
#             over a row after it), and SOUT alone afterwards against SOUT alone from the start
# Writes WORK/records.tsv (section, label, size, rep, GB/s, p50 us, -), WORK/bed.md (a Markdown
# section for docs/PERFORMANCE.md) and WORK/bed-split.png (gnuplot). Needs root (namespaces), iperf3
# and gnuplot (Debian packages; scripts/perf installs them).
set -uo pipefail  # no -e: the bed helpers test their own failures (a qdisc that is not there)
work=$1 bin=$2 reps=$3 quick=${4:-}
here=$(cd "$(dirname "$(readlink -f "$0")")" && pwd)
root=$(cd "$here/../../.." && pwd)
NA=mpib_perf_a NB=mpib_perf_b
# The bed is the harness's (two hosts back to back, prefix mpib_perf: namespaces $NA and $NB).
bed() { "$bin/mpib-bed" --prefix mpib_perf "$@"; }
teardown() { bed down; }
shape() { bed shape "$1" "${2:-0}"; } # shape RAIL RATE: tbf on both ends; empty or 0: unshaped
mkdir -p "$work"
: > "$work/records.tsv"
rm -f "$work/failures.log"
tmp=$(mktemp -d /tmp/mpib_perf.XXXXXX)
cleanup() { teardown; rm -rf "$tmp"; }
trap cleanup EXIT
teardown
bed up || { echo "bed perf: cannot build the bed (root, iproute2?)" >&2; exit 1; }
for v in $(compgen -e); do [[ $v != MPIB_* ]] || unset "$v"; done
common=(MPIB_FABRIC=tcp MPIB_PROBES=0 MPIB_AGENT_SOCKET=$tmp/agent.sock MPIB_HINT_PATH=$tmp/hints)
A=("${common[@]}" MPIB_HCA_SOUT=veth_a0 MPIB_HCA_SUP=veth_a1 MPIB_OOB_ADDR=10.100.0.1)
B=("${common[@]}" MPIB_HCA_SOUT=veth_b0 MPIB_HCA_SUP=veth_b1 MPIB_OOB_ADDR=10.100.0.2)
sizes=(1048576 4194304 16777216)
splits=0,256,512,683,768,1024
[ -z "$quick" ] || { sizes=(4194304); splits=0,683,1024; }

# perf CSV EXTRA-ENV MPIB-PERF-ARGS...: one two-process mpib-perf run (receiver in B, sender in A).
port=6100
perf() {
  local csv=$1 extra=$2
  shift 2
  port=$((port + 1))
  # shellcheck disable=SC2086  # $extra is a list of K=V words
  ip netns exec "$NB" env "${B[@]}" $extra timeout 300 "$bin/mpib-perf" --listen "10.100.0.2:$port" \
    > "$csv.listen" 2>&1 &
  local listener=$!
  # shellcheck disable=SC2086
  ip netns exec "$NA" env "${A[@]}" $extra timeout 300 "$bin/mpib-perf" --peer "10.100.0.2:$port" \
    --csv "$@" > "$csv" 2> "$csv.err" ||
    { echo "bed perf: mpib-perf failed: $(tail -n 3 "$csv.err")" >&2; kill "$listener" 2> /dev/null; return 1; }
  wait "$listener" || true
}
# iperf STREAMS RAIL: GB/s of iperf3 with STREAMS streams from A to B over rail RAIL (3 s).
iperf() {
  local streams=$1 rail=$2
  ip netns exec "$NB" iperf3 -s -1 -B "10.100.$rail.2" -p $((5300 + rail)) > /dev/null 2>&1 &
  local server=$!
  sleep 0.3
  ip netns exec "$NA" iperf3 -c "10.100.$rail.2" -B "10.100.$rail.1" -p $((5300 + rail)) \
    -P "$streams" -t 3 -J 2> /dev/null |
    python3 -c 'import json, sys; print("%.4f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"] / 8e9))'
  wait "$server" || true
}
# record SECTION LABEL CSV REP: mpib-perf rows as records (label "... sup_bw N" when swept).
# series LOG PORT EXTRA-ENV ARGS...: one pair as a time series (a CSV row per ITERS messages).
series() {
  local log=$1 p=$2 extra=$3
  shift 3
  # shellcheck disable=SC2086  # $extra is a list of K=V words
  ip netns exec "$NB" env "${B[@]}" $extra timeout 300 "$bin/mpib-perf" --listen "10.100.0.2:$p" \
    > "$log.listen" 2>&1 &
  local listener=$!
  # shellcheck disable=SC2086
  ip netns exec "$NA" env "${A[@]}" $extra timeout 300 "$bin/mpib-perf" --peer "10.100.0.2:$p" \
    --csv "$@" > "$log" 2> "$log.err"
  local rc=$?
  wait "$listener"
  return "$rc"
}
# why TEXT: a failed measurement's cause, on stderr and in WORK/failures.log, which scripts/perf
# prints again last (CI keeps only the tail of the output).
why() { echo "bed perf: $*" | tee -a "$work/failures.log" >&2; }
# together CSV...: the sum of the processes' rates over the window in which all of them ran
# settled, on the wall clock (unix_ms: each process's at_ms counts from its own first row, and
# a process starved at the start begins its rows seconds late). The window opens $settle_ms
# after the last process's first row started and closes when the first process's last row ended;
# each row's bytes count in proportion to its time inside it. "fail" (and why, on stderr) when
# the window is under a second.
together() {
  awk -F, -v settle="$settle_ms" '
    FNR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; files++; next }
    { n++; file[n] = files; end[n] = $(c["unix_ms"]) + 0; span[n] = $(c["time_us"]) / 1000
      bytes[n] = $(c["bytes"]) + 0
      if (!(files in first) || end[n] - span[n] < first[files]) first[files] = end[n] - span[n]
      if (!(files in last) || end[n] > last[files]) last[files] = end[n] }
    END {
      for (f = 1; f <= files; f++) {
        if (!(f in first)) { print "process " f " of " files " printed no rows" > "/dev/stderr"; print "fail"; exit }
        if (f == 1 || first[f] > start) start = first[f]
        if (f == 1 || last[f] < stop) stop = last[f]
      }
      start += settle
      if (stop - start < 1000) {
        printf "the processes ran settled together %.0f ms, under a second\n", stop - start > "/dev/stderr"
        print "fail"; exit
      }
      for (j = 1; j <= n; j++) {
        from = end[j] - span[j]; to = end[j]
        if (from < start) from = start
        if (to > stop) to = stop
        if (to > from && span[j] > 0) moved += bytes[j] * (to - from) / span[j]
      }
      printf "%.6f\n", moved / (stop - start) / 1e6
    }' "$@" 2> "$tmp/together.err"
  [ ! -s "$tmp/together.err" ] || why "$(cat "$tmp/together.err")"
}
# processes N HOW REP: N sender processes at once (HOW: adaptive, through the one mpib-agent; or
# static, each at the fixed split 683 with its own test agent); records the sum of their rates.
processes() {
  local n=$1 how=$2 rep=$3 i jobs=() csvs=() extra args=() sum
  extra="MPIB_MODE=1 MPIB_ISLAND_PREFIX_LEN=24 MPIB_PROBES=1 MPIB_PROBES_DIR=$tmp/probes"
  [ "$how" = adaptive ] || args=(--sup-bw 683)
  for ((i = 1; i <= n; i++)); do
    port=$((port + 1))
    csvs+=("$work/agent-$how-$n-$i-$rep.csv")
    series "${csvs[-1]}" "$port" "$extra" --min-size 4194304 \
      --max-size 4194304 --iters 8 --warmup 0 --repeat $((agent_rows / n)) "${args[@]}" &
    jobs+=($!)
  done
  local failed=no
  for i in "${!jobs[@]}"; do
    wait "${jobs[$i]}" ||
      { why "$how $n processes: process $((i + 1)) failed: $(tail -n 3 "${csvs[$i]}.err")"; failed=yes; }
  done
  sum=$(together "${csvs[@]}")
  [ "$failed" = no ] && [ -n "$sum" ] || sum=fail
  printf 'bed-agent\t%s %d processes\t4194304\t%s\t%s\t-\t-\n' "$how" "$n" "$rep" "$sum" >> "$work/records.tsv"
}
# failover_cut REP I HOW: one run at the split 683 whose SUP rail is cut about 2 s after it
# starts (HOW: down, its link set down; drop, every packet host A sends on it dropped; watchdog,
# dropped with the progress watchdog at 100 ms) and mended after it; records the time lost to
# the cut and the rates before and after.
failover_cut() {
  local rep=$1 i=$2 how=$3 csv=$work/failover-$3-$1-$2.csv cutter label env=$failover_env
  port=$((port + 1))
  local cut_at=$csv.cut mode=one-way
  rm -f "$cut_at"
  if [ "$how" = down ]; then
    label="link down" mode=down
  else
    label="packets dropped"
    [ "$how" = drop ] || { label="packets dropped, watchdog"; env+=" MPIB_FAILOVER_WATCHDOG_MS=100"; }
  fi
  # The wall clock (ms) once the cut is made: the rows (mpib-perf's unix_ms) are matched to it.
  ( sleep 2; bed cut 1 "$mode" && date +%s%3N > "$cut_at" ) &
  cutter=$!
  series "$csv" "$port" "$env" --min-size 4194304 --max-size 4194304 --iters 2 \
    --warmup 0 --repeat "$failover_rows" --sup-bw 683 || echo "bed perf: failover run $rep.$i failed" >&2
  wait "$cutter"
  bed restore 1
  shape 1 2gbit
  # Rows of 8 MiB. The row the cut stalls is the longest of the three that end first after the
  # cut (the cut may land as a row ends); the rows two past it run on SOUT alone. A cut that
  # missed the run (or was not made) is a failed measurement, recorded as such.
  awk -F, -v r="$rep.$i" -v how="$label" -v cut="$(cat "$cut_at" 2> /dev/null)" \
    'NR == 1 { for (j = 1; j <= NF; j++) c[$j] = j; next }
    { n++; at[n] = $(c["at_ms"]) + 0; rate[n] = $(c["gbps"]) + 0; end[n] = $(c["unix_ms"]) + 0 }
    function median(list, k,    v, m, a, b, t) {
      m = split(list, v, " ")
      for (a = 2; a <= m; a++) { t = v[a]; for (b = a - 1; b >= 1 && v[b] + 0 > t + 0; b--) v[b + 1] = v[b]; v[b + 1] = t }
      return (m % 2) ? v[(m + 1) / 2] : (v[m / 2] + v[m / 2 + 1]) / 2
    }
    function failed(why) {
      print "bed perf: failover " how " " r ": " why > "/dev/stderr"
      printf "bed-failover\ttime lost ms, %s\t-\t%s\tfail\t-\t-\n", how, r
      exit
    }
    END {
      if (cut == "") failed("the cut was not made")
      for (j = 2; j <= n; j++) d[j] = at[j] - at[j - 1]
      for (j = 2; j <= n && end[j] < cut + 0; j++) ;
      for (k = j; j <= n && j < k + 3; j++) if (d[j] > d[k]) k = j
      if (k < 4 || n - k < 4) failed("the cut missed the run (row " k " of " n ")")
      for (j = 2; j < k; j++) before = before " " rate[j]
      for (j = k + 2; j <= n; j++) { after = after " " rate[j]; spans = spans " " d[j] }
      printf "bed-failover\tsplit before the cut\t-\t%s\t%.4f\t-\t-\n", r, median(before)
      printf "bed-failover\tSOUT alone after it\t-\t%s\t%.4f\t-\t-\n", r, median(after)
      printf "bed-failover\ttime lost ms, %s\t-\t%s\t%.1f\t-\t-\n", how, r, d[k] - median(spans)
    }' "$csv" >> "$work/records.tsv"
}
# failover REP: $cuts cuts, then SOUT alone from the start (sup_bw 0) for the survivor's rate.
failover() {
  local rep=$1 i
  for ((i = 1; i <= cuts; i++)); do
    failover_cut "$rep" "$i" down
    failover_cut "$rep" "$i" drop
    failover_cut "$rep" "$i" watchdog
  done
  port=$((port + 1))
  series "$work/survivor-$rep.csv" "$port" "$failover_env" --min-size 4194304 --max-size 4194304 \
    --iters 2 --warmup 0 --repeat $((failover_rows / 2)) --sup-bw 0 || echo "bed perf: the SOUT-alone run failed" >&2
  awk -F, -v r="$rep" 'NR == 1 { for (j = 1; j <= NF; j++) c[$j] = j; next } NR > 2 { print $(c["gbps"]) }' \
    "$work/survivor-$rep.csv" | sort -g | awk -v r="$rep" '{ v[++n] = $1 }
      END { if (n) printf "bed-failover\tSOUT alone from the start\t-\t%s\t%.4f\t-\t-\n", r, (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2 }' \
    >> "$work/records.tsv"
}
failover_env="MPIB_MODE=1 MPIB_ISLAND_PREFIX_LEN=24 MPIB_IB_TIMEOUT=14 MPIB_IB_RETRY_CNT=6"
cuts=4 failover_rows=160
[ -z "$quick" ] || { cuts=1 failover_rows=120; }

# Rows of 32 MiB, shared out so that every case lasts about 17 s (the rails move 0.36 GB/s in all);
# the rates count from 8 s on, once the agent has settled (it decides every 500 ms).
agent_rows=180 settle_ms=8000 converge_rows=450
[ -z "$quick" ] || { agent_rows=80 settle_ms=3000 converge_rows=150; }

# start_agent REP: a fresh mpib-agent (adaptive, deciding every 500 ms) for both hosts' processes.
start_agent() {
  ip netns exec "$NA" "$bin/mpib-agent" --policy adaptive --interval-ms 500 \
    --hint-path "$tmp/hints" --socket "$tmp/agent.sock" --probes-dir "$tmp/probes" \
    --metrics-listen off > "$work/agent-$1.log" 2>&1 &
  agent=$!
  for _ in $(seq 100); do [ -S "$tmp/agent.sock" ] && break; sleep 0.1; done
}
stop_agent() { kill "$agent" 2> /dev/null; wait "$agent" 2> /dev/null; rm -f "$tmp/agent.sock"; }

# ranks REP: mpib-ranks, a ring all-reduce of 2 ranks (rank 0 on host A, rank 1 on host B, 2
# channels) in advanced mode through one mpib-agent whose capacity policy knows the rails' rates
# (SOUT 1 and SUP 2 Gbit/s: the split 683); records the bus bandwidth per size (for 2 ranks the
# bytes each rank sends per second, each way at once).
ranks_all_reduce() {
  local rep=$1 rank ns host pids=() dir=$tmp/ranks-$rep ok=yes
  mkdir -p "$dir"
  printf 'default = "capacity"\n[rates]\nsout_gbps = 1.0\nsup_gbps = 2.0\n' > "$tmp/capacity.toml"
  ip netns exec "$NA" "$bin/mpib-agent" --config "$tmp/capacity.toml" --hint-path "$tmp/hints" \
    --socket "$tmp/agent.sock" --probes-dir "$tmp/probes" --metrics-listen off \
    > "$work/ranks-agent-$rep.log" 2>&1 &
  agent=$!
  for _ in $(seq 100); do [ -S "$tmp/agent.sock" ] && break; sleep 0.1; done
  for rank in 0 1; do
    if [ "$rank" = 0 ]; then ns=$NA host=("${A[@]}"); else ns=$NB host=("${B[@]}"); fi
    ip netns exec "$ns" env "${host[@]}" MPIB_MODE=1 MPIB_ISLAND_PREFIX_LEN=24 MPIB_PROBES=1 \
      MPIB_PROBES_DIR="$tmp/probes" timeout 300 "$bin/mpib-ranks" --ranks 2 --rank "$rank" \
      --rendezvous "$dir" --channels 2 "${ranks_sizes[@]}" --warmup 2 --timeout 120 \
      > "$work/ranks-$rep-$rank.log" 2>&1 &
    pids+=($!)
  done
  for rank in 0 1; do
    wait "${pids[$rank]}" || { why "all-reduce rank $rank failed: $(tail -n 2 "$work/ranks-$rep-$rank.log")"; ok=no; }
  done
  stop_agent
  awk -F'\t' -v r="$rep" -v ok="$ok" '{ n = split($0, f, " ") }
    n == 8 && f[3] == "uint32" { printf "bed-ranks\tall-reduce busbw, 2 ranks\t%s\t%s\t%s\t-\t-\n", f[1], r, (ok == "yes" ? f[7] : "fail") }' \
    "$work/ranks-$rep-0.log" >> "$work/records.tsv"
}
ranks_sizes=(--min-size 1M --max-size 64M --step-factor 4 --iters 5)
[ -z "$quick" ] || ranks_sizes=(--min-size 4M --max-size 16M --step-factor 4 --iters 3)

# converge: one pair through a fresh agent; SUP slowed 12 s in (the balance moves from 683 to 341).
converge() {
  local extra="MPIB_MODE=1 MPIB_ISLAND_PREFIX_LEN=24 MPIB_PROBES=1 MPIB_PROBES_DIR=$tmp/probes"
  start_agent converge
  ( while kill -0 "$agent" 2> /dev/null; do
      date +%s.%N; "$bin/mpib-agent" status --control "$tmp/agent.control" 2>&1 | tail -n +4
      sleep 0.25
    done ) > "$work/converge-status.log" 2>&1 &
  local watcher=$!
  date +%s.%N > "$work/converge.start"
  ( sleep 12; shape 1 500mbit; date +%s.%N > "$work/converge.slowed" ) &
  local slower=$!
  port=$((port + 1))
  series "$work/converge.csv" "$port" "$extra" --min-size 4194304 --max-size 4194304 --iters 4 \
    --warmup 0 --repeat "$converge_rows" || echo "bed perf: the convergence series failed" >&2
  wait "$slower"
  stop_agent
  wait "$watcher"
  shape 1 2gbit
}

record() {
  awk -F, -v s="$1" -v l="$2" -v r="$4" 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
    { printf "%s\t%s%s\t%s\t%s\t%s\t%s\t-\n", s, l, (l ~ /sup_bw$/ ? " " $(c["sup_bw"]) : ""),
             $(c["size"]), r, $(c["gbps"]), $(c["p50_us"]) }' "$3" >> "$work/records.tsv"
}

# Iterations: mpib-perf's own choice (about 256 MiB per size), so every row lasts a second or more.
perf_args=(--min-size "${sizes[0]}" --max-size "${sizes[-1]}" --step-factor 4 --warmup 4)
# PERF_ONLY=agent, ranks or failover: those cases alone (a development shortcut, as in
# scripts/lib/perf/rig.sh).
only=${PERF_ONLY:-}
for ((rep = 1; rep <= reps; rep++)); do
  if [ "$only" = failover ]; then
    shape 0 1gbit && shape 1 2gbit && failover "$rep"
    continue
  fi
  if [ "$only" = ranks ]; then
    shape 0 1gbit && shape 1 2gbit || exit 1
    perf "$work/split-$rep.csv" "MPIB_MODE=1 MPIB_ISLAND_PREFIX_LEN=24" --min-size 4194304 \
      --max-size 4194304 --warmup 4 --iters 64 --sup-bw 0,1024 || exit 1
    record bed-split "sup_bw" "$work/split-$rep.csv" "$rep"
    mkdir -p "$tmp/probes"
    ranks_all_reduce "$rep"
    continue
  fi
  for section in rail ceiling; do
    [ "$only" != agent ] || continue
    if [ $section = rail ]; then shape 0 2gbit; else shape 0 ''; fi
    shape 1 ''
    perf "$work/$section-$rep.csv" "MPIB_ISLAND_PREFIX_LEN=32" "${perf_args[@]}" || exit 1
    record "bed-$section" "mpib-perf SOUT" "$work/$section-$rep.csv" "$rep"
    printf 'bed-%s\tiperf3 -P 2\t-\t%s\t%s\t-\t-\n' $section "$rep" "$(iperf 2 0)" >> "$work/records.tsv"
    printf 'bed-%s\tiperf3 -P 1\t-\t%s\t%s\t-\t-\n' $section "$rep" "$(iperf 1 0)" >> "$work/records.tsv"
  done
  shape 0 1gbit && shape 1 2gbit || { echo "bed perf: tc cannot shape the rails" >&2; exit 1; }
  [ "$only" = agent ] || perf "$work/split-$rep.csv" "MPIB_MODE=1 MPIB_ISLAND_PREFIX_LEN=24" --min-size 4194304 \
    --max-size 4194304 --warmup 4 --iters 64 --sup-bw "$splits" || exit 1
  [ "$only" = agent ] || record bed-split "sup_bw" "$work/split-$rep.csv" "$rep"
  mkdir -p "$tmp/probes"
  start_agent "$rep"
  for n in 2 4; do
    processes "$n" adaptive "$rep"
    processes "$n" static "$rep"
  done
  stop_agent
  [ "$rep" != 1 ] || converge
  [ "$only" = failover ] || ranks_all_reduce "$rep"
  [ "$only" = agent ] || failover "$rep"
  echo "bed perf: repetition $rep of $reps done"
done
"$here/bed-render.sh" "$work" "$reps"
