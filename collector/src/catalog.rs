//! The metric catalog: the families the collector itself defines, as one static table, plus
//! the values every probes file declares (`mpib_probes::declared`), exported generically.
//!
//! Both are a contract. Dashboards, alert rules and `docs/OBSERVABILITY.md` are written against
//! these names and labels; the document's table is generated from [`families`], and the tests
//! check a scrape and the document against it. A value a newer writer declares is exported
//! under the name its file gives, with the rail or process labels, without a collector change.

use mpib_probes::{Declared, Scope, ValueKind, ValueUnit, DECLARATIONS};

pub use crate::points::Family;

/// How a family behaves: counter, gauge or histogram (a classic Prometheus histogram, rendered
/// from the writer's buckets).
pub use mpib_node::exposition::Kind;

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
const CONN_LABELS: &[&str] = &[
    "host",
    "pid",
    "nccl_device",
    "peer",
    "direction",
    "path_class",
    "mode",
];
const CONN_RAIL_LABELS: &[&str] = &[
    "host",
    "pid",
    "nccl_device",
    "peer",
    "direction",
    "path_class",
    "mode",
    "rail",
];
const CONN_INFO_LABELS: &[&str] = &[
    "host",
    "pid",
    "nccl_device",
    "peer",
    "direction",
    "path_class",
    "mode",
    "hint_slot",
];
const PEER_LABELS: &[&str] = &["host", "pid", "nccl_device", "peer_host", "direction"];
const PEER_RAIL_LABELS: &[&str] = &[
    "host",
    "pid",
    "nccl_device",
    "peer_host",
    "direction",
    "rail",
];
const OPERATION_LABELS: &[&str] = &[
    "host",
    "pid",
    "nccl_device",
    "direction",
    "function",
    "algorithm",
    "protocol",
];
const DEGRADED_LABELS: &[&str] = &["host", "pid", "nccl_device", "rail"];
const COLLECTOR_LABELS: &[&str] = &["host"];
const SKIP_LABELS: &[&str] = &["host", "reason"];
const RESULT_LABELS: &[&str] = &["host", "result"];
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
    /// Post-to-completion latency.
    TRANSFER_LATENCY = "mpib_transfer_latency_seconds", Histogram, Seconds, RAIL_LABELS,
        "Post-to-completion latency of the rail's transfers (log2 buckets).";
    /// Transfers by active rail mask.
    TRANSFERS = "mpib_transfers_total", Counter, Count, MASK_LABELS,
        "Completed transfers by the rails they used: mask sout, sup or both.";
    /// Bytes per connection and rail.
    CONNECTION_BYTES = "mpib_connection_bytes_total", Counter, Bytes, CONN_RAIL_LABELS,
        "Bytes moved per peer connection and rail (connections with equal labels summed), for \
         the process's first --connection-series label sets.";
    /// Connection attributes.
    CONNECTION_INFO = "mpib_connection_info", Gauge, Info, CONN_INFO_LABELS,
        "Open connections, 1 per label set (the process's first --connection-series); \
         hint_slot is the agent hint table slot.";
    /// The agent's SUP share hint.
    CONNECTION_HINT_SUP_RATIO = "mpib_connection_hint_sup_ratio", Gauge, Ratio, CONN_LABELS,
        "Advanced mode: the agent's current SUP share hint (sup_bw / 1024, at most 1).";
    /// Bytes per fused device, peer host, direction and rail: every connection.
    PEER_BYTES = "mpib_peer_bytes_total", Counter, Bytes, PEER_RAIL_LABELS,
        "Bytes moved per fused device, peer host and direction, on each rail: every connection \
         of the process, listed one by one in mpib_connection_bytes_total or not.";
    /// Open connections per fused device, peer host and direction.
    PEER_CONNECTIONS = "mpib_peer_connections", Gauge, Count, PEER_LABELS,
        "Open connections per fused device, peer host and direction (every connection of the \
         process).";
    /// Open connections without series of their own.
    CONNECTIONS_UNLISTED = "mpib_connections_unlisted", Gauge, Count, PROCESS_LABELS,
        "Open connections with no mpib_connection_* series of their own: their label sets came \
         after the process's first --connection-series (their bytes are in \
         mpib_peer_bytes_total).";
    /// Open connections by what NCCL said they serve.
    CONNECTIONS_BY_OPERATION = "mpib_connections_by_operation", Gauge, Count, OPERATION_LABELS,
        "Open connections by the operation NCCL said (setNetAttr, ABI v11 on) their last posted \
         transfer served: function, algorithm and protocol (- for point-to-point calls); \
         connections it said nothing about are not counted.";
    /// Open connections that failed a rail over.
    DEGRADED_CONNECTIONS = "mpib_degraded_connections", Gauge, Count, DEGRADED_LABELS,
        "Open connections of the fused device whose rail (the rail label) failed over: they run \
         on the other rail alone (docs/PROTOCOL.md section 10); 0 while none does. What \
         MpibRailFailedOver fires on.";
    /// How long the oldest of them has been degraded.
    DEGRADED_SECONDS = "mpib_degraded_seconds", Gauge, Seconds, DEGRADED_LABELS,
        "Time since the oldest of mpib_degraded_connections failed the rail over (0 while none \
         has).";
    /// Slow transfers read from the event ring.
    SLOW_TRANSFERS = "mpib_slow_transfers_total", Counter, Count, PROCESS_LABELS,
        "Slow transfers (over MPIB_SLOW_US) read from the event ring and exported as spans.";
    /// Threads holding a writer lane.
    WRITER_THREADS = "mpib_writer_threads", Gauge, Count, PROCESS_LABELS,
        "Threads of the process that hold a writer lane of its probes file (each counts into \
         its own copy, summed on export).";
    /// Event records lost to overwriting.
    EVENTS_DROPPED = "mpib_events_dropped_total", Counter, Count, PROCESS_LABELS,
        "Event ring records overwritten before the collector read them.";
    /// Heartbeat age.
    WRITER_HEARTBEAT_AGE = "mpib_writer_heartbeat_age_seconds", Gauge, Seconds, PROCESS_LABELS,
        "Time since the writer last refreshed its heartbeat.";
    /// Probes files found.
    PROBES_FILES = "mpib_probes_files", Gauge, Count, COLLECTOR_LABELS,
        "Probes files in the probes directory after the last scan (reaped ones excluded).";
    /// Declarations of probes files the collector does not export.
    DECLARATIONS_REFUSED = "mpib_probes_declarations_refused_total", Counter, Count,
        COLLECTOR_LABELS,
        "Value declarations in probes files that the collector does not export (a name taken by \
         another family or kind, a bad name, an unknown code), each counted once per file.";
    /// OTLP metrics exports.
    OTLP_METRIC_EXPORTS = "mpib_otlp_metric_exports_total", Counter, Count, RESULT_LABELS,
        "OTLP metrics exports by result: ok or failed (a failed one is retried with the next \
         scan; the log says why once).";
    /// Probes files refused.
    PROBES_SKIPPED = "mpib_probes_skipped_total", Counter, Count, SKIP_LABELS,
        "Probes files refused, by reason: version, corrupt, truncated or untrusted (each \
         counted once).";
    /// Dead writers' files removed.
    PROBES_REAPED = "mpib_probes_reaped_total", Counter, Count, COLLECTOR_LABELS,
        "Probes files of dead writers removed by the collector.";
    /// NIC counters from sysfs.
    NIC_COUNTER = "mpib_nic_counter_total", Counter, Count, NIC_LABELS,
        "The rail NICs' own sysfs counters and hw_counters (port_*_data in bytes).";
}

/// The family of a value a probes file declares, with the rail labels or the process labels.
///
/// # Errors
///
/// The name breaks the rules every exported family keeps (`mpib_` prefix, `[a-z0-9_]`, `_total`
/// exactly on counters); the message names it.
pub fn declared_family(d: &Declared) -> Result<Family, String> {
    let kind = match d.kind {
        ValueKind::Counter => Kind::Counter,
        ValueKind::Gauge => Kind::Gauge,
    };
    let unit = match d.unit {
        ValueUnit::Count => Unit::Count,
        ValueUnit::Bytes => Unit::Bytes,
    };
    let labels = match d.scope {
        Scope::Rail => RAIL_LABELS,
        Scope::Process => PROCESS_LABELS,
    };
    let name = &d.name;
    let charset = name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if !name.starts_with("mpib_") || !charset {
        return Err(format!("{name:?} is not a metric name mpib_[a-z0-9_]*"));
    }
    if name.ends_with("_total") != (kind == Kind::Counter) {
        return Err(format!(
            "{name:?}: counters and only counters end in _total"
        ));
    }
    Ok(Family {
        name: name.clone(),
        kind,
        unit,
        help: d.help.clone(),
        labels,
    })
}

impl Family {
    /// The family of a catalog spec.
    pub fn of_spec(spec: &MetricSpec) -> Family {
        Family {
            name: spec.name.to_owned(),
            kind: spec.kind,
            unit: spec.unit,
            help: spec.help.to_owned(),
            labels: spec.labels,
        }
    }
}

/// Every family a collector of this version exports for writers of this version: the values
/// the probes crate declares (`mpib_probes::DECLARATIONS`), then the collector's own catalog.
pub fn families() -> Vec<Family> {
    let declared = DECLARATIONS.iter().filter_map(|d| {
        let family = declared_family(&Declared::from(d));
        debug_assert!(family.is_ok(), "{family:?}");
        family.ok()
    });
    declared
        .chain(CATALOG.iter().map(|s| Family::of_spec(s)))
        .collect()
}

/// The family named `name`, if this version exports it.
pub fn find(name: &str) -> Option<Family> {
    families().into_iter().find(|f| f.name == name)
}

/// The family a sample name belongs to: the name itself, or a histogram's name without its
/// `_bucket`, `_sum` or `_count` suffix.
pub fn family_of(sample: &str) -> Option<Family> {
    if let Some(family) = find(sample) {
        return Some(family);
    }
    ["_bucket", "_sum", "_count"].iter().find_map(|suffix| {
        let base = sample.strip_suffix(suffix)?;
        find(base).filter(|f| f.kind == Kind::Histogram)
    })
}

/// The families as the Markdown table `docs/OBSERVABILITY.md` embeds.
pub fn markdown_table() -> String {
    let mut out =
        String::from("| metric | type | unit | labels | meaning |\n|---|---|---|---|---|\n");
    for family in families() {
        let labels = family
            .labels
            .iter()
            .map(|l| format!("`{l}`"))
            .collect::<Vec<_>>()
            .join(", ");
        out.push_str(&format!(
            "| `{}` | {} | {} | {} | {} |\n",
            family.name,
            family.kind.as_str(),
            family.unit.as_str(),
            labels,
            family.help
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
        for spec in families() {
            assert!(seen.insert(spec.name.clone()), "duplicate {}", spec.name);
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
            Some(hist.to_owned())
        );
        assert_eq!(
            family_of(&format!("{hist}_count")).map(|s| s.name),
            Some(hist.to_owned())
        );
        assert_eq!(
            family_of("mpib_srq_depth").map(|s| s.name),
            Some("mpib_srq_depth".to_owned())
        );
        assert!(family_of("mpib_srq_depth_bucket").is_none());
        assert!(family_of("mpib_nope").is_none());
    }
}
