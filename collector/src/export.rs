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
//! time, and [`Exporter::linger`] keeps those last points, together, in that scan and the next
//! [`LINGER_SCANS`]` - 1` (3 scan intervals in all), so that a scrape in between sees its final
//! values. Counting scans, not reading a clock, keeps this right when the wall clock steps. A
//! newer writer of the same `host`/`pid` (a restart) ends that at once: its series replace the
//! old ones in the scan that first exports it, and Prometheus sees a counter reset, which
//! `rate()` handles.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use tracing::error;

use crate::catalog::{Family, Kind, MetricSpec, CATALOG};
use crate::otlp_metrics::Pushed;
use crate::points::{HistogramValue, Point, ScanPoints, Value};
use crate::prometheus;

/// Scans that publish a departed writer's last points: the scan of its last export and the
/// next two.
pub const LINGER_SCANS: u32 = 3;

/// The last points of a writer that went away, kept for [`LINGER_SCANS`].
struct Lingering {
    host: String,
    pid: String,
    /// Scans that will still publish them.
    scans_left: u32,
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
        if let Some(family) = families.get(self.name) {
            return Arc::clone(family);
        }
        let family = Arc::new(Family::of_spec(self));
        families.insert(self.name.to_owned(), Arc::clone(&family));
        family
    }
}

impl FamilyRef for Arc<Family> {
    fn resolve(&self, _: &Exporter) -> Arc<Family> {
        Arc::clone(self)
    }
}

impl Default for Exporter {
    fn default() -> Exporter {
        Exporter::new()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Exporter {
    /// An empty model that knows the catalog's families.
    pub fn new() -> Exporter {
        let families = CATALOG
            .iter()
            .map(|spec| (spec.name.to_owned(), Arc::new(Family::of_spec(spec))))
            .collect();
        Exporter {
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
        let point = Point::new(family, values, start_ns, value);
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
    /// recorded for it (its last export) are published by this scan and the next ones, up to
    /// [`LINGER_SCANS`] in all, unless a newer writer of the same `host`/`pid` is exported.
    pub fn linger(&self, host: &str, pid: u32, start_ns: u64) {
        let pid = pid.to_string();
        let mut recording = lock(&self.recording);
        let (last, others): (Vec<Point>, Vec<Point>) = std::mem::take(&mut recording.points)
            .into_iter()
            .partition(|p| p.start_ns == start_ns && p.is_of(host, &pid));
        recording.points = others;
        recording
            .lingering
            .retain(|l| l.host != host || l.pid != pid);
        recording.lingering.push(Lingering {
            host: host.to_owned(),
            pid,
            scans_left: LINGER_SCANS,
            points: last,
        });
    }

    /// End the scan of `time_ns`: publish what it recorded, with the last points of the
    /// writers that still linger (a series recorded twice keeps its last value).
    pub fn finish_scan(&self, time_ns: u64) {
        let mut recording = lock(&self.recording);
        let mut points = std::mem::take(&mut recording.points);
        if !recording.lingering.is_empty() {
            let live: HashSet<(&str, &str)> = points
                .iter()
                .filter_map(|p| Some((p.label("host")?, p.label("pid")?)))
                .collect();
            recording
                .lingering
                .retain(|l| l.scans_left > 0 && !live.contains(&(l.host.as_str(), l.pid.as_str())));
            drop(live);
            for lingering in &mut recording.lingering {
                points.extend(lingering.points.iter().cloned());
                lingering.scans_left -= 1;
            }
        }
        drop(recording);
        *lock(&self.published) = Arc::new(ScanPoints {
            time_ns,
            points: last_of_each_series(points),
        });
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

/// A series, borrowed from its point: the family's name and the label pairs.
type SeriesKey<'a> = (&'a str, &'a [(String, String)]);

/// `points` with each series (family and labels) once, with its last value (at the place of
/// that value). Only `mpib_connection_info` repeats a series in a scan (connections that share
/// a label set), so the common case is a check that copies nothing.
fn last_of_each_series(points: Vec<Point>) -> Vec<Point> {
    let mut last: HashMap<SeriesKey<'_>, usize> = HashMap::with_capacity(points.len());
    for (index, point) in points.iter().enumerate() {
        last.insert((point.family.name.as_str(), point.labels.as_slice()), index);
    }
    if last.len() == points.len() {
        return points;
    }
    let keep: HashSet<usize> = last.into_values().collect();
    points
        .into_iter()
        .enumerate()
        .filter_map(|(index, point)| keep.contains(&index).then_some(point))
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
