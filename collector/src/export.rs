//! The collector's one metric model: every series it exports, as [`Point`]s, from which both
//! the Prometheus text ([`crate::prometheus`]) and the OTLP request ([`crate::otlp_metrics`])
//! are rendered. The families are the catalog's specs and those admitted from probes files'
//! declarations.
//!
//! # Series lifetime
//!
//! The scan decides it. A scan records the points of every writer it exports and the
//! collector's own, and publishes them whole with [`Exporter::finish_scan`]: a scrape or an
//! OTLP push sees one scan, never part of one. A series the scan did not record is gone (a
//! closed connection's, a NIC no exported writer uses).
//!
//! A writer that went away (its file closed, gone, superseded or dead) is exported one last
//! time, and [`Exporter::linger`] keeps those last points, together, for the linger time
//! (3 scan intervals), so that a scrape in between sees its final values. A newer writer of
//! the same `host`/`pid` (a restart) ends that at once: its series replace the old ones in the
//! scan that first exports it, and Prometheus sees a counter reset, which `rate()` handles.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tracing::error;

use crate::catalog::{Family, Kind, MetricSpec, CATALOG};
use crate::otlp_metrics::Pushed;
use crate::points::{HistogramValue, Owner, Point, ScanPoints, Value};
use crate::prometheus;

/// The last points of a writer that went away, kept for the linger time.
struct Lingering {
    owner: Owner,
    /// Until when, ns since the Unix epoch (scan time).
    until_ns: u64,
    points: Vec<Point>,
}

/// What the scan in progress has recorded, and what lingers from earlier scans.
#[derive(Default)]
struct Recording {
    points: Vec<Point>,
    lingering: Vec<Lingering>,
}

/// The model: the families, the scan being recorded and the last one published. Cheap to
/// share (`Arc`): the scan records, the HTTP endpoint and the OTLP pusher read.
pub struct Exporter {
    linger_ns: u64,
    recording: Mutex<Recording>,
    published: Mutex<Arc<ScanPoints>>,
    families: Mutex<HashMap<String, Arc<Family>>>,
    /// Names of the collector's own families ([`CATALOG`]): a probes file may not declare them.
    own: HashSet<&'static str>,
    /// OTLP metric exports that succeeded and that failed.
    otlp_exports: [AtomicU64; 2],
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

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Exporter {
    /// A model whose writers that went away keep their last points for `linger`.
    pub fn new(linger: Duration) -> Exporter {
        let families = CATALOG
            .iter()
            .map(|spec| (spec.name.to_owned(), Arc::new(Family::of_spec(spec))))
            .collect();
        Exporter {
            linger_ns: u64::try_from(linger.as_nanos()).unwrap_or(u64::MAX),
            recording: Mutex::new(Recording::default()),
            published: Mutex::new(Arc::new(ScanPoints::default())),
            families: Mutex::new(families),
            own: CATALOG.iter().map(|spec| spec.name).collect(),
            otlp_exports: [AtomicU64::new(0), AtomicU64::new(0)],
        }
    }

    fn lock_families(&self) -> MutexGuard<'_, HashMap<String, Arc<Family>>> {
        lock(&self.families)
    }

    /// Admit a family a probes file declares: the exporter's copy when another file declared
    /// it with the same kind, unit and labels (or it is new).
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
        Ok(family)
    }

    fn record<F>(&self, family: &F, kind: Kind, values: &[&str], start_ns: u64, value: Value)
    where
        F: FamilyRef + ?Sized,
    {
        let family = family.resolve(self);
        if values.len() != family.labels.len() || family.kind != kind {
            error!(
                metric = family.name,
                "internal error: a {} with {} label values for a {} with {} labels",
                kind.as_str(),
                values.len(),
                family.kind.as_str(),
                family.labels.len()
            );
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
        lock(&self.recording).points.push(point);
    }

    /// Set counter `family{labels = values}` to `value` (the writer's running total, counted
    /// since `start_ns`).
    pub fn counter<F>(&self, family: &F, values: &[&str], value: u64, start_ns: u64)
    where
        F: FamilyRef + ?Sized,
    {
        self.record(
            family,
            Kind::Counter,
            values,
            start_ns,
            Value::Counter(value),
        );
    }

    /// Set gauge `family{labels = values}` to `value` (of a series that exists since
    /// `start_ns`).
    pub fn gauge<F>(&self, family: &F, values: &[&str], value: f64, start_ns: u64)
    where
        F: FamilyRef + ?Sized,
    {
        self.record(family, Kind::Gauge, values, start_ns, Value::Gauge(value));
    }

    /// Set histogram `family{labels = values}` to `value` (cumulative since `start_ns`).
    pub fn histogram<F>(&self, family: &F, values: &[&str], value: HistogramValue, start_ns: u64)
    where
        F: FamilyRef + ?Sized,
    {
        let value = Value::Histogram(value);
        self.record(family, Kind::Histogram, values, start_ns, value);
    }

    /// The writer `host`/`pid` that started at `start_ns` went away: the points this scan
    /// recorded for it (its last export) are kept, together, for the linger time after
    /// `now_ns`, or until a newer writer of the same `host`/`pid` is exported.
    pub fn linger(&self, host: &str, pid: u32, start_ns: u64, now_ns: u64) {
        let owner = Owner::Writer {
            host: host.to_owned(),
            pid: pid.to_string(),
        };
        let mut recording = lock(&self.recording);
        let (last, others): (Vec<Point>, Vec<Point>) = std::mem::take(&mut recording.points)
            .into_iter()
            .partition(|p| p.start_ns == start_ns && p.owner() == owner);
        recording.points = others;
        recording.lingering.retain(|l| l.owner != owner);
        recording.lingering.push(Lingering {
            owner,
            until_ns: now_ns.saturating_add(self.linger_ns),
            points: last,
        });
    }

    /// End the scan of `time_ns`: publish what it recorded, with the last points of the
    /// writers that still linger (a series recorded twice keeps its last value).
    pub fn finish_scan(&self, time_ns: u64) {
        let mut recording = lock(&self.recording);
        let mut points = std::mem::take(&mut recording.points);
        let live: HashSet<Owner> = points.iter().map(Point::owner).collect();
        recording
            .lingering
            .retain(|l| l.until_ns > time_ns && !live.contains(&l.owner));
        for lingering in &recording.lingering {
            points.extend(lingering.points.iter().cloned());
        }
        drop(recording);
        self.publish(ScanPoints {
            time_ns,
            points: last_of_each_series(points),
        });
    }

    /// Publish a finished scan's points as they are (for tests and tools that build a scan
    /// themselves).
    pub fn publish(&self, points: ScanPoints) {
        *lock(&self.published) = Arc::new(points);
    }

    /// Every point of the last published scan (empty before the first).
    pub fn last_points(&self) -> Arc<ScanPoints> {
        Arc::clone(&lock(&self.published))
    }

    /// The last published scan as Prometheus text.
    pub fn render(&self) -> String {
        prometheus::render(&self.last_points())
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
}

/// `points` with each series (family and labels) once, at its first place with its last
/// value.
fn last_of_each_series(points: Vec<Point>) -> Vec<Point> {
    let mut index: HashMap<(String, Vec<(String, String)>), usize> = HashMap::new();
    let mut out: Vec<Point> = Vec::with_capacity(points.len());
    for point in points {
        let key = (point.family.name.clone(), point.labels.clone());
        match index.get(&key) {
            Some(&at) => out[at] = point,
            None => {
                index.insert(key, out.len());
                out.push(point);
            }
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
