#!/usr/bin/env bash
# scripts/lib/perf/window.sh OUT BIN REPS: where the loopback's last percent goes (docs/PERFORMANCE.md,
# "Where the loopback's last percent goes"). The rate-proportional split (sup_bw 683) against SOUT
# alone + SUP alone, side by side in each run, at 4 and 16 MiB, for three rate scales at NCCL's
# window of 8 and for 2 + 4 GB/s at window 32; then the model without rates (the copy's ceiling).
# Writes OUT/rows.tsv (rails, window, rep, sup_bw, size, GB/s) and prints the medians' ratios.
set -euo pipefail
out=$1 bin=$2 reps=$3
mkdir -p "$out"
: > "$out/rows.tsv"
for v in $(compgen -e); do [[ $v != MPIB_* ]] || unset "$v"; done
run() { # LABEL RAILS WINDOW
  local rep
  for ((rep = 1; rep <= reps; rep++)); do
    env MPIB_FABRIC=loopback ${2:+MPIB_LOOPBACK_RAILS="$2,latency=5us"} "$bin/mpib-perf" --sup-bw 0,683,1024 \
      --min-size 4M --max-size 16M --step-factor 4 --window "$3" --csv 2> /dev/null |
      awk -F, -v l="$1" -v w="$3" -v r="$rep" 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
        { print l "\t" w "\t" r "\t" $(c["sup_bw"]) "\t" $(c["size"]) "\t" $(c["gbps"]) }' >> "$out/rows.tsv"
  done
}
run "2+4 GB/s" "sout=2GB/s,sup=4GB/s" 8
run "1+2 GB/s" "sout=1GB/s,sup=2GB/s" 8
run "0.5+1 GB/s" "sout=0.5GB/s,sup=1GB/s" 8
run "2+4 GB/s" "sout=2GB/s,sup=4GB/s" 32
run "no rates" "" 8
python3 - "$out/rows.tsv" << 'PY'
import collections, statistics, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    rails, window, _, share, size, gbps = line.rstrip("\n").split("\t")
    rows[(rails, window, size, share)].append(float(gbps))
print("| rails, window | size | SOUT alone | SUP alone | 683 | 683 / (SOUT + SUP) |")
print("|---|---:|---:|---:|---:|---:|")
for rails, window, size in sorted({k[:3] for k in rows}, key=lambda k: (k[0], int(k[1]), int(k[2]))):
    m = {s: statistics.median(rows[(rails, window, size, s)]) for s in ("0", "683", "1024")}
    print(f"| {rails}, window {window} | {int(size) >> 20} MiB | {m['0']:.3f} | {m['1024']:.3f} | {m['683']:.3f} | {m['683'] / (m['0'] + m['1024']):.3f} |")
PY
