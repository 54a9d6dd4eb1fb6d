//! The `mpib_transfer_latency_seconds` family's values: a rail's 64 log2 buckets as a histogram
//! with fixed bounds.
//!
//! The probes file keeps 64 log2 buckets per rail: bucket `b` (`64 - leading_zeros(ns)`,
//! capped at 63) holds `[2^(b-1), 2^b - 1]` ns, bucket 0 holds 0 and bucket 63 everything from
//! 2^62 up. The collector exports them as a classic histogram whose finite bounds are
//! `(2^b - 1)` ns in seconds for `b = 0..=62`, the last bucket above every bound; the bucket
//! set never changes, which `histogram_quantile` and heatmaps need. Prometheus gets them as
//! `le` labels ([`crate::prometheus`]), OTLP as explicit bounds.

use mpib_probes::LatencySnapshot;

use crate::points::HistogramValue;

/// Buckets with a finite upper bound (the last stored bucket is `+Inf`).
pub const FINITE_BUCKETS: usize = 63;

/// The upper bound of bucket `b < 63`: `(2^b - 1)` ns in seconds.
pub fn bound(b: usize) -> f64 {
    ((1u64 << b) - 1) as f64 / 1e9
}

/// One rail's histogram: the bucket bounds (seconds), per-bucket counts (the last above every
/// bound), sum and count.
pub fn value(snap: &LatencySnapshot) -> HistogramValue {
    HistogramValue {
        bounds: (0..FINITE_BUCKETS).map(bound).collect(),
        counts: snap.buckets.to_vec(),
        sum: snap.sum as f64 / 1e9,
        count: snap.count(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mpib_node::exposition::float_text;
    use mpib_probes::bucket_index;

    #[test]
    fn bounds_match_the_bucket_function() {
        assert_eq!(float_text(bound(0)), "0");
        assert_eq!(float_text(bound(1)), "0.000000001");
        assert_eq!(float_text(bound(10)), "0.000001023");
        for b in 1..FINITE_BUCKETS {
            let upper = (1u64 << b) - 1;
            assert_eq!(bucket_index(upper), b);
            assert_eq!(bucket_index(upper + 1), b + 1);
        }
        let snap = LatencySnapshot {
            buckets: [1; 64],
            sum: 3_000_000_000,
            consistent: true,
        };
        let value = value(&snap);
        assert_eq!((value.bounds.len(), value.counts.len()), (63, 64));
        assert_eq!((value.sum, value.count), (3.0, 64));
    }
}
