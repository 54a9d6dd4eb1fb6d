//! Loom models of the seqlocked event ring and latency histogram: every interleaving (up to
//! the preemption bound) of one writer and one reader, over ring wraparound; and of two threads
//! pushing through the ring's writer flag (`try_push`) at once.
//!
//! ```text
//! RUSTFLAGS="--cfg loom" cargo test -p mpib-probes --test loom --release
//! ```
//!
//! `LOOM_MAX_PREEMPTIONS` overrides the default bound of 4 (crossbeam's CI uses 2).

#![cfg(loom)]
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use loom::sync::Arc;
use loom::thread;

use mpib_probes::histogram::SeqHistogram;
use mpib_probes::ring::{HeapRing, Ring, RingCursor};

/// Payload of record `i`: never all zero, and the two words tie together, so a copy that
/// mixes two records (or a record and the zeroed initial slot) is always detectable.
fn words(i: u64) -> [u64; 2] {
    [i + 1, (i + 1) * 1000]
}

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(4);
    }
    let runs = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = runs.clone();
    builder.check(move || {
        counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        f();
    });
    let runs = runs.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!("loom explored {runs} executions");
    // Guards against the model silently degenerating to one schedule (see `sync::load_own`).
    assert!(runs > 1, "loom explored a single execution");
}

/// Drain `ring`, asserting every returned record is intact and in order; return the indices.
fn drain_checked(ring: &Ring<'_, 2>, cursor: &mut RingCursor, seen: &mut Vec<u64>) {
    ring.drain(cursor, |i, w| {
        assert_eq!(w, words(i), "torn record {i}");
        assert!(seen.last().map_or(true, |last| i > *last), "out of order");
        seen.push(i);
    });
}

#[test]
fn ring_wraparound_never_returns_torn_record() {
    // Capacity 2, three records: the third overwrites the first while the reader may be
    // copying it.
    model(|| {
        let heap = Arc::new(HeapRing::<2>::new(2).unwrap());
        let writer = {
            let heap = heap.clone();
            thread::spawn(move || {
                let ring = heap.ring();
                for i in 0..3 {
                    ring.push(&words(i));
                }
            })
        };
        let ring = heap.ring();
        let mut cursor = RingCursor::new();
        let mut seen = Vec::new();
        drain_checked(&ring, &mut cursor, &mut seen);
        writer.join().unwrap();
        drain_checked(&ring, &mut cursor, &mut seen);
        // Every index is accounted for exactly once: returned intact or counted dropped.
        assert_eq!(seen.len() as u64 + cursor.dropped_total(), 3);
        assert_eq!(seen.last(), Some(&2), "the newest record survives");
    });
}

#[test]
fn two_pushers_through_the_writer_flag_never_interleave() {
    // Each pusher's record either lands whole or is given up; loom's `unsync_load` in `push`
    // fails the model if the flag did not hand the single-writer role over (a push that
    // could not see the previous one's `written`).
    model(|| {
        let heap = Arc::new(HeapRing::<2>::new(2).unwrap());
        let pushers: Vec<_> = (0..2u64)
            .map(|t| {
                let heap = heap.clone();
                thread::spawn(move || heap.ring().try_push(&words(t * 10)).is_some())
            })
            .collect();
        let landed = pushers
            .into_iter()
            .map(|p| u64::from(p.join().unwrap()))
            .sum::<u64>();
        let ring = heap.ring();
        assert_eq!(ring.written(), landed);
        let mut cursor = RingCursor::new();
        let mut returned = 0;
        ring.drain(&mut cursor, |_, w| {
            assert!(w == words(0) || w == words(10), "torn record {w:?}");
            returned += 1;
        });
        assert_eq!(returned, landed);
        assert!(landed >= 1, "the first pusher always finds the flag free");
    });
}

#[test]
fn ring_reader_racing_each_push_never_returns_torn_record() {
    // Two concurrent drains against a lapping writer: the reader's second pass may start on a
    // slot the writer is rewriting.
    model(|| {
        let heap = Arc::new(HeapRing::<2>::new(1).unwrap());
        let writer = {
            let heap = heap.clone();
            thread::spawn(move || {
                let ring = heap.ring();
                for i in 0..2 {
                    ring.push(&words(i));
                }
            })
        };
        let ring = heap.ring();
        let mut cursor = RingCursor::new();
        let mut seen = Vec::new();
        drain_checked(&ring, &mut cursor, &mut seen);
        drain_checked(&ring, &mut cursor, &mut seen);
        writer.join().unwrap();
        drain_checked(&ring, &mut cursor, &mut seen);
        assert_eq!(seen.len() as u64 + cursor.dropped_total(), 2);
    });
}

#[test]
fn histogram_consistent_read_is_never_mixed() {
    model(|| {
        let hist = Arc::new(SeqHistogram::<2>::new());
        let writer = {
            let hist = hist.clone();
            thread::spawn(move || {
                hist.record(0, 10);
                hist.record(1, 1);
            })
        };
        let snap = hist.read();
        if snap.consistent {
            // Only whole observations: (0, 0, 0), (1, 0, 10) or (1, 1, 11).
            let seen = (snap.buckets[0], snap.buckets[1], snap.sum);
            assert!(
                matches!(seen, (0, 0, 0) | (1, 0, 10) | (1, 1, 11)),
                "{seen:?}"
            );
        }
        writer.join().unwrap();
        let last = hist.read();
        assert!(last.consistent);
        assert_eq!((last.count(), last.sum), (2, 11));
    });
}
