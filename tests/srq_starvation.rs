//! A shared receive queue forced tiny (NICs whose `max_srq_wr` is 48, so a queue grants at most 24
//! receives at once) under a burst of 32 grouped receives of 8 buffers (256 sends in flight):
//! `irecv` holds back what the queue cannot grant instead of letting a sender find it empty, so
//! no receiver-not-ready error reaches NCCL, every byte arrives, and the probes count the takes
//! that came back short. Through the exported v12 table, in a child process (the NICs' limits
//! and the marks are read at `init`).
#![allow(clippy::unwrap_used, clippy::expect_used)] // A failed unwrap fails the test, with its message.

use mpib_probes::declared::{
    RAIL_ERROR_COMPLETIONS, RAIL_RECV_COMPLETIONS, SRQ_DEPTH, SRQ_HIGH_WATER, SRQ_LOW_WATER,
    SRQ_LOW_WATER_HITS,
};
use std::path::Path;
use std::time::Duration;

use mpib_driver::cases::many_outstanding_plan;
use mpib_driver::{child, Pair, Version};
use mpib_probes::{RAIL_SOUT, RAIL_SUP};

#[path = "common/process.rs"]
mod process;
use process::own_probes;

const CHILD_LIMIT: Duration = Duration::from_secs(300);

#[test]
fn a_tiny_srq_under_a_burst_of_grouped_receives_never_runs_dry() {
    let dir = std::env::temp_dir().join(format!("mpib-srq-starve-{}", std::process::id()));
    let probes_dir = dir.to_str().unwrap().to_string();
    let env = [
        ("MPIB_FABRIC", "loopback"),
        (
            "MPIB_LOOPBACK_FAULTS",
            "max_srq_wr=sout:48,max_srq_wr=sup:48",
        ),
        ("MPIB_SRQ_LOW_WATER", "4"),
        ("MPIB_PROBES_DIR", probes_dir.as_str()),
    ];
    let outcome = child::run_test("child_starved_srq", &env, CHILD_LIMIT).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!("{}", outcome.output);
    outcome.assert_success("child_starved_srq");
}

#[test]
#[ignore = "runs in a child process started by a_tiny_srq_under_a_burst_of_grouped_receives_never_runs_dry"]
fn child_starved_srq() {
    if !child::is_child("child_starved_srq") {
        return;
    }
    let plugin = mpib_driver::load_built_plugin().unwrap_or_else(|e| panic!("{e}"));
    let net = plugin.net(Version::V12).unwrap();
    let mut pair = Pair::connect(&net).unwrap_or_else(|e| panic!("{e}"));
    let plan = many_outstanding_plan();
    for round in 0..3 {
        // Any error (an RNR completion would be one) fails the round; bytes are verified.
        pair.exchange(&plan, 0x5e0, round)
            .unwrap_or_else(|e| panic!("round {round} with a 24-receive queue: {e}"));
    }
    let dir = std::env::var("MPIB_PROBES_DIR").unwrap();
    let snapshot = own_probes(Path::new(&dir));
    pair.close().unwrap_or_else(|e| panic!("{e}"));
    // Vanilla intra-island: the data rides SUP.
    let sup = snapshot.rails[RAIL_SUP];
    eprintln!("SUP rail: {sup:?}");
    assert_eq!(
        (sup.gauge(SRQ_LOW_WATER), sup.gauge(SRQ_HIGH_WATER)),
        (4, 512)
    );
    assert!(
        sup.gauge(SRQ_DEPTH) <= 24,
        "depth {} over what the queue may hold",
        sup.gauge(SRQ_DEPTH)
    );
    assert!(
        sup.counter(SRQ_LOW_WATER_HITS) > 0,
        "irecvs held back for want of a receive the queue could grant"
    );
    // One IMM per grouped receive (32 per round), on SUP.
    assert_eq!(
        sup.counter(RAIL_RECV_COMPLETIONS),
        3 * 32,
        "every grouped receive's completion arrived"
    );
    for rail in [RAIL_SOUT, RAIL_SUP] {
        let errors = snapshot.rails[rail].counter(RAIL_ERROR_COMPLETIONS);
        assert_eq!(errors, 0, "rail {rail}: {errors} error completion(s)");
    }
}
