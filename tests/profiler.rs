//! NCCL profiler events (net ABI v10+): with a callback from `init` and a non-NULL `phandle`,
//! every transfer emits one QP event per active rail in net_ib's descriptor format, each started
//! under the request's NCCL step and stopped at completion; with a NULL `phandle`, none.

use std::ffi::c_void;
use std::ptr::null_mut;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nccl_net_mpib::ffi::ncclNetPlugin_v12;
use nccl_net_mpib::ffi::types::NetCommConfig;

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

fn check(code: i32, what: &str) {
    assert_eq!(code, 0, "{what} returned ncclResult {code}");
}

#[test]
fn each_rail_of_each_transfer_is_a_qp_event_under_its_nccl_step() {
    std::env::set_var("MPIB_FABRIC", "loopback");
    std::env::set_var("MPIB_MODE", "0"); // vanilla intra-island: data on SUP, CTS on SUP
    std::env::set_var("MPIB_PROBES", "0");
    let net = &ncclNetPlugin_v12.0;
    let mut config = NetCommConfig { traffic_class: -1 };
    let mut ctx: *mut c_void = null_mut();
    let mut step_send = 0u64;
    let mut step_recv = 0u64;
    // SAFETY: the table's functions follow the NCCL ABI; every pointer passed is valid.
    unsafe {
        check(
            net.init.unwrap()(&mut ctx, 1, &mut config, None, Some(profiler)),
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
        let mut source = vec![7u8; 8192];
        let mut sink = vec![0u8; 8192];
        let (mut smh, mut rmh): (*mut c_void, *mut c_void) = (null_mut(), null_mut());
        check(
            net.reg_mr.unwrap()(send, source.as_mut_ptr().cast(), 8192, 1, &mut smh),
            "regMr",
        );
        check(
            net.reg_mr.unwrap()(recv, sink.as_mut_ptr().cast(), 8192, 1, &mut rmh),
            "regMr",
        );
        for with_parent in [true, false] {
            let send_parent: *mut c_void = if with_parent {
                (&mut step_send as *mut u64).cast()
            } else {
                null_mut()
            };
            let mut recv_parents: [*mut c_void; 1] = [if with_parent {
                (&mut step_recv as *mut u64).cast()
            } else {
                null_mut()
            }];
            let mut data = [sink.as_mut_ptr().cast::<c_void>()];
            let (mut sizes, mut tags, mut handles) = ([8192usize], [3i32], [rmh]);
            let mut rreq: *mut c_void = null_mut();
            while rreq.is_null() {
                check(
                    net.irecv.unwrap()(
                        recv,
                        1,
                        data.as_mut_ptr(),
                        sizes.as_mut_ptr(),
                        tags.as_mut_ptr(),
                        handles.as_mut_ptr(),
                        recv_parents.as_mut_ptr(),
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
                        source.as_mut_ptr().cast(),
                        8192,
                        3,
                        smh,
                        send_parent,
                        &mut sreq,
                    ),
                    "isend",
                );
            }
            let (mut sent, mut received) = (0, 0);
            let mut got = [0i32; 8];
            while sent == 0 || received == 0 {
                if sent == 0 {
                    check(
                        net.test.unwrap()(sreq, &mut sent, got.as_mut_ptr()),
                        "test(send)",
                    );
                }
                if received == 0 {
                    check(
                        net.test.unwrap()(rreq, &mut received, got.as_mut_ptr()),
                        "test(recv)",
                    );
                }
            }
        }
        check(net.dereg_mr.unwrap()(send, smh), "deregMr");
        check(net.dereg_mr.unwrap()(recv, rmh), "deregMr");
        check(net.close_send.unwrap()(send), "closeSend");
        check(net.close_recv.unwrap()(recv), "closeRecv");
        check(net.finalize.unwrap()(ctx), "finalize");
    }
    let events = EVENTS.lock().unwrap().clone();
    let send_parent = &mut step_send as *mut u64 as usize;
    let recv_parent = &mut step_recv as *mut u64 as usize;
    let starts: Vec<_> = events.iter().filter(|e| e.kind == 0).collect();
    assert_eq!(
        starts.len(),
        2,
        "one send event (one active rail) and one receive event: {events:?}"
    );
    let send_start = starts
        .iter()
        .find(|e| e.parent == send_parent)
        .expect("send event under its step");
    assert_eq!(
        (send_start.device, send_start.length, send_start.plugin_id),
        (1, 8192, (1 << 16) | 1)
    );
    let recv_start = starts
        .iter()
        .find(|e| e.parent == recv_parent)
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
