#!/bin/bash
# Collectives over many ranks in one process on the loopback rate model, host side:
#
#   scripts/lib/perf/ranks.sh OUT BIN REPS [quick]
#
# Each repetition runs mpib-ranks (every rank in this one process, driven by one proxy loop) on
# rails of 2 and 4 GB/s, vanilla intra-island (every byte on SUP, a rail all ranks share):
#   ranks-alltoall12   all-to-all over 12 ranks, 1 channel: 132 send and 132 receive connections
#                      in one process, what NCCL's all-to-all opens per process for some 64 ranks
#                      (about two per peer), 48 MiB per rank (12 MiB with quick)
#   ranks-allreduce8   ring all-reduce over 8 ranks, 2 channels, 64 MiB per rank (16 MiB)
# Records (tab-separated) appended to OUT/records.tsv: case, `wire`, rep, value: the bytes all the
# ranks sent per second (busbw × ranks, GB/s), against the SUP rail's 4 GB/s; "fail" when the run
# failed (its log in OUT/logs).
set -uo pipefail
out=$1 bin=$2 reps=${3:-5} quick=${4:-}
records=$out/records.tsv logs=$out/logs
mkdir -p "$logs"
touch "$records"
rails="sout=2GB/s,sup=4GB/s,latency=5us"
alltoall=48M allreduce=64M
[ -z "$quick" ] || { alltoall=12M allreduce=16M; }

# run CASE RANKS SIZE ARGS...: one mpib-ranks run; records the ranks' bytes per second.
run() {
  local case=$1 ranks=$2 size=$3 rep=$4 log
  shift 4
  log=$logs/$case-$rep.log
  if MPIB_FABRIC=loopback MPIB_LOOPBACK_RAILS=$rails timeout 600 "$bin/mpib-ranks" --ranks "$ranks" \
       --min-size "$size" --max-size "$size" --iters 3 --warmup 1 "$@" > "$log" 2>&1; then
    value=$(awk -v n="$ranks" '$3 == "uint32" { v = $7 * n } END { if (v == "") print "fail"; else printf "%.4f", v }' "$log")
  else
    value=fail
  fi
  printf '%s\twire\t%s\t%s\n' "$case" "$rep" "$value" >> "$records"
  echo "ranks perf: $case wire $rep $value"
}

for ((rep = 1; rep <= reps; rep++)); do
  run ranks-alltoall12 12 "$alltoall" "$rep" --op alltoall --channels 1
  run ranks-allreduce8 8 "$allreduce" "$rep" --op allreduce --channels 2
done
echo "ranks perf: done"
