//! The `mpib_transfer_latency_seconds` family, rendered by the collector.
//!
//! The probes file keeps 64 log2 buckets per rail: bucket `b` (`64 - leading_zeros(ns)`,
//! capped at 63) holds `[2^(b-1), 2^b - 1]` ns, bucket 0 holds 0 and bucket 63 everything from
//! 2^62 up. `metrics-exporter-prometheus` only builds histograms from raw observations, so the
//! collector writes this classic histogram itself: cumulative `_bucket` lines with
//! `le = (2^b - 1) ns` in seconds for `b = 0..=62`, `le="+Inf"` (the count), `_sum` and
//! `_count`. The bucket set never changes, which `histogram_quantile` and heatmaps need.

use std::fmt::Write as _;

use mpib_probes::LatencySnapshot;

use crate::catalog::TRANSFER_LATENCY;
use crate::export::{family_text, label_block};
use crate::points::HistogramValue;

/// Buckets with a finite upper bound (the last stored bucket is `+Inf`).
pub const FINITE_BUCKETS: usize = 63;

/// The `le` label of bucket `b < 63`: `(2^b - 1)` ns in seconds.
pub fn le_label(b: usize) -> String {
    let ns = (1u64 << b) - 1;
    if ns == 0 {
        "0".to_owned()
    } else {
        format!("{}", ns as f64 / 1e9)
    }
}

/// The samples of one rail's histogram; `values` are the rail label values
/// (`host, pid, rail, device, port`).
pub fn series_text(values: &[&str], snap: &LatencySnapshot) -> String {
    let name = TRANSFER_LATENCY.name;
    let mut out = String::new();
    let mut cumulative = 0u64;
    for (b, count) in snap.buckets.iter().enumerate().take(FINITE_BUCKETS) {
        cumulative = cumulative.wrapping_add(*count);
        let le = le_label(b);
        let labels = label_block(&TRANSFER_LATENCY, values, &[("le", &le)]);
        let _ = writeln!(out, "{name}_bucket{labels} {cumulative}");
    }
    let count = snap.count();
    let labels = label_block(&TRANSFER_LATENCY, values, &[("le", "+Inf")]);
    let _ = writeln!(out, "{name}_bucket{labels} {count}");
    let labels = label_block(&TRANSFER_LATENCY, values, &[]);
    let sum = snap.sum as f64 / 1e9;
    let _ = writeln!(out, "{name}_sum{labels} {sum}");
    let _ = write!(out, "{name}_count{labels} {count}");
    out
}

/// One rail's histogram as an OTLP point: the same bucket bounds (seconds) as the `le`
/// labels, per-bucket counts (the last above every bound), sum and count.
pub fn value(snap: &LatencySnapshot) -> HistogramValue {
    let bounds = (0..FINITE_BUCKETS)
        .map(|b| ((1u64 << b) - 1) as f64 / 1e9)
        .collect();
    HistogramValue {
        bounds,
        counts: snap.buckets.to_vec(),
        sum: snap.sum as f64 / 1e9,
        count: snap.count(),
    }
}

/// The whole family from the series of every rail of every exported process.
pub fn family(series: &[String]) -> String {
    family_text(&TRANSFER_LATENCY, &series.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use mpib_probes::bucket_index;

    #[test]
    fn bounds_match_the_bucket_function() {
        assert_eq!(le_label(0), "0");
        assert_eq!(le_label(1), "0.000000001");
        assert_eq!(le_label(10), "0.000001023");
        for b in 1..FINITE_BUCKETS {
            let upper = (1u64 << b) - 1;
            assert_eq!(bucket_index(upper), b);
            assert_eq!(bucket_index(upper + 1), b + 1);
        }
    }

    #[test]
    fn cumulative_with_inf_sum_and_count() {
        let mut buckets = [0u64; 64];
        buckets[bucket_index(1500)] = 2; // bucket 11
        buckets[bucket_index(3_000_000)] = 1; // bucket 22
        buckets[63] = 1;
        let snap = LatencySnapshot {
            buckets,
            sum: 2_000_000_000,
            consistent: true,
        };
        let text = series_text(&["h", "1", "sout", "d", "1"], &snap);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), FINITE_BUCKETS + 3);
        assert!(lines[10].ends_with(" 0"), "{}", lines[10]);
        assert!(lines[11].contains("le=\"0.000002047\"} 2"), "{}", lines[11]);
        assert!(lines[22].ends_with("} 3"), "{}", lines[22]);
        assert!(lines[62].ends_with("} 3"), "{}", lines[62]);
        assert!(lines[63].contains("le=\"+Inf\"} 4"), "{}", lines[63]);
        assert!(
            lines[64].starts_with("mpib_transfer_latency_seconds_sum{")
                && lines[64].ends_with(" 2")
        );
        assert!(lines[65].ends_with("} 4"));
        let fam = family(&[text]);
        assert!(fam.starts_with("# HELP mpib_transfer_latency_seconds "));
        assert!(fam.contains("# TYPE mpib_transfer_latency_seconds histogram\n"));
        assert!(family(&[]).is_empty());
    }
}
