#!/bin/bash
# Several fused devices (NIC pairs) of one node moving at once, on the loopback rate model (host
# side; every NIC its own wire, `MPIB_LOOPBACK_RAILS`):
#
#   scripts/lib/perf/devices.sh OUT BIN REPS
#
# Each repetition runs:
#   pairs2, pairs4  2 and 4 devices (SOUT loop0, loop2, ..., SUP loop1, loop3, ...), rails of 1 and
#                   2 GB/s, one connection per device (mpib-perf --dev 0,1[,2,3]) at the static
#                   share 683 (a test agent): the slowest device's GB/s against one device's two
#                   rails each alone, summed (`rails_sum`, measured on device 0 alone)
#   shared          2 devices sharing one SUP NIC (SOUT loop0, loop1, SUP loop2; 1 and 2 GB/s):
#                   mpib-agent's `capacity` and `adaptive` policies, the total after 2 s, against the best static
#                   share (512: each device half the SUP NIC) and the share each device's rails
#                   alone would give (683, what `capacity` chose before it counted a shared NIC
#                   once)
# Records (tab-separated) appended to OUT/records.tsv: case, metric, rep, value (GB/s).
set -uo pipefail
out=$1 bin=$2 reps=${3:-5}
records=$out/records.tsv logs=$out/logs
mkdir -p "$logs"
touch "$records"
size=4194304
rails="sout=1GB/s,sup=2GB/s,latency=5us"

record() { printf '%s\t%s\t%s\t%s\n' "$@" >> "$records"; echo "devices perf: $*"; }

# perf LOG SOUT SUP [ARGS...]: mpib-perf on the loopback fabric with NIC lists SOUT and SUP; CSV
# rows to LOG, each device's GB/s (`# size N dev D: X GB/s` notes) in LOG.err.
perf() {
  local log=$1 sout=$2 sup=$3
  shift 3
  MPIB_FABRIC=loopback MPIB_HCA_SOUT=$sout MPIB_HCA_SUP=$sup MPIB_LOOPBACK_RAILS=$rails \
    timeout 300 "$bin/mpib-perf" --min-size "$size" --max-size "$size" --csv "$@" \
    > "$log" 2> "$log.err"
}

# column LOG NAME: the values of column NAME, one per row.
column() {
  awk -F, -v name="$2" 'NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next } { print $(col[name]) }' "$1"
}

# slowest_device LOG: the lowest per-device GB/s of the last row.
slowest_device() {
  awk '/^# size [0-9]+ dev [0-9]+: / { v[$5] = $6 } END { m = ""; for (d in v) if (m == "" || v[d] + 0 < m + 0) m = v[d]; print (m == "") ? "fail" : m }' "$1.err"
}

# median_after LOG FROM_MS: the median GB/s of the rows from FROM_MS.
median_after() {
  paste -d' ' <(column "$1" at_ms) <(column "$1" gbps) | awk -v from="$2" '$1 + 0 >= from + 0 { print $2 }' |
    sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "fail"; else print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

sum() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "") print "fail"; else printf "%.6f", a + b }'; }

. "$(dirname "$0")/with-agent.sh"

for ((rep = 1; rep <= reps; rep++)); do
  # ---- one device alone: its two rails each alone, summed
  log=$logs/rails-$rep.csv
  if perf "$log" loop0 loop1 --sup-bw 0,1024 --warmup 4 --iters 32; then
    rails_sum=$(sum $(column "$log" gbps | tr '\n' ' '))
  else
    rails_sum=fail
  fi
  # ---- 2 and 4 devices at once, the rate-proportional static share
  for pairs in 2 4; do
    record "pairs$pairs" rails_sum "$rep" "$rails_sum"
    sout=$(seq -s, 0 2 $((2 * pairs - 2)) | sed 's/[0-9]\+/loop&/g')
    sup=$(seq -s, 1 2 $((2 * pairs - 1)) | sed 's/[0-9]\+/loop&/g')
    log=$logs/pairs$pairs-$rep.csv
    if perf "$log" "$sout" "$sup" --dev "$(seq -s, 0 $((pairs - 1)))" --sup-bw 683 --warmup 4 --iters 32; then
      record "pairs$pairs" slowest_device "$rep" "$(slowest_device "$log")"
      record "pairs$pairs" total "$rep" "$(column "$log" gbps | tail -n 1)"
    else
      record "pairs$pairs" slowest_device "$rep" fail
    fi
  done
  # ---- two devices sharing one SUP NIC
  for share in 512 683; do
    log=$logs/shared-static$share-$rep.csv
    if perf "$log" loop0,loop1 loop2 --dev 0,1 --sup-bw "$share" --warmup 4 --iters 32; then
      record shared "static$share" "$rep" "$(column "$log" gbps | tail -n 1)"
    else
      record shared "static$share" "$rep" fail
    fi
  done
  for policy in capacity adaptive; do
    log=$logs/shared-$policy-$rep.csv
    if with_agent "$policy" "$log" perf "$log" loop0,loop1 loop2 --dev 0,1 --iters 16 --repeat 100 --warmup 0; then
      record shared "$policy" "$rep" "$(median_after "$log" 2000)"
    else
      record shared "$policy" "$rep" fail
    fi
  done
done
echo "devices perf: done"
