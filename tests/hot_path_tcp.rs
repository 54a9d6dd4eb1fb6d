//! The tcp fabric's data path allocates nothing either: 2,000 transfers through the exported
//! `ncclNetPlugin_v12` table over `MPIB_FABRIC=tcp` (two loopback addresses as the rails, advanced
//! mode so both rails carry bytes), with a counting global allocator watching EVERY thread of
//! the process — the caller's and the fabric's rail threads, which move the bytes and deliver
//! the completions. (A file of its own: the count is process-wide, so no other test may run
//! beside it.)
//!
//! Set-up (init, connect, regMr, the rail threads' first passes) may allocate; only the
//! data-path window is counted.
#![allow(clippy::unwrap_used, clippy::expect_used)] // A failed unwrap fails the test, with its message.

use std::alloc::{GlobalAlloc, Layout, System};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use nccl_net_mpib::ffi::ncclNetPlugin_v12;

#[path = "common/table.rs"]
mod table;

struct CountingAllocator;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

fn note_allocation() {
    if COUNTING.load(Ordering::Relaxed) {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: forwards to the system allocator unchanged; counting touches only two atomics.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note_allocation();
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note_allocation();
        // SAFETY: same contract as ours.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note_allocation();
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

const TRANSFERS: usize = 2_000;
const WARM_UP: usize = 200;
const SIZES: [usize; 5] = [0, 1, 4097, 65536, 1 << 20];

#[test]
fn transfers_over_tcp_allocate_nothing_in_any_thread() {
    std::env::set_var("MPIB_FABRIC", "tcp");
    std::env::set_var("MPIB_HCA_SOUT", "127.0.0.1");
    std::env::set_var("MPIB_HCA_SUP", "lo=127.0.0.2");
    std::env::set_var("MPIB_PROBES", "0");
    let net = &ncclNetPlugin_v12.0;
    let largest = SIZES[SIZES.len() - 1];
    let mut source: Vec<u8> = (0..largest).map(|i| (i * 7) as u8).collect();
    let mut sink = vec![0u8; largest];
    // SAFETY: the buffers outlive the pair (closed below).
    let pair = unsafe { table::connect(net, None, &mut source, &mut sink) };
    for transfer in 0..WARM_UP + TRANSFERS {
        if transfer == WARM_UP {
            COUNTING.store(true, Ordering::SeqCst);
        }
        let size = SIZES[transfer % SIZES.len()];
        // SAFETY: the buffers are the pair's registered ones.
        let (sent, received) = unsafe {
            let recv = table::irecv(net, &pair, sink.as_mut_ptr(), largest, 7, null_mut());
            let send = table::isend(net, &pair, source.as_mut_ptr(), size, 7, null_mut());
            table::wait_both(net, send, recv)
        };
        assert_eq!((sent as usize, received as usize), (size, size));
    }
    COUNTING.store(false, Ordering::SeqCst);
    let allocations = ALLOCATIONS.load(Ordering::SeqCst);
    assert!(sink == source, "bytes differ after {TRANSFERS} transfers");
    assert_eq!(
        allocations, 0,
        "{allocations} heap allocations in the process during {TRANSFERS} transfers"
    );
    // SAFETY: no request in flight.
    unsafe { table::close(net, pair) };
}
