//! The hot path allocates nothing: 10,000 transfers through the exported `ncclNetPlugin_v12`
//! table (`isend`, `irecv`, `test`) with a counting global allocator watching this thread, in
//! advanced mode (hint read on every slot) with probes on (counters, histograms, events).
//!
//! Set-up (init, connect, regMr) may allocate; only the data-path window is counted.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::ptr::null_mut;

use nccl_net_mpib::ffi::ncclNetPlugin_v12;

#[path = "common/table.rs"]
mod table;

struct CountingAllocator;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn note_allocation() {
    // `try_with`: the allocator also runs during thread teardown, after TLS is gone.
    let _ = COUNTING.try_with(|counting| {
        if counting.get() {
            let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        }
    });
}

// SAFETY: forwards to the system allocator unchanged; counting touches only thread-locals.
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

const TRANSFERS: usize = 10_000;
const SIZES: [usize; 5] = [0, 1, 4097, 65536, 1 << 20];

#[test]
fn isend_irecv_and_test_allocate_nothing() {
    std::env::set_var("MPIB_FABRIC", "loopback");
    std::env::set_var("MPIB_MODE", "1"); // advanced: the hint read is on the path too
    std::env::set_var("MPIB_AGENT_SOCKET", "/nonexistent/mpib-agent.sock");
    std::env::set_var("MPIB_PROBES_SAMPLE", "1"); // every transfer also writes a ring event
    std::env::set_var(
        "MPIB_PROBES_DIR",
        std::env::temp_dir().join("mpib-hot-path-probes"),
    );
    let net = &ncclNetPlugin_v12.0;
    let largest = SIZES[SIZES.len() - 1];
    let mut source: Vec<u8> = (0..largest).map(|i| i as u8).collect();
    let mut sink = vec![0u8; largest];
    // SAFETY: the buffers outlive the pair (closed below).
    let pair = unsafe { table::connect(net, None, &mut source, &mut sink) };
    let probes_dir = std::env::temp_dir().join("mpib-hot-path-probes");
    let probes_file = std::fs::read_dir(&probes_dir).map(|entries| {
        entries
            .flatten()
            .any(|e| e.path().extension().is_some_and(|x| x == "probes"))
    });
    assert!(
        probes_file.unwrap_or(false),
        "probes are on: a file in {}",
        probes_dir.display()
    );
    COUNTING.with(|c| c.set(true));
    for transfer in 0..TRANSFERS {
        let size = SIZES[transfer % SIZES.len()];
        // SAFETY: the buffers are the pair's registered ones.
        let (sent, received) = unsafe {
            let recv = table::irecv(net, &pair, sink.as_mut_ptr(), largest, 7, null_mut());
            let send = table::isend(net, &pair, source.as_mut_ptr(), size, 7, null_mut());
            table::wait_both(net, send, recv)
        };
        assert_eq!((sent as usize, received as usize), (size, size));
    }
    COUNTING.with(|c| c.set(false));
    let allocations = ALLOCATIONS.with(Cell::get);
    assert!(sink == source, "bytes differ after {TRANSFERS} transfers");
    assert_eq!(
        allocations, 0,
        "{allocations} heap allocations during {TRANSFERS} transfers"
    );
    // SAFETY: no request in flight.
    unsafe { table::close(net, pair) };
}
