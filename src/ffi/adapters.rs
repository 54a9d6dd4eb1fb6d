//! The `extern "C"` functions the tables point at: one-liners that pick the version's argument
//! types and run the shared body from [`super::common`] inside the boundary ([`entry!`]).
//!
//! Functions whose C signature is the same in several versions exist once; the rest are named
//! after the first version that has their signature (`isend_v7` serves v7 ... v9 through its
//! size type `S`, `isend_v10` serves v10 ... v12).
//!
//! Safety contract of every function here: the NCCL net ABI (`docs/NCCL_NET_ABI.md` sections 1
//! and 2): each pointer is NULL or valid as that ABI describes, and each handle is one this
//! plugin returned and has not yet released.

use std::ffi::{c_int, c_void};
use std::ptr::null_mut;

use super::boundary::{call, entry, SizeArg};
use super::common::{self, ContextArg, RecvArrays};
use super::types::{FromProperties, NetAttr, NetCommConfig, NetDeviceHandle, NetVDeviceProps};
use crate::log::LoggerFn;
use crate::net::ProfilerCallback;

// ----- Every version -------------------------------------------------------------------------

/// `devices`.
pub unsafe extern "C" fn devices(ndev: *mut c_int) -> c_int {
    entry!("devices", common::devices(ndev))
}

/// `getProperties` for the version's properties struct `P`.
pub unsafe extern "C" fn get_properties<P: FromProperties>(dev: c_int, props: *mut P) -> c_int {
    entry!("getProperties", common::get_properties(dev, props))
}

/// `accept`.
pub unsafe extern "C" fn accept(
    listen_comm: *mut c_void,
    recv_comm: *mut *mut c_void,
    recv_dev_comm: *mut *mut NetDeviceHandle,
) -> c_int {
    entry!(
        "accept",
        common::accept(listen_comm, recv_comm, recv_dev_comm)
    )
}

/// `regMr` (`S` = `int` in v7, `size_t` from v8).
pub unsafe extern "C" fn reg_mr<S: SizeArg>(
    comm: *mut c_void,
    data: *mut c_void,
    size: S,
    ptr_type: c_int,
    mhandle: *mut *mut c_void,
) -> c_int {
    entry!("regMr", common::reg_mr(comm, data, size, ptr_type, mhandle))
}

/// `regMrDmaBuf`.
pub unsafe extern "C" fn reg_mr_dma_buf(
    comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    ptr_type: c_int,
    offset: u64,
    fd: c_int,
    mhandle: *mut *mut c_void,
) -> c_int {
    entry!(
        "regMrDmaBuf",
        common::reg_mr_dma_buf(comm, data, size, ptr_type, offset, fd, mhandle)
    )
}

/// `deregMr`.
pub unsafe extern "C" fn dereg_mr(comm: *mut c_void, mhandle: *mut c_void) -> c_int {
    entry!("deregMr", common::dereg_mr(comm, mhandle))
}

/// `iflush` (`int` sizes in every version).
pub unsafe extern "C" fn iflush(
    recv_comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut c_int,
    mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> c_int {
    let arrays = RecvArrays {
        data,
        sizes,
        tags: null_mut(),
        mhandles,
        phandles: null_mut(),
    };
    entry!("iflush", common::iflush(recv_comm, n, arrays, request))
}

/// `test` (`int` sizes in every version).
pub unsafe extern "C" fn test(request: *mut c_void, done: *mut c_int, sizes: *mut c_int) -> c_int {
    entry!("test", common::test(request, done, sizes))
}

/// `closeSend`.
pub unsafe extern "C" fn close_send(send_comm: *mut c_void) -> c_int {
    entry!("closeSend", common::close_send(send_comm))
}

/// `closeRecv`.
pub unsafe extern "C" fn close_recv(recv_comm: *mut c_void) -> c_int {
    entry!("closeRecv", common::close_recv(recv_comm))
}

/// `closeListen`.
pub unsafe extern "C" fn close_listen(listen_comm: *mut c_void) -> c_int {
    entry!("closeListen", common::close_listen(listen_comm))
}

/// `getDeviceMr`: no device-side handle (HOST plugin).
pub unsafe extern "C" fn get_device_mr(
    _comm: *mut c_void,
    _mhandle: *mut c_void,
    dptr_mhandle: *mut *mut c_void,
) -> c_int {
    entry!("getDeviceMr", common::get_device_mr(dptr_mhandle))
}

/// `irecvConsumed`: nothing to do for a HOST plugin.
pub unsafe extern "C" fn irecv_consumed(
    _recv_comm: *mut c_void,
    _n: c_int,
    _request: *mut c_void,
) -> c_int {
    call("irecvConsumed", || Ok(()))
}

/// `makeVDevice` (v9+; `N` = 4 before v12, 8 in v12).
pub unsafe extern "C" fn make_v_device<const N: usize>(
    d: *mut c_int,
    props: *mut NetVDeviceProps<N>,
) -> c_int {
    entry!("makeVDevice", common::make_v_device(d, props))
}

// ----- v7 ... v10: one process-wide context ---------------------------------------------------

/// `init(logger)` (v7 ... v9).
pub unsafe extern "C" fn init_v7(logger: Option<LoggerFn>) -> c_int {
    call("init", || common::init_legacy(logger, None))
}

/// `init(logger, profiler)` (v10).
pub unsafe extern "C" fn init_v10(
    logger: Option<LoggerFn>,
    profiler: Option<ProfilerCallback>,
) -> c_int {
    call("init", || common::init_legacy(logger, profiler))
}

/// `listen(dev, handle, listenComm)` (v7 ... v10).
pub unsafe extern "C" fn listen_v7(
    dev: c_int,
    handle: *mut c_void,
    listen_comm: *mut *mut c_void,
) -> c_int {
    entry!(
        "listen",
        common::listen(ContextArg::Legacy, dev, handle, listen_comm)
    )
}

/// `connect(dev, handle, sendComm, sendDevComm)` (v7 ... v9).
pub unsafe extern "C" fn connect_v7(
    dev: c_int,
    handle: *mut c_void,
    send_comm: *mut *mut c_void,
    send_dev_comm: *mut *mut NetDeviceHandle,
) -> c_int {
    let config = std::ptr::null();
    entry!(
        "connect",
        common::connect(
            ContextArg::Legacy,
            dev,
            config,
            handle,
            send_comm,
            send_dev_comm
        )
    )
}

/// `connect(dev, config, handle, sendComm, sendDevComm)` (v10): `config->trafficClass`.
pub unsafe extern "C" fn connect_v10(
    dev: c_int,
    config: *mut NetCommConfig,
    handle: *mut c_void,
    send_comm: *mut *mut c_void,
    send_dev_comm: *mut *mut NetDeviceHandle,
) -> c_int {
    entry!(
        "connect",
        common::connect(
            ContextArg::Legacy,
            dev,
            config,
            handle,
            send_comm,
            send_dev_comm
        )
    )
}

/// `isend` without a profiler handle (v7 ... v9; `S` = `int` before v9, `size_t` in v9).
pub unsafe extern "C" fn isend_v7<S: SizeArg>(
    send_comm: *mut c_void,
    data: *mut c_void,
    size: S,
    tag: c_int,
    mhandle: *mut c_void,
    request: *mut *mut c_void,
) -> c_int {
    entry!(
        "isend",
        common::isend(send_comm, data, size, tag, mhandle, null_mut(), request)
    )
}

/// `irecv` without profiler handles (v7 ... v9; `S` = `int` before v9, `size_t` in v9).
pub unsafe extern "C" fn irecv_v7<S: SizeArg>(
    recv_comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut S,
    tags: *mut c_int,
    mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> c_int {
    let arrays = RecvArrays {
        data,
        sizes,
        tags,
        mhandles,
        phandles: null_mut(),
    };
    entry!("irecv", common::irecv(recv_comm, n, arrays, request))
}

// ----- v10+: profiler handles ------------------------------------------------------------------

/// `isend` with a profiler handle (v10 ... v12).
pub unsafe extern "C" fn isend_v10(
    send_comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    tag: c_int,
    mhandle: *mut c_void,
    phandle: *mut c_void,
    request: *mut *mut c_void,
) -> c_int {
    entry!(
        "isend",
        common::isend(send_comm, data, size, tag, mhandle, phandle, request)
    )
}

/// `irecv` with profiler handles (v10 ... v12).
#[allow(clippy::too_many_arguments)] // the C signature
pub unsafe extern "C" fn irecv_v10(
    recv_comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut usize,
    tags: *mut c_int,
    mhandles: *mut *mut c_void,
    phandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> c_int {
    let arrays = RecvArrays {
        data,
        sizes,
        tags,
        mhandles,
        phandles,
    };
    entry!("irecv", common::irecv(recv_comm, n, arrays, request))
}

// ----- v11+: per-communicator contexts ---------------------------------------------------------

/// `init(ctx, commId, config, logger, profiler)` (v11, v12): one context per call.
pub unsafe extern "C" fn init_v11(
    ctx: *mut *mut c_void,
    comm_id: u64,
    config: *mut NetCommConfig,
    logger: Option<LoggerFn>,
    profiler: Option<ProfilerCallback>,
) -> c_int {
    entry!("init", common::init(ctx, comm_id, config, logger, profiler))
}

/// `finalize(ctx)` (v11, v12).
pub unsafe extern "C" fn finalize(ctx: *mut c_void) -> c_int {
    entry!("finalize", common::finalize(ctx))
}

/// `listen(ctx, dev, handle, listenComm)` (v11, v12).
pub unsafe extern "C" fn listen_v11(
    ctx: *mut c_void,
    dev: c_int,
    handle: *mut c_void,
    listen_comm: *mut *mut c_void,
) -> c_int {
    entry!(
        "listen",
        common::listen(ContextArg::Raw(ctx), dev, handle, listen_comm)
    )
}

/// `connect(ctx, dev, handle, sendComm, sendDevComm)` (v11, v12): the traffic class comes from
/// the context's `init` config.
pub unsafe extern "C" fn connect_v11(
    ctx: *mut c_void,
    dev: c_int,
    handle: *mut c_void,
    send_comm: *mut *mut c_void,
    send_dev_comm: *mut *mut NetDeviceHandle,
) -> c_int {
    let (ctx, config) = (ContextArg::Raw(ctx), std::ptr::null());
    entry!(
        "connect",
        common::connect(ctx, dev, config, handle, send_comm, send_dev_comm)
    )
}

/// `setNetAttr(ctx, netAttr)` (v11, v12): kept per context for the comms made with it.
pub unsafe extern "C" fn set_net_attr(ctx: *mut c_void, net_attr: *mut NetAttr) -> c_int {
    entry!(
        "setNetAttr",
        common::set_net_attr(ContextArg::Raw(ctx), net_attr)
    )
}
