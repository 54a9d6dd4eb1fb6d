//! Posting a matched slot: the split, the WR chain per active rail (built by `proto::chain`),
//! send-queue credits, the completion record, and the telemetry of what was posted.

use crate::error::{Error, Result};
use crate::fabric::{Rail, WorkRequest};
use crate::proto::chain::{self, MatchedBuffer, RecordTarget, Signal, EMPTY_WR, MAX_CHAIN};
use crate::proto::cts::{slot_of, CompletionRecord, CtsEntry, MAX_RECVS};
use crate::proto::imm::Imm;
use crate::proto::policy::{sup_bandwidth, within_bdp};
use crate::proto::rail_mask::RailMask;
use crate::proto::split::{slot_mask, RailSplit};
use crate::proto::wr_id::{WrId, WrKind};
use mpib_probes::declared::{RAIL_TX_BYTES, RAIL_WORK_REQUESTS};

use super::super::profiler;
use super::super::request::now_ns;
use super::{Phase, SendComm, SendData};

/// An unused buffer entry, for stack arrays.
const EMPTY_BUFFER: MatchedBuffer = MatchedBuffer {
    entry: EMPTY_ENTRY,
    addr: 0,
    lkeys: [0; 2],
    split: RailSplit { size: 0, sup: 0 },
};

const EMPTY_ENTRY: CtsEntry = CtsEntry {
    addr: 0,
    size: 0,
    rkeys: [0; 2],
    nreqs: 0,
    tag: 0,
    idx: 0,
    padding: [0; 24],
};

impl SendComm {
    /// Posts matched slots in fifo order while send-queue credits allow.
    pub(super) fn post_ready(&self, data: &mut SendData) -> Result<()> {
        while data.post_head < data.fifo_head {
            let slot = slot_of(data.post_head);
            if data.slots[slot].phase != Phase::Posting || !self.post_slot(data, slot)? {
                break;
            }
            data.post_head += 1;
        }
        Ok(())
    }

    /// Builds and posts the WR chains of one slot; `Ok(false)` when credits are short.
    fn post_slot(&self, data: &mut SendData, slot: usize) -> Result<bool> {
        let state = data.slots[slot];
        let nreqs = state.nreqs as usize;
        let info = &self.info;
        let size = |r: usize| data.pool.get(state.requests[r]).sizes[0];
        // The BDP threshold keeps small inter-island transfers on SOUT; when it covers every
        // request of the slot the hint is not even read.
        let small = |r: usize| within_bdp(info.mode, info.class, size(r), info.bdp_bytes);
        let sup_bw = if (0..nreqs).all(small) {
            0
        } else {
            let hint = &mut data.hint;
            sup_bandwidth(info.mode, info.class, || hint.read())
        };
        let mut buffers = [EMPTY_BUFFER; MAX_RECVS];
        for (r, buffer) in buffers.iter_mut().enumerate().take(nreqs) {
            let share = if small(r) { 0 } else { sup_bw };
            *buffer = MatchedBuffer {
                entry: state.entries[r],
                addr: state.addrs[r],
                lkeys: state.lkeys[r],
                split: RailSplit::new(share, size(r)),
            };
        }
        let buffers = &buffers[..nreqs];
        let mut splits = [RailSplit::default(); MAX_RECVS];
        for (split, buffer) in splits.iter_mut().zip(buffers) {
            *split = buffer.split;
        }
        let mask = slot_mask(&splits[..nreqs]);
        if !mask.is_subset_of(info.layout.rails()) {
            return Err(Error::internal(format!(
                "{}: split chose rails {:#x} but this connection has QPs on {:#x}",
                info.describe_peer(),
                mask.bits(),
                info.layout.rails().bits()
            )));
        }
        let signal = match (nreqs, Imm::exact_size_q(splits[0].size)) {
            (1, Some(size_q)) => Signal::ExactSize(size_q),
            _ => Signal::Record(self.record_target(data, slot)),
        };
        let mut chains = [[EMPTY_WR; MAX_CHAIN]; 2];
        let mut lengths = [0usize; 2];
        let mut qp_indices = [0usize; 2];
        for rail in mask.rails() {
            let qp = info.layout.qp_for_request(state.seq, rail).ok_or_else(|| {
                Error::internal(format!("no {rail} QP for fifo sequence {}", state.seq))
            })?;
            qp_indices[rail.index()] = qp;
            lengths[rail.index()] = chain::build(
                slot as u8,
                mask,
                buffers,
                signal,
                rail,
                &mut chains[rail.index()],
            );
        }
        let short = |rail: Rail| {
            data.qps.credits[qp_indices[rail.index()]].available() < lengths[rail.index()] as u32
        };
        if mask.rails().any(short) {
            return Ok(false);
        }
        let mut rail_bytes = [0u64; 2];
        for rail in Rail::ALL {
            rail_bytes[rail.index()] = splits[..nreqs].iter().map(|s| s.length(rail)).sum();
        }
        if let Signal::Record(_) = signal {
            let mut record = CompletionRecord {
                rail_bytes,
                ..CompletionRecord::default()
            };
            for (size, split) in record.sizes.iter_mut().zip(&splits[..nreqs]) {
                *size = split.size as u32;
            }
            data.records.region().write(slot, record);
        }
        for rail in mask.rails() {
            let (qp, length) = (qp_indices[rail.index()], lengths[rail.index()]);
            self.post_chain(data, rail, qp, slot, &mut chains[rail.index()][..length])?;
        }
        self.count_posted(data, slot, mask, &qp_indices, &lengths, rail_bytes, sup_bw);
        Ok(true)
    }

    /// Where this slot's completion record goes (general path).
    fn record_target(&self, data: &SendData, slot: usize) -> RecordTarget {
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
    fn post_chain(
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
            data.failure = Some(error.clone());
            error
        })
    }

    /// Telemetry and slot state for a posted slot.
    #[allow(clippy::too_many_arguments)]
    fn count_posted(
        &self,
        data: &mut SendData,
        slot: usize,
        mask: RailMask,
        qp_indices: &[usize; 2],
        lengths: &[usize; 2],
        rail_bytes: [u64; 2],
        sup_bw: u32,
    ) {
        let telemetry = data.telemetry.telemetry();
        for rail in mask.rails() {
            let probe = telemetry.rail(rail);
            probe.add(RAIL_TX_BYTES, rail_bytes[rail.index()]);
            probe.add(RAIL_WORK_REQUESTS, lengths[rail.index()] as u64);
        }
        telemetry.transfers().record(mask.bits());
        data.telemetry.add_split(rail_bytes);
        data.transfers += 1;
        self.start_profiler_events(data, slot, mask, qp_indices, lengths, &rail_bytes);
        let now = now_ns();
        for rail in mask.rails() {
            let clock = &mut data.busy[rail.index()];
            clock.posted(now);
            data.telemetry.set_rail_in_flight(rail, clock.in_flight());
        }
        let state = &mut data.slots[slot];
        state.pending = mask;
        state.phase = Phase::InFlight;
        state.post_ns = now;
        state.done_ns = [0; 2];
        state.rail_bytes = rail_bytes;
        state.sup_bw = sup_bw;
        for rail in mask.rails() {
            state.qp_nums[rail.index()] = data.qps.qps[qp_indices[rail.index()]].qp_num();
        }
    }

    /// One profiler QP event per request and active rail, under each request's NCCL step.
    fn start_profiler_events(
        &self,
        data: &mut SendData,
        slot: usize,
        mask: RailMask,
        qp_indices: &[usize; 2],
        lengths: &[usize; 2],
        rail_bytes: &[u64; 2],
    ) {
        if self.info.profiler.is_none() {
            return;
        }
        let state = &data.slots[slot];
        for index in &state.requests[..state.nreqs as usize] {
            let request = data.pool.get_mut(*index);
            for rail in mask.rails() {
                let qp = qp_indices[rail.index()];
                let event = profiler::QpEvent {
                    rail,
                    wr_id: u64::from(data.qps.credits[qp].posted_index()),
                    opcode: if lengths[rail.index()] > 1 {
                        profiler::OPCODE_RDMA_WRITE
                    } else {
                        profiler::OPCODE_RDMA_WRITE_WITH_IMM
                    },
                    qp_num: data.qps.qps[qp].qp_num(),
                    length: rail_bytes[rail.index()],
                };
                request.profiler_events[rail.index()] =
                    profiler::start(self.info.profiler, request.profiler_handles[0], &event);
            }
        }
    }
}
