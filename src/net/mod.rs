//! The one internal implementation of the NCCL net interface, with the newest ABI's semantics.
//! `crate::ffi`'s per-version adapters convert arguments and call these functions; nothing here
//! knows about ABI versions or raw C pointers except the opaque handles it hands out.
//!
//! Threading (NCCL's contract, `docs/NCCL_NET_ABI.md` section 2): `init`/`devices`/`properties`
//! on the application thread; `listen`/`connect`/`accept`/memory registration/`close_*` on the
//! proxy service thread; `isend`/`irecv`/`test`/`iflush` on the proxy progress thread. Global state
//! lives in [`setup::plugin`] behind a mutex that the data path never takes.

use std::ffi::{c_char, c_void};
use std::ptr::NonNull;
use std::sync::Arc;

use crate::error::{Error, Result};
use setup::comm::{RECV_MAGIC, SEND_MAGIC};

/// The advanced mode's agent: registering a connection, reading its hint entry.
mod agent;
/// The data path: sends, receives, flushes, requests, registered memory, NIC-shared regions.
mod data;
/// Watching a running plugin: probes, the profiler, device events, the peer, the housekeeper.
mod observe;
/// Bringing connections up: the plugin's rails, listen/connect/accept, the peer's addresses,
/// queue pairs and completion queues.
mod setup;

pub use agent::hints::read_hint_file;

pub use observe::attributes::NetAttributeValues;
pub use setup::plugin::{Context, InitParams, ProfilerCallback};

/// Size of NCCL's opaque listen handle (`NCCL_NET_HANDLE_MAXSIZE`).
pub const HANDLE_SIZE: usize = 128;
/// Grouped receives per `irecv` (`maxRecvs`).
pub const MAX_RECVS: usize = 8;
/// `NCCL_PTR_HOST`.
pub const PTR_HOST: i32 = 0x1;
/// `NCCL_PTR_CUDA`.
pub const PTR_CUDA: i32 = 0x2;
/// `NCCL_PTR_DMABUF`.
pub const PTR_DMABUF: i32 = 0x4;

/// Version-neutral device properties; adapters copy them into their versioned struct.
#[derive(Clone, Copy, Debug)]
pub struct Properties {
    /// Device name (`"<sout>+<sup>"`), NUL-terminated, valid while the plugin is loaded.
    pub name: *const c_char,
    /// PCI path of the SOUT rail, or NULL when it has none.
    pub pci_path: *const c_char,
    /// SOUT GUID.
    pub guid: u64,
    /// `NCCL_PTR_*` bits.
    pub ptr_support: i32,
    /// Registrations are cache-backed (`regIsGlobal`).
    pub reg_is_global: i32,
    /// NCCL must call `iflush` (`forceFlush`).
    pub force_flush: i32,
    /// Sum of the rails' speeds, Mbps.
    pub speed: i32,
    /// SOUT port number.
    pub port: i32,
    /// Latency in microseconds (0 = NCCL default).
    pub latency: f32,
    /// Comms the device can hold (the scarcer NIC's QPs over what one comm takes).
    pub max_comms: i32,
    /// Grouped receive limit.
    pub max_recvs: i32,
    /// `vProps.ndevs`: 1, the device itself (NCCL reads more only for `makeVDevice` devices).
    pub vdev_count: i32,
    /// `vProps.devs`: the first `vdev_count` entries are used.
    pub vdev_devices: [i32; 2],
    /// Largest `isend`/`irecv` NCCL may issue.
    pub max_p2p_bytes: usize,
    /// collNet only.
    pub max_coll_bytes: usize,
    /// `maxMultiRequestSize` (v11+).
    pub max_multi_request_size: i32,
    /// v12 rail id (-1 undefined).
    pub rail_id: i16,
    /// v12 plane id (-1 undefined).
    pub plane_id: i16,
}

pub use data::memory::MemoryHandle;
pub use data::recv::RecvComm;
pub use data::request::Request;
pub use data::send::SendComm;
pub use setup::accept::ListenComm;

/// Either kind of data comm (NCCL's `regMr` takes both through one `void*`).
#[derive(Clone, Copy)]
pub enum CommRef<'a> {
    /// A send comm.
    Send(&'a SendComm),
    /// A receive comm.
    Recv(&'a RecvComm),
}

impl CommRef<'_> {
    /// Identifies the comm behind a pointer NCCL passed to `regMr`/`deregMr`/`getDeviceMr`.
    ///
    /// # Safety
    /// `comm` must be a pointer this plugin returned from `connect` or `accept` and not yet
    /// closed; the comm must outlive `'a`.
    pub unsafe fn from_raw<'a>(comm: NonNull<c_void>) -> Result<CommRef<'a>> {
        // SAFETY: both comm types are `#[repr(C)]` with a `u32` magic first; the caller promises
        // the pointer is one of them, so the first word is readable.
        let magic = unsafe { comm.cast::<u32>().as_ptr().read() };
        match magic {
            SEND_MAGIC => {
                // SAFETY: the magic identifies the concrete type; lifetime per the caller's
                // promise.
                Ok(CommRef::Send(unsafe { comm.cast::<SendComm>().as_ref() }))
            }
            RECV_MAGIC => {
                // SAFETY: as above.
                Ok(CommRef::Recv(unsafe { comm.cast::<RecvComm>().as_ref() }))
            }
            other => Err(Error::invalid_argument(format!(
                "comm {:p} is not an MPIB send or receive comm (first word {other:#x})",
                comm.as_ptr()
            ))),
        }
    }

    fn info(&self) -> &setup::comm::ConnectionInfo {
        match self {
            CommRef::Send(comm) => &comm.info,
            CommRef::Recv(comm) => &comm.info,
        }
    }
}

/// One buffer of a (possibly grouped) receive.
#[derive(Clone, Copy)]
pub struct RecvBuffer<'a> {
    /// Destination address.
    pub addr: u64,
    /// Capacity in bytes (the sender's size is clamped to it).
    pub capacity: usize,
    /// Tag the matching `isend` carries.
    pub tag: i32,
    /// Registration covering `[addr, addr + capacity)`.
    pub memory: Option<&'a MemoryHandle>,
    /// NCCL profiler handle for this buffer (may be NULL).
    pub profiler_handle: *mut c_void,
}

impl RecvBuffer<'_> {
    /// An unused entry, for stack arrays.
    pub const EMPTY: RecvBuffer<'static> = RecvBuffer {
        addr: 0,
        capacity: 0,
        tag: 0,
        memory: None,
        profiler_handle: std::ptr::null_mut(),
    };
}

/// What `test` found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TestOutcome {
    /// The request finished; it is now released.
    pub done: bool,
    /// Sizes received (receive: one per buffer) or sent (send: one).
    pub sizes: [i32; MAX_RECVS],
    /// How many entries of `sizes` are meaningful.
    pub count: usize,
}

/// `init`: idempotent and refcounted; each call returns a context to pass to `finalize`.
pub fn init(params: InitParams) -> Result<Arc<Context>> {
    setup::plugin::init(params)
}

/// `finalize`: releases one `init`; the last one closes the devices.
pub fn finalize(ctx: Arc<Context>) -> Result<()> {
    setup::plugin::finalize(ctx)
}

/// `devices`: always 1 (the fused device).
pub fn device_count() -> Result<i32> {
    setup::plugin::device_count()
}

/// `getProperties`.
pub fn properties(dev: i32) -> Result<Properties> {
    setup::plugin::properties(dev)
}

/// `makeVDevice`: MPIB fuses its rails itself, so NCCL-side fusion is refused.
pub fn make_vdevice(ndevs: i32) -> Result<i32> {
    Err(crate::error::Error::invalid_usage(format!(
        "makeVDevice({ndevs} devices) is not supported: MPIB already fuses each MPIB_HCA_SOUT \
         NIC with its MPIB_HCA_SUP NIC into one device"
    )))
}

/// `setNetAttr` (v11+): what NCCL says about the communicator's next operations, shown in each
/// connection's probes slot and carried by its slow transfers (src/net/observe/attributes.rs).
pub fn set_net_attributes(ctx: &Context, values: &NetAttributeValues) {
    ctx.attributes.set(values);
}

/// `listen`: writes the handle to ship to the peer.
pub fn listen(
    ctx: &Arc<Context>,
    dev: i32,
    handle: &mut [u8; HANDLE_SIZE],
) -> Result<Box<ListenComm>> {
    let device = ctx.plugin.device(dev)?.clone();
    setup::accept::listen(ctx, device, handle)
}

/// `connect`: non-blocking; `Ok(None)` means call again with the same handle.
pub fn connect(
    ctx: &Arc<Context>,
    dev: i32,
    handle: &mut [u8; HANDLE_SIZE],
    traffic_class: i32,
) -> Result<Option<Box<SendComm>>> {
    setup::connect::connect(ctx, dev, handle, traffic_class)
}

/// `accept`: non-blocking; `Ok(None)` means call again.
pub fn accept(listen: &mut ListenComm) -> Result<Option<Box<RecvComm>>> {
    if !listen.is_valid() {
        return Err(Error::invalid_argument(
            "accept: listenComm is not a live MPIB listen comm",
        ));
    }
    listen.accept()
}

/// `regMr`.
pub fn register_memory(
    comm: CommRef<'_>,
    addr: u64,
    size: usize,
    ptr_type: i32,
) -> Result<Box<MemoryHandle>> {
    data::memory::register(comm.info(), addr, size, ptr_type)
}

/// `regMrDmaBuf`: `fd` is duplicated if kept (NCCL closes it on return).
pub fn register_dmabuf(
    comm: CommRef<'_>,
    addr: u64,
    size: usize,
    ptr_type: i32,
    offset: u64,
    fd: i32,
) -> Result<Box<MemoryHandle>> {
    data::memory::register_dmabuf(comm.info(), addr, size, ptr_type, offset, fd)
}

/// `deregMr`.
pub fn deregister_memory(comm: CommRef<'_>, memory: Box<MemoryHandle>) -> Result<()> {
    let _ = comm;
    data::memory::deregister(memory)
}

/// `isend`: `Ok(None)` means "try again later".
pub fn isend(
    comm: &SendComm,
    addr: u64,
    size: usize,
    tag: i32,
    memory: &MemoryHandle,
    profiler_handle: *mut c_void,
) -> Result<Option<NonNull<Request>>> {
    comm.isend(addr, size as u64, tag, memory, profiler_handle as usize)
}

/// `irecv` of `buffers.len()` (1..=8) grouped buffers: `Ok(None)` means "try again later".
pub fn irecv(comm: &RecvComm, buffers: &[RecvBuffer<'_>]) -> Result<Option<NonNull<Request>>> {
    comm.irecv(buffers)
}

/// `iflush`: `Ok(None)` means nothing to wait for.
pub fn iflush(comm: &RecvComm, buffers: &[RecvBuffer<'_>]) -> Result<Option<NonNull<Request>>> {
    // Without MPIB_FORCE_FLUSH this is a no-op: forceFlush = 0, and on PCIe the completion
    // already orders the data for the GPU (docs/ARCHITECTURE.md, 'The verbs backend').
    comm.iflush(buffers)
}

/// `test`.
///
/// # Safety
/// `request` must have been returned by `isend`/`irecv`/`iflush` and not yet reported done.
pub unsafe fn test(request: NonNull<Request>) -> Result<TestOutcome> {
    // SAFETY: the caller passes a pointer this plugin returned and has not seen done; requests
    // live inside their comm, which NCCL closes only after its requests finished.
    let header = unsafe { request.as_ref() };
    if !header.is_live() {
        return Err(Error::invalid_argument(format!(
            "test: request {:p} is not a live MPIB request (already reported done?)",
            request.as_ptr()
        )));
    }
    let (index, owner) = (header.index, header.owner);
    let mut outcome = TestOutcome {
        done: false,
        sizes: [0; MAX_RECVS],
        count: 0,
    };
    match header.owner_kind {
        data::request::Owner::Send => {
            // SAFETY: `owner` is the comm that allocated the request (set in isend), still open.
            let comm = unsafe { &*(owner as *const SendComm) };
            if let Some(size) = comm.test(index)? {
                outcome = TestOutcome {
                    done: true,
                    sizes: [0; MAX_RECVS],
                    count: 1,
                };
                outcome.sizes[0] = size as i32;
            }
        }
        data::request::Owner::Recv => {
            // SAFETY: as above, set in irecv.
            let comm = unsafe { &*(owner as *const RecvComm) };
            if let Some((sizes, count)) = comm.test(index)? {
                outcome = TestOutcome {
                    done: true,
                    sizes: [0; MAX_RECVS],
                    count,
                };
                for (out, size) in outcome.sizes.iter_mut().zip(&sizes[..count]) {
                    *out = *size as i32;
                }
            }
        }
    }
    Ok(outcome)
}

/// `closeSend`: poisons the comm, then drops it.
pub fn close_send(mut comm: Box<SendComm>) -> Result<()> {
    comm.poison();
    drop(comm);
    Ok(())
}

/// `closeRecv`: poisons the comm, then drops it.
pub fn close_recv(mut comm: Box<RecvComm>) -> Result<()> {
    comm.poison();
    drop(comm);
    Ok(())
}

/// `closeListen`: poisons the comm, then drops it.
pub fn close_listen(mut comm: Box<ListenComm>) -> Result<()> {
    comm.poison();
    drop(comm);
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests;
