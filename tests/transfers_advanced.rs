//! Advanced mode (`MPIB_MODE=1`) with the test agent: every version, each in its own process
//! (the plugin's settings for v7–v10 are per process). The agent serves the registration socket
//! and the hint SHM in a private temp dir; after the pair connects, its hint slots are set to each
//! `sup_bw` in turn (0, 1, 256, 512, 768, 1023, 1024, 5000) and every transfer must verify.
#![allow(clippy::unwrap_used, clippy::expect_used)] // A failed unwrap fails the test, with its message.

use std::time::Duration;

use mpib_driver::testing::{
    bounded, exchange_grouped, exchange_sizes, exchange_sizes_in_larger_receives, shared_plugin,
    slot_capacity, version_arg, BASIC_SIZES,
};
use mpib_driver::{child, Agent, Pair, Plan, Version};

const CHILD_LIMIT: Duration = Duration::from_secs(300);
const SUP_BW: [u32; 8] = [0, 1, 256, 512, 768, 1023, 1024, 5000];

fn advanced(version: Version) {
    let number = version.number().to_string();
    let env = [
        ("MPIB_FABRIC", "loopback"),
        ("MPIB_DRIVER_VERSION", number.as_str()),
    ];
    let outcome = child::run_test("child_advanced", &env, CHILD_LIMIT).unwrap();
    outcome.assert_success("child_advanced");
}

#[test]
fn advanced_v7() {
    advanced(Version::V7);
}

#[test]
fn advanced_v8() {
    advanced(Version::V8);
}

#[test]
fn advanced_v9() {
    advanced(Version::V9);
}

#[test]
fn advanced_v10() {
    advanced(Version::V10);
}

#[test]
fn advanced_v11() {
    advanced(Version::V11);
}

#[test]
fn advanced_v12() {
    advanced(Version::V12);
}

#[test]
#[ignore = "runs in a child process started by advanced_v*"]
fn child_advanced() {
    if !child::is_child("child_advanced") {
        return;
    }
    bounded(CHILD_LIMIT, || {
        let version = version_arg();
        let agent = Agent::start_in_temp().unwrap_or_else(|e| panic!("{e}"));
        let owned: Vec<(&str, String)> = [("MPIB_FABRIC", "loopback".to_string())]
            .into_iter()
            .chain(agent.env())
            .collect();
        let vars: Vec<(&str, &str)> = owned.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let net = shared_plugin(&vars)
            .net(version)
            .unwrap_or_else(|e| panic!("{e}"));
        let mut pair = Pair::connect(&net).unwrap_or_else(|e| panic!("{version}: {e}"));
        let registrations = agent
            .wait_for_registrations(1, Duration::from_secs(10))
            .unwrap_or_else(|e| {
                panic!("{version}: the plugin did not register its connection: {e}")
            });
        eprintln!("{version}: agent registrations: {registrations:?}");
        // The SUP pair is the SUP rails' addresses (loop1's GID is ::ffff:127.0.0.2 on both
        // ends), not zeros: an agent keys SUP flows by it.
        let loop1 = std::net::Ipv4Addr::new(127, 0, 0, 2);
        for r in &registrations {
            assert_eq!((r.sup_src, r.sup_dst), (loop1, loop1), "{version}: {r:?}");
        }
        for sup_bw in SUP_BW {
            for r in agent.registrations() {
                agent.set_sup_bw(r.slot, sup_bw);
            }
            let case = format!("{version} advanced sup_bw {sup_bw}");
            exchange_sizes(&mut pair, &BASIC_SIZES, &case, 1)
                .unwrap_or_else(|e| panic!("{case}: {e}"));
            exchange_sizes(&mut pair, &[(4 << 20) + 5], &case, 1)
                .unwrap_or_else(|e| panic!("{case}: {e}"));
            exchange_grouped(&mut pair, &case).unwrap_or_else(|e| panic!("{case}: {e}"));
            exchange_sizes_in_larger_receives(&mut pair, &BASIC_SIZES, slot_capacity, &case)
                .unwrap_or_else(|e| panic!("{case}: {e}"));
            let plan =
                Plan::pipeline(32, |i| 3000 + 1531 * i, 16).labelled(format!("{case} pipeline"));
            pair.exchange(&plan, u64::from(sup_bw), 7)
                .unwrap_or_else(|e| panic!("{e}"));
        }
        pair.close().unwrap_or_else(|e| panic!("{version}: {e}"));
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while agent.registrations().iter().any(|r| r.active) {
            assert!(
                std::time::Instant::now() < deadline,
                "{version}: connections still registered 10 s after close: {:?}",
                agent.registrations()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    });
}
