//! MPIB probes: per-NIC telemetry in a versioned shared-memory file.
//!
//! The plugin (one writer per process) keeps its counters, connection table and slow-transfer
//! events in a small file under `MPIB_PROBES_DIR` (default `/dev/shm/mpib`), mapped into its
//! address space; the collector maps the same file read-only and exports it. The model is
//! Aeron's CnC file: a header whose version word is written last, regions found through
//! offsets (never pointers), counters written by plain stores from one thread each (a writer
//! lane per thread, summed by readers), and metadata records whose state word is written last.
//!
//! # Layout (ABI 3.3, 2,480,640 bytes, sparse)
//!
//! A 4,352-byte header (version word written last, the region table, the NIC slots and fused
//! devices, the connection table's high-water mark), then the regions: rail blocks (16 writer
//! lanes x 16 NIC slots: declared values and a latency histogram), the process block, the lane
//! blocks, the connection table (16,384 slots, used from the first up), the event ring and the
//! value declarations. `docs/PROBES_LAYOUT.md` has the diagram with every offset.
//!
//! Every region starts on a 128-byte boundary; sizes and offsets are frozen by compile-time
//! asserts (`layout.rs`). `docs/PROBES_LAYOUT.md` has the field tables, the event word layout
//! and the versioning rules (major = incompatible change, refused by readers; minor = values
//! declared in free words, fields added in reserved space, record kinds added).
//!
//! Every NIC the plugin opened has one NIC slot (a rail block per lane and its description in
//! the header, with the rail it serves), counted once however many fused devices share it;
//! the header's device table names each fused device's SOUT and SUP NIC slots, and each
//! connection and slow-transfer event names its device.
//!
//! # Quick start
//!
//! ```no_run
//! use mpib_probes::declared::{RAIL_SEND_COMPLETIONS, RAIL_TX_BYTES};
//! use mpib_probes::{LoadState, ProbesFile, ProbesReader, RailInfo, WriterInfo};
//! # fn main() -> std::io::Result<()> {
//! let rails = vec![
//!     RailInfo { device: "mlx5_0".into(), port: 1, speed_mbps: 200_000 },
//!     RailInfo { device: "mlx5_1".into(), port: 1, speed_mbps: 400_000 },
//! ];
//! let probes = ProbesFile::create("/dev/shm/mpib".as_ref(), &WriterInfo::for_this_process(rails))?;
//! let sout = probes.rail(0);
//! sout.add(RAIL_TX_BYTES, 4096);
//! sout.inc(RAIL_SEND_COMPLETIONS);
//! sout.record_latency_ns(12_000);
//!
//! // The collector:
//! if let LoadState::Ready(reader) = ProbesReader::open(probes.path().unwrap_or("".as_ref()))? {
//!     assert_eq!(reader.snapshot().rails[0].counter(RAIL_TX_BYTES), 4096);
//! }
//! probes.remove()?;
//! # Ok(())
//! # }
//! ```
//!
//! # Thread safety
//!
//! Any number of threads may count at once, exactly: each thread writes its own writer lane
//! (a copy of the rail blocks and transfer counts, claimed on first use, taken over by another
//! thread once its owner has exited), so an update stays a plain load + store instead of a
//! locked add, and readers sum the lanes. Threads beyond the owned lanes share the last one
//! with locked adds. A connection handle is written by the thread that drives its comm; the
//! event ring takes one thread at a time and gives a record up rather than wait (counted).
//! Heartbeats and connection claims are safe from any thread. Readers never block writers.
//! Details in [`counters`] and [`writer`].
//!
//! # Disabled mode
//!
//! [`ProbesFile::disabled`] (`MPIB_PROBES=0`) gives handles that write into a static dummy
//! block, so call sites never branch on whether probes are on.
//!
//! # Safety model
//!
//! All shared memory is accessed through atomics (`sync` re-exports `core`'s, or loom's
//! under `--cfg loom`); the only non-atomic shared data is header fields written before the
//! version is published and never after. Every `unsafe` block carries a `// SAFETY:` comment
//! and every ordering pair a `// SYNC:` comment. The event ring and the histogram are
//! seqlocks, model-checked with loom (`tests/loom.rs`) and run under miri heap-backed.
//!
//! # Features
//!
//! None. `--cfg loom` swaps the atomics for loom's and compiles only [`ring`] and
//! [`histogram`] (loom atomics cannot live in a file).

// Beyond the workspace's lints: what this crate exports is the probes layout's contract with
// readers in other crates, so nothing is `pub` that they cannot reach.
#![warn(unreachable_pub)]

pub mod histogram;
pub mod ring;
mod sync;

#[cfg(not(loom))]
mod claims;
#[cfg(not(loom))]
mod conn;
#[cfg(not(loom))]
pub mod counters;
#[cfg(not(loom))]
pub mod declared;
#[cfg(not(loom))]
mod failover_event;
#[cfg(not(loom))]
pub mod guard;
#[cfg(not(loom))]
mod lanes;
#[cfg(not(loom))]
mod layout;
#[cfg(not(loom))]
pub mod operation;
#[cfg(not(loom))]
mod reader;
#[cfg(not(loom))]
mod snapshot;
#[cfg(not(loom))]
mod types;
#[cfg(not(loom))]
pub mod writer;

#[cfg(all(test, not(loom)))]
mod tests;
#[cfg(all(test, not(loom)))]
mod tests_connections;
#[cfg(all(test, not(loom)))]
mod tests_guard;
#[cfg(all(test, not(loom)))]
mod tests_lanes;

#[cfg(not(loom))]
pub use crate::{
    conn::{ConnectionProbe, ConnectionSnapshot, ConnectionState, InFlightSample, REUSE_LINGER_NS},
    counters::{RailProbe, TransferProbe},
    declared::{
        Declaration, Declared, Merge, ProcessCounter, RailCounter, RailGauge, Scope, ValueKind,
        ValueUnit, DECLARATIONS,
    },
    failover_event::FailoverEvent,
    histogram::{bucket_index, bucket_lower_bound, HistogramSnapshot},
    layout::{
        ABI_MAJOR, ABI_MINOR, ABI_VERSION, CONNECTION_SLOTS, EVENT_CAPACITY, EVENT_WORDS, FILE_LEN,
        HEADER_LEN, LATENCY_BUCKETS, MAGIC, MAX_DEVICES, MAX_NICS, MAX_RAILS, NAME_LEN,
        PROCESS_VALUE_SLOTS, RAIL_NAMES, RAIL_SOUT, RAIL_SUP, RAIL_VALUE_SLOTS, REGION_COUNT,
        SHARED_LANE, WRITER_LANES,
    },
    operation::Operation,
    reader::{version_string, Corruption, LoadState, ProbesReader},
    snapshot::{
        DrainedEvents, EventCursor, FileInfo, LatencySnapshot, RailSnapshot, SlowTransferRecord,
        Snapshot, TransferCounts,
    },
    types::{
        now_ns, ConnectionInfo, DeviceEntry, Direction, EventKind, Mode, PathClass, RailInfo,
        SlowTransfer, WriterInfo, NO_CONNECTION,
    },
    writer::{file_name, Probes, ProbesFile},
};
