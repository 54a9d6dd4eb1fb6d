//! One implementation of each entry point, shared by every ABI version.
//!
//! Each function validates and converts the raw arguments (scalars first, then pointers), calls
//! `crate::net`, and writes its outputs last, so an error leaves them untouched. They return
//! `Result<()>`; the per-version adapters in [`super::adapters`] run them inside
//! [`super::boundary::call`]. Version differences are type parameters: `S` is the C type of a
//! size (`int` or `size_t`, see [`SizeArg`]), `P` a properties struct, `N` a `vProps` length.
//!
//! `isend`, `irecv`, `iflush` and `test` are the data path: they never allocate (receive
//! buffers live in a stack array; errors allocate only when they happen).

use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex, PoisonError};

use super::boundary::{
    count_arg, input, input_mut, input_slice, optional_slice, size_arg, size_at, Out, SizeArg,
};
use super::handle;
use super::types::{FromProperties, NetAttr, NetCommConfig, NetDeviceHandle, NetVDeviceProps};
use crate::error::{Error, Result};
use crate::log::{self, LoggerFn};
use crate::net::{
    self, Context, InitParams, ListenComm, MemoryHandle, NetAttributeValues, ProfilerCallback,
    RecvBuffer, RecvComm, SendComm, HANDLE_SIZE, MAX_RECVS,
};

/// `NCCL_NET_TRAFFIC_CLASS_UNDEF`.
const TRAFFIC_CLASS_UNDEF: c_int = -1;

/// The process-wide context of ABI v7 ... v10, which have no context argument: created by the
/// first `init` and kept for the life of the loaded library.
static LEGACY_CONTEXT: Mutex<Option<Arc<Context>>> = Mutex::new(None);

/// Where `listen`/`connect` find their context.
#[derive(Clone, Copy, Debug)]
pub enum ContextArg {
    /// ABI v7 ... v10: the process-wide context from the first `init`.
    Legacy,
    /// ABI v11+: the `void* ctx` NCCL passed (from this plugin's `init`).
    Raw(*mut c_void),
}

impl ContextArg {
    /// The context for one call.
    ///
    /// # Safety
    /// A `Raw` pointer must be NULL or a context from `init` that is not yet finalized.
    unsafe fn resolve(self) -> Result<Arc<Context>> {
        match self {
            ContextArg::Legacy => {
                let slot = LEGACY_CONTEXT
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                slot.clone()
                    .ok_or_else(|| Error::internal("called before init"))
            }
            // SAFETY: forwarded contract.
            ContextArg::Raw(ctx) => unsafe { handle::clone_arc::<Context>(ctx, "ctx") },
        }
    }
}

/// `init` for ABI v7 ... v10: the first call creates the process-wide context; later calls (NCCL
/// makes one per process, but a host may repeat it) keep it.
pub fn init_legacy(logger: Option<LoggerFn>, profiler: Option<ProfilerCallback>) -> Result<()> {
    let mut slot = LEGACY_CONTEXT
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if slot.is_none() {
        let params = InitParams {
            comm_id: 0,
            traffic_class: TRAFFIC_CLASS_UNDEF,
            profiler,
            logger,
        };
        *slot = Some(net::init(params)?);
    }
    Ok(())
}

/// `init` for ABI v11+: one new context per call, written to `*ctx` on success.
///
/// # Safety
/// `ctx` must be NULL or writable; `config` NULL or readable.
pub unsafe fn init(
    ctx: *mut *mut c_void,
    comm_id: u64,
    config: *const NetCommConfig,
    logger: Option<LoggerFn>,
    profiler: Option<ProfilerCallback>,
) -> Result<()> {
    // SAFETY: forwarded contract.
    let ctx = unsafe { Out::required(ctx, "ctx") }?;
    // SAFETY: forwarded contract.
    let traffic_class = unsafe { config.as_ref() }.map_or(TRAFFIC_CLASS_UNDEF, |c| c.traffic_class);
    let context = net::init(InitParams {
        comm_id,
        traffic_class,
        profiler,
        logger,
    })?;
    ctx.write(handle::arc_to_ptr(context));
    Ok(())
}

/// `finalize` (v11+): releases the context NCCL got from `init`.
///
/// # Safety
/// `ctx` must be NULL or a context from `init`, not used again.
pub unsafe fn finalize(ctx: *mut c_void) -> Result<()> {
    // SAFETY: forwarded contract.
    let ctx = unsafe { handle::arc_from_ptr::<Context>(ctx, "ctx") }?;
    net::finalize(ctx)
}

/// `devices`.
///
/// # Safety
/// `ndev` must be NULL or writable.
pub unsafe fn devices(ndev: *mut c_int) -> Result<()> {
    // SAFETY: forwarded contract.
    let ndev = unsafe { Out::required(ndev, "ndev") }?;
    ndev.write(net::device_count()?);
    Ok(())
}

/// `getProperties` for properties struct `P`.
///
/// # Safety
/// `props` must be NULL or writable.
pub unsafe fn get_properties<P: FromProperties>(dev: c_int, props: *mut P) -> Result<()> {
    // SAFETY: forwarded contract.
    let props = unsafe { Out::required(props, "props") }?;
    props.write(P::from_properties(&net::properties(dev)?));
    Ok(())
}

/// `listen`.
///
/// # Safety
/// `handle` must be NULL or a writable 128-byte buffer; `listen_comm` NULL or writable; `ctx`
/// as [`ContextArg::resolve`].
pub unsafe fn listen(
    ctx: ContextArg,
    dev: c_int,
    handle: *mut c_void,
    listen_comm: *mut *mut c_void,
) -> Result<()> {
    // SAFETY: forwarded contract.
    let out = unsafe { Out::required(listen_comm, "listenComm") }?;
    // SAFETY: forwarded contract (NCCL's `ncclNetHandle_t` is `char[128]`).
    let handle = unsafe { input_mut(handle.cast::<[u8; HANDLE_SIZE]>(), "handle") }?;
    // SAFETY: forwarded contract.
    let ctx = unsafe { ctx.resolve() }?;
    out.write(handle::box_to_ptr(net::listen(&ctx, dev, handle)?));
    Ok(())
}

/// `connect`: the traffic class comes from `config` if given (v10), else from the context.
///
/// # Safety
/// As [`listen`]; `config` NULL or readable; `send_dev_comm` NULL or writable.
pub unsafe fn connect(
    ctx: ContextArg,
    dev: c_int,
    config: *const NetCommConfig,
    handle: *mut c_void,
    send_comm: *mut *mut c_void,
    send_dev_comm: *mut *mut NetDeviceHandle,
) -> Result<()> {
    // SAFETY: forwarded contract.
    let out = unsafe { Out::required(send_comm, "sendComm") }?;
    // SAFETY: forwarded contract.
    let dev_out = unsafe { Out::optional(send_dev_comm) };
    // SAFETY: forwarded contract (NCCL's `ncclNetHandle_t` is `char[128]`).
    let handle = unsafe { input_mut(handle.cast::<[u8; HANDLE_SIZE]>(), "handle") }?;
    // SAFETY: forwarded contract.
    let ctx = unsafe { ctx.resolve() }?;
    // SAFETY: forwarded contract.
    let traffic_class = unsafe { config.as_ref() }.map_or(ctx.traffic_class, |c| c.traffic_class);
    let comm = net::connect(&ctx, dev, handle, traffic_class)?;
    out.write(handle::option_box_to_ptr(comm));
    if let Some(dev_out) = dev_out {
        dev_out.write(std::ptr::null_mut());
    }
    Ok(())
}

/// `accept`.
///
/// # Safety
/// `listen_comm` NULL or a live listen comm; `recv_comm` NULL or writable; `recv_dev_comm` NULL
/// or writable.
pub unsafe fn accept(
    listen_comm: *mut c_void,
    recv_comm: *mut *mut c_void,
    recv_dev_comm: *mut *mut NetDeviceHandle,
) -> Result<()> {
    // SAFETY: forwarded contract.
    let out = unsafe { Out::required(recv_comm, "recvComm") }?;
    // SAFETY: forwarded contract.
    let dev_out = unsafe { Out::optional(recv_dev_comm) };
    // SAFETY: forwarded contract; NCCL calls accept on one thread per listen comm.
    let listen = unsafe { handle::try_mut::<ListenComm>(listen_comm, "listenComm") }?;
    out.write(handle::option_box_to_ptr(net::accept(listen)?));
    if let Some(dev_out) = dev_out {
        dev_out.write(std::ptr::null_mut());
    }
    Ok(())
}

/// `regMr` (`S` = `int` in v7, `size_t` from v8).
///
/// # Safety
/// `comm` NULL or a live send/recv comm; `mhandle` NULL or writable.
pub unsafe fn reg_mr<S: SizeArg>(
    comm: *mut c_void,
    data: *mut c_void,
    size: S,
    ptr_type: c_int,
    mhandle: *mut *mut c_void,
) -> Result<()> {
    let size = size_arg(size, "size")?;
    // SAFETY: forwarded contract.
    let out = unsafe { Out::required(mhandle, "mhandle") }?;
    // SAFETY: forwarded contract.
    let comm = unsafe { handle::comm_ref(comm, "comm") }?;
    let memory = net::register_memory(comm, data as usize as u64, size, ptr_type)?;
    out.write(handle::box_to_ptr(memory));
    Ok(())
}

/// `regMrDmaBuf`.
///
/// # Safety
/// As [`reg_mr`].
pub unsafe fn reg_mr_dma_buf(
    comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    ptr_type: c_int,
    offset: u64,
    fd: c_int,
    mhandle: *mut *mut c_void,
) -> Result<()> {
    // SAFETY: forwarded contract.
    let out = unsafe { Out::required(mhandle, "mhandle") }?;
    // SAFETY: forwarded contract.
    let comm = unsafe { handle::comm_ref(comm, "comm") }?;
    let memory = net::register_dmabuf(comm, data as usize as u64, size, ptr_type, offset, fd)?;
    out.write(handle::box_to_ptr(memory));
    Ok(())
}

/// `deregMr`.
///
/// # Safety
/// `comm` NULL or a live send/recv comm; `mhandle` NULL or a registration not used again.
pub unsafe fn dereg_mr(comm: *mut c_void, mhandle: *mut c_void) -> Result<()> {
    // SAFETY: forwarded contract.
    let comm = unsafe { handle::comm_ref(comm, "comm") }?;
    // SAFETY: forwarded contract; ownership is taken only after `comm` was accepted.
    let memory = unsafe { handle::box_from_ptr::<MemoryHandle>(mhandle, "mhandle") }?;
    net::deregister_memory(comm, memory)
}

/// `isend` (`S` = `int` before v9; `phandle` NULL before v10).
///
/// # Safety
/// `send_comm` NULL or a live send comm; `mhandle` NULL or a live registration; `request` NULL
/// or writable (never read).
pub unsafe fn isend<S: SizeArg>(
    send_comm: *mut c_void,
    data: *mut c_void,
    size: S,
    tag: c_int,
    mhandle: *mut c_void,
    phandle: *mut c_void,
    request: *mut *mut c_void,
) -> Result<()> {
    let size = size_arg(size, "size")?;
    // SAFETY: forwarded contract.
    let out = unsafe { Out::required(request, "request") }?;
    // SAFETY: forwarded contract.
    let comm = unsafe { handle::try_ref::<SendComm>(send_comm, "sendComm") }?;
    // SAFETY: forwarded contract.
    let memory = unsafe { handle::try_ref::<MemoryHandle>(mhandle, "mhandle") }?;
    let sent = net::isend(comm, data as usize as u64, size, tag, memory, phandle)?;
    out.write(handle::request_to_ptr(sent));
    Ok(())
}

/// The raw arrays of an `irecv` or `iflush`, `n` entries each.
#[derive(Clone, Copy)]
pub struct RecvArrays<S> {
    /// `void** data`.
    pub data: *const *mut c_void,
    /// `sizes` (capacities).
    pub sizes: *const S,
    /// `int* tags` (NULL for `iflush`, which has none: tags are then 0).
    pub tags: *const c_int,
    /// `void** mhandles`.
    pub mhandles: *const *mut c_void,
    /// `void** phandles` (NULL when absent).
    pub phandles: *const *mut c_void,
}

/// Builds the stack array of receive buffers from NCCL's parallel arrays.
///
/// # Safety
/// Every non-NULL array pointer must hold `count` readable elements; non-NULL memory handles
/// must be live registrations outliving `'a`.
unsafe fn recv_buffers<'a, S: SizeArg>(
    count: usize,
    arrays: RecvArrays<S>,
    tags_required: bool,
) -> Result<[RecvBuffer<'a>; MAX_RECVS]> {
    // SAFETY: forwarded contract.
    let data = unsafe { input_slice(arrays.data, count, "data") }?;
    // SAFETY: forwarded contract.
    let sizes = unsafe { input_slice(arrays.sizes, count, "sizes") }?;
    // SAFETY: forwarded contract.
    let mhandles = unsafe { input_slice(arrays.mhandles, count, "mhandles") }?;
    // SAFETY: forwarded contract.
    let phandles = unsafe { optional_slice(arrays.phandles, count) };
    let tags = match tags_required {
        // SAFETY: forwarded contract.
        true => Some(unsafe { input_slice(arrays.tags, count, "tags") }?),
        false => None,
    };
    let mut buffers = [RecvBuffer::EMPTY; MAX_RECVS];
    for (i, buffer) in buffers.iter_mut().enumerate().take(count) {
        *buffer = RecvBuffer {
            addr: data[i] as usize as u64,
            capacity: size_at(sizes[i], "sizes", i)?,
            tag: tags.map_or(0, |t| t[i]),
            // SAFETY: forwarded contract.
            memory: unsafe { handle::optional_ref::<MemoryHandle>(mhandles[i]) },
            profiler_handle: phandles.map_or(std::ptr::null_mut(), |p| p[i]),
        };
    }
    Ok(buffers)
}

/// `irecv` of `n` (1..=8) grouped buffers (`S` = `int` before v9; `phandles` NULL before v10).
///
/// # Safety
/// `recv_comm` NULL or a live receive comm; the arrays as [`recv_buffers`]; `request` NULL or
/// writable (never read: NCCL may pre-set it to `(void*)1`).
pub unsafe fn irecv<S: SizeArg>(
    recv_comm: *mut c_void,
    n: c_int,
    arrays: RecvArrays<S>,
    request: *mut *mut c_void,
) -> Result<()> {
    let count = count_arg(n, "n", MAX_RECVS)?;
    // SAFETY: forwarded contract.
    let out = unsafe { Out::required(request, "request") }?;
    // SAFETY: forwarded contract.
    let comm = unsafe { handle::try_ref::<RecvComm>(recv_comm, "recvComm") }?;
    // SAFETY: forwarded contract.
    let buffers = unsafe { recv_buffers(count, arrays, true) }?;
    let posted = net::irecv(comm, &buffers[..count])?;
    out.write(handle::request_to_ptr(posted));
    Ok(())
}

/// `iflush` (`int` sizes in every version); `*request` = NULL means nothing to wait for.
///
/// # Safety
/// As [`irecv`].
pub unsafe fn iflush(
    recv_comm: *mut c_void,
    n: c_int,
    arrays: RecvArrays<c_int>,
    request: *mut *mut c_void,
) -> Result<()> {
    let count = count_arg(n, "n", MAX_RECVS)?;
    // SAFETY: forwarded contract.
    let out = unsafe { Out::required(request, "request") }?;
    // SAFETY: forwarded contract.
    let comm = unsafe { handle::try_ref::<RecvComm>(recv_comm, "recvComm") }?;
    // SAFETY: forwarded contract.
    let buffers = unsafe { recv_buffers(count, arrays, false) }?;
    let flush = net::iflush(comm, &buffers[..count])?;
    out.write(handle::request_to_ptr(flush));
    Ok(())
}

/// `test`: writes `*done` and, when done and `sizes` is non-NULL, `sizes[0..count]`.
///
/// # Safety
/// `request` NULL or a pending request; `done` NULL or writable; `sizes` NULL or writable for
/// as many sizes as the request has buffers.
pub unsafe fn test(request: *mut c_void, done: *mut c_int, sizes: *mut c_int) -> Result<()> {
    let request = handle::request_from_ptr(request, "request")?;
    // SAFETY: forwarded contract.
    let done = unsafe { Out::required(done, "done") }?;
    // SAFETY: forwarded contract.
    let sizes = unsafe { Out::optional(sizes) };
    // SAFETY: forwarded contract: `request` came from isend/irecv/iflush and is not done.
    let outcome = unsafe { net::test(request) }?;
    let reported = outcome.sizes.get(..outcome.count).ok_or_else(|| {
        Error::internal(format!(
            "request reported {} sizes (max {MAX_RECVS})",
            outcome.count
        ))
    })?;
    if let (true, Some(sizes)) = (outcome.done, sizes) {
        // SAFETY: NCCL passes an `int[64]` for receives and an `int` for sends (count 1).
        unsafe { sizes.write_slice(reported) };
    }
    done.write(c_int::from(outcome.done));
    Ok(())
}

/// Takes a comm back from NCCL, but only if `is_live` finds it one of this kind: a pointer that
/// is not is refused whole, never freed.
///
/// # Safety
/// `comm` NULL or a readable object of type `T` from [`handle::box_to_ptr`], not used again.
unsafe fn take_live<T: handle::Castable<Ownership = handle::OwnershipBox>>(
    comm: *mut c_void,
    name: &str,
    kind: &str,
    is_live: fn(&T) -> bool,
) -> Result<Box<T>> {
    // SAFETY: forwarded contract (a readable comm of this kind, or NULL).
    let live = unsafe { handle::try_ref::<T>(comm, name) }?;
    if !is_live(live) {
        return Err(Error::invalid_argument(format!(
            "{name} is not a live MPIB {kind}"
        )));
    }
    // SAFETY: forwarded contract; checked above.
    unsafe { handle::box_from_ptr::<T>(comm, name) }
}

/// `closeSend`.
///
/// # Safety
/// `comm` NULL or a live send comm, not used again.
pub unsafe fn close_send(comm: *mut c_void) -> Result<()> {
    // SAFETY: forwarded contract.
    let comm = unsafe { take_live(comm, "sendComm", "send comm", SendComm::is_valid) }?;
    net::close_send(comm)
}

/// `closeRecv`.
///
/// # Safety
/// `comm` NULL or a live receive comm, not used again.
pub unsafe fn close_recv(comm: *mut c_void) -> Result<()> {
    // SAFETY: forwarded contract.
    let comm = unsafe { take_live(comm, "recvComm", "receive comm", RecvComm::is_valid) }?;
    net::close_recv(comm)
}

/// `closeListen`.
///
/// # Safety
/// `comm` NULL or a live listen comm, not used again.
pub unsafe fn close_listen(comm: *mut c_void) -> Result<()> {
    // SAFETY: forwarded contract.
    let comm = unsafe { take_live(comm, "listenComm", "listen comm", ListenComm::is_valid) }?;
    net::close_listen(comm)
}

/// `getDeviceMr`: MPIB is a HOST plugin, so there is no device-side handle (`*dptr` = NULL).
///
/// # Safety
/// `dptr_mhandle` NULL or writable.
pub unsafe fn get_device_mr(dptr_mhandle: *mut *mut c_void) -> Result<()> {
    // SAFETY: forwarded contract.
    unsafe { Out::required(dptr_mhandle, "dptr_mhandle") }?.write(std::ptr::null_mut());
    Ok(())
}

/// `makeVDevice` with an `N`-entry `vProps`.
///
/// # Safety
/// `d` NULL or writable; `props` NULL or readable.
pub unsafe fn make_v_device<const N: usize>(
    d: *mut c_int,
    props: *const NetVDeviceProps<N>,
) -> Result<()> {
    // SAFETY: forwarded contract.
    let out = unsafe { Out::required(d, "d") }?;
    // SAFETY: forwarded contract.
    let props = unsafe { input(props, "props") }?;
    count_arg(props.ndevs, "props->ndevs", N)?;
    out.write(net::make_vdevice(props.ndevs)?);
    Ok(())
}

/// `setNetAttr` (v11+): what NCCL says about the context's next operations, kept for the comms
/// made with it (src/net/observe/attributes.rs).
///
/// # Safety
/// `ctx` as for [`ContextArg::resolve`]; `attr` NULL or readable.
pub unsafe fn set_net_attr(ctx: ContextArg, attr: *const NetAttr) -> Result<()> {
    // SAFETY: forwarded contract.
    let attr = unsafe { attr.as_ref() }
        .ok_or_else(|| Error::invalid_argument("setNetAttr: netAttr is NULL"))?;
    // SAFETY: forwarded contract.
    let ctx = unsafe { ctx.resolve() }?;
    crate::trace!(log::NET, "setNetAttr on comm {:#x}: {attr:?}", ctx.comm_id);
    let values = NetAttributeValues {
        functions: attr.op,
        algorithms: attr.algo,
        protocols: attr.proto,
        send: [
            attr.send_comm_attr.max_concurrent_peers,
            attr.send_comm_attr.max_flows_per_peer,
        ],
        recv: [
            attr.recv_comm_attr.max_concurrent_peers,
            attr.recv_comm_attr.max_flows_per_peer,
        ],
    };
    net::set_net_attributes(&ctx, &values);
    Ok(())
}
