#!/usr/bin/env bash
# The live check of dashboards/ (issue 4, "Done when"): during a loopback run through the real
# plugin, Prometheus scraping mpib-collector returns non-empty results for every dashboard
# query, and every metric name the dashboard uses is in the collector's scrape.
#
#   1. cargo build --release: the plugin, mpib-demo (driver) and mpib-collector;
#   2. mpib-collector on 127.0.0.1 (free port), reading probes files from a temp directory;
#   3. Prometheus (Debian's binary) on 127.0.0.1 with a temp TSDB, scraping the collector
#      every 1 s and loading dashboards/alerts.yml;
#   4. mpib-demo over the loopback fabric, advanced mode with its test agent, writing its
#      probes into that directory (MPIB_PROBES_DIR), for about MPIB_E2E_SECONDS (its
#      iterations sized by a short timed run first), then holding its comms open (and its
#      series live) for MPIB_E2E_HOLD s;
#   5. while it runs: dashboards/e2e/check_panels.py runs every panel target and template
#      variable of dashboards/mpib.json against Prometheus' HTTP API, checks the metric names
#      against the collector's /metrics, the recording rule, and that no error alert fires;
#   5b. beside it, for the policy agent's panels: mpib-agent (adaptive policy, its own hint
#      file, socket and probes directory, its /metrics scraped too) serving mpib-perf in
#      advanced mode on modelled loopback rails of 200 and 400 MB/s, until the checks are done;
#   6. after it: a short mpib-demo --mode vanilla run (no agent, MPIB_MODE=0, all bytes on SUP
#      over loopback), checking that Prometheus then has mode="vanilla" series too.
#
# Everything listens on 127.0.0.1 only; every process started here is killed on exit (by pid).
# Environment: MPIB_E2E_SECONDS (workload length, default 25), MPIB_E2E_HOLD (mpib-demo --hold,
# default 10), MPIB_E2E_ITERATIONS (mpib-demo --iterations instead of sizing it),
# MPIB_E2E_CHECK_AFTER (seconds of workload before the checks, default 20), MPIB_E2E_KEEP=1
# (keep the temp directory: logs, TSDB, last scrape).
# Exit status: 0 when every check passed.
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/lib/setup.sh
ensure_rust

seconds="${MPIB_E2E_SECONDS:-25}"
hold="${MPIB_E2E_HOLD:-10}"
iterations="${MPIB_E2E_ITERATIONS:-}"
check_after="${MPIB_E2E_CHECK_AFTER:-20}"
for tool in prometheus promtool python3 curl; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "error: $tool not found. Prometheus and promtool come from Debian's \`prometheus\` package" >&2
        echo "       (apt-get install -y prometheus; scripts/test installs it)." >&2
        exit 1
    fi
done

t0=$(date +%s)
work="$(mktemp -d "${TMPDIR:-/tmp}/mpib-e2e.XXXXXX")"
mkdir -p "$work/probes" "$work/tmp" "$work/prom"
started=()
cleanup() {
    local rc=$?
    for pid in "${started[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${started[@]}"; do
        # Give each one 5 s to exit on SIGTERM, then SIGKILL it.
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    if [ "$rc" -ne 0 ]; then
        for log in "$work"/*.log; do
            [ -f "$log" ] || continue
            echo "---- $(basename "$log") (last 30 lines)"
            tail -n 30 "$log"
        done
    fi
    if [ "${MPIB_E2E_KEEP:-0}" = 1 ]; then
        echo "kept $work"
    else
        rm -rf "$work"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# wait_for SECONDS DESCRIPTION COMMAND...: poll COMMAND every 0.2 s.
wait_for() {
    local seconds="$1" what="$2"
    shift 2
    local deadline=$((SECONDS + seconds))
    until "$@" >/dev/null 2>&1; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            echo "error: timed out after ${seconds}s waiting for $what" >&2
            return 1
        fi
        sleep 0.2
    done
}

# The normal target directory (target/), or CARGO_TARGET_DIR where the caller set one.
bin="${CARGO_TARGET_DIR:-target}/release"
echo "==> cargo build --release (plugin, mpib-demo, mpib-perf, mpib-collector, mpib-agent)"
cargo build --release --locked -p mpib -p mpib-driver -p mpib-collector -p mpib-agent 2>&1 | tail -n 2
t_built=$(date +%s)

collector_port="$(free_port)"
prom_port="$(free_port)"
agent_port="$(free_port)"
metrics_url="http://127.0.0.1:$collector_port/metrics"
agent_url="http://127.0.0.1:$agent_port/metrics"
prom_url="http://127.0.0.1:$prom_port"

echo "==> mpib-agent on $agent_url (adaptive; socket, hints and probes under $work/agent)"
mkdir -p "$work/agent/probes"
"$bin"/mpib-agent --policy adaptive --hint-path "$work/agent/hints" \
    --socket "$work/agent/agent.sock" --probes-dir "$work/agent/probes" \
    --metrics-listen "127.0.0.1:$agent_port" >"$work/agent.log" 2>&1 &
started+=("$!")
wait_for 30 "the agent's /metrics" curl -fsS "$agent_url"
echo "==> mpib-perf, advanced mode with mpib-agent (loopback rails 200 and 400 MB/s)"
MPIB_FABRIC=loopback MPIB_MODE=1 MPIB_LOOPBACK_RAILS="sout=200MB/s,sup=400MB/s,latency=5us" \
    MPIB_HINT_PATH="$work/agent/hints" MPIB_AGENT_SOCKET="$work/agent/agent.sock" \
    MPIB_PROBES_DIR="$work/agent/probes" \
    "$bin"/mpib-perf --min-size 1M --max-size 1M --iters 16 --warmup 0 --repeat 100000 --csv \
    >"$work/perf.csv" 2>"$work/perf.log" &
perf=$!
started+=("$perf")

echo "==> mpib-collector on $metrics_url (probes in $work/probes)"
# The demo's test agent writes its hint file under $work/tmp (its TMPDIR), in a directory
# named after its pid; $work/hints is linked to it once the demo starts.
RUST_LOG="${RUST_LOG:-info}" "$bin"/mpib-collector \
    --probes-dir "$work/probes" --listen "127.0.0.1:$collector_port" \
    --hint-path "$work/hints" --sysfs "$work/sys" --interval-ms 500 \
    >"$work/collector.log" 2>&1 &
started+=("$!")
wait_for 30 "the collector's /metrics" curl -fsS "$metrics_url"

echo "==> prometheus on $prom_url (scrape every 1 s, rules dashboards/alerts.yml)"
cat >"$work/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files:
  - $PWD/dashboards/alerts.yml
scrape_configs:
  - job_name: mpib-collector
    static_configs:
      - targets: ["127.0.0.1:$collector_port"]
  - job_name: mpib-agent
    static_configs:
      - targets: ["127.0.0.1:$agent_port"]
EOF
promtool check config "$work/prometheus.yml" >/dev/null
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/prom" \
    --web.listen-address="127.0.0.1:$prom_port" --storage.tsdb.retention.time=1h \
    --log.level=warn >"$work/prometheus.log" 2>&1 &
started+=("$!")
wait_for 60 "prometheus to be ready" curl -fsS "$prom_url/-/ready"

if [ -z "$iterations" ]; then
    # Size the run to about $seconds s on this machine: time a short run (probes off).
    t_a=$(date +%s%N)
    MPIB_FABRIC=loopback MPIB_PROBES=0 TMPDIR="$work/tmp" \
        "$bin"/mpib-demo --iterations 4 >"$work/calibrate.log" 2>&1
    per_iteration_ms=$(( ($(date +%s%N) - t_a) / 4000000 + 1 ))
    iterations=$(( seconds * 1000 / per_iteration_ms ))
    [ "$iterations" -ge 20 ] || iterations=20
    [ "$iterations" -le 5000 ] || iterations=5000
    echo "    calibrated: ~${per_iteration_ms} ms per iteration, $iterations iterations for ~${seconds} s"
fi
echo "==> mpib-demo --iterations $iterations --hold $hold (loopback, advanced mode, probes on)"
window_start=$(date +%s)
# Not under timeout(1): the agent's directory is named after the demo's own pid. The wait
# below is bounded instead.
MPIB_FABRIC=loopback MPIB_PROBES_DIR="$work/probes" TMPDIR="$work/tmp" \
    "$bin"/mpib-demo --iterations "$iterations" --hold "$hold" >"$work/demo.log" 2>&1 &
demo=$!
started+=("$demo")
ln -s "$work/tmp/mpib-agent-$demo-0/hints" "$work/hints"
t_demo=$(date +%s)

# snapshot: keep the last scrape that has the plugin's series. If the demo ends before the
# checks start (a fast machine), the collector drops its series; names are checked on this copy.
snapshot() {
    curl -fsS "$metrics_url" >"$work/scrape.tmp" 2>/dev/null \
        && grep -q '^mpib_rail_tx_bytes_total{' "$work/scrape.tmp" \
        && mv "$work/scrape.tmp" "$work/scrape.txt"
}
# Wait until the workload has run for check_after seconds (or ended), with live series.
wait_for 60 "the plugin's probes in the collector's scrape" snapshot
# There is no RDMA NIC here: give the collector a sysfs tree (--sysfs) for the loopback
# rails' device/port, with idle counters, so that the NIC-counter panel has its series. On a
# real host the collector reads /sys.
curl -fsS "$metrics_url" | python3 -c '
import re, sys, os
root = sys.argv[1]
for dev, port in sorted({m.groups() for m in re.finditer(
        r"^mpib_rail_tx_bytes_total\{(?=[^}]*device=\"([^\"]+)\")(?=[^}]*port=\"([0-9]+)\")", sys.stdin.read(), re.M)}):
    base = os.path.join(root, "class/infiniband", dev, "ports", port)
    for sub, names in (("counters", ["port_xmit_data", "port_rcv_data", "link_downed", "symbol_error", "port_rcv_errors"]),
                       ("hw_counters", ["out_of_buffer", "out_of_sequence", "rnr_nak_retry_err", "local_ack_timeout_err"])):
        os.makedirs(os.path.join(base, sub), exist_ok=True)
        for name in names:
            with open(os.path.join(base, sub, name), "w") as f:
                f.write("0\n")
    print(f"    fake sysfs counters for {dev}/{port}")
' "$work/sys"
while kill -0 "$demo" 2>/dev/null && [ $(($(date +%s) - t_demo)) -lt "$check_after" ]; do
    snapshot || true
    sleep 1
done
if kill -0 "$demo" 2>/dev/null; then
    echo "==> checking while mpib-demo runs ($(($(date +%s) - t_demo)) s in)"
    scrape="$metrics_url"
else
    echo "==> mpib-demo ended before $check_after s; checking its last live samples and scrape"
    scrape="file://$work/scrape.txt"
fi
set +e
python3 dashboards/e2e/check_panels.py dashboards/mpib.json \
    --prometheus "$prom_url" --metrics "$scrape" --metrics "$agent_url" --start "$window_start" \
    --rate-interval 1m --rules dashboards/alerts.yml \
    --no-fire MpibMaskMismatch,MpibErrorCompletions,MpibProtocolErrors,MpibWriterStale
check=$?
set -e
t_checked=$(date +%s)
if ! kill -0 "$perf" 2>/dev/null; then
    echo "error: mpib-perf (advanced mode with mpib-agent) ended early: $(tail -n 3 "$work/perf.log")" >&2
    exit 1
fi
kill "$perf"
echo "    mpib-perf with mpib-agent: $(($(wc -l <"$work/perf.csv") - 1)) rows, last SUP share" \
    "$(tail -n 1 "$work/perf.csv" | awk -F, '{print $16}') of 1024"

demo_deadline=$((SECONDS + 300))
while kill -0 "$demo" 2>/dev/null && [ "$SECONDS" -lt "$demo_deadline" ]; do
    sleep 0.5
done
if kill -0 "$demo" 2>/dev/null; then
    echo "error: mpib-demo still running after 300 s; killing it" >&2
    exit 1
fi
set +e
wait "$demo"
demo_rc=$?
set -e
t_end=$(date +%s)
tail -n 1 "$work/demo.log"
if [ "$demo_rc" -ne 0 ]; then
    echo "error: mpib-demo exited with $demo_rc" >&2
    exit 1
fi

echo "==> mpib-demo --mode vanilla --iterations 2 --hold 3 (loopback, no agent, probes on)"
MPIB_FABRIC=loopback MPIB_PROBES_DIR="$work/probes" TMPDIR="$work/tmp" \
    timeout -k 5 120 "$bin"/mpib-demo --mode vanilla --iterations 2 --hold 3 \
    >"$work/demo-vanilla.log" 2>&1 &
vanilla=$!
started+=("$vanilla")
vanilla_series() {
    curl -fsS "$prom_url/api/v1/query" --data-urlencode \
        'query=count(last_over_time(mpib_connection_bytes_total{mode="vanilla"}[5m]))' \
        | grep -q '"result":\[{'
}
wait_for 60 'mode="vanilla" series in Prometheus' vanilla_series
set +e
wait "$vanilla"
vanilla_rc=$?
set -e
tail -n 1 "$work/demo-vanilla.log"
if [ "$vanilla_rc" -ne 0 ]; then
    echo "error: mpib-demo --mode vanilla exited with $vanilla_rc" >&2
    exit 1
fi
echo "    mode=\"vanilla\" series present in Prometheus"
if [ -n "$(ls -A "$work/probes")" ]; then
    echo "error: probes files left behind after a clean shutdown: $(ls "$work/probes")" >&2
    exit 1
fi
echo "timings: build $((t_built - t0)) s, workload $((t_end - t_demo)) s" \
    "(checks at +$((t_checked - t_demo)) s), total $((t_end - t0)) s"
exit "$check"
