//! What the connection table costs at NCCL's counts (16,384 slots, probes 3.2): for each count
//! of open connections, the time of one claim as NCCL's setup makes them (thousands in a row, no
//! close), what the readers pay per look (`snapshot`, which the collector and `mpib-top` take
//! each interval, and `sample_in_flight`, which the agent takes 2,000 times a second), and the
//! file's memory. Beside each reader figure, the same file read as a 3.1 reader reads it: every
//! slot, with no high-water mark. Medians of `--rounds` rounds, each in a fresh file under
//! `--dir` (default /dev/shm, where the plugin writes them):
//!
//! ```text
//! cargo bench -p mpib-probes --bench connections -- --counts 64,1024,4096,16384 --rounds 5
//! ```
//!
//! Prints a table and one `row connections=N ...` line per count for scripts.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

fn main() {
    // Under `--cfg loom` the crate only has the heap-backed ring and histogram.
    #[cfg(not(loom))]
    bench::run();
}

#[cfg(not(loom))]
mod bench {
    use std::net::{Ipv4Addr, SocketAddrV4};
    use std::os::unix::fs::MetadataExt as _;
    use std::path::{Path, PathBuf};
    use std::time::Instant;

    use mpib_probes::{
        ConnectionInfo, Direction, LoadState, Mode, PathClass, ProbesFile, ProbesReader, RailInfo,
        WriterInfo,
    };

    /// Samples the agent takes a second (`mpib_agent::measure::SAMPLE_EVERY`, 500 µs).
    const AGENT_SAMPLES_PER_SECOND: f64 = 2000.0;

    struct Round {
        claim_ns: f64,
        snapshot_us: f64,
        sample_us: f64,
        full_snapshot_us: f64,
        full_sample_us: f64,
        file_kib: f64,
    }

    fn argument(name: &str) -> Option<String> {
        let args: Vec<String> = std::env::args().collect();
        let at = args.iter().position(|a| a == name)?;
        args.get(at + 1).cloned()
    }

    fn median(mut values: Vec<f64>) -> f64 {
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    }

    fn writer() -> WriterInfo {
        let rail = |device: &str| RailInfo {
            device: device.into(),
            port: 1,
            speed_mbps: 400_000,
        };
        WriterInfo::for_this_process(vec![rail("mlx5_0"), rail("mlx5_1")])
    }

    fn ready(path: &Path) -> ProbesReader {
        match ProbesReader::open(path).unwrap() {
            LoadState::Ready(reader) => reader,
            other => panic!("{}: {other:?}", path.display()),
        }
    }

    /// Median µs of `reps` calls of `look`.
    fn time_us(reps: usize, mut look: impl FnMut()) -> f64 {
        let times = (0..reps)
            .map(|_| {
                let start = Instant::now();
                look();
                start.elapsed().as_nanos() as f64 / 1e3
            })
            .collect();
        median(times)
    }

    fn reader_costs(reader: &ProbesReader, expected: usize) -> (f64, f64) {
        let snapshot = time_us(21, || {
            let n = reader.snapshot().connections.len();
            assert_eq!(n, expected);
        });
        let sample = time_us(201, || {
            let mut n = 0;
            reader.sample_in_flight(|_| n += 1);
            assert_eq!(n, expected);
        });
        (snapshot, sample)
    }

    fn round(dir: &Path, count: usize) -> Round {
        let probes = ProbesFile::create(dir, &writer()).unwrap();
        let path = probes.path().unwrap().to_path_buf();
        let start = Instant::now();
        let held: Vec<_> = (0..count)
            .map(|i| {
                let info = ConnectionInfo {
                    peer: SocketAddrV4::new(Ipv4Addr::new(10, 1, 0, (i % 64) as u8), 40_000),
                    direction: if i % 2 == 0 {
                        Direction::Send
                    } else {
                        Direction::Recv
                    },
                    path_class: PathClass::InterIsland,
                    mode: Mode::Advanced,
                    hint_slot: (i % 64) as u32,
                    device: 0,
                };
                probes.claim_connection(&info).expect("a free slot")
            })
            .collect();
        let claim_ns = start.elapsed().as_nanos() as f64 / count as f64;
        let (snapshot_us, sample_us) = reader_costs(&ready(&path), count);
        let file_kib = std::fs::metadata(&path).unwrap().blocks() as f64 * 512.0 / 1024.0;
        // The same file as a 3.1 reader sees it: the version word says 3.1, so every slot.
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[8..12].copy_from_slice(&0x0003_0001u32.to_le_bytes());
        let older = dir.join("as-3.1.probes");
        std::fs::write(&older, bytes).unwrap();
        let (full_snapshot_us, full_sample_us) = reader_costs(&ready(&older), count);
        std::fs::remove_file(&older).unwrap();
        drop(held);
        probes.remove().unwrap();
        Round {
            claim_ns,
            snapshot_us,
            sample_us,
            full_snapshot_us,
            full_sample_us,
            file_kib,
        }
    }

    pub(super) fn run() {
        let counts: Vec<usize> = argument("--counts")
            .unwrap_or_else(|| "64,1024,4096,16384".into())
            .split(',')
            .map(|c| c.parse().expect("--counts: numbers"))
            .collect();
        let rounds: usize = argument("--rounds").map_or(5, |r| r.parse().expect("--rounds"));
        let base = PathBuf::from(argument("--dir").unwrap_or_else(|| "/dev/shm".into()));
        let dir = base.join(format!("mpib-bench-connections-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        println!(
            "{:>11} {:>9} {:>10} {:>10} {:>11} {:>10} {:>10} {:>11}",
            "connections",
            "claim ns",
            "file KiB",
            "snap us",
            "snap 3.1 us",
            "sample us",
            "sample 3.1",
            "agent CPU %"
        );
        for &count in &counts {
            let all: Vec<Round> = (0..rounds).map(|_| round(&dir, count)).collect();
            let m = |f: fn(&Round) -> f64| median(all.iter().map(f).collect());
            let (claim, kib) = (m(|r| r.claim_ns), m(|r| r.file_kib));
            let (snap, full_snap) = (m(|r| r.snapshot_us), m(|r| r.full_snapshot_us));
            let (sample, full_sample) = (m(|r| r.sample_us), m(|r| r.full_sample_us));
            let agent = sample * 1e-6 * AGENT_SAMPLES_PER_SECOND * 100.0;
            println!(
                "{count:>11} {claim:>9.0} {kib:>10.0} {snap:>10.1} {full_snap:>11.1} \
                 {sample:>10.2} {full_sample:>10.2} {agent:>11.2}"
            );
            println!(
                "row connections={count} claim_ns={claim:.0} file_kib={kib:.0} \
                 snapshot_us={snap:.1} snapshot_full_us={full_snap:.1} sample_us={sample:.2} \
                 sample_full_us={full_sample:.2} agent_cpu_percent={agent:.2}"
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
