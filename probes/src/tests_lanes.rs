//! Writer lanes: counts stay exact with any number of threads counting at once.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Barrier;

use crate::tests::{info, open_ready, TempDir};
use crate::*;

const ADDS: u64 = 20_000;

/// `threads` threads, all alive at once (a barrier after each has taken its lane), each
/// counting `ADDS` updates of every kind into SUP.
fn count_from_threads(probes: &ProbesFile, threads: usize) {
    let (claimed, counted) = (Barrier::new(threads + 1), Barrier::new(threads + 1));
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    probes.rail(RAIL_SUP).add_wrs_posted(0); // claims this thread's lane
                    claimed.wait();
                    for i in 0..ADDS {
                        let rail = probes.rail(RAIL_SUP);
                        rail.add_tx_bytes(3);
                        rail.inc_send_cqes();
                        rail.record_latency_ns(1000 + i);
                        probes.transfers().record(0b10);
                    }
                    counted.wait();
                })
            })
            .collect();
        claimed.wait();
        let in_use = open_ready(probes.path().unwrap()).snapshot().lanes_in_use;
        counted.wait();
        // A join waits for the thread's whole exit, its thread-local destructors (the lane
        // release) included; the scope's own end does not.
        for worker in workers {
            worker.join().unwrap();
        }
        // Checked once every thread is past the barriers: a failure here never hangs them.
        let owned = (threads.min(SHARED_LANE)) as u32;
        assert_eq!(in_use, owned, "one lane per live thread");
    });
}

#[test]
fn threads_beyond_the_lanes_still_count_exactly() {
    let dir = TempDir::new();
    let probes = ProbesFile::create(&dir.0, &info()).unwrap();
    let threads = WRITER_LANES + 4;
    count_from_threads(&probes, threads);
    let snapshot = open_ready(probes.path().unwrap()).snapshot();
    let n = threads as u64;
    let sup = &snapshot.rails[RAIL_SUP];
    assert_eq!(sup.counters.tx_bytes, 3 * ADDS * n);
    assert_eq!(sup.counters.send_cqes, ADDS * n);
    assert_eq!(sup.latency.count(), ADDS * n);
    let sum_per_thread: u64 = (0..ADDS).map(|i| 1000 + i).sum();
    assert_eq!(sup.latency.sum, sum_per_thread * n);
    assert_eq!(snapshot.transfers.sup_only, ADDS * n);
    assert_eq!(snapshot.rails[RAIL_SOUT].counters.tx_bytes, 0);
    assert_eq!(
        snapshot.lane_overflows,
        (threads - SHARED_LANE) as u64,
        "the threads beyond the owned lanes shared the last one"
    );
    assert_eq!(
        snapshot.lanes_in_use, 0,
        "exited threads released their lanes"
    );
}

#[test]
fn a_lane_is_handed_on_with_its_counts() {
    let dir = TempDir::new();
    let probes = ProbesFile::create(&dir.0, &info()).unwrap();
    // More threads over time than lanes, never more than a few at once: every count lands
    // in an owned lane, handed from each exited thread to the next.
    for _ in 0..3 * WRITER_LANES {
        count_from_threads(&probes, 2);
    }
    let snapshot = open_ready(probes.path().unwrap()).snapshot();
    let n = 6 * WRITER_LANES as u64;
    assert_eq!(snapshot.rails[RAIL_SUP].counters.tx_bytes, 3 * ADDS * n);
    assert_eq!(snapshot.transfers.sup_only, ADDS * n);
    assert_eq!(snapshot.lane_overflows, 0);
    assert!(snapshot.rails[RAIL_SUP].latency.consistent);
}

#[test]
fn srq_gauges_show_the_lowest_depth_of_the_lanes_that_receive() {
    let dir = TempDir::new();
    let probes = ProbesFile::create(&dir.0, &info()).unwrap();
    // Three threads alive at once (three lanes): two receive (SRQ gauges), one only sends.
    let depths = [Some((64, 512, 300)), Some((64, 512, 70)), None];
    let all_set = Barrier::new(depths.len());
    std::thread::scope(|scope| {
        for gauges in depths {
            let (probes, all_set) = (&probes, &all_set);
            scope.spawn(move || {
                let rail = probes.rail(RAIL_SOUT);
                match gauges {
                    Some((low, high, depth)) => {
                        rail.set_srq_watermarks(low, high);
                        rail.set_srq_depth(depth);
                    }
                    None => rail.add_tx_bytes(1),
                }
                all_set.wait();
            });
        }
    });
    let counters = open_ready(probes.path().unwrap()).snapshot().rails[RAIL_SOUT].counters;
    assert_eq!(
        (
            counters.srq_depth,
            counters.srq_low_water,
            counters.srq_high_water
        ),
        (70, 64, 512),
        "a lane without a receive side does not pull the depth to 0"
    );
    assert_eq!(counters.tx_bytes, 1);
}

#[test]
fn a_disabled_file_takes_updates_from_any_thread() {
    let probes = ProbesFile::disabled();
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| {
                for _ in 0..1000 {
                    probes.rail(RAIL_SUP).add_tx_bytes(1);
                    probes.transfers().record(1);
                }
            });
        }
    });
    assert!(!probes.is_enabled());
}
