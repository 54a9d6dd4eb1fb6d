//! The Prometheus side: a `metrics-exporter-prometheus` recorder owned by the collector (no
//! global recorder), fed only through catalog specs, plus the histogram text the collector
//! renders itself.
//!
//! # Series lifetime
//!
//! The recorder removes a series that has not been updated for the idle timeout (3 scan
//! intervals); every live series is updated on every scan, so only series of writers that went
//! away (or connections that closed) disappear. Counters are set with `Counter::absolute`,
//! which keeps the maximum of the old and new values: a restarted writer (same `host`/`pid`,
//! counters back at 0) must therefore wait until its old series are gone before its new values
//! are written. [`has_process`] is how the collector checks that.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockWriteGuard};
use std::time::Duration;

use metrics::{Key, KeyName, Label, Level, Metadata, Recorder, SharedString};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};
use metrics_util::MetricKindMask;
use tracing::error;

use crate::catalog::{Kind, MetricSpec, CATALOG};
use crate::latency;
use crate::points::ScanPoints;

static METADATA: Metadata<'static> =
    Metadata::new("mpib_collector", Level::INFO, Some(module_path!()));

/// The latency histogram series of one scan (`latency::series_text` output).
#[derive(Clone, Debug, Default)]
pub struct Histograms {
    /// Series of the writers exported by the scan.
    pub live: Vec<String>,
    /// `(host, pid, series)` of writers that went away, shown while their other series last.
    pub fading: Vec<(String, u32, Vec<String>)>,
}

/// Owns the recorder and the last scan's histogram series; cheap to share (`Arc`).
pub struct Exporter {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
    histograms: Mutex<Arc<Histograms>>,
    points: Mutex<Arc<ScanPoints>>,
    scan_lock: RwLock<()>,
}

impl Exporter {
    /// A recorder whose series expire after `idle_timeout` without an update, with every
    /// catalog family described (`# HELP`).
    pub fn new(idle_timeout: Duration) -> Exporter {
        let recorder = PrometheusBuilder::new()
            .idle_timeout(MetricKindMask::ALL, Some(idle_timeout))
            .build_recorder();
        for spec in CATALOG {
            let name = KeyName::from_const_str(spec.name);
            let unit = spec.unit.metrics_unit();
            let help = SharedString::const_str(spec.help);
            match spec.kind {
                Kind::Counter => recorder.describe_counter(name, unit, help),
                Kind::Gauge => recorder.describe_gauge(name, unit, help),
                Kind::Histogram => {}
            }
        }
        let handle = recorder.handle();
        Exporter {
            recorder,
            handle,
            histograms: Mutex::new(Arc::new(Histograms::default())),
            points: Mutex::new(Arc::new(ScanPoints::default())),
            scan_lock: RwLock::new(()),
        }
    }

    fn key(spec: &'static MetricSpec, values: &[&str]) -> Option<Key> {
        if values.len() != spec.labels.len() {
            error!(
                metric = spec.name,
                "internal error: {} label values for {} labels",
                values.len(),
                spec.labels.len()
            );
            return None;
        }
        let labels: Vec<Label> = spec
            .labels
            .iter()
            .zip(values)
            .map(|(name, value)| Label::new(*name, (*value).to_owned()))
            .collect();
        Some(Key::from_parts(spec.name, labels))
    }

    /// Set counter `spec{labels = values}` to `value` (the writer's running total).
    pub fn counter(&self, spec: &'static MetricSpec, values: &[&str], value: u64) {
        debug_assert_eq!(spec.kind, Kind::Counter, "{}", spec.name);
        if let Some(key) = Exporter::key(spec, values) {
            self.recorder
                .register_counter(&key, &METADATA)
                .absolute(value);
        }
    }

    /// Set gauge `spec{labels = values}` to `value`.
    pub fn gauge(&self, spec: &'static MetricSpec, values: &[&str], value: f64) {
        debug_assert_eq!(spec.kind, Kind::Gauge, "{}", spec.name);
        if let Some(key) = Exporter::key(spec, values) {
            self.recorder.register_gauge(&key, &METADATA).set(value);
        }
    }

    /// Every point of the last finished scan (empty before the first), for the OTLP metrics
    /// exporter.
    pub fn last_points(&self) -> Arc<ScanPoints> {
        Arc::clone(&self.points.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Publish a finished scan's points.
    pub fn set_points(&self, points: ScanPoints) {
        *self.points.lock().unwrap_or_else(PoisonError::into_inner) = Arc::new(points);
    }

    /// Replace the latency histogram series appended to every scrape.
    pub fn set_histograms(&self, histograms: Histograms) {
        *self
            .histograms
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Arc::new(histograms);
    }

    /// The whole exposition: the recorder's families, then the latency histogram family
    /// (waits for a scan in progress). The histograms of writers that went away are kept
    /// exactly as long as the recorder still shows their other series.
    pub fn render(&self) -> String {
        let _scan = self
            .scan_lock
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        let mut text = self.handle.render();
        let histograms = Arc::clone(
            &self
                .histograms
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        let fading = histograms
            .fading
            .iter()
            .filter(|(host, pid, _)| has_process(&text, host, *pid))
            .flat_map(|(_, _, lines)| lines.iter().cloned());
        let series: Vec<String> = histograms.live.iter().cloned().chain(fading).collect();
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(&latency::family(&series));
        text
    }

    /// Hold off [`render`](Exporter::render) while a scan updates the series, so that a
    /// scrape never sees a half-written scan.
    pub fn scan_guard(&self) -> RwLockWriteGuard<'_, ()> {
        self.scan_lock
            .write()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The recorder's text alone, without waiting for a scan (this is also what expires idle
    /// series). For [`has_process`].
    pub fn recorder_text(&self) -> String {
        self.handle.render()
    }
}

/// Whether `text` (from [`Exporter::recorder_text`]) holds a series of the writer
/// `host`/`pid`.
pub fn has_process(text: &str, host: &str, pid: u32) -> bool {
    let needle = format!("{{host=\"{}\",pid=\"{pid}\"", escape_label(host));
    text.contains(&needle)
}

/// Escape a label value for the text format (backslash, double quote, newline).
pub fn escape_label(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// `{name="value",...}` with the spec's label names, plus `extra` pairs at the end.
pub fn label_block(spec: &MetricSpec, values: &[&str], extra: &[(&str, &str)]) -> String {
    let mut out = String::from("{");
    let pairs = spec.labels.iter().copied().zip(values.iter().copied());
    for (i, (name, value)) in pairs.chain(extra.iter().copied()).enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(out, "{name}=\"{}\"", escape_label(value));
    }
    out.push('}');
    out
}

/// The `# HELP` and `# TYPE` lines of a family, followed by `body` (its samples); empty when
/// `body` is.
pub fn family_text(spec: &MetricSpec, body: &str) -> String {
    if body.is_empty() {
        return String::new();
    }
    format!(
        "# HELP {name} {help}\n# TYPE {name} {kind}\n{body}\n",
        name = spec.name,
        help = spec.help,
        kind = spec.kind.as_str()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{PROBES_FILES, RAIL_TX_BYTES, SRQ_DEPTH};

    #[test]
    fn renders_catalog_names_and_expires_idle_series() {
        let exporter = Exporter::new(Duration::from_millis(50));
        let rail = ["h", "7", "sout", "mlx5_0", "1"];
        exporter.counter(&RAIL_TX_BYTES, &rail, 10);
        exporter.counter(&RAIL_TX_BYTES, &rail, 5); // absolute keeps the maximum
        exporter.gauge(&SRQ_DEPTH, &rail, 3.0);
        exporter.gauge(&PROBES_FILES, &["h", "extra"], 1.0); // wrong arity: dropped
        let text = exporter.render();
        assert!(
            text.contains("# TYPE mpib_rail_tx_bytes_total counter"),
            "{text}"
        );
        assert!(text.contains(
            "mpib_rail_tx_bytes_total{host=\"h\",pid=\"7\",rail=\"sout\",device=\"mlx5_0\",port=\"1\"} 10"
        ), "{text}");
        assert!(!text.contains("mpib_probes_files"), "{text}");
        assert!(has_process(&exporter.recorder_text(), "h", 7));
        assert!(!has_process(&exporter.recorder_text(), "h", 8));
        std::thread::sleep(Duration::from_millis(120));
        assert!(
            !has_process(&exporter.recorder_text(), "h", 7),
            "still there after the idle timeout"
        );
        exporter.counter(&RAIL_TX_BYTES, &rail, 5);
        assert!(exporter.render().contains("} 5\n"));
    }

    #[test]
    fn labels_are_escaped() {
        assert_eq!(escape_label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
        let block = label_block(&PROBES_FILES, &["x\"y"], &[("le", "+Inf")]);
        assert_eq!(block, "{host=\"x\\\"y\",le=\"+Inf\"}");
    }
}
