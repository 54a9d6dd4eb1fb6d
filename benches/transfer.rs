//! What the probes cost a transfer: the same loopback workload through the exported
//! `ncclNetPlugin_v12` table with `MPIB_PROBES=1` and `MPIB_PROBES=0`, rounds interleaved so that
//! machine noise hits both alike; reports transfers/s (median of rounds) and the on/off ratio.
//!
//! `cargo bench --bench transfer` (optional: `-- --rounds N --transfers N`).

use std::ffi::c_void;
use std::ptr::null_mut;
use std::time::{Duration, Instant};

use nccl_net_mpib::ffi::ncclNetPlugin_v12;
use nccl_net_mpib::ffi::types::NetV12;

#[path = "../tests/common/table.rs"]
mod table;

use table::{check, TablePair};

/// Connects a pair with the environment `probes` selects (each `init` snapshots it).
unsafe fn open(net: &NetV12, probes: bool, source: &mut [u8], sink: &mut [u8]) -> TablePair {
    std::env::set_var("MPIB_FABRIC", "loopback");
    std::env::set_var("MPIB_PROBES", if probes { "1" } else { "0" });
    std::env::set_var(
        "MPIB_PROBES_DIR",
        std::env::temp_dir().join("mpib-bench-probes"),
    );
    // SAFETY: forwarded contract.
    unsafe { table::connect(net, None, source, sink) }
}

/// Moves `count` transfers of `size` bytes, keeping `window` in flight; returns the elapsed time.
unsafe fn run(
    net: &NetV12,
    e: &TablePair,
    sink: *mut u8,
    source: *mut u8,
    size: usize,
    count: usize,
) -> Duration {
    const WINDOW: usize = 8;
    let mut sends = [null_mut::<c_void>(); WINDOW];
    let mut recvs = [null_mut::<c_void>(); WINDOW];
    let started = Instant::now();
    let (mut posted, mut completed) = (0usize, 0usize);
    // SAFETY: NCCL ABI calls; buffers registered in `open` and alive for the run.
    unsafe {
        while completed < count {
            while posted < count && posted - completed < WINDOW {
                let slot = posted % WINDOW;
                let mut data = [sink.cast::<c_void>()];
                let (mut sizes, mut tags, mut handles) = ([size], [5i32], [e.recv_memory]);
                while recvs[slot].is_null() {
                    check(
                        net.irecv.unwrap()(
                            e.recv,
                            1,
                            data.as_mut_ptr(),
                            sizes.as_mut_ptr(),
                            tags.as_mut_ptr(),
                            handles.as_mut_ptr(),
                            null_mut(),
                            &mut recvs[slot],
                        ),
                        "irecv",
                    );
                }
                while sends[slot].is_null() {
                    check(
                        net.isend.unwrap()(
                            e.send,
                            source.cast(),
                            size,
                            5,
                            e.send_memory,
                            null_mut(),
                            &mut sends[slot],
                        ),
                        "isend",
                    );
                }
                posted += 1;
            }
            let slot = completed % WINDOW;
            let (mut send_done, mut recv_done) = (0, 0);
            let mut sizes = [0i32; 8];
            while send_done == 0 || recv_done == 0 {
                if send_done == 0 {
                    check(
                        net.test.unwrap()(sends[slot], &mut send_done, sizes.as_mut_ptr()),
                        "test",
                    );
                }
                if recv_done == 0 {
                    check(
                        net.test.unwrap()(recvs[slot], &mut recv_done, sizes.as_mut_ptr()),
                        "test",
                    );
                }
            }
            sends[slot] = null_mut();
            recvs[slot] = null_mut();
            completed += 1;
        }
    }
    started.elapsed()
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn argument(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let rounds = argument("--rounds", 7);
    let transfers = argument("--transfers", 20_000);
    let net = &ncclNetPlugin_v12.0;
    println!("probes overhead on the loopback fabric: {rounds} interleaved rounds x {transfers} transfers");
    println!(
        "{:>9} {:>16} {:>16} {:>8}",
        "size", "off (xfer/s)", "on (xfer/s)", "on/off"
    );
    for size in [64usize, 4096, 65536] {
        let mut source = vec![1u8; size];
        let mut sink = vec![0u8; size];
        let (mut off, mut on) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            for probes in [false, true] {
                // SAFETY: the exported table, driven as NCCL's proxy does.
                let elapsed = unsafe {
                    let e = open(net, probes, &mut source, &mut sink);
                    run(
                        net,
                        &e,
                        sink.as_mut_ptr(),
                        source.as_mut_ptr(),
                        size,
                        transfers / 10,
                    );
                    let elapsed = run(
                        net,
                        &e,
                        sink.as_mut_ptr(),
                        source.as_mut_ptr(),
                        size,
                        transfers,
                    );
                    table::close(net, e);
                    elapsed
                };
                let rate = transfers as f64 / elapsed.as_secs_f64();
                if probes {
                    on.push(rate)
                } else {
                    off.push(rate)
                }
            }
        }
        let (off, on) = (median(off), median(on));
        println!("{size:>9} {off:>16.0} {on:>16.0} {:>8.3}", on / off);
    }
}
