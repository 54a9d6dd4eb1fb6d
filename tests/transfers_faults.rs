//! Loopback fault knobs (`MPIB_LOOPBACK_FAULTS`, read at `init`), each scenario in its own
//! process: cross-rail reordering and a slow SUP rail must not break byte-exactness; a rail cut
//! (`cut`) or an injected work-request failure (`fail`) fails over to the other rail with every
//! transfer byte-exact (docs/PROTOCOL.md §10); where no rail survives (vanilla inter-island), or
//! with `MPIB_FAILOVER=0`, it must surface as an error code from the data path
//! (ncclRemoteError or ncclSystemError) before the deadline, never as a hang.
//!
//! Both rails carry data only when the split says so: advanced mode with the test agent at a
//! `sup_bw` between 1 and 1023 (or vanilla intra-island for SUP only, inter-island for SOUT only).
#![allow(clippy::unwrap_used, clippy::expect_used)] // A failed unwrap fails the test, with its message.

use std::time::Duration;

use mpib_driver::abi::{NCCL_REMOTE_ERROR, NCCL_SYSTEM_ERROR};
use mpib_driver::testing::{
    bounded, exchange_grouped, exchange_sizes, many_outstanding_plan, shared_plugin, version_arg,
    BASIC_SIZES,
};
use mpib_driver::{child, Agent, Deadlines, Error, Pair, PairOptions, Plan, Version};

const CHILD_LIMIT: Duration = Duration::from_secs(300);

/// One scenario, run by `child_faults` in a fresh process.
struct Scenario {
    faults: &'static str,
    version: Version,
    /// Advanced mode at this `sup_bw` (`None`: vanilla).
    sup_bw: Option<u32>,
    /// Vanilla inter-island (receiver 127.0.0.1, sender 127.0.1.1; v11/v12 only).
    inter_island: bool,
    /// An error code is expected instead of clean transfers.
    expect_failure: bool,
    /// `MPIB_FAILOVER` (on by default).
    failover: bool,
}

fn run(s: Scenario) {
    let number = s.version.number().to_string();
    let bw = s.sup_bw.map(|b| b.to_string()).unwrap_or_default();
    let env = [
        ("MPIB_FABRIC", "loopback"),
        ("MPIB_LOOPBACK_FAULTS", s.faults),
        ("MPIB_FAILOVER", if s.failover { "1" } else { "0" }),
        ("MPIB_DRIVER_VERSION", number.as_str()),
        ("MPIB_DRIVER_SUP_BW", bw.as_str()),
        ("MPIB_DRIVER_INTER", if s.inter_island { "1" } else { "" }),
        (
            "MPIB_DRIVER_EXPECT",
            if s.expect_failure { "failure" } else { "" },
        ),
    ];
    let outcome = child::run_test("child_faults", &env, CHILD_LIMIT).unwrap();
    eprintln!("{}", outcome.output);
    outcome.assert_success(&format!(
        "child_faults with MPIB_LOOPBACK_FAULTS={}",
        s.faults
    ));
}

fn clean(faults: &'static str, version: Version, sup_bw: Option<u32>) {
    run(Scenario {
        faults,
        version,
        sup_bw,
        inter_island: false,
        expect_failure: false,
        failover: true,
    });
}

#[test]
fn reorder_with_split_v12() {
    clean("reorder", Version::V12, Some(512));
}

#[test]
fn reorder_with_split_v9() {
    clean("reorder", Version::V9, Some(256));
}

#[test]
fn reorder_with_split_v7() {
    clean("reorder", Version::V7, Some(768));
}

#[test]
fn delay_sup_vanilla_intra_island_v12() {
    clean("delay=sup:3", Version::V12, None);
}

#[test]
fn delay_sup_with_split_v12() {
    clean("delay=sup:3", Version::V12, Some(512));
}

#[test]
fn delay_sup_with_split_v8() {
    clean("delay=sup:3", Version::V8, Some(1023));
}

#[test]
fn reorder_and_delay_sup_with_split_v11() {
    clean("reorder,delay=sup:3", Version::V11, Some(640));
}

#[test]
fn a_failed_sout_work_request_fails_over_to_sup_advanced_v12() {
    clean("fail=sout:5", Version::V12, Some(0));
}

#[test]
fn a_cut_sout_rail_fails_over_with_split_v9() {
    clean("cut=sout:30", Version::V9, Some(512));
}

#[test]
fn a_cut_sup_rail_fails_over_with_split_v12() {
    clean("cut=sup:50", Version::V12, Some(384));
}

#[test]
fn a_cut_sup_rail_fails_over_with_split_and_reordering_v10() {
    clean("reorder,delay=sup:2,cut=sup:200", Version::V10, Some(700));
}

#[test]
fn a_cut_sup_rail_fails_over_to_sout_intra_island_v7() {
    clean("cut=sup:9", Version::V7, None);
}

#[test]
fn a_cut_sout_rail_is_reported_inter_island_where_nothing_survives_v12() {
    run(Scenario {
        faults: "cut=sout:5",
        version: Version::V12,
        sup_bw: None,
        inter_island: true,
        expect_failure: true,
        failover: true,
    });
}

#[test]
fn without_failover_an_injected_sup_failure_is_reported_intra_island_v11() {
    run(Scenario {
        faults: "fail=sup:5",
        version: Version::V11,
        sup_bw: None,
        inter_island: false,
        expect_failure: true,
        failover: false,
    });
}

#[test]
fn without_failover_a_cut_sout_rail_is_reported_with_split_v8() {
    run(Scenario {
        faults: "cut=sout:30",
        version: Version::V8,
        sup_bw: Some(512),
        inter_island: false,
        expect_failure: true,
        failover: false,
    });
}

fn arg(name: &str) -> String {
    std::env::var(name).unwrap_or_default()
}

#[test]
#[ignore = "runs in a child process started by the other tests of this file"]
fn child_faults() {
    if !child::is_child("child_faults") {
        return;
    }
    bounded(CHILD_LIMIT, || {
        let version = version_arg();
        let sup_bw: Option<u32> = arg("MPIB_DRIVER_SUP_BW").parse().ok();
        let faults = arg("MPIB_LOOPBACK_FAULTS");
        let agent = sup_bw.map(|bw| {
            let agent = Agent::start_in_temp().unwrap_or_else(|e| panic!("{e}"));
            agent.set_default_sup_bw(bw);
            agent
        });
        let mut owned = vec![("MPIB_FABRIC", "loopback".to_string())];
        owned.extend(agent.iter().flat_map(Agent::env));
        let vars: Vec<(&str, &str)> = owned.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let net = shared_plugin(&vars)
            .net(version)
            .unwrap_or_else(|e| panic!("{e}"));
        let mut options = PairOptions {
            deadlines: Deadlines {
                connect: Duration::from_secs(10),
                data: Duration::from_secs(30),
            },
            ..PairOptions::default()
        };
        if arg("MPIB_DRIVER_INTER") == "1" {
            options.recv_env = vec![("MPIB_OOB_ADDR".into(), Some("127.0.0.1".into()))];
            options.send_env = vec![("MPIB_OOB_ADDR".into(), Some("127.0.1.1".into()))];
        }
        let case = format!("{version} faults {faults:?} sup_bw {sup_bw:?}");
        if arg("MPIB_DRIVER_EXPECT") == "failure" {
            expect_failure(
                &case,
                Pair::connect_with(&net, &options).and_then(|mut pair| {
                    let plan = Plan::pipeline(64, |i| 65_536 + 128 * i, 8)
                        .labelled(format!("{case} pipeline"));
                    for iteration in 0..8 {
                        pair.exchange(&plan, 0xFA11, iteration)?;
                    }
                    pair.close()
                }),
            );
            return;
        }
        let mut pair = Pair::connect_with(&net, &options).unwrap_or_else(|e| panic!("{case}: {e}"));
        for iteration in 0..3 {
            let case = format!("{case} #{iteration}");
            exchange_sizes(&mut pair, &BASIC_SIZES, &case, 1)
                .unwrap_or_else(|e| panic!("{case}: {e}"));
            exchange_sizes(&mut pair, &[(8 << 20) + 129], &case, 1)
                .unwrap_or_else(|e| panic!("{case}: {e}"));
            exchange_grouped(&mut pair, &case).unwrap_or_else(|e| panic!("{case}: {e}"));
        }
        let report = pair
            .exchange(&many_outstanding_plan(), 0x0F, 0)
            .unwrap_or_else(|e| panic!("{case}: {e}"));
        eprintln!(
            "{case}: ok, up to {} sends in flight",
            report.max_sends_in_flight
        );
        pair.close().unwrap_or_else(|e| panic!("{case}: {e}"));
        drop(agent);
    });
}

fn expect_failure(case: &str, outcome: Result<(), Error>) {
    match outcome {
        Err(e @ Error::Nccl { code, .. })
            if code == NCCL_REMOTE_ERROR || code == NCCL_SYSTEM_ERROR =>
        {
            eprintln!("{case}: failure reported as expected: {e}");
        }
        Err(e @ Error::Timeout(_)) => {
            panic!("{case}: the injected failure hung instead of being reported: {e}")
        }
        Err(e) => panic!("{case}: expected ncclRemoteError (6) or ncclSystemError (2), got: {e}"),
        Ok(()) => panic!("{case}: the injected failure was never reported"),
    }
}
