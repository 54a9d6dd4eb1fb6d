//! The sender's CTS slots as a state machine (docs/PROTOCOL.md §5–§7): which fifo sequence the
//! next `isend` matches, when a slot's CTS may be read, which slot posts next, and when a
//! posted slot's requests are done.
//!
//! Pure: the engine reads the FIFO through a closure, passes the time in, and does the posting
//! itself from what [`SendSlots::next_to_post`] hands it ([`crate::post_plan`] builds the work
//! requests). Each slot goes `Idle → Matching → Posting → InFlight → Idle`:
//!
//! * `Idle → Matching` when every entry of the slot's CTS carries the sequence's `idx`
//!   ([`SendSlots::load_cts`]);
//! * `Matching → Posting` when an `isend` has taken every entry ([`SendSlots::take`]); the fifo
//!   head moves on, so sends match the next sequence while this one waits for credits;
//! * `Posting → InFlight` when its chains are posted, strictly in fifo order
//!   ([`SendSlots::posted`]);
//! * `InFlight → Idle` when every rail it used has completed ([`SendSlots::complete`]).
//!
//! When a rail fails (docs/PROTOCOL.md §10) nothing more is posted on it
//! ([`SendSlots::rail_failed`]); the receiver's report ([`SendSlots::on_report`]) settles every
//! slot in flight that used it: done if the receiver has it whole, else replayed whole on the
//! survivor ([`SendSlots::next_replay`], [`SendSlots::replayed`]) and done once that replay
//! and what the slot still had in flight on the survivor have completed.

use std::fmt;

use crate::cts::{
    match_tag, ready_idx, slot_of, Advertised, CtsEntry, CtsError, FIFO_SLOTS, MAX_RECVS,
};
use crate::failover::{FailoverNotice, FailoverReport, SlotSet};
use crate::rail::Rail;
use crate::rail_mask::RailMask;

/// Where a CTS slot is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Free for the next fifo sequence that maps here.
    Idle,
    /// CTS read; `isend`s are being matched to its entries.
    Matching,
    /// All entries matched; waiting for send-queue credits to post.
    Posting,
    /// Posted; waiting for the signalled completion of every active rail.
    InFlight,
}

/// The sender's local side of one matched entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SendBuffer {
    /// The engine's request index for the `isend` that took the entry.
    pub request: u16,
    /// Local address of the data.
    pub addr: u64,
    /// Local keys per rail.
    pub lkeys: [u32; 2],
    /// Bytes to send: the `isend`'s size clamped to the receive's capacity.
    pub size: u64,
}

/// Sender-side state of one CTS slot.
#[derive(Clone, Copy, Debug)]
pub struct SendSlot {
    phase: Phase,
    seq: u64,
    nreqs: u8,
    taken: u8,
    pending: RailMask,
    used: RailMask,
    entries: [Advertised; MAX_RECVS],
    buffers: [SendBuffer; MAX_RECVS],
    post_ns: u64,
    done_ns: [u64; 2],
    /// A replay is to be posted (after a failover) or in flight.
    replay: Replay,
}

/// A slot's replay after a failover.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Replay {
    None,
    /// The receiver awaits it: to be posted on the survivor.
    Needed,
    /// Posted; its completion is awaited.
    InFlight,
}

impl SendSlot {
    const IDLE: SendSlot = SendSlot {
        replay: Replay::None,
        phase: Phase::Idle,
        seq: 0,
        nreqs: 0,
        taken: 0,
        pending: RailMask::NONE,
        used: RailMask::NONE,
        entries: [Advertised::EMPTY; MAX_RECVS],
        buffers: [SendBuffer {
            request: 0,
            addr: 0,
            lkeys: [0; 2],
            size: 0,
        }; MAX_RECVS],
        post_ns: 0,
        done_ns: [0; 2],
    };

    /// Where the slot is.
    #[inline]
    pub const fn phase(&self) -> Phase {
        self.phase
    }

    /// The fifo sequence the slot serves (meaningful once a CTS was loaded).
    #[inline]
    pub const fn seq(&self) -> u64 {
        self.seq
    }

    /// The receiver's entries of the loaded CTS.
    #[inline]
    pub fn entries(&self) -> &[Advertised] {
        &self.entries[..self.nreqs as usize]
    }

    /// The matched local buffers, one per entry (complete from `Posting` on).
    #[inline]
    pub fn buffers(&self) -> &[SendBuffer] {
        &self.buffers[..self.nreqs as usize]
    }

    /// The rails the posted transfer used.
    #[inline]
    pub const fn rails(&self) -> RailMask {
        self.used
    }

    /// The rails still to complete.
    #[inline]
    pub const fn pending(&self) -> RailMask {
        self.pending
    }

    /// When the slot was posted (the engine's clock).
    #[inline]
    pub const fn post_ns(&self) -> u64 {
        self.post_ns
    }

    /// When each rail completed (0: not (yet) completed or not used).
    #[inline]
    pub const fn done_ns(&self) -> [u64; 2] {
        self.done_ns
    }
}

/// What [`SendSlots::head`] finds at the fifo head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Head {
    /// The head's slot is free: its CTS may be loaded for this sequence.
    NeedsCts {
        /// The fifo sequence.
        seq: u64,
    },
    /// The head's CTS is loaded and sends are matched to it.
    Matching,
    /// The head's slot still holds the transfer of a sequence 256 earlier.
    Busy,
}

/// An `isend` matched to an entry of the head's CTS, not yet taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Match {
    /// The slot (`seq % 256`).
    pub slot: usize,
    /// The entry within the slot.
    pub entry: usize,
    /// The bytes that will be sent: the send's size clamped to the receive's capacity.
    pub size: u64,
}

/// What a completion did to its slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendProgress {
    /// Other rails of the slot are still in flight.
    RailDone,
    /// The last rail completed: the slot's requests are done and the slot is free.
    SlotDone,
}

/// A step the state machine refuses: the peer or the engine broke the protocol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SendSlotError {
    /// The receiver's CTS entry is malformed.
    Cts(CtsError),
    /// A completion for a slot and rail that has nothing in flight there.
    NotInFlight {
        /// The slot named by the completion's wr_id.
        slot: usize,
        /// The rail that completed.
        rail: Rail,
    },
    /// The engine broke a rule of the sequence (a bug, named by the rule).
    Invariant(&'static str),
    /// Both rails failed: there is nothing to go on over.
    NoSurvivor,
}

impl fmt::Display for SendSlotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SendSlotError::Cts(e) => write!(f, "{e}"),
            SendSlotError::NotInFlight { slot, rail } => write!(
                f,
                "completion for slot {slot} on {rail} that has no transfer in flight"
            ),
            SendSlotError::Invariant(rule) => write!(f, "send slot invariant broken: {rule}"),
            SendSlotError::NoSurvivor => write!(f, "both rails failed"),
        }
    }
}

impl std::error::Error for SendSlotError {}

/// The 256 send slots of one connection, the fifo head (next sequence to match) and the post
/// head (next sequence to post).
#[derive(Debug)]
pub struct SendSlots {
    fifo_head: u64,
    post_head: u64,
    slots: Box<[SendSlot]>,
    /// The connection's rails, those that failed, failovers so far (this side's count), and
    /// the last report taken.
    rails: RailMask,
    down: RailMask,
    epoch: u32,
    reported: u32,
    /// Failed rails whose report has not come yet.
    unreported: RailMask,
    /// Slots whose replay is to be posted.
    replays: SlotSet,
}

impl Default for SendSlots {
    fn default() -> Self {
        SendSlots::new()
    }
}

impl SendSlots {
    /// Every slot idle, both heads at sequence 0 (allocates once, at connect).
    #[inline]
    pub fn new() -> SendSlots {
        SendSlots {
            fifo_head: 0,
            post_head: 0,
            slots: vec![SendSlot::IDLE; FIFO_SLOTS].into_boxed_slice(),
            rails: RailMask::BOTH,
            down: RailMask::NONE,
            epoch: 0,
            reported: 0,
            unreported: RailMask::NONE,
            replays: SlotSet::EMPTY,
        }
    }

    /// The connection has only `rails` (a vanilla inter-island one has no SUP QPs): a failure
    /// of the last one leaves nothing to go on over.
    #[inline]
    pub fn use_rails(&mut self, rails: RailMask) {
        self.rails = rails;
    }

    /// The slot with this index (`0..256`).
    #[inline]
    pub fn slot(&self, slot: usize) -> &SendSlot {
        &self.slots[slot % FIFO_SLOTS]
    }

    /// The next fifo sequence a send matches.
    #[inline]
    pub const fn fifo_head(&self) -> u64 {
        self.fifo_head
    }

    /// What the fifo head's slot is doing.
    #[inline]
    pub fn head(&self) -> Head {
        let state = &self.slots[slot_of(self.fifo_head)];
        match state.phase {
            Phase::Idle => Head::NeedsCts {
                seq: self.fifo_head,
            },
            Phase::Matching if state.seq == self.fifo_head => Head::Matching,
            Phase::Matching | Phase::Posting | Phase::InFlight => Head::Busy,
        }
    }

    /// Loads the head's CTS if the receiver has written it: `read(r)` returns entry `r` of the
    /// head's slot as the sender's FIFO holds it now. `Ok(false)` when not (all) there yet.
    ///
    /// The entries arrive in one RDMA write but may become visible piecemeal, and each entry's
    /// words in ascending order (`idx` last): the first entry is read again after its `idx` was
    /// seen (the first read took `nreqs` before `idx`, so possibly from the slot's previous use),
    /// then every entry must carry the sequence's `idx` before any is used, as net_ib does.
    #[inline]
    pub fn load_cts(
        &mut self,
        mut read: impl FnMut(usize) -> CtsEntry,
        rails: RailMask,
    ) -> Result<bool, SendSlotError> {
        let seq = self.fifo_head;
        let slot = slot_of(seq);
        if self.slots[slot].phase != Phase::Idle {
            return Err(SendSlotError::Invariant(
                "a CTS is loaded only into an idle slot",
            ));
        }
        let ready = ready_idx(seq);
        if read(0).idx != ready {
            return Ok(false);
        }
        let nreqs = (read(0).nreqs as usize).clamp(1, MAX_RECVS);
        if (1..nreqs).any(|r| read(r).idx != ready) {
            return Ok(false);
        }
        if read(0).failover_epoch() > self.reported {
            // Written after a failover report this side has not taken: the report landed first
            // (docs/PROTOCOL.md §10), so the engine reads its mailbox and calls again.
            return Ok(false);
        }
        // Read straight into the slot: until its phase changes it is idle and its entries
        // mean nothing, so a refused entry leaves nothing behind.
        let state = &mut self.slots[slot];
        for r in 0..nreqs {
            let entry = read(r);
            entry.validate(slot, r, rails).map_err(SendSlotError::Cts)?;
            state.entries[r] = Advertised::from(&entry);
        }
        state.phase = Phase::Matching;
        state.seq = seq;
        state.nreqs = nreqs as u8;
        state.taken = 0;
        state.pending = RailMask::NONE;
        state.used = RailMask::NONE;
        Ok(true)
    }

    /// The head's first untaken entry with this tag (NCCL matches tags in order), if the head is
    /// matching and has one.
    #[inline]
    pub fn match_send(&self, tag: u32, size: u64) -> Option<Match> {
        if self.head() != Head::Matching {
            return None;
        }
        let slot = slot_of(self.fifo_head);
        let state = &self.slots[slot];
        let entry = match_tag(state.entries(), state.taken, tag)?;
        Some(Match {
            slot,
            entry,
            size: size.min(state.entries[entry].size),
        })
    }

    /// The send behind `matched` took its entry (`buffer.size` is `matched.size`). `Ok(true)`
    /// when that was the slot's last entry: the slot waits to be posted and the fifo head moves
    /// to the next sequence.
    #[inline]
    pub fn take(&mut self, matched: Match, buffer: SendBuffer) -> Result<bool, SendSlotError> {
        if self.head() != Head::Matching || slot_of(self.fifo_head) != matched.slot {
            return Err(SendSlotError::Invariant(
                "a send takes an entry of the head's CTS",
            ));
        }
        let state = &mut self.slots[matched.slot];
        let bit = 1u8 << matched.entry;
        if matched.entry >= state.nreqs as usize || state.taken & bit != 0 {
            return Err(SendSlotError::Invariant("an entry is taken once"));
        }
        state.taken |= bit;
        state.buffers[matched.entry] = buffer;
        if state.taken.count_ones() < u32::from(state.nreqs) {
            return Ok(false);
        }
        state.phase = Phase::Posting;
        self.fifo_head += 1;
        Ok(true)
    }

    /// The slot to post next, in fifo order, if it is fully matched.
    #[inline]
    pub fn next_to_post(&self) -> Option<usize> {
        if self.post_head >= self.fifo_head {
            return None;
        }
        let slot = slot_of(self.post_head);
        (self.slots[slot].phase == Phase::Posting).then_some(slot)
    }

    /// The slot from [`SendSlots::next_to_post`] was posted at `now` on the rails of `mask`.
    #[inline]
    pub fn posted(&mut self, slot: usize, mask: RailMask, now: u64) -> Result<(), SendSlotError> {
        if self.next_to_post() != Some(slot) {
            return Err(SendSlotError::Invariant("slots are posted in fifo order"));
        }
        if mask.is_empty() {
            return Err(SendSlotError::Invariant("a posted slot uses a rail"));
        }
        if mask.bits() & self.down.bits() != 0 {
            return Err(SendSlotError::Invariant(
                "nothing is posted on a failed rail",
            ));
        }
        let state = &mut self.slots[slot];
        state.phase = Phase::InFlight;
        state.pending = mask;
        state.used = mask;
        state.post_ns = now;
        state.done_ns = [0; 2];
        self.post_head += 1;
        Ok(())
    }

    /// The signalled work request of `slot` on `rail` completed at `now` (on a queue pair, a
    /// slot's first post completes before its replay, which goes on the same queue pair). A
    /// completion on a rail that failed is ignored.
    #[inline]
    pub fn complete(
        &mut self,
        slot: usize,
        rail: Rail,
        now: u64,
    ) -> Result<SendProgress, SendSlotError> {
        let state = self
            .slots
            .get_mut(slot)
            .ok_or(SendSlotError::NotInFlight { slot, rail })?;
        if self.down.contains(rail) {
            // A completion of a failed rail (late, or flushed) says nothing any more: the
            // receiver's report settles what rode it.
            return Ok(SendProgress::RailDone);
        }
        if state.phase != Phase::InFlight {
            return Err(SendSlotError::NotInFlight { slot, rail });
        }
        if state.pending.contains(rail) {
            state.done_ns[rail.index()] = now;
            state.pending = RailMask(state.pending.bits() & !RailMask::of(rail).bits());
        } else if state.replay == Replay::InFlight {
            state.done_ns[rail.index()] = now;
            state.replay = Replay::None;
        } else {
            return Err(SendSlotError::NotInFlight { slot, rail });
        }
        Ok(Self::settle(state))
    }

    /// A slot in flight is done once nothing of it is pending, replay included.
    fn settle(state: &mut SendSlot) -> SendProgress {
        if !state.pending.is_empty() || state.replay != Replay::None {
            return SendProgress::RailDone;
        }
        state.phase = Phase::Idle;
        SendProgress::SlotDone
    }

    /// The rails that failed: nothing is posted on them (the engine splits onto the other).
    #[inline]
    pub const fn down(&self) -> RailMask {
        self.down
    }

    /// `rail` failed on this side (an error completion, or its port went down): nothing more
    /// is posted on it. Returns the notice asking the receiver for its report, `Ok(None)` when
    /// the rail had failed already; fails when the other rail had too.
    pub fn rail_failed(&mut self, rail: Rail) -> Result<Option<FailoverNotice>, SendSlotError> {
        if self.down.contains(rail) {
            return Ok(None);
        }
        let left = RailMask(self.rails.bits() & !self.down.with(rail).bits());
        if left.is_empty() {
            return Err(SendSlotError::NoSurvivor);
        }
        self.down = self.down.with(rail);
        self.unreported = self.unreported.with(rail);
        self.epoch += 1;
        Ok(Some(FailoverNotice {
            epoch: self.epoch,
            failed: rail,
        }))
    }

    /// The receiver's report: every slot in flight that used the failed rail is replayed if
    /// the receiver awaits it, else its part there arrived (and it is done once its part on the
    /// survivor, if any, completes). Returns the slots it made done (their requests are
    /// complete); a report seen before is nothing new.
    pub fn on_report(&mut self, report: &FailoverReport) -> Result<SlotSet, SendSlotError> {
        let mut done = SlotSet::EMPTY;
        if report.epoch <= self.reported {
            return Ok(done);
        }
        self.reported = report.epoch;
        let failed = report.failed;
        if !self.down.contains(failed) {
            self.rail_failed(failed)?;
        }
        self.unreported = self.unreported.without(failed);
        for (slot, state) in self.slots.iter_mut().enumerate() {
            if state.phase != Phase::InFlight || !state.used.contains(failed) {
                continue;
            }
            // Its part on the failed rail completes no more: the report settles it.
            state.pending = RailMask(state.pending.bits() & !RailMask::of(failed).bits());
            // The report names a slot's sequence within the 256 before the receiver's head: an
            // earlier use of the slot still in flight here got its part on the failed rail.
            if report.awaits(state.seq) {
                if state.replay == Replay::None {
                    state.replay = Replay::Needed;
                    self.replays.insert(slot);
                }
            } else if Self::settle(state) == SendProgress::SlotDone {
                done.insert(slot);
            }
        }
        Ok(done)
    }

    /// Whether every failover is over on this side: each failed rail's report taken, and
    /// every transfer that used a failed rail done (its replay included). Only then may a rail
    /// come back (docs/PROTOCOL.md §11): no part of an earlier use can still be on its way.
    pub fn settled(&self) -> bool {
        self.unreported.is_empty()
            && self.replays.is_empty()
            && self.slots.iter().all(|state| {
                state.phase != Phase::InFlight
                    || (state.replay == Replay::None && state.used.bits() & self.down.bits() == 0)
            })
    }

    /// `rail` is back (the receiver took it back and the sender's probes went through on it):
    /// later transfers may use it again. Only once settled ([`SendSlots::settled`]).
    pub fn rail_restored(&mut self, rail: Rail) -> Result<(), SendSlotError> {
        if !self.down.contains(rail) || !self.settled() {
            return Err(SendSlotError::Invariant(
                "a rail comes back only after its failover settled",
            ));
        }
        self.down = self.down.without(rail);
        Ok(())
    }

    /// A slot whose replay is to be posted (whole, on the surviving rail, with the replay's
    /// immediate: `crate::post_plan::plan_on`).
    #[inline]
    pub fn next_replay(&self) -> Option<usize> {
        self.replays.first()
    }

    /// The replay of `slot` was posted.
    pub fn replayed(&mut self, slot: usize) -> Result<(), SendSlotError> {
        let state = &mut self.slots[slot % FIFO_SLOTS];
        if !self.replays.contains(slot) || state.replay != Replay::Needed {
            return Err(SendSlotError::Invariant(
                "a replay is posted once, when needed",
            ));
        }
        self.replays.remove(slot);
        state.replay = Replay::InFlight;
        Ok(())
    }
}

#[cfg(test)]
#[path = "send_slots_tests.rs"]
mod tests;
