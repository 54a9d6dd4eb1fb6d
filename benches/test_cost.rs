//! What one `test()` costs as connections grow: N loopback connections each hold a pending
//! receive that nothing will complete, and `test` is called on them in turn, as NCCL's proxy
//! thread sweeps its connections; reported is the median over rounds of the wall time per call,
//! for N = 1 and N = 1,024 (advanced mode, probes on, as in production).
//!
//! `cargo bench --bench test_cost` (optional: `-- --rounds N --calls N`). It uses only the
//! exported `ncclNetPlugin_v12` table, so the same file measures an older tree too. It prints one
//! `row connections=N test_ns=...` line per N for scripts.
#![allow(clippy::unwrap_used, clippy::expect_used)] // A failed unwrap fails the test, with its message.

use std::ffi::c_void;
use std::ptr::null_mut;
use std::time::Instant;

use nccl_net_mpib::ffi::ncclNetPlugin_v12;
use nccl_net_mpib::ffi::types::NetV12;

mod common;
#[path = "../tests/common/table.rs"]
mod table;

use common::{argument, median};

use table::{check, TablePair};

/// Posts a receive that no send will complete.
///
/// # Safety
/// `sink` is the pair's registered receive buffer.
unsafe fn pending_receive(net: &NetV12, pair: &TablePair, sink: *mut u8) -> *mut c_void {
    // SAFETY: as the caller promises.
    unsafe { table::irecv(net, pair, sink, 64, 1, null_mut()) }
}

/// Nanoseconds per `test` over `connections` pending receives, median of `rounds`.
fn measure(net: &NetV12, connections: usize, rounds: usize, calls: usize) -> f64 {
    let mut buffers = vec![[0u8; 64]; 2 * connections];
    let pairs: Vec<TablePair> = buffers
        .chunks_mut(2)
        // SAFETY: the buffers outlive the pairs (closed below).
        .map(|two| unsafe {
            let (a, b) = two.split_at_mut(1);
            table::connect(net, None, &mut a[0], &mut b[0])
        })
        .collect();
    let requests: Vec<*mut c_void> = pairs
        .iter()
        .zip(buffers.chunks_mut(2))
        // SAFETY: the second buffer of each chunk is the pair's receive registration.
        .map(|(pair, two)| unsafe { pending_receive(net, pair, two[1].as_mut_ptr()) })
        .collect();
    let test = net.test.unwrap();
    let mut samples = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let started = Instant::now();
        for call in 0..calls {
            let (mut done, mut sizes) = (0, [0i32; 8]);
            // SAFETY: a live request; outputs valid.
            check(
                unsafe { test(requests[call % connections], &mut done, sizes.as_mut_ptr()) },
                "test",
            );
            assert_eq!(done, 0, "nothing sends: the receive stays pending");
        }
        samples.push(started.elapsed().as_nanos() as f64 / calls as f64);
    }
    // The receives cannot be cancelled (NCCL closes comms with requests pending on abort).
    for pair in pairs {
        // SAFETY: the pair came from `table::connect`; closing with a receive pending is
        // allowed (as on NCCL's abort).
        unsafe { table::close(net, pair) };
    }
    drop(buffers);
    median(samples)
}

fn main() {
    let rounds = argument("--rounds", 7);
    let calls = argument("--calls", 200_000);
    std::env::set_var("MPIB_FABRIC", "loopback");
    std::env::set_var("MPIB_MODE", "1");
    std::env::set_var("MPIB_AGENT_SOCKET", "/nonexistent/mpib-agent.sock");
    let probes = std::env::temp_dir().join(format!("mpib-test-cost-{}", std::process::id()));
    std::env::set_var("MPIB_PROBES_DIR", &probes);
    let net = &ncclNetPlugin_v12.0;
    println!(
        "test() on a pending receive, ns per call (median of {rounds} rounds of {calls} calls)"
    );
    for connections in [1, 1024] {
        let ns = measure(net, connections, rounds, calls);
        println!("{connections:>6} connections: {ns:>8.1} ns");
        println!("row connections={connections} test_ns={ns:.1}");
    }
    let _ = std::fs::remove_dir_all(&probes);
}
