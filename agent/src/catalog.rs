//! The agent's metric catalog: every family its Prometheus endpoint exports, as one static table.
//!
//! This table is a contract, like the collector's: the dashboard panels and the alert rules are
//! written against these names and labels (`checks/tests/dashboards.rs` reads this file), and the
//! renderer in [`crate::metrics`] only writes families listed here.

/// How a family behaves: the agent writes counters and gauges.
pub use mpib_node::exposition::Kind;

/// One metric family.
#[derive(Debug, PartialEq, Eq)]
pub struct MetricSpec {
    /// Full Prometheus name (counters end in `_total`).
    pub name: &'static str,
    /// Counter or gauge.
    pub kind: Kind,
    /// The `# HELP` text.
    pub help: &'static str,
    /// Label names, in the order the renderer writes them.
    pub labels: &'static [&'static str],
}

/// Labels of agent-wide families.
pub const AGENT_LABELS: &[&str] = &["host"];
const INFO_LABELS: &[&str] = &["host", "version", "policy"];
const RESULT_LABELS: &[&str] = &["host", "result"];
const REASON_LABELS: &[&str] = &["host", "reason"];
const DECISION_LABELS: &[&str] = &["host", "policy", "reason"];
/// Labels of per-flow families: the hint slot and the flow's SOUT address pair.
pub const FLOW_LABELS: &[&str] = &["host", "flow", "sout_src", "sout_dst"];
/// Labels of per-flow, per-rail families.
pub const FLOW_RAIL_LABELS: &[&str] = &["host", "flow", "sout_src", "sout_dst", "rail"];

macro_rules! specs {
    ($($(#[$doc:meta])* $id:ident = $name:literal, $kind:ident, $labels:expr, $help:literal;)+) => {
        $(
            $(#[$doc])*
            pub static $id: MetricSpec = MetricSpec {
                name: $name,
                kind: Kind::$kind,
                help: $help,
                labels: $labels,
            };
        )+
        /// Every family, in documentation order.
        pub static CATALOG: &[&MetricSpec] = &[$(&$id),+];
    };
}

specs! {
    /// Build and configuration.
    INFO = "mpib_agent_info", Gauge, INFO_LABELS,
        "Always 1; the labels carry the agent's version and default policy.";
    /// Hint slots in use.
    SLOTS_USED = "mpib_agent_slots_used", Gauge, AGENT_LABELS,
        "Hint slots in use (one per SOUT address pair with a registered connection).";
    /// Hint slots in the file.
    SLOTS_TOTAL = "mpib_agent_slots_total", Gauge, AGENT_LABELS,
        "Hint slots in the hint file (256 in this layout).";
    /// Registered connections.
    CONNECTIONS = "mpib_agent_connections", Gauge, AGENT_LABELS,
        "Connections registered and not yet deregistered or reclaimed.";
    /// Registration requests by outcome.
    REGISTRATIONS = "mpib_agent_registrations_total", Counter, RESULT_LABELS,
        "Register requests answered, by result: ok, no_free_slots, process_limit and user_limit \
         (a new flow past --max-flows-per-process or --max-flows-per-user, answered no free \
         slots), invalid.";
    /// Deregistration requests by outcome.
    DEREGISTRATIONS = "mpib_agent_deregistrations_total", Counter, RESULT_LABELS,
        "Deregister requests answered, by result: ok, unknown (no such connection: already \
         reclaimed, or registered before an agent restart).";
    /// Malformed or silent clients.
    BAD_CLIENTS = "mpib_agent_bad_clients_total", Counter, REASON_LABELS,
        "Client connections closed for bad input: short, wrong_magic, wrong_type, wrong_length, \
         silent, busy (closed having sent nothing, to make room for a newcomer: more clients \
         open than the socket keeps), no_credentials, not_allowed (a uid and gid outside \
         --allowed-uids and --allowed-gids).";
    /// Slots freed without a deregistration.
    RECLAIMED = "mpib_agent_reclaimed_total", Counter, REASON_LABELS,
        "Registrations dropped without a deregistration: process_exited (connections of a process \
         that exited), orphan_unused (flows taken back after a restart that nothing read, given \
         up when the table was full).";
    /// Policy decisions that changed a flow's share.
    DECISIONS = "mpib_agent_decisions_total", Counter, DECISION_LABELS,
        "Changes of a flow's SUP share, by policy and reason.";
    /// Writes to the hint file by another process.
    EXTERNAL_WRITES = "mpib_agent_external_writes_total", Counter, AGENT_LABELS,
        "Hint entries found changed by another writer (the flow is then pinned to that value).";
    /// Configuration reloads.
    RELOADS = "mpib_agent_config_reloads_total", Counter, RESULT_LABELS,
        "Configuration reloads (SIGHUP), by result: ok, error (the old configuration stays).";
    /// Probes files read.
    PROBES_FILES = "mpib_agent_probes_files", Gauge, AGENT_LABELS,
        "Live probes files the agent read on its last tick.";
    /// The share asked of each flow.
    FLOW_SUP_RATIO = "mpib_agent_flow_sup_ratio", Gauge, FLOW_LABELS,
        "SUP share the agent asks of the flow (sup_bw / 1024).";
    /// The share the flow's bytes actually took.
    FLOW_MEASURED_SUP_RATIO = "mpib_agent_flow_measured_sup_ratio", Gauge, FLOW_LABELS,
        "SUP share of the bytes the flow's senders moved over the last measuring interval.";
    /// Bytes per second over both rails.
    FLOW_THROUGHPUT = "mpib_agent_flow_throughput_bytes_per_second", Gauge, FLOW_LABELS,
        "Bytes per second the flow's senders completed over the last measuring interval.";
    /// Rate of each rail while it carried the flow's data.
    FLOW_RAIL_RATE = "mpib_agent_flow_rail_rate_bytes_per_second", Gauge, FLOW_RAIL_LABELS,
        "Completed bytes over the time the rail had any of the flow's parts in flight, all its \
         connections and processes together (the policy's input).";
    /// Operator pin.
    FLOW_PINNED = "mpib_agent_flow_pinned", Gauge, FLOW_LABELS,
        "1 when an operator (mpib-agent set) or another writer fixed the flow's share.";
    /// Send connections the last measurement read.
    FLOW_MEASURED_CONNECTIONS = "mpib_agent_flow_measured_connections", Gauge, FLOW_LABELS,
        "Send connections of the flow the agent read in the probes files on its last measuring \
         interval (every one the plugins' connection tables hold).";
    /// Age of the flow's telemetry.
    FLOW_TELEMETRY_AGE = "mpib_agent_flow_telemetry_age_seconds", Gauge, FLOW_LABELS,
        "Seconds since the flow's senders last moved data the agent saw in a probes file.";
}
