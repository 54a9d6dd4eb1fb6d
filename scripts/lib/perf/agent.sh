#!/bin/bash
# The policy-agent half of scripts/perf, on the loopback rate model (host side):
#
#   scripts/lib/perf/agent.sh OUT BIN REPS
#
# Each repetition runs, with a fresh mpib-agent (its own hint file, socket and probes directory):
#   independent  rails of 2 and 4 GB/s: SOUT alone and SUP alone (a test agent's fixed shares),
#                then `adaptive` from all-SOUT as a time series (mpib-perf --repeat): when it first
#                reaches 0.95 of the two single rails summed, and its median after 2 s
#   degraded     the same start, SUP falling to 0.5 GB/s at 3 s (a MPIB_LOOPBACK_RAILS phase):
#                the time from the first slowed row to the first row after the last one below
#                0.9 of the new best (SOUT alone + the slowed SUP alone, measured too), and the
#                median from 2 s after the slowdown
#   mixed        the mixing penalty (mixed=1.5GB/s): `adaptive`'s median over the last half of
#                its series against the best single rail, with `capacity` and a static 512 beside
#   comms8       8 connections in one process (mpib-perf --comms 8) through one agent, rails of 2
#                and 4 GB/s: the aggregate's median after 2 s against the single rails summed
# Records (tab-separated) in OUT/records.tsv: case, metric, rep, value (GB/s, or ms for *_ms;
# "never" when the run ended first: a missed target, not a failed measurement).
set -uo pipefail
out=$1 bin=$2 reps=${3:-5}
records=$out/records.tsv logs=$out/logs
mkdir -p "$logs"
: > "$records"
size=4194304
rails="sout=2GB/s,sup=4GB/s,latency=5us"

record() { printf '%s\t%s\t%s\t%s\n' "$@" >> "$records"; echo "agent perf: $*"; }

# perf LOG [ARGS...]: mpib-perf on the loopback fabric with the given environment (caller's);
# CSV rows to LOG. Returns its status.
perf() {
  local log=$1
  shift
  timeout 300 "$bin/mpib-perf" --min-size "$size" --max-size "$size" --csv "$@" \
    > "$log" 2> "$log.err"
}

# column LOG NAME [FILTER]: the values of column NAME, one per row.
column() {
  awk -F, -v name="$2" 'NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next } { print $(col[name]) }' "$1"
}

# single LOG [ARGS...]: "SOUT SUP" GB/s, each rail alone (a test agent's fixed shares 0, 1024).
single() {
  local log=$1
  shift
  MPIB_FABRIC=loopback MPIB_LOOPBACK_RAILS=$RAILS perf "$log" --sup-bw 0,1024 --warmup 4 "$@" ||
    { echo "fail fail"; return; }
  column "$log" gbps | tr '\n' ' '
}

# agent_perf POLICY LOG [ARGS...]: mpib-perf in advanced mode against a fresh mpib-agent.
. "$(dirname "$0")/with-agent.sh"
agent_perf() {
  local policy=$1 log=$2
  shift 2
  MPIB_FABRIC=loopback MPIB_LOOPBACK_RAILS=$RAILS with_agent "$policy" "$log" perf "$log" --warmup 0 "$@"
}

# series LOG: "at_ms gbps" per row.
series() { paste -d' ' <(column "$1" at_ms) <(column "$1" gbps); }

# first_at LOG THRESHOLD [AFTER_MS]: the first at_ms (after AFTER_MS) whose GB/s >= THRESHOLD.
first_at() {
  series "$1" | awk -v t="$2" -v after="${3:-0}" '$1 + 0 >= after + 0 && $2 + 0 >= t + 0 { print $1; found = 1; exit }
                                                END { if (!found) print "never" }'
}

# median_after LOG FROM_MS [TO_MS]: the median GB/s of the rows from FROM_MS (to TO_MS).
median_after() {
  series "$1" | awk -v from="$2" -v to="${3:-1e18}" '$1 + 0 >= from + 0 && $1 + 0 <= to + 0 { print $2 }' |
    sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "fail"; else print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

sum() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "fail" || b == "fail") print "fail"; else printf "%.6f", a + b }'; }
max() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "fail" || b == "fail") print "fail"; else print (a + 0 > b + 0) ? a : b }'; }
times() { awk -v a="$1" -v f="$2" 'BEGIN { if (a == "fail") print "fail"; else printf "%.6f", a * f }'; }

for ((rep = 1; rep <= reps; rep++)); do
  # ---- independent rails, adaptive from all-SOUT
  RAILS=$rails
  read -r s0 s1 < <(single "$logs/independent-single-$rep.csv" --iters 64)
  sum_single=$(sum "$s0" "$s1")
  record independent sum_single "$rep" "$sum_single"
  log=$logs/independent-adaptive-$rep.csv
  if agent_perf adaptive "$log" --iters 64 --repeat 100; then
    record independent reach_ms "$rep" "$(first_at "$log" "$(times "$sum_single" 0.95)")"
    record independent steady "$rep" "$(median_after "$log" 2000)"
  else
    record independent reach_ms "$rep" fail
  fi

  # ---- SUP degraded to 0.5 GB/s at 3 s
  RAILS="$rails,sup=0.5GB/s"
  read -r d0 d1 < <(single "$logs/degraded-single-$rep.csv" --iters 32)
  best_after=$(sum "$d0" "$d1")
  record degraded best_after "$rep" "$best_after"
  RAILS="$rails;3s:sup=0.5GB/s"
  log=$logs/degraded-adaptive-$rep.csv
  if agent_perf adaptive "$log" --iters 64 --repeat 130; then
    before=$(median_after "$log" 1500 2800)
    # The first row the slowdown shows in, then the first at 0.9 of the new best.
    dropped=$(series "$log" | awk -v b="$before" '$1 + 0 >= 2000 && $2 + 0 < 0.8 * b { print $1; found = 1; exit }
                                                  END { if (!found) print "fail" }')
    # Recovered: the first row after the last one below 0.9 of the new best.
    back=$(series "$log" | awk -v d="$dropped" -v t="$(times "$best_after" 0.9)" '
      d == "fail" || t == "fail" { exit }
      $1 + 0 >= d + 0 { if ($2 + 0 < t + 0) { bad = 1; ok = "" } else if (ok == "") ok = $1 }
      END { print (ok == "") ? "never" : ok }')
    record degraded recover_ms "$rep" "$(awk -v a="$dropped" -v b="$back" 'BEGIN { if (a == "fail" || b == "fail") print "fail"; else printf "%.0f", b - a }')"
    record degraded steady_after "$rep" "$(median_after "$log" "$(awk -v d="$dropped" 'BEGIN { print d + 2000 }')")"
  else
    record degraded recover_ms "$rep" fail
  fi

  # ---- the mixing penalty: adaptive, capacity, static 512
  RAILS="$rails,mixed=1.5GB/s"
  read -r m0 m1 < <(single "$logs/mixed-single-$rep.csv" --iters 32)
  record mixed best_single "$rep" "$(max "$m0" "$m1")"
  for policy in adaptive capacity; do
    log=$logs/mixed-$policy-$rep.csv
    if agent_perf "$policy" "$log" --iters 64 --repeat 60; then
      last=$(column "$log" at_ms | tail -n 1)
      record mixed "$policy" "$rep" "$(median_after "$log" "$(awk -v l="$last" 'BEGIN { print l / 2 }')")"
    else
      record mixed "$policy" "$rep" fail
    fi
  done
  log=$logs/mixed-static512-$rep.csv
  if MPIB_FABRIC=loopback MPIB_LOOPBACK_RAILS=$RAILS perf "$log" --sup-bw 512 --warmup 4 --iters 64; then
    record mixed static512 "$rep" "$(column "$log" gbps | tail -n 1)"
  else
    record mixed static512 "$rep" fail
  fi

  # ---- 8 connections through one agent
  RAILS=$rails
  read -r c0 c1 < <(single "$logs/comms8-single-$rep.csv" --comms 8 --iters 8)
  sum8=$(sum "$c0" "$c1")
  record comms8 sum_single "$rep" "$sum8"
  log=$logs/comms8-adaptive-$rep.csv
  if agent_perf adaptive "$log" --comms 8 --iters 8 --repeat 80; then
    record comms8 reach_ms "$rep" "$(first_at "$log" "$(times "$sum8" 0.95)")"
    record comms8 steady "$rep" "$(median_after "$log" 2000)"
  else
    record comms8 reach_ms "$rep" fail
  fi
done
echo "agent perf: done"
