//! The real flush (`MPIB_FORCE_FLUSH=1`): a 1-byte RDMA_READ of the last received buffer, issued
//! on a self-connected QP of every rail the connection uses, into a host scratch word.
//!
//! Why a read flushes: PCIe orders a read completion behind the writes that preceded it on the
//! same path, so once the NIC has read a byte back from the GPU buffer, every byte the NIC wrote
//! there before is visible to the GPU. Needed where writes can be reordered in front of the GPU
//! (NVLink-C2C / data-direct paths, or relaxed ordering without a strong host bridge): see
//! docs/ARCHITECTURE.md, 'The verbs backend', and net_ib's `ncclIbIflush`.

use crate::error::{Error, Result};
use crate::fabric::{Access, QueuePair, Rail, SendOpcode, Sge, WorkRequest};
use crate::proto::credits::SendQueueCredits;
use crate::proto::qp_layout::QpLayout;
use crate::proto::rail_mask::RailMask;
use crate::proto::wr_id::{WrId, WrKind};

use crate::net::data::memory::MemoryHandle;
use crate::net::setup::resources::{qp_settings, Devices, RailQueues, RegisteredRegion};

/// Outstanding flush reads per rail.
const FLUSH_QUEUE: u32 = 256;

/// Self-connected QPs and the scratch word they read into.
pub(crate) struct Flusher {
    queue_pairs: [Option<(Box<dyn QueuePair>, SendQueueCredits)>; 2],
    scratch: RegisteredRegion<u64>,
}

impl Flusher {
    /// One self-connected QP on each rail of `layout`, completing on that rail's CQ.
    pub(crate) fn create(
        devices: &Devices,
        layout: QpLayout,
        queues: &[Option<RailQueues>; 2],
        settings: &crate::params::Settings,
    ) -> Result<Flusher> {
        let scratch = RegisteredRegion::<u64>::new(devices, 1, Access::LOCAL)?;
        let mut queue_pairs: [Option<(Box<dyn QueuePair>, SendQueueCredits)>; 2] = [None, None];
        for rail in layout.rails().rails() {
            let device = &devices[rail.index()];
            let cq = queues[rail.index()]
                .as_ref()
                .ok_or_else(|| Error::internal(format!("flush: rail {rail} has no CQ")))?;
            let caps = crate::fabric::QpCapabilities {
                max_send_wr: FLUSH_QUEUE,
                max_inline: 0,
                // Connected to itself: no connection of its own to prove, but none a stranger
                // could claim before `connect` either.
                secret: crate::random::unguessable("flush QP secret")?,
            };
            let mut qp = device.create_qp(cq.cq.as_ref(), None, caps)?;
            let own = crate::fabric::RemoteQp {
                qp_num: qp.qp_num(),
                endpoint: device.info().endpoint,
            };
            qp.connect(&own, &qp_settings(settings, -1))
                .map_err(|e| Error::from(e).context(format!("flush QP on {rail}")))?;
            queue_pairs[rail.index()] = Some((qp, SendQueueCredits::new(FLUSH_QUEUE)));
        }
        Ok(Flusher {
            queue_pairs,
            scratch,
        })
    }

    /// Whether `rail`'s flush QP has reads out.
    pub(crate) fn busy(&self, rail: Rail) -> bool {
        self.queue_pairs[rail.index()]
            .as_ref()
            .is_some_and(|(_, credits)| credits.available() < FLUSH_QUEUE)
    }

    /// A new self-connected QP on `rail` in place of the old one (which failed with the rail's
    /// port, if it did): a failed rail came back (docs/PROTOCOL.md §11). Only while no read is
    /// out on the old one ([`Flusher::busy`]): a destroyed QP completes nothing. The old QP's
    /// number and the new one's, if the rail has one.
    pub(crate) fn renew(
        &mut self,
        device: &std::sync::Arc<dyn crate::fabric::RailDevice>,
        rail: Rail,
        queues: &RailQueues,
        settings: &crate::fabric::QpSettings,
    ) -> Result<(Option<u32>, Option<u32>)> {
        let Some((old, _)) = self.queue_pairs[rail.index()].as_ref() else {
            return Ok((None, None));
        };
        let old = old.qp_num();
        let caps = crate::fabric::QpCapabilities {
            max_send_wr: FLUSH_QUEUE,
            max_inline: 0,
            secret: crate::random::unguessable("flush QP secret")?,
        };
        let mut qp = device.create_qp(queues.cq.as_ref(), None, caps)?;
        let own = crate::fabric::RemoteQp {
            qp_num: qp.qp_num(),
            endpoint: device.info().endpoint,
        };
        qp.connect(&own, settings)
            .map_err(|e| Error::from(e).context(format!("flush QP on {rail}")))?;
        let new = qp.qp_num();
        self.queue_pairs[rail.index()] = Some((qp, SendQueueCredits::new(FLUSH_QUEUE)));
        Ok((Some(old), Some(new)))
    }

    /// Reads one byte at `addr` on every rail; returns the rails to wait for (empty: credits
    /// short, nothing posted).
    pub(crate) fn post(
        &mut self,
        addr: u64,
        memory: &MemoryHandle,
        request: u16,
    ) -> Result<RailMask> {
        let rails = self.rails();
        if rails
            .rails()
            .any(|rail| self.credits(rail).available() == 0)
        {
            return Ok(RailMask::NONE);
        }
        for rail in rails.rails() {
            let lkey = self.scratch.keys(rail).lkey;
            let scratch = self.scratch.region().addr();
            let Some((qp, credits)) = self.queue_pairs[rail.index()].as_mut() else {
                continue;
            };
            let post_index = credits.reserve(1).ok_or_else(|| {
                Error::internal(format!(
                    "invariant broken in flush on {rail}: credits were checked before posting"
                ))
            })?;
            let slot = u8::try_from(request).map_err(|_| {
                Error::internal(format!("flush request {request} does not fit a wr_id slot"))
            })?;
            let wr = WorkRequest {
                wr_id: WrId {
                    kind: WrKind::Flush,
                    rail,
                    qp_index: 0,
                    slot,
                    post_index,
                }
                .pack(),
                opcode: SendOpcode::Read,
                sge: Some(Sge {
                    addr: scratch,
                    length: 1,
                    lkey,
                }),
                remote_addr: addr,
                rkey: memory.rkey(rail),
                signaled: true,
                inline: false,
            };
            // SAFETY: the scratch word is owned by this flusher; the source byte lies in a
            // registration NCCL keeps until the flush request is reported done.
            unsafe { qp.post_send(std::slice::from_ref(&wr)) }.map_err(Error::from)?;
        }
        Ok(rails)
    }

    /// A flush read on `rail` completed.
    pub(crate) fn on_completion(&mut self, rail: Rail, post_index: u32) {
        if let Some((_, credits)) = self.queue_pairs[rail.index()].as_mut() {
            credits.retire(post_index);
        }
    }

    fn rails(&self) -> RailMask {
        Rail::ALL
            .into_iter()
            .filter(|rail| self.queue_pairs[rail.index()].is_some())
            .fold(RailMask::NONE, RailMask::with)
    }

    fn credits(&self, rail: Rail) -> SendQueueCredits {
        self.queue_pairs[rail.index()]
            .as_ref()
            .map_or(SendQueueCredits::new(0), |(_, c)| *c)
    }
}
