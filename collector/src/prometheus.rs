//! A published scan ([`ScanPoints`]) as Prometheus text, written with the node crate's
//! exposition writer (`mpib_node::exposition`, shared with the agent's endpoint).
//!
//! Families come in the order the scan first recorded them, each with its `# HELP` and
//! `# TYPE` lines once; a family without points is not written. A histogram point becomes a
//! classic histogram: cumulative `_bucket` samples with `le` = each finite bound, then
//! `le="+Inf"` (the count), `_sum` and `_count`.

use std::collections::HashMap;

use mpib_node::exposition::{float_text, Number, Text};

use crate::points::{HistogramValue, Point, ScanPoints, Value};

/// The whole exposition of `scan`.
pub fn render(scan: &ScanPoints) -> String {
    let mut order: Vec<&str> = Vec::new();
    let mut by_family: HashMap<&str, Vec<&Point>> = HashMap::new();
    for point in &scan.points {
        let name = point.family.name.as_str();
        by_family
            .entry(name)
            .or_insert_with(|| {
                order.push(name);
                Vec::new()
            })
            .push(point);
    }
    let mut text = Text::new();
    let mut bounds = Bounds::default();
    for name in order {
        let points = by_family.remove(name).unwrap_or_default();
        let Some(first) = points.first() else {
            continue;
        };
        let family = &first.family;
        text.family(name, family.kind, &family.help);
        for point in points {
            let labels = point.label_pairs();
            match &point.value {
                Value::Counter(v) => text.sample(name, "", labels, Number::Integer(*v)),
                Value::Gauge(v) => text.sample(name, "", labels, Number::Float(*v)),
                Value::Histogram(h) => histogram(&mut text, &mut bounds, point, h),
            }
        }
    }
    text.finish()
}

/// The `le` labels of the last bounds written: every rail's latency histogram has the same.
#[derive(Default)]
struct Bounds {
    bounds: Vec<f64>,
    labels: Vec<String>,
}

impl Bounds {
    fn labels(&mut self, bounds: &[f64]) -> &[String] {
        if self.bounds != bounds {
            self.bounds = bounds.to_vec();
            self.labels = bounds.iter().map(|b| float_text(*b)).collect();
        }
        &self.labels
    }
}

fn histogram(text: &mut Text, bounds: &mut Bounds, point: &Point, value: &HistogramValue) {
    let name = point.family.name.as_str();
    let bounds = bounds.labels(&value.bounds);
    let labels = point.label_pairs();
    let mut cumulative = 0u64;
    for (le, count) in bounds.iter().zip(&value.counts) {
        cumulative = cumulative.wrapping_add(*count);
        let labels = labels.clone().chain([("le", le.as_str())]);
        text.sample(name, "_bucket", labels, Number::Integer(cumulative));
    }
    let inf = labels.clone().chain([("le", "+Inf")]);
    text.sample(name, "_bucket", inf, Number::Integer(value.count));
    text.sample(name, "_sum", labels.clone(), Number::Float(value.sum));
    text.sample(name, "_count", labels, Number::Integer(value.count));
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::Arc;

    use mpib_probes::{bucket_index, LatencySnapshot};

    use super::*;
    use crate::catalog::{Family, PROBES_FILES, TRANSFER_LATENCY};
    use crate::latency;

    fn point(family: &crate::catalog::MetricSpec, values: &[&str], value: Value) -> Point {
        Point::new(Arc::new(Family::of_spec(family)), values, 1, value)
    }

    #[test]
    fn a_histogram_is_cumulative_with_inf_sum_and_count() {
        let mut buckets = [0u64; 64];
        buckets[bucket_index(1500)] = 2; // bucket 11
        buckets[bucket_index(3_000_000)] = 1; // bucket 22
        buckets[63] = 1;
        let snap = LatencySnapshot {
            buckets,
            sum: 2_000_000_000,
            consistent: true,
        };
        let rail = ["h", "1", "sout", "d", "1"];
        let histogram = Value::Histogram(latency::value(&snap));
        let files = Value::Gauge(2.0);
        let scan = ScanPoints {
            time_ns: 5,
            points: vec![
                point(&TRANSFER_LATENCY, &rail, histogram),
                point(&PROBES_FILES, &["h"], files),
            ],
        };
        let text = render(&scan);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            format!("# HELP {} {}", TRANSFER_LATENCY.name, TRANSFER_LATENCY.help)
        );
        assert_eq!(lines[1], "# TYPE mpib_transfer_latency_seconds histogram");
        let samples = &lines[2..];
        assert!(samples[0].contains("le=\"0\"} 0"), "{}", samples[0]);
        assert!(samples[10].ends_with(" 0"), "{}", samples[10]);
        assert!(
            samples[11].contains(",le=\"0.000002047\"} 2"),
            "{}",
            samples[11]
        );
        assert!(samples[22].ends_with("} 3"), "{}", samples[22]);
        assert!(samples[62].ends_with("} 3"), "{}", samples[62]);
        assert!(samples[63].contains("le=\"+Inf\"} 4"), "{}", samples[63]);
        assert_eq!(
            samples[64],
            "mpib_transfer_latency_seconds_sum{host=\"h\",pid=\"1\",rail=\"sout\",device=\"d\",port=\"1\"} 2"
        );
        assert!(
            samples[65].starts_with("mpib_transfer_latency_seconds_count{")
                && samples[65].ends_with("} 4")
        );
        assert!(samples[66].starts_with("# HELP mpib_probes_files "));
        assert_eq!(samples[67], "# TYPE mpib_probes_files gauge");
        assert_eq!(samples[68], "mpib_probes_files{host=\"h\"} 2");
        assert_eq!(render(&ScanPoints::default()), "");
    }
}
