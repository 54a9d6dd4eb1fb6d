#!/bin/bash
# The rig half of scripts/perf, run INSIDE the Soft-RoCE guest (scripts/rxe-vm/run.sh) with the
# release binaries already built on the host:
#
#   scripts/rxe-vm/run.sh scripts/lib/perf/rig.sh OUT REPS [quick]
#
# Shapes the rails (SOUT 80 Mbit/s, SUP 160 Mbit/s: a 1:2 pair well under the emulation ceiling,
# see shape.sh), then measures, each REPS times, in this order:
#   single   ib_write_bw on each shaped rail alone, mpib-perf with all bytes on that rail
#   both     two ib_write_bw at once (one per rail), mpib-perf at the rate-proportional split
#   sweep    mpib-perf at SUP shares 0 ... 1024
#   knobs    SUP alone and the balanced split again with MPIB_IB_TIMEOUT=14 (67 ms instead of
#            4.3 s per ACK timeout) and with one QP per rail
#   reorder  the balanced split with per-CPU receive (the rig's default): packets reordered
#   lossy    0.1 % of packets lost at random on each shaped rail (netem): the case with drops
#   agent    mpib-agent's adaptive policy (advanced mode, both processes through one agent,
#            interval 500 ms, 1 MiB messages): a 60 s series from all-SOUT (its median after
#            20 s, its slowest row of about 1 s against the best single rail; the same rows at
#            the fixed split beside it), SUP slowed to 40 Mbit/s by tc mid-run (how long until
#            the split comes within 64 of the new balance), and two sender processes at once
#            (their sum; beside it the same two processes at the fixed split)
#   latency  unshaped rails: ib_write_lat vs mpib-perf's p50, 8 B ... 4 KiB
# The agent cases append "case metric rep value" records to OUT/agent.tsv (GB/s, ms for *_ms).
# Every other measurement appends one tab-separated record to OUT/records.tsv:
#   section  label  size  rep  GB/s  p50_us  loss-counter deltas ("none" when nothing moved)
# A measurement that fails records GB/s as "fail" and its log stays under OUT/logs/; in the cases
# run with PERF_ALLOW_ERRORS=1 (where losses may exhaust the retries), an mpib-perf that ends
# because the plugin reported an error (exit 1) records "error" instead.
set -uo pipefail
out=$1 reps=${2:-5} quick=${3:-}
here=$(cd "$(dirname "$(readlink -f "$0")")" && pwd)
root=$(cd "$here/../../.." && pwd)
. "$here/shape.sh"
bin=$root/target/release
records=$out/records.tsv logs=$out/logs
mkdir -p "$logs"
: > "$records"; : > "$out/agent.tsv"
for v in $(compgen -e); do case $v in MPIB_*) unset "$v" ;; esac; done
# retry_cnt 6: rxe treats 7 as "retry forever" (docs/PERFORMANCE.md, rig notes).
export MPIB_FABRIC=verbs MPIB_IB_RETRY_CNT=6 MPIB_PROBES=1 MPIB_PROBES_DIR=/tmp/perf/probes
mkdir -p /tmp/perf/probes
A=(MPIB_HCA_SOUT=rxe_a0 MPIB_HCA_SUP=rxe_a1 MPIB_OOB_ADDR=10.100.0.1)
B=(MPIB_HCA_SOUT=rxe_b0 MPIB_HCA_SUP=rxe_b1 MPIB_OOB_ADDR=10.100.0.2)
SOUT_RATE=${PERF_SOUT_RATE:-80mbit} SUP_RATE=${PERF_SUP_RATE:-160mbit}
# The rate-proportional SUP share for 1:2 rails: 1024 * 2/3.
BALANCED=${PERF_BALANCED:-683}
port=20000
# Extra plugin settings for both mpib-perf processes (the knobs section sets them).
PERF_ENV=() PERF_ALLOW_ERRORS=
next_port() { port=$((port + 1)); }

record() { printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >> "$records"; echo "rig perf: $*"; }

# wait_listen PORT: until something listens on TCP PORT (up to 20 s; TCG starts are slow).
wait_listen() {
  local hex; hex=$(printf '%04X' "$1")
  for _ in $(seq 200); do
    grep -q ":$hex 00000000:0000 0A" /proc/net/tcp 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}

# ib_bw RAIL SIZE ITERS PORT LOG: one ib_write_bw pair on RAIL (server on B); prints GB/s.
ib_bw() {
  local r=$1 size=$2 iters=$3 p=$4 log=$5
  timeout 120 ib_write_bw -d "rxe_b$r" -x 1 -p "$p" -s "$size" -n "$iters" -F --report_gbits \
    > "$log.server" 2>&1 &
  local server=$!
  wait_listen "$p" || { kill "$server" 2>/dev/null; echo fail; return; }
  timeout 120 ib_write_bw -d "rxe_a$r" -x 1 -p "$p" -s "$size" -n "$iters" -F --report_gbits \
    "10.100.$r.2" > "$log" 2>&1
  wait "$server"
  # The result line starts with the size; column 4 is the average in Gb/s (1e9 bits).
  awk -v s="$size" '$1 == s && NF >= 5 { printf "%.6f\n", $4 / 8; found = 1 }
                    END { if (!found) print "fail" }' "$log"
}

# mpib_perf LOG SIZE ITERS SUP_BW [EXTRA...]: mpib-perf, receiver on B, sender on A, two
# processes meeting over TCP on the SOUT wire; prints "GB/s p50_us" of the sender's CSV row.
mpib_perf() {
  local log=$1 size=$2 iters=$3 bw=$4 p
  shift 4
  next_port; p=$port
  env "${B[@]}" "${PERF_ENV[@]}" \
    timeout 300 "$bin/mpib-perf" --listen "10.100.0.2:$p" --timeout 120 > "$log.recv" 2>&1 &
  local receiver=$!
  wait_listen "$p" || { kill "$receiver" 2>/dev/null; echo "fail -"; return; }
  env "${A[@]}" "${PERF_ENV[@]}" \
    timeout 300 "$bin/mpib-perf" --peer "10.100.0.2:$p" --sup-bw "$bw" --min-size "$size" \
    --max-size "$size" --iters "$iters" --warmup 2 --timeout 120 --csv "$@" > "$log" 2> "$log.err"
  local rc=$?
  wait "$receiver"
  if [ "$rc" = 1 ] && [ -n "$PERF_ALLOW_ERRORS" ]; then echo "error -"; return; fi
  [ "$rc" = 0 ] || { echo "fail -"; return; }
  perf_columns "$log"
}

# perf_columns CSV: "GB/s p50_us" of the last row (columns found by name in the header).
perf_columns() {
  awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
           { g = $(col["gbps"]); p = $(col["p50_us"]) }
           END { if (g == "") print "fail -"; else print g, p }' "$1"
}

measure_bw() { # measure_bw SECTION LABEL RAIL SIZE ITERS
  local before after gbs
  next_port; before=$(loss_snapshot)
  gbs=$(ib_bw "$3" "$4" "$5" "$port" "$logs/$1-$2-$4-$rep.log")
  after=$(loss_snapshot)
  record "$1" "$2" "$4" "$rep" "$gbs" - "$(loss_delta "$before" "$after")"
}

measure_both_ib() { # measure_both_ib SIZE ITERS: two ib_write_bw at once, one per rail
  local size=$1 iters=$2 before after p0 p1 f0 f1 g0 g1
  next_port; p0=$port; next_port; p1=$port
  f0=$logs/both-ib-sout-$size-$rep.log f1=$logs/both-ib-sup-$size-$rep.log
  before=$(loss_snapshot)
  ib_bw 0 "$size" "$iters" "$p0" "$f0" > "$f0.gbs" &
  local j0=$!
  ib_bw 1 "$size" "$((iters * 2))" "$p1" "$f1" > "$f1.gbs" &
  wait "$j0" $!
  after=$(loss_snapshot)
  g0=$(cat "$f0.gbs") g1=$(cat "$f1.gbs")
  local sum=fail
  [ "$g0" = fail ] || [ "$g1" = fail ] || sum=$(awk -v a="$g0" -v b="$g1" 'BEGIN { printf "%.6f", a + b }')
  record both "ib_write_bw x2 (sum)" "$size" "$rep" "$sum" - "$(loss_delta "$before" "$after")"
  record both "ib_write_bw x2 (sout part)" "$size" "$rep" "$g0" - -
  record both "ib_write_bw x2 (sup part)" "$size" "$rep" "$g1" - -
}

# ---- the policy agent: one mpib-agent serves both processes (A's flow and B's)
agent_dir=/tmp/perf/agent
agent_start() {
  rm -rf "$agent_dir"; mkdir -p "$agent_dir"
  # A 500 ms interval: at 30 MB/s a 100 ms one sees three or four 1 MiB transfers, too few for
  # a rate; 500 ms sees about fifteen and still leaves room for several steps within 3 s.
  "$bin/mpib-agent" --policy adaptive --interval-ms "${RIG_AGENT_INTERVAL_MS:-500}" --hint-path "$agent_dir/hints" --socket "$agent_dir/agent.sock" \
    --probes-dir "$MPIB_PROBES_DIR" --metrics-listen off > "$logs/agent-$1.log" 2>&1 &
  agent_pid=$!
  for _ in $(seq 100); do [ -S "$agent_dir/agent.sock" ] && break; sleep 0.1; done
  [ -S "$agent_dir/agent.sock" ] || return 1
  # Its status four times a second (logs/agent-status-REP.log): the move is timed from it.
  ( while kill -0 "$agent_pid" 2>/dev/null; do
      date +%s.%N; "$bin/mpib-agent" status --control "$agent_dir/agent.control" 2>&1 | tail -n +4
      sleep 0.25
    done ) > "$logs/agent-status-$1.log" 2>&1 &
  agent_watch=$!
}
agent_stop() {
  kill "$agent_pid" 2>/dev/null; wait "$agent_pid" 2>/dev/null
  wait "$agent_watch" 2>/dev/null
}
AGENT_ENV=(MPIB_MODE=1 "MPIB_HINT_PATH=$agent_dir/hints" "MPIB_AGENT_SOCKET=$agent_dir/agent.sock")

# agent_series LOG SIZE ITERS REPEAT PORT [EXTRA...]: mpib-perf in advanced mode (no --sup-bw:
# the agent's shares), a row per ITERS messages; 0 when it ran. (The port is the caller's: two
# series may run at once in subshells.)
agent_series() {
  local log=$1 size=$2 iters=$3 repeat=$4 p=$5
  shift 5
  env "${B[@]}" "${AGENT_ENV[@]}" \
    timeout 600 "$bin/mpib-perf" --listen "10.100.0.2:$p" --timeout 120 > "$log.recv" 2>&1 &
  local receiver=$!
  wait_listen "$p" || { kill "$receiver" 2>/dev/null; return 1; }
  env "${A[@]}" "${AGENT_ENV[@]}" \
    timeout 600 "$bin/mpib-perf" --peer "10.100.0.2:$p" --min-size "$size" --max-size "$size" \
    --iters "$iters" --warmup 0 --repeat "$repeat" --timeout 120 --csv "$@" > "$log" 2> "$log.err"
  local rc=$?
  wait "$receiver"
  return "$rc"
}

agent_record() { printf '%s\t%s\t%s\t%s\n' "$@" >> "$out/agent.tsv"; echo "rig perf: agent $*"; }

# series_stat LOG STAT FROM_MS: over the rows from FROM_MS, the median or the min GB/s.
series_stat() {
  awk -F, -v stat="$2" -v from="$3" 'NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
    $(col["at_ms"]) + 0 >= from + 0 { v[++n] = $(col["gbps"]) + 0 }
    END { if (n == 0) { print "fail"; exit }
          for (i = 2; i <= n; i++) { t = v[i]; for (j = i - 1; j >= 1 && v[j] > t; j--) v[j + 1] = v[j]; v[j + 1] = t }
          if (stat == "min") print v[1]; else print (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2 }' "$1"
}

measure_agent() { # measure_agent SIZE: the three agent cases at one size
  local size=$1 iters log
  # A row of 24 MiB (0.9 s at the rails' sum, 1.2 s at the faster rail alone) and at least 16
  # messages: the target is about 1-s intervals, and each row starts and ends with the window
  # filling and draining, which a shorter row would pay too often.
  iters=$((24 * 1048576 / size)); [ "$iters" -ge 16 ] || iters=16
  # The same rows at the fixed rate-proportional split (a test agent, --sup-bw): what the
  # adaptive series is compared with beside two ib_write_bw, since every row pays the window's
  # fill and drain alike.
  log=$logs/agent-static-$size-$rep.csv
  next_port
  if agent_series "$log" "$size" "$iters" 15 "$port" --sup-bw "$BALANCED"; then
    agent_record rig-static steady "$rep" "$(series_stat "$log" median 3000)"
  else
    agent_record rig-static steady "$rep" fail
  fi
  # Two sender processes at the same fixed split: what four busy-polling processes get from
  # the rig's two emulated CPUs, the yardstick of the agent's two-process case below.
  two_processes rig-two-processes-static "$size" "$iters" --sup-bw "$BALANCED"
  agent_start "$rep" || { agent_record rig-adaptive steady "$rep" fail; return; }
  log=$logs/agent-series-$size-$rep.csv
  next_port
  if agent_series "$log" "$size" "$iters" 60 "$port"; then
    agent_record rig-adaptive steady "$rep" "$(series_stat "$log" median 20000)"
    agent_record rig-adaptive slowest_row "$rep" "$(series_stat "$log" min 5000)"
  else
    agent_record rig-adaptive steady "$rep" fail
  fi
  # SUP slowed to half of SOUT's rate 15 s in: how long until the agent's split moves.
  log=$logs/agent-slowdown-$size-$rep.csv
  ( sleep 15; date +%s%3N > "$log.slowed"; shape_rail 1 40mbit ) &
  local slower=$!
  local started; started=$(date +%s%3N)
  next_port
  if agent_series "$log" "$size" "$iters" 40 "$port"; then
    wait "$slower"
    # When the agent's asked share (its status, read four times a second) first came within 64
    # parts of the new balance (SOUT 80 and SUP 40 Mbit/s: 1024 / 3 = 341) after the change. The
    # rows cannot tell: one takes about a second and averages the shares it saw.
    local slowed_ms; slowed_ms=$(( $(cat "$log.slowed") - started ))
    agent_record rig-slowdown move_ms "$rep" "$(awk -v t="$(cat "$log.slowed")" '
      /^[0-9]+\.[0-9]+$/ { now = $1 * 1000; next }
      / 10\.100\.0\.1->10\.100\.0\.2 / && now > t && $4 >= 341 - 64 && $4 <= 341 + 64 {
        printf "%.0f\n", now - t; found = 1; exit }
      END { if (!found) print "never" }' "$logs/agent-status-$rep.log")"
    agent_record rig-slowdown steady_after "$rep" "$(series_stat "$log" median $((slowed_ms + 10000)))"
  else
    wait "$slower"
    agent_record rig-slowdown move_ms "$rep" fail
  fi
  shape_rail 1 "$SUP_RATE"
  # Two sender processes at once, each to its own receiver, through the one agent.
  two_processes rig-two-processes "$size" "$iters"
  agent_stop
}

# two_processes CASE SIZE ITERS [EXTRA...]: two sender processes at once, each to its own
# receiver, 30 rows each; records the sum of their medians after 10 s.
two_processes() {
  local case=$1 size=$2 iters=$3
  shift 3
  local l1=$logs/$case-1-$size-$rep.csv l2=$logs/$case-2-$size-$rep.csv
  next_port; local p1=$port; next_port
  agent_series "$l1" "$size" "$iters" 30 "$p1" "$@" &
  local j1=$!
  agent_series "$l2" "$size" "$iters" 30 "$port" "$@" &
  local j2=$!
  if wait "$j1" && wait "$j2"; then
    agent_record "$case" sum "$rep" "$(awk -v a="$(series_stat "$l1" median 10000)" \
      -v b="$(series_stat "$l2" median 10000)" 'BEGIN { if (a == "fail" || b == "fail") print "fail"; else printf "%.6f", a + b }')"
  else
    agent_record "$case" sum "$rep" fail
  fi
}

measure_perf() { # measure_perf SECTION LABEL SIZE ITERS SUP_BW
  local before after res
  before=$(loss_snapshot)
  res=$(mpib_perf "$logs/$1-$(echo "$2" | tr -c 'a-zA-Z0-9=_.-' _)-$3-$rep.csv" "$3" "$4" "$5")
  after=$(loss_snapshot)
  # shellcheck disable=SC2086  # "GB/s p50"
  record "$1" "$2" "$3" "$rep" $res "$(loss_delta "$before" "$after")"
}

echo "rig perf: $(nproc) vCPU(s), kernel $(uname -r), rails SOUT $SOUT_RATE, SUP $SUP_RATE, $reps repetition(s)"
shape_rail 0 "$SOUT_RATE"; shape_rail 1 "$SUP_RATE"
receive_in_order on
sizes=(1048576 4194304)
sweep=(0 256 512 640 683 768 896 1024)
if [ -n "$quick" ]; then sizes=(1048576); sweep=(0 683 1024); fi
if [ "${PERF_ONLY:-}" = agent ]; then   # a development shortcut: the agent cases alone
  for ((rep = 1; rep <= reps; rep++)); do measure_agent "${sizes[0]}"; done
  echo "rig perf: done"; exit 0
fi
for ((rep = 1; rep <= reps; rep++)); do
  for size in "${sizes[@]}"; do
    iters=$((16 * 1048576 / size)); [ "$iters" -ge 8 ] || iters=8
    measure_bw single "ib_write_bw sout" 0 "$size" "$iters"
    measure_perf single "mpib-perf sout (sup_bw 0)" "$size" "$iters" 0
    measure_bw single "ib_write_bw sup" 1 "$size" "$((iters * 2))"
    measure_perf single "mpib-perf sup (sup_bw 1024)" "$size" "$((iters * 2))" 1024
    measure_both_ib "$size" "$iters"
    measure_perf both "mpib-perf sup_bw $BALANCED" "$size" "$((iters * 3))" "$BALANCED"
  done
  size=${sizes[-1]}; iters=$((24 * 1048576 / size)); [ "$iters" -ge 8 ] || iters=8
  for bw in "${sweep[@]}"; do
    measure_perf sweep "sup_bw $bw" "$size" "$iters" "$bw"
  done
  iters=$((16 * 1048576 / size)); [ "$iters" -ge 8 ] || iters=8
  for knob in "MPIB_IB_TIMEOUT=14" "MPIB_SOUT_QP=1 MPIB_SUP_QP=1"; do
    read -r -a PERF_ENV <<< "$knob"
    # A short ACK timeout under a deep queue may run out of retries: an expected outcome.
    PERF_ALLOW_ERRORS=1
    measure_perf knobs "sup alone (sup_bw 1024), $knob" "$size" "$((iters * 2))" 1024
    measure_perf knobs "sup_bw $BALANCED, $knob" "$size" "$((iters * 3))" "$BALANCED"
  done
  PERF_ENV=() PERF_ALLOW_ERRORS=
  measure_agent "${sizes[0]}"
done
# Reordering: the rig's per-CPU receive, as it is without receive_in_order.
receive_in_order off
for ((rep = 1; rep <= reps; rep++)); do
  measure_perf reorder "mpib-perf sup_bw $BALANCED, per-CPU receive" "${sizes[-1]}" 12 "$BALANCED"
done
receive_in_order on
# The separate case with drops: 0.1 % random loss on each rail's wire.
shape_lossy 0 "$SOUT_RATE" 0.1%; shape_lossy 1 "$SUP_RATE" 0.1%
lossy_reps=3; [ -z "$quick" ] || lossy_reps=1
PERF_ALLOW_ERRORS=1
for ((rep = 1; rep <= lossy_reps; rep++)); do
  measure_perf lossy "mpib-perf sup_bw $BALANCED, 0.1 % loss" "${sizes[-1]}" 12 "$BALANCED"
  PERF_ENV=(MPIB_SOUT_QP=1 MPIB_SUP_QP=1)
  measure_perf lossy "mpib-perf sup_bw $BALANCED, 0.1 % loss, MPIB_SOUT_QP=1 MPIB_SUP_QP=1" \
    "${sizes[-1]}" 12 "$BALANCED"
  PERF_ENV=()
  measure_bw lossy "ib_write_bw sup, 0.1 % loss" 1 "${sizes[-1]}" 12
done
PERF_ALLOW_ERRORS=
# Latency on unshaped rails: every packet goes straight to the wire.
shape_rail 0 off; shape_rail 1 off
lat_sizes=(8 64 512 4096)
for ((rep = 1; rep <= reps; rep++)); do
  for size in "${lat_sizes[@]}"; do
    next_port
    timeout 60 ib_write_lat -d rxe_b0 -x 1 -p "$port" -s "$size" -n 500 -F > "$logs/lat-$size-$rep.server" 2>&1 &
    server=$!
    if wait_listen "$port"; then
      timeout 60 ib_write_lat -d rxe_a0 -x 1 -p "$port" -s "$size" -n 500 -F 10.100.0.2 \
        > "$logs/lat-$size-$rep.log" 2>&1
    fi
    wait "$server"
    # Columns: bytes iterations t_min t_max t_typical t_avg ...: t_typical is the median.
    typical=$(awk -v s="$size" '$1 == s && NF >= 6 { print $5; found = 1 } END { if (!found) print "fail" }' \
      "$logs/lat-$size-$rep.log")
    record latency "ib_write_lat (one-way, t_typical)" "$size" "$rep" - "$typical" -
    # One message in flight: latency, not queueing behind the window.
    res=$(mpib_perf "$logs/lat-mpib-$size-$rep.csv" "$size" 500 0 --window 1)
    record latency "mpib-perf p50, window 1 (sup_bw 0)" "$size" "$rep" "${res% *}" "${res#* }" -
  done
done
echo "rig perf: done"
