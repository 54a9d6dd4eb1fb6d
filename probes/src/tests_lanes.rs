//! Writer lanes: counts stay exact with any number of threads counting at once.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::declared::{
    RAIL_SEND_COMPLETIONS, RAIL_TX_BYTES, RAIL_WORK_REQUESTS, SRQ_DEPTH, SRQ_HIGH_WATER,
    SRQ_LOW_WATER, WRITER_LANE_OVERFLOWS,
};
use std::sync::Barrier;

use crate::tests::{info, open_ready, TempDir};
use crate::*;

const ADDS: u64 = 20_000;

/// A writer of this process (its real pid), so that readers can tell which lane owners are
/// still running threads.
fn this_process() -> WriterInfo {
    WriterInfo {
        pid: std::process::id(),
        ..info()
    }
}

/// `threads` threads, all alive at once (a barrier after each has taken its lane), each
/// counting `ADDS` updates of every kind into SUP.
fn count_from_threads(probes: &ProbesFile, threads: usize) {
    let (claimed, counted) = (Barrier::new(threads + 1), Barrier::new(threads + 1));
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    probes.rail(RAIL_SUP).add(RAIL_WORK_REQUESTS, 0); // claims this thread's lane
                    claimed.wait();
                    for i in 0..ADDS {
                        let rail = probes.rail(RAIL_SUP);
                        rail.add(RAIL_TX_BYTES, 3);
                        rail.inc(RAIL_SEND_COMPLETIONS);
                        rail.record_latency_ns(1000 + i);
                        probes.transfers().record(0b10);
                    }
                    counted.wait();
                })
            })
            .collect();
        claimed.wait();
        // Every worker holds its lane now; threads of an earlier call may still show in /proc a
        // moment after their join (the kernel releases a task after waking its joiner).
        let owned = (threads.min(SHARED_LANE)) as u32;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut in_use = open_ready(probes.path().unwrap()).snapshot().lanes_in_use;
        while in_use != owned && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
            in_use = open_ready(probes.path().unwrap()).snapshot().lanes_in_use;
        }
        counted.wait();
        // A join waits for the thread's whole exit; the scope's own end does not.
        for worker in workers {
            worker.join().unwrap();
        }
        // Checked once every thread is past the barriers: a failure here never hangs them.
        assert_eq!(in_use, owned, "one lane per live thread");
    });
}

#[test]
fn threads_beyond_the_lanes_still_count_exactly() {
    let dir = TempDir::new();
    let probes = ProbesFile::create(&dir.0, &this_process()).unwrap();
    let threads = WRITER_LANES + 4;
    count_from_threads(&probes, threads);
    let snapshot = open_ready(probes.path().unwrap()).snapshot();
    let n = threads as u64;
    let sup = &snapshot.rails[RAIL_SUP];
    assert_eq!(sup.counter(RAIL_TX_BYTES), 3 * ADDS * n);
    assert_eq!(sup.counter(RAIL_SEND_COMPLETIONS), ADDS * n);
    assert_eq!(sup.latency.count(), ADDS * n);
    let sum_per_thread: u64 = (0..ADDS).map(|i| 1000 + i).sum();
    assert_eq!(sup.latency.sum, sum_per_thread * n);
    assert_eq!(snapshot.transfers.sup_only, ADDS * n);
    assert_eq!(snapshot.rails[RAIL_SOUT].counter(RAIL_TX_BYTES), 0);
    assert_eq!(
        snapshot.process_counter(WRITER_LANE_OVERFLOWS),
        (threads - SHARED_LANE) as u64,
        "the threads beyond the owned lanes shared the last one"
    );
    // A joined thread's /proc entry goes a moment after the join returns (the kernel releases
    // the task after waking the joiner): wait for it, boundedly.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let mut in_use = snapshot.lanes_in_use;
    while in_use != 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
        in_use = open_ready(probes.path().unwrap()).snapshot().lanes_in_use;
    }
    assert_eq!(in_use, 0, "exited threads' lanes are not counted as in use");
}

#[test]
fn a_lane_is_handed_on_with_its_counts() {
    let dir = TempDir::new();
    let probes = ProbesFile::create(&dir.0, &this_process()).unwrap();
    // More threads over time than lanes, never more than a few at once: every count lands
    // in an owned lane, handed from each exited thread to the next.
    for _ in 0..3 * WRITER_LANES {
        count_from_threads(&probes, 2);
    }
    let snapshot = open_ready(probes.path().unwrap()).snapshot();
    let n = 6 * WRITER_LANES as u64;
    assert_eq!(
        snapshot.rails[RAIL_SUP].counter(RAIL_TX_BYTES),
        3 * ADDS * n
    );
    assert_eq!(snapshot.transfers.sup_only, ADDS * n);
    assert_eq!(snapshot.process_counter(WRITER_LANE_OVERFLOWS), 0);
    assert!(snapshot.rails[RAIL_SUP].latency.consistent);
}

#[test]
fn srq_gauges_show_the_lowest_depth_of_the_lanes_that_receive() {
    let dir = TempDir::new();
    let probes = ProbesFile::create(&dir.0, &this_process()).unwrap();
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
                        rail.set(SRQ_LOW_WATER, low);
                        rail.set(SRQ_HIGH_WATER, high);
                        rail.set(SRQ_DEPTH, depth);
                    }
                    None => rail.add(RAIL_TX_BYTES, 1),
                }
                all_set.wait();
            });
        }
    });
    let rail = open_ready(probes.path().unwrap()).snapshot().rails[RAIL_SOUT];
    assert_eq!(
        (
            rail.gauge(SRQ_DEPTH),
            rail.gauge(SRQ_LOW_WATER),
            rail.gauge(SRQ_HIGH_WATER)
        ),
        (70, 64, 512),
        "a lane without a receive side does not pull the depth to 0"
    );
    assert_eq!(rail.counter(RAIL_TX_BYTES), 1);
}

#[test]
fn a_disabled_file_takes_updates_from_any_thread() {
    let probes = ProbesFile::disabled();
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| {
                for _ in 0..1000 {
                    probes.rail(RAIL_SUP).add(RAIL_TX_BYTES, 1);
                    probes.transfers().record(1);
                }
            });
        }
    });
    assert!(!probes.is_enabled());
}
