//! `mpib-ranks` as a user runs it: the harness's loopback cases (every ABI in one process, a rail
//! cut failed over or not), and across processes on the tcp fabric on this host: several ABIs,
//! a burst of connections, a rank killed mid-collective fails the others and none hangs.
#![allow(clippy::unwrap_used, clippy::expect_used)] // A failed unwrap fails the test, with its message.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use mpib_driver::plugin::current_profile;

/// Generous: debug builds on two shared cores.
const LIMIT: Duration = Duration::from_secs(120);

fn command(env: &[(&str, &str)], args: &[&str]) -> Command {
    let plugin = mpib_driver::locate_built_plugin(&current_profile())
        .unwrap_or_else(|e| panic!("build the plugin first (cargo build -p mpib): {e}"));
    let mut command = Command::new(env!("CARGO_BIN_EXE_mpib-ranks"));
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("MPIB_") {
            command.env_remove(name);
        }
    }
    command
        .envs(env.iter().copied())
        .arg("--plugin")
        .arg(plugin)
        .args(args);
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    command
}

/// Waits for `child` at most `limit`; killed (and the test failed) past it: nothing may hang.
fn finish(mut child: Child, limit: Duration, what: &str) -> Output {
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > limit {
            let _ = child.kill();
            let output = child.wait_with_output().unwrap();
            panic!("{what} hung past {limit:?}:\n{}", text(&output));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

fn text(output: &Output) -> String {
    format!(
        "{}\n--- stdout\n{}--- stderr\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

fn rows(output: &Output) -> usize {
    let stdout = String::from_utf8_lossy(&output.stdout);
    // A table row: SIZE COUNT uint32 sum TIME ALGBW BUSBW #WRONG, with no wrong word.
    let row = |line: &&str| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        fields.len() == 8 && fields[2] == "uint32" && fields[7] == "0"
    };
    stdout.lines().filter(row).count()
}

const SIZES: [&str; 6] = ["--min-size", "4", "--max-size", "4M", "--step-factor", "16"];

/// The harness's loopback cases (driver/src/harness/catalog.rs): a ring all-reduce over 4 ranks
/// in one process for every ABI, all-to-all and send/recv, 12 ranks' all-to-all (132 + 132
/// connections in one batch), and the loopback's SUP rail cut mid all-reduce, failed over exactly
/// or, with `MPIB_FAILOVER=0`, failing every rank. Every case must pass and say so.
#[test]
fn every_loopback_case_of_the_harness_passes() {
    let plugin = mpib_driver::locate_built_plugin(&current_profile())
        .unwrap_or_else(|e| panic!("build the plugin first (cargo build -p mpib): {e}"));
    let bin = Path::new(env!("CARGO_BIN_EXE_mpib-ranks"))
        .parent()
        .unwrap();
    let work = mpib_driver::temp_dir("mpib-harness-loopback").unwrap();
    let mut harness = Command::new(env!("CARGO_BIN_EXE_mpib-harness"));
    harness
        .args(["--topology", "loopback", "--bin"])
        .arg(bin)
        .arg("--plugin")
        .arg(plugin)
        .arg("--work")
        .arg(&work)
        .args(["--prefix", &format!("mpib_test_{}", std::process::id())])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let output = finish(harness.spawn().unwrap(), LIMIT * 2, "the harness");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{}", text(&output));
    let passed = stdout.lines().filter(|l| l.starts_with("PASS ")).count();
    assert!(passed >= 13, "13 loopback cases or more: {}", text(&output));
    let records = std::fs::read_to_string(work.join("results.jsonl")).unwrap();
    assert_eq!(
        records.lines().count(),
        passed,
        "one record per case: {records}"
    );
    assert!(
        records.lines().all(|l| l.contains("\"verdict\":\"pass\"")),
        "{records}"
    );
    let _ = std::fs::remove_dir_all(&work);
}

/// The tcp fabric's environment for a rank on this host: two rails on loopback addresses.
const TCP: [(&str, &str); 4] = [
    ("MPIB_FABRIC", "tcp"),
    ("MPIB_HCA_SOUT", "lo=127.0.0.1"),
    ("MPIB_HCA_SUP", "lo=127.0.0.2"),
    ("MPIB_OOB_ADDR", "127.0.0.1"),
];

/// Starts `ranks` rank processes meeting in `rendezvous`.
fn start_ranks(ranks: usize, rendezvous: &Path, extra: &[&str]) -> Vec<Child> {
    let total = ranks.to_string();
    (0..ranks)
        .map(|rank| {
            let rank = rank.to_string();
            let dir = rendezvous.to_str().unwrap();
            let mut args = vec!["--ranks", &total, "--rank", &rank, "--rendezvous", dir];
            args.extend(extra);
            command(&TCP, &args).spawn().unwrap()
        })
        .collect()
}

#[test]
fn ranks_in_their_own_processes_over_the_tcp_fabric_are_exact() {
    // v7 unloads with no finalize, as NCCL does for the older tables.
    for (op, version) in [
        ("allreduce", "v12"),
        ("allreduce", "v7"),
        ("alltoall", "v9"),
    ] {
        let rendezvous = mpib_driver::temp_dir("mpib-ranks-test").unwrap();
        let mut extra = vec![
            "--op",
            op,
            "--version",
            version,
            "--channels",
            "2",
            "--iters",
            "2",
        ];
        extra.extend(SIZES);
        let children = start_ranks(3, &rendezvous, &extra);
        for (rank, child) in children.into_iter().enumerate() {
            let output = finish(child, LIMIT, &format!("{op} rank {rank}"));
            assert!(
                output.status.success(),
                "{op} rank {rank}: {}",
                text(&output)
            );
            assert_eq!(rows(&output), 6, "{op} rank {rank}: {}", text(&output));
        }
        let _ = std::fs::remove_dir_all(&rendezvous);
    }
}

/// 10 ranks' all-to-all in one process on the tcp fabric: 90 connections of 6 QPs reach the two
/// rails' ports at once (180 and 360 QP connections), far more than a rail keeps waiting for
/// their hellos (64). They wait in the
/// listener's backlog until places free; pushing the oldest out as they came dropped real ones,
/// and those QPs' transfers hung (issue 34's review).
#[test]
fn a_burst_of_qp_connections_past_the_rails_unclaimed_places_all_connect() {
    let args = [
        "--op",
        "alltoall",
        "--ranks",
        "10",
        "--channels",
        "1",
        "--min-size",
        "64K",
        "--max-size",
        "64K",
        "--iters",
        "1",
        "--timeout",
        "60",
    ];
    let output = finish(
        command(&TCP, &args).spawn().unwrap(),
        LIMIT,
        "10 ranks on tcp",
    );
    assert!(output.status.success(), "{}", text(&output));
    assert!(
        !String::from_utf8_lossy(&output.stderr).contains("dropped a connection"),
        "no real connection dropped: {}",
        text(&output)
    );
}

/// A rank killed while the ring runs: every other rank's next call returns the plugin's error
/// (its peer's sockets closed by the kernel), well before its own deadline, and no rank hangs.
#[test]
fn a_rank_killed_mid_collective_fails_the_others_and_none_hangs() {
    let rendezvous = mpib_driver::temp_dir("mpib-ranks-kill").unwrap();
    let extra = [
        "--min-size",
        "16M",
        "--max-size",
        "16M",
        "--iters",
        "1000",
        "--timeout",
        "60",
    ];
    let mut children = start_ranks(3, &rendezvous, &extra);
    // Every rank connected (then moving): each marks it in the rendezvous directory.
    let up = |rank: usize| rendezvous.join(format!("rank-{rank}.connected")).exists();
    let started = Instant::now();
    while !(0..3).all(up) {
        assert!(started.elapsed() < LIMIT, "the ring never came up");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    children[1].kill().unwrap();
    let _ = children[1].wait();
    let survivors = children
        .into_iter()
        .enumerate()
        .filter(|(rank, _)| *rank != 1);
    for (rank, child) in survivors {
        let started = Instant::now();
        let output = finish(child, Duration::from_secs(45), &format!("rank {rank}"));
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert_eq!(
            output.status.code(),
            Some(1),
            "rank {rank}: {}",
            text(&output)
        );
        let reported = ["ncclRemoteError", "ncclSystemError"]
            .iter()
            .any(|e| stdout.contains(e));
        assert!(
            reported,
            "rank {rank}: the plugin's error: {}",
            text(&output)
        );
        assert!(
            started.elapsed() < Duration::from_secs(40),
            "rank {rank} took {:?} to fail",
            started.elapsed()
        );
    }
    let _ = std::fs::remove_dir_all(&rendezvous);
}
