//! Driving the exported `ncclNetPlugin_v12` table in-process (through the rlib), as NCCL's proxy
//! does: init, listen, alternating connect/accept, regMr; and the matching teardown. Shared by the
//! tests and benches that must run in the test binary's own process (allocation counting, a
//! profiler callback).

#![allow(dead_code)]

use std::ffi::c_void;
use std::ptr::null_mut;
use std::time::{Duration, Instant};

use nccl_net_mpib::ffi::types::{NetCommConfig, NetV12};
use nccl_net_mpib::net::ProfilerCallback;

/// A connected send/receive pair with one registered buffer on each side.
pub struct TablePair {
    pub ctx: *mut c_void,
    pub send: *mut c_void,
    pub recv: *mut c_void,
    pub send_memory: *mut c_void,
    pub recv_memory: *mut c_void,
}

impl TablePair {
    /// Nothing made yet.
    pub fn empty() -> TablePair {
        TablePair {
            ctx: null_mut(),
            send: null_mut(),
            recv: null_mut(),
            send_memory: null_mut(),
            recv_memory: null_mut(),
        }
    }
}

/// Panics with the entry point's name unless it returned ncclSuccess.
pub fn check(code: i32, what: &str) {
    assert_eq!(code, 0, "{what} returned ncclResult {code}");
}

/// init (one context), listen, connect/accept until both are up, closeListen, regMr both buffers.
///
/// # Safety
/// `source` and `sink` must stay valid until [`close`].
pub unsafe fn connect(
    net: &NetV12,
    profiler: Option<ProfilerCallback>,
    source: &mut [u8],
    sink: &mut [u8],
) -> TablePair {
    // SAFETY: as the caller promises.
    unsafe { try_connect(net, profiler, source, sink) }.unwrap_or_else(|e| panic!("{e}"))
}

/// [`connect`], or which call failed with which code, everything it had made closed again.
///
/// # Safety
/// As for [`connect`].
pub unsafe fn try_connect(
    net: &NetV12,
    profiler: Option<ProfilerCallback>,
    source: &mut [u8],
    sink: &mut [u8],
) -> Result<TablePair, String> {
    let mut config = NetCommConfig { traffic_class: -1 };
    let mut pair = TablePair::empty();
    let mut listen: *mut c_void = null_mut();
    // Closes what exists and says what failed.
    let fail = |pair: &TablePair, listen: *mut c_void, what: &str, code: i32| {
        // SAFETY: each object is closed once, only if it was made.
        unsafe {
            if !listen.is_null() {
                net.close_listen.unwrap()(listen);
            }
            if !pair.send.is_null() {
                net.close_send.unwrap()(pair.send);
            }
            if !pair.recv.is_null() {
                net.close_recv.unwrap()(pair.recv);
            }
            if !pair.ctx.is_null() {
                net.finalize.unwrap()(pair.ctx);
            }
        }
        Err(format!("{what} returned ncclResult {code}"))
    };
    // SAFETY: NCCL ABI calls with valid pointers.
    unsafe {
        let code = net.init.unwrap()(&mut pair.ctx, 1, &mut config, None, profiler);
        if code != 0 {
            pair.ctx = null_mut();
            return fail(&pair, listen, "init", code);
        }
        let mut handle = [0u8; 128];
        let code = net.listen.unwrap()(pair.ctx, 0, handle.as_mut_ptr().cast(), &mut listen);
        if code != 0 {
            return fail(&pair, null_mut(), "listen", code);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while pair.send.is_null() || pair.recv.is_null() {
            if Instant::now() >= deadline {
                return fail(&pair, listen, "connect/accept (10 s without finishing)", -1);
            }
            if pair.send.is_null() {
                let code = net.connect.unwrap()(
                    pair.ctx,
                    0,
                    handle.as_mut_ptr().cast(),
                    &mut pair.send,
                    null_mut(),
                );
                if code != 0 {
                    return fail(&pair, listen, "connect", code);
                }
            }
            if pair.recv.is_null() {
                let code = net.accept.unwrap()(listen, &mut pair.recv, null_mut());
                if code != 0 {
                    return fail(&pair, listen, "accept", code);
                }
            }
        }
        check(net.close_listen.unwrap()(listen), "closeListen");
        register(net, &mut pair, source, sink);
    }
    Ok(pair)
}

/// regMr `source` on the pair's send comm and `sink` on its receive comm (host memory).
///
/// # Safety
/// The pair's comms are live; `source` and `sink` stay valid until [`close`].
pub unsafe fn register(net: &NetV12, pair: &mut TablePair, source: &mut [u8], sink: &mut [u8]) {
    let reg = net.reg_mr.unwrap();
    // SAFETY: NCCL ABI calls on live comms with host buffers the caller keeps alive.
    unsafe {
        check(
            reg(
                pair.send,
                source.as_mut_ptr().cast(),
                source.len(),
                1,
                &mut pair.send_memory,
            ),
            "regMr",
        );
        check(
            reg(
                pair.recv,
                sink.as_mut_ptr().cast(),
                sink.len(),
                1,
                &mut pair.recv_memory,
            ),
            "regMr",
        );
    }
}

/// deregMr both, closeSend, closeRecv, finalize.
///
/// # Safety
/// `pair` came from [`connect`] with the same table and has no request in flight.
pub unsafe fn close(net: &NetV12, pair: TablePair) {
    // SAFETY: NCCL ABI calls on live objects.
    unsafe {
        check(
            net.dereg_mr.unwrap()(pair.send, pair.send_memory),
            "deregMr",
        );
        check(
            net.dereg_mr.unwrap()(pair.recv, pair.recv_memory),
            "deregMr",
        );
        check(net.close_send.unwrap()(pair.send), "closeSend");
        check(net.close_recv.unwrap()(pair.recv), "closeRecv");
        check(net.finalize.unwrap()(pair.ctx), "finalize");
    }
}

/// Posts one receive of `capacity` bytes at `sink` (retrying while the plugin says "later").
///
/// # Safety
/// `sink` lies in the pair's receive registration.
pub unsafe fn irecv(
    net: &NetV12,
    pair: &TablePair,
    sink: *mut u8,
    capacity: usize,
    tag: i32,
    parent: *mut c_void,
) -> *mut c_void {
    let mut data = [sink.cast::<c_void>()];
    let (mut sizes, mut tags, mut handles, mut parents) =
        ([capacity], [tag], [pair.recv_memory], [parent]);
    let mut request: *mut c_void = null_mut();
    while request.is_null() {
        // SAFETY: arrays of one valid entry each.
        let code = unsafe {
            net.irecv.unwrap()(
                pair.recv,
                1,
                data.as_mut_ptr(),
                sizes.as_mut_ptr(),
                tags.as_mut_ptr(),
                handles.as_mut_ptr(),
                parents.as_mut_ptr(),
                &mut request,
            )
        };
        check(code, "irecv");
    }
    request
}

/// Posts one send of `size` bytes from `source` (retrying while the plugin says "later").
///
/// # Safety
/// `source` lies in the pair's send registration.
pub unsafe fn isend(
    net: &NetV12,
    pair: &TablePair,
    source: *mut u8,
    size: usize,
    tag: i32,
    parent: *mut c_void,
) -> *mut c_void {
    let mut request: *mut c_void = null_mut();
    while request.is_null() {
        // SAFETY: live comm and registration.
        let code = unsafe {
            net.isend.unwrap()(
                pair.send,
                source.cast(),
                size,
                tag,
                pair.send_memory,
                parent,
                &mut request,
            )
        };
        check(code, "isend");
    }
    request
}

/// Polls both requests until done; returns (sent size, first received size).
///
/// # Safety
/// Both are live requests of this table.
pub unsafe fn wait_both(net: &NetV12, send: *mut c_void, recv: *mut c_void) -> (i32, i32) {
    let (mut send_done, mut recv_done) = (0, 0);
    let (mut sent, mut received) = (0i32, [0i32; 8]);
    while send_done == 0 || recv_done == 0 {
        // SAFETY: live requests; outputs valid.
        unsafe {
            if send_done == 0 {
                check(
                    net.test.unwrap()(send, &mut send_done, &mut sent),
                    "test(send)",
                );
            }
            if recv_done == 0 {
                check(
                    net.test.unwrap()(recv, &mut recv_done, received.as_mut_ptr()),
                    "test(recv)",
                );
            }
        }
    }
    (sent, received[0])
}
