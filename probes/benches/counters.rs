//! Cost of a probe update, without criterion: times 100 M counter updates (load + store) into
//! a real probes file, plus the same through a disabled handle, a locked `fetch_add` for
//! comparison, the seqlocked latency histogram and the event ring; then the two ways to stay
//! exact with several threads side by side, with 1, 2 and 8 threads: each thread in its own
//! writer lane (plain stores, what the probes do) against every thread doing a locked
//! `fetch_add` on one shared counter. Runs in a few seconds:
//!
//! ```text
//! cargo bench -p mpib-probes --bench counters
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

fn main() {
    // Under `--cfg loom` the crate only has the heap-backed ring and histogram.
    #[cfg(not(loom))]
    bench::run();
}

#[cfg(not(loom))]
mod bench {
    use std::hint::black_box;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Instant;

    use mpib_probes::declared::RAIL_TX_BYTES;
    use mpib_probes::{
        Direction, EventKind, ProbesFile, RailInfo, SlowTransfer, WriterInfo, NO_CONNECTION,
    };

    const UPDATES: u64 = 100_000_000;

    fn report(name: &str, n: u64, f: impl FnOnce()) {
        let start = Instant::now();
        f();
        let ns = start.elapsed().as_nanos() as f64 / n as f64;
        println!("{name:<44} {n:>11} ops  {ns:>6.2} ns/op");
    }

    /// Each of `n` threads making `per_thread` updates at once: wall time per update of one
    /// thread (on fewer cores than threads both ways pay the same time-sharing).
    fn report_threads(name: &str, n: usize, per_thread: u64, update: impl Fn(u64) + Sync) {
        let start = Instant::now();
        std::thread::scope(|scope| {
            for _ in 0..n {
                scope.spawn(|| {
                    for i in 0..per_thread {
                        update(i);
                    }
                });
            }
        });
        let ns = start.elapsed().as_nanos() as f64 / per_thread as f64;
        println!("{name:<44} {n:>2} thread(s) x {per_thread:>9} ops  {ns:>6.2} ns/op");
    }

    fn threads(probes: &ProbesFile) {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        println!("-- several threads counting at once ({cores} core(s) here)");
        let shared = AtomicU64::new(0);
        for n in [1, 2, 8] {
            let per_thread = UPDATES / 10;
            report_threads("own lane, plain store (probes.rail)", n, per_thread, |i| {
                probes.rail(1).add(RAIL_TX_BYTES, black_box(i & 0xff));
            });
            report_threads("one shared counter, fetch_add", n, per_thread, |i| {
                black_box(&shared).fetch_add(black_box(i & 0xff), Ordering::Relaxed);
            });
        }
        let total: u64 = (0..UPDATES / 10).map(|i| i & 0xff).sum::<u64>() * 11;
        assert_eq!(
            shared.load(Ordering::Relaxed),
            total,
            "fetch_add lost nothing"
        );
    }

    pub(crate) fn run() {
        let dir = std::env::temp_dir().join(format!("mpib-probes-bench-{}", std::process::id()));
        let rails = vec![
            RailInfo {
                device: "bench0".into(),
                port: 1,
                speed_mbps: 0,
            },
            RailInfo {
                device: "bench1".into(),
                port: 1,
                speed_mbps: 0,
            },
        ];
        let probes = ProbesFile::create(&dir, &WriterInfo::for_this_process(rails)).unwrap();
        let rail = probes.rail(0);
        report("rail counter add (load+store, file)", UPDATES, || {
            for i in 0..UPDATES {
                rail.add(RAIL_TX_BYTES, black_box(i & 0xff));
            }
        });
        report(
            "rail counter add, lane looked up per update",
            UPDATES,
            || {
                for i in 0..UPDATES {
                    probes.rail(0).add(RAIL_TX_BYTES, black_box(i & 0xff));
                }
            },
        );
        let off = ProbesFile::disabled();
        let dummy = off.rail(0);
        report("rail counter add (disabled handle)", UPDATES, || {
            for i in 0..UPDATES {
                dummy.add(RAIL_TX_BYTES, black_box(i & 0xff));
            }
        });
        let locked = AtomicU64::new(0);
        report(
            "fetch_add Relaxed (lock add), for contrast",
            UPDATES / 10,
            || {
                for i in 0..UPDATES / 10 {
                    black_box(&locked).fetch_add(black_box(i & 0xff), Ordering::Relaxed);
                }
            },
        );
        report("latency histogram record (seqlock)", UPDATES / 10, || {
            for i in 0..UPDATES / 10 {
                rail.record_latency_ns(black_box(i & 0xffff));
            }
        });
        let mut event = SlowTransfer {
            kind: EventKind::SLOW,
            direction: Direction::Send,
            rail_mask: 3,
            conn_index: NO_CONNECTION,
            size: 1 << 20,
            post_ns: [1, 2],
            done_ns: [3, 4],
            rail_bytes: [1 << 19, 1 << 19],
            sup_bw: 512,
            slot: 0,
            qp_num: [11, 12],
            peer: "10.0.0.1:4000".parse().unwrap(),
            device: 0,
            operation: mpib_probes::Operation::default(),
        };
        report(
            "slow-transfer event push (128 B record)",
            UPDATES / 100,
            || {
                for i in 0..UPDATES / 100 {
                    event.slot = black_box(i as u32);
                    probes.record_slow_transfer(&event);
                }
            },
        );
        let written = black_box(&probes).events_written();
        assert_eq!(written, UPDATES / 100);
        threads(&probes);
        probes.remove().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
