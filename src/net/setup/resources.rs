//! Per-connection fabric resources with ownership-guaranteed teardown: memory registrations,
//! NIC-shared regions, queue pairs and their completion / shared receive queues.
//!
//! Teardown order matters for verbs (QPs before the CQ/SRQ they use, MRs before the memory they
//! cover): it follows from field order and ownership here, and teardown failures are logged, never
//! panicked on (we live inside someone else's process).

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::fabric::{
    Access, CompletionQueue, CqSettings, Endpoint, MemoryKeys, QpCapabilities, QpSettings,
    QueuePair, Rail, RailDevice, RemoteQp,
};
use crate::log;
use crate::net::setup::budget::{Need, NicBudget, Reservation};
use crate::net::setup::receives::{Membership, SharedReceives};
use crate::proto::credits::SendQueueCredits;
use crate::proto::qp_layout::QpLayout;
use crate::proto::wire::RailEndpoint;

use crate::net::data::dma::DmaRegion;

/// The two opened rails, SOUT first.
pub(crate) type Devices = [Arc<dyn RailDevice>; 2];

/// One memory registration on one rail, deregistered on drop.
pub(crate) struct Registration {
    device: Arc<dyn RailDevice>,
    keys: MemoryKeys,
}

impl Registration {
    /// Registers `[addr, addr + len)` on `device`.
    pub(crate) fn new(
        device: &Arc<dyn RailDevice>,
        addr: u64,
        len: usize,
        access: Access,
    ) -> Result<Self> {
        let keys = device.register(addr, len, access)?;
        Ok(Registration {
            device: Arc::clone(device),
            keys,
        })
    }

    /// The keys.
    pub(crate) fn keys(&self) -> MemoryKeys {
        self.keys
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Err(e) = self.device.deregister(self.keys) {
            warn!(log::NET, "teardown: {e}");
        }
    }
}

/// A NIC-shared region registered on both rails.
pub(crate) struct RegisteredRegion<T: Copy> {
    registrations: [Registration; 2],
    region: DmaRegion<T>,
}

impl<T: Copy> RegisteredRegion<T> {
    /// Allocates `len` zeroed elements and registers them on both rails.
    pub(crate) fn new(devices: &Devices, len: usize, access: Access) -> Result<Self> {
        let region = DmaRegion::zeroed(len)?;
        let register = |rail: Rail| {
            Registration::new(
                &devices[rail.index()],
                region.addr(),
                region.byte_len(),
                access,
            )
        };
        let registrations = [register(Rail::ScaleOut)?, register(Rail::ScaleUp)?];
        Ok(RegisteredRegion {
            registrations,
            region,
        })
    }

    /// The memory.
    pub(crate) fn region(&self) -> &DmaRegion<T> {
        &self.region
    }

    /// Keys on `rail`.
    pub(crate) fn keys(&self, rail: Rail) -> MemoryKeys {
        self.registrations[rail.index()].keys()
    }

    /// Remote keys of both rails, as the handshake carries them.
    pub(crate) fn rkeys(&self) -> [u32; 2] {
        [
            self.keys(Rail::ScaleOut).rkey,
            self.keys(Rail::ScaleUp).rkey,
        ]
    }
}

/// Completion queue (and, on the receiver, its place in a shared receive queue) of one rail.
pub(crate) struct RailQueues {
    /// The shared receive queue the connection's QPs on this rail take receives from (receiver
    /// only; src/net/setup/receives.rs).
    pub srq: Option<Membership>,
    /// Completion queue.
    pub cq: Box<dyn CompletionQueue>,
}

/// The QPs of one connection in layout order, with their send-queue credits.
pub(crate) struct QueuePairs {
    /// QPs, contiguous by rail (docs/PROTOCOL.md §2).
    pub qps: Vec<Box<dyn QueuePair>>,
    /// Send-queue credits per QP.
    pub credits: Vec<SendQueueCredits>,
    /// What the connection holds of its NICs' limits, given back with the QPs.
    pub _reservation: Reservation,
}

/// Sizing of one side's queues.
#[derive(Clone, Copy, Debug)]
pub(crate) struct QueueSizing {
    /// Send-queue depth per QP.
    pub send_queue: u32,
    /// When only some QPs (by layout index) ever post sends, those (the two may be the same):
    /// the others get a send queue of one entry.
    pub only_senders: Option<[usize; 2]>,
    /// CQ entries per rail.
    pub cq_depth: u32,
    /// Whether the QPs take receives from the NICs' shared receive queues (the receiver).
    pub receiving: bool,
}

/// Creates a connection's queues a step at a time: one rail's CQ (and SRQ), then that rail's
/// QPs, then the other rail's. Each step is a few verbs that cost tens of milliseconds on
/// emulated rails (docs/RELIABILITY.md); the handshakes take one step per call so that no
/// `connect` or `accept` call adds them all up.
pub(crate) struct QueueBuilder {
    layout: QpLayout,
    sizing: QueueSizing,
    /// Declared before `queues`: a handshake that fails destroys its QPs before it leaves the
    /// shared receive queues (which an IMM could otherwise still reach).
    qps: Vec<Box<dyn QueuePair>>,
    queues: [Option<RailQueues>; 2],
    credits: Vec<SendQueueCredits>,
    reservation: Reservation,
    /// The connection's secret (`ConnectRequest::secret`), given to every QP.
    secret: u64,
}

impl QueueBuilder {
    /// Nothing created yet; what the connection will create is taken from the NICs' budgets
    /// first (src/net/setup/budget.rs), or the connection is refused before anything exists.
    /// `flush`: a receiver under `MPIB_FORCE_FLUSH` also creates a flush QP per rail.
    pub(crate) fn new(
        layout: QpLayout,
        sizing: QueueSizing,
        budgets: &[Arc<NicBudget>; 2],
        flush: bool,
        secret: u64,
    ) -> Result<QueueBuilder> {
        let needs = Need::of(layout, sizing.receiving, flush);
        let reservation = Reservation::take(budgets, needs)?;
        Ok(QueueBuilder {
            reservation,
            secret,
            layout,
            sizing,
            queues: [None, None],
            qps: Vec::with_capacity(layout.total()),
            credits: Vec::with_capacity(layout.total()),
        })
    }

    /// Creates the next rail's CQ (and joins its shared receive queue), or the QPs of the rail
    /// whose QPs come next; `Ok(true)` once everything exists.
    pub(crate) fn step(
        &mut self,
        devices: &Devices,
        receives: &[Arc<SharedReceives>; 2],
    ) -> Result<bool> {
        let index = self.qps.len();
        let Some(rail) = self.layout.rail_of(index) else {
            return Ok(true);
        };
        let device = &devices[rail.index()];
        let Some(rail_queues) = &self.queues[rail.index()] else {
            let cq = device.create_cq(CqSettings {
                depth: self.sizing.cq_depth,
            })?;
            let srq = match self.sizing.receiving {
                false => None,
                true => Some(receives[rail.index()].join()?),
            };
            self.queues[rail.index()] = Some(RailQueues { srq, cq });
            return Ok(false);
        };
        let (qps, credits) = create_rail_queue_pairs(
            device.as_ref(),
            rail_queues,
            self.layout,
            self.sizing,
            rail,
            self.secret,
        )?;
        self.qps.extend(qps);
        self.credits.extend(credits);
        Ok(self.qps.len() == self.layout.total())
    }

    /// The connection's secret the QPs were created with.
    pub(crate) fn secret(&self) -> u64 {
        self.secret
    }

    /// The layout, queues and QPs, once [`QueueBuilder::step`] said everything exists.
    pub(crate) fn finish(self) -> Result<(QpLayout, [Option<RailQueues>; 2], QueuePairs)> {
        if self.qps.len() != self.layout.total() {
            return Err(Error::internal(format!(
                "{} of {} QPs created",
                self.qps.len(),
                self.layout.total()
            )));
        }
        let qps = QueuePairs {
            qps: self.qps,
            credits: self.credits,
            _reservation: self.reservation,
        };
        Ok((self.layout, self.queues, qps))
    }
}

/// One rail's new QPs and their send-queue credits, in layout order.
pub(crate) type RailQueuePairs = (Vec<Box<dyn QueuePair>>, Vec<SendQueueCredits>);

/// Creates `rail`'s QPs of `layout` on `queues` (its CQ, and its shared receive queue on the
/// receiver), sized by `sizing`, with their send-queue credits: at connect, and again when a
/// failed rail comes back (docs/PROTOCOL.md §11).
pub(crate) fn create_rail_queue_pairs(
    device: &dyn RailDevice,
    queues: &RailQueues,
    layout: QpLayout,
    sizing: QueueSizing,
    rail: Rail,
    secret: u64,
) -> Result<RailQueuePairs> {
    let first = layout.first(rail);
    let mut qps = Vec::with_capacity(layout.count(rail));
    let mut credits = Vec::with_capacity(layout.count(rail));
    for index in first..first + layout.count(rail) {
        let send_queue = match sizing.only_senders {
            Some(senders) if !senders.contains(&index) => 1,
            _ => sizing.send_queue,
        };
        let caps = QpCapabilities {
            max_send_wr: send_queue,
            max_inline: 0,
            secret,
        };
        let cq = queues.cq.as_ref();
        let qp = match &queues.srq {
            Some(member) => member.with_queue(|srq| device.create_qp(cq, Some(srq), caps))?,
            None => device.create_qp(cq, None, caps)?,
        };
        qps.push(qp);
        credits.push(SendQueueCredits::new(send_queue));
    }
    Ok((qps, credits))
}

impl QueuePairs {
    /// Puts `qps` (with `credits`) in the place of `rail`'s QPs, whose numbers it returns: the
    /// old ones are destroyed here (in error and quiesced since the rail's failover), and
    /// completions of theirs still in the CQ are recognised by those numbers.
    pub(crate) fn replace_rail(
        &mut self,
        layout: QpLayout,
        rail: Rail,
        qps: Vec<Box<dyn QueuePair>>,
        credits: Vec<SendQueueCredits>,
    ) -> Result<Vec<u32>> {
        let first = layout.first(rail);
        let count = layout.count(rail);
        if qps.len() != count || credits.len() != count {
            return Err(Error::internal(format!(
                "{} new {rail} QPs for {count} places",
                qps.len()
            )));
        }
        let old: Vec<u32> = self.qps[first..first + count]
            .iter()
            .map(|qp| qp.qp_num())
            .collect();
        drop(self.qps.splice(first..first + count, qps));
        drop(self.credits.splice(first..first + count, credits));
        Ok(old)
    }

    /// Connects `rail`'s QPs to the peer's `remote_qp_nums` (in layout order) at `remote`.
    pub(crate) fn connect_rail(
        &mut self,
        layout: QpLayout,
        rail: Rail,
        remote: &RailEndpoint,
        remote_qp_nums: &[u32],
        settings: &QpSettings,
    ) -> Result<()> {
        let first = layout.first(rail);
        if remote_qp_nums.len() != layout.count(rail) {
            return Err(Error::remote(format!(
                "the peer named {} {rail} QPs for {}",
                remote_qp_nums.len(),
                layout.count(rail)
            )));
        }
        for (offset, qp_num) in remote_qp_nums.iter().enumerate() {
            let remote_qp = RemoteQp {
                qp_num: *qp_num,
                endpoint: Endpoint(remote.endpoint),
            };
            self.qps[first + offset]
                .connect(&remote_qp, settings)
                .map_err(|e| {
                    Error::from(e).context(format!("bringing {rail} QP {} back", first + offset))
                })?;
        }
        Ok(())
    }
}

/// Replaced QPs whose numbers are kept: their completions may still sit in the CQ.
const STALE_KEPT: usize = 64;

/// Keeps the rail and numbers of QPs a failback replaced on it (`QueuePairs::replace_rail`),
/// the newest [`STALE_KEPT`]: a completion of theirs still in the CQ is recognised and ignored.
/// QP numbers are per NIC, so the rail is part of the key.
/// `current` are the numbers of the QPs now in place on the rail: a provider may give a new QP
/// a number an old one had, and the new one's completions count.
pub(crate) fn remember_stale(
    stale: &mut Vec<(Rail, u32)>,
    rail: Rail,
    replaced: Vec<u32>,
    current: &[u32],
) {
    stale.retain(|(on, qp_num)| *on != rail || !current.contains(qp_num));
    stale.extend(
        (replaced.into_iter())
            .filter(|qp_num| !current.contains(qp_num))
            .map(|qp_num| (rail, qp_num)),
    );
    if stale.len() > STALE_KEPT {
        stale.drain(..stale.len() - STALE_KEPT);
    }
}

/// What the handshake tells the peer about a local rail.
pub(crate) fn endpoint(device: &dyn RailDevice) -> RailEndpoint {
    let info = device.info();
    let address = match info.address {
        std::net::IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        std::net::IpAddr::V6(v6) => v6,
    };
    RailEndpoint {
        present: true,
        address: address.octets(),
        endpoint: info.endpoint.0,
    }
}

/// Moves every QP to RTS against the peer's QP of the same index (both sides use one layout).
pub(crate) fn connect_queue_pairs(
    qps: &mut QueuePairs,
    layout: QpLayout,
    remote_rails: &[RailEndpoint; 2],
    remote_qp_nums: &[u32],
    settings: &QpSettings,
) -> Result<()> {
    for (index, qp) in qps.qps.iter_mut().enumerate() {
        let rail = layout
            .rail_of(index)
            .ok_or_else(|| Error::internal(format!("QP index {index} outside the layout")))?;
        let remote = &remote_rails[rail.index()];
        if !remote.present {
            return Err(Error::remote(format!(
                "peer reported no {rail} rail but the layout uses it"
            )));
        }
        // The fabric decodes and checks the peer's endpoint (the path MTU is its business).
        let remote_qp = RemoteQp {
            qp_num: remote_qp_nums[index],
            endpoint: Endpoint(remote.endpoint),
        };
        qp.connect(&remote_qp, settings)
            .map_err(|e| Error::from(e).context(format!("bringing up {rail} QP {index}")))?;
    }
    Ok(())
}

/// Transport settings from `MPIB_IB_*` (NCCL's defaults), with the traffic class from
/// `MPIB_IB_TC`, else the communicator's, else 0.
pub(crate) fn qp_settings(settings: &crate::params::Settings, traffic_class: i32) -> QpSettings {
    let communicator = u8::try_from(traffic_class).ok();
    QpSettings {
        timeout: settings.ib_timeout,
        retry_count: settings.ib_retry_count,
        traffic_class: settings.ib_traffic_class.or(communicator).unwrap_or(0),
        service_level: settings.ib_service_level,
        ..QpSettings::default()
    }
}

/// The QP numbers of `qps` per rail, for matching QP-level async events.
pub(crate) fn qp_nums_by_rail(qps: &QueuePairs, layout: QpLayout) -> [Vec<u32>; 2] {
    let mut nums: [Vec<u32>; 2] = [Vec::new(), Vec::new()];
    for (index, qp) in qps.qps.iter().enumerate() {
        if let Some(rail) = layout.rail_of(index) {
            nums[rail.index()].push(qp.qp_num());
        }
    }
    nums
}

/// Data-path state that owns per-rail completion queues.
pub(crate) trait RailCompletions {
    /// The queues of `rail`, when the connection uses it.
    fn rail_queues(&mut self, rail: Rail) -> Option<&mut RailQueues>;
}

/// Drains every rail's CQ into `complete`, batch by batch, through a caller-owned array (no
/// allocation), until a poll returns less than a full batch.
pub(crate) fn drain_completions<D: RailCompletions>(
    data: &mut D,
    mut complete: impl FnMut(&mut D, Rail, &crate::fabric::Completion) -> Result<()>,
) -> Result<()> {
    const BATCH: usize = 16;
    let mut completions = [crate::fabric::Completion::EMPTY; BATCH];
    for rail in Rail::ALL {
        while let Some(queues) = data.rail_queues(rail) {
            let count = queues.cq.poll(&mut completions).map_err(Error::from)?;
            for completion in &completions[..count] {
                complete(data, rail, completion)?;
            }
            if count < BATCH {
                break;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// QP numbers are per NIC: a replaced SUP QP's number says nothing of a SOUT QP with the
    /// same one (on rxe both NICs number from 17: a failback once ignored the survivor's
    /// completions for that).
    #[test]
    fn replaced_queue_pairs_are_known_by_rail_and_number_the_newest_kept() {
        let mut stale = Vec::new();
        remember_stale(&mut stale, Rail::ScaleUp, vec![17, 18], &[19, 20]);
        assert!(stale.contains(&(Rail::ScaleUp, 17)));
        assert!(!stale.contains(&(Rail::ScaleOut, 17)));
        // A new QP that got an old number back is not stale.
        remember_stale(&mut stale, Rail::ScaleUp, vec![19, 20], &[17, 21]);
        assert!(!stale.contains(&(Rail::ScaleUp, 17)) && stale.contains(&(Rail::ScaleUp, 18)));
        let many = (100..100 + STALE_KEPT as u32).collect();
        remember_stale(&mut stale, Rail::ScaleUp, many, &[]);
        assert_eq!(stale.len(), STALE_KEPT);
        assert!(!stale.contains(&(Rail::ScaleUp, 18)), "the oldest go first");
        assert!(stale.contains(&(Rail::ScaleUp, 100 + STALE_KEPT as u32 - 1)));
    }
}
