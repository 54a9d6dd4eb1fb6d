//! What a reader copies out of a probes file: the header fields, a snapshot of the counters,
//! histograms and connections, and the event records ([`crate::ProbesReader`] fills them).

use crate::conn::ConnectionSnapshot;
use crate::declared::{ProcessCounter, RailCounter, RailGauge};
use crate::histogram::HistogramSnapshot;
#[cfg(doc)]
use crate::layout::WRITER_LANES;
use crate::layout::{LATENCY_BUCKETS, PROCESS_VALUE_SLOTS, RAIL_VALUE_SLOTS};
use crate::ring::RingCursor;
use crate::types::{DeviceEntry, RailInfo, SlowTransfer};

/// Header fields that never change once published.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileInfo {
    /// Version word, `(major << 16) | minor`.
    pub abi_version: u32,
    /// Writer process id.
    pub pid: u32,
    /// Writer start time, ns since the Unix epoch.
    pub start_ns: u64,
    /// Writer host name.
    pub host: String,
    /// NIC slots in use, each with its device and port (the `device` and `port` labels).
    pub rails: Vec<RailInfo>,
    /// The rail each NIC slot serves (0 SOUT, 1 SUP), one entry per slot.
    pub rail_kinds: Vec<usize>,
    /// The fused devices (NCCL's net devices) and their NIC slots.
    pub devices: Vec<DeviceEntry>,
    /// Slow-transfer threshold, ns.
    pub slow_threshold_ns: u64,
    /// 1-in-N sampling (0 = off).
    pub sample_one_in: u32,
}

/// One rail's post-to-completion latency histogram copy (ns, log2 buckets).
pub type LatencySnapshot = HistogramSnapshot<LATENCY_BUCKETS>;

/// One rail's copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RailSnapshot {
    /// The rail's value words merged over the writer lanes, each by its declared rule (see
    /// [`crate::ProbesReader::declarations`]); undeclared words are summed.
    pub values: [u64; RAIL_VALUE_SLOTS],
    /// Latency histogram.
    pub latency: LatencySnapshot,
}

impl RailSnapshot {
    /// The value of rail counter `counter`.
    pub fn counter(&self, counter: RailCounter) -> u64 {
        self.values[counter.slot()]
    }

    /// The value of rail gauge `gauge`.
    pub fn gauge(&self, gauge: RailGauge) -> u64 {
        self.values[gauge.slot()]
    }
}

/// Completed transfers by active rail mask.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TransferCounts {
    /// Mask 0 (should stay 0).
    pub no_rail: u64,
    /// SOUT only.
    pub sout_only: u64,
    /// SUP only.
    pub sup_only: u64,
    /// Both rails.
    pub both: u64,
}

/// A copy of everything but the event ring.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// Writer process id.
    pub pid: u32,
    /// Writer start time, ns since the Unix epoch.
    pub start_ns: u64,
    /// Last heartbeat, ns since the Unix epoch.
    pub heartbeat_ns: u64,
    /// Clean-shutdown time (0 while running), ns since the Unix epoch.
    pub closed_ns: u64,
    /// One entry per NIC slot in use (what [`FileInfo::rails`] describes).
    pub rails: Vec<RailSnapshot>,
    /// Transfers by active rail mask.
    pub transfers: TransferCounts,
    /// The process block's value words (see [`crate::ProbesReader::declarations`]).
    pub process: [u64; PROCESS_VALUE_SLOTS],
    /// Writer lanes held by a thread right now (of [`WRITER_LANES`] - 1 owned lanes).
    pub lanes_in_use: u32,
    /// Active and closed connections.
    pub connections: Vec<ConnectionSnapshot>,
    /// Event records written so far (including overwritten ones).
    pub events_written: u64,
}

impl Snapshot {
    /// The value of process counter `counter`.
    pub fn process_counter(&self, counter: ProcessCounter) -> u64 {
        self.process[counter.slot()]
    }
}

/// A reader's position in the event ring.
pub type EventCursor = RingCursor;

/// One event read back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlowTransferRecord {
    /// Record index (0-based, over the writer's life).
    pub index: u64,
    /// The transfer.
    pub transfer: SlowTransfer,
}

/// What one [`crate::ProbesReader::drain_events`] call returned.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DrainedEvents {
    /// Intact records, oldest first.
    pub records: Vec<SlowTransferRecord>,
    /// Records lost to overwriting since the previous drain with the same cursor.
    pub dropped: u64,
}
