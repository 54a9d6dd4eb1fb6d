//! The send comm's data path (`isend`, `test` on send requests): wait for the receiver's CTS,
//! match tags, split each transfer across the rails, post one WR chain per active rail, and
//! complete requests from the leader-independent per-rail signalled completions.
//!
//! Lock-free and integer-only, and allocation-free once the comm has had its most requests in
//! flight at once (the request pool grows 32 at a time, src/net/data/request.rs).

use mpib_probes::declared::RAIL_SEND_COMPLETIONS;
use std::cell::UnsafeCell;
use std::ptr::NonNull;

use crate::error::{Error, Result};
use crate::fabric::{Completion, CompletionOpcode, CompletionStatus, Rail};
use crate::proto::cts::{slot_of, CompletionRecord, CtsEntry, FIFO_SLOTS, MAX_RECVS};
use crate::proto::failback::WRITE_RESTORE_PROBE;
use crate::proto::send_slots::{Head, SendBuffer, SendProgress, SendSlotError, SendSlots};
use crate::proto::wr_id::{WrId, WrKind};

mod busy;
mod failback;
mod failover;
mod post;

use busy::BusyClock;
use failback::SendFailback;
use failover::SendFailover;

use crate::net::agent::hints::HintReader;
use crate::net::data::memory::MemoryHandle;
use crate::net::data::request::{now_ns, Owner, Request, RequestPool};
use crate::net::observe::health::{DeviceHealth, HealthWatch};
use crate::net::observe::peer::PeerWatch;
use crate::net::observe::profiler;
use crate::net::observe::telemetry::ConnectionTelemetry;
use crate::net::setup::comm::{ConnectionInfo, SEND_MAGIC};
use crate::net::setup::resources::{
    drain_completions, QueuePairs, RailCompletions, RailQueues, RegisteredRegion,
};

/// Largest single transfer (`maxP2pBytes`); completion records carry sizes as u32.
pub(crate) const MAX_TRANSFER: u64 = 1 << 30;

/// What the engine keeps of a posted slot for its telemetry (the slot's protocol state is in
/// [`SendSlots`]).
#[derive(Clone, Copy, Default)]
struct PostedSlot {
    rail_bytes: [u64; 2],
    sup_bw: u32,
    qp_nums: [u32; 2],
    /// What NCCL said of the operation it serves, when posted (probes word).
    operation: u64,
}

/// Mutable data-path state; touched only by the comm's progress thread.
pub(crate) struct SendData {
    pub(crate) qps: QueuePairs,
    pub(crate) queues: [Option<RailQueues>; 2],
    /// The CTS FIFO `[256][8]` the receiver RDMA-writes into.
    pub(crate) fifo: RegisteredRegion<CtsEntry>,
    /// Local shadow of the completion records the leader rail writes to the receiver.
    pub(crate) records: RegisteredRegion<CompletionRecord>,
    pub(crate) remote_records: u64,
    pub(crate) remote_records_rkeys: [u32; 2],
    pub(crate) hint: HintReader,
    telemetry: ConnectionTelemetry,
    watch: HealthWatch,
    /// The peer's end of the control connection (set once connected).
    pub(crate) peer: PeerWatch,
    /// Slots posted so far (drives 1-in-N event sampling).
    transfers: u64,
    /// The CTS slots' protocol state (`proto::send_slots`).
    slots: SendSlots,
    /// Per slot: what its posting sent, for completion telemetry and slow-transfer events.
    posted: Box<[PostedSlot]>,
    /// Per-rail busy time (probes: what the policy agent divides completed bytes by).
    busy: [BusyClock; 2],
    pool: RequestPool,
    failure: Option<Error>,
    /// What failovers left to do (a notice to write) and the last report taken.
    failover: SendFailover,
    /// A failed rail's return (docs/PROTOCOL.md §11).
    failback: SendFailback,
}

impl SendData {
    /// State for a freshly connected comm.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        qps: QueuePairs,
        queues: [Option<RailQueues>; 2],
        fifo: RegisteredRegion<CtsEntry>,
        records: RegisteredRegion<CompletionRecord>,
        remote_records: (u64, [u32; 2]),
        hint: HintReader,
        telemetry: ConnectionTelemetry,
        health: [std::sync::Arc<DeviceHealth>; 2],
    ) -> SendData {
        SendData {
            qps,
            queues,
            fifo,
            records,
            remote_records: remote_records.0,
            remote_records_rkeys: remote_records.1,
            hint,
            telemetry,
            watch: HealthWatch::new(&health),
            peer: PeerWatch::none(),
            transfers: 0,
            slots: SendSlots::new(),
            posted: vec![PostedSlot::default(); FIFO_SLOTS].into_boxed_slice(),
            busy: [BusyClock::default(); 2],
            pool: RequestPool::new(),
            failure: None,
            failover: SendFailover::default(),
            failback: SendFailback::new(None),
        }
    }
}

/// A connected send comm.
#[repr(C)]
pub struct SendComm {
    magic: u32,
    pub(crate) info: ConnectionInfo,
    data: UnsafeCell<SendData>,
}

// SAFETY: `info` is immutable after connect; `data` is only touched from NCCL's progress thread
// for this comm (NCCL's contract, docs/NCCL_NET_ABI.md §2), never concurrently.
unsafe impl Sync for SendComm {}
// SAFETY: all fields are owned; the raw pointers inside requests point into this comm.
unsafe impl Send for SendComm {}

impl SendComm {
    pub(crate) fn new(info: ConnectionInfo, mut data: SendData) -> Box<SendComm> {
        data.slots.use_rails(info.layout.rails());
        let timer = info
            .renewal
            .failback
            .map(crate::proto::failback::FailbackTimer::new);
        data.failback = SendFailback::new(timer);
        Box::new(SendComm {
            magic: SEND_MAGIC,
            info,
            data: UnsafeCell::new(data),
        })
    }

    /// Whether this is a live comm of this kind (the magic word, cleared at close).
    pub(crate) fn is_valid(&self) -> bool {
        self.magic == SEND_MAGIC
    }

    /// Clears the magic, so a pointer to a closed comm that is still readable is refused.
    pub(crate) fn poison(&mut self) {
        self.magic = 0;
    }

    /// The identifier of the control link the comm watches its peer through (tests).
    #[cfg(test)]
    pub(crate) fn link_id(&self) -> Option<u64> {
        self.data().peer.link_id()
    }

    /// The rails that failed over (tests).
    #[cfg(test)]
    pub(crate) fn rails_down(&self) -> crate::proto::rail_mask::RailMask {
        self.data().slots.down()
    }

    /// The data-path state.
    #[allow(clippy::mut_from_ref)]
    fn data(&self) -> &mut SendData {
        // SAFETY: NCCL drives one comm's data path from a single progress thread and never
        // re-enters it; no other code takes a reference into `data` (see `unsafe impl Sync`).
        unsafe { &mut *self.data.get() }
    }

    /// `isend`.
    pub(crate) fn isend(
        &self,
        addr: u64,
        size: u64,
        tag: i32,
        memory: &MemoryHandle,
        profiler_handle: usize,
    ) -> Result<Option<NonNull<Request>>> {
        let data = self.data();
        if let Some(failure) = &data.failure {
            return Err(failure.clone());
        }
        if size > MAX_TRANSFER {
            return Err(Error::invalid_argument(format!(
                "isend: size {size} exceeds maxP2pBytes ({MAX_TRANSFER})"
            )));
        }
        self.post_ready(data)?;
        if !self.head_matching(data)? {
            // Not there yet: reap completions (they free slots whose previous use is still in
            // flight, and a fabric that executes work only when polled, like the loopback, makes
            // progress), then look once more.
            self.poll(data)?;
            if !self.head_matching(data)? {
                // A CTS that never comes: is the receiver still there?
                self.check_peer(data, now_ns())?;
                return Ok(None);
            }
        }
        let Some(matched) = data.slots.match_send(tag as u32, size) else {
            // NCCL retries until the receive with this tag is posted, if the receiver is there.
            self.check_peer(data, now_ns())?;
            return Ok(None);
        };
        memory.check_covers("isend", addr, matched.size)?;
        let owner = self as *const SendComm as *const ();
        let Some(index) = data
            .pool
            .allocate(Owner::Send, owner, data.slots.fifo_head())
        else {
            return Ok(None);
        };
        let request = data.pool.get_mut(index);
        request.count = 1;
        request.sizes[0] = matched.size;
        request.profiler_handles[0] = profiler_handle;
        request.posted_ns = now_ns();
        let buffer = SendBuffer {
            request: index,
            addr,
            lkeys: [memory.lkey(Rail::ScaleOut), memory.lkey(Rail::ScaleUp)],
            size: matched.size,
        };
        let filled = data
            .slots
            .take(matched, buffer)
            .map_err(|e| self.slot_error(e))?;
        if filled {
            self.post_ready(data)?;
        }
        Ok(Some(data.pool.pointer(index)))
    }

    /// Whether the fifo head's slot is matching sends: loads its CTS when the slot is free and
    /// the receiver has written it; false while the slot's previous use is still in flight.
    fn head_matching(&self, data: &mut SendData) -> Result<bool> {
        match data.slots.head() {
            Head::Matching => Ok(true),
            Head::Busy => Ok(false),
            Head::NeedsCts { seq } => {
                let base = slot_of(seq) * MAX_RECVS;
                let fifo = data.fifo.region();
                let rails = self.info.layout.rails();
                data.slots
                    .load_cts(|r| fifo.read(base + r), rails)
                    .map_err(|e| self.slot_error(e))
            }
        }
    }

    /// A step the slot state machine refused, with the peer named: the receiver's fault when it
    /// wrote a bad CTS, else a broken invariant of this engine.
    fn slot_error(&self, error: SendSlotError) -> Error {
        let text = format!("{}: {error}", self.info.describe_peer());
        match error {
            SendSlotError::Cts(_) | SendSlotError::NoSurvivor => Error::remote(text),
            SendSlotError::NotInFlight { .. } | SendSlotError::Invariant(_) => {
                Error::internal(text)
            }
        }
    }

    /// `test` on a send request.
    pub(crate) fn test(&self, index: u16) -> Result<Option<u64>> {
        let data = self.data();
        if let Some(failure) = &data.failure {
            return Err(failure.clone());
        }
        self.post_ready(data)?;
        self.poll(data)?;
        let now = now_ns();
        if let Some((rail, error)) = self.info.check_health(&mut data.watch, now) {
            self.rail_failed(data, rail, error)?;
            self.post_ready(data)?;
        }
        if self.info.watchdog_ns != 0 {
            self.check_progress(data, now)?;
        }
        if !data.slots.down().is_empty() {
            self.finish_episode(data, now);
            self.advance_failback(data, now)?;
        }
        data.telemetry.telemetry().heartbeat(now);
        let request = data.pool.get(index);
        if !request.done {
            self.check_peer(data, now)?;
            return Ok(None);
        }
        let size = request.sizes[0];
        data.pool.release(index);
        data.peer.progressed(now);
        Ok(Some(size))
    }

    /// Fails the comm once the receiver's process is gone while something waits on it (or,
    /// after a failover of the rail the control connection rides, probes it on the survivor).
    #[inline]
    fn check_peer(&self, data: &mut SendData, now: u64) -> Result<()> {
        match data.peer.check(now, || self.info.describe_peer()) {
            Ok(watch) => self.act_on_watch(data, watch),
            Err(error) => {
                data.fail(&error);
                Err(error)
            }
        }
    }

    /// Drains both rails' CQs, then looks for a failover report.
    fn poll(&self, data: &mut SendData) -> Result<()> {
        drain_completions(data, |data, rail, completion| {
            self.complete(data, rail, completion)
        })?;
        self.check_report(data)
    }

    fn complete(&self, data: &mut SendData, rail: Rail, completion: &Completion) -> Result<()> {
        if data.failback.is_stale(rail, completion) {
            // A QP a failback replaced: what rode it was settled by its failover.
            return Ok(());
        }
        if completion.status != CompletionStatus::Success {
            return self.failed_completion(data, rail, completion);
        }
        let wr = WrId::unpack(completion.wr_id)
            .map_err(|e| Error::internal(format!("send completion with {e}")))?;
        if wr.kind == WrKind::Failover && completion.opcode == CompletionOpcode::RdmaWrite {
            if wr.slot == WRITE_RESTORE_PROBE {
                return self.restore_probe_done(data, wr, true, now_ns());
            }
            self.control_write_done(data, wr);
            return Ok(());
        }
        if wr.kind != WrKind::Data || completion.opcode != CompletionOpcode::RdmaWrite {
            return Err(Error::internal(format!(
                "unexpected send completion {wr:?} on {rail}"
            )));
        }
        if let Some(credits) = data.qps.credits.get_mut(wr.qp_index as usize) {
            credits.retire(wr.post_index);
        }
        let slot = usize::from(wr.slot);
        let now = now_ns();
        let progress = data
            .slots
            .complete(slot, rail, now)
            .map_err(|e| self.slot_error(e))?;
        let state = data.slots.slot(slot);
        let probe = data.telemetry.rail(rail);
        probe.inc(RAIL_SEND_COMPLETIONS);
        probe.record_latency_ns(now.saturating_sub(state.post_ns()));
        let clock = &mut data.busy[rail.index()];
        let busy_ns = clock.completed(now, state.post_ns());
        data.telemetry.add_rail_done(
            rail,
            data.posted[slot].rail_bytes[rail.index()],
            busy_ns,
            clock.in_flight(),
        );
        if self.info.profiler.is_some() {
            for buffer in state.buffers() {
                let request = data.pool.get_mut(buffer.request);
                profiler::stop(
                    self.info.profiler,
                    std::mem::take(&mut request.profiler_events[rail.index()]),
                );
            }
        }
        if progress == SendProgress::SlotDone {
            self.slot_done(data, slot);
        }
        Ok(())
    }

    /// Every request of `slot` is complete.
    fn slot_done(&self, data: &mut SendData, slot: usize) {
        let state = *data.slots.slot(slot);
        for buffer in state.buffers() {
            data.pool.get_mut(buffer.request).done = true;
        }
        self.record_event(data, slot);
    }

    /// Records the slot's transfer as a slow (or sampled) event when the policy wants it.
    fn record_event(&self, data: &SendData, slot: usize) {
        let state = data.slots.slot(slot);
        let posted = &data.posted[slot];
        let [sout_done, sup_done] = state.done_ns();
        let last_done = sout_done.max(sup_done);
        let telemetry = data.telemetry.telemetry();
        let Some(kind) =
            telemetry.event_kind(last_done.saturating_sub(state.post_ns()), data.transfers)
        else {
            return;
        };
        let mask = state.rails();
        let epoch = |ns: u64, rail: Rail| {
            if mask.contains(rail) {
                telemetry.epoch_ns(ns)
            } else {
                0
            }
        };
        let size = posted.rail_bytes[0] + posted.rail_bytes[1];
        telemetry.record(&mpib_probes::SlowTransfer {
            kind,
            direction: mpib_probes::Direction::Send,
            rail_mask: mask.bits(),
            conn_index: data.telemetry.index(),
            size,
            post_ns: [
                epoch(state.post_ns(), Rail::ScaleOut),
                epoch(state.post_ns(), Rail::ScaleUp),
            ],
            done_ns: [
                epoch(sout_done, Rail::ScaleOut),
                epoch(sup_done, Rail::ScaleUp),
            ],
            rail_bytes: posted.rail_bytes,
            sup_bw: posted.sup_bw,
            slot: slot as u32,
            qp_num: posted.qp_nums,
            peer: self.info.peer,
            device: u8::try_from(self.info.device_index).unwrap_or(u8::MAX),
            operation: mpib_probes::Operation::decode(posted.operation),
        });
    }
}

impl SendData {
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

impl RailCompletions for SendData {
    fn rail_queues(&mut self, rail: Rail) -> Option<&mut RailQueues> {
        self.queues[rail.index()].as_mut()
    }
}
