//! NCCL profiler events (net ABI v10+): with a callback from `init` and a non-NULL `phandle`,
//! every transfer emits one QP event per active rail in net_ib's descriptor format, each started
//! under the request's NCCL step and stopped at completion; with a NULL `phandle`, none.
#![allow(clippy::unwrap_used, clippy::expect_used)] // A failed unwrap fails the test, with its message.

use std::ffi::c_void;
use std::ptr::null_mut;
use std::sync::Mutex;

use nccl_net_mpib::ffi::ncclNetPlugin_v12;

#[path = "common/table.rs"]
mod table;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Event {
    kind: i32,
    parent: usize,
    plugin_id: i64,
    handle: usize,
    device: i32,
    length: usize,
}

static EVENTS: Mutex<Vec<Event>> = Mutex::new(Vec::new());

unsafe extern "C" fn profiler(
    handle: *mut *mut c_void,
    kind: i32,
    parent: *mut c_void,
    plugin_id: i64,
    data: *mut c_void,
) -> i32 {
    let mut events = EVENTS.lock().unwrap();
    let (device, length) = if data.is_null() {
        (-1, 0)
    } else {
        // SAFETY: the plugin passes net_ib's v1 descriptor: type at 0, qp.device at 8,
        // qp.length at 32.
        unsafe {
            let bytes = data as *const u8;
            (
                *(bytes.add(8) as *const i32),
                *(bytes.add(32) as *const usize),
            )
        }
    };
    let recorded = if kind == 0 {
        let fresh = 0x1000 + events.len();
        // SAFETY: the plugin passes a writable handle slot.
        unsafe { *handle = fresh as *mut c_void };
        fresh
    } else {
        // SAFETY: as above; on stop it holds the handle we returned at start.
        unsafe { *handle as usize }
    };
    events.push(Event {
        kind,
        parent: parent as usize,
        plugin_id,
        handle: recorded,
        device,
        length,
    });
    0
}

#[test]
fn each_rail_of_each_transfer_is_a_qp_event_under_its_nccl_step() {
    std::env::set_var("MPIB_FABRIC", "loopback");
    std::env::set_var("MPIB_MODE", "0"); // vanilla intra-island: data on SUP, CTS on SUP
    std::env::set_var("MPIB_PROBES", "0");
    let net = &ncclNetPlugin_v12.0;
    let mut step_send = 0u64;
    let mut step_recv = 0u64;
    let send_parent = (&mut step_send as *mut u64).cast::<c_void>();
    let recv_parent = (&mut step_recv as *mut u64).cast::<c_void>();
    let mut source = vec![7u8; 8192];
    let mut sink = vec![0u8; 8192];
    // SAFETY: the buffers outlive the pair; the parents outlive every event.
    unsafe {
        let pair = table::connect(net, Some(profiler), &mut source, &mut sink);
        for (send_step, recv_step) in [(send_parent, recv_parent), (null_mut(), null_mut())] {
            let recv = table::irecv(net, &pair, sink.as_mut_ptr(), 8192, 3, recv_step);
            let send = table::isend(net, &pair, source.as_mut_ptr(), 8192, 3, send_step);
            assert_eq!(table::wait_both(net, send, recv), (8192, 8192));
        }
        table::close(net, pair);
    }
    let events = EVENTS.lock().unwrap().clone();
    let starts: Vec<_> = events.iter().filter(|e| e.kind == 0).collect();
    assert_eq!(
        starts.len(),
        2,
        "one send event (one active rail) and one receive event: {events:?}"
    );
    let send_start = starts
        .iter()
        .find(|e| e.parent == send_parent as usize)
        .expect("send event under its step");
    assert_eq!(
        (send_start.device, send_start.length, send_start.plugin_id),
        (1, 8192, (1 << 16) | 1)
    );
    let recv_start = starts
        .iter()
        .find(|e| e.parent == recv_parent as usize)
        .expect("receive event under its step");
    assert_eq!(recv_start.device, 1, "vanilla intra-island CTS ride SUP");
    for start in starts {
        let stops = events
            .iter()
            .filter(|e| e.kind == 1 && e.handle == start.handle)
            .count();
        assert_eq!(stops, 1, "event {start:?} is stopped exactly once");
    }
    assert_eq!(
        events.len(),
        4,
        "no events for the transfer with a NULL phandle: {events:?}"
    );
}
