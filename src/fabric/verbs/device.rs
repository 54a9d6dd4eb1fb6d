//! Opened devices: the context and protection domain (RAII), the port facts reported as
//! [`DeviceInfo`], and the [`RailDevice`] implementation.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use super::library::{
    self, ibv_alloc_pd, ibv_close_device, ibv_dealloc_pd, ibv_open_device, ibv_query_device,
};
use rdma_sys::{ibv_context, ibv_device, ibv_device_attr, ibv_pd, ibv_port_attr};

use super::attrs::{self, PORT_ACTIVE};
use super::endpoint::PortAddress;
use super::{fabric_error, gid, sys, teardown_failed};
use crate::fabric::{
    Access, AsyncEvent, CompletionQueue, CqSettings, DeviceInfo, Endpoint, FabricError,
    FabricResult, LinkLayer, MemoryKeys, PeerResolution, QpCapabilities, QueuePair, Rail,
    RailDevice, SharedReceiveQueue,
};
use crate::log;

/// What [`VerbsDevice::open`] needs besides the device.
#[derive(Clone, Copy, Debug)]
pub(crate) struct OpenOptions<'a> {
    /// Physical port (1-based).
    pub port: u8,
    /// The rail the device serves (for errors and logs).
    pub rail: Rail,
    /// `MPIB_IB_GID_INDEX`.
    pub gid_index: Option<u8>,
    /// `MPIB_IB_PCI_RELAXED_ORDERING`.
    pub relaxed_ordering: u8,
    /// `MPIB_SYSFS`.
    pub sysfs: &'a str,
}

/// An open device context, closed on drop.
struct Context {
    ctx: *mut ibv_context,
    label: String,
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: `ctx` came from ibv_open_device; every child object is gone (they hold Arcs
        // on the `DeviceInner` that owns this), so it is closed exactly once, last.
        let rc = unsafe { ibv_close_device(self.ctx) };
        if rc != 0 {
            teardown_failed("ibv_close_device", &self.label, rc);
        }
    }
}

/// A protection domain, deallocated on drop, before the context it belongs to.
struct ProtectionDomain {
    pd: *mut ibv_pd,
    /// Dropped after `pd` is deallocated (fields drop after `Drop::drop`).
    context: Context,
}

impl Drop for ProtectionDomain {
    fn drop(&mut self) {
        // SAFETY: `pd` came from ibv_alloc_pd on `context`; no MR or QP uses it any more.
        let rc = unsafe { ibv_dealloc_pd(self.pd) };
        if rc != 0 {
            teardown_failed("ibv_dealloc_pd", &self.context.label, rc);
        }
    }
}

/// One registration in a device's table.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MrEntry {
    /// The `ibv_mr` (as an address, so the table is `Send`).
    pub mr: usize,
    /// Its remote key.
    pub rkey: u32,
}

/// The verbs objects of one opened device; shared (`Arc`) by everything created on it.
pub(crate) struct DeviceInner {
    pd: ProtectionDomain,
    /// Port in use.
    pub port: u8,
    /// `name:port (rail)`, for errors and logs.
    pub label: String,
    /// Live registrations by lkey (control path only, so a mutex is fine).
    mrs: Mutex<HashMap<u32, MrEntry>>,
    /// QPs whose `IBV_EVENT_QP_LAST_WQE_REACHED` was read and not yet taken by their
    /// `QueuePair::quiesced` (a failover waits for it: src/fabric/verbs/qp.rs).
    last_wqe: Mutex<HashSet<u32>>,
}

// SAFETY: libibverbs objects may be used from any thread (every verb is thread-safe); the raw
// pointers are only dereferenced by libibverbs, and the MR table is behind a mutex.
unsafe impl Send for DeviceInner {}
// SAFETY: as above; shared access only calls thread-safe verbs.
unsafe impl Sync for DeviceInner {}

impl DeviceInner {
    /// The device context.
    pub(crate) fn context(&self) -> *mut ibv_context {
        self.pd.context.ctx
    }

    /// The protection domain.
    pub(crate) fn pd(&self) -> *mut ibv_pd {
        self.pd.pd
    }

    /// The registration table (a poisoned lock is recovered: entries are plain values).
    pub(crate) fn mrs(&self) -> MutexGuard<'_, HashMap<u32, MrEntry>> {
        self.mrs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The QPs whose last-WQE-reached event was read (a poisoned lock is recovered: plain
    /// numbers).
    pub(crate) fn last_wqe(&self) -> MutexGuard<'_, HashSet<u32>> {
        self.last_wqe.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An error about this device.
    pub(crate) fn error(
        &self,
        verb: &'static str,
        errno: i32,
        detail: impl Into<String>,
    ) -> FabricError {
        fabric_error(verb, &self.label, None, errno, detail)
    }
}

impl Drop for DeviceInner {
    fn drop(&mut self) {
        let leftover: Vec<MrEntry> = self.mrs().drain().map(|(_, e)| e).collect();
        if !leftover.is_empty() {
            warn!(
                log::NET,
                "teardown: {} registrations still open on {}; deregistering them",
                leftover.len(),
                self.label
            );
        }
        for entry in leftover {
            // SAFETY: the entry came from a successful registration on this PD and was never
            // deregistered (deregistration removes it from the table first).
            let rc = unsafe { super::library::ibv_dereg_mr(entry.mr as *mut rdma_sys::ibv_mr) };
            if rc != 0 {
                teardown_failed("ibv_dereg_mr", &self.label, rc);
            }
        }
    }
}

/// An opened RDMA device and port: the [`RailDevice`] of the verbs backend.
pub struct VerbsDevice {
    pub(crate) inner: Arc<DeviceInner>,
    info: DeviceInfo,
    /// The port's address (what `info.endpoint` encodes).
    pub(crate) address: PortAddress,
    /// Whether data registrations asking for relaxed ordering get it.
    relaxed_ordering: bool,
    /// Result of NCCL's DMA-BUF probe at open.
    dmabuf: bool,
    /// The network interface of the chosen GID (RoCE), whose neighbour table peers resolve in.
    netdev: Option<String>,
}

impl std::fmt::Debug for VerbsDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsDevice")
            .field("label", &self.inner.label)
            .field("info", &self.info)
            .finish()
    }
}

impl VerbsDevice {
    /// Opens `device` (named `name`) on `options.port`: context, port checks, GID, PD.
    ///
    /// # Safety
    /// `device` must come from a device list that is still alive.
    pub(crate) unsafe fn open(
        device: *mut ibv_device,
        name: &str,
        options: OpenOptions<'_>,
    ) -> FabricResult<VerbsDevice> {
        let label = format!("{name}:{} ({})", options.port, options.rail);
        sys::clear_errno();
        // SAFETY: the caller guarantees `device` is live.
        let ctx = unsafe { ibv_open_device(device) };
        if ctx.is_null() {
            return Err(fabric_error(
                "ibv_open_device",
                &label,
                None,
                sys::errno(),
                "cannot open the device",
            ));
        }
        let context = Context {
            ctx,
            label: label.clone(),
        };
        let (info, address) = query_info(&context, name, options)?;
        let relaxed_ordering = relaxed_policy(options.relaxed_ordering, &label)?;
        set_nonblocking(&context)?;
        // SAFETY: `ctx` is live.
        let pd = unsafe { ibv_alloc_pd(ctx) };
        if pd.is_null() {
            return Err(fabric_error(
                "ibv_alloc_pd",
                &label,
                None,
                sys::errno(),
                "cannot allocate a protection domain",
            ));
        }
        let inner = Arc::new(DeviceInner {
            pd: ProtectionDomain { pd, context },
            port: options.port,
            label,
            mrs: Mutex::new(HashMap::new()),
            last_wqe: Mutex::new(HashSet::new()),
        });
        let dmabuf = super::memory::probe_dmabuf(&inner);
        info!(
            log::INIT,
            "verbs: opened {}: {:?} MTU {} speed {} Mbps GID[{}] {} pci {:?}; relaxed ordering {}, DMA-BUF {}",
            inner.label,
            info.link_layer,
            attrs::mtu_bytes(info.active_mtu),
            info.speed_mbps,
            address.gid_index,
            gid::format_gid(&address.gid),
            info.pci_path,
            relaxed_ordering,
            dmabuf
        );
        let netdev = match info.link_layer {
            LinkLayer::Ethernet => {
                gid::read_attr(name, options.port, "ndevs", u32::from(address.gid_index))
            }
            LinkLayer::InfiniBand => None,
        };
        Ok(VerbsDevice {
            inner,
            info,
            address,
            relaxed_ordering,
            dmabuf,
            netdev,
        })
    }

    /// Whether the device can register DMA-BUF memory (NCCL's probe: `ibv_reg_dmabuf_mr` with
    /// fd -1 fails with something other than EOPNOTSUPP / EPROTONOSUPPORT). Decides whether
    /// `NCCL_PTR_DMABUF` may be advertised, together with the GPU side's own support.
    pub fn dmabuf_supported(&self) -> bool {
        self.dmabuf
    }

    /// Whether data registrations that ask for relaxed ordering get it.
    pub fn relaxed_ordering(&self) -> bool {
        self.relaxed_ordering
    }

    /// The access flags and relaxed-ordering decision for a registration.
    pub(crate) fn access_flags(&self, access: Access) -> (u32, bool) {
        super::memory::access_flags(access, self.relaxed_ordering)
    }
}

/// Whether relaxed ordering is used: 0 never, 1 always (`ibv_reg_mr_iova2` required), 2 when
/// `ibv_reg_mr_iova2` exists.
fn relaxed_policy(setting: u8, label: &str) -> FabricResult<bool> {
    let available = sys::optional().reg_mr_iova2.is_some();
    match setting {
        0 => Ok(false),
        1 if !available => Err(fabric_error(
            "ibv_reg_mr_iova2",
            label,
            None,
            libc::EOPNOTSUPP,
            "MPIB_IB_PCI_RELAXED_ORDERING=1 needs ibv_reg_mr_iova2 (IBVERBS_1.8, rdma-core 29+), which this libibverbs lacks",
        )),
        _ => Ok(available),
    }
}

/// Puts the async event fd in non-blocking mode, so `next_async_event` never waits.
fn set_nonblocking(context: &Context) -> FabricResult<()> {
    // SAFETY: `ctx` is live; async_fd is a plain field.
    let fd = unsafe { (*context.ctx).async_fd };
    // SAFETY: fcntl on an fd the context owns; F_GETFL/F_SETFL have no memory effects.
    let rc = unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags < 0 {
            flags
        } else {
            libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK)
        }
    };
    if rc < 0 {
        return Err(fabric_error(
            "fcntl(async_fd, O_NONBLOCK)",
            &context.label,
            None,
            sys::errno(),
            "cannot make the async event fd non-blocking",
        ));
    }
    Ok(())
}

/// Queries the device and port and builds the [`DeviceInfo`] and the port's address.
fn query_info(
    context: &Context,
    name: &str,
    options: OpenOptions<'_>,
) -> FabricResult<(DeviceInfo, PortAddress)> {
    let label = context.label.as_str();
    // SAFETY: all-zero is a valid `ibv_device_attr` (integers and arrays of integers).
    let mut device_attr: ibv_device_attr = unsafe { std::mem::zeroed() };
    // SAFETY: `ctx` is live and `device_attr` a valid out-parameter.
    let rc = unsafe { ibv_query_device(context.ctx, &mut device_attr) };
    if rc != 0 {
        return Err(fabric_error(
            "ibv_query_device",
            label,
            None,
            sys::rc_errno(rc),
            "cannot query the device",
        ));
    }
    if options.port == 0 || options.port > device_attr.phys_port_cnt {
        let detail = format!(
            "the device has {} port(s), not port {}",
            device_attr.phys_port_cnt, options.port
        );
        return Err(fabric_error(
            "ibv_query_port",
            label,
            None,
            libc::EINVAL,
            detail,
        ));
    }
    let port_attr = query_port(context, options.port)?;
    if port_attr.state != PORT_ACTIVE {
        let detail = format!(
            "port {} is {} (state {}), not ACTIVE",
            options.port,
            attrs::port_state_name(port_attr.state),
            port_attr.state
        );
        return Err(fabric_error(
            "ibv_query_port",
            label,
            None,
            libc::ENETDOWN,
            detail,
        ));
    }
    let link_layer = attrs::link_layer(port_attr.link_layer).ok_or_else(|| {
        let detail = format!("unknown link layer {}", port_attr.link_layer);
        fabric_error("ibv_query_port", label, None, libc::EPROTONOSUPPORT, detail)
    })?;
    let (gid_index, gid) = choose_gid(context, name, options, link_layer, &port_attr)?;
    let active_mtu = u8::try_from(port_attr.active_mtu).unwrap_or(0);
    let address = PortAddress {
        lid: port_attr.lid,
        gid,
        gid_index,
        mtu: active_mtu,
        link_layer,
    };
    let info = DeviceInfo {
        name: name.to_string(),
        port: options.port,
        speed_mbps: port_speed(context, options.port, &port_attr),
        active_mtu,
        link_layer,
        address: address.ip(),
        endpoint: address.endpoint(),
        guid: u64::from_be(device_attr.node_guid),
        pci_path: crate::fabric::rdma_pci_path(options.sysfs, name),
        max_qp: u32::try_from(device_attr.max_qp).unwrap_or(0),
        max_cq: u32::try_from(device_attr.max_cq).unwrap_or(0),
        max_srq: u32::try_from(device_attr.max_srq).unwrap_or(0),
        max_srq_wr: u32::try_from(device_attr.max_srq_wr).unwrap_or(0),
        max_mr: u32::try_from(device_attr.max_mr).unwrap_or(0),
    };
    Ok((info, address))
}

/// `ibv_query_port` (the `verbs.h` inline that prefers the extended op).
fn query_port(context: &Context, port: u8) -> FabricResult<ibv_port_attr> {
    // SAFETY: all-zero is a valid `ibv_port_attr` (integers only).
    let mut attr: ibv_port_attr = unsafe { std::mem::zeroed() };
    sys::clear_errno();
    // SAFETY: `ctx` is live; `attr` is a full-size out-parameter.
    let rc = unsafe { library::query_port(context.ctx, port, &mut attr) };
    if rc != 0 {
        let errno = sys::rc_errno(rc);
        return Err(fabric_error(
            "ibv_query_port",
            &context.label,
            None,
            errno,
            format!("cannot query port {port}"),
        ));
    }
    Ok(attr)
}

/// Port speed in Mbps: `ibv_query_port_speed` when libibverbs has it, else width x lane rate.
fn port_speed(context: &Context, port: u8, attr: &ibv_port_attr) -> u32 {
    if let Some(query) = sys::optional().query_port_speed {
        let mut speed: u64 = 0;
        // SAFETY: the function has this prototype (looked up by name); `ctx` is live.
        let rc = unsafe { query(context.ctx, u32::from(port), &mut speed) };
        if rc == 0 && speed > 0 {
            return u32::try_from(speed.saturating_mul(100)).unwrap_or(u32::MAX);
        }
    }
    attrs::speed_mbps(attr.active_width, attr.active_speed)
}

/// The GID index and GID of the port: the override, else index 0 on InfiniBand, else NCCL's
/// RoCE selection.
fn choose_gid(
    context: &Context,
    name: &str,
    options: OpenOptions<'_>,
    link_layer: LinkLayer,
    attr: &ibv_port_attr,
) -> FabricResult<(u8, [u8; 16])> {
    let label = context.label.as_str();
    let table_len = u32::try_from(attr.gid_tbl_len).unwrap_or(0).min(256);
    let index = match (options.gid_index, link_layer) {
        (Some(index), _) => index,
        (None, LinkLayer::InfiniBand) => 0,
        (None, LinkLayer::Ethernet) => {
            // SAFETY: `ctx` is a live context of device `name`.
            let (entries, own) =
                unsafe { gid::read_table(context.ctx, name, options.port, table_len) };
            let index = gid::select(&entries, own.as_deref()).ok_or_else(|| {
                let detail = format!("no usable RoCE GID on port {} ({} populated entries, none configured and not link-local)", options.port, entries.len());
                fabric_error("ibv_query_gid", label, None, libc::EADDRNOTAVAIL, detail)
            })?;
            u8::try_from(index).unwrap_or(0)
        }
    };
    // SAFETY: `ctx` is live.
    let gid = unsafe { gid::query_gid(context.ctx, options.port, u32::from(index)) }.ok_or_else(
        || {
            fabric_error(
                "ibv_query_gid",
                label,
                None,
                sys::errno(),
                format!("cannot read GID index {index}"),
            )
        },
    )?;
    if link_layer == LinkLayer::Ethernet && !gid::is_valid(&gid) {
        let detail = format!(
            "GID index {index} is {} (not configured, or link-local)",
            gid::format_gid(&gid)
        );
        return Err(fabric_error(
            "ibv_query_gid",
            label,
            None,
            libc::EADDRNOTAVAIL,
            detail,
        ));
    }
    Ok((index, gid))
}

impl RailDevice for VerbsDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn gpu_support(&self) -> crate::fabric::GpuSupport {
        crate::fabric::GpuSupport {
            peer_memory: super::gdr_supported(),
            dmabuf: self.dmabuf,
        }
    }

    fn register(&self, addr: u64, len: usize, access: Access) -> FabricResult<MemoryKeys> {
        let (flags, relaxed) = self.access_flags(access);
        self.inner.register(addr, len, flags, relaxed)
    }

    fn register_dmabuf(
        &self,
        offset: u64,
        len: usize,
        iova: u64,
        fd: i32,
        access: Access,
    ) -> FabricResult<MemoryKeys> {
        let (flags, _relaxed_in_flags) = self.access_flags(access);
        self.inner.register_dmabuf(offset, len, iova, fd, flags)
    }

    fn deregister(&self, keys: MemoryKeys) -> FabricResult<()> {
        self.inner.deregister(keys)
    }

    fn create_cq(&self, settings: CqSettings) -> FabricResult<Box<dyn CompletionQueue>> {
        Ok(Box::new(super::queues::VerbsCq::create(
            &self.inner,
            settings.depth,
        )?))
    }

    fn create_srq(&self, depth: u32) -> FabricResult<Box<dyn SharedReceiveQueue>> {
        Ok(Box::new(super::queues::VerbsSrq::create(
            &self.inner,
            depth,
        )?))
    }

    fn create_qp(
        &self,
        cq: &dyn CompletionQueue,
        srq: Option<&dyn SharedReceiveQueue>,
        caps: QpCapabilities,
    ) -> FabricResult<Box<dyn QueuePair>> {
        let qp = super::qp::VerbsQp::create(&self.inner, &self.address, cq, srq, caps)?;
        Ok(Box::new(qp))
    }

    fn next_async_event(&self) -> Option<AsyncEvent> {
        super::events::next_async_event(&self.inner)
    }

    fn resolve_peer(&self, peer: &Endpoint) -> FabricResult<Box<dyn PeerResolution>> {
        let peer = PortAddress::decode(peer).map_err(|detail| {
            fabric_error(
                "resolve peer",
                &self.inner.label,
                None,
                libc::EPROTO,
                detail,
            )
        })?;
        super::neighbour::start(
            &self.inner.label,
            self.info.link_layer,
            &self.address.gid,
            self.netdev.as_deref(),
            &peer.gid,
        )
    }
}
