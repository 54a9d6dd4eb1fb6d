//! Shared files changed under a running job (docs/SECURITY.md, "Shared files"): the agent's hint
//! file and the plugin's own probes file are truncated, replaced by rename, or overwritten with
//! garbage in the middle of a run. The job must go on moving verified bytes and say what
//! happened once; before the guard, the truncations ended it with SIGBUS (`Bus error`, 135).
//!
//! Each case runs in its own process (advanced mode, loopback, v12, the driver's test agent),
//! so a SIGBUS would show as that child's exit status.
#![allow(clippy::unwrap_used, clippy::expect_used)] // A failed unwrap fails the test, with its message.

use std::fs::{self, OpenOptions};
use std::path::{Path, PathBuf};
use std::time::Duration;

use mpib_driver::rails::Probes;
use mpib_driver::testing::{bounded, shared_plugin};
use mpib_driver::{child, Agent, Pair, Plan, Version};
use mpib_probes::declared::{HINT_FILE_LOST, RAIL_TX_BYTES};
use mpib_probes::{LoadState, ProbesReader, RAIL_SUP};

const CHILD_LIMIT: Duration = Duration::from_secs(120);
/// Sends per exchange.
const SENDS: usize = 200;

fn run(case: &str) -> String {
    let outcome = child::run_test(
        "child_shared_file",
        &[("MPIB_SHARED_CASE", case)],
        CHILD_LIMIT,
    )
    .unwrap_or_else(|e| panic!("{case}: {e}"));
    outcome.assert_success(case);
    outcome.output
}

fn count(output: &str, needle: &str) -> usize {
    output.matches(needle).count()
}

#[test]
fn a_truncated_hint_file_moves_the_job_to_sout() {
    let output = run("truncate-hints");
    assert_eq!(count(&output, "it shrank under the mapping"), 1, "{output}");
}

#[test]
fn a_replaced_hint_file_moves_the_job_to_sout() {
    let output = run("replace-hints");
    assert_eq!(
        count(&output, "another file was put in its place"),
        1,
        "{output}"
    );
}

#[test]
fn garbage_in_the_hint_file_is_only_a_share() {
    let output = run("garbage-hints");
    assert!(!output.contains("mpib_hint_file_lost_total"), "{output}");
}

#[test]
fn a_truncated_probes_file_stops_only_the_telemetry() {
    let output = run("truncate-probes");
    let warned = count(&output, "this process's telemetry stops");
    assert_eq!(warned, 1, "{output}");
    assert!(output.contains("it shrank under the mapping"), "{output}");
}

#[test]
fn a_replaced_probes_file_is_left_alone() {
    let output = run("replace-probes");
    assert_eq!(
        count(&output, "another file was put in its place"),
        1,
        "{output}"
    );
}

fn probes_path() -> PathBuf {
    Probes::open_own()
        .unwrap_or_else(|e| panic!("{e}"))
        .path()
        .to_path_buf()
}

fn snapshot(path: &Path) -> mpib_probes::Snapshot {
    match ProbesReader::open(path).unwrap_or_else(|e| panic!("{e}")) {
        LoadState::Ready(reader) => reader.snapshot(),
        other => panic!("{}: {other:?}", path.display()),
    }
}

fn exchange(pair: &mut Pair<'_, '_>, label: &str, round: u64) {
    let plan = Plan::pipeline(SENDS, |i| (256 << 10) + 977 * i, 8).labelled(label.to_owned());
    pair.exchange(&plan, round, round)
        .unwrap_or_else(|e| panic!("{label}: {e}"));
}

/// Replace `path` by rename with a copy of what it holds now (a restarted agent would write a
/// fresh file the same way).
fn replace(path: &Path) {
    let fresh = path.with_extension("fresh");
    fs::copy(path, &fresh).unwrap();
    fs::rename(&fresh, path).unwrap();
}

#[test]
#[ignore = "runs in a child process started by the tests above"]
fn child_shared_file() {
    if !child::is_child("child_shared_file") {
        return;
    }
    let case = std::env::var("MPIB_SHARED_CASE").unwrap();
    bounded(CHILD_LIMIT, move || shared_file_case(&case));
}

fn shared_file_case(case: &str) {
    let agent = Agent::start_in_temp().unwrap_or_else(|e| panic!("{e}"));
    let probes_dir = agent.hint_path().with_file_name("probes");
    let owned: Vec<(&str, String)> = [
        ("MPIB_FABRIC", "loopback".to_owned()),
        ("MPIB_PROBES_DIR", probes_dir.display().to_string()),
    ]
    .into_iter()
    .chain(agent.env())
    .collect();
    std::env::set_var("MPIB_PROBES_DIR", &probes_dir);
    let vars: Vec<(&str, &str)> = owned.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let net = shared_plugin(&vars)
        .net(Version::V12)
        .unwrap_or_else(|e| panic!("{e}"));
    let mut pair = Pair::connect(&net).unwrap_or_else(|e| panic!("{e}"));
    agent
        .wait_for_registrations(1, Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("{e}"));
    agent.set_sup_bw_all(1024);
    exchange(&mut pair, "before, all SUP", 1);
    let probes = probes_path();
    let sup_before = snapshot(&probes).rails[RAIL_SUP].counter(RAIL_TX_BYTES);
    assert!(sup_before > 0, "the hint put bytes on SUP");
    // From here on the test never writes the hint file through the agent's mapping: the
    // driver's test agent is not guarded, and it is this same process.
    let hints = agent.hint_path().to_path_buf();
    match case {
        "truncate-hints" => OpenOptions::new()
            .write(true)
            .open(&hints)
            .unwrap()
            .set_len(0)
            .unwrap(),
        "replace-hints" => replace(&hints),
        "garbage-hints" => {
            let len = fs::metadata(&hints).unwrap().len() as usize;
            let garbage: Vec<u8> = (0..len).map(|i| (i * 7919 % 251) as u8).collect();
            fs::write(&hints, garbage).unwrap();
        }
        "truncate-probes" => OpenOptions::new()
            .write(true)
            .open(&probes)
            .unwrap()
            .set_len(100)
            .unwrap(),
        "replace-probes" => replace(&probes),
        other => panic!("unknown case {other}"),
    }
    exchange(&mut pair, &format!("after {case}"), 2);
    std::thread::sleep(Duration::from_millis(1100)); // past the once-a-second file checks
    exchange(&mut pair, &format!("after {case}, checked"), 3);
    if case.ends_with("-hints") {
        let sup_checked = snapshot(&probes).rails[RAIL_SUP].counter(RAIL_TX_BYTES);
        exchange(&mut pair, &format!("after {case}, once more"), 4);
        let after = snapshot(&probes);
        let lost = after.process_counter(HINT_FILE_LOST);
        let sup_after = after.rails[RAIL_SUP].counter(RAIL_TX_BYTES);
        if case == "garbage-hints" {
            assert_eq!(lost, 0, "the same file, other values: still read");
        } else {
            assert!(lost >= 1, "{case}: no connection counted the loss");
            assert_eq!(sup_after, sup_checked, "{case}: SUP kept carrying bytes");
        }
    } else {
        exchange(&mut pair, &format!("after {case}, once more"), 4);
    }
    pair.close().unwrap_or_else(|e| panic!("{e}"));
    if case == "replace-probes" {
        drop(net);
        assert!(
            probes.exists(),
            "the file put in place of ours is not ours to remove"
        );
    }
}
