//! Posting a matched slot: the split, the WR chain per active rail (built by `proto::chain`),
//! send-queue credits, the completion record, and the telemetry of what was posted.

use crate::error::{Error, Result};
use crate::fabric::{Rail, WorkRequest};
use crate::proto::chain::RecordTarget;
use crate::proto::cts::{CompletionRecord, MAX_RECVS};
use crate::proto::policy::{sup_bandwidth, within_bdp};
use crate::proto::post_plan::{self, PostPlan};
use crate::proto::wr_id::{WrId, WrKind};
use mpib_probes::declared::{RAIL_TX_BYTES, RAIL_WORK_REQUESTS};

use super::{PostedSlot, SendComm, SendData};
use crate::net::data::request::now_ns;
use crate::net::observe::profiler;

impl SendComm {
    /// Posts matched slots in fifo order while send-queue credits allow.
    pub(super) fn post_ready(&self, data: &mut SendData) -> Result<()> {
        self.post_failover(data)?;
        if data.slots.next_replay().is_some() {
            // Replays go ahead of new transfers (docs/PROTOCOL.md §10): they wait for credits.
            return Ok(());
        }
        while let Some(slot) = data.slots.next_to_post() {
            if !self.post_slot(data, slot)? {
                break;
            }
        }
        Ok(())
    }

    /// Plans (`proto::post_plan`) and posts the WR chains of one slot; `Ok(false)` when
    /// credits are short.
    fn post_slot(&self, data: &mut SendData, slot: usize) -> Result<bool> {
        let slot_index = u8::try_from(slot)
            .map_err(|_| Error::internal(format!("slot {slot} does not fit an IMM")))?;
        let record = self.record_target(data, slot);
        let info = &self.info;
        let state = data.slots.slot(slot);
        let (seq, buffers) = (state.seq(), state.buffers());
        // The BDP threshold keeps small inter-island transfers on SOUT; when it covers every
        // request of the slot the hint is not even read.
        let small = |r: usize| within_bdp(info.mode, info.class, buffers[r].size, info.bdp_bytes);
        let sup_bw = if (0..buffers.len()).all(small) {
            0
        } else {
            let hint = &mut data.hint;
            sup_bandwidth(info.mode, info.class, || hint.read())
        };
        let mut shares = [0u32; MAX_RECVS];
        for (r, share) in shares.iter_mut().enumerate().take(buffers.len()) {
            *share = if small(r) { 0 } else { sup_bw };
        }
        let mut plan = match self.survivor(data) {
            // After a failover every transfer goes all on the survivor (the hint is overridden).
            Some(survivor) if !data.slots.down().is_empty() => {
                post_plan::plan_on(slot_index, state, survivor, record, false)
            }
            _ => post_plan::plan(slot_index, state, &shares[..buffers.len()], record),
        };
        if !plan.mask.is_subset_of(info.layout.rails()) {
            return Err(Error::internal(format!(
                "{}: split chose rails {:#x} but this connection has QPs on {:#x}",
                info.describe_peer(),
                plan.mask.bits(),
                info.layout.rails().bits()
            )));
        }
        let mut qp_indices = [0usize; 2];
        for rail in plan.mask.rails() {
            qp_indices[rail.index()] = info
                .layout
                .qp_for_request(seq, rail)
                .ok_or_else(|| Error::internal(format!("no {rail} QP for fifo sequence {seq}")))?;
        }
        let short = |rail: Rail| {
            let needed = plan.lengths[rail.index()] as u32;
            data.qps.credits[qp_indices[rail.index()]].available() < needed
        };
        if plan.mask.rails().any(short) {
            return Ok(false);
        }
        if let Some(record) = plan.record {
            data.records.region().write(slot, record);
        }
        for rail in plan.mask.rails() {
            let qp = qp_indices[rail.index()];
            self.post_chain(data, rail, qp, slot, plan.chain_mut(rail))?;
        }
        let now = now_ns();
        data.slots
            .posted(slot, plan.mask, now)
            .map_err(|e| self.slot_error(e))?;
        self.count_posted(data, slot, &plan, &qp_indices, sup_bw, now);
        Ok(true)
    }

    /// Where this slot's completion record goes (general path).
    pub(super) fn record_target(&self, data: &SendData, slot: usize) -> RecordTarget {
        let length = std::mem::size_of::<CompletionRecord>() as u32;
        RecordTarget {
            local_addr: data.records.region().addr_of(slot),
            lkeys: [
                data.records.keys(Rail::ScaleOut).lkey,
                data.records.keys(Rail::ScaleUp).lkey,
            ],
            remote_addr: data.remote_records + (slot as u64) * u64::from(length),
            rkeys: data.remote_records_rkeys,
            length,
        }
    }

    /// Posts one rail's chain with its signalled WR identified; a failure fails the comm.
    pub(super) fn post_chain(
        &self,
        data: &mut SendData,
        rail: Rail,
        qp: usize,
        slot: usize,
        chain: &mut [WorkRequest],
    ) -> Result<()> {
        let length = chain.len();
        let invariant = |what: &str| {
            Error::internal(format!(
                "invariant broken posting slot {slot} on {rail} QP {qp}: {what}"
            ))
        };
        let post_index = data.qps.credits[qp]
            .reserve(u32::try_from(length).map_err(|_| invariant("chain length"))?)
            .ok_or_else(|| invariant("send credits were checked before the chain was built"))?;
        chain[length - 1].wr_id = WrId {
            kind: WrKind::Data,
            rail,
            qp_index: u8::try_from(qp).map_err(|_| invariant("QP index fits a wr_id"))?,
            slot: u8::try_from(slot).map_err(|_| invariant("slot fits a wr_id"))?,
            post_index,
        }
        .pack();
        // SAFETY: every SGE lies in a registration NCCL keeps alive until `test` reports this
        // slot's requests done (checked by `check_covers`), or in `records`, owned by this comm;
        // remote ranges come from the receiver's CTS and handshake.
        let posted = unsafe { data.qps.qps[qp].post_send(chain) };
        posted.map_err(|e| {
            let error = Error::from(e).context(self.info.describe_peer());
            data.fail(&error);
            error
        })
    }

    /// Telemetry of a posted slot.
    fn count_posted(
        &self,
        data: &mut SendData,
        slot: usize,
        plan: &PostPlan,
        qp_indices: &[usize; 2],
        sup_bw: u32,
        now: u64,
    ) {
        let telemetry = data.telemetry.telemetry();
        for rail in plan.mask.rails() {
            let probe = data.telemetry.rail(rail);
            probe.add(RAIL_TX_BYTES, plan.rail_bytes[rail.index()]);
            probe.add(RAIL_WORK_REQUESTS, plan.lengths[rail.index()] as u64);
        }
        telemetry.transfers().record(plan.mask.bits());
        data.telemetry.add_split(plan.rail_bytes);
        data.transfers += 1;
        self.start_profiler_events(data, slot, plan, qp_indices);
        for rail in plan.mask.rails() {
            let clock = &mut data.busy[rail.index()];
            clock.posted(now);
            data.telemetry.set_rail_in_flight(rail, clock.in_flight());
        }
        let mut qp_nums = [0u32; 2];
        for rail in plan.mask.rails() {
            qp_nums[rail.index()] = data.qps.qps[qp_indices[rail.index()]].qp_num();
        }
        let operation = self.info.attributes.word(true);
        data.telemetry.set_operation(operation);
        data.posted[slot] = PostedSlot {
            rail_bytes: plan.rail_bytes,
            sup_bw,
            qp_nums,
            operation,
        };
    }

    /// One profiler QP event per request and active rail, under each request's NCCL step.
    fn start_profiler_events(
        &self,
        data: &mut SendData,
        slot: usize,
        plan: &PostPlan,
        qp_indices: &[usize; 2],
    ) {
        if self.info.profiler.is_none() {
            return;
        }
        let state = *data.slots.slot(slot);
        for buffer in state.buffers() {
            let request = data.pool.get_mut(buffer.request);
            for rail in plan.mask.rails() {
                let qp = qp_indices[rail.index()];
                let event = profiler::QpEvent {
                    rail,
                    wr_id: u64::from(data.qps.credits[qp].posted_index()),
                    opcode: if plan.lengths[rail.index()] > 1 {
                        profiler::OPCODE_RDMA_WRITE
                    } else {
                        profiler::OPCODE_RDMA_WRITE_WITH_IMM
                    },
                    qp_num: data.qps.qps[qp].qp_num(),
                    length: plan.rail_bytes[rail.index()],
                };
                request.profiler_events[rail.index()] =
                    profiler::start(self.info.profiler, request.profiler_handles[0], &event);
            }
        }
    }
}
