//! A soak on the loopback fabric: random sizes (0 B … 4 MiB), grouped receives of 1 … 8
//! buffers in random send orders, pipelines, a SUP share the test agent changes under the
//! running job, and injected faults that must not break anything (cross-rail reordering, a
//! delayed SUP rail). Every byte is verified; at the end the probes' per-rail totals equal the
//! bytes moved and the resident memory has stayed flat.
//!
//! `MPIB_SOAK_SECONDS` sets the length (default 20 s, the test command's short version);
//! `scripts/soak` runs a long one. `MPIB_SOAK_SEED` replays a run (the seed is printed).
#![allow(clippy::unwrap_used, clippy::expect_used)] // A failed unwrap fails the test, with its message.

use mpib_probes::declared::{RAIL_RX_BYTES, RAIL_TX_BYTES};
use std::path::Path;
use std::time::{Duration, Instant};

#[path = "common/process.rs"]
mod process;
use process::{own_probes, rss_kib};

use mpib_driver::testing::bounded;
use mpib_driver::{child, Agent, Deadlines, Pair, PairOptions, Plan, Version};

/// A small xorshift generator: the run is a function of its seed.
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    /// A size with every scale equally likely: 0, a few bytes, KiB, MiB (up to 4 MiB).
    fn size(&mut self) -> usize {
        match self.below(5) {
            0 => self.below(2) as usize,
            1 => self.below(200) as usize,
            2 => self.below(64 << 10) as usize,
            3 => self.below(1 << 20) as usize,
            _ => self.below(4 << 20) as usize,
        }
    }
}

fn random_plan(random: &mut Random) -> Plan {
    if random.below(3) == 0 {
        let count = 1 + random.below(32) as usize;
        let sizes: Vec<usize> = (0..count).map(|_| random.size() / 4).collect();
        let window = 1 + random.below(16) as usize;
        return Plan::pipeline(count, |i| sizes[i], window).labelled("random pipeline");
    }
    let n = 1 + random.below(8) as usize;
    let sizes: Vec<usize> = (0..n).map(|_| random.size() / n).collect();
    let tags: Vec<i32> = (0..n as i32).collect();
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        order.swap(i, random.below(i as u64 + 1) as usize);
    }
    let groups = 1 + random.below(4) as usize;
    Plan::streams(groups, &sizes, &tags, &order, groups, groups * n).labelled("random groups")
}

#[test]
fn soak() {
    let seconds = std::env::var("MPIB_SOAK_SECONDS").unwrap_or_else(|_| "20".into());
    let dir = std::env::temp_dir().join(format!("mpib-soak-{}", std::process::id()));
    let probes_dir = dir.to_str().unwrap().to_string();
    let env = [
        ("MPIB_FABRIC", "loopback"),
        ("MPIB_LOOPBACK_FAULTS", "reorder,delay=sup:2"),
        ("MPIB_PROBES_DIR", probes_dir.as_str()),
        ("MPIB_SOAK_SECONDS", seconds.as_str()),
    ];
    let limit = Duration::from_secs(seconds.parse::<u64>().unwrap_or(20) + 120);
    let outcome = child::run_test("child_soak", &env, limit).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    for line in outcome.output.lines().filter(|l| l.starts_with("soak:")) {
        eprintln!("{line}");
    }
    outcome.assert_success("child_soak");
}

#[test]
#[ignore = "runs in a child process started by soak"]
fn child_soak() {
    if !child::is_child("child_soak") {
        return;
    }
    let seconds: u64 = std::env::var("MPIB_SOAK_SECONDS").unwrap().parse().unwrap();
    let seed = std::env::var("MPIB_SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| mpib_probes::now_ns() | 1);
    eprintln!("soak: seed {seed} (MPIB_SOAK_SEED={seed} replays it), {seconds} s");
    bounded(Duration::from_secs(seconds + 60), move || {
        run(seed, seconds)
    });
}

fn run(seed: u64, seconds: u64) {
    let mut random = Random(seed);
    let agent = Agent::start_in_temp().unwrap_or_else(|e| panic!("{e}"));
    agent.set_default_sup_bw(512);
    for (name, value) in agent.env() {
        std::env::set_var(name, value);
    }
    std::env::set_var("MPIB_MODE", "1");
    let plugin = mpib_driver::load_built_plugin().unwrap_or_else(|e| panic!("{e}"));
    let net = plugin.net(Version::V12).unwrap();
    let options = PairOptions {
        deadlines: Deadlines {
            connect: Duration::from_secs(10),
            data: Duration::from_secs(30),
        },
        ..PairOptions::default()
    };
    let mut pair = Pair::connect_with(&net, &options).unwrap_or_else(|e| panic!("{e}"));
    let (start, end) = (
        Instant::now(),
        Instant::now() + Duration::from_secs(seconds),
    );
    // First the largest plan the generator can make (32 messages of up to 1 MiB pipelined),
    // so the pair's buffers are at their full size, every page touched, before the baseline.
    let largest = Plan::pipeline(32, |_| 1 << 20, 16).labelled("warm-up: the largest plan");
    pair.exchange(&largest, seed, 0)
        .unwrap_or_else(|e| panic!("warm-up: {e}"));
    let baseline = rss_kib();
    let (mut rounds, mut moved, mut rss_peak) = (0u64, largest.payload_bytes() as u64, baseline);
    while Instant::now() < end {
        if rounds % 16 == 0 {
            agent.set_default_sup_bw(random.below(1025) as u32); // the hint moves under the job
        }
        let plan = random_plan(&mut random);
        pair.exchange(&plan, seed ^ rounds, rounds)
            .unwrap_or_else(|e| panic!("round {rounds} (seed {seed}): {e}"));
        moved += plan.payload_bytes() as u64;
        rounds += 1;
        rss_peak = rss_peak.max(rss_kib());
    }
    let dir = std::env::var("MPIB_PROBES_DIR").unwrap();
    let snapshot = own_probes(Path::new(&dir));
    let sent: u64 = snapshot
        .rails
        .iter()
        .map(|r| r.counter(RAIL_TX_BYTES))
        .sum();
    let received: u64 = snapshot
        .rails
        .iter()
        .map(|r| r.counter(RAIL_RX_BYTES))
        .sum();
    pair.close().unwrap_or_else(|e| panic!("{e}"));
    let rss_end = rss_kib();
    eprintln!(
        "soak: seed {seed}: {rounds} rounds, {moved} bytes in {:.1} s, probes sent {sent} received \
         {received}, RSS {baseline} KiB after the warm-up, peak {rss_peak}, {rss_end} at the end",
        start.elapsed().as_secs_f64()
    );
    assert!(rounds >= 50, "too few rounds to judge: {rounds}");
    assert_eq!(
        (sent, received),
        (moved, moved),
        "probes totals vs bytes moved"
    );
    // Every plan fits in the warmed-up buffers; a leak of even 16 KiB a round (a few hundred
    // rounds in the short run) shows.
    let grown = rss_peak.saturating_sub(baseline);
    assert!(grown < 4 * 1024, "RSS grew {grown} KiB after the warm-up");
}
