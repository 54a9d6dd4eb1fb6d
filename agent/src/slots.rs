//! Flows and their hint slots: one slot per SOUT (source, destination) pair, shared by every
//! connection of that pair, freed when its last connection goes. Pure bookkeeping, no I/O.
//!
//! Why per pair: a share belongs to the flow, not the connection (every connection between the
//! same two SOUT addresses crosses the same rails; docs/AGENT.md, 'What it does'), and 256 slots
//! would not last one job's connections otherwise. Connections are keyed by the registering
//! process (its pid from the socket's peer credentials, with the process start time so that a
//! reused pid is not mistaken for the owner) and the plugin's `conn_id`, whose pid bits are
//! truncated to 16.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use mpib_proto::hint::HINT_MAX_ENTRIES;

/// The process behind a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Process {
    /// Its pid.
    pub pid: u32,
    /// Its start time (clock ticks since boot, `/proc/PID/stat` field 22), 0 when unknown.
    pub start_ticks: u64,
    /// Its user (from the socket's peer credentials): whose probes files describe its flows.
    pub uid: u32,
}

/// One registered connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConnectionKey {
    /// The registering process.
    pub process: Process,
    /// The plugin's `conn_id`.
    pub conn_id: u32,
}

/// A SOUT address pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Pair {
    /// SOUT source.
    pub src: Ipv4Addr,
    /// SOUT destination.
    pub dst: Ipv4Addr,
}

impl std::fmt::Display for Pair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}->{}", self.src, self.dst)
    }
}

/// A flow holding a slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Flow {
    /// Its slot in the hint file.
    pub slot: u32,
    /// Its SOUT pair.
    pub pair: Pair,
    /// The SUP pair of the latest registration (unspecified for a flow taken back on restart).
    pub sup: Pair,
    /// Its registered connections; empty for a flow taken back from the file after a restart.
    pub connections: BTreeSet<ConnectionKey>,
    /// Taken back from the file after a restart, not (yet) re-registered.
    pub recovered: bool,
}

/// What a registration did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Registered {
    /// A new flow got `slot`.
    NewFlow(u32),
    /// The connection joined the existing flow in `slot`.
    Joined(u32),
}

impl Registered {
    /// The slot either way.
    pub fn slot(self) -> u32 {
        match self {
            Registered::NewFlow(slot) | Registered::Joined(slot) => slot,
        }
    }
}

/// Connections one process may hold registered: the plugin's `conn_id` counter is 16 bits, so
/// a well-behaved process never has more live at once; a client past it is refused rather than
/// allowed to grow the table without bound.
pub const MAX_CONNECTIONS_PER_PROCESS: usize = 1 << 16;

/// Every slot's flow.
#[derive(Clone, Debug)]
pub struct SlotTable {
    flows: BTreeMap<u32, Flow>,
    by_pair: BTreeMap<Pair, u32>,
    /// Ordered by process then `conn_id`: a process's connections are one range.
    by_connection: BTreeMap<ConnectionKey, u32>,
    per_process: BTreeMap<Process, usize>,
    /// Slots freed as a side effect of a registration (a key moved to another pair), for the
    /// caller to clear ([`SlotTable::take_freed`]).
    freed: Vec<u32>,
    capacity: usize,
}

impl Default for SlotTable {
    fn default() -> Self {
        SlotTable::new(HINT_MAX_ENTRIES)
    }
}

impl SlotTable {
    /// A table of `capacity` slots (at most the file's 256).
    pub fn new(capacity: usize) -> SlotTable {
        SlotTable {
            flows: BTreeMap::new(),
            by_pair: BTreeMap::new(),
            by_connection: BTreeMap::new(),
            per_process: BTreeMap::new(),
            freed: Vec::new(),
            capacity: capacity.min(HINT_MAX_ENTRIES),
        }
    }

    /// Takes back a flow found in the file after a restart; false when the slot is out of range
    /// or its pair already has a slot (the entry is then stale).
    pub fn recover(&mut self, slot: u32, pair: Pair) -> bool {
        if (slot as usize) >= self.capacity || self.by_pair.contains_key(&pair) {
            return false;
        }
        self.by_pair.insert(pair, slot);
        let unspecified = Pair {
            src: Ipv4Addr::UNSPECIFIED,
            dst: Ipv4Addr::UNSPECIFIED,
        };
        self.flows.insert(
            slot,
            Flow {
                slot,
                pair,
                sup: unspecified,
                connections: BTreeSet::new(),
                recovered: true,
            },
        );
        true
    }

    /// Registers a connection of `pair`; `None` when every slot is taken by another pair or the
    /// process holds [`MAX_CONNECTIONS_PER_PROCESS`]. Registering a key again on the same pair
    /// keeps it; on another pair moves it (a slot freed so is in [`SlotTable::take_freed`]).
    pub fn register(&mut self, key: ConnectionKey, pair: Pair, sup: Pair) -> Option<Registered> {
        match self.by_connection.get(&key) {
            Some(slot) if self.flows.get(slot).is_some_and(|f| f.pair == pair) => {
                return Some(Registered::Joined(*slot));
            }
            Some(_) => {
                if let Some((slot, true)) = self.deregister(key) {
                    self.freed.push(slot);
                }
            }
            None => {}
        }
        if self.per_process.get(&key.process).copied().unwrap_or(0) >= MAX_CONNECTIONS_PER_PROCESS {
            return None;
        }
        if let Some(&slot) = self.by_pair.get(&pair) {
            let flow = self.flows.get_mut(&slot)?;
            flow.connections.insert(key);
            flow.sup = sup;
            flow.recovered = false;
            self.index(key, slot);
            return Some(Registered::Joined(slot));
        }
        let slot = (0..self.capacity as u32).find(|s| !self.flows.contains_key(s))?;
        self.by_pair.insert(pair, slot);
        self.index(key, slot);
        self.flows.insert(
            slot,
            Flow {
                slot,
                pair,
                sup,
                connections: BTreeSet::from([key]),
                recovered: false,
            },
        );
        Some(Registered::NewFlow(slot))
    }

    fn index(&mut self, key: ConnectionKey, slot: u32) {
        self.by_connection.insert(key, slot);
        *self.per_process.entry(key.process).or_default() += 1;
    }

    fn unindex(&mut self, key: &ConnectionKey) -> Option<u32> {
        let slot = self.by_connection.remove(key)?;
        if let Some(count) = self.per_process.get_mut(&key.process) {
            *count -= 1;
            if *count == 0 {
                self.per_process.remove(&key.process);
            }
        }
        Some(slot)
    }

    /// Slots freed by registrations since the last call.
    pub fn take_freed(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.freed)
    }

    /// Removes a connection; `Some((slot, freed))` when it was registered, `freed` when its
    /// flow had no other connection and the slot is free again.
    pub fn deregister(&mut self, key: ConnectionKey) -> Option<(u32, bool)> {
        let slot = self.unindex(&key)?;
        let flow = self.flows.get_mut(&slot)?;
        flow.connections.remove(&key);
        if !flow.connections.is_empty() {
            return Some((slot, false));
        }
        self.free(slot);
        Some((slot, true))
    }

    /// Finds a connection by pid and `conn_id` (a deregistration carries no start time): a
    /// scan of that pid's processes only (normally one).
    pub fn find(&self, pid: u32, conn_id: u32) -> Option<ConnectionKey> {
        self.per_process
            .keys()
            .filter(|p| p.pid == pid)
            .map(|&process| ConnectionKey { process, conn_id })
            .find(|key| self.by_connection.contains_key(key))
    }

    fn free(&mut self, slot: u32) {
        if let Some(flow) = self.flows.remove(&slot) {
            self.by_pair.remove(&flow.pair);
            for key in flow.connections {
                self.unindex(&key);
            }
        }
    }

    /// Per slot, the users of its registered connections.
    pub fn users(&self) -> BTreeMap<u32, BTreeSet<u32>> {
        self.flows
            .values()
            .map(|f| {
                (
                    f.slot,
                    f.connections.iter().map(|k| k.process.uid).collect(),
                )
            })
            .collect()
    }

    /// The processes holding connections.
    pub fn processes(&self) -> Vec<Process> {
        self.per_process.keys().copied().collect()
    }

    /// Drops the connections of the processes in `gone`; returns the number dropped and the
    /// slots freed.
    pub fn reclaim_exited(&mut self, gone: &[Process]) -> (usize, Vec<u32>) {
        let gone: Vec<ConnectionKey> = self
            .by_connection
            .keys()
            .filter(|k| gone.contains(&k.process))
            .copied()
            .collect();
        let mut freed = Vec::new();
        for key in &gone {
            if let Some((slot, true)) = self.deregister(*key) {
                freed.push(slot);
            }
        }
        (gone.len(), freed)
    }

    /// Frees recovered flows nobody re-registered and no live connection reads (`in_use`).
    pub fn free_unused_recovered(&mut self, in_use: &BTreeSet<u32>) -> Vec<u32> {
        let unused: Vec<u32> = self
            .flows
            .values()
            .filter(|f| f.recovered && f.connections.is_empty() && !in_use.contains(&f.slot))
            .map(|f| f.slot)
            .collect();
        for slot in &unused {
            self.free(*slot);
        }
        unused
    }

    /// The flow in `slot`.
    pub fn flow(&self, slot: u32) -> Option<&Flow> {
        self.flows.get(&slot)
    }

    /// Every flow, by slot.
    pub fn flows(&self) -> impl Iterator<Item = &Flow> {
        self.flows.values()
    }

    /// Slots in use.
    pub fn used(&self) -> usize {
        self.flows.len()
    }

    /// Slots in the table.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Registered connections.
    pub fn connections(&self) -> usize {
        self.by_connection.len()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn pair(a: u8, b: u8) -> Pair {
        Pair {
            src: Ipv4Addr::new(10, 0, 0, a),
            dst: Ipv4Addr::new(10, 0, 0, b),
        }
    }

    fn key(pid: u32, id: u32) -> ConnectionKey {
        ConnectionKey {
            process: Process {
                pid,
                start_ticks: 1,
                uid: 1000,
            },
            conn_id: id,
        }
    }

    #[test]
    fn one_slot_per_pair_freed_with_its_last_connection() {
        let mut t = SlotTable::new(2);
        assert_eq!(
            t.register(key(1, 1), pair(1, 2), pair(5, 6)),
            Some(Registered::NewFlow(0))
        );
        assert_eq!(
            t.register(key(2, 1), pair(1, 2), pair(5, 6)),
            Some(Registered::Joined(0))
        );
        assert_eq!(
            t.register(key(1, 2), pair(1, 3), pair(5, 7)),
            Some(Registered::NewFlow(1))
        );
        assert_eq!(t.register(key(1, 3), pair(1, 4), pair(5, 8)), None, "full");
        assert_eq!(
            t.register(key(2, 1), pair(1, 2), pair(5, 6)),
            Some(Registered::Joined(0)),
            "the same key again stays"
        );
        assert_eq!(t.connections(), 3);
        // Key (1, 2) moves from pair 1->3 (its only connection) to 1->2: slot 1 is freed.
        assert_eq!(
            t.register(key(1, 2), pair(1, 2), pair(5, 6)),
            Some(Registered::Joined(0))
        );
        assert_eq!(t.take_freed(), vec![1]);
        assert_eq!(t.find(1, 2), Some(key(1, 2)));
        assert_eq!(t.deregister(key(1, 2)), Some((0, false)));
        assert_eq!(t.deregister(key(1, 1)), Some((0, false)));
        assert_eq!(t.deregister(key(2, 1)), Some((0, true)));
        assert_eq!(t.deregister(key(2, 1)), None, "twice");
        assert_eq!(
            t.register(key(1, 3), pair(1, 4), pair(5, 8)),
            Some(Registered::NewFlow(0))
        );
        assert_eq!((t.used(), t.connections()), (1, 1));
    }

    #[test]
    fn exited_processes_lose_their_connections() {
        let mut t = SlotTable::new(4);
        t.register(key(1, 1), pair(1, 2), pair(5, 6));
        t.register(key(2, 1), pair(1, 2), pair(5, 6));
        t.register(key(2, 2), pair(1, 3), pair(5, 7));
        let gone: Vec<Process> = t.processes().into_iter().filter(|p| p.pid == 2).collect();
        let (dropped, freed) = t.reclaim_exited(&gone);
        assert_eq!((dropped, freed), (2, vec![1]));
        assert_eq!(t.flow(0).unwrap().connections.len(), 1);
    }

    #[test]
    fn recovered_flows_rejoin_or_are_freed_when_unused() {
        let mut t = SlotTable::new(8);
        t.recover(5, pair(1, 2));
        t.recover(6, pair(1, 3));
        assert_eq!(
            t.register(key(9, 1), pair(1, 2), pair(5, 6)),
            Some(Registered::Joined(5))
        );
        assert_eq!(
            t.free_unused_recovered(&BTreeSet::from([6])),
            Vec::<u32>::new()
        );
        assert_eq!(t.free_unused_recovered(&BTreeSet::new()), vec![6]);
        assert!(!t.flow(5).unwrap().recovered);
    }

    proptest! {
        /// Whatever the sequence, pairs and slots stay one-to-one and every connection is in
        /// exactly the flow its index names.
        #[test]
        fn indexes_stay_consistent(ops in proptest::collection::vec((0u8..3, 1u32..6, 1u8..5), 0..200)) {
            let mut t = SlotTable::new(3);
            for (op, pid, b) in ops {
                match op {
                    0 => { t.register(key(pid, u32::from(b)), pair(1, b), pair(5, b)); }
                    1 => { t.deregister(key(pid, u32::from(b))); }
                    _ => {
                        let gone: Vec<Process> = t.processes().into_iter().filter(|p| p.pid == pid).collect();
                        t.reclaim_exited(&gone);
                    }
                }
                let pairs: BTreeSet<Pair> = t.flows().map(|f| f.pair).collect();
                prop_assert_eq!(pairs.len(), t.used());
                prop_assert!(t.used() <= 3);
                let total: usize = t.flows().map(|f| f.connections.len()).sum();
                prop_assert_eq!(total, t.connections());
                prop_assert_eq!(t.per_process.values().sum::<usize>(), t.connections());
                prop_assert!(t.take_freed().iter().all(|s| t.flow(*s).is_none()));
                for f in t.flows() {
                    prop_assert!(!f.connections.is_empty());
                }
            }
        }
    }
}
