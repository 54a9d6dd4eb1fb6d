//! The collector's series as plain data: what one scan publishes, from which the Prometheus
//! text ([`crate::prometheus`]) and the OTLP request ([`crate::otlp_metrics`]) are both rendered.
//!
//! Every point carries its family (name, kind, unit, help), its label pairs in the family's
//! order, the start of its cumulative interval (the writer's start for a writer's series, the
//! collector's start for its own) and its value.

use std::sync::Arc;

use crate::catalog::{Kind, Unit};

/// A metric family as exported: from the collector's catalog or declared in a probes file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Family {
    /// Full metric name, as in Prometheus (`mpib_rail_tx_bytes_total`).
    pub name: String,
    /// Counter, gauge or histogram.
    pub kind: Kind,
    /// Unit of the values.
    pub unit: Unit,
    /// Help text.
    pub help: String,
    /// Label names, in the order the exporter writes them.
    pub labels: &'static [&'static str],
}

/// A histogram's value: explicit upper bounds (seconds) and per-bucket counts.
#[derive(Clone, Debug, PartialEq)]
pub struct HistogramValue {
    /// Upper bounds of the finite buckets, ascending.
    pub bounds: Vec<f64>,
    /// Observations per bucket, not cumulative: `bounds.len() + 1` entries, the last one above
    /// every bound.
    pub counts: Vec<u64>,
    /// Sum of the observations (seconds).
    pub sum: f64,
    /// Number of observations (the sum of `counts`).
    pub count: u64,
}

/// A point's value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// A monotonic running total.
    Counter(u64),
    /// A value that goes up and down.
    Gauge(f64),
    /// A cumulative histogram.
    Histogram(HistogramValue),
}

/// One series' value in one scan.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    /// Its family.
    pub family: Arc<Family>,
    /// `(label name, value)` in the family's label order.
    pub labels: Vec<(String, String)>,
    /// Start of the cumulative interval, ns since the Unix epoch.
    pub start_ns: u64,
    /// The value.
    pub value: Value,
}

/// Every point of one scan.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ScanPoints {
    /// When the scan ran, ns since the Unix epoch.
    pub time_ns: u64,
    /// The points, in export order.
    pub points: Vec<Point>,
}

/// Whose series a point is: a writer's (`host`, `pid` labels) or the collector's own.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Owner {
    /// A writer process, by its `host` and `pid` labels.
    Writer {
        /// The `host` label.
        host: String,
        /// The `pid` label.
        pid: String,
    },
    /// The collector itself (its health, the NICs' counters).
    Collector,
}

impl Point {
    /// A point of `family` with label `values` in the family's label order (as many as it has).
    pub fn new(family: Arc<Family>, values: &[&str], start_ns: u64, value: Value) -> Point {
        let labels = family
            .labels
            .iter()
            .zip(values)
            .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
            .collect();
        Point {
            family,
            labels,
            start_ns,
            value,
        }
    }

    /// The `(name, value)` label pairs, borrowed.
    pub fn label_pairs(&self) -> impl Iterator<Item = (&str, &str)> + Clone {
        self.labels.iter().map(|(n, v)| (n.as_str(), v.as_str()))
    }

    /// Whose series this is: a point with a `pid` label belongs to that writer.
    pub fn owner(&self) -> Owner {
        match self.label("pid") {
            Some(pid) => Owner::Writer {
                host: self.label("host").unwrap_or_default().to_owned(),
                pid: pid.to_owned(),
            },
            None => Owner::Collector,
        }
    }

    /// Whether this is a series of the writer `host`/`pid` (its labels), compared in place.
    pub fn is_of(&self, host: &str, pid: &str) -> bool {
        self.label("pid") == Some(pid) && self.label("host") == Some(host)
    }

    /// The value of label `name`, if the point has it.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

impl Unit {
    /// The unit as OTLP writes it (UCUM): `By`, `s`, `1`.
    pub const fn ucum(self) -> &'static str {
        match self {
            Unit::Bytes => "By",
            Unit::Seconds => "s",
            Unit::Ratio | Unit::Count | Unit::Info => "1",
        }
    }
}
