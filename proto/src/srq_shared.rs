//! The accounting of one shared receive queue that many receive connections of a rail use
//! (docs/PROTOCOL.md §8, "Receives shared per rail").
//!
//! Why: a queue per connection keeps a connection's worth of receives posted whether or not it
//! receives anything (512 per rail by default), and costs a NIC object each. Shared, the queue
//! holds receives for what the connections have outstanding, and a NIC serves thousands of
//! connections with a few queues, as the seed's SRQ design intends ("one SRQ per device context,
//! all QPs of that device share it").
//!
//! How the RNR-free guarantee survives sharing: each member *holds* receives granted to it from
//! the ledger and posts a receive (CTS) only for slots its holding covers; the IMM of any member
//! consumes a receive of the shared queue but is counted against the member's own holding. The
//! queue therefore always has a receive for every IMM that can still arrive, whoever sends it.
//!
//! * **Floor.** Each member may always hold [`SharedSrqLedger::floor`] receives: a connection
//!   that holds a few receives always gets to post, so none waits on receives other connections
//!   hold while their data waits on it. Beyond its floor a member borrows from what no floor
//!   reserves; a connection joins only while every floor, its own too, fits beside what is
//!   borrowed, and the floors in half the capacity.
//! * **Consumption is settled late.** A member counts its IMMs itself, and tells the ledger
//!   ([`SharedSrqLedger::settle`]) when it takes or gives back receives and every few dozen IMMs,
//!   so the hot path touches nothing shared.
//! * **Leaving.** A member that leaves with receives outstanding cannot know whether their IMMs
//!   consumed receives before its queue pairs were destroyed; those are written off as *lost*
//!   (the queue may still hold them). The queue is created twice as deep as its capacity (less
//!   one), so lost receives never make a post overflow it; once a quarter of the capacity is
//!   lost the ledger admits no one new, and its queue goes with its last member.
//!
//! Pure: the engine posts the receives and keeps the lock; this only counts.

use std::fmt;

/// Receives each member may always hold: a channel's whole pipeline (NCCL's proxy keeps at most
/// `NCCL_STEPS`, 8 in NCCL's `device.h`, receives of a channel in flight; a comm several
/// channels share may keep up to 32 and borrows the rest). Any floor above zero is what keeps
/// connections that share a queue live: receives already advertised complete without further
/// ones, so a connection always gets to advertise again.
pub const SHARED_SRQ_FLOOR: u32 = 8;

/// Largest capacity of one shared queue (receives granted at once; 128 connections' floors in its
/// half). The queue is created twice as deep, which a ConnectX (`max_srq_wr` 32,767) and
/// Soft-RoCE (16,384) both allow. Its ring is the fixed cost of a NIC's first receive connection:
/// on Soft-RoCE, 8,192-receive queues cost a one-pair process 4 MB more than 512-receive queues of
/// its own (measured, docs/PERFORMANCE.md), so queues are kept to a quarter of that.
pub const SHARED_SRQ_CAPACITY: u32 = 2_048;

/// Why a connection cannot join a ledger.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JoinRefused {
    /// The floors of its members already take half the capacity.
    Full {
        /// Members now.
        members: u32,
    },
    /// A quarter of the capacity was written off by members that left with receives
    /// outstanding.
    Retired {
        /// Receives written off.
        lost: u32,
    },
}

impl fmt::Display for JoinRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JoinRefused::Full { members } => {
                write!(
                    f,
                    "the shared receive queue's {members} connections hold or reserve all it has"
                )
            }
            JoinRefused::Retired { lost } => write!(
                f,
                "the shared receive queue wrote off {lost} receives (connections closed with \
                 receives outstanding, or a peer that broke the protocol)"
            ),
        }
    }
}

impl std::error::Error for JoinRefused {}

/// What a take granted, and what the engine must post first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Granted {
    /// Receives added to the member's holding (at most what it asked for).
    pub receives: u32,
    /// Receives the engine posts on the queue before the member uses the grant; report them with
    /// [`SharedSrqLedger::on_posted`].
    pub post: u32,
}

/// The counts of one shared receive queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SharedSrqLedger {
    capacity: u32,
    floor: u32,
    spare: u32,
    members: u32,
    /// Receives posted and not known to be consumed.
    posted: u32,
    /// What the members hold, as they last settled.
    granted: u32,
    /// The part of `granted` above the members' floors.
    borrowed: u32,
    /// Receives written off by members that left with receives outstanding.
    lost: u32,
}

impl SharedSrqLedger {
    /// A ledger for a queue of `capacity` receives (at least 2 floors); each member may always
    /// hold `floor`. The queue itself must be [`SharedSrqLedger::depth`] deep.
    pub fn new(capacity: u32, floor: u32) -> SharedSrqLedger {
        let floor = floor.max(1);
        let capacity = capacity.max(2 * floor);
        SharedSrqLedger {
            capacity,
            floor,
            // Posting tops up past what is granted by this much, so that most takes post nothing.
            spare: (capacity / 16).max(floor),
            members: 0,
            posted: 0,
            granted: 0,
            borrowed: 0,
            lost: 0,
        }
    }

    /// Depth to create the queue with: lost receives may still sit in it beside `capacity`.
    /// One less than twice the capacity, as providers round `depth + 1` up to a power of two
    /// for their rings (rxe, mlx5): twice a power-of-two capacity would double the ring.
    pub const fn depth(&self) -> u32 {
        self.capacity.saturating_mul(2).saturating_sub(1)
    }

    /// Receives a member beyond its floor could still borrow (the telemetry's queue depth: near
    /// zero, connections past their floors wait on the queue).
    pub fn room(&self) -> u32 {
        let borrowable = self
            .capacity
            .saturating_sub(self.members.saturating_mul(self.floor))
            .saturating_sub(self.borrowed);
        self.usable().saturating_sub(self.granted).min(borrowable)
    }

    /// Receives granted at most at once.
    pub const fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Receives each member may always hold.
    pub const fn floor(&self) -> u32 {
        self.floor
    }

    /// Connections using the queue.
    pub const fn members(&self) -> u32 {
        self.members
    }

    /// Receives posted and not known to be consumed.
    pub const fn posted(&self) -> u32 {
        self.posted
    }

    /// Receives the members hold (as they last settled).
    pub const fn granted(&self) -> u32 {
        self.granted
    }

    /// Receives written off at leaving.
    pub const fn lost(&self) -> u32 {
        self.lost
    }

    /// Connections the queue admits at most: every floor in half its capacity (the other half
    /// absorbs what leaving members write off).
    pub const fn most_members(&self) -> u32 {
        (self.capacity / 2) / self.floor
    }

    /// Adds a member, or says why not (the engine then uses another queue).
    pub fn join(&mut self) -> Result<(), JoinRefused> {
        if self.lost >= self.capacity / 4 {
            return Err(JoinRefused::Retired { lost: self.lost });
        }
        // Every floor, the new one's too, must fit beside what is borrowed.
        let floors = (self.members + 1).saturating_mul(self.floor);
        if self.members >= self.most_members()
            || floors.saturating_add(self.borrowed) > self.capacity
        {
            return Err(JoinRefused::Full {
                members: self.members,
            });
        }
        self.members += 1;
        Ok(())
    }

    /// A member that held `settled` at its last call now holds `holding` (its IMMs consumed the
    /// rest): those receives left the queue.
    pub fn settle(&mut self, settled: u32, holding: u32) {
        let consumed = settled.saturating_sub(holding);
        self.posted = self.posted.saturating_sub(consumed);
        self.granted = self.granted.saturating_sub(consumed);
        self.borrowed = self
            .borrowed
            .saturating_sub(self.above_floor(settled) - self.above_floor(holding));
    }

    /// A member holding `holding` (settled) asks for `want` more: grants what its floor and the
    /// unreserved capacity allow.
    pub fn take(&mut self, holding: u32, want: u32) -> Granted {
        let floor_room = self.floor.saturating_sub(holding);
        let reserved = self.members.saturating_mul(self.floor);
        let borrow_room = self
            .capacity
            .saturating_sub(reserved)
            .saturating_sub(self.borrowed);
        let usable = self.usable();
        let receives = want
            .min(floor_room.saturating_add(borrow_room))
            .min(usable.saturating_sub(self.granted));
        self.borrowed +=
            self.above_floor(holding.saturating_add(receives)) - self.above_floor(holding);
        self.granted += receives;
        let post = if self.posted < self.granted {
            (self.granted + self.spare).min(usable) - self.posted
        } else {
            0
        };
        Granted { receives, post }
    }

    /// `n` receives were posted (fewer than a take asked for when the post failed part way: the
    /// engine then fails the connection).
    pub fn on_posted(&mut self, n: u32) {
        self.posted = self.posted.saturating_add(n);
    }

    /// A post of `n` receives failed part way: as many may sit in the queue uncounted.
    pub fn write_off(&mut self, n: u32) {
        self.lost = self.lost.saturating_add(n);
    }

    /// An IMM consumed a receive its member did not hold (a peer that broke the protocol): the
    /// receive is gone from the queue without a grant.
    pub fn consumed_unheld(&mut self) {
        self.posted = self.posted.saturating_sub(1);
    }

    /// A member's peer broke the protocol: its connection fails and its QPs go, but IMMs of
    /// that peer may already have taken receives unseen. Returns how many receives the engine
    /// posts beyond the count to stand in for them (a quarter of the capacity, as the depth
    /// allows); they are counted as lost, and the queue admits no one new and goes with its
    /// last member.
    pub fn quarantine(&mut self) -> u32 {
        let free = self
            .depth()
            .saturating_sub(self.posted.saturating_add(self.lost));
        let spare = (self.capacity / 4).min(free);
        self.lost = self.lost.saturating_add(spare).max(self.capacity / 4);
        spare
    }

    /// A member holding `holding` (settled) gives `n` back.
    pub fn give_back(&mut self, holding: u32, n: u32) {
        let n = n.min(holding);
        self.borrowed = self
            .borrowed
            .saturating_sub(self.above_floor(holding) - self.above_floor(holding - n));
        self.granted = self.granted.saturating_sub(n);
    }

    /// A member holding `holding` (settled) left after its queue pairs were destroyed, with
    /// `outstanding` receives whose IMMs may have consumed a receive unseen: those are lost, the
    /// rest of its holding returns.
    pub fn leave(&mut self, holding: u32, outstanding: u32) {
        let unknown = outstanding.min(holding);
        self.give_back(holding, holding);
        self.posted = self.posted.saturating_sub(unknown);
        self.lost = self.lost.saturating_add(unknown);
        self.members = self.members.saturating_sub(1);
    }

    /// Receives the queue can be counted on to take: its capacity, less what lost receives may
    /// occupy beyond the spare depth.
    fn usable(&self) -> u32 {
        self.capacity.min(self.depth().saturating_sub(self.lost))
    }

    fn above_floor(&self, holding: u32) -> u32 {
        holding.saturating_sub(self.floor)
    }
}

#[cfg(test)]
#[path = "srq_shared_tests.rs"]
mod tests;
