//! A single-writer log2 histogram behind one seqlock, readable as a consistent snapshot.
//!
//! # Buckets
//!
//! `bucket = 64 - leading_zeros(value)`, capped at `B - 1`. With `B = 64` (the probes file):
//! bucket 0 holds the value 0, bucket `b` in `1..=62` holds `[2^(b-1), 2^b - 1]`, and bucket 63
//! holds everything from `2^62` up. Recording is integer-only: one `lzcnt`, no float, no
//! allocation. The buckets map onto an OpenTelemetry exponential histogram of scale 0 (whose
//! bucket `b` is `(2^(b-1), 2^b]`: exact powers of two land one bucket higher here) and onto
//! Prometheus classic buckets with `le = 2^b - 1`.
//!
//! # Why a seqlock (and why the fallback is still safe)
//!
//! A latency histogram is exported as buckets + count + sum. Read word by word while the
//! writer records, the reader could see a bucket incremented but not the sum, so `sum / count`
//! would be off. One seqlock per histogram makes the whole histogram one consistent
//! observation: the writer bumps `seq` to odd, updates one bucket and the sum, and bumps `seq`
//! to even; the reader retries while `seq` is odd or changed (measured cost of a publish: about
//! 1 ns, `telemetry.md` section 1). The count is not stored: it is the sum of the buckets, so
//! it can never disagree with them.
//!
//! The reader bounds its retries (a writer that died mid-update leaves `seq` odd forever).
//! When they run out it returns the per-word copy flagged `consistent = false`. That copy is
//! still safe to export: every bucket and the sum are single-writer monotonic counters, each
//! read atomically, so every value lies between its value at the start and at the end of the
//! read and successive snapshots never go backwards; only the sum may lead or lag the
//! buckets by the few observations recorded during the read.

use crate::sync::{fence, load_own, spin_hint, AtomicU64, Ordering};

/// Reader retries before falling back to the per-word copy.
const READ_TRIES: usize = if cfg!(loom) { 3 } else { 1000 };

/// The bucket of `value` in a 64-bucket log2 histogram: `64 - leading_zeros(value)`, at most 63.
#[inline]
pub const fn bucket_index(value: u64) -> usize {
    let b = (64 - value.leading_zeros()) as usize;
    if b > 63 {
        63
    } else {
        b
    }
}

/// The smallest value that lands in bucket `bucket` of a 64-bucket histogram.
pub const fn bucket_lower_bound(bucket: usize) -> u64 {
    match bucket {
        0 => 0,
        b if b >= 63 => 1 << 62,
        b => 1 << (b - 1),
    }
}

/// A `B`-bucket histogram with a sequence word and a running sum (see the module docs).
#[repr(C)]
pub struct SeqHistogram<const B: usize> {
    seq: AtomicU64,
    sum: AtomicU64,
    buckets: [AtomicU64; B],
}

/// A copy of a [`SeqHistogram`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HistogramSnapshot<const B: usize> {
    /// Observations per bucket.
    pub buckets: [u64; B],
    /// Sum of all observed values (wrapping).
    pub sum: u64,
    /// Whether the copy is one consistent observation (seqlock validated); see the module docs
    /// for why an inconsistent copy is still monotonic and safe to export.
    pub consistent: bool,
}

impl<const B: usize> HistogramSnapshot<B> {
    /// Number of observations: the sum of the buckets.
    pub fn count(&self) -> u64 {
        self.buckets.iter().fold(0u64, |a, b| a.wrapping_add(*b))
    }

    /// Add `other` into this copy (the writer lanes of one rail summed); the sum is consistent
    /// only if both were.
    pub fn merge(&mut self, other: &HistogramSnapshot<B>) {
        for (mine, theirs) in self.buckets.iter_mut().zip(other.buckets) {
            *mine = mine.wrapping_add(theirs);
        }
        self.sum = self.sum.wrapping_add(other.sum);
        self.consistent &= other.consistent;
    }
}

impl<const B: usize> SeqHistogram<B> {
    /// An empty histogram (all zero, which is also what a fresh file holds).
    pub fn new() -> Self {
        SeqHistogram {
            seq: AtomicU64::new(0),
            sum: AtomicU64::new(0),
            buckets: core::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    /// Writer: count one observation of `value` in `bucket` (capped at `B - 1`). Single writer.
    #[inline]
    pub fn record(&self, bucket: usize, value: u64) {
        let last = self.buckets.len().saturating_sub(1);
        let Some(slot) = self.buckets.get(bucket.min(last)) else {
            return; // B == 0: nothing to count into.
        };
        let seq = load_own(&self.seq);
        self.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        // SYNC: pairs with the fence(Acquire) before the second seq load in `read`: a reader
        // whose copy saw the bucket or sum stored below also sees the odd seq (or later).
        fence(Ordering::Release);
        slot.store(load_own(slot).wrapping_add(1), Ordering::Relaxed);
        let sum = load_own(&self.sum).wrapping_add(value);
        self.sum.store(sum, Ordering::Relaxed);
        // SYNC: pairs with the Relaxed load + fence(Acquire) at the start of `read`.
        self.seq.store(seq.wrapping_add(2), Ordering::Release);
    }

    /// Writer, from any number of threads at once (the probes' shared lane): a locked add to
    /// the bucket and to the sum, `seq` untouched. Read it with
    /// [`read_shared`](SeqHistogram::read_shared).
    #[inline]
    pub fn record_shared(&self, bucket: usize, value: u64) {
        let last = self.buckets.len().saturating_sub(1);
        if let Some(slot) = self.buckets.get(bucket.min(last)) {
            slot.fetch_add(1, Ordering::Relaxed);
            self.sum.fetch_add(value, Ordering::Relaxed);
        }
    }

    /// Reader of a histogram written by [`record_shared`](SeqHistogram::record_shared): the
    /// per-word copy (monotonic, as the module docs explain), `consistent` only while empty.
    pub fn read_shared(&self) -> HistogramSnapshot<B> {
        let (buckets, sum) = self.copy();
        let consistent = buckets.iter().all(|b| *b == 0);
        HistogramSnapshot {
            buckets,
            sum,
            consistent,
        }
    }

    fn copy(&self) -> ([u64; B], u64) {
        let buckets = core::array::from_fn(|i| self.buckets[i].load(Ordering::Relaxed));
        (buckets, self.sum.load(Ordering::Relaxed))
    }

    /// Reader: a consistent copy if one can be had within the retry bound, else the per-word
    /// copy with `consistent = false` (module docs). Never blocks.
    pub fn read(&self) -> HistogramSnapshot<B> {
        for _ in 0..READ_TRIES {
            let before = self.seq.load(Ordering::Relaxed);
            // SYNC: pairs with the final Release store of seq in `record`.
            fence(Ordering::Acquire);
            if before % 2 == 1 {
                spin_hint();
                continue;
            }
            let (buckets, sum) = self.copy();
            // SYNC: pairs with the fence(Release) in `record`.
            fence(Ordering::Acquire);
            if self.seq.load(Ordering::Relaxed) == before {
                return HistogramSnapshot {
                    buckets,
                    sum,
                    consistent: true,
                };
            }
            spin_hint();
        }
        let (buckets, sum) = self.copy();
        HistogramSnapshot {
            buckets,
            sum,
            consistent: false,
        }
    }
}

impl<const B: usize> Default for SeqHistogram<B> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(all(test, not(loom)))]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn bucket_index_is_bit_length_capped() {
        let cases = [
            (0, 0),
            (1, 1),
            (2, 2),
            (3, 2),
            (4, 3),
            (1023, 10),
            (1024, 11),
            (1 << 61, 62),
            (1 << 62, 63),
            (u64::MAX, 63),
        ];
        for (value, bucket) in cases {
            assert_eq!(bucket_index(value), bucket, "value {value}");
        }
        for b in 0..64 {
            assert_eq!(bucket_index(bucket_lower_bound(b)), b);
        }
    }

    #[test]
    fn histogram_counts_and_sums() {
        let h = SeqHistogram::<64>::new();
        for v in [0, 1, 5, 5, 1000, u64::MAX] {
            h.record(bucket_index(v), v);
        }
        let s = h.read();
        assert!(s.consistent);
        assert_eq!(s.count(), 6);
        assert_eq!((s.buckets[0], s.buckets[1], s.buckets[3]), (1, 1, 2));
        assert_eq!((s.buckets[10], s.buckets[63]), (1, 1));
        assert_eq!(s.sum, 1011u64.wrapping_add(u64::MAX));
    }

    #[test]
    fn histogram_dead_writer_mid_update_falls_back() {
        let h = SeqHistogram::<4>::new();
        h.record(1, 1);
        h.record(7, 5); // capped into the last bucket
                        // A writer that died between its two seq stores leaves seq odd.
        h.seq.store(5, Ordering::Relaxed);
        let s = h.read();
        assert!(!s.consistent);
        assert_eq!((s.count(), s.sum, s.buckets[3]), (2, 6, 1));
    }

    #[test]
    fn histogram_concurrent_reads_are_consistent() {
        let n: u64 = if cfg!(miri) { 100 } else { 100_000 };
        let h = SeqHistogram::<4>::new();
        std::thread::scope(|s| {
            s.spawn(|| {
                for i in 0..n {
                    // Value 10 in bucket 0, value 1 in bucket 1: sum = 10 * b0 + b1 always.
                    let (bucket, value) = if i % 3 == 0 { (0, 10) } else { (1, 1) };
                    h.record(bucket, value);
                }
            });
            let mut last = 0;
            while last < n {
                let snap = h.read();
                if snap.consistent {
                    assert_eq!(snap.sum, 10 * snap.buckets[0] + snap.buckets[1]);
                }
                assert!(snap.count() >= last, "went backwards");
                last = snap.count();
            }
        });
    }
}
