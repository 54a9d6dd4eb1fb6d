//! Every counter and gauge of the probes file, declared once.
//!
//! A declaration names a value (its exported metric name, kind, unit and help), says where it
//! lives (a word of each rail block, or of the process block) and how readers merge the
//! writer lanes' copies. The writer copies the declarations into the file's declarations
//! region before it publishes the version (Aeron's counter metadata records), so a reader shows
//! a value it was never built for: the collector exports every declared value of a file
//! without knowing its name in advance (`docs/PROBES_LAYOUT.md`, "Declarations").
//!
//! Adding a value is one line in `declare!` below plus its call site, for example
//! `probes.rail(0).add(RAIL_TX_BYTES, n)`. The slot is part of the file format: a new value
//! takes a free slot (a minor version), and a slot is never reused for another meaning.

use crate::layout::{DeclarationRecord, PROCESS_VALUE_SLOTS, RAIL_VALUE_SLOTS};

/// Where a declared value lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    /// One word per rail in every writer lane's rail block; labels `rail`, `device`, `port`.
    Rail,
    /// One word in the process block, written by any thread with locked adds.
    Process,
}

/// How a declared value behaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueKind {
    /// A running total that only grows (exported as a counter, name ending in `_total`).
    Counter,
    /// A reading that goes up and down.
    Gauge,
}

/// The unit of a declared value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueUnit {
    /// A dimensionless count of things.
    Count,
    /// Bytes.
    Bytes,
}

/// How readers combine the copies of a rail value in the writer lanes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Merge {
    /// Add them (every counter).
    Sum,
    /// The highest copy (for example a threshold every lane sets alike).
    Highest,
    /// The lowest copy among the lanes that use the value: a lane takes part when this value or
    /// the `witness` slot is non-zero (for a queue depth: the queue nearest to running dry,
    /// where 0 is a real reading as soon as the lane has set its water mark).
    LowestActive {
        /// Slot of the rail value that marks a lane as using this one.
        witness: u16,
    },
}

/// One declared value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Declaration {
    /// Rail or process.
    pub scope: Scope,
    /// Counter or gauge.
    pub kind: ValueKind,
    /// Unit of the value.
    pub unit: ValueUnit,
    /// How lanes merge (rail values; process values have one copy).
    pub merge: Merge,
    /// Word index in its block (below [`RAIL_VALUE_SLOTS`] or [`PROCESS_VALUE_SLOTS`]).
    pub slot: u16,
    /// Exported metric name, at most 63 bytes of `[a-z0-9_]`.
    pub name: &'static str,
    /// One-line help text, at most 175 bytes.
    pub help: &'static str,
}

/// A rail counter: added to by the lane's thread ([`crate::RailProbe::add`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RailCounter(u16);
/// A rail gauge: set by the lane's thread ([`crate::RailProbe::set`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RailGauge(u16);
/// A process counter: added to by any thread ([`crate::ProbesFile::add`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessCounter(u16);

macro_rules! handle {
    ($handle:ident, $scope:ident, $kind:ident, $capacity:expr) => {
        impl $handle {
            /// The handle of slot `slot` (a declaration's slot). Panics at compile time in a
            /// `const` beyond the block.
            pub const fn at(slot: u16) -> $handle {
                assert!((slot as usize) < $capacity, "slot beyond the block");
                $handle(slot)
            }

            /// The word index in the block. Masked by the block's size (a power of two, so one
            /// AND): `at` already keeps it inside, and the mask lets the compiler drop the
            /// bounds check (and its panic path) even where `add` is not inlined.
            #[inline(always)]
            pub const fn slot(self) -> usize {
                self.0 as usize & ($capacity - 1)
            }

            /// A declaration of this handle's kind and scope.
            pub const fn declare(
                self,
                unit: ValueUnit,
                merge: Merge,
                name: &'static str,
                help: &'static str,
            ) -> Declaration {
                Declaration {
                    scope: Scope::$scope,
                    kind: ValueKind::$kind,
                    unit,
                    merge,
                    slot: self.0,
                    name,
                    help,
                }
            }
        }
    };
}

const _: () = assert!(RAIL_VALUE_SLOTS.is_power_of_two() && PROCESS_VALUE_SLOTS.is_power_of_two());

handle!(RailCounter, Rail, Counter, RAIL_VALUE_SLOTS);
handle!(RailGauge, Rail, Gauge, RAIL_VALUE_SLOTS);
handle!(ProcessCounter, Process, Counter, PROCESS_VALUE_SLOTS);

macro_rules! declare {
    ($(
        $(#[$doc:meta])*
        $id:ident: $handle:ident = $slot:literal, $unit:ident, $merge:expr, $name:literal,
            $help:literal;
    )+) => {
        $(
            $(#[$doc])*
            pub const $id: $handle = $handle::at($slot);
        )+
        /// Every value this version declares, in documentation order.
        pub static DECLARATIONS: &[Declaration] = &[
            $($id.declare(ValueUnit::$unit, $merge, $name, $help)),+
        ];
    };
}

const SRQ_HIGH_WATER_SLOT: u16 = 7;

declare! {
    /// Bytes sent on a rail.
    RAIL_TX_BYTES: RailCounter = 0, Bytes, Merge::Sum, "mpib_rail_tx_bytes_total",
        "Bytes sent on the rail (payload posted by this process).";
    /// Bytes received on a rail.
    RAIL_RX_BYTES: RailCounter = 1, Bytes, Merge::Sum, "mpib_rail_rx_bytes_total",
        "Bytes received on the rail.";
    /// Work requests posted (send, RDMA write and receive WRs).
    RAIL_WORK_REQUESTS: RailCounter = 2, Count, Merge::Sum, "mpib_rail_work_requests_total",
        "Work requests posted on the rail's queue pairs.";
    /// Send-side completions polled.
    RAIL_SEND_COMPLETIONS: RailCounter = 3, Count, Merge::Sum,
        "mpib_rail_send_completions_total",
        "Send-side completions (CQEs) polled on the rail.";
    /// Receive-side completions polled.
    RAIL_RECV_COMPLETIONS: RailCounter = 4, Count, Merge::Sum,
        "mpib_rail_recv_completions_total",
        "Receive-side completions (CQEs) polled on the rail.";
    /// Receives a shared receive queue could still lend beyond its connections' floors.
    SRQ_DEPTH: RailGauge = 5, Count, Merge::LowestActive { witness: SRQ_HIGH_WATER_SLOT },
        "mpib_srq_depth",
        "Receives a shared receive queue of the rail could still lend beyond its connections' \
         floors, as one last saw it: the lowest reading of the process's threads.";
    /// The batch a connection takes beyond its shortfall.
    SRQ_LOW_WATER: RailGauge = 6, Count, Merge::Highest, "mpib_srq_low_water",
        "Receives a connection takes from a shared receive queue beyond what its outstanding \
         receives need (MPIB_SRQ_LOW_WATER).";
    /// The most receives a connection holds.
    SRQ_HIGH_WATER: RailGauge = 7, Count, Merge::Highest, "mpib_srq_high_water",
        "The most receives a connection holds of a shared receive queue, and so keeps \
         outstanding (MPIB_SRQ_HIGH_WATER).";
    /// Batches of receives posted on a shared receive queue.
    SRQ_REFILLS: RailCounter = 8, Count, Merge::Sum, "mpib_srq_refills_total",
        "Batches of receives posted on a shared receive queue of the rail.";
    /// irecvs that returned no request for want of a shared receive.
    SRQ_LOW_WATER_HITS: RailCounter = 9, Count, Merge::Sum, "mpib_srq_low_water_hits_total",
        "Times an irecv returned no request because the rail's shared receive queue could not \
         grant the receive it needed.";
    /// Completions whose rail mask disagreed with the expected one.
    MASK_MISMATCHES: RailCounter = 10, Count, Merge::Sum, "mpib_mask_mismatches_total",
        "Completions whose rail mask disagreed with the expected one.";
    /// Any other protocol anomaly (bad immediate, unknown slot, size mismatch...).
    PROTOCOL_ERRORS: RailCounter = 11, Count, Merge::Sum, "mpib_protocol_errors_total",
        "Protocol anomalies other than mask mismatches.";
    /// Clear-to-send entries posted.
    CTS_POSTED: RailCounter = 12, Count, Merge::Sum, "mpib_cts_posted_total",
        "Clear-to-send entries posted on the rail.";
    /// Clear-to-send entries posted with a signalled completion.
    CTS_SIGNALED: RailCounter = 13, Count, Merge::Sum, "mpib_cts_signaled_total",
        "Clear-to-send entries posted with a signalled completion.";
    /// Completions with an error status.
    RAIL_ERROR_COMPLETIONS: RailCounter = 14, Count, Merge::Sum,
        "mpib_rail_error_completions_total",
        "Completions with an error status on the rail.";
    /// Memory regions made on a NIC for `regMr` buffers.
    MEMORY_REGISTRATIONS: RailCounter = 15, Count, Merge::Sum,
        "mpib_rail_memory_registrations_total",
        "Memory regions made on the rail's NIC for buffers NCCL registered (regMr): one per page \
         range, however many comms share it.";
    /// Memory regions of `regMr` buffers released on a NIC.
    MEMORY_DEREGISTRATIONS: RailCounter = 16, Count, Merge::Sum,
        "mpib_rail_memory_deregistrations_total",
        "Memory regions of regMr buffers released on the rail's NIC, with the last handle that \
         shared one: made minus released is what the NIC holds.";
    /// `regMr` calls served by a memory region the NIC already held.
    MEMORY_REGISTRATIONS_SHARED: RailCounter = 17, Count, Merge::Sum,
        "mpib_rail_memory_registrations_shared_total",
        "regMr calls served by a memory region the rail's NIC already held for the same pages.";
    /// Connection ends that failed over from a rail.
    RAIL_FAILOVERS: RailCounter = 18, Count, Merge::Sum, "mpib_rail_failovers_total",
        "Connection ends that failed over from the rail to the other one (an error completion, \
         a port event or the peer's word; docs/PROTOCOL.md section 10).";
    /// Bytes sent again after a failover.
    RAIL_REPLAYED_BYTES: RailCounter = 19, Bytes, Merge::Sum, "mpib_rail_replayed_bytes_total",
        "Bytes sent again on the rail after the other rail failed over: transfers the receiver \
         still lacked a part of (also counted in mpib_rail_tx_bytes_total).";
    /// Connection ends whose failed rail came back.
    RAIL_FAILBACKS: RailCounter = 20, Count, Merge::Sum, "mpib_rail_failbacks_total",
        "Connection ends whose rail came back after a failover: new queue pairs on it, each \
         probed, and transfers split over both rails again (docs/PROTOCOL.md section 11).";
    /// Whether the NIC's port is down.
    RAIL_PORT_DOWN: RailGauge = 21, Count, Merge::Highest, "mpib_rail_port_down",
        "1 while the NIC's port is down (its last port event; the tcp fabric's link): its \
         connections fail the rail over, and take it back once it is up (PROTOCOL.md 10-11).";
    /// `claim_connection` calls that found no free slot.
    CONNECTION_CLAIM_FAILURES: ProcessCounter = 0, Count, Merge::Sum,
        "mpib_connection_claim_failures_total",
        "Connections not shown in the connection table because all its slots were taken.";
    /// Advanced-mode connections that got no hint slot from the agent.
    CONNECTIONS_WITHOUT_AGENT: ProcessCounter = 1, Count, Merge::Sum,
        "mpib_connections_without_agent_total",
        "Advanced-mode connections that got no hint slot from the policy agent (none reachable, \
         no answer in time, a refusal or a full table): they move all their bytes on SOUT.";
    /// Threads that found every owned lane taken.
    WRITER_LANE_OVERFLOWS: ProcessCounter = 2, Count, Merge::Sum,
        "mpib_writer_lane_overflows_total",
        "Threads that found every owned writer lane taken and count in the shared lane (still \
         exact, with locked adds).";
    /// Slow-transfer events given up because another thread was writing the ring.
    EVENTS_CONTENDED: ProcessCounter = 3, Count, Merge::Sum, "mpib_events_contended_total",
        "Slow-transfer events the plugin gave up because another of its threads was writing \
         the event ring at that moment (it never waits for it).";
    /// Advanced-mode connections that stopped reading a hint file another process broke.
    HINT_FILE_LOST: ProcessCounter = 4, Count, Merge::Sum, "mpib_hint_file_lost_total",
        "Advanced-mode connections that stopped reading the agent's hint file because another \
         process shrank, replaced or removed it: they move all their bytes on SOUT.";
}

/// Bytes of a declaration's name field (the name is at most one byte shorter).
pub const DECLARATION_NAME_LEN: usize = 64;
/// Bytes of a declaration's help field (the help is at most one byte shorter).
pub const DECLARATION_HELP_LEN: usize = 176;
/// Declaration records in a file.
pub const DECLARATION_CAPACITY: usize = 64;

/// The values a file of minor version 0 (ABI 2.0) has: the words this version declares that
/// existed then (rail words 0 to 14, process words 0 to 3), at the same offsets.
pub(crate) fn declared_in_minor_0(d: &Declaration) -> bool {
    match d.scope {
        Scope::Rail => d.slot < 15,
        Scope::Process => d.slot < 4,
    }
}

/// Why a set of declarations cannot go into a file, naming the declaration.
pub fn check(declarations: &[Declaration]) -> Result<(), String> {
    if declarations.len() > DECLARATION_CAPACITY {
        return Err(format!(
            "{} declarations, a file holds {DECLARATION_CAPACITY}",
            declarations.len()
        ));
    }
    for (i, d) in declarations.iter().enumerate() {
        let capacity = match d.scope {
            Scope::Rail => RAIL_VALUE_SLOTS,
            Scope::Process => PROCESS_VALUE_SLOTS,
        };
        let name_ok = !d.name.is_empty()
            && d.name.len() < DECLARATION_NAME_LEN
            && d.name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        let problem = if !name_ok {
            Some("the name must be 1 to 63 bytes of [a-z0-9_]".to_owned())
        } else if d.help.len() >= DECLARATION_HELP_LEN {
            Some(format!("the help is {} bytes (at most 175)", d.help.len()))
        } else if usize::from(d.slot) >= capacity {
            Some(format!("slot {} is beyond the block's {capacity}", d.slot))
        } else if d.kind == ValueKind::Counter && d.merge != Merge::Sum {
            Some("a counter's lanes are summed (Merge::Sum)".to_owned())
        } else if let Merge::LowestActive { witness } = d.merge {
            (usize::from(witness) >= capacity).then(|| format!("witness slot {witness}"))
        } else {
            None
        };
        if let Some(problem) = problem {
            return Err(format!("declaration {:?}: {problem}", d.name));
        }
        let clash = declarations[..i]
            .iter()
            .find(|o| (o.scope == d.scope && o.slot == d.slot) || o.name == d.name);
        if let Some(other) = clash {
            return Err(format!(
                "declarations {:?} and {:?} share a name or a {:?} slot ({})",
                other.name, d.name, d.scope, d.slot
            ));
        }
    }
    Ok(())
}

/// A declaration as a reader found it in a file (owned strings).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Declared {
    /// Rail or process.
    pub scope: Scope,
    /// Counter or gauge.
    pub kind: ValueKind,
    /// Unit of the value.
    pub unit: ValueUnit,
    /// How lanes merge.
    pub merge: Merge,
    /// Word index in its block.
    pub slot: u16,
    /// Exported metric name.
    pub name: String,
    /// Help text.
    pub help: String,
}

impl From<&Declaration> for Declared {
    fn from(d: &Declaration) -> Declared {
        Declared {
            scope: d.scope,
            kind: d.kind,
            unit: d.unit,
            merge: d.merge,
            slot: d.slot,
            name: d.name.to_owned(),
            help: d.help.to_owned(),
        }
    }
}

fn text_field<const N: usize>(text: &str) -> [u8; N] {
    let mut field = [0u8; N];
    let len = text.len().min(N - 1);
    field[..len].copy_from_slice(&text.as_bytes()[..len]);
    field
}

fn field_text(field: &[u8]) -> Option<String> {
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    String::from_utf8(field[..end].to_vec()).ok()
}

impl DeclarationRecord {
    /// The record of an unused entry.
    pub(crate) const EMPTY: DeclarationRecord = DeclarationRecord {
        scope: 0,
        kind: 0,
        unit: 0,
        merge: 0,
        slot: 0,
        witness: 0,
        _reserved: [0; 8],
        name: [0; DECLARATION_NAME_LEN],
        help: [0; DECLARATION_HELP_LEN],
    };

    /// The record of `d` (checked by [`check`] first).
    pub(crate) fn encode(d: &Declaration) -> DeclarationRecord {
        let (merge, witness) = match d.merge {
            Merge::Sum => (1, 0),
            Merge::Highest => (2, 0),
            Merge::LowestActive { witness } => (3, witness),
        };
        DeclarationRecord {
            scope: match d.scope {
                Scope::Rail => 1,
                Scope::Process => 2,
            },
            kind: match d.kind {
                ValueKind::Counter => 1,
                ValueKind::Gauge => 2,
            },
            unit: match d.unit {
                ValueUnit::Count => 1,
                ValueUnit::Bytes => 2,
            },
            merge,
            slot: d.slot,
            witness,
            _reserved: [0; 8],
            name: text_field(d.name),
            help: text_field(d.help),
        }
    }

    /// The declaration in this record: `Ok(None)` for an empty entry, `Err` naming what a
    /// reader of this version cannot use (an unknown code, a slot beyond the block, a name
    /// that is not UTF-8).
    pub(crate) fn decode(&self) -> Result<Option<Declared>, String> {
        let name = field_text(&self.name).ok_or("a name that is not UTF-8")?;
        let scope = match self.scope {
            0 => return Ok(None),
            1 => Scope::Rail,
            2 => Scope::Process,
            other => return Err(format!("{name:?}: unknown scope {other}")),
        };
        let kind = match self.kind {
            1 => ValueKind::Counter,
            2 => ValueKind::Gauge,
            other => return Err(format!("{name:?}: unknown kind {other}")),
        };
        let unit = match self.unit {
            1 => ValueUnit::Count,
            2 => ValueUnit::Bytes,
            other => return Err(format!("{name:?}: unknown unit {other}")),
        };
        let merge = match self.merge {
            1 => Merge::Sum,
            2 => Merge::Highest,
            3 => Merge::LowestActive {
                witness: self.witness,
            },
            other => return Err(format!("{name:?}: unknown merge rule {other}")),
        };
        let capacity = match scope {
            Scope::Rail => RAIL_VALUE_SLOTS,
            Scope::Process => PROCESS_VALUE_SLOTS,
        };
        let witness_ok =
            !matches!(merge, Merge::LowestActive { witness } if usize::from(witness) >= capacity);
        if usize::from(self.slot) >= capacity || !witness_ok {
            return Err(format!("{name:?}: slot {} beyond the block", self.slot));
        }
        let help = field_text(&self.help).ok_or_else(|| format!("{name:?}: help not UTF-8"))?;
        Ok(Some(Declared {
            scope,
            kind,
            unit,
            merge,
            slot: self.slot,
            name,
            help,
        }))
    }
}
