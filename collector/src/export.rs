//! The Prometheus side: a `metrics-exporter-prometheus` recorder owned by the collector (no
//! global recorder), fed only through known families (the catalog's specs and the families
//! admitted from probes files' declarations), plus the histogram text the collector renders
//! itself. Every value set also becomes a point of the scan, for the OTLP export.
//!
//! # Series lifetime
//!
//! The recorder removes a series that has not been updated for the idle timeout (3 scan
//! intervals); every live series is updated on every scan, so only series of writers that went
//! away (or connections that closed) disappear. Counters are set with `Counter::absolute`,
//! which keeps the maximum of the old and new values: a restarted writer (same `host`/`pid`,
//! counters back at 0) must therefore wait until its old series are gone before its new values
//! are written. [`has_process`] is how the collector checks that.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockWriteGuard};
use std::time::Duration;

use metrics::{Key, KeyName, Label, Level, Metadata, Recorder, SharedString};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};
use metrics_util::MetricKindMask;
use tracing::error;

use crate::catalog::{Family, Kind, MetricSpec, CATALOG};
use crate::latency;
use crate::otlp_metrics::Pushed;
use crate::points::{HistogramValue, Point, ScanPoints, Value};

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
    pending: Mutex<Vec<Point>>,
    /// Whether scans record points at all: only the OTLP metrics export reads them.
    record_points: AtomicBool,
    families: Mutex<HashMap<String, Arc<Family>>>,
    /// Names of the collector's own families ([`CATALOG`]): a probes file may not declare them.
    own: std::collections::HashSet<&'static str>,
    /// OTLP metric exports that succeeded and that failed.
    otlp_exports: [AtomicU64; 2],
    scan_lock: RwLock<()>,
}

/// A family as the exporter's methods take it: a catalog spec, or a family admitted with
/// [`Exporter::admit`].
pub trait FamilyRef {
    /// The exporter's shared copy of the family.
    fn resolve(&self, exporter: &Exporter) -> Arc<Family>;
}

impl FamilyRef for MetricSpec {
    fn resolve(&self, exporter: &Exporter) -> Arc<Family> {
        let mut families = exporter.lock_families();
        let family = families
            .entry(self.name.to_owned())
            .or_insert_with(|| Arc::new(Family::of_spec(self)));
        Arc::clone(family)
    }
}

impl FamilyRef for Arc<Family> {
    fn resolve(&self, _: &Exporter) -> Arc<Family> {
        Arc::clone(self)
    }
}

impl Exporter {
    /// A recorder whose series expire after `idle_timeout` without an update, with every
    /// catalog family described (`# HELP`).
    pub fn new(idle_timeout: Duration) -> Exporter {
        let recorder = PrometheusBuilder::new()
            .idle_timeout(MetricKindMask::ALL, Some(idle_timeout))
            .build_recorder();
        let handle = recorder.handle();
        let exporter = Exporter {
            recorder,
            handle,
            histograms: Mutex::new(Arc::new(Histograms::default())),
            points: Mutex::new(Arc::new(ScanPoints::default())),
            pending: Mutex::new(Vec::new()),
            record_points: AtomicBool::new(false),
            families: Mutex::new(HashMap::new()),
            own: CATALOG.iter().map(|spec| spec.name).collect(),
            otlp_exports: [AtomicU64::new(0), AtomicU64::new(0)],
            scan_lock: RwLock::new(()),
        };
        for spec in CATALOG {
            let family = spec.resolve(&exporter);
            exporter.describe(&family);
        }
        exporter
    }

    fn lock_families(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Family>>> {
        self.families.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn describe(&self, family: &Family) {
        let name = KeyName::from(family.name.clone());
        let unit = family.unit.metrics_unit();
        let help = SharedString::from(family.help.clone());
        match family.kind {
            Kind::Counter => self.recorder.describe_counter(name, unit, help),
            Kind::Gauge => self.recorder.describe_gauge(name, unit, help),
            Kind::Histogram => {}
        }
    }

    /// Admit a family a probes file declares: the exporter's copy when another file declared
    /// it with the same kind, unit and labels (or it is new, and then described).
    ///
    /// # Errors
    ///
    /// The name is one of the collector's own families (two values would feed one series), is
    /// declared by another file with another kind, unit or label set, or is a histogram's
    /// sample name.
    pub fn admit(&self, family: Family) -> Result<Arc<Family>, String> {
        if self.own.contains(family.name.as_str()) {
            return Err(format!(
                "{:?} is one of the collector's own families",
                family.name
            ));
        }
        let mut families = self.lock_families();
        if let Some(known) = families.get(&family.name) {
            let same = known.kind == family.kind
                && known.unit == family.unit
                && known.labels == family.labels;
            return if same {
                Ok(Arc::clone(known))
            } else {
                Err(format!(
                    "{:?} is already exported as a {} in {} with labels {:?}",
                    family.name,
                    known.kind.as_str(),
                    known.unit.as_str(),
                    known.labels
                ))
            };
        }
        let histogram_sample = ["_bucket", "_sum", "_count"].iter().any(|suffix| {
            family
                .name
                .strip_suffix(suffix)
                .and_then(|base| families.get(base))
                .is_some_and(|f| f.kind == Kind::Histogram)
        });
        if histogram_sample {
            return Err(format!("{:?} is a histogram's sample name", family.name));
        }
        let family = Arc::new(family);
        families.insert(family.name.clone(), Arc::clone(&family));
        drop(families);
        self.describe(&family);
        Ok(family)
    }

    fn key(family: &Family, values: &[&str]) -> Option<Key> {
        if values.len() != family.labels.len() {
            error!(
                metric = family.name,
                "internal error: {} label values for {} labels",
                values.len(),
                family.labels.len()
            );
            return None;
        }
        let labels: Vec<Label> = family
            .labels
            .iter()
            .zip(values)
            .map(|(name, value)| Label::new(*name, (*value).to_owned()))
            .collect();
        Some(Key::from_parts(family.name.clone(), labels))
    }

    /// Record points from now on (off by default: without an OTLP metrics export nothing reads
    /// them, and a scan need not copy every label).
    pub fn record_points(&self) {
        self.record_points.store(true, Ordering::Relaxed);
    }

    fn push(&self, family: Arc<Family>, values: &[&str], start_ns: u64, value: Value) {
        if !self.record_points.load(Ordering::Relaxed) {
            return;
        }
        let labels = family
            .labels
            .iter()
            .zip(values)
            .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
            .collect();
        let point = Point {
            family,
            labels,
            start_ns,
            value,
        };
        self.pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(point);
    }

    /// Set counter `family{labels = values}` to `value` (the writer's running total, counted
    /// since `start_ns`).
    pub fn counter<F>(&self, family: &F, values: &[&str], value: u64, start_ns: u64)
    where
        F: FamilyRef + ?Sized,
    {
        let family = family.resolve(self);
        debug_assert_eq!(family.kind, Kind::Counter, "{}", family.name);
        if let Some(key) = Exporter::key(&family, values) {
            self.recorder
                .register_counter(&key, &METADATA)
                .absolute(value);
            self.push(family, values, start_ns, Value::Counter(value));
        }
    }

    /// Set gauge `family{labels = values}` to `value` (of a series that exists since
    /// `start_ns`).
    pub fn gauge<F>(&self, family: &F, values: &[&str], value: f64, start_ns: u64)
    where
        F: FamilyRef + ?Sized,
    {
        let family = family.resolve(self);
        debug_assert_eq!(family.kind, Kind::Gauge, "{}", family.name);
        if let Some(key) = Exporter::key(&family, values) {
            self.recorder.register_gauge(&key, &METADATA).set(value);
            self.push(family, values, start_ns, Value::Gauge(value));
        }
    }

    /// Record a histogram point for the OTLP export (the Prometheus text of histograms is
    /// rendered by [`latency`] and handed over with [`set_histograms`](Exporter::set_histograms)).
    pub fn histogram<F>(&self, family: &F, values: &[&str], value: HistogramValue, start_ns: u64)
    where
        F: FamilyRef + ?Sized,
    {
        let family = family.resolve(self);
        if values.len() == family.labels.len() {
            self.push(family, values, start_ns, Value::Histogram(value));
        }
    }

    /// Count one OTLP metrics export attempt (an unchanged scan, not sent, is not counted).
    pub fn count_otlp_export(&self, pushed: &Pushed) {
        let index = match pushed {
            Pushed::Unchanged => return,
            Pushed::Sent => 0,
            Pushed::Failed(_) => 1,
        };
        self.otlp_exports[index].fetch_add(1, Ordering::Relaxed);
    }

    /// OTLP metrics exports so far: `(succeeded, failed)`.
    pub fn otlp_exports(&self) -> (u64, u64) {
        let [ok, failed] = &self.otlp_exports;
        (ok.load(Ordering::Relaxed), failed.load(Ordering::Relaxed))
    }

    /// End a scan: publish the points recorded since the last call as the scan of `time_ns`.
    pub fn finish_points(&self, time_ns: u64) {
        let points =
            std::mem::take(&mut *self.pending.lock().unwrap_or_else(PoisonError::into_inner));
        self.set_points(ScanPoints { time_ns, points });
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
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::catalog::{declared_family, PROBES_FILES, PROBES_REAPED};
    use mpib_probes::{Declared, DECLARATIONS};

    fn declared(exporter: &Exporter, name: &str) -> Arc<Family> {
        let d = DECLARATIONS.iter().find(|d| d.name == name).unwrap();
        exporter
            .admit(declared_family(&Declared::from(d)).unwrap())
            .unwrap()
    }

    #[test]
    fn renders_catalog_names_and_expires_idle_series() {
        let exporter = Exporter::new(Duration::from_millis(50));
        exporter.record_points();
        let rail = ["h", "7", "sout", "mlx5_0", "1"];
        let tx = declared(&exporter, "mpib_rail_tx_bytes_total");
        let depth = declared(&exporter, "mpib_srq_depth");
        exporter.counter(&tx, &rail, 10, 1);
        exporter.counter(&tx, &rail, 5, 1); // absolute keeps the maximum
        exporter.gauge(&depth, &rail, 3.0, 1);
        exporter.gauge(&PROBES_FILES, &["h", "extra"], 1.0, 1); // wrong arity: dropped
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
        exporter.counter(&tx, &rail, 5, 1);
        assert!(exporter.render().contains("} 5\n"));
        exporter.finish_points(42);
        let points = exporter.last_points();
        assert_eq!(points.time_ns, 42);
        let values: Vec<&Value> = points.points.iter().map(|p| &p.value).collect();
        let want = [
            Value::Counter(10),
            Value::Counter(5),
            Value::Gauge(3.0),
            Value::Counter(5),
        ];
        assert_eq!(values, want.iter().collect::<Vec<_>>());
        assert_eq!(points.points[0].label("rail"), Some("sout"));
    }

    #[test]
    fn a_declared_name_cannot_take_another_familys() {
        let exporter = Exporter::new(Duration::from_secs(1));
        // Same kind, unit and labels as the collector's own: still refused.
        let own = Family::of_spec(&PROBES_REAPED);
        let e = exporter.admit(own).unwrap_err();
        assert!(e.contains("one of the collector's own families"), "{e}");
        let first = Family {
            name: "mpib_other".to_owned(),
            ..Family::of_spec(&PROBES_FILES)
        };
        exporter.admit(first.clone()).unwrap();
        let other_kind = Family {
            kind: Kind::Counter,
            ..first
        };
        let e = exporter.admit(other_kind).unwrap_err();
        assert!(e.contains("already exported as a gauge"), "{e}");
        let sample = Family {
            name: "mpib_transfer_latency_seconds_sum".to_owned(),
            ..Family::of_spec(&PROBES_FILES)
        };
        assert!(exporter.admit(sample).unwrap_err().contains("histogram"));
        let new = Family {
            name: "mpib_new".to_owned(),
            ..Family::of_spec(&PROBES_FILES)
        };
        let first = exporter.admit(new.clone()).unwrap();
        assert!(Arc::ptr_eq(&first, &exporter.admit(new).unwrap()));
    }

    #[test]
    fn labels_are_escaped() {
        assert_eq!(escape_label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
        let block = label_block(&PROBES_FILES, &["x\"y"], &[("le", "+Inf")]);
        assert_eq!(block, "{host=\"x\\\"y\",le=\"+Inf\"}");
    }
}
