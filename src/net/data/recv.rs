//! The receive comm's data path (`irecv`, `test` on receive requests): post a CTS into the
//! sender's FIFO once every rail holds a receive of its shared queue for it, and complete requests by mask
//! learning over the IMMs of the active rails (docs/PROTOCOL.md §8).
//!
//! Integer-only, and allocation-free once the comm has had its most requests in flight at once
//! (the request pool grows 32 at a time, src/net/data/request.rs). The only lock is its shared
//! receive queues' (src/net/setup/receives.rs), taken a batch of receives at a time, never per
//! transfer.

use mpib_probes::declared::{
    CTS_POSTED, CTS_SIGNALED, MASK_MISMATCHES, PROTOCOL_ERRORS, RAIL_RECV_COMPLETIONS,
    RAIL_RX_BYTES,
};
use std::cell::UnsafeCell;
use std::ptr::NonNull;

use crate::error::{Error, Result};
use crate::fabric::{
    Completion, CompletionOpcode, CompletionStatus, Rail, SendOpcode, Sge, WorkRequest,
};
use crate::proto::completion::MaskError;
use crate::proto::cts::{self, CompletionRecord, CtsEntry, MAX_RECVS};
use crate::proto::imm::Imm;
use crate::proto::rail_mask::RailMask;
use crate::proto::recv_slots::{
    Completed, ImmOutcome, RecvBlocked, RecvBuffer as CtsBuffer, RecvSlotError, RecvSlots,
};
use crate::proto::signal::CtsSignalPolicy;
use crate::proto::srq::SrqCredits;
use crate::proto::wr_id::{WrId, WrKind};

use crate::net::data::flush::Flusher;
use crate::net::data::request::{now_ns, Owner, Request, RequestPool};
use crate::net::observe::health::{DeviceHealth, HealthWatch};
use crate::net::observe::peer::PeerWatch;
use crate::net::observe::profiler;
use crate::net::observe::telemetry::ConnectionTelemetry;
use crate::net::setup::comm::{ConnectionInfo, RECV_MAGIC};
use crate::net::setup::resources::{
    drain_completions, QueuePairs, RailCompletions, RailQueues, RegisteredRegion,
};
use crate::net::RecvBuffer;

mod failback;
mod failover;
mod holding;

use failback::RecvFailback;
use failover::RecvFailover;

/// Mutable data-path state; touched only by the comm's progress thread.
pub(crate) struct RecvData {
    pub(crate) qps: QueuePairs,
    /// Self-connected flush QPs (`MPIB_FORCE_FLUSH=1`); dropped before the CQs they use.
    pub(crate) flusher: Option<Flusher>,
    pub(crate) queues: [Option<RailQueues>; 2],
    /// Local shadow of the CTS entries, the source of the CTS RDMA write.
    pub(crate) cts_shadow: RegisteredRegion<CtsEntry>,
    /// Completion records the sender's leader rail writes.
    pub(crate) records: RegisteredRegion<CompletionRecord>,
    pub(crate) remote_fifo: u64,
    pub(crate) remote_fifo_rkeys: [u32; 2],
    cts_qp: usize,
    cts_rail: Rail,
    signal: CtsSignalPolicy,
    /// The CTS slots' protocol state and the SRQ accounting (`proto::recv_slots`).
    slots: RecvSlots,
    pool: RequestPool,
    failure: Option<Error>,
    protocol_errors: u64,
    pub(crate) telemetry: ConnectionTelemetry,
    pub(crate) watch: HealthWatch,
    /// The peer's end of the control connection (set once accepted).
    pub(crate) peer: PeerWatch,
    /// A failover under way, and the last notice taken.
    failover: RecvFailover,
    /// Offers to bring a failed rail back (docs/PROTOCOL.md §11).
    failback: RecvFailback,
}

impl RecvData {
    /// State for a freshly accepted comm, holding no receive yet (`srq`: each rail's marks).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        qps: QueuePairs,
        queues: [Option<RailQueues>; 2],
        cts_shadow: RegisteredRegion<CtsEntry>,
        records: RegisteredRegion<CompletionRecord>,
        remote_fifo: (u64, [u32; 2]),
        srq: [SrqCredits; 2],
        cts: (usize, Rail),
        signal: CtsSignalPolicy,
        telemetry: ConnectionTelemetry,
        health: &[std::sync::Arc<DeviceHealth>; 2],
    ) -> RecvData {
        // Only a rail with an SRQ holds receives (and counts them).
        let has_srq = |rail: Rail| {
            queues[rail.index()]
                .as_ref()
                .is_some_and(|q| q.srq.is_some())
        };
        let srq = [
            has_srq(Rail::ScaleOut).then_some(srq[0]),
            has_srq(Rail::ScaleUp).then_some(srq[1]),
        ];
        RecvData {
            qps,
            flusher: None,
            queues,
            cts_shadow,
            records,
            remote_fifo: remote_fifo.0,
            remote_fifo_rkeys: remote_fifo.1,
            cts_qp: cts.0,
            cts_rail: cts.1,
            signal,
            slots: RecvSlots::new(srq),
            pool: RequestPool::new(),
            failure: None,
            protocol_errors: 0,
            watch: HealthWatch::new(health),
            peer: PeerWatch::none(),
            telemetry,
            failover: RecvFailover::default(),
            failback: RecvFailback::default(),
        }
    }
}

/// A connected receive comm.
#[repr(C)]
pub struct RecvComm {
    magic: u32,
    pub(crate) info: ConnectionInfo,
    data: UnsafeCell<RecvData>,
}

// SAFETY: `info` is immutable after accept; `data` is only touched from NCCL's progress thread
// for this comm (NCCL's contract, docs/NCCL_NET_ABI.md §2), never concurrently.
unsafe impl Sync for RecvComm {}
// SAFETY: all fields are owned; the raw pointers inside requests point into this comm.
unsafe impl Send for RecvComm {}

impl RecvComm {
    pub(crate) fn new(info: ConnectionInfo, data: RecvData) -> Box<RecvComm> {
        Box::new(RecvComm {
            magic: RECV_MAGIC,
            info,
            data: UnsafeCell::new(data),
        })
    }

    /// Whether this is a live comm of this kind (the magic word, cleared at close).
    pub(crate) fn is_valid(&self) -> bool {
        self.magic == RECV_MAGIC
    }

    /// Clears the magic, so a pointer to a closed comm that is still readable is refused.
    pub(crate) fn poison(&mut self) {
        self.magic = 0;
    }

    #[allow(clippy::mut_from_ref)]
    fn data(&self) -> &mut RecvData {
        // SAFETY: as for `SendComm::data`: one progress thread, no re-entrance.
        unsafe { &mut *self.data.get() }
    }

    /// `irecv` of 1..=8 grouped buffers.
    pub(crate) fn irecv(&self, buffers: &[RecvBuffer<'_>]) -> Result<Option<NonNull<Request>>> {
        let data = self.data();
        if let Some(failure) = &data.failure {
            return Err(failure.clone());
        }
        check_buffers(buffers)?;
        if !self.ready_for_cts(data)? {
            return Ok(None);
        }
        let count = buffers.len();
        let owner = self as *const RecvComm as *const ();
        let Some(index) = data
            .pool
            .allocate(Owner::Recv, owner, data.slots.fifo_head())
        else {
            return Ok(None);
        };
        data.telemetry
            .set_operation(self.info.attributes.word(false));
        let request = data.pool.get_mut(index);
        request.count = count as u8;
        request.posted_ns = now_ns();
        for (r, buffer) in buffers.iter().enumerate() {
            request.sizes[r] = buffer.capacity as u64;
            request.profiler_handles[r] = buffer.profiler_handle as usize;
        }
        let slot = cts::slot_of(data.slots.fifo_head());
        for (r, buffer) in buffers.iter().enumerate() {
            let memory = buffer
                .memory
                .ok_or_else(|| Error::invalid_argument("irecv: mhandle is NULL"))?;
            let advertised = CtsBuffer {
                addr: buffer.addr,
                size: buffer.capacity as u64,
                rkeys: [memory.rkey(Rail::ScaleOut), memory.rkey(Rail::ScaleUp)],
                tag: buffer.tag as u32,
            };
            let entry = data.slots.cts_entry(count, &advertised);
            data.cts_shadow.region().write(slot * MAX_RECVS + r, entry);
        }
        if let Err(error) = self.post_cts(data, slot, count) {
            data.pool.release(index);
            return Err(error);
        }
        if self.info.profiler.is_some() {
            let event = profiler::QpEvent {
                rail: data.cts_rail,
                wr_id: u64::from(data.qps.credits[data.cts_qp].posted_index()),
                opcode: profiler::OPCODE_RDMA_WRITE,
                qp_num: data.qps.qps[data.cts_qp].qp_num(),
                length: (count * std::mem::size_of::<CtsEntry>()) as u64,
            };
            let request = data.pool.get_mut(index);
            request.profiler_events[0] =
                profiler::start(self.info.profiler, request.profiler_handles[0], &event);
        }
        data.slots
            .posted(index, count as u8)
            .map_err(|e| Error::internal(format!("{}: {e}", self.info.describe_peer())))?;
        Ok(Some(data.pool.pointer(index)))
    }

    /// Whether a CTS can go out now: a slot, a send credit, and a receive of each rail's shared
    /// queue for every IMM that may come. Polls when that frees something; never waits.
    fn ready_for_cts(&self, data: &mut RecvData) -> Result<bool> {
        // Never more receives outstanding than an SRQ holds: each may bring one IMM per rail,
        // and an IMM that finds its SRQ empty stalls the sender (RNR). Completions free slots,
        // and a failover's report goes out from a poll, so poll once; otherwise no request
        // (NCCL calls again), never a wait.
        if matches!(
            data.slots.can_post(),
            Err(RecvBlocked::SrqFull | RecvBlocked::ReportDue)
        ) {
            self.poll(data)?;
            if data.slots.can_post() == Err(RecvBlocked::SrqFull) {
                return Ok(false);
            }
        }
        if data.qps.credits[data.cts_qp].available() == 0 {
            // CTS credits come back with the periodic signalled CTS completion: reap it here too,
            // so a caller that only retries `irecv` still makes progress.
            self.poll(data)?;
        }
        if data.slots.can_post().is_err() || data.qps.credits[data.cts_qp].available() == 0 {
            return Ok(false);
        }
        // Nothing is polled from here to the CTS: an IMM polled after the cover check would
        // take a receive the check counted. After a failover a receive awaiting a replay may
        // still bring one IMM more than one per outstanding receive (docs/PROTOCOL.md §10).
        let in_flight = data.slots.imms_in_flight() + 1;
        data.refill_for(in_flight)?;
        if !data.slots.covers(in_flight) {
            // The shared queue had nothing more to grant beyond this connection's floor, which
            // its outstanding receives use: one of them completing frees it. No request.
            data.count_uncovered(in_flight);
            return Ok(false);
        }
        Ok(true)
    }

    /// One RDMA_WRITE of the slot's `n` entries into the sender's FIFO on the pinned CTS QP.
    fn post_cts(&self, data: &mut RecvData, slot: usize, n: usize) -> Result<()> {
        let rail = data.cts_rail;
        let bytes = (n * std::mem::size_of::<CtsEntry>()) as u32;
        let post_index = data.qps.credits[data.cts_qp]
            .reserve(1)
            .ok_or_else(|| Error::internal("CTS send queue full after a credit check"))?;
        let wr = WorkRequest {
            wr_id: WrId {
                kind: WrKind::Cts,
                rail,
                qp_index: data.cts_qp as u8,
                slot: slot as u8,
                post_index,
            }
            .pack(),
            opcode: SendOpcode::Write,
            sge: Some(Sge {
                addr: data.cts_shadow.region().addr_of(slot * MAX_RECVS),
                length: bytes,
                lkey: data.cts_shadow.keys(rail).lkey,
            }),
            remote_addr: data.remote_fifo
                + (slot * MAX_RECVS * std::mem::size_of::<CtsEntry>()) as u64,
            rkey: data.remote_fifo_rkeys[rail.index()],
            signaled: data.signal.is_signaled(slot as u8),
            inline: false,
        };
        let probe = data.telemetry.rail(rail);
        probe.inc(CTS_POSTED);
        if wr.signaled {
            probe.inc(CTS_SIGNALED);
        }
        // SAFETY: the SGE lies in `cts_shadow`, owned and registered by this comm, and is not
        // rewritten until this slot comes round again 256 receives later, after its completion.
        unsafe { data.qps.qps[data.cts_qp].post_send(std::slice::from_ref(&wr)) }.map_err(|e| {
            let error = Error::from(e).context(self.info.describe_peer());
            data.fail(&error);
            error
        })
    }

    /// `iflush`: with flush QPs, read one byte of the last non-empty buffer on every rail;
    /// `Ok(None)` when there is nothing to wait for.
    pub(crate) fn iflush(&self, buffers: &[RecvBuffer<'_>]) -> Result<Option<NonNull<Request>>> {
        let data = self.data();
        if let Some(failure) = &data.failure {
            return Err(failure.clone());
        }
        let Some(last) = buffers.iter().rev().find(|b| b.capacity > 0) else {
            return Ok(None);
        };
        let Some(flusher) = data.flusher.as_mut() else {
            return Ok(None);
        };
        let memory = last
            .memory
            .ok_or_else(|| Error::invalid_argument("iflush: mhandle is NULL"))?;
        memory.check_covers("iflush", last.addr, 1)?;
        let owner = self as *const RecvComm as *const ();
        let Some(index) = data.pool.allocate(Owner::Recv, owner, 0) else {
            return Ok(None);
        };
        let pending = match flusher.post(last.addr, memory, index) {
            Ok(pending) if !pending.is_empty() => pending,
            other => {
                data.pool.release(index);
                return other.map(|_| None);
            }
        };
        let request = data.pool.get_mut(index);
        request.count = 0;
        request.flush_pending = pending;
        Ok(Some(data.pool.pointer(index)))
    }

    /// `test` on a receive request: the sizes received when done.
    pub(crate) fn test(&self, index: u16) -> Result<Option<([u64; MAX_RECVS], usize)>> {
        let data = self.data();
        if let Some(failure) = &data.failure {
            return Err(failure.clone());
        }
        self.poll(data)?;
        data.refill()?;
        let now = now_ns();
        if let Some((rail, error)) = self.info.check_health(&mut data.watch, now) {
            self.rail_failed(data, rail, error)?;
            self.advance_failover(data)?;
        }
        data.telemetry.telemetry().heartbeat(now);
        let request = data.pool.get(index);
        if !request.done {
            // Data that never comes: is the sender still there?
            match data.peer.check(now, || self.info.describe_peer()) {
                Ok(watch) => self.act_on_watch(data, watch)?,
                Err(error) => {
                    data.fail(&error);
                    return Err(error);
                }
            }
            return Ok(None);
        }
        let outcome = (request.sizes, request.count as usize);
        data.pool.release(index);
        data.peer.progressed(now);
        Ok(Some(outcome))
    }

    /// As if an IMM `imm` (wire order) had consumed a receive of `rail`'s shared queue: what a
    /// peer that sends more than it was given receives for would make happen.
    #[cfg(test)]
    pub(crate) fn receive_imm(&self, rail: Rail, imm: u32) -> Result<()> {
        let completion = Completion {
            opcode: CompletionOpcode::RecvRdmaWithImm,
            imm,
            ..Completion::EMPTY
        };
        self.on_imm(self.data(), rail, &completion)
    }

    /// The rails that failed over (tests).
    #[cfg(test)]
    pub(crate) fn rails_down(&self) -> RailMask {
        let data = self.data();
        data.slots.down().union(data.failback.unconfirmed)
    }

    /// The QPs the connection still has (for tests).
    #[cfg(test)]
    pub(crate) fn queue_pairs(&self) -> usize {
        self.data().qps.qps.len()
    }

    /// Drains both rails' CQs, then moves a failover on.
    fn poll(&self, data: &mut RecvData) -> Result<()> {
        drain_completions(data, |data, rail, completion| {
            self.complete(data, rail, completion)
        })?;
        self.advance_failover(data)?;
        self.advance_failback(data)
    }

    fn complete(&self, data: &mut RecvData, rail: Rail, completion: &Completion) -> Result<()> {
        let stale = &data.failback.stale;
        if !stale.is_empty() && stale.contains(&(rail, completion.qp_num)) {
            // A QP a failback replaced: quiesced and drained at its failover, nothing it says
            // matters now.
            return Ok(());
        }
        if completion.status != CompletionStatus::Success {
            return self.failed_completion(data, rail, completion);
        }
        match completion.opcode {
            CompletionOpcode::RecvRdmaWithImm => self.on_imm(data, rail, completion),
            CompletionOpcode::RdmaWrite => {
                let wr = WrId::unpack(completion.wr_id)
                    .map_err(|e| Error::internal(format!("CTS completion with {e}")))?;
                if let Some(credits) = data.qps.credits.get_mut(wr.qp_index as usize) {
                    credits.retire(wr.post_index);
                }
                if wr.kind == WrKind::Failover {
                    data.failover.probe_done(wr);
                }
                Ok(())
            }
            CompletionOpcode::RdmaRead => {
                let wr = WrId::unpack(completion.wr_id)
                    .map_err(|e| Error::internal(format!("flush completion with {e}")))?;
                self.flush_done(data, rail, wr)
            }
        }
    }

    /// The flush read `wr` on `rail` is over: its request is done once every rail's is.
    fn flush_done(&self, data: &mut RecvData, rail: Rail, wr: WrId) -> Result<()> {
        let flusher = data
            .flusher
            .as_mut()
            .ok_or_else(|| Error::internal("RDMA_READ completion on a comm without flush QPs"))?;
        flusher.on_completion(rail, wr.post_index);
        let request = data.pool.get_mut(u16::from(wr.slot));
        request.flush_pending = RailMask(request.flush_pending.bits() & !RailMask::of(rail).bits());
        request.done = request.flush_pending.is_empty();
        Ok(())
    }

    /// One IMM: the slot state machine consumes an SRQ credit, finds the slot's request and
    /// learns or checks the mask.
    fn on_imm(&self, data: &mut RecvData, rail: Rail, completion: &Completion) -> Result<()> {
        if data.failback.unconfirmed.contains(rail) {
            self.rail_confirmed(data, rail);
        }
        let probe = data.telemetry.rail(rail);
        probe.inc(RAIL_RECV_COMPLETIONS);
        let imm = Imm::from_wire(completion.imm);
        let allowed = self.info.layout.rails();
        let outcome = match data.slots.on_imm(rail, imm, allowed) {
            Ok(outcome) => outcome,
            Err(e) => {
                let unheld = match e {
                    RecvSlotError::SrqUnderflow(rail) => Some(rail),
                    _ => None,
                };
                data.stop_misbehaving_peer(unheld);
                let mask_error = match &e {
                    RecvSlotError::Mask(_, mask_error) => Some(*mask_error),
                    _ => None,
                };
                return self.protocol_error(data, rail, mask_error, e.to_string());
            }
        };
        if imm.size_bytes().is_some() {
            // Fast path: the IMM's own write carried this rail's bytes.
            probe.add(RAIL_RX_BYTES, u64::from(completion.byte_len));
            data.telemetry
                .add_rail_bytes(rail, u64::from(completion.byte_len));
        }
        if let ImmOutcome::Complete(completed) = outcome {
            self.finish(data, completed);
        }
        Ok(())
    }

    /// All active rails delivered: fix the sizes and report the request done.
    fn finish(&self, data: &mut RecvData, completed: Completed) {
        let request = data.pool.get_mut(completed.request);
        let count = usize::from(completed.count);
        match (count, completed.imm_size) {
            (1, Some(bytes)) => request.sizes[0] = bytes.min(request.sizes[0]),
            _ => {
                // The leader rail's IMM has been seen, so its record write landed before it.
                let record = data.records.region().read(completed.slot);
                for r in 0..count {
                    request.sizes[r] = u64::from(record.sizes[r]).min(request.sizes[r]);
                }
                for rail in Rail::ALL {
                    data.telemetry
                        .rail(rail)
                        .add(RAIL_RX_BYTES, record.rail_bytes[rail.index()]);
                }
                data.telemetry.add_split(record.rail_bytes);
            }
        }
        let request = data.pool.get_mut(completed.request);
        request.done = true;
        profiler::stop(
            self.info.profiler,
            std::mem::take(&mut request.profiler_events[0]),
        );
    }

    /// Counts a protocol violation (mask mismatches separately) and fails the comm with the full
    /// context.
    fn protocol_error(
        &self,
        data: &mut RecvData,
        rail: Rail,
        mask_error: Option<MaskError>,
        what: String,
    ) -> Result<()> {
        let probe = data.telemetry.rail(rail);
        match mask_error {
            Some(MaskError::Mismatch { .. }) => probe.inc(MASK_MISMATCHES),
            _ => probe.inc(PROTOCOL_ERRORS),
        }
        data.protocol_errors += 1;
        let error = Error::internal(format!(
            "{}: protocol error on the {rail} rail (#{}): {what}",
            self.info.describe_peer(),
            data.protocol_errors
        ));
        data.fail(&error);
        Err(error)
    }
}

/// `irecv`'s buffers: 1..=8, each inside its registration.
fn check_buffers(buffers: &[RecvBuffer<'_>]) -> Result<()> {
    if buffers.is_empty() || buffers.len() > MAX_RECVS {
        return Err(Error::invalid_argument(format!(
            "irecv: n = {} (must be 1..=8)",
            buffers.len()
        )));
    }
    for buffer in buffers {
        let memory = buffer
            .memory
            .ok_or_else(|| Error::invalid_argument("irecv: mhandle is NULL"))?;
        memory.check_covers("irecv", buffer.addr, buffer.capacity as u64)?;
    }
    Ok(())
}

impl RecvData {
    /// Fails the comm with `error` (sticky: every later call returns it) and tells the peer why,
    /// so that its pending requests fail with this text rather than at a timeout.
    #[cold]
    fn fail(&mut self, error: &Error) {
        self.peer.notify_failure(error);
        self.failure = Some(error.clone());
        if self.peer.probing() {
            // The control connection that would carry the notice is gone: the peer watches
            // this end with probes on our QPs, which must stop answering (docs/PROTOCOL.md §10).
            for qp in &mut self.qps.qps {
                let _ = qp.fail();
            }
        }
    }
}

impl RailCompletions for RecvData {
    fn rail_queues(&mut self, rail: Rail) -> Option<&mut RailQueues> {
        self.queues[rail.index()].as_mut()
    }
}
