//! One buffer registered through many comms, as NCCL registers a peer's shared p2p buffer pool
//! and each user buffer for every connection that uses it: `--comms` comms (half of them send,
//! half receive, from `--comms / 2` pairs opened through the exported `ncclNetPlugin_v12` table)
//! each `regMr` the same `--size` buffer, then each `deregMr` it. Per round it reports the time of
//! one `regMr` (p50 / p99 / total) and of one `deregMr`, and what the NICs hold while every
//! handle is live: the MRs the buffer added on each NIC, as the probes count them (made minus
//! released, `mpib_rail_memory_registrations_total` − `mpib_rail_memory_deregistrations_total`,
//! beside what the pairs' own buffers held before), and the pinned bytes (`VmPin`, verbs only).
//! Medians over `--rounds`.
//!
//! `cargo bench --bench registrations -- --comms 1024 --size 67108864 --rounds 5` (the
//! defaults). With `--fabric verbs` it runs on the NICs the environment names (the rig's). Prints
//! a table and one `row comms=N ...` line for scripts.
#![allow(clippy::unwrap_used, clippy::expect_used)] // A failed unwrap fails the test, with its message.

use std::ffi::c_void;
use std::path::Path;
use std::ptr::null_mut;
use std::time::Instant;

use mpib_probes::declared::{MEMORY_DEREGISTRATIONS, MEMORY_REGISTRATIONS};
use mpib_probes::{LoadState, ProbesReader};
use nccl_net_mpib::ffi::ncclNetPlugin_v12;
use nccl_net_mpib::ffi::types::NetV12;

mod common;
#[path = "../tests/common/process.rs"]
mod process;
#[path = "../tests/common/table.rs"]
mod table;

use common::median;
use table::{check, TablePair};

/// `NCCL_PTR_HOST`.
const PTR_HOST: i32 = 1;

/// One round's figures.
struct Round {
    register_ns: Vec<f64>,
    deregister_ns: Vec<f64>,
    /// MRs the buffer's handles added per NIC slot while all were live (`None`: the file does
    /// not count them).
    held: Option<Vec<u64>>,
    pinned: u64,
}

/// MRs each NIC slot holds for `regMr` handles, from this process's probes file in `dir`.
fn held_per_nic(dir: &Path) -> Option<Vec<u64>> {
    let path = process::own_probes_path(dir)?;
    let Ok(LoadState::Ready(reader)) = ProbesReader::open(&path) else {
        return None;
    };
    let counted = reader
        .declarations()
        .iter()
        .any(|d| d.name == "mpib_rail_memory_registrations_total");
    let snapshot = reader.snapshot();
    counted.then(|| {
        snapshot
            .rails
            .iter()
            .map(|rail| rail.counter(MEMORY_REGISTRATIONS) - rail.counter(MEMORY_DEREGISTRATIONS))
            .collect()
    })
}

fn round(net: &NetV12, pairs: &[TablePair], buffer: &mut [u8], probes: &Path) -> Round {
    let comms: Vec<*mut c_void> = pairs.iter().flat_map(|p| [p.send, p.recv]).collect();
    // The pairs' own buffers hold theirs already: what the one buffer adds is the difference.
    let before = held_per_nic(probes);
    let mut handles = Vec::with_capacity(comms.len());
    let mut register_ns = Vec::with_capacity(comms.len());
    for comm in &comms {
        let mut handle: *mut c_void = null_mut();
        let started = Instant::now();
        // SAFETY: a live comm and a buffer that outlives the handle (deregistered below).
        let code = unsafe {
            net.reg_mr.unwrap()(
                *comm,
                buffer.as_mut_ptr().cast(),
                buffer.len(),
                PTR_HOST,
                &mut handle,
            )
        };
        register_ns.push(started.elapsed().as_nanos() as f64);
        check(code, "regMr");
        handles.push(handle);
    }
    let held = held_per_nic(probes)
        .zip(before)
        .map(|(during, before)| during.iter().zip(before).map(|(d, b)| d - b).collect());
    let pinned = common::pinned_bytes();
    let mut deregister_ns = Vec::with_capacity(comms.len());
    for (comm, handle) in comms.iter().zip(handles) {
        let started = Instant::now();
        // SAFETY: the handle came from regMr on this comm and is deregistered once.
        let code = unsafe { net.dereg_mr.unwrap()(*comm, handle) };
        deregister_ns.push(started.elapsed().as_nanos() as f64);
        check(code, "deregMr");
    }
    Round {
        register_ns,
        deregister_ns,
        held,
        pinned,
    }
}

fn percentile(mut values: Vec<f64>, pct: f64) -> f64 {
    values.sort_by(f64::total_cmp);
    let index = ((values.len() as f64 - 1.0) * pct / 100.0).round() as usize;
    values[index.min(values.len() - 1)]
}

fn main() {
    let comms = common::argument("--comms", 1024).max(2);
    let size = common::argument("--size", 64 << 20).max(1);
    let rounds = common::argument("--rounds", 5).max(1);
    let verbs = std::env::args().any(|a| a == "verbs");
    let probes =
        std::env::temp_dir().join(format!("mpib-bench-registrations-{}", std::process::id()));
    std::fs::create_dir_all(&probes).expect("probes dir");
    // SAFETY: set before the plugin's first init, while this is the only thread.
    unsafe {
        if !verbs {
            std::env::set_var("MPIB_FABRIC", "loopback");
        }
        std::env::set_var("MPIB_PROBES_DIR", &probes);
    }
    let net = &ncclNetPlugin_v12.0;
    let pairs_wanted = comms / 2;
    let mut sources = vec![0u8; pairs_wanted * 4096];
    let mut sinks = vec![0u8; pairs_wanted * 4096];
    let mut pairs = Vec::with_capacity(pairs_wanted);
    for (source, sink) in sources.chunks_mut(4096).zip(sinks.chunks_mut(4096)) {
        // SAFETY: `sources` and `sinks` outlive the pairs (closed below).
        pairs.push(unsafe { table::connect(net, None, source, sink) });
    }
    let mut buffer = vec![0u8; size];
    // Touched: a registration of untouched pages would time the page faults, not the plugin.
    buffer.iter_mut().step_by(4096).for_each(|b| *b = 1);
    let results: Vec<Round> = (0..rounds)
        .map(|_| round(net, &pairs, &mut buffer, &probes))
        .collect();
    for pair in pairs {
        // SAFETY: no request in flight; the buffers are still alive.
        unsafe { table::close(net, pair) };
    }
    let _ = std::fs::remove_dir_all(&probes);
    report(comms, size, &results);
}

fn report(comms: usize, size: usize, results: &[Round]) {
    let median_of = |f: &dyn Fn(&Round) -> f64| median(results.iter().map(f).collect());
    let p50 = median_of(&|r| percentile(r.register_ns.clone(), 50.0)) / 1e3;
    let p99 = median_of(&|r| percentile(r.register_ns.clone(), 99.0)) / 1e3;
    let total = median_of(&|r| r.register_ns.iter().sum::<f64>()) / 1e6;
    let dereg = median_of(&|r| percentile(r.deregister_ns.clone(), 50.0)) / 1e3;
    let pinned = median_of(&|r| r.pinned as f64) / (1 << 20) as f64;
    let held = results[0]
        .held
        .as_ref()
        .map(|per_nic| {
            per_nic
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join("/")
        })
        .unwrap_or_else(|| "n/a".to_string());
    println!(
        "{comms} comms each regMr one {} MiB buffer ({} rounds, medians)",
        size >> 20,
        results.len()
    );
    println!("  regMr p50 {p50:.1} us, p99 {p99:.1} us, all {comms} {total:.1} ms; deregMr p50 {dereg:.1} us");
    println!("  MRs the buffer adds per NIC while all are live: {held}; pinned {pinned:.0} MiB");
    println!(
        "row comms={comms} size={size} reg_p50_us={p50:.1} reg_p99_us={p99:.1} reg_total_ms={total:.1} \
         dereg_p50_us={dereg:.1} mrs_per_nic={held} pinned_mib={pinned:.0}"
    );
}
