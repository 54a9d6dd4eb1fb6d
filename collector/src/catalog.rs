//! The metric catalog: every family the collector exports, as one static table.
//!
//! This table is a contract. Dashboards, alert rules and `docs/OBSERVABILITY.md` are written
//! against these names and labels, so the exporter only accepts a [`MetricSpec`] from here
//! (label names come from the spec, values are positional) and the tests check a scrape and
//! the document against [`CATALOG`].

/// How a family behaves in Prometheus.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Monotonic; exported with `Counter::absolute` from the writer's value.
    Counter,
    /// Goes up and down.
    Gauge,
    /// A classic Prometheus histogram (`_bucket`, `_sum`, `_count`), rendered by the collector.
    Histogram,
}

impl Kind {
    /// The `# TYPE` word.
    pub const fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// The unit of a family's values (Prometheus base units).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// Bytes.
    Bytes,
    /// Seconds.
    Seconds,
    /// A ratio between 0 and 1.
    Ratio,
    /// A dimensionless count of things (requests, completions, files).
    Count,
    /// An info metric: always 1, the labels carry the information.
    Info,
}

impl Unit {
    /// The word the documentation uses.
    pub const fn as_str(self) -> &'static str {
        match self {
            Unit::Bytes => "bytes",
            Unit::Seconds => "seconds",
            Unit::Ratio => "ratio",
            Unit::Count => "count",
            Unit::Info => "info",
        }
    }

    /// The `metrics` crate's unit, where it has one.
    pub fn metrics_unit(self) -> Option<metrics::Unit> {
        match self {
            Unit::Bytes => Some(metrics::Unit::Bytes),
            Unit::Seconds => Some(metrics::Unit::Seconds),
            Unit::Count => Some(metrics::Unit::Count),
            Unit::Ratio | Unit::Info => None,
        }
    }
}

/// One metric family.
#[derive(Debug, PartialEq, Eq)]
pub struct MetricSpec {
    /// Full Prometheus name (counters end in `_total`).
    pub name: &'static str,
    /// Counter, gauge or histogram.
    pub kind: Kind,
    /// Unit of the values.
    pub unit: Unit,
    /// The `# HELP` text.
    pub help: &'static str,
    /// Label names, in the order the exporter writes them.
    pub labels: &'static [&'static str],
}

/// Labels of per-process families.
pub const PROCESS_LABELS: &[&str] = &["host", "pid"];
/// Labels of per-rail families (`device`/`port` as in node_exporter's `node_infiniband_*`).
pub const RAIL_LABELS: &[&str] = &["host", "pid", "rail", "device", "port"];
const MASK_LABELS: &[&str] = &["host", "pid", "mask"];
const CONN_LABELS: &[&str] = &["host", "pid", "peer", "direction", "path_class", "mode"];
const CONN_RAIL_LABELS: &[&str] = &[
    "host",
    "pid",
    "peer",
    "direction",
    "path_class",
    "mode",
    "rail",
];
const CONN_INFO_LABELS: &[&str] = &[
    "host",
    "pid",
    "peer",
    "direction",
    "path_class",
    "mode",
    "hint_slot",
];
const COLLECTOR_LABELS: &[&str] = &["host"];
const SKIP_LABELS: &[&str] = &["host", "reason"];
const NIC_LABELS: &[&str] = &["host", "device", "port", "counter"];

macro_rules! specs {
    ($($(#[$doc:meta])* $id:ident = $name:literal, $kind:ident, $unit:ident, $labels:expr, $help:literal;)+) => {
        $(
            $(#[$doc])*
            pub static $id: MetricSpec = MetricSpec {
                name: $name,
                kind: Kind::$kind,
                unit: Unit::$unit,
                help: $help,
                labels: $labels,
            };
        )+
        /// Every family, in documentation order.
        pub static CATALOG: &[&MetricSpec] = &[$(&$id),+];
    };
}

specs! {
    /// Bytes sent per rail.
    RAIL_TX_BYTES = "mpib_rail_tx_bytes_total", Counter, Bytes, RAIL_LABELS,
        "Bytes sent on the rail (payload posted by this process).";
    /// Bytes received per rail.
    RAIL_RX_BYTES = "mpib_rail_rx_bytes_total", Counter, Bytes, RAIL_LABELS,
        "Bytes received on the rail.";
    /// Work requests posted per rail.
    RAIL_WORK_REQUESTS = "mpib_rail_work_requests_total", Counter, Count, RAIL_LABELS,
        "Work requests posted on the rail's queue pairs.";
    /// Send completions per rail.
    RAIL_SEND_COMPLETIONS = "mpib_rail_send_completions_total", Counter, Count, RAIL_LABELS,
        "Send-side completions (CQEs) polled on the rail.";
    /// Receive completions per rail.
    RAIL_RECV_COMPLETIONS = "mpib_rail_recv_completions_total", Counter, Count, RAIL_LABELS,
        "Receive-side completions (CQEs) polled on the rail.";
    /// Error completions per rail.
    RAIL_ERROR_COMPLETIONS = "mpib_rail_error_completions_total", Counter, Count, RAIL_LABELS,
        "Completions with an error status on the rail.";
    /// SRQ depth.
    SRQ_DEPTH = "mpib_srq_depth", Gauge, Count, RAIL_LABELS,
        "Receive work requests posted to an SRQ of the rail and not yet consumed: the lowest \
         of the last readings of the process's threads (the SRQ nearest to running dry).";
    /// SRQ low watermark.
    SRQ_LOW_WATER = "mpib_srq_low_water", Gauge, Count, RAIL_LABELS,
        "SRQ refill threshold: a refill starts at or under this depth.";
    /// SRQ high watermark.
    SRQ_HIGH_WATER = "mpib_srq_high_water", Gauge, Count, RAIL_LABELS,
        "SRQ refill target depth.";
    /// SRQ refills.
    SRQ_REFILLS = "mpib_srq_refills_total", Counter, Count, RAIL_LABELS,
        "SRQ refill passes.";
    /// SRQ low-water hits.
    SRQ_LOW_WATER_HITS = "mpib_srq_low_water_hits_total", Counter, Count, RAIL_LABELS,
        "Times the SRQ depth was found at or under its low watermark.";
    /// Rail mask mismatches.
    MASK_MISMATCHES = "mpib_mask_mismatches_total", Counter, Count, RAIL_LABELS,
        "Completions whose rail mask disagreed with the expected one.";
    /// Other protocol errors.
    PROTOCOL_ERRORS = "mpib_protocol_errors_total", Counter, Count, RAIL_LABELS,
        "Protocol anomalies other than mask mismatches.";
    /// CTS entries posted.
    CTS_POSTED = "mpib_cts_posted_total", Counter, Count, RAIL_LABELS,
        "Clear-to-send entries posted on the rail.";
    /// CTS entries posted signalled.
    CTS_SIGNALED = "mpib_cts_signaled_total", Counter, Count, RAIL_LABELS,
        "Clear-to-send entries posted with a signalled completion.";
    /// Post-to-completion latency.
    TRANSFER_LATENCY = "mpib_transfer_latency_seconds", Histogram, Seconds, RAIL_LABELS,
        "Post-to-completion latency of the rail's transfers (log2 buckets).";
    /// Transfers by active rail mask.
    TRANSFERS = "mpib_transfers_total", Counter, Count, MASK_LABELS,
        "Completed transfers by the rails they used: mask sout, sup or both.";
    /// Bytes per connection and rail.
    CONNECTION_BYTES = "mpib_connection_bytes_total", Counter, Bytes, CONN_RAIL_LABELS,
        "Bytes moved per peer connection and rail (connections with equal labels summed).";
    /// Connection attributes.
    CONNECTION_INFO = "mpib_connection_info", Gauge, Info, CONN_INFO_LABELS,
        "Open connections, 1 per label set; hint_slot is the agent hint table slot.";
    /// The agent's SUP share hint.
    CONNECTION_HINT_SUP_RATIO = "mpib_connection_hint_sup_ratio", Gauge, Ratio, CONN_LABELS,
        "Advanced mode: the agent's current SUP share hint (sup_bw / 1024, at most 1).";
    /// Slow transfers read from the event ring.
    SLOW_TRANSFERS = "mpib_slow_transfers_total", Counter, Count, PROCESS_LABELS,
        "Slow transfers (over MPIB_SLOW_US) read from the event ring and exported as spans.";
    /// Advanced-mode connections left without a hint slot.
    CONNECTIONS_WITHOUT_AGENT = "mpib_connections_without_agent_total", Counter, Count,
        PROCESS_LABELS,
        "Advanced-mode connections that got no hint slot from the policy agent (none reachable, \
         no answer in time, a refusal or a full table): they move all their bytes on SOUT.";
    /// Slow-transfer events the plugin gave up under contention.
    EVENTS_CONTENDED = "mpib_events_contended_total", Counter, Count, PROCESS_LABELS,
        "Slow-transfer events the plugin gave up because another of its threads was writing the \
         event ring at that moment (it never waits for it).";
    /// Threads holding a writer lane.
    WRITER_THREADS = "mpib_writer_threads", Gauge, Count, PROCESS_LABELS,
        "Threads of the process that hold a writer lane of its probes file (each counts into \
         its own copy, summed on export).";
    /// Threads beyond the owned writer lanes.
    WRITER_LANE_OVERFLOWS = "mpib_writer_lane_overflows_total", Counter, Count, PROCESS_LABELS,
        "Threads that found every owned writer lane taken and count in the shared lane (still \
         exact, with locked adds).";
    /// Event records lost to overwriting.
    EVENTS_DROPPED = "mpib_events_dropped_total", Counter, Count, PROCESS_LABELS,
        "Event ring records overwritten before the collector read them.";
    /// Heartbeat age.
    WRITER_HEARTBEAT_AGE = "mpib_writer_heartbeat_age_seconds", Gauge, Seconds, PROCESS_LABELS,
        "Time since the writer last refreshed its heartbeat.";
    /// Probes files found.
    PROBES_FILES = "mpib_probes_files", Gauge, Count, COLLECTOR_LABELS,
        "Probes files in the probes directory after the last scan (reaped ones excluded).";
    /// Probes files refused.
    PROBES_SKIPPED = "mpib_probes_skipped_total", Counter, Count, SKIP_LABELS,
        "Probes files refused, by reason: version, corrupt or truncated (each counted once).";
    /// Dead writers' files removed.
    PROBES_REAPED = "mpib_probes_reaped_total", Counter, Count, COLLECTOR_LABELS,
        "Probes files of dead writers removed by the collector.";
    /// NIC counters from sysfs.
    NIC_COUNTER = "mpib_nic_counter_total", Counter, Count, NIC_LABELS,
        "The rail NICs' own sysfs counters and hw_counters (port_*_data in bytes).";
}

/// The spec named `name`, if the catalog has it.
pub fn find(name: &str) -> Option<&'static MetricSpec> {
    CATALOG.iter().copied().find(|spec| spec.name == name)
}

/// The family a sample name belongs to: the name itself, or a histogram's name without its
/// `_bucket`, `_sum` or `_count` suffix.
pub fn family_of(sample: &str) -> Option<&'static MetricSpec> {
    if let Some(spec) = find(sample) {
        return Some(spec);
    }
    ["_bucket", "_sum", "_count"].iter().find_map(|suffix| {
        let base = sample.strip_suffix(suffix)?;
        find(base).filter(|spec| spec.kind == Kind::Histogram)
    })
}

/// The catalog as the Markdown table `docs/OBSERVABILITY.md` embeds.
pub fn markdown_table() -> String {
    let mut out =
        String::from("| metric | type | unit | labels | meaning |\n|---|---|---|---|---|\n");
    for spec in CATALOG {
        let labels = spec
            .labels
            .iter()
            .map(|l| format!("`{l}`"))
            .collect::<Vec<_>>()
            .join(", ");
        out.push_str(&format!(
            "| `{}` | {} | {} | {} | {} |\n",
            spec.name,
            spec.kind.as_str(),
            spec.unit.as_str(),
            labels,
            spec.help
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn names_follow_prometheus_conventions() {
        let mut seen = HashSet::new();
        for spec in CATALOG {
            assert!(seen.insert(spec.name), "duplicate {}", spec.name);
            assert_eq!(spec.name.split('_').next(), Some("mpib"), "{}", spec.name);
            let is_total = spec.name.ends_with("_total");
            assert_eq!(is_total, spec.kind == Kind::Counter, "{}", spec.name);
            if spec.unit == Unit::Bytes {
                assert!(spec.name.contains("_bytes"), "{}", spec.name);
            }
            if spec.unit == Unit::Seconds {
                assert!(spec.name.contains("_seconds"), "{}", spec.name);
            }
            assert_eq!(spec.labels[0], "host", "{}", spec.name);
            let labels: HashSet<_> = spec.labels.iter().collect();
            assert_eq!(labels.len(), spec.labels.len(), "{}", spec.name);
            assert!(!spec.labels.contains(&"le"), "{}", spec.name);
        }
    }

    #[test]
    fn families_resolve_histogram_samples() {
        let hist = "mpib_transfer_latency_seconds";
        assert_eq!(
            family_of(&format!("{hist}_bucket")).map(|s| s.name),
            Some(hist)
        );
        assert_eq!(
            family_of(&format!("{hist}_count")).map(|s| s.name),
            Some(hist)
        );
        assert_eq!(
            family_of("mpib_srq_depth").map(|s| s.name),
            Some("mpib_srq_depth")
        );
        assert!(family_of(&format!("{}_bucket", SRQ_DEPTH.name)).is_none());
        // (Built from pieces: tests/dashboards.rs reads the string literals of this file.)
        assert!(family_of(concat!("mpib", "_nope")).is_none());
    }
}
