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

/// Why a registration got no slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// Every slot is held by another pair.
    NoFreeSlots,
    /// The process already has connections in [`FlowLimits::per_process`] flows.
    ProcessLimit,
    /// The process's user already has connections in [`FlowLimits::per_user`] flows while
    /// another user has connections too.
    UserLimit,
    /// The process holds [`MAX_CONNECTIONS_PER_PROCESS`] connections.
    TooManyConnections,
}

/// How many flows one process, and one user, may take a slot for: without them one client could
/// register made-up pairs until every slot is its own, and every real job would run all-SOUT.
///
/// A flow counts for a process (and its user) while it has a connection in it. The limits apply
/// to taking a free slot only: a connection of a pair that already has a slot always joins it,
/// since that costs no slot. The per-user limit applies only while another user has connections:
/// it is there so that one user cannot starve another, and with a single user on the node it
/// would cost that user slots for nobody (a 32-node all-to-all over 8 rails needs about 248).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlowLimits {
    /// Flows one process may have connections in.
    pub per_process: usize,
    /// Flows the processes of one user may have connections in, together.
    pub per_user: usize,
}

impl FlowLimits {
    /// A quarter of the slots per process and three quarters per user: one process (a rank
    /// talks to its ring and tree neighbours, a few flows per device) cannot take more than 64 of
    /// the 256, and while two users share the node neither takes a new flow past 192, so the
    /// other keeps the rest as flows end (a user alone may take every slot).
    pub const DEFAULT: FlowLimits = FlowLimits {
        per_process: HINT_MAX_ENTRIES / 4,
        per_user: HINT_MAX_ENTRIES * 3 / 4,
    };

    /// No limit beyond the table's size.
    pub const NONE: FlowLimits = FlowLimits {
        per_process: HINT_MAX_ENTRIES,
        per_user: HINT_MAX_ENTRIES,
    };
}

impl Default for FlowLimits {
    fn default() -> Self {
        FlowLimits::DEFAULT
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
    /// Per process, and per user, the slots it has connections in and how many in each.
    process_flows: BTreeMap<Process, BTreeMap<u32, usize>>,
    user_flows: BTreeMap<u32, BTreeMap<u32, usize>>,
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
            process_flows: BTreeMap::new(),
            user_flows: BTreeMap::new(),
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

    /// Registers a connection of `pair`; refused when every slot is taken by another pair, when
    /// a new flow would put the process past its limit or its user past its own while another
    /// user has connections ([`FlowLimits`]), or when the process holds
    /// [`MAX_CONNECTIONS_PER_PROCESS`]. Registering a key again on the same pair keeps it; on
    /// another pair moves it (a slot freed so is in [`SlotTable::take_freed`]).
    pub fn register(
        &mut self,
        key: ConnectionKey,
        pair: Pair,
        sup: Pair,
        limits: FlowLimits,
    ) -> Result<Registered, Refused> {
        match self.by_connection.get(&key) {
            Some(slot) if self.flows.get(slot).is_some_and(|f| f.pair == pair) => {
                return Ok(Registered::Joined(*slot));
            }
            Some(_) => {
                if let Some((slot, true)) = self.deregister(key) {
                    self.freed.push(slot);
                }
            }
            None => {}
        }
        if self.per_process.get(&key.process).copied().unwrap_or(0) >= MAX_CONNECTIONS_PER_PROCESS {
            return Err(Refused::TooManyConnections);
        }
        if let Some(&slot) = self.by_pair.get(&pair) {
            let flow = self.flows.get_mut(&slot).ok_or(Refused::NoFreeSlots)?;
            flow.connections.insert(key);
            flow.sup = sup;
            flow.recovered = false;
            self.index(key, slot);
            return Ok(Registered::Joined(slot));
        }
        if self.process_flow_count(key.process) >= limits.per_process {
            return Err(Refused::ProcessLimit);
        }
        if self.user_flow_count(key.process.uid) >= limits.per_user
            && self.another_user_present(key.process.uid)
        {
            return Err(Refused::UserLimit);
        }
        let slot = (0..self.capacity as u32)
            .find(|s| !self.flows.contains_key(s))
            .ok_or(Refused::NoFreeSlots)?;
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
        Ok(Registered::NewFlow(slot))
    }

    /// The flows `process` has connections in.
    pub fn process_flow_count(&self, process: Process) -> usize {
        self.process_flows.get(&process).map_or(0, BTreeMap::len)
    }

    /// The flows the processes of `uid` have connections in.
    pub fn user_flow_count(&self, uid: u32) -> usize {
        self.user_flows.get(&uid).map_or(0, BTreeMap::len)
    }

    /// Whether a user other than `uid` has connections (flows taken back after a restart have
    /// none, so they name no user).
    pub fn another_user_present(&self, uid: u32) -> bool {
        self.user_flows.keys().any(|other| *other != uid)
    }

    fn index(&mut self, key: ConnectionKey, slot: u32) {
        self.by_connection.insert(key, slot);
        *self.per_process.entry(key.process).or_default() += 1;
        let by_process = self.process_flows.entry(key.process).or_default();
        *by_process.entry(slot).or_default() += 1;
        let by_user = self.user_flows.entry(key.process.uid).or_default();
        *by_user.entry(slot).or_default() += 1;
    }

    fn unindex(&mut self, key: &ConnectionKey) -> Option<u32> {
        let slot = self.by_connection.remove(key)?;
        if let Some(count) = self.per_process.get_mut(&key.process) {
            *count -= 1;
            if *count == 0 {
                self.per_process.remove(&key.process);
            }
        }
        uncount(&mut self.process_flows, key.process, slot);
        uncount(&mut self.user_flows, key.process.uid, slot);
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

/// One connection fewer of `owner` in `slot`; entries reaching 0 are removed.
fn uncount<K: Ord>(counts: &mut BTreeMap<K, BTreeMap<u32, usize>>, owner: K, slot: u32) {
    let Some(slots) = counts.get_mut(&owner) else {
        return;
    };
    if let Some(count) = slots.get_mut(&slot) {
        *count -= 1;
        if *count == 0 {
            slots.remove(&slot);
        }
    }
    if slots.is_empty() {
        counts.remove(&owner);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
#[path = "slots_tests.rs"]
mod tests;
