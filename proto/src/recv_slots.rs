//! The receiver's CTS slots as a state machine (docs/PROTOCOL.md §5 and §8): when a receive may
//! be posted, the CTS entries it advertises, which request an IMM belongs to, when a receive is
//! complete (mask learning), and how many generic receives each rail's SRQ must hold.
//!
//! Pure: the engine posts the CTS write and the SRQ receives itself, from what this returns.
//!
//! * A receive is posted only while fewer slots are outstanding than the smallest SRQ
//!   high-water mark, and only once the connection holds a receive of each rail's shared queue
//!   per outstanding slot, this one included ([`RecvSlots::wanted`], [`RecvSlots::covers`]):
//!   each outstanding slot may bring one IMM per rail, and an IMM that finds the queue empty
//!   stalls the sender (RNR).
//! * An IMM consumes one receive the connection holds on its rail, names its slot, and teaches
//!   or checks the slot's rail mask; the slot completes when every rail of the mask has
//!   delivered.
//! * When a rail fails ([`RecvSlots::fail_rail`], docs/PROTOCOL.md §10) every outstanding slot
//!   that may lack its part on that rail awaits the sender: it completes on a replay's IMM or on
//!   a post that used the survivor alone, and ignores once the survivor's part of a post that
//!   also used the failed rail (the replay carries it again). The report goes out
//!   ([`RecvSlots::take_report`]) only once the connection holds a receive for every IMM that
//!   may still come, and no receive is posted before it.

use std::fmt;

use crate::completion::{MaskError, MaskLearning};
use crate::cts::{ready_idx, slot_of, CtsEntry, FIFO_SLOTS, MAX_RECVS};
use crate::failover::{FailoverReport, SlotSet};
use crate::imm::Imm;
use crate::rail::Rail;
use crate::rail_mask::RailMask;
use crate::srq::SrqCredits;

/// One buffer of a (grouped) receive, as the CTS advertises it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecvBuffer {
    /// Receiver address of the buffer.
    pub addr: u64,
    /// Capacity in bytes.
    pub size: u64,
    /// Remote keys per rail.
    pub rkeys: [u32; 2],
    /// NCCL tag.
    pub tag: u32,
}

/// Why a receive cannot be posted now (the engine polls and NCCL calls again).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecvBlocked {
    /// As many slots are outstanding as an SRQ holds receives for.
    SrqFull,
    /// The head's slot still waits for the IMMs of the receive 256 earlier.
    SlotBusy,
    /// A failover's report has not gone out yet (docs/PROTOCOL.md §10).
    ReportDue,
}

/// A receive completed by an IMM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completed {
    /// The slot it used (its record, on the general path, is at this index).
    pub slot: usize,
    /// The engine's request index.
    pub request: u16,
    /// How many buffers it had.
    pub count: u8,
    /// The exact size from an IMM's `size_q` (fast path), else `None`: read the record.
    pub imm_size: Option<u64>,
}

/// What an IMM did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImmOutcome {
    /// Other rails of the slot have yet to deliver.
    Pending,
    /// The slot's receive is complete and the slot is free.
    Complete(Completed),
}

/// An IMM the state machine refuses: the peer broke the protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecvSlotError {
    /// An IMM arrived on a rail whose SRQ had no receive posted (as the core counts them).
    SrqUnderflow(Rail),
    /// An IMM named a slot with no receive posted.
    NoReceive(usize),
    /// An IMM's mask contradicts what the slot learned, or repeats a rail.
    Mask(usize, MaskError),
    /// An IMM on a rail that failed.
    RailDown(Rail),
    /// A replay for a slot that awaits none.
    UnawaitedReplay(usize),
    /// Both rails failed: there is nothing to go on over.
    NoSurvivor,
    /// A rail taken back while it is up, or its failover is not over.
    NotRestorable(Rail),
    /// The engine broke a rule of the sequence (a bug, named by the rule).
    Invariant(&'static str),
}

impl fmt::Display for RecvSlotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecvSlotError::SrqUnderflow(rail) => {
                write!(f, "{rail} SRQ delivered more IMMs than receives posted")
            }
            RecvSlotError::NoReceive(slot) => {
                write!(f, "IMM for slot {slot}, which has no receive posted")
            }
            RecvSlotError::Mask(slot, e) => write!(f, "slot {slot}: {e}"),
            RecvSlotError::RailDown(rail) => {
                write!(f, "IMM on the {rail} rail, which failed over")
            }
            RecvSlotError::UnawaitedReplay(slot) => {
                write!(f, "replayed IMM for slot {slot}, which awaits no replay")
            }
            RecvSlotError::NoSurvivor => write!(f, "both rails failed"),
            RecvSlotError::NotRestorable(rail) => {
                write!(f, "the {rail} rail taken back before its failover was over")
            }
            RecvSlotError::Invariant(rule) => write!(f, "receive slot invariant broken: {rule}"),
        }
    }
}

impl std::error::Error for RecvSlotError {}

#[derive(Clone, Copy, Debug)]
struct RecvSlot {
    request: Option<u16>,
    count: u8,
    learning: MaskLearning,
    imm_size: Option<u64>,
    /// Outstanding when a rail failed: waits for the sender's replay or survivor-only post.
    awaiting: bool,
    /// An awaiting slot ignored the survivor's part of a post that also used the failed rail
    /// (there is one such part at most).
    ignored: bool,
}

impl RecvSlot {
    const FREE: RecvSlot = RecvSlot {
        request: None,
        count: 0,
        learning: MaskLearning::new(),
        imm_size: None,
        awaiting: false,
        ignored: false,
    };
}

/// The 256 receive slots of one connection and the SRQ accounting of its rails.
#[derive(Debug)]
pub struct RecvSlots {
    fifo_head: u64,
    outstanding: u32,
    /// Rails that failed, and the failovers so far.
    down: RailMask,
    epoch: u32,
    /// Outstanding slots that await the sender after a failover (each may bring one IMM more
    /// than a slot does: the ignored survivor part, then the replay).
    awaiting: u32,
    /// A failover not reported yet (the report is built when it goes: [`RecvSlots::take_report`]).
    report_due: bool,
    /// Credits of the rails that have an SRQ (`None`: no SRQ on that rail).
    srq: [Option<SrqCredits>; 2],
    slots: Box<[RecvSlot]>,
}

impl RecvSlots {
    /// Every slot free; `srq[rail]` the (empty) credits of each rail that has an SRQ.
    #[inline]
    pub fn new(srq: [Option<SrqCredits>; 2]) -> RecvSlots {
        RecvSlots {
            fifo_head: 0,
            outstanding: 0,
            down: RailMask::NONE,
            epoch: 0,
            awaiting: 0,
            report_due: false,
            srq,
            slots: vec![RecvSlot::FREE; FIFO_SLOTS].into_boxed_slice(),
        }
    }

    /// Slots whose CTS is out and whose IMMs may still arrive.
    #[inline]
    pub const fn outstanding(&self) -> u32 {
        self.outstanding
    }

    /// The next fifo sequence a receive is posted for.
    #[inline]
    pub const fn fifo_head(&self) -> u64 {
        self.fifo_head
    }

    /// The SRQ credits of `rail`, if it has an SRQ.
    #[inline]
    pub fn srq(&self, rail: Rail) -> Option<&SrqCredits> {
        self.srq[rail.index()].as_ref()
    }

    /// Slots that may be outstanding at once: the smallest high-water mark (most held) of the
    /// rails that have an SRQ.
    #[inline]
    pub fn capacity(&self) -> u32 {
        self.live_srqs()
            .map(SrqCredits::high_water)
            .min()
            .unwrap_or(u32::MAX)
    }

    /// The credits of the rails that have an SRQ and have not failed.
    fn live_srqs(&self) -> impl Iterator<Item = &SrqCredits> {
        Rail::ALL
            .into_iter()
            .filter(|rail| !self.down.contains(*rail))
            .filter_map(|rail| self.srq[rail.index()].as_ref())
    }

    /// The rails that failed.
    #[inline]
    pub const fn down(&self) -> RailMask {
        self.down
    }

    /// IMMs that may still arrive, one per outstanding slot and one more per slot awaiting the
    /// sender after a failover: what each rail's holding covers ([`RecvSlots::wanted`]).
    #[inline]
    pub const fn imms_in_flight(&self) -> u32 {
        self.outstanding + self.awaiting
    }

    /// Whether a receive may be posted now, and if not why.
    #[inline]
    pub fn can_post(&self) -> Result<(), RecvBlocked> {
        if self.report_due {
            // A CTS must not reach the sender before the report it comes after (the sender
            // would post it on the failed rail too).
            return Err(RecvBlocked::ReportDue);
        }
        if self.outstanding >= self.capacity() {
            return Err(RecvBlocked::SrqFull);
        }
        if self.slots[slot_of(self.fifo_head)].request.is_some() {
            return Err(RecvBlocked::SlotBusy);
        }
        Ok(())
    }

    /// Receives to take from `rail`'s shared queue so that the connection holds one for each
    /// of `in_flight` slots (and a batch more); 0 without an SRQ or when covered. The engine takes
    /// them and reports with [`RecvSlots::on_granted`].
    #[inline]
    pub fn wanted(&self, rail: Rail, in_flight: u32) -> u32 {
        if self.down.contains(rail) {
            return 0;
        }
        self.srq[rail.index()]
            .as_ref()
            .map_or(0, |credits| credits.wanted(in_flight))
    }

    /// A take on `rail` granted `n` receives.
    #[inline]
    pub fn on_granted(&mut self, rail: Rail, n: u32) {
        if let Some(credits) = self.srq[rail.index()].as_mut() {
            credits.on_granted(n);
        }
    }

    /// Whether every rail with an SRQ holds a receive for each of `in_flight` slots: a CTS for
    /// the `in_flight`-th goes out only then.
    #[inline]
    pub fn covers(&self, in_flight: u32) -> bool {
        self.live_srqs().all(|credits| credits.covers(in_flight))
    }

    /// Receives `rail` holds beyond what `in_flight` slots need (see [`SrqCredits::excess`]);
    /// the engine gives them back and reports with [`RecvSlots::on_given_back`].
    #[inline]
    pub fn excess(&self, rail: Rail, in_flight: u32) -> u32 {
        self.srq[rail.index()]
            .as_ref()
            .map_or(0, |credits| credits.excess(in_flight))
    }

    /// `n` receives of `rail` went back to the shared queue.
    #[inline]
    pub fn on_given_back(&mut self, rail: Rail, n: u32) {
        if let Some(credits) = self.srq[rail.index()].as_mut() {
            credits.on_given_back(n);
        }
    }

    /// The CTS entry of `buffer`, one of the `count` buffers of a receive at the fifo head
    /// (the `count` entries go to the sender's FIFO at the head's slot in one write).
    #[inline]
    pub fn cts_entry(&self, count: usize, buffer: &RecvBuffer) -> CtsEntry {
        CtsEntry {
            addr: buffer.addr,
            size: buffer.size,
            rkeys: buffer.rkeys,
            nreqs: count as u32,
            tag: buffer.tag,
            idx: ready_idx(self.fifo_head),
            padding: [0; 24],
        }
        .with_failover_epoch(self.epoch)
    }

    /// The head's CTS went out for `request`, a receive of `count` buffers: the slot waits for
    /// its IMMs. Returns the slot.
    #[inline]
    pub fn posted(&mut self, request: u16, count: u8) -> Result<usize, RecvSlotError> {
        if self.can_post().is_err() {
            return Err(RecvSlotError::Invariant(
                "a CTS goes out only when can_post allows",
            ));
        }
        if count == 0 || usize::from(count) > MAX_RECVS {
            return Err(RecvSlotError::Invariant("a receive has 1..=8 buffers"));
        }
        if !self.covers(self.imms_in_flight() + 1) {
            return Err(RecvSlotError::Invariant(
                "a CTS goes out only when every rail holds a receive for it",
            ));
        }
        let slot = slot_of(self.fifo_head);
        self.slots[slot] = RecvSlot {
            request: Some(request),
            count,
            ..RecvSlot::FREE
        };
        self.outstanding += 1;
        self.fifo_head += 1;
        Ok(slot)
    }

    /// One IMM arrived on `rail`; `allowed` is the set of rails this connection has. On error
    /// the slot is unchanged (the engine fails the connection).
    #[inline]
    pub fn on_imm(
        &mut self,
        rail: Rail,
        imm: Imm,
        allowed: RailMask,
    ) -> Result<ImmOutcome, RecvSlotError> {
        if self.down.contains(rail) {
            return Err(RecvSlotError::RailDown(rail));
        }
        // A rail without an SRQ has no receive an IMM could consume.
        self.srq[rail.index()]
            .as_mut()
            .ok_or(RecvSlotError::SrqUnderflow(rail))?
            .on_consumed()
            .map_err(|_| RecvSlotError::SrqUnderflow(rail))?;
        let slot = usize::from(imm.slot);
        let live = RailMask(allowed.bits() & !self.down.bits());
        let state = &mut self.slots[slot];
        let Some(request) = state.request else {
            return Err(RecvSlotError::NoReceive(slot));
        };
        // A slot that learned its mask before a failover may still name the failed rail (its
        // part there arrived: the survivor's comes); one that learns it now may not.
        let learnable = if state.learning.expected().is_empty() {
            live
        } else {
            allowed
        };
        let complete = match (imm.is_replay(), state.awaiting) {
            (true, true) => true,
            (true, false) => return Err(RecvSlotError::UnawaitedReplay(slot)),
            // The survivor's part of a post whose part on the failed rail was lost: the replay
            // will carry it again, whole. There is one at most, on the rail it names.
            (false, true) if !imm.mask.is_subset_of(live) => {
                if state.ignored || !imm.mask.contains(rail) {
                    let error = MaskError::Duplicate { rail };
                    return Err(RecvSlotError::Mask(slot, error));
                }
                state.ignored = true;
                return Ok(ImmOutcome::Pending);
            }
            (false, _) => state
                .learning
                .arrive(rail, imm.mask, learnable)
                .map_err(|e| RecvSlotError::Mask(slot, e))?,
        };
        if let Some(bytes) = imm.size_bytes() {
            state.imm_size = Some(bytes);
        }
        if !complete {
            return Ok(ImmOutcome::Pending);
        }
        let completed = Completed {
            slot,
            request,
            count: state.count,
            imm_size: state.imm_size,
        };
        if state.awaiting {
            self.awaiting -= 1;
        }
        *state = RecvSlot::FREE;
        self.outstanding -= 1;
        Ok(ImmOutcome::Complete(completed))
    }

    /// `rail` failed, and nothing more can land on it (its queue pairs are in error and every
    /// IMM they delivered was passed to [`RecvSlots::on_imm`]). Every outstanding slot that
    /// may lack a part of the failed rail — it learned a mask naming that rail whose IMM has
    /// not come, or learned nothing yet — now awaits the sender: a replay, or a first post on
    /// the survivor alone. The others complete as they would have (their part on the failed
    /// rail arrived, or they did not use it). `Ok(true)` when the rail had not failed before
    /// (a report is then due: [`RecvSlots::take_report`]); fails when the connection has no
    /// other rail, or it failed too.
    pub fn fail_rail(&mut self, rail: Rail) -> Result<bool, RecvSlotError> {
        if self.down.contains(rail) {
            return Ok(false);
        }
        let survivor = rail.other();
        if self.down.contains(survivor) || self.srq[survivor.index()].is_none() {
            return Err(RecvSlotError::NoSurvivor);
        }
        self.down = self.down.with(rail);
        self.epoch += 1;
        self.report_due = true;
        for state in self.slots.iter_mut() {
            let expected = state.learning.expected();
            let lacks = expected.is_empty()
                || (expected.contains(rail) && !state.learning.seen().contains(rail));
            if state.request.is_none() || !lacks {
                continue;
            }
            // What arrived of it is not counted: its replay, or its survivor-only post,
            // brings it all.
            state.learning = MaskLearning::new();
            state.imm_size = None;
            if !state.awaiting {
                state.awaiting = true;
                self.awaiting += 1;
            }
        }
        Ok(true)
    }

    /// Whether `rail` may come back (docs/PROTOCOL.md §11): it is down, its failover was
    /// reported, and no receive awaits a replay (the sender offers only once every transfer
    /// of the failover is done on its side, so a receive still awaiting one means its IMMs are
    /// not all taken yet: the offer is refused and made again later).
    pub fn can_restore(&self, rail: Rail) -> bool {
        self.down.contains(rail) && !self.report_due && self.awaiting == 0
    }

    /// `rail` is back: its IMMs count again (the engine gave it new queue pairs, and the old
    /// ones delivered nothing since the failover). Only when [`RecvSlots::can_restore`].
    pub fn restore_rail(&mut self, rail: Rail) -> Result<(), RecvSlotError> {
        if !self.can_restore(rail) {
            return Err(RecvSlotError::NotRestorable(rail));
        }
        self.down = self.down.without(rail);
        Ok(())
    }

    /// The report of the last failover, once it is due and the connection holds a receive for
    /// every IMM that may still come (the replays it asks for come on top of the survivor's
    /// parts already in flight: [`RecvSlots::imms_in_flight`]). Built now, from the slots that
    /// await the sender now. Receives are posted again after it.
    pub fn take_report(&mut self) -> Option<FailoverReport> {
        if !self.report_due || !self.covers(self.imms_in_flight()) {
            return None;
        }
        let failed = Rail::ALL
            .into_iter()
            .find(|rail| self.down.contains(*rail))?;
        self.report_due = false;
        let mut awaiting = SlotSet::EMPTY;
        for (slot, state) in self.slots.iter().enumerate() {
            if state.awaiting {
                awaiting.insert(slot);
            }
        }
        Some(FailoverReport {
            epoch: self.epoch,
            failed,
            awaiting,
            head: self.fifo_head,
        })
    }
}

#[cfg(test)]
#[path = "recv_slots_tests.rs"]
mod tests;
