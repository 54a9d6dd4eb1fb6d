//! Loopback devices: static facts, memory registration, async events, and the factories for
//! CQs, SRQs and QPs.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::qp::{LoopbackQp, QpState};
use super::queues::{CqState, LoopbackCq, LoopbackSrq, SrqState};
use super::{device_name, fabric_error, world, World};
use crate::fabric::pages::check_depth;
use crate::fabric::{
    Access, AsyncEvent, CompletionQueue, CqSettings, DeviceInfo, Endpoint, FabricError, FabricKind,
    FabricResult, LinkLayer, MemoryKeys, PeerResolution, QpCapabilities, QueuePair, Rail,
    RailDevice, Sge, SharedReceiveQueue,
};

/// Largest CQ a loopback device creates (the ConnectX `max_cqe`).
const MAX_CQE: u32 = (1 << 22) - 1;
/// Largest SRQ a loopback device creates (the ConnectX `max_srq_wr`).
const MAX_SRQ_WR: u32 = (1 << 15) - 1;
/// Largest send queue a loopback QP has (the ConnectX `max_qp_wr`).
const MAX_QP_WR: u32 = 1 << 15;
/// Largest inline payload a loopback QP accepts (inline data is copied into per-slot buffers
/// preallocated at QP creation, so this bounds that memory).
const MAX_INLINE: u32 = 1024;
/// Pending async events kept per device; older ones are what matters (the first failure), so
/// later ones are dropped once the queue is full rather than growing it without bound.
const MAX_EVENTS: usize = 64;

/// One memory registration.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Mr {
    /// First byte.
    addr: u64,
    /// Length in bytes (non-zero).
    len: u64,
    /// Rights granted to remote peers.
    access: Access,
    /// Local key.
    lkey: u32,
    /// Remote key.
    rkey: u32,
}

impl Mr {
    /// Whether `[addr, addr + len)` lies inside the region.
    fn covers(&self, addr: u64, len: u64) -> bool {
        addr >= self.addr
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= self.addr + self.len)
    }
}

/// The mutable state of one emulated NIC.
pub(crate) struct DeviceState {
    /// Memory registrations by lkey (each registration's rkey is its lkey + 1): a lookup per
    /// executed WR must not grow with the thousands of registrations of thousands of comms.
    mrs: std::collections::BTreeMap<u32, Mr>,
    /// Pending async events, oldest first.
    events: VecDeque<AsyncEvent>,
}

impl DeviceState {
    /// A device with no registrations and no events.
    pub(crate) const EMPTY: DeviceState = DeviceState {
        mrs: std::collections::BTreeMap::new(),
        events: VecDeque::new(),
    };

    /// Whether a local SGE lies inside a region registered with its lkey (any access: the
    /// local NIC may always read its own registered memory).
    pub(crate) fn local_ok(&self, sge: &Sge) -> bool {
        self.mrs
            .get(&sge.lkey)
            .is_some_and(|m| m.covers(sge.addr, u64::from(sge.length)))
    }

    /// Whether a remote peer may write `[addr, addr + len)` with `rkey`.
    pub(crate) fn remote_write_ok(&self, addr: u64, len: u64, rkey: u32) -> bool {
        self.by_rkey(rkey)
            .is_some_and(|m| m.access.remote_write && m.covers(addr, len))
    }

    /// Whether `[addr, addr + len)` is inside a registration with `rkey` that allows remote reads.
    pub(crate) fn remote_read_ok(&self, addr: u64, len: u64, rkey: u32) -> bool {
        self.by_rkey(rkey)
            .is_some_and(|m| m.access.remote_read && m.covers(addr, len))
    }

    /// The registration whose rkey is `rkey`.
    fn by_rkey(&self, rkey: u32) -> Option<&Mr> {
        self.mrs
            .get(&rkey.wrapping_sub(1))
            .filter(|m| m.rkey == rkey)
    }

    /// Queues an async event (dropped when `MAX_EVENTS` are already pending).
    pub(crate) fn push_event(&mut self, event: AsyncEvent) {
        if self.events.len() < MAX_EVENTS {
            self.events.push_back(event);
            EVENTS_QUEUED.fetch_add(1, Ordering::Release);
        }
    }
}

/// Events queued on every device, so that a reader with none to take skips the world's lock
/// (the housekeeping thread reads every 10 ms; it must not contend with the data path for it).
static EVENTS_QUEUED: AtomicUsize = AtomicUsize::new(0);

/// An opened loopback device: a handle onto [`DeviceState`] in the world, tagged with the rail
/// it was opened as (the fault knobs act per rail).
pub(crate) struct LoopbackDevice {
    /// Index of the device in the world.
    index: usize,
    /// Rail this handle serves.
    rail: Rail,
    /// Static facts.
    info: DeviceInfo,
}

impl LoopbackDevice {
    /// A handle on device `index` for `rail`.
    /// `speed_mbps` overrides the reported 100 Gb/s when the rail's rate is modelled, so a
    /// policy that reads link speeds sees the configured rates.
    pub(crate) fn new(
        index: usize,
        rail: Rail,
        speed_mbps: Option<u32>,
        pci_path: Option<String>,
    ) -> LoopbackDevice {
        let mut info = device_info(index);
        if let Some(speed) = speed_mbps {
            info.speed_mbps = speed;
        }
        info.pci_path = pci_path;
        LoopbackDevice { index, rail, info }
    }

    /// Reports `limits` (max_qp, max_cq, max_srq, max_srq_wr, max_mr) where set, instead of a
    /// ConnectX-5's; an SRQ deeper than `max_srq_wr` is then refused, as a NIC refuses it.
    pub(crate) fn limit(&mut self, limits: [Option<u32>; 5]) {
        let [qp, cq, srq, srq_wr, mr] = limits;
        self.info.max_mr = mr.unwrap_or(self.info.max_mr);
        self.info.max_qp = qp.unwrap_or(self.info.max_qp);
        self.info.max_cq = cq.unwrap_or(self.info.max_cq);
        self.info.max_srq = srq.unwrap_or(self.info.max_srq);
        self.info.max_srq_wr = srq_wr.unwrap_or(self.info.max_srq_wr).min(MAX_SRQ_WR);
    }

    /// Shorthand for errors about this device.
    fn error(&self, verb: &'static str, errno: i32, detail: impl Into<String>) -> FabricError {
        fabric_error(verb, &self.info.name, None, errno, detail)
    }
}

/// What device `index` reports: 100 Gb/s RoCE with MTU 4096 and a distinct IPv4-mapped GID,
/// and no PCI path (callers must cope with devices that have none, like Soft-RoCE).
pub(crate) fn device_info(index: usize) -> DeviceInfo {
    let gid = device_gid(index);
    let host = gid[15];
    DeviceInfo {
        name: device_name(index).to_string(),
        port: 1,
        speed_mbps: 100_000,
        active_mtu: 5,
        link_layer: LinkLayer::Ethernet,
        address: std::net::Ipv6Addr::from(gid).to_canonical(),
        endpoint: endpoint_of_gid(gid),
        // "MPIBLOOP" followed by the device number: distinct per device, recognisable in logs.
        guid: 0x4d50_4942_4c4f_4f00 | u64::from(host),
        pci_path: None,
        // A ConnectX-5's counts (`ibv_devinfo -v`), unless `MPIB_LOOPBACK_FAULTS` sets lower
        // ones (`max_qp=RAIL:N`, ...) to reach them in a test.
        max_qp: 1 << 17,
        max_cq: 1 << 24,
        max_srq: 1 << 23,
        max_srq_wr: MAX_SRQ_WR,
        max_mr: 1 << 24,
    }
}

/// A loopback rail's endpoint: its device's GID (a wrong one is how the fault tests aim a QP at
/// no device).
pub(crate) fn endpoint_of_gid(gid: [u8; 16]) -> Endpoint {
    Endpoint::new(FabricKind::Loopback, &gid)
}

/// The GID in a loopback endpoint, or why it is not one.
pub(crate) fn gid_of_endpoint(endpoint: &Endpoint) -> Result<[u8; 16], String> {
    let body = endpoint.body(FabricKind::Loopback)?;
    let mut gid = [0u8; 16];
    gid.copy_from_slice(&body[..16]);
    Ok(gid)
}

/// The GID of device `index`: `::ffff:127.0.0.(index + 1)`, so the two rails have different
/// addresses (computed, not stored, so that the data path can compare without allocating).
pub(crate) fn device_gid(index: usize) -> [u8; 16] {
    let host = u8::try_from(index + 1).unwrap_or(u8::MAX);
    let mut gid = [0u8; 16];
    gid[10] = 0xff;
    gid[11] = 0xff;
    gid[12..].copy_from_slice(&[127, 0, 0, host]);
    gid
}

impl RailDevice for LoopbackDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn register(&self, addr: u64, len: usize, access: Access) -> FabricResult<MemoryKeys> {
        let verb = "ibv_reg_mr";
        let len64 = crate::fabric::pages::check_registration(addr, len)
            .map_err(|(errno, detail)| self.error(verb, errno, detail))?;
        let mut world = world();
        let lkey = world.next_key;
        let Some(next) = lkey.checked_add(2) else {
            return Err(self.error(verb, libc::ENOMEM, "memory keys exhausted"));
        };
        world.next_key = next;
        // lkey and rkey differ so that using one for the other fails, as it may on hardware.
        let mr = Mr {
            addr,
            len: len64,
            access,
            lkey,
            rkey: lkey + 1,
        };
        world.devices[self.index].mrs.insert(mr.lkey, mr);
        Ok(MemoryKeys {
            lkey: mr.lkey,
            rkey: mr.rkey,
        })
    }

    fn register_dmabuf(
        &self,
        _offset: u64,
        _len: usize,
        _iova: u64,
        _fd: i32,
        _access: Access,
    ) -> FabricResult<MemoryKeys> {
        Err(self.error(
            "ibv_reg_dmabuf_mr",
            libc::EOPNOTSUPP,
            "loopback devices have no DMA-BUF",
        ))
    }

    fn deregister(&self, keys: MemoryKeys) -> FabricResult<()> {
        let mut world = world();
        let mrs = &mut world.devices[self.index].mrs;
        match mrs.get(&keys.lkey).filter(|m| m.rkey == keys.rkey) {
            Some(_) => {
                mrs.remove(&keys.lkey);
                Ok(())
            }
            None => Err(self.error(
                "ibv_dereg_mr",
                libc::EINVAL,
                format!(
                    "no registration with lkey {:#x} rkey {:#x}",
                    keys.lkey, keys.rkey
                ),
            )),
        }
    }

    fn create_cq(&self, settings: CqSettings) -> FabricResult<Box<dyn CompletionQueue>> {
        let verb = "ibv_create_cq";
        let depth =
            check_depth(settings.depth, MAX_CQE).map_err(|d| self.error(verb, libc::EINVAL, d))?;
        let mut state = CqState::new(self.index, depth)
            .ok_or_else(|| self.error(verb, libc::ENOMEM, "cannot allocate the CQ ring"))?;
        let mut world = world();
        let id = world
            .cqs
            .next_key()
            .ok_or_else(|| self.error(verb, libc::ENOMEM, "CQ identifiers exhausted"))?;
        state.id = id;
        world.cqs.insert(id, state);
        Ok(Box::new(LoopbackCq::new(id, self.index)))
    }

    fn create_srq(&self, depth: u32) -> FabricResult<Box<dyn SharedReceiveQueue>> {
        let verb = "ibv_create_srq";
        let depth = check_depth(depth, self.info.max_srq_wr)
            .map_err(|d| self.error(verb, libc::EINVAL, d))?;
        let mut state = SrqState::new(self.rail, depth)
            .ok_or_else(|| self.error(verb, libc::ENOMEM, "cannot allocate the SRQ ring"))?;
        let mut world = world();
        let id = world
            .srqs
            .next_key()
            .ok_or_else(|| self.error(verb, libc::ENOMEM, "SRQ identifiers exhausted"))?;
        state.id = id;
        world.srqs.insert(id, state);
        Ok(Box::new(LoopbackSrq::new(id, self.index)))
    }

    fn create_qp(
        &self,
        cq: &dyn CompletionQueue,
        srq: Option<&dyn SharedReceiveQueue>,
        caps: QpCapabilities,
    ) -> FabricResult<Box<dyn QueuePair>> {
        let verb = "ibv_create_qp";
        let einval = |detail: String| self.error(verb, libc::EINVAL, detail);
        let cq = cq
            .as_any()
            .downcast_ref::<LoopbackCq>()
            .ok_or_else(|| einval("the CQ was not created by the loopback fabric".to_string()))?;
        let srq = match srq {
            None => None,
            Some(s) => Some(s.as_any().downcast_ref::<LoopbackSrq>().ok_or_else(|| {
                einval("the SRQ was not created by the loopback fabric".to_string())
            })?),
        };
        if cq.device() != self.index || srq.is_some_and(|s| s.device() != self.index) {
            return Err(einval(
                "the CQ and SRQ must belong to the QP's device".to_string(),
            ));
        }
        check_depth(caps.max_send_wr, MAX_QP_WR)
            .map_err(|d| einval(format!("max_send_wr: {d}")))?;
        if caps.max_inline > MAX_INLINE {
            let detail = format!("max_inline {} exceeds {MAX_INLINE}", caps.max_inline);
            return Err(einval(detail));
        }
        let mut world = world();
        create_qp_locked(&mut world, self, cq.id(), srq.map(|s| s.id()), caps)
    }

    fn next_async_event(&self) -> Option<AsyncEvent> {
        if EVENTS_QUEUED.load(Ordering::Acquire) == 0 {
            return None;
        }
        let event = world().devices[self.index].events.pop_front();
        if event.is_some() {
            EVENTS_QUEUED.fetch_sub(1, Ordering::Release);
        }
        event
    }

    fn resolve_peer(&self, peer: &Endpoint) -> FabricResult<Box<dyn PeerResolution>> {
        let peer_gid =
            gid_of_endpoint(peer).map_err(|e| self.error("resolve peer", libc::EPROTO, e))?;
        Ok(Box::new(LoopbackResolution {
            rail: self.rail,
            device: self.index,
            peer_gid,
            polls: 0,
        }))
    }
}

/// A peer address resolving on a loopback rail: ready once the `arp` knob's count of polls
/// (over every resolution of the rail) has run out.
struct LoopbackResolution {
    rail: Rail,
    device: usize,
    peer_gid: [u8; 16],
    polls: u64,
}

impl PeerResolution for LoopbackResolution {
    fn poll(&mut self) -> FabricResult<bool> {
        self.polls += 1;
        let mut world = world();
        let left = &mut world.unresolved[self.rail.index()];
        if *left == 0 {
            return Ok(true);
        }
        *left -= 1;
        Ok(false)
    }

    fn describe(&self) -> String {
        format!(
            "{} ({}): peer GID {} unresolved after {} poll(s) (MPIB_LOOPBACK_FAULTS arp knob)",
            device_name(self.device),
            self.rail,
            std::net::Ipv6Addr::from(self.peer_gid),
            self.polls
        )
    }
}

/// Second half of `create_qp`, under the world lock: allocates the QP number and state.
fn create_qp_locked(
    world: &mut World,
    dev: &LoopbackDevice,
    cq: u64,
    srq: Option<u64>,
    caps: QpCapabilities,
) -> FabricResult<Box<dyn QueuePair>> {
    let verb = "ibv_create_qp";
    // The handles borrowed by the caller keep both queues alive, but check anyway: the world
    // is the source of truth, not the handles.
    if world.cq_index(cq).is_none() || srq.is_some_and(|s| world.srq_index(s).is_none()) {
        return Err(dev.error(verb, libc::EINVAL, "the CQ or SRQ no longer exists"));
    }
    let Some(qpn) = world.qps.next_key() else {
        // QP numbers are 24 bits on the wire: about a million live QPs.
        return Err(dev.error(verb, libc::ENOMEM, "QP numbers exhausted"));
    };
    let created = world.created_qps;
    let state = QpState::new(qpn, created, dev.index, dev.rail, cq, srq, caps)
        .ok_or_else(|| dev.error(verb, libc::ENOMEM, "cannot allocate the send queue"))?;
    world.created_qps += 1;
    world.qps.insert(qpn, state);
    // Room for every live QP in the busy list, taken now so that posting never allocates.
    let spare = world.qps.len().saturating_sub(world.busy.len());
    world.busy.reserve(spare);
    Ok(Box::new(LoopbackQp::new(qpn, dev.index)))
}
