//! The conformance cases the verbs rig runs across two processes (`scripts/rig/suite.sh`,
//! `mpib-xfer`), run here on the loopback fabric with the same code: the receiver and the sender
//! are `mpib_driver::xfer` sides on two threads, walking the same `mpib_driver::cases` list, with
//! the same byte, size, island and per-rail checks. Each configuration runs in a child process of
//! its own (the plugin's settings for v7–v10 are per process; the probes file is per process).
//! The plugin is the one built in the same target dir (`cargo test --workspace` builds it).
#![allow(clippy::unwrap_used, clippy::expect_used)] // A failed unwrap fails the test, with its message.

use std::time::Duration;

use mpib_driver::cases::{self, Scale};
use mpib_driver::rails::PathClass;
use mpib_driver::testing::bounded;
use mpib_driver::xfer::{self, Checks, SideOptions};
use mpib_driver::{child, load_built_plugin, Agent};

const CHILD_LIMIT: Duration = Duration::from_secs(400);

/// Runs `child_cases` in a fresh process with `config` and `version`.
fn config(name: &str, version: u32) {
    let probes = mpib_driver::temp_dir("mpib-cases-probes").unwrap();
    let version = version.to_string();
    let env = [
        ("MPIB_FABRIC", "loopback"),
        ("MPIB_DRIVER_VERSION", version.as_str()),
        ("MPIB_CASES_CONFIG", name),
        ("MPIB_PROBES", "1"),
        ("MPIB_PROBES_DIR", probes.to_str().unwrap()),
    ];
    let outcome = child::run_test("child_cases", &env, CHILD_LIMIT).unwrap();
    let _ = std::fs::remove_dir_all(&probes);
    outcome.assert_success(&format!("child_cases {name} v{version}"));
}

#[test]
fn vanilla_intra_island_v12() {
    config("intra", 12);
}

#[test]
fn vanilla_intra_island_v8() {
    config("intra", 8);
}

#[test]
fn vanilla_inter_island_v12() {
    config("inter", 12);
}

#[test]
fn advanced_splits_v12() {
    config("advanced", 12);
}

#[test]
fn advanced_splits_v8() {
    config("advanced", 8);
}

fn oob(addr: &str) -> SideOptions {
    SideOptions {
        env: vec![("MPIB_OOB_ADDR".into(), Some(addr.into()))],
        connect_deadline: Duration::from_secs(30),
        data_deadline: Duration::from_secs(120),
        ..SideOptions::default()
    }
}

#[test]
#[ignore = "runs in a child process started by the tests above"]
fn child_cases() {
    if !child::is_child("child_cases") {
        return;
    }
    bounded(CHILD_LIMIT, || {
        let version = xfer::parse_version(&std::env::var("MPIB_DRIVER_VERSION").unwrap()).unwrap();
        let config = std::env::var("MPIB_CASES_CONFIG").unwrap();
        let plugin = load_built_plugin().unwrap_or_else(|e| panic!("{e}"));
        let (list, recv, send, class, agent) = match config.as_str() {
            // v7–v10 take the environment once per process, so intra-island pins nothing.
            "intra" => (
                cases::VANILLA.join(","),
                oob("127.0.0.1"),
                oob("127.0.0.1"),
                PathClass::Intra,
                None,
            ),
            // A different /24 for each side (v11+ snapshot the environment per communicator).
            "inter" => (
                cases::VANILLA.join(","),
                oob("127.0.0.1"),
                oob("127.0.1.1"),
                PathClass::Inter,
                None,
            ),
            "advanced" => {
                let agent = Agent::start_in_temp().unwrap_or_else(|e| panic!("{e}"));
                let env: Vec<(String, Option<String>)> = agent
                    .env()
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), Some(v)))
                    .chain([("MPIB_OOB_ADDR".to_string(), Some("127.0.0.1".to_string()))])
                    .collect();
                let side = SideOptions {
                    env,
                    ..oob("127.0.0.1")
                };
                let list = "split-0,split-256,split-512,split-1024,grouped@512,outstanding@768";
                (
                    list.to_string(),
                    side.clone(),
                    side,
                    PathClass::Intra,
                    Some(agent),
                )
            }
            other => panic!("unknown MPIB_CASES_CONFIG {other:?}"),
        };
        let cases = cases::parse_list(&list, Scale::Loopback).unwrap_or_else(|e| panic!("{e}"));
        let checks = Checks {
            class: Some(class),
            rails: true,
        };
        let (sent, received) = xfer::run_in_process(
            &plugin,
            version,
            &cases,
            &recv,
            &send,
            agent.as_ref(),
            checks,
        )
        .unwrap_or_else(|e| panic!("{config} {version}: {e}"));
        assert_eq!(sent.len(), cases.len());
        for (s, r) in sent.iter().zip(&received) {
            eprintln!("{config} {version}: send {}", s.summary());
            eprintln!("{config} {version}: recv {}", r.summary());
            assert_eq!(s.rail_bytes, r.rail_bytes, "both sides saw the same split");
        }
    });
}
