# Sourced by scripts/lib/perf/agent.sh and devices.sh (needs $bin):
#
#   with_agent POLICY LOG COMMAND [ARGS...]
#
# Starts a fresh mpib-agent with POLICY (its own hint file, socket and probes directory; its log
# in LOG.agent), runs COMMAND ARGS in advanced mode against it (MPIB_MODE=1 and the agent's
# paths in its environment), stops the agent and returns COMMAND's status.
with_agent() {
  local policy=$1 log=$2 dir rc agent
  shift 2
  dir=$(mktemp -d "${TMPDIR:-/tmp}/mpib-perf-agent.XXXXXX")
  mkdir -p "$dir/probes"
  "$bin/mpib-agent" --policy "$policy" --hint-path "$dir/hints" --socket "$dir/agent.sock" \
    --probes-dir "$dir/probes" --metrics-listen off > "$log.agent" 2>&1 &
  agent=$!
  for _ in $(seq 100); do [ -S "$dir/agent.sock" ] && break; sleep 0.05; done
  MPIB_MODE=1 MPIB_HINT_PATH=$dir/hints MPIB_AGENT_SOCKET=$dir/agent.sock \
    MPIB_PROBES_DIR=$dir/probes "$@"
  rc=$?
  kill "$agent" 2>/dev/null; wait "$agent" 2>/dev/null
  rm -rf "$dir"
  return "$rc"
}
