#!/usr/bin/env bash
# scripts/lib/perf/bed.sh WORK BIN REPS [quick]: the tcp fabric's figures on the two-host bed of
# network namespaces (scripts/bed/lib.sh), medians of REPS repetitions, side by side in one run:
#   rail      one rail (SOUT) shaped to 2 Gbit/s by tbf: mpib-perf (inter-island: every byte on
#             SOUT, over its 2 QPs) vs iperf3 with as many streams, at 1, 4 and 16 MiB
#   ceiling   the same unshaped: the fabric's own ceiling against iperf3's on this machine
#   split     SOUT 1 Gbit/s + SUP 2 Gbit/s, advanced mode, mpib-perf's test agent sweeping the SUP
#             share; the rate-proportional split (683/1024) against the sum of the two rails alone
# Writes WORK/records.tsv (section, label, size, rep, GB/s, p50 us, -), WORK/bed.md (a Markdown
# section for docs/PERFORMANCE.md) and WORK/bed-split.png (gnuplot). Needs root (namespaces), iperf3
# and gnuplot (Debian packages; scripts/perf installs them).
set -uo pipefail  # no -e: the bed helpers test their own failures (a qdisc that is not there)
work=$1 bin=$2 reps=$3 quick=${4:-}
here=$(cd "$(dirname "$(readlink -f "$0")")" && pwd)
root=$(cd "$here/../../.." && pwd)
NA=mpib_perf_a NB=mpib_perf_b
# shellcheck source=scripts/bed/lib.sh
. "$root/scripts/bed/lib.sh"
mkdir -p "$work"
: > "$work/records.tsv"
tmp=$(mktemp -d /tmp/mpib_perf.XXXXXX)
cleanup() { teardown; rm -rf "$tmp"; }
trap cleanup EXIT
teardown
build_bed || { echo "bed perf: cannot build the bed (root, iproute2?)" >&2; exit 1; }
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
record() {
  awk -F, -v s="$1" -v l="$2" -v r="$4" 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
    { printf "%s\t%s%s\t%s\t%s\t%s\t%s\t-\n", s, l, (l ~ /sup_bw$/ ? " " $(c["sup_bw"]) : ""),
             $(c["size"]), r, $(c["gbps"]), $(c["p50_us"]) }' "$3" >> "$work/records.tsv"
}

# Iterations: mpib-perf's own choice (about 256 MiB per size), so every row lasts a second or more.
perf_args=(--min-size "${sizes[0]}" --max-size "${sizes[-1]}" --step-factor 4 --warmup 4)
for ((rep = 1; rep <= reps; rep++)); do
  for section in rail ceiling; do
    if [ $section = rail ]; then shape 0 2gbit; else shape 0 ''; fi
    shape 1 ''
    perf "$work/$section-$rep.csv" "MPIB_ISLAND_PREFIX_LEN=32" "${perf_args[@]}" || exit 1
    record "bed-$section" "mpib-perf SOUT" "$work/$section-$rep.csv" "$rep"
    printf 'bed-%s\tiperf3 -P 2\t-\t%s\t%s\t-\t-\n' $section "$rep" "$(iperf 2 0)" >> "$work/records.tsv"
    printf 'bed-%s\tiperf3 -P 1\t-\t%s\t%s\t-\t-\n' $section "$rep" "$(iperf 1 0)" >> "$work/records.tsv"
  done
  shape 0 1gbit && shape 1 2gbit || { echo "bed perf: tc cannot shape the rails" >&2; exit 1; }
  perf "$work/split-$rep.csv" "MPIB_MODE=1 MPIB_ISLAND_PREFIX_LEN=24" --min-size 4194304 \
    --max-size 4194304 --warmup 4 --iters 64 --sup-bw "$splits" || exit 1
  record bed-split "sup_bw" "$work/split-$rep.csv" "$rep"
  echo "bed perf: repetition $rep of $reps done"
done
"$here/bed-render.sh" "$work" "$reps"
