//! The connection table: claiming and releasing slots (writer) and reading them (reader).
//!
//! Each slot is an Aeron-style metadata record whose state word is written last. The state
//! word packs `(generation << 32) | state` so that one atomic load tells a reader both whether
//! the slot is in use and which occupant it holds:
//!
//! * claim (any thread, not the hot path): CAS the word from `UNUSED`, or from `CLOSED` once
//!   the slot has lingered [`REUSE_LINGER_NS`], to `(generation + 1, CLAIMING)`; raise the
//!   header's high-water mark past the slot; release fence; write the attributes and zero the
//!   byte counters; store `(generation + 1, ACTIVE)` with Release.
//! * which slot: the writer's bookkeeping says ([`crate::claims`]): the oldest closed slot
//!   once it has lingered, else the next never used; the slots in use stay below the most that
//!   were open at once plus those lingering, and a claim costs the same whatever the table holds.
//! * close: store `closed_ns`, then `(generation, CLOSED)` with Release, then hand the slot to
//!   the writer's bookkeeping. The slot keeps its final counters for the collector until it is
//!   reused.
//! * read: load the word; skip `UNUSED`/`CLAIMING`; copy the fields; acquire fence; reload the
//!   word and retry if it changed (a seqlock whose "odd" value is `CLAIMING`, with the
//!   generation making every claim a new value). The byte counters keep changing while the
//!   slot is `ACTIVE`; they are single-writer monotonic words, each read atomically.

use std::net::{Ipv4Addr, SocketAddrV4};

use crate::claims::{Candidate, FreeSlots};
use crate::counters::bump;
use crate::layout::{ConnSlot, MAX_RAILS};
use crate::operation::Operation;
use crate::sync::{fence, spin_hint, AtomicU32, Ordering};
use crate::types::{now_ns, ConnectionInfo, Direction, Mode, PathClass, NO_CONNECTION};
use crate::writer::DUMMY;

/// Never claimed.
const UNUSED: u32 = 0;
/// In use.
const ACTIVE: u32 = 1;
/// Closed; final counters kept until reuse.
const CLOSED: u32 = 2;
/// Being (re)initialised by a claimer.
const CLAIMING: u32 = 3;

/// How long a closed slot keeps its final values before it may be reused (so a collector
/// polling every second or so sees every connection's last counters).
pub const REUSE_LINGER_NS: u64 = 5_000_000_000;

/// Reader retries before giving a slot up for this snapshot.
const READ_TRIES: usize = 64;

const fn word(generation: u32, state: u32) -> u64 {
    ((generation as u64) << 32) | state as u64
}

const fn split(word: u64) -> (u32, u32) {
    ((word >> 32) as u32, word as u32)
}

/// State of a connection slot as seen by a reader.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnectionState {
    /// The connection is open.
    Active,
    /// The connection was closed; the values are final.
    Closed,
}

/// A reader's copy of one connection slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionSnapshot {
    /// Slot index (what events carry as `conn_index`).
    pub index: u32,
    /// Claim generation of the slot: changes each time the slot gets a new connection.
    pub generation: u32,
    /// Open or closed.
    pub state: ConnectionState,
    /// The claimed attributes.
    pub info: ConnectionInfo,
    /// When the slot was claimed, ns since the Unix epoch.
    pub opened_ns: u64,
    /// When it was closed (0 while active), ns since the Unix epoch.
    pub closed_ns: u64,
    /// Bytes moved per rail (counted when posted).
    pub rail_bytes: [u64; MAX_RAILS],
    /// Time each rail had a part of this connection in flight, ns.
    pub rail_busy_ns: [u64; MAX_RAILS],
    /// Bytes per rail whose completion was seen.
    pub rail_done_bytes: [u64; MAX_RAILS],
    /// Parts in flight on each rail when read (always 0 in files older than 2.2).
    pub rail_in_flight: [u32; MAX_RAILS],
    /// What NCCL last said about its operations (nothing in files older than 3.2).
    pub operation: Operation,
    /// Bit per rail (`1 << rail`) that failed over: the connection runs on the others alone
    /// (always 0 in files older than 3.3).
    pub rails_down: u8,
    /// When its first failover happened, ns since the Unix epoch (0: none).
    pub failed_over_ns: u64,
}

/// What a sampler needs of an active connection, read without the seqlock's retries (a sample
/// taken while the slot changes occupant is one sample of many).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InFlightSample {
    /// Send or receive.
    pub direction: Direction,
    /// Vanilla or advanced.
    pub mode: Mode,
    /// The connection's agent hint slot.
    pub hint_slot: u32,
    /// The fused device it uses.
    pub device: u8,
    /// Whether each rail has at least one of its parts in flight.
    pub busy: [bool; MAX_RAILS],
}

/// Writer handle for one connection's slot. Releases the slot (state `CLOSED`) when dropped
/// or [`close`](ConnectionProbe::close)d. Single writer: the thread that moves the
/// connection's data updates its byte counters.
pub struct ConnectionProbe<'a> {
    slot: &'a ConnSlot,
    index: u32,
    generation: u32,
    /// The writer's free slots, which take this one back at close (`None`: disabled).
    free: Option<&'a FreeSlots>,
}

impl<'a> ConnectionProbe<'a> {
    /// A handle that records nothing anyone reads (its index is `NO_CONNECTION`).
    pub fn disabled() -> ConnectionProbe<'static> {
        ConnectionProbe {
            slot: &DUMMY.conns[0],
            index: NO_CONNECTION,
            generation: 0,
            free: None,
        }
    }

    /// The slot index, to put in `SlowTransfer::conn_index`.
    #[inline]
    pub fn index(&self) -> u32 {
        self.index
    }

    /// Add `n` bytes moved on rail `rail` (0 = SOUT, 1 = SUP; other values are ignored).
    #[inline]
    pub fn add_rail_bytes(&self, rail: usize, n: u64) {
        if let Some(counter) = self.slot.rail_bytes.get(rail) {
            bump(counter, n, false);
        }
    }

    /// Add a transfer's per-rail split.
    #[inline]
    pub fn add_split(&self, bytes: [u64; MAX_RAILS]) {
        for (counter, n) in self.slot.rail_bytes.iter().zip(bytes) {
            bump(counter, n, false);
        }
    }

    /// A part of `bytes` on `rail` completed after the rail had been busy for `busy_ns` more
    /// (time with at least one part in flight since the previous completion or first post).
    #[inline]
    pub fn add_rail_done(&self, rail: usize, bytes: u64, busy_ns: u64) {
        if let (Some(done), Some(busy)) = (
            self.slot.rail_done_bytes.get(rail),
            self.slot.rail_busy_ns.get(rail),
        ) {
            bump(done, bytes, false);
            bump(busy, busy_ns, false);
        }
    }

    /// Publish the number of parts in flight on `rail` (after a post or a completion changed it).
    #[inline]
    pub fn set_rail_in_flight(&self, rail: usize, parts: u32) {
        if let Some(word) = self.slot.rail_in_flight.get(rail) {
            word.store(parts, Ordering::Relaxed);
        }
    }

    /// Publish what NCCL says about the connection's operations now: a word from
    /// [`Operation::encode`].
    #[inline]
    pub fn set_operation(&self, word: u64) {
        self.slot.operation.store(word, Ordering::Relaxed);
    }

    /// Publish that `rail` failed over (the connection goes on over the other rail alone); the
    /// first failover's time is kept.
    #[inline]
    pub fn rail_failed(&self, rail: usize) {
        let Some(bit) = u8::try_from(rail)
            .ok()
            .and_then(|r| 1u8.checked_shl(u32::from(r)))
        else {
            return;
        };
        if self.slot.failed_over_ns.load(Ordering::Relaxed) == 0 {
            self.slot.failed_over_ns.store(now_ns(), Ordering::Relaxed);
        }
        self.slot.rails_down.fetch_or(bit, Ordering::Relaxed);
    }

    /// Publish that `rail` is back: the connection splits over it again (the first failover's
    /// time stays: the slot's history, not its state).
    #[inline]
    pub fn rail_restored(&self, rail: usize) {
        let Some(bit) = u8::try_from(rail)
            .ok()
            .and_then(|r| 1u8.checked_shl(u32::from(r)))
        else {
            return;
        };
        self.slot.rails_down.fetch_and(!bit, Ordering::Relaxed);
    }

    /// Release the slot now (the same as dropping the handle).
    pub fn close(self) {}
}

impl Drop for ConnectionProbe<'_> {
    fn drop(&mut self) {
        let closed_ns = now_ns();
        self.slot.closed_ns.store(closed_ns, Ordering::Relaxed);
        // SYNC: pairs with the Relaxed load + fence(Acquire) in `read_slot`: a reader that sees
        // CLOSED sees `closed_ns` and the final byte counts.
        let closed = word(self.generation, CLOSED);
        self.slot.state.store(closed, Ordering::Release);
        if let Some(free) = self.free {
            free.closed(self.index, closed_ns);
        }
    }
}

impl std::fmt::Debug for ConnectionProbe<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectionProbe")
            .field("index", &self.index)
            .field("generation", &self.generation)
            .finish_non_exhaustive()
    }
}

/// The connection table as a claim sees it.
pub(crate) struct ClaimTable<'a> {
    /// The slots, in the file.
    pub(crate) slots: &'a [ConnSlot],
    /// The writer's free slots (process memory).
    pub(crate) free: &'a FreeSlots,
    /// The header's mark: one past the highest slot ever claimed.
    pub(crate) high_water: &'a AtomicU32,
}

/// Claim the slot the writer's bookkeeping gives for `info`; `None` when every slot is active
/// or closed too recently. Safe to call from any thread: the bookkeeping hands each slot to one
/// claimer, and the claim is a CAS on the slot's state.
pub(crate) fn claim<'a>(
    table: &ClaimTable<'a>,
    info: &ConnectionInfo,
) -> Option<ConnectionProbe<'a>> {
    let now = now_ns();
    let count = u32::try_from(table.slots.len()).unwrap_or(u32::MAX);
    while let Some(candidate) = table.free.take(now, REUSE_LINGER_NS, count) {
        let index = candidate.index();
        let Some(slot) = table.slots.get(index as usize) else {
            continue;
        };
        let current = slot.state.load(Ordering::Relaxed);
        let (generation, state) = split(current);
        let expected = match candidate {
            Candidate::Fresh(_) => UNUSED,
            Candidate::Lingered(_) => CLOSED,
        };
        // Only this writer changes the states (and the bookkeeping saw the close, so a CLOSED
        // slot it gives has lingered): this holds; a slot that disagrees is left out.
        if state != expected {
            continue;
        }
        let next = generation.wrapping_add(1).max(1);
        // Acquire: we take the slot over after its previous owner's last stores.
        let won = slot.state.compare_exchange(
            current,
            word(next, CLAIMING),
            Ordering::Acquire,
            Ordering::Relaxed,
        );
        if won.is_err() {
            continue;
        }
        // SYNC: none needed: a reader that loads an older mark misses this slot for one read
        // only, and the mark never falls, so Relaxed.
        table.high_water.fetch_max(index + 1, Ordering::Relaxed);
        // SYNC: pairs with the fence(Acquire) before the second state load in `read_slot`: a
        // reader whose copy saw any field stored below sees CLAIMING (or later) on reload.
        fence(Ordering::Release);
        write_fields(slot, info, now);
        // SYNC: pairs with the Relaxed load + fence(Acquire) at the start of `read_slot`.
        slot.state.store(word(next, ACTIVE), Ordering::Release);
        return Some(ConnectionProbe {
            slot,
            index,
            generation: next,
            free: Some(table.free),
        });
    }
    None
}

fn write_fields(slot: &ConnSlot, info: &ConnectionInfo, now: u64) {
    let relaxed = Ordering::Relaxed;
    slot.peer_ipv4.store(u32::from(*info.peer.ip()), relaxed);
    slot.peer_port.store(info.peer.port(), relaxed);
    slot.direction.store(info.direction.code(), relaxed);
    slot.path_class.store(info.path_class.code(), relaxed);
    slot.mode.store(info.mode.code(), relaxed);
    slot.device.store(info.device, relaxed);
    slot.hint_slot.store(info.hint_slot, relaxed);
    slot.opened_ns.store(now, relaxed);
    slot.closed_ns.store(0, relaxed);
    let counters = slot.rail_bytes.iter().chain(&slot.rail_busy_ns);
    for counter in counters.chain(&slot.rail_done_bytes) {
        counter.store(0, relaxed);
    }
    for parts in &slot.rail_in_flight {
        parts.store(0, relaxed);
    }
    slot.operation.store(0, relaxed);
    slot.rails_down.store(0, relaxed);
    slot.failed_over_ns.store(0, relaxed);
}

/// The slot's in-flight state if it holds an active connection.
pub(crate) fn sample_slot(slot: &ConnSlot) -> Option<InFlightSample> {
    let relaxed = Ordering::Relaxed;
    let (_, state) = split(slot.state.load(Ordering::Acquire));
    (state == ACTIVE).then(|| InFlightSample {
        direction: Direction::from_code(slot.direction.load(relaxed)),
        mode: Mode::from_code(slot.mode.load(relaxed)),
        hint_slot: slot.hint_slot.load(relaxed),
        device: slot.device.load(relaxed),
        busy: core::array::from_fn(|r| slot.rail_in_flight[r].load(relaxed) > 0),
    })
}

/// Read slot `index` consistently; `None` if it is unused, being claimed, or kept changing
/// occupant for the whole retry budget.
pub(crate) fn read_slot(slot: &ConnSlot, index: u32) -> Option<ConnectionSnapshot> {
    for _ in 0..READ_TRIES {
        let before = slot.state.load(Ordering::Relaxed);
        // SYNC: pairs with the Release stores of ACTIVE (claim) and CLOSED (drop).
        fence(Ordering::Acquire);
        let (generation, state) = split(before);
        let state = match state {
            ACTIVE => ConnectionState::Active,
            CLOSED => ConnectionState::Closed,
            UNUSED => return None,
            _ => {
                spin_hint();
                continue;
            }
        };
        let snapshot = copy_fields(slot, index, generation, state);
        // SYNC: pairs with the fence(Release) after the claim CAS.
        fence(Ordering::Acquire);
        if slot.state.load(Ordering::Relaxed) == before {
            return Some(snapshot);
        }
    }
    None
}

fn copy_fields(
    slot: &ConnSlot,
    index: u32,
    generation: u32,
    state: ConnectionState,
) -> ConnectionSnapshot {
    let relaxed = Ordering::Relaxed;
    let ip = Ipv4Addr::from(slot.peer_ipv4.load(relaxed));
    ConnectionSnapshot {
        index,
        generation,
        state,
        info: ConnectionInfo {
            peer: SocketAddrV4::new(ip, slot.peer_port.load(relaxed)),
            direction: Direction::from_code(slot.direction.load(relaxed)),
            path_class: PathClass::from_code(slot.path_class.load(relaxed)),
            mode: Mode::from_code(slot.mode.load(relaxed)),
            hint_slot: slot.hint_slot.load(relaxed),
            device: slot.device.load(relaxed),
        },
        opened_ns: slot.opened_ns.load(relaxed),
        closed_ns: slot.closed_ns.load(relaxed),
        rail_bytes: core::array::from_fn(|r| slot.rail_bytes[r].load(relaxed)),
        rail_busy_ns: core::array::from_fn(|r| slot.rail_busy_ns[r].load(relaxed)),
        rail_done_bytes: core::array::from_fn(|r| slot.rail_done_bytes[r].load(relaxed)),
        rail_in_flight: core::array::from_fn(|r| slot.rail_in_flight[r].load(relaxed)),
        operation: Operation::decode(slot.operation.load(relaxed)),
        rails_down: slot.rails_down.load(relaxed),
        failed_over_ns: slot.failed_over_ns.load(relaxed),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    struct Table {
        slots: Vec<ConnSlot>,
        free: FreeSlots,
        high_water: AtomicU32,
    }

    impl Table {
        fn claim(&self, info: &ConnectionInfo) -> Option<ConnectionProbe<'_>> {
            let table = ClaimTable {
                slots: &self.slots,
                free: &self.free,
                high_water: &self.high_water,
            };
            claim(&table, info)
        }

        fn mark(&self) -> u32 {
            self.high_water.load(Ordering::Relaxed)
        }

        /// Ages every closed slot's close past the linger time, in the file and in the
        /// writer's bookkeeping, keeping their order.
        fn age(&self) {
            let mut closed = Vec::new();
            while let Some(candidate) = self.free.take(u64::MAX, 0, 0) {
                closed.push(candidate.index());
            }
            for index in closed {
                self.slots[index as usize]
                    .closed_ns
                    .store(1, Ordering::Relaxed);
                self.free.closed(index, 1);
            }
        }
    }

    fn table(n: usize) -> Table {
        Table {
            // SAFETY: all-zero bytes are a valid ConnSlot (atomics and byte arrays): UNUSED.
            slots: (0..n).map(|_| unsafe { std::mem::zeroed() }).collect(),
            free: FreeSlots::default(),
            high_water: AtomicU32::new(0),
        }
    }

    fn info(port: u16) -> ConnectionInfo {
        ConnectionInfo {
            peer: SocketAddrV4::new(Ipv4Addr::new(192, 0, 2, 7), port),
            direction: Direction::Send,
            path_class: PathClass::InterIsland,
            mode: Mode::Advanced,
            hint_slot: 3,
            device: 0,
        }
    }

    #[test]
    fn claim_fill_and_release() {
        let t = table(2);
        let a = t.claim(&info(1)).unwrap();
        let b = t.claim(&info(2)).unwrap();
        assert_eq!((a.index(), b.index()), (0, 1));
        assert!(t.claim(&info(3)).is_none(), "table full");
        a.add_split([5, 7]);
        a.add_rail_bytes(1, 1);
        a.add_rail_bytes(9, 1000); // ignored
        a.add_rail_done(1, 8, 300);
        a.add_rail_done(7, 8, 300); // ignored
        let s = read_slot(&t.slots[0], 0).unwrap();
        assert_eq!(
            (s.state, s.generation, s.info),
            (ConnectionState::Active, 1, info(1))
        );
        assert_eq!((s.rail_bytes, s.closed_ns), ([5, 8], 0));
        assert_eq!((s.rail_done_bytes, s.rail_busy_ns), ([0, 8], [0, 300]));
        a.close();
        let s = read_slot(&t.slots[0], 0).unwrap();
        assert_eq!(s.state, ConnectionState::Closed);
        assert!(s.closed_ns >= s.opened_ns && s.closed_ns > 0);
        assert_eq!(s.rail_bytes, [5, 8], "final values kept after close");
        assert!(
            t.claim(&info(3)).is_none(),
            "a closed slot lingers before reuse"
        );
        // Age the closed slot past the linger time: it is reused with a new generation.
        t.age();
        let c = t.claim(&info(3)).unwrap();
        let s = read_slot(&t.slots[0], c.index()).unwrap();
        assert_eq!(
            (s.generation, s.info.peer.port(), s.rail_bytes),
            (2, 3, [0, 0])
        );
        drop(b);
        assert_eq!(
            read_slot(&t.slots[1], 1).unwrap().state,
            ConnectionState::Closed
        );
        assert!(
            read_slot(&table(1).slots[0], 0).is_none(),
            "an unused slot reads as none"
        );
    }

    #[test]
    fn claiming_slot_is_neither_read_nor_claimed() {
        let t = table(1);
        t.slots[0].state.store(word(4, CLAIMING), Ordering::Relaxed);
        assert!(read_slot(&t.slots[0], 0).is_none());
        assert!(t.claim(&info(1)).is_none());
    }

    #[test]
    fn disabled_connection_probe_is_inert() {
        let p = ConnectionProbe::disabled();
        assert_eq!(p.index(), NO_CONNECTION);
        p.add_split([1, 2]);
        p.close();
    }

    #[test]
    fn closed_slots_are_reused_once_lingered_and_the_mark_follows_the_most_open_at_once() {
        let t = table(8);
        let probes: Vec<_> = (0..5).map(|p| t.claim(&info(p)).unwrap()).collect();
        assert_eq!(t.mark(), 5);
        let [a, b, c, d, e] = probes.try_into().unwrap();
        drop(d);
        drop(b);
        // Both still linger: the next claim takes a slot never used.
        let f = t.claim(&info(6)).unwrap();
        assert_eq!((f.index(), t.mark()), (5, 6));
        // Aged past the linger time: the slot that closed first is reused first, and reuse
        // does not raise the mark.
        t.age();
        let reused: Vec<u32> = (0..2).map(|p| t.claim(&info(p)).unwrap().index()).collect();
        assert_eq!(reused, [3, 1]);
        assert_eq!(t.mark(), 6);
        drop((a, c, e, f));
    }
}
