//! Many connections in one process (issue 22), bounded so that the test command runs it: a
//! thousand connection pairs opened, each moving verified bytes, closed, three times over, with
//! the memory the process keeps after each cycle checked for growth (a leak of a kilobyte per
//! pair fails it), the descriptors they hold checked (connections between two processes share
//! one control connection: a descriptor per pair fails it), the NICs allowed eight SRQs each (the
//! receive connections share their NIC's receive queues, 128 to a queue); and a connection past a NIC's limits refused whole, with the limit, the NIC
//! and the variable named, its objects given back when the others close. `benches/scale.rs`
//! measures the same shape up to 8,192 pairs (docs/PERFORMANCE.md "Thousands of connections: what each costs").
//! Each case runs in a child process: the plugin's devices and limits are fixed at its first
//! `init`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // A failed unwrap fails the test, with its message.

#[path = "common/devices.rs"]
mod devices;
#[path = "common/table.rs"]
mod table;

use std::ffi::c_void;
use std::ptr::null_mut;

use devices::*;
use mpib_driver::testing::exchange_sizes;
use mpib_driver::{child, Pair, PairOptions, Version};
use nccl_net_mpib::ffi::ncclNetPlugin_v12;

/// Pairs per cycle.
const PAIRS: usize = 1024;
/// Bytes each pair moves per cycle.
const BYTES: usize = 4096;

fn resident_bytes() -> i64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: i64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

fn open_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

fn trimmed_resident_bytes() -> i64 {
    // SAFETY: glibc's malloc_trim has no preconditions.
    unsafe { libc::malloc_trim(0) };
    resident_bytes()
}

/// One NIC pair on loopback in advanced mode with no agent (every connection still makes both
/// rails' QPs), plus `extra`.
fn advanced_env<'a>(extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut env = loopback_env("loop0", "loop1");
    env.extend([
        ("MPIB_MODE", "1"),
        ("MPIB_AGENT_SOCKET", "/nonexistent/mpib-agent.sock"),
    ]);
    env.extend_from_slice(extra);
    env
}

#[test]
fn a_thousand_pairs_open_move_bytes_and_close_without_keeping_memory() {
    // Eight SRQs per NIC: the 1,024 receive connections share them (128 to a queue), cycle after
    // cycle; with a queue each, or with a queue kept past its connections, the ninth would be
    // refused.
    let limits = [("MPIB_LOOPBACK_FAULTS", "max_srq=sout:8,max_srq=sup:8")];
    let output = run_child("child_thousand_pairs", &advanced_env(&limits));
    for line in output.lines().filter(|l| l.starts_with("cycle")) {
        println!("{line}");
    }
    assert!(output.contains("cycles done"), "{output}");
}

#[test]
#[ignore = "runs in a child process started by a_thousand_pairs_open_move_bytes_and_close_without_keeping_memory"]
fn child_thousand_pairs() {
    if !child::is_child("child_thousand_pairs") {
        return;
    }
    let net = &ncclNetPlugin_v12.0;
    let mut holder: *mut c_void = null_mut();
    let mut config = nccl_net_mpib::ffi::types::NetCommConfig { traffic_class: -1 };
    // SAFETY: NCCL ABI call with valid pointers.
    table::check(
        unsafe { net.init.unwrap()(&mut holder, 1, &mut config, None, None) },
        "init",
    );
    let baseline = trimmed_resident_bytes();
    let descriptors = open_descriptors();
    let mut after = Vec::new();
    for cycle in 0..3 {
        let mut source: Vec<u8> = (0..BYTES + PAIRS).map(|i| (i % 251) as u8).collect();
        let mut sinks = vec![0u8; BYTES * PAIRS];
        let pairs: Vec<table::TablePair> = sinks
            .chunks_mut(BYTES)
            // SAFETY: `source` and `sinks` outlive the pairs (closed below).
            .map(|sink| unsafe { table::connect(net, None, &mut source, sink) })
            .collect();
        let open = resident_bytes();
        // One control connection (both its ends, as this process is both peers) for them all.
        let held = open_descriptors() - descriptors;
        assert!(
            held <= 4,
            "cycle {cycle}: {PAIRS} pairs hold {held} descriptors: each has its own control \
             connection instead of sharing its process pair's"
        );
        let (base, sink_base) = (source.as_mut_ptr(), sinks.as_mut_ptr());
        let requests: Vec<_> = pairs
            .iter()
            .enumerate()
            // SAFETY: each pair's sink chunk and the source lie in its registrations.
            .map(|(i, pair)| unsafe {
                let recv = table::irecv(net, pair, sink_base.add(i * BYTES), BYTES, 3, null_mut());
                (
                    table::isend(net, pair, base.add(i), BYTES, 3, null_mut()),
                    recv,
                )
            })
            .collect();
        for (send, recv) in requests {
            // SAFETY: live requests; every transfer is already in flight.
            assert_eq!(unsafe { table::wait_both(net, send, recv) }, (4096, 4096));
        }
        for (i, sink) in sinks.chunks(BYTES).enumerate() {
            assert!(
                sink == &source[i..i + BYTES],
                "cycle {cycle}: pair {i}'s bytes differ"
            );
        }
        for pair in pairs {
            // SAFETY: pairs from `table::connect` with nothing in flight.
            unsafe { table::close(net, pair) };
        }
        drop((source, sinks));
        after.push(trimmed_resident_bytes());
        println!(
            "cycle {cycle}: {:.1} MB open, {:.1} MB after closing ({:.1} MB before any)",
            (open - baseline) as f64 / 1e6,
            (after[cycle] - baseline) as f64 / 1e6,
            baseline as f64 / 1e6
        );
    }
    // The first cycle may leave what a process keeps once it has had connections (pools sized
    // to their peak, the probes file's pages); a later one must not add to it.
    let growth = after[2] - after[1];
    assert!(
        growth < (PAIRS * 1024) as i64,
        "the third cycle of {PAIRS} pairs kept {growth} bytes more than the second: a leak of \
         about {} bytes per pair",
        growth / PAIRS as i64
    );
    assert!(
        after[0] - baseline < 16 << 20,
        "closing {PAIRS} pairs kept {} MB",
        (after[0] - baseline) >> 20
    );
    // SAFETY: the context from init above.
    table::check(unsafe { net.finalize.unwrap()(holder) }, "finalize");
    println!("cycles done");
}

/// Runs `child` with the loopback NICs limited by `faults`, and checks that it printed the
/// limit `named` (the refusal) and its closing line.
fn refused_whole(child: &str, faults: &str, named: &[&str]) {
    let env = advanced_env(&[("MPIB_LOOPBACK_FAULTS", faults)]);
    let output = run_child(child, &env);
    for named in named.iter().chain(&["loop1", "limits hold"]) {
        assert!(output.contains(named), "no `{named}` in\n{output}");
    }
}

/// In a child: `maxComms` is `max_comms`, one pair moves bytes, a second is refused (`why`
/// it should not fit), and once the first closes what both held is back and a new pair fits.
fn one_pair_fits_then_room_again(max_comms: i32, why: &str) {
    let plugin = load();
    let net = plugin.net(Version::V12).unwrap();
    let ctx = net.init(1).unwrap();
    let props = net.get_properties(0).unwrap();
    assert_eq!(props.max_comms, max_comms, "{why}");
    let options = PairOptions::default();
    let mut first = Pair::connect_with(&net, &options).unwrap();
    exchange_sizes(&mut first, &[4096], "first", 1).unwrap();
    match Pair::connect_with(&net, &options) {
        Ok(_) => panic!("a second pair fit: {why}"),
        Err(error) => println!("refused: {error}"),
    }
    first.close().unwrap();
    let mut again = Pair::connect_with(&net, &options).unwrap();
    exchange_sizes(&mut again, &[0, 65_536], "again", 2).unwrap();
    again.close().unwrap();
    net.finalize(ctx).unwrap();
    println!("limits hold");
}

#[test]
fn a_connection_past_a_nic_limit_is_refused_whole() {
    // Room for one pair's 4 + 4 SUP QPs (MPIB_SUP_QP=4 on each side).
    let named = ["holds 8 of 8 QPs (max_qp)", "lower MPIB_SUP_QP"];
    refused_whole("child_past_the_limit", "max_qp=sup:8", &named);
}

#[test]
#[ignore = "runs in a child process started by a_connection_past_a_nic_limit_is_refused_whole"]
fn child_past_the_limit() {
    if child::is_child("child_past_the_limit") {
        one_pair_fits_then_room_again(2, "8 SUP QPs over 4 per comm");
    }
}

#[test]
fn a_connection_past_a_nics_receive_queues_is_refused_whole() {
    // One SRQ on the SUP NIC, and queues so shallow (`max_srq_wr` 32: 16 receives, two floors
    // of 8 in their half) that each serves one connection: the second pair needs a second queue,
    // and once the first closes its queue goes with it.
    let named = [
        "holds 1 of 1 SRQs (max_srq)",
        "a new shared receive queue needs 1",
    ];
    refused_whole(
        "child_past_the_queues",
        "max_srq=sup:1,max_srq_wr=sup:32",
        &named,
    );
}

#[test]
#[ignore = "runs in a child process started by a_connection_past_a_nics_receive_queues_is_refused_whole"]
fn child_past_the_queues() {
    if child::is_child("child_past_the_queues") {
        one_pair_fits_then_room_again(1, "one queue of one connection on the SUP NIC");
    }
}

#[test]
fn a_connection_past_a_nics_registrations_is_refused_whole() {
    // Room for one pair on the SUP NIC: its own registrations (2 of the sender's, 2 of the
    // receiver's) and the MRs of its two buffers, which regMr takes from the same budget.
    let named = ["holds 6 of 6 MRs (max_mr)"];
    refused_whole("child_past_the_registrations", "max_mr=sup:6", &named);
}

#[test]
#[ignore = "runs in a child process started by a_connection_past_a_nics_registrations_is_refused_whole"]
fn child_past_the_registrations() {
    if child::is_child("child_past_the_registrations") {
        one_pair_fits_then_room_again(3, "6 SUP MRs over 2 per comm");
    }
}
