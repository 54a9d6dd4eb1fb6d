//! More connections than the probes' connection table held before 3.2 (64 slots): one process
//! sets up 100 pairs in NCCL's batch order (200 connections) in advanced mode with the agent and
//! moves bytes on every one. The agent measures every send connection of the flow, and
//! `mpib-top` lists every connection, each send connection with its flow. With 64 slots the agent
//! saw at most the send connections among the first 64 and `mpib-top` listed 64.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{agent, process, temp_dir, top_json};
use mpib_driver::batch::{connect_batch, Batch};
use mpib_driver::net::{MemHandle, Net, RecvBuf, Request};
use mpib_driver::{child, Version};

/// Pairs of the batch: 100 send and 100 receive connections.
const PAIRS: usize = 100;
/// Bytes each pair moves per round.
const SIZE: usize = 64 * 1024;
/// `NCCL_PTR_HOST`.
const PTR_HOST: i32 = 1;
/// Where the child finds the agent and the probes (set by the parent).
const DIR_VARIABLE: &str = "TOP_MANY_DIR";

#[test]
fn more_connections_than_64_are_each_measured_and_listed() {
    let dir = temp_dir("many");
    let _agent = agent(&dir);
    let path = |name: &str| dir.join(name).display().to_string();
    let (hints, socket, probes) = (path("hints"), path("agent.sock"), path("probes"));
    let env = [
        ("MPIB_FABRIC", "loopback"),
        ("MPIB_MODE", "1"),
        ("MPIB_HINT_PATH", hints.as_str()),
        ("MPIB_AGENT_SOCKET", socket.as_str()),
        ("MPIB_PROBES_DIR", probes.as_str()),
        (DIR_VARIABLE, &dir.display().to_string()),
    ];
    let outcome = child::run_test("child_many", &env, Duration::from_secs(300)).unwrap();
    outcome.assert_success("child_many");
    // The child's line follows the harness's `test child_many ... ` on the same line.
    for line in outcome
        .output
        .lines()
        .filter_map(|l| l.split_once("many: "))
    {
        eprintln!("many: {}", line.1);
    }
}

/// `call` until it returns a request; past `deadline` the test fails naming `what`.
fn posted(what: &str, deadline: Instant, mut call: impl FnMut() -> Option<Request>) -> Request {
    loop {
        if let Some(request) = call() {
            return request;
        }
        assert!(Instant::now() < deadline, "{what} never posted");
    }
}

/// Every pair moves `SIZE` bytes once: every receive posted, then every send, then each request
/// tested until done (one thread, as NCCL's proxy drives its comms).
fn move_round(net: &Net<'_>, batch: &Batch, handles: &Handles, sinks: &mut [u8]) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut pending = Vec::with_capacity(2 * PAIRS);
    for (i, recv) in batch.recvs.iter().enumerate() {
        let bufs = [RecvBuf {
            data: sinks[i * SIZE..].as_mut_ptr().cast(),
            size: SIZE,
            tag: 1,
            mhandle: handles.recvs[i].as_ptr(),
        }];
        // SAFETY: the sink slice is registered and outlives the request (tested below).
        let call = || unsafe { net.irecv(recv, &bufs) }.unwrap();
        pending.push(posted("irecv", deadline, call));
    }
    for (send, handle) in batch.sends.iter().zip(&handles.sends) {
        let source = handles.source.cast();
        // SAFETY: the source buffer is registered and outlives the request (tested below).
        let call = || unsafe { net.isend(send, source, SIZE, 1, handle) }.unwrap();
        pending.push(posted("isend", deadline, call));
    }
    while !pending.is_empty() {
        pending.retain(|request| !net.test(request, None).unwrap());
        assert!(
            Instant::now() < deadline,
            "{} requests never completed",
            pending.len()
        );
    }
}

/// The registrations of one round's buffers.
struct Handles {
    source: *mut u8,
    sends: Vec<MemHandle>,
    recvs: Vec<MemHandle>,
}

/// The agent's measured send connections of its one flow (0 while it has none).
fn measured_connections(control: &Path) -> usize {
    let flows = mpib_agent::control::request(control, mpib_agent::control::Command::Flows)
        .unwrap_or_default();
    let flows = mpib_top::agent::parse(&flows).unwrap_or_default();
    flows
        .first()
        .and_then(|f| f.measured_connections)
        .map_or(0, |n| n as usize)
}

#[test]
#[ignore = "runs in a child process started by more_connections_than_64_are_each_measured_and_listed"]
fn child_many() {
    if !child::is_child("child_many") {
        return;
    }
    let dir = PathBuf::from(std::env::var(DIR_VARIABLE).unwrap());
    let plugin = mpib_driver::load_built_plugin().unwrap_or_else(|e| panic!("{e}"));
    let net = plugin.net(Version::V12).unwrap();
    let recv_ctx = net.init(0xA1).unwrap();
    let send_ctx = net.init(0xA2).unwrap();
    let setup = Duration::from_secs(120);
    let batch = connect_batch(&net, &send_ctx, &recv_ctx, 0, PAIRS, setup)
        .unwrap_or_else(|e| panic!("{e}"));
    let mut source = vec![0x5au8; SIZE];
    let mut sinks = vec![0u8; SIZE * PAIRS];
    let source_ptr = source.as_mut_ptr();
    let handles = Handles {
        source: source_ptr,
        sends: (batch.sends.iter())
            // SAFETY: `source` outlives every handle (deregistered below).
            .map(|s| unsafe { net.reg_mr(s, source_ptr.cast(), SIZE, PTR_HOST) }.unwrap())
            .collect(),
        recvs: (batch.recvs.iter().enumerate())
            .map(|(i, recv)| {
                let at = sinks[i * SIZE..].as_mut_ptr();
                // SAFETY: `sinks` outlives every handle (deregistered below).
                unsafe { net.reg_mr(recv, at.cast(), SIZE, PTR_HOST) }.unwrap()
            })
            .collect(),
    };
    let control = dir.join("agent.control");
    let (started, mut rounds, mut measured) = (Instant::now(), 0, 0);
    while measured < PAIRS && started.elapsed() < Duration::from_secs(60) {
        move_round(&net, &batch, &handles, &mut sinks);
        rounds += 1;
        measured = measured_connections(&control);
    }
    assert!(sinks.iter().all(|&b| b == 0x5a), "every byte arrived");
    assert_eq!(
        measured, PAIRS,
        "the agent measured {measured} of {PAIRS} send connections"
    );

    let doc = top_json(&dir, &["--interval", "0.2"]);
    let me = process(&doc, std::process::id()).unwrap_or_else(|| panic!("not listed: {doc}"));
    let listed = me["connections"].as_array().unwrap();
    let sends: Vec<_> = listed.iter().filter(|c| c["direction"] == "send").collect();
    assert_eq!((listed.len(), sends.len()), (2 * PAIRS, PAIRS), "{me}");
    assert!(
        sends.iter().all(|c| c["flow"].is_u64()),
        "every send has its flow: {me}"
    );
    println!(
        "many: {PAIRS} pairs, the agent measured {measured} send connections after {rounds} \
         round(s) in {:?}, mpib-top listed {}",
        started.elapsed(),
        listed.len()
    );
    for (send, handle) in batch.sends.iter().zip(handles.sends) {
        net.dereg_mr(send, handle).unwrap();
    }
    for (recv, handle) in batch.recvs.iter().zip(handles.recvs) {
        net.dereg_mr(recv, handle).unwrap();
    }
    batch.close(&net).unwrap();
    net.finalize(send_ctx).unwrap();
    net.finalize(recv_ctx).unwrap();
    drop(source);
}
