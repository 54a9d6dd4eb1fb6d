//! File descriptors: the first `init` raises a low soft `RLIMIT_NOFILE` to the hard limit, and a
//! process that runs out anyway is told so, with the limit and how to raise it. Connections
//! between two processes share one control connection (src/net/observe/link.rs), so a made
//! connection holds no descriptor of its own, and a handshake after the first rides it, so it
//! needs none either while it runs. In a child process: both change the process's limits.
#![allow(clippy::unwrap_used, clippy::expect_used)] // A failed unwrap fails the test, with its message.

use std::time::Duration;

use mpib_driver::batch::connect_batch;
use mpib_driver::{child, Pair, Version};

fn soft_and_hard() -> (u64, u64) {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid out-parameter.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    assert_eq!(rc, 0);
    (limit.rlim_cur, limit.rlim_max)
}

fn set_soft(soft: u64) {
    let (_, hard) = soft_and_hard();
    let limit = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: a valid rlimit, soft under hard.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) }, 0);
}

fn open_descriptors() -> u64 {
    std::fs::read_dir("/proc/self/fd").unwrap().count() as u64
}

#[test]
fn init_raises_the_soft_limit_and_running_out_is_named() {
    let env = [("MPIB_FABRIC", "loopback"), ("MPIB_PROBES", "0")];
    let outcome = child::run_test("child_descriptors", &env, Duration::from_secs(120)).unwrap();
    outcome.assert_success("child_descriptors");
    assert!(
        outcome
            .output
            .contains("this process is out of file descriptors (RLIMIT_NOFILE soft")
            && outcome.output.contains("ulimit -n"),
        "the error names the limit and how to raise it:\n{}",
        outcome.output
    );
}

#[test]
#[ignore = "runs in a child process started by init_raises_the_soft_limit_and_running_out_is_named"]
fn child_descriptors() {
    if !child::is_child("child_descriptors") {
        return;
    }
    let (_, hard) = soft_and_hard();
    assert!(
        hard > 256,
        "the hard limit must leave room to lower the soft one"
    );
    set_soft(256);
    let plugin = mpib_driver::load_built_plugin().unwrap_or_else(|e| panic!("{e}"));
    let net = plugin.net(Version::V12).unwrap();
    let ctx = net.init(0xFD).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        soft_and_hard().0,
        hard,
        "init raised the soft limit to the hard one"
    );
    // Room for a handful of descriptors: connections between the same two processes share one
    // control connection, so 64 of them fit.
    set_soft(open_descriptors() + 8);
    let mut pairs = Vec::new();
    for made in 0..64 {
        let pair = Pair::connect(&net).unwrap_or_else(|e| panic!("pair {made}: {e}"));
        pairs.push(pair);
    }
    // A later handshake between the two processes rides their link (src/net/observe/link_ride.rs):
    // with one spare descriptor, for the listening socket alone, a pair still connects. With
    // none, `listen` fails, naming why. The closed handshakes left holes below the limit: filled
    // first.
    let mut fillers = Vec::new();
    while let Ok(file) = std::fs::File::open("/dev/null") {
        fillers.push(file);
    }
    fillers.truncate(fillers.len().saturating_sub(1));
    let riding = Pair::connect(&net)
        .unwrap_or_else(|e| panic!("a handshake on the link needs no descriptor of its own: {e}"));
    riding.close().unwrap();
    while let Ok(file) = std::fs::File::open("/dev/null") {
        fillers.push(file);
    }
    let failure = Pair::connect(&net)
        .err()
        .expect("no spare descriptor: the listening socket cannot be made");
    drop(fillers);
    assert!(failure.code().is_some_and(|c| c != 0), "{failure}");
    set_soft(hard);
    for pair in pairs {
        pair.close().unwrap();
    }
    net.finalize(ctx).unwrap();
}

/// Pairs of the batch, and the descriptors a process has for them (hard and soft: `init` raises
/// the soft limit to the hard one).
const BATCH: usize = 1024;
const BATCH_DESCRIPTORS: u64 = 512;

/// NCCL's batch order (every `listen` first, then `connect` and `accept` polled round-robin,
/// `closeListen` after each `accept`: NCCL's `ncclTransportP2pSetup`): 1,024 pairs
/// in a process limited to 512 descriptors, so a descriptor per listen, per handshake in flight
/// or per connection runs out; while connecting and once connected it holds a handful more than
/// before (the handshakes after the first ride the link it made).
#[test]
fn a_batch_of_1024_pairs_in_nccls_order_fits_in_512_descriptors() {
    let env = [("MPIB_FABRIC", "loopback"), ("MPIB_PROBES", "0")];
    let outcome = child::run_test("child_batch", &env, Duration::from_secs(300)).unwrap();
    outcome.assert_success("child_batch");
    for line in outcome.output.lines().filter(|l| l.starts_with("batch:")) {
        eprintln!("{line}");
    }
}

#[test]
#[ignore = "runs in a child process started by a_batch_of_1024_pairs_in_nccls_order_fits_in_512_descriptors"]
fn child_batch() {
    if !child::is_child("child_batch") {
        return;
    }
    let limit = libc::rlimit {
        rlim_cur: BATCH_DESCRIPTORS,
        rlim_max: BATCH_DESCRIPTORS,
    };
    // SAFETY: a valid rlimit; lowering both limits needs no privilege.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) }, 0);
    let plugin = mpib_driver::load_built_plugin().unwrap_or_else(|e| panic!("{e}"));
    let net = plugin.net(Version::V12).unwrap();
    let recv_ctx = net.init(0xB1).unwrap_or_else(|e| panic!("{e}"));
    let send_ctx = net.init(0xB2).unwrap_or_else(|e| panic!("{e}"));
    let before = open_descriptors();
    // The most descriptors seen open while the batch connects, sampled beside it.
    let connecting = std::sync::atomic::AtomicBool::new(true);
    let deadline = Duration::from_secs(120);
    let (batch, peak) = std::thread::scope(|scope| {
        let sampler = scope.spawn(|| {
            let mut peak = 0;
            while connecting.load(std::sync::atomic::Ordering::Relaxed) {
                peak = peak.max(open_descriptors());
                std::thread::sleep(Duration::from_micros(200));
            }
            peak
        });
        let batch = connect_batch(&net, &send_ctx, &recv_ctx, 0, BATCH, deadline);
        connecting.store(false, std::sync::atomic::Ordering::Relaxed);
        (batch, sampler.join().unwrap())
    });
    let batch = batch.unwrap_or_else(|e| panic!("{e}"));
    let held = open_descriptors().saturating_sub(before);
    // The sampler's own directory handle is one of those it counts.
    let peak = peak.saturating_sub(before + 1);
    let mut times: Vec<Duration> = batch.connect_times.clone();
    times.sort();
    eprintln!(
        "batch: {BATCH} pairs under a limit of {BATCH_DESCRIPTORS} descriptors: at most {peak} \
         more open while connecting, {held} held once connected, the last up after {:?}",
        times.last().copied().unwrap_or_default()
    );
    assert_eq!((batch.sends.len(), batch.recvs.len()), (BATCH, BATCH));
    assert!(
        held <= 16,
        "{held} descriptors held for {BATCH} connected pairs: they grow with connections"
    );
    // The listening socket, the first handshake's connection (both ends, which become the link)
    // and a few more: a descriptor per handshake in flight would be hundreds.
    assert!(
        peak <= 16,
        "{peak} descriptors open at once while {BATCH} pairs connected: handshakes open \
         connections of their own"
    );
    batch.close(&net).unwrap();
    net.finalize(send_ctx).unwrap();
    net.finalize(recv_ctx).unwrap();
}
