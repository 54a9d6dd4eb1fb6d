//! The send comm's data path (`isend`, `test` on send requests): wait for the receiver's CTS,
//! match tags, split each transfer across the rails, post one WR chain per active rail, and
//! complete requests from the leader-independent per-rail signalled completions.
//!
//! Allocation-free, lock-free and integer-only: all state is preallocated at connect time.

use mpib_probes::declared::{RAIL_ERROR_COMPLETIONS, RAIL_SEND_COMPLETIONS};
use std::cell::UnsafeCell;
use std::ptr::NonNull;

use crate::error::{Error, Result};
use crate::fabric::{Completion, CompletionOpcode, CompletionStatus, Rail};
use crate::proto::cts::{
    match_tag, ready_idx, slot_of, CompletionRecord, CtsEntry, FIFO_SLOTS, MAX_RECVS,
};
use crate::proto::rail_mask::RailMask;
use crate::proto::wr_id::{WrId, WrKind};

mod busy;
mod post;

use busy::BusyClock;

use super::agent::HintReader;
use super::comm::{ConnectionInfo, SEND_MAGIC};
use super::health::{DeviceHealth, HealthWatch};
use super::memory::MemoryHandle;
use super::peer::PeerWatch;
use super::profiler;
use super::request::{now_ns, Owner, Request, RequestPool};
use super::resources::{
    drain_completions, QueuePairs, RailCompletions, RailQueues, RegisteredRegion,
};
use super::telemetry::ConnectionTelemetry;

/// Largest single transfer (`maxP2pBytes`); completion records carry sizes as u32.
pub(crate) const MAX_TRANSFER: u64 = 1 << 30;

/// Where a CTS slot is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Free for the next fifo sequence that maps here.
    Idle,
    /// CTS read; `isend`s are being matched to its entries.
    Matching,
    /// All entries matched; waiting for send-queue credits to post.
    Posting,
    /// Posted; waiting for the signalled completion of every active rail.
    InFlight,
}

/// Sender-side state of one CTS slot.
#[derive(Clone, Copy)]
struct SendSlot {
    phase: Phase,
    seq: u64,
    nreqs: u8,
    taken: u8,
    pending: RailMask,
    entries: [CtsEntry; MAX_RECVS],
    requests: [u16; MAX_RECVS],
    addrs: [u64; MAX_RECVS],
    lkeys: [[u32; 2]; MAX_RECVS],
    /// Telemetry of the posted transfer: when, per-rail completion times, bytes, split, QPs.
    post_ns: u64,
    done_ns: [u64; 2],
    rail_bytes: [u64; 2],
    sup_bw: u32,
    qp_nums: [u32; 2],
}

impl SendSlot {
    /// The rails the posted transfer used (those that have a completion time).
    fn completed_rails(&self) -> RailMask {
        Rail::ALL
            .into_iter()
            .filter(|rail| self.done_ns[rail.index()] != 0)
            .fold(RailMask::NONE, RailMask::with)
    }

    const IDLE: SendSlot = SendSlot {
        phase: Phase::Idle,
        seq: 0,
        nreqs: 0,
        taken: 0,
        pending: RailMask::NONE,
        entries: [CtsEntry {
            addr: 0,
            size: 0,
            rkeys: [0; 2],
            nreqs: 0,
            tag: 0,
            idx: 0,
            padding: [0; 24],
        }; MAX_RECVS],
        requests: [0; MAX_RECVS],
        addrs: [0; MAX_RECVS],
        lkeys: [[0; 2]; MAX_RECVS],
        post_ns: 0,
        done_ns: [0; 2],
        rail_bytes: [0; 2],
        sup_bw: 0,
        qp_nums: [0; 2],
    };
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
    fifo_head: u64,
    post_head: u64,
    slots: Box<[SendSlot]>,
    /// Per-rail busy time (probes: what the policy agent divides completed bytes by).
    busy: [BusyClock; 2],
    pool: RequestPool,
    failure: Option<Error>,
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
            fifo_head: 0,
            post_head: 0,
            slots: vec![SendSlot::IDLE; FIFO_SLOTS].into_boxed_slice(),
            busy: [BusyClock::default(); 2],
            pool: RequestPool::new(),
            failure: None,
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
    pub(crate) fn new(info: ConnectionInfo, data: SendData) -> Box<SendComm> {
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
        let seq = data.fifo_head;
        let slot = slot_of(seq);
        if !self.slot_matching(data, seq)? {
            // Not there yet: reap completions (they free slots whose previous use is still in
            // flight, and a fabric that executes work only when polled, like the loopback, makes
            // progress), then look once more.
            self.poll(data)?;
            if !self.slot_matching(data, seq)? {
                // A CTS that never comes: is the receiver still there?
                self.check_peer(data, now_ns())?;
                return Ok(None);
            }
        }
        let state = &mut data.slots[slot];
        let nreqs = state.nreqs as usize;
        let Some(entry) = match_tag(&state.entries[..nreqs], state.taken, tag as u32) else {
            // NCCL retries until the receive with this tag is posted, if the receiver is there.
            self.check_peer(data, now_ns())?;
            return Ok(None);
        };
        let clamped = size.min(state.entries[entry].size);
        memory.check_covers("isend", addr, clamped)?;
        let owner = self as *const SendComm as *const ();
        let Some(index) = data.pool.allocate(Owner::Send, owner, seq) else {
            return Ok(None);
        };
        let request = data.pool.get_mut(index);
        request.count = 1;
        request.sizes[0] = clamped;
        request.profiler_handles[0] = profiler_handle;
        request.posted_ns = now_ns();
        let state = &mut data.slots[slot];
        state.taken |= 1 << entry;
        state.requests[entry] = index;
        state.addrs[entry] = addr;
        state.lkeys[entry] = [memory.lkey(Rail::ScaleOut), memory.lkey(Rail::ScaleUp)];
        if state.taken.count_ones() as usize == nreqs {
            state.phase = Phase::Posting;
            data.fifo_head += 1;
            self.post_ready(data)?;
        }
        Ok(Some(data.pool.pointer(index)))
    }

    /// Whether `seq`'s slot is matching sends: loads its CTS when the slot is free and the
    /// receiver has written it; false while the slot's previous use is still in flight.
    fn slot_matching(&self, data: &mut SendData, seq: u64) -> Result<bool> {
        let state = &data.slots[slot_of(seq)];
        match state.phase {
            Phase::Idle => self.load_cts(data, seq),
            Phase::Matching => Ok(state.seq == seq),
            Phase::Posting | Phase::InFlight => Ok(false),
        }
    }

    /// Reads the CTS for `seq` if the receiver wrote it (`idx == seq + 1` on every entry).
    fn load_cts(&self, data: &mut SendData, seq: u64) -> Result<bool> {
        let slot = slot_of(seq);
        let base = slot * MAX_RECVS;
        let ready = ready_idx(seq);
        if data.fifo.region().read(base).idx != ready {
            return Ok(false);
        }
        // Read again: the first read took `nreqs` before `idx` (ascending words), so it may be
        // the slot's previous use; a read after seeing the new `idx` sees the fields the
        // receiver's write put below it (src/fabric/landing.rs).
        let first = data.fifo.region().read(base);
        let nreqs = (first.nreqs as usize).clamp(1, MAX_RECVS);
        // The n entries arrive in one RDMA write but may become visible piecemeal: wait (by
        // returning "try later") until every entry carries this sequence's idx, as net_ib does.
        if (1..nreqs).any(|r| data.fifo.region().read(base + r).idx != ready) {
            return Ok(false);
        }
        // Every entry's idx was read with acquire, so these reads see the fields below it.
        let state = &mut data.slots[slot];
        for r in 0..nreqs {
            let entry = data.fifo.region().read(base + r);
            entry
                .validate(slot, r, self.info.layout.rails())
                .map_err(|e| {
                    Error::remote(format!(
                        "{}: posted incorrect receive info: {e}",
                        self.info.describe_peer()
                    ))
                })?;
            state.entries[r] = entry;
        }
        state.phase = Phase::Matching;
        state.seq = seq;
        state.nreqs = nreqs as u8;
        state.taken = 0;
        Ok(true)
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
        if let Err(error) = self.info.check_health(&mut data.watch, now) {
            data.failure = Some(error.clone());
            return Err(error);
        }
        data.telemetry.telemetry().heartbeat(now);
        let request = data.pool.get(index);
        if !request.done {
            self.check_peer(data, now)?;
            return Ok(None);
        }
        let size = request.sizes[0];
        data.pool.release(index);
        Ok(Some(size))
    }

    /// Fails the comm once the receiver's process is gone while something waits on it.
    #[inline]
    fn check_peer(&self, data: &mut SendData, now: u64) -> Result<()> {
        if let Err(error) = data.peer.check(now, || self.info.describe_peer()) {
            data.failure = Some(error.clone());
            return Err(error);
        }
        Ok(())
    }

    /// Drains both rails' CQs.
    fn poll(&self, data: &mut SendData) -> Result<()> {
        drain_completions(data, |data, rail, completion| {
            self.complete(data, rail, completion)
        })
    }

    fn complete(&self, data: &mut SendData, rail: Rail, completion: &Completion) -> Result<()> {
        if completion.status != CompletionStatus::Success {
            let error = self.info.completion_error(rail, completion);
            data.telemetry
                .telemetry()
                .rail(rail)
                .inc(RAIL_ERROR_COMPLETIONS);
            data.failure = Some(error.clone());
            return Err(error);
        }
        let wr = WrId::unpack(completion.wr_id)
            .map_err(|e| Error::internal(format!("send completion with {e}")))?;
        if wr.kind != WrKind::Data || completion.opcode != CompletionOpcode::RdmaWrite {
            return Err(Error::internal(format!(
                "unexpected send completion {wr:?} on {rail}"
            )));
        }
        if let Some(credits) = data.qps.credits.get_mut(wr.qp_index as usize) {
            credits.retire(wr.post_index);
        }
        let state = &mut data.slots[wr.slot as usize];
        if state.phase != Phase::InFlight || !state.pending.contains(rail) {
            return Err(Error::internal(format!(
                "{}: completion for slot {} on {rail} that has no transfer in flight",
                self.info.describe_peer(),
                wr.slot
            )));
        }
        let now = now_ns();
        let probe = data.telemetry.telemetry().rail(rail);
        probe.inc(RAIL_SEND_COMPLETIONS);
        probe.record_latency_ns(now.saturating_sub(state.post_ns));
        state.done_ns[rail.index()] = now;
        let clock = &mut data.busy[rail.index()];
        let busy_ns = clock.completed(now);
        data.telemetry.add_rail_done(
            rail,
            state.rail_bytes[rail.index()],
            busy_ns,
            clock.in_flight(),
        );
        state.pending = RailMask(state.pending.bits() & !RailMask::of(rail).bits());
        if self.info.profiler.is_some() {
            for index in &state.requests[..state.nreqs as usize] {
                let request = data.pool.get_mut(*index);
                profiler::stop(
                    self.info.profiler,
                    std::mem::take(&mut request.profiler_events[rail.index()]),
                );
            }
        }
        if state.pending.is_empty() {
            state.phase = Phase::Idle;
            let (requests, nreqs) = (state.requests, state.nreqs as usize);
            for index in &requests[..nreqs] {
                data.pool.get_mut(*index).done = true;
            }
            self.record_event(data, wr.slot as usize);
        }
        Ok(())
    }

    /// Records the slot's transfer as a slow (or sampled) event when the policy wants it.
    fn record_event(&self, data: &SendData, slot: usize) {
        let state = &data.slots[slot];
        let last_done = state.done_ns[0].max(state.done_ns[1]);
        let telemetry = data.telemetry.telemetry();
        let Some(kind) =
            telemetry.event_kind(last_done.saturating_sub(state.post_ns), data.transfers)
        else {
            return;
        };
        let mask = state.completed_rails();
        let epoch = |ns: u64, rail: Rail| {
            if mask.contains(rail) {
                telemetry.epoch_ns(ns)
            } else {
                0
            }
        };
        let size = state.rail_bytes[0] + state.rail_bytes[1];
        telemetry.record(&mpib_probes::SlowTransfer {
            kind,
            direction: mpib_probes::Direction::Send,
            rail_mask: mask.bits(),
            conn_index: data.telemetry.index(),
            size,
            post_ns: [
                epoch(state.post_ns, Rail::ScaleOut),
                epoch(state.post_ns, Rail::ScaleUp),
            ],
            done_ns: [
                epoch(state.done_ns[0], Rail::ScaleOut),
                epoch(state.done_ns[1], Rail::ScaleUp),
            ],
            rail_bytes: state.rail_bytes,
            sup_bw: state.sup_bw,
            slot: slot as u32,
            qp_num: state.qp_nums,
            peer: self.info.peer,
        });
    }
}

impl RailCompletions for SendData {
    fn rail_queues(&mut self, rail: Rail) -> Option<&mut RailQueues> {
        self.queues[rail.index()].as_mut()
    }
}
