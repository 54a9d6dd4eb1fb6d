//! One scan's points as an OTLP `ExportMetricsServiceRequest`.
//!
//! Names, label names and values are the Prometheus ones. A point with a `pid` label belongs
//! to that writer: its resource is `service.name = mpib`, `host.name` = its `host` label,
//! `process.pid` = its pid. A point without one is the collector's own (`mpib-collector`, the
//! collector's host and pid). Counters are monotonic cumulative sums, gauges gauges,
//! histograms cumulative explicit-bucket histograms; every point keeps all of its labels as
//! string attributes.

use std::collections::HashMap;

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValueKind;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use opentelemetry_proto::tonic::metrics::v1::number_data_point::Value as NumberValue;
use opentelemetry_proto::tonic::metrics::v1::{
    AggregationTemporality, Gauge, Histogram, HistogramDataPoint, Metric, NumberDataPoint,
    ResourceMetrics, ScopeMetrics, Sum,
};
use opentelemetry_proto::tonic::resource::v1::Resource;

use crate::points::{HistogramValue, Owner, Point, ScanPoints, Value};

/// `service.name` of the writers' resources.
pub const WRITER_SERVICE: &str = "mpib";
/// `service.name` of the collector's own resource.
pub const COLLECTOR_SERVICE: &str = "mpib-collector";
/// Name of the instrumentation scope (its version is the crate's).
pub const SCOPE_NAME: &str = "mpib-collector";

/// The resource of a point's owner: a writer's, or the collector's on `collector_host`.
fn resource(owner: &Owner, collector_host: &str) -> Resource {
    let (service, host, pid) = match owner {
        Owner::Writer { host, pid } => (WRITER_SERVICE, host.as_str(), pid_value(pid)),
        Owner::Collector => (
            COLLECTOR_SERVICE,
            collector_host,
            AnyValueKind::IntValue(i64::from(std::process::id())),
        ),
    };
    Resource {
        attributes: vec![
            string_attribute("service.name", service),
            string_attribute("host.name", host),
            attribute("process.pid", pid),
        ],
        ..Resource::default()
    }
}

/// The pid as an int attribute (as a string if it is not a number).
fn pid_value(pid: &str) -> AnyValueKind {
    pid.parse::<i64>().map_or_else(
        |_| AnyValueKind::StringValue(pid.to_owned()),
        AnyValueKind::IntValue,
    )
}

fn attribute(key: &str, value: AnyValueKind) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue { value: Some(value) }),
        ..KeyValue::default()
    }
}

fn string_attribute(key: &str, value: &str) -> KeyValue {
    attribute(key, AnyValueKind::StringValue(value.to_owned()))
}

/// The metrics of one resource, with the index of each family's metric.
#[derive(Default)]
struct Group {
    metrics: Vec<Metric>,
    by_name: HashMap<String, usize>,
}

impl Group {
    fn add(&mut self, point: &Point, time_ns: u64) {
        let family = &point.family;
        let index = *self.by_name.entry(family.name.clone()).or_insert_with(|| {
            self.metrics.push(Metric {
                name: family.name.clone(),
                description: family.help.clone(),
                unit: family.unit.ucum().to_owned(),
                data: Some(empty_data(&point.value)),
                ..Metric::default()
            });
            self.metrics.len() - 1
        });
        let attributes: Vec<KeyValue> = point
            .labels
            .iter()
            .map(|(name, value)| string_attribute(name, value))
            .collect();
        let (start, time) = (point.start_ns, time_ns);
        let data = self.metrics.get_mut(index).and_then(|m| m.data.as_mut());
        match (data, &point.value) {
            (Some(Data::Sum(sum)), Value::Counter(v)) => {
                let value = NumberValue::AsInt(i64::try_from(*v).unwrap_or(i64::MAX));
                sum.data_points
                    .push(number_point(attributes, start, time, value));
            }
            (Some(Data::Gauge(gauge)), Value::Gauge(v)) => {
                let value = NumberValue::AsDouble(*v);
                gauge
                    .data_points
                    .push(number_point(attributes, start, time, value));
            }
            (Some(Data::Histogram(histogram)), Value::Histogram(h)) => {
                histogram
                    .data_points
                    .push(histogram_point(attributes, start, time, h));
            }
            _ => tracing::debug!(
                metric = family.name,
                "point of another kind than its family's first: not exported"
            ),
        }
    }
}

fn empty_data(value: &Value) -> Data {
    let cumulative = AggregationTemporality::Cumulative as i32;
    match value {
        Value::Counter(_) => Data::Sum(Sum {
            data_points: Vec::new(),
            aggregation_temporality: cumulative,
            is_monotonic: true,
        }),
        Value::Gauge(_) => Data::Gauge(Gauge::default()),
        Value::Histogram(_) => Data::Histogram(Histogram {
            data_points: Vec::new(),
            aggregation_temporality: cumulative,
        }),
    }
}

fn number_point(
    attributes: Vec<KeyValue>,
    start_ns: u64,
    time_ns: u64,
    value: NumberValue,
) -> NumberDataPoint {
    NumberDataPoint {
        attributes,
        start_time_unix_nano: start_ns,
        time_unix_nano: time_ns,
        value: Some(value),
        ..NumberDataPoint::default()
    }
}

fn histogram_point(
    attributes: Vec<KeyValue>,
    start_ns: u64,
    time_ns: u64,
    h: &HistogramValue,
) -> HistogramDataPoint {
    HistogramDataPoint {
        attributes,
        start_time_unix_nano: start_ns,
        time_unix_nano: time_ns,
        count: h.count,
        sum: Some(h.sum),
        bucket_counts: h.counts.clone(),
        explicit_bounds: h.bounds.clone(),
        ..HistogramDataPoint::default()
    }
}

/// The OTLP request for `scan`: one `ResourceMetrics` per writer (`host`, `pid`) and one for
/// the collector's own points (on `collector_host`), each with one scope whose metrics group
/// the points of a family. Resources and metrics keep the points' order of first appearance.
pub fn request(scan: &ScanPoints, collector_host: &str) -> ExportMetricsServiceRequest {
    let mut owners: Vec<Owner> = Vec::new();
    let mut groups: HashMap<Owner, Group> = HashMap::new();
    for point in &scan.points {
        let owner = point.owner();
        let group = groups.entry(owner.clone()).or_insert_with(|| {
            owners.push(owner);
            Group::default()
        });
        group.add(point, scan.time_ns);
    }
    let resource_metrics = owners
        .into_iter()
        .map(|owner| {
            let metrics = groups.remove(&owner).unwrap_or_default().metrics;
            ResourceMetrics {
                resource: Some(resource(&owner, collector_host)),
                scope_metrics: vec![ScopeMetrics {
                    scope: Some(InstrumentationScope {
                        name: SCOPE_NAME.to_owned(),
                        version: env!("CARGO_PKG_VERSION").to_owned(),
                        ..InstrumentationScope::default()
                    }),
                    metrics,
                    ..ScopeMetrics::default()
                }],
                ..ResourceMetrics::default()
            }
        })
        .collect();
    ExportMetricsServiceRequest { resource_metrics }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::float_cmp)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::catalog::{Kind, Unit};
    use crate::points::Family;

    fn family(name: &str, kind: Kind, unit: Unit) -> Arc<Family> {
        Arc::new(Family {
            name: name.to_owned(),
            kind,
            unit,
            help: format!("help of {name}"),
            labels: &[],
        })
    }

    fn point(family: &Arc<Family>, labels: &[(&str, &str)], start_ns: u64, value: Value) -> Point {
        Point {
            family: Arc::clone(family),
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            start_ns,
            value,
        }
    }

    /// Two writers on `h` (pids 7 and 8) and the collector's own gauge.
    fn scan() -> ScanPoints {
        let tx = family("mpib_rail_tx_bytes_total", Kind::Counter, Unit::Bytes);
        let depth = family("mpib_srq_depth", Kind::Gauge, Unit::Count);
        let latency = family(
            "mpib_transfer_latency_seconds",
            Kind::Histogram,
            Unit::Seconds,
        );
        let files = family("mpib_probes_files", Kind::Gauge, Unit::Count);
        let sout = [("host", "h"), ("pid", "7"), ("rail", "sout")];
        let sup = [("host", "h"), ("pid", "7"), ("rail", "sup")];
        let other = [("host", "h"), ("pid", "8"), ("rail", "sout")];
        let histogram = HistogramValue {
            bounds: vec![0.5, 1.0],
            counts: vec![1, 2, 3],
            sum: 4.5,
            count: 6,
        };
        ScanPoints {
            time_ns: 1_000,
            points: vec![
                point(&tx, &sout, 100, Value::Counter(10)),
                point(&files, &[("host", "collector")], 50, Value::Gauge(2.0)),
                point(&tx, &sup, 100, Value::Counter(u64::MAX)),
                point(&depth, &sout, 100, Value::Gauge(3.5)),
                point(&tx, &other, 200, Value::Counter(1)),
                point(&latency, &sout, 100, Value::Histogram(histogram)),
            ],
        }
    }

    fn attrs(list: &[KeyValue]) -> Vec<(String, AnyValueKind)> {
        list.iter()
            .map(|kv| (kv.key.clone(), kv.value.clone().unwrap().value.unwrap()))
            .collect()
    }

    fn s(v: &str) -> AnyValueKind {
        AnyValueKind::StringValue(v.to_owned())
    }

    fn resource_attrs(rm: &ResourceMetrics) -> Vec<(String, AnyValueKind)> {
        attrs(&rm.resource.as_ref().unwrap().attributes)
    }

    #[test]
    fn one_resource_per_writer_and_one_for_the_collector() {
        let request = request(&scan(), "collector-host");
        let rms = &request.resource_metrics;
        assert_eq!(rms.len(), 3);
        let want = |service: &str, host: &str, pid: i64| {
            vec![
                ("service.name".to_owned(), s(service)),
                ("host.name".to_owned(), s(host)),
                ("process.pid".to_owned(), AnyValueKind::IntValue(pid)),
            ]
        };
        assert_eq!(resource_attrs(&rms[0]), want("mpib", "h", 7));
        let own = i64::from(std::process::id());
        assert_eq!(
            resource_attrs(&rms[1]),
            want("mpib-collector", "collector-host", own)
        );
        assert_eq!(resource_attrs(&rms[2]), want("mpib", "h", 8));
        for rm in rms {
            assert_eq!(rm.scope_metrics.len(), 1);
            let scope = rm.scope_metrics[0].scope.as_ref().unwrap();
            assert_eq!(scope.name, "mpib-collector");
            assert_eq!(scope.version, env!("CARGO_PKG_VERSION"));
        }
        let names: Vec<&str> = rms[0].scope_metrics[0]
            .metrics
            .iter()
            .map(|m| m.name.as_str())
            .collect();
        assert_eq!(
            names,
            [
                "mpib_rail_tx_bytes_total",
                "mpib_srq_depth",
                "mpib_transfer_latency_seconds"
            ]
        );
    }

    #[test]
    fn counters_are_monotonic_cumulative_int_sums() {
        let request = request(&scan(), "c");
        let metric = &request.resource_metrics[0].scope_metrics[0].metrics[0];
        assert_eq!(metric.name, "mpib_rail_tx_bytes_total");
        assert_eq!(metric.description, "help of mpib_rail_tx_bytes_total");
        assert_eq!(metric.unit, "By");
        let Some(Data::Sum(sum)) = &metric.data else {
            panic!("not a sum: {metric:?}")
        };
        assert!(sum.is_monotonic);
        assert_eq!(
            sum.aggregation_temporality,
            AggregationTemporality::Cumulative as i32
        );
        assert_eq!(sum.data_points.len(), 2, "both rails in one metric");
        let first = &sum.data_points[0];
        assert_eq!(first.value, Some(NumberValue::AsInt(10)));
        assert_eq!(first.start_time_unix_nano, 100);
        assert_eq!(first.time_unix_nano, 1_000);
        assert_eq!(
            attrs(&first.attributes),
            [
                ("host".to_owned(), s("h")),
                ("pid".to_owned(), s("7")),
                ("rail".to_owned(), s("sout"))
            ]
        );
        let saturated = &sum.data_points[1];
        assert_eq!(saturated.value, Some(NumberValue::AsInt(i64::MAX)));
    }

    #[test]
    fn gauges_are_double_gauges() {
        let request = request(&scan(), "c");
        let writer = &request.resource_metrics[0].scope_metrics[0].metrics[1];
        assert_eq!(writer.unit, "1");
        let Some(Data::Gauge(gauge)) = &writer.data else {
            panic!("not a gauge: {writer:?}")
        };
        assert_eq!(gauge.data_points[0].value, Some(NumberValue::AsDouble(3.5)));
        let own = &request.resource_metrics[1].scope_metrics[0].metrics[0];
        assert_eq!(own.name, "mpib_probes_files");
        let Some(Data::Gauge(gauge)) = &own.data else {
            panic!("not a gauge: {own:?}")
        };
        let p = &gauge.data_points[0];
        assert_eq!(p.value, Some(NumberValue::AsDouble(2.0)));
        assert_eq!((p.start_time_unix_nano, p.time_unix_nano), (50, 1_000));
        assert_eq!(attrs(&p.attributes), [("host".to_owned(), s("collector"))]);
    }

    #[test]
    fn histograms_are_cumulative_explicit_buckets() {
        let request = request(&scan(), "c");
        let metric = &request.resource_metrics[0].scope_metrics[0].metrics[2];
        assert_eq!(metric.unit, "s");
        let Some(Data::Histogram(histogram)) = &metric.data else {
            panic!("not a histogram: {metric:?}")
        };
        assert_eq!(
            histogram.aggregation_temporality,
            AggregationTemporality::Cumulative as i32
        );
        let p = &histogram.data_points[0];
        assert_eq!(p.explicit_bounds, [0.5, 1.0]);
        assert_eq!(p.bucket_counts, [1, 2, 3]);
        assert_eq!((p.count, p.sum), (6, Some(4.5)));
        assert_eq!((p.start_time_unix_nano, p.time_unix_nano), (100, 1_000));
        assert_eq!(attrs(&p.attributes).len(), 3);
    }

    #[test]
    fn empty_scan_and_odd_points() {
        assert!(request(&ScanPoints::default(), "c")
            .resource_metrics
            .is_empty());
        let tx = family("mpib_rail_tx_bytes_total", Kind::Counter, Unit::Bytes);
        let odd = ScanPoints {
            time_ns: 5,
            points: vec![
                point(&tx, &[("pid", "x")], 1, Value::Counter(1)),
                point(&tx, &[("pid", "x")], 1, Value::Gauge(1.0)), // kind mismatch: dropped
            ],
        };
        let request = request(&odd, "c");
        let rm = &request.resource_metrics[0];
        assert_eq!(
            resource_attrs(rm),
            [
                ("service.name".to_owned(), s("mpib")),
                ("host.name".to_owned(), s("")),
                ("process.pid".to_owned(), s("x"))
            ]
        );
        let Some(Data::Sum(sum)) = &rm.scope_metrics[0].metrics[0].data else {
            panic!("not a sum")
        };
        assert_eq!(sum.data_points.len(), 1);
    }
}
