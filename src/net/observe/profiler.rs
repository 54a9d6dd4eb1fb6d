//! Per-rail QP events for NCCL's profiler (net ABI v10+), in net_ib's event format so that stock
//! profiler plugins (the example profiler, Inspector-era tools) decode them without knowing MPIB.
//!
//! NCCL passes a callback at `init` and a per-step parent handle (`phandle`) with each
//! `isend`/`irecv`. Starting an event with a NULL or foreign parent would make NCCL dereference it
//! (`docs/NCCL_NET_ABI.md` §5), so events are emitted only for a non-NULL `phandle`, and only
//! when a callback was given. Stock NCCL builds compile net_ib's own events out; MPIB emits them
//! whenever NCCL asks (the callback is a no-op inside NCCL when no profiler is loaded).

use std::ffi::c_void;

use crate::fabric::Rail;

use crate::net::ProfilerCallback;

/// `NCCL_PROFILER_NET_TYPE_IB | 1`: net_ib's descriptor, version 1 (`profiler_net_ib v1`).
pub(crate) const PLUGIN_ID: i64 = (1 << 16) | 1;
/// `ncclProfileQp`.
const EVENT_QP: u8 = 1;
/// `ncclProfilerNetEventStart`.
const START: i32 = 0;
/// `ncclProfilerNetEventStop`.
const STOP: i32 = 1;
/// `IBV_WR_RDMA_WRITE`.
pub(crate) const OPCODE_RDMA_WRITE: i32 = 0;
/// `IBV_WR_RDMA_WRITE_WITH_IMM`.
pub(crate) const OPCODE_RDMA_WRITE_WITH_IMM: i32 = 1;

/// `ncclProfilerNetIbDescr_v1_t`: `{uint8_t type; union { struct { int device; uint64_t wr_id;
/// int opcode; int qpNum; size_t length; } qp; }}`.
#[repr(C)]
struct IbDescriptor {
    event_type: u8,
    /// The union's one member; its `uint64_t` aligns it to offset 8.
    qp: QpDescriptor,
}

#[repr(C)]
struct QpDescriptor {
    device: i32,
    wr_id: u64,
    opcode: i32,
    qp_num: i32,
    length: usize,
}

const _: () = {
    assert!(std::mem::size_of::<IbDescriptor>() == 40);
    assert!(std::mem::offset_of!(IbDescriptor, qp) == 8);
    assert!(std::mem::offset_of!(QpDescriptor, wr_id) == 8);
    assert!(std::mem::offset_of!(QpDescriptor, qp_num) == 20);
    assert!(std::mem::offset_of!(QpDescriptor, length) == 24);
};

/// One QP work request as a profiler event.
#[derive(Clone, Copy, Debug)]
pub(crate) struct QpEvent {
    /// Rail (reported as `device`: 0 = SOUT, 1 = SUP).
    pub rail: Rail,
    /// The signalled WR's id.
    pub wr_id: u64,
    /// `ibv_wr_opcode`.
    pub opcode: i32,
    /// QP number.
    pub qp_num: u32,
    /// Bytes.
    pub length: u64,
}

/// Starts a QP event under NCCL's step `parent`; the returned handle (0 = none) stops it.
#[inline]
pub(crate) fn start(callback: Option<ProfilerCallback>, parent: usize, event: &QpEvent) -> usize {
    let Some(callback) = callback else { return 0 };
    if parent == 0 {
        return 0;
    }
    let mut descriptor = IbDescriptor {
        event_type: EVENT_QP,
        qp: QpDescriptor {
            device: event.rail.index() as i32,
            wr_id: event.wr_id,
            opcode: event.opcode,
            qp_num: event.qp_num as i32,
            length: event.length as usize,
        },
    };
    let mut handle: *mut c_void = std::ptr::null_mut();
    // SAFETY: NCCL's contract for the v10+ profiler callback: `parent` is the non-NULL step
    // handle NCCL passed with this request, the descriptor lives for the call, and NCCL writes
    // the event handle (or leaves it NULL when no profiler wants the event).
    unsafe {
        callback(
            &mut handle,
            START,
            parent as *mut c_void,
            PLUGIN_ID,
            (&mut descriptor as *mut IbDescriptor).cast(),
        );
    }
    handle as usize
}

/// Stops an event started by [`start`] (no-op for handle 0).
#[inline]
pub(crate) fn stop(callback: Option<ProfilerCallback>, handle: usize) {
    let (Some(callback), false) = (callback, handle == 0) else {
        return;
    };
    let mut handle = handle as *mut c_void;
    // SAFETY: `handle` is what NCCL returned from the matching start; stop takes no parent and
    // no data.
    unsafe {
        callback(
            &mut handle,
            STOP,
            std::ptr::null_mut(),
            PLUGIN_ID,
            std::ptr::null_mut(),
        );
    }
}
