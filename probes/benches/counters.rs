//! Cost of a probe update, without criterion: times 100 M counter updates (load + store) into
//! a real probes file, plus the same through a disabled handle, a locked `fetch_add` for
//! comparison, the seqlocked latency histogram and the event ring. Runs in a few seconds:
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
                rail.add_tx_bytes(black_box(i & 0xff));
            }
        });
        let off = ProbesFile::disabled();
        let dummy = off.rail(0);
        report("rail counter add (disabled handle)", UPDATES, || {
            for i in 0..UPDATES {
                dummy.add_tx_bytes(black_box(i & 0xff));
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
        probes.remove().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
