//! The hot path allocates nothing: 10,000 transfers through the exported `ncclNetPlugin_v12`
//! table (`isend`, `irecv`, `test`) with a counting global allocator watching this thread.
//!
//! Set-up (init, connect, regMr) may allocate; only the data-path window is counted.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::ffi::c_void;
use std::ptr::null_mut;
use std::time::{Duration, Instant};

use nccl_net_mpib::ffi::ncclNetPlugin_v12;
use nccl_net_mpib::ffi::types::NetCommConfig;

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

fn check(code: i32, what: &str) {
    assert_eq!(code, 0, "{what} returned ncclResult {code}");
}

#[test]
fn isend_irecv_and_test_allocate_nothing() {
    std::env::set_var("MPIB_FABRIC", "loopback");
    std::env::set_var("MPIB_MODE", "1"); // advanced: the hint read is on the path too
    std::env::set_var("MPIB_AGENT_SOCKET", "/nonexistent/mpib-agent.sock");
    let net = &ncclNetPlugin_v12.0;
    let mut config = NetCommConfig { traffic_class: -1 };
    let mut ctx: *mut c_void = null_mut();
    // SAFETY: the table's functions follow the NCCL ABI; every pointer passed is valid.
    unsafe {
        check(
            net.init.unwrap()(&mut ctx, 1, &mut config, None, None),
            "init",
        );
        let mut handle = [0u8; 128];
        let mut listen: *mut c_void = null_mut();
        check(
            net.listen.unwrap()(ctx, 0, handle.as_mut_ptr().cast(), &mut listen),
            "listen",
        );
        let (mut send, mut recv): (*mut c_void, *mut c_void) = (null_mut(), null_mut());
        let deadline = Instant::now() + Duration::from_secs(10);
        while send.is_null() || recv.is_null() {
            assert!(Instant::now() < deadline, "connect/accept did not finish");
            if send.is_null() {
                check(
                    net.connect.unwrap()(ctx, 0, handle.as_mut_ptr().cast(), &mut send, null_mut()),
                    "connect",
                );
            }
            if recv.is_null() {
                check(net.accept.unwrap()(listen, &mut recv, null_mut()), "accept");
            }
        }
        check(net.close_listen.unwrap()(listen), "closeListen");

        let largest = SIZES[SIZES.len() - 1];
        let source: Vec<u8> = (0..largest).map(|i| i as u8).collect();
        let mut sink = vec![0u8; largest];
        let (mut smh, mut rmh): (*mut c_void, *mut c_void) = (null_mut(), null_mut());
        check(
            net.reg_mr.unwrap()(send, source.as_ptr() as *mut c_void, largest, 1, &mut smh),
            "regMr",
        );
        check(
            net.reg_mr.unwrap()(recv, sink.as_mut_ptr().cast(), largest, 1, &mut rmh),
            "regMr",
        );

        COUNTING.with(|c| c.set(true));
        for transfer in 0..TRANSFERS {
            let size = SIZES[transfer % SIZES.len()];
            let mut data = [sink.as_mut_ptr().cast::<c_void>()];
            let mut capacity = [largest];
            let mut tags = [7i32];
            let mut handles = [rmh];
            let mut rreq: *mut c_void = null_mut();
            while rreq.is_null() {
                check(
                    net.irecv.unwrap()(
                        recv,
                        1,
                        data.as_mut_ptr(),
                        capacity.as_mut_ptr(),
                        tags.as_mut_ptr(),
                        handles.as_mut_ptr(),
                        null_mut(),
                        &mut rreq,
                    ),
                    "irecv",
                );
            }
            let mut sreq: *mut c_void = null_mut();
            while sreq.is_null() {
                check(
                    net.isend.unwrap()(
                        send,
                        source.as_ptr() as *mut c_void,
                        size,
                        7,
                        smh,
                        null_mut(),
                        &mut sreq,
                    ),
                    "isend",
                );
            }
            let (mut send_done, mut recv_done) = (0, 0);
            let mut received = [0i32; 8];
            let mut sent = 0i32;
            while send_done == 0 || recv_done == 0 {
                if send_done == 0 {
                    check(
                        net.test.unwrap()(sreq, &mut send_done, &mut sent),
                        "test(send)",
                    );
                }
                if recv_done == 0 {
                    check(
                        net.test.unwrap()(rreq, &mut recv_done, received.as_mut_ptr()),
                        "test(recv)",
                    );
                }
            }
            assert_eq!((sent as usize, received[0] as usize), (size, size));
        }
        COUNTING.with(|c| c.set(false));
        let allocations = ALLOCATIONS.with(Cell::get);
        assert!(sink == source, "bytes differ after {TRANSFERS} transfers");
        assert_eq!(
            allocations, 0,
            "{allocations} heap allocations during {TRANSFERS} transfers"
        );

        check(net.dereg_mr.unwrap()(send, smh), "deregMr");
        check(net.dereg_mr.unwrap()(recv, rmh), "deregMr");
        check(net.close_send.unwrap()(send), "closeSend");
        check(net.close_recv.unwrap()(recv), "closeRecv");
        check(net.finalize.unwrap()(ctx), "finalize");
    }
}
