//! What the plugin costs a transfer: the same loopback workload through the exported
//! `ncclNetPlugin_v12` table with `MPIB_PROBES=1` and `MPIB_PROBES=0`, rounds interleaved so that
//! machine noise hits both alike. Per size it reports transfers/s (median of rounds), the on/off
//! ratio, the CPU time per transfer (this thread's CPU clock: `isend` + `irecv` + `test` on both
//! sides plus the loopback's own copy, which at these sizes is a few ns) and the heap
//! allocations per transfer in the timed loop (a counting global allocator).
//!
//! `cargo bench --bench transfer` (optional: `-- --rounds N --transfers N`). Besides the table it
//! prints one `row size=... cpu_ns_on=...` line per size for scripts/perf.
#![allow(clippy::unwrap_used, clippy::expect_used)] // A failed unwrap fails the test, with its message.

use std::alloc::{GlobalAlloc, Layout, System};
use std::ffi::c_void;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use nccl_net_mpib::ffi::ncclNetPlugin_v12;
use nccl_net_mpib::ffi::types::NetV12;

mod common;
#[path = "../tests/common/table.rs"]
mod table;

use common::{argument, median};

use table::{check, TablePair};

/// Every heap allocation of the process (the bench is single-threaded while it measures).
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

struct CountingAllocator;

// SAFETY: forwards to the system allocator unchanged; counting is one relaxed atomic add.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

/// This thread's CPU time.
fn thread_cpu() -> Duration {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

/// One timed run: wall time, CPU time and allocations.
struct Measured {
    wall: Duration,
    cpu: Duration,
    allocations: u64,
}

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

fn main() {
    let rounds = argument("--rounds", 7);
    let transfers = argument("--transfers", 20_000);
    let net = &ncclNetPlugin_v12.0;
    println!(
        "plugin cost on the loopback fabric: {rounds} interleaved rounds x {transfers} transfers"
    );
    println!(
        "{:>9} {:>14} {:>14} {:>7} {:>12} {:>12} {:>12}",
        "size", "off (xfer/s)", "on (xfer/s)", "on/off", "cpu ns off", "cpu ns on", "allocs/xfer"
    );
    for size in [64usize, 4096, 65536] {
        let mut source = vec![1u8; size];
        let mut sink = vec![0u8; size];
        let (mut off, mut on) = (Vec::new(), Vec::new());
        let (mut cpu_off, mut cpu_on) = (Vec::new(), Vec::new());
        let mut allocations = 0u64;
        for _ in 0..rounds {
            for probes in [false, true] {
                // SAFETY: the exported table, driven as NCCL's proxy does.
                let measured = unsafe {
                    let e = open(net, probes, &mut source, &mut sink);
                    run(
                        net,
                        &e,
                        sink.as_mut_ptr(),
                        source.as_mut_ptr(),
                        size,
                        transfers / 10,
                    );
                    let (cpu, allocated) = (thread_cpu(), ALLOCATIONS.load(Ordering::Relaxed));
                    let wall = run(
                        net,
                        &e,
                        sink.as_mut_ptr(),
                        source.as_mut_ptr(),
                        size,
                        transfers,
                    );
                    let measured = Measured {
                        wall,
                        cpu: thread_cpu() - cpu,
                        allocations: ALLOCATIONS.load(Ordering::Relaxed) - allocated,
                    };
                    table::close(net, e);
                    measured
                };
                let rate = transfers as f64 / measured.wall.as_secs_f64();
                let cpu_ns = measured.cpu.as_nanos() as f64 / transfers as f64;
                allocations += measured.allocations;
                if probes {
                    on.push(rate);
                    cpu_on.push(cpu_ns);
                } else {
                    off.push(rate);
                    cpu_off.push(cpu_ns);
                }
            }
        }
        let (off, on) = (median(off), median(on));
        let (cpu_off, cpu_on) = (median(cpu_off), median(cpu_on));
        let per_transfer = allocations as f64 / (2 * rounds * transfers) as f64;
        println!(
            "{size:>9} {off:>14.0} {on:>14.0} {:>7.3} {cpu_off:>12.0} {cpu_on:>12.0} {per_transfer:>12.4}",
            on / off
        );
        println!(
            "row size={size} off={off:.0} on={on:.0} ratio={:.3} cpu_ns_off={cpu_off:.0} \
             cpu_ns_on={cpu_on:.0} allocs_per_transfer={per_transfer:.4}",
            on / off
        );
    }
}
