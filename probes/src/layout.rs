//! The probes file's `repr(C)` structures, constants and compile-time layout asserts.
//!
//! Every structure here is frozen by `const _: () = assert!(...)` on its size, alignment and
//! field offsets. Padding is explicit (`_reserved` / `_pad` byte arrays) and fixed at 128-byte
//! granularity rather than `CachePadded`, whose size depends on the architecture (crossbeam
//! documents 32 to 256 bytes) and so cannot be part of a file format. Every region starts on a
//! 128-byte boundary and is located through the header's region table (offsets, never
//! pointers). See `docs/PROBES_LAYOUT.md` for the diagram and the versioning rules.

use core::mem::{align_of, offset_of, size_of};

use crate::declared::{DECLARATION_CAPACITY, DECLARATION_HELP_LEN, DECLARATION_NAME_LEN};
use crate::histogram::SeqHistogram;
use crate::ring::{RingControl, SeqRecord};
use crate::sync::{AtomicU16, AtomicU32, AtomicU64, AtomicU8};

/// The file's first 8 bytes.
pub const MAGIC: [u8; 8] = *b"MPIBPROB";
/// Layout major version: a reader refuses a file whose major differs from its own.
pub const ABI_MAJOR: u16 = 3;
/// Layout minor version: added fields (in reserved space), regions or record kinds.
pub const ABI_MINOR: u16 = 3;
/// `(ABI_MAJOR << 16) | ABI_MINOR`, the value of the header's version word.
pub const ABI_VERSION: u32 = ((ABI_MAJOR as u32) << 16) | ABI_MINOR as u32;
/// Rails a connection uses, one NIC each (rail 0 = SOUT, rail 1 = SUP): the per-rail arrays of
/// a connection slot and an event, and the kinds a NIC slot may serve.
pub const MAX_RAILS: usize = 2;
/// Rail index of the scale-out rail.
pub const RAIL_SOUT: usize = 0;
/// Rail index of the scale-up rail.
pub const RAIL_SUP: usize = 1;
/// Label of each rail index, as used by the collector's `rail` label.
pub const RAIL_NAMES: [&str; MAX_RAILS] = ["sout", "sup"];
/// NIC slots: every NIC the writer opened has its own counters, whichever rail it serves and
/// however many fused devices share it (3.0 on; a 2.x file had one slot per rail).
pub const MAX_NICS: usize = 16;
/// Fused devices (NCCL's net devices) described in the header (3.0 on).
pub const MAX_DEVICES: usize = 16;
/// Writer lanes: copies of the rail blocks and transfer counts, one per writing thread, summed
/// by readers. The last lane is shared by any threads beyond the others and written with
/// locked read-modify-writes (`docs/PROBES_LAYOUT.md`, "Writer lanes").
pub const WRITER_LANES: usize = 16;
/// The lane written with read-modify-writes by every thread that found no free lane.
pub const SHARED_LANE: usize = WRITER_LANES - 1;
/// Connection table slots (64 before 3.2): as many connections as the largest process NCCL's
/// batched setup makes in the scale target (8,192 pairs, 16,384 connections; issue 32). The
/// table is 2 MiB of the file, but the file is sparse and slots are claimed lowest first, so
/// only the pages of slots ever used are paged in, and readers look no further than the
/// header's high-water mark (docs/PROBES_LAYOUT.md, "Connection slot").
pub const CONNECTION_SLOTS: usize = 16_384;
/// Event ring records (a power of two).
pub const EVENT_CAPACITY: usize = 1024;
/// Payload words of an event record (after its sequence word).
pub const EVENT_WORDS: usize = 15;
/// Latency histogram buckets per rail block (one histogram per NIC slot and lane).
pub const LATENCY_BUCKETS: usize = 64;
/// Bytes of the header (512 in 2.x files).
pub const HEADER_LEN: usize = 4352;
/// Bytes of the host and device name fields (NUL-padded UTF-8, not necessarily terminated).
pub const NAME_LEN: usize = 64;
/// Entries in the header's region table (6 in 2.0 files, which had no declarations region; a
/// 3.x reader requires all 7).
pub const REGION_COUNT: usize = 7;
/// Regions before the declarations region (a 2.0 file's count); a 3.x reader requires all
/// `REGION_COUNT`.
pub(crate) const REQUIRED_REGIONS: usize = 6;
/// Words of each rail block's value array ([`crate::declared`] gives each its meaning).
pub const RAIL_VALUE_SLOTS: usize = 32;
/// Words of the process block's value array.
pub const PROCESS_VALUE_SLOTS: usize = 16;

/// Region table index of the rail blocks.
pub(crate) const REGION_RAILS: usize = 0;
/// Region table index of the per-process block.
pub(crate) const REGION_PROCESS: usize = 1;
/// Region table index of the connection table.
pub(crate) const REGION_CONNECTIONS: usize = 2;
/// Region table index of the event ring control block.
pub(crate) const REGION_RING: usize = 3;
/// Region table index of the event records.
pub(crate) const REGION_EVENTS: usize = 4;
/// Region table index of the writer lanes' blocks.
pub(crate) const REGION_LANES: usize = 5;
/// Region table index of the value declarations (2.1 on; every 3.x file has it).
pub(crate) const REGION_DECLARATIONS: usize = 6;
/// Region names, for error messages.
pub(crate) const REGION_NAMES: [&str; REGION_COUNT] = [
    "rails",
    "process",
    "connections",
    "ring",
    "events",
    "lanes",
    "declarations",
];

/// Where one region lives: byte offset and length in the file, record stride and count.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RegionDesc {
    pub(crate) offset: u32,
    pub(crate) len: u32,
    pub(crate) stride: u32,
    pub(crate) count: u32,
}

/// Static description of one NIC slot, for the collector's `rail`, `device` and `port` labels;
/// 128 bytes, 16 of them at header offset 256.
#[repr(C)]
pub(crate) struct RailDesc {
    pub(crate) device: [u8; NAME_LEN],
    pub(crate) port: u32,
    /// Link speed in Mbps as the device reports it (0: unknown).
    pub(crate) speed_mbps: u32,
    /// The rail the NIC serves: 0 SOUT, 1 SUP (3.0 on).
    pub(crate) rail: u8,
    pub(crate) _reserved: [u8; 55],
}

/// One fused device (NCCL's net device): its name and its two NIC slots (3.0 on); 128 bytes,
/// 16 of them at header offset 2304.
#[repr(C)]
pub(crate) struct DeviceDesc {
    /// NUL-padded name as NCCL sees it (`mlx5_0+mlx5_1`).
    pub(crate) name: [u8; NAME_LEN],
    /// NIC slots of its SOUT and SUP NICs (the same slot twice for a device with one NIC).
    pub(crate) nics: [u8; MAX_RAILS],
    pub(crate) _reserved: [u8; 62],
}

/// The file header (4352 bytes). Immutable once `abi_version` is non-zero, except the atomics.
#[repr(C, align(128))]
pub(crate) struct Header {
    pub(crate) magic: [u8; 8],
    /// Written last, with Release: 0 until the rest of the file is initialised.
    pub(crate) abi_version: AtomicU32,
    pub(crate) header_len: u32,
    pub(crate) file_len: u64,
    pub(crate) writer_pid: u32,
    /// NIC slots in use (3.0 on; rails in use in 2.x).
    pub(crate) rail_count: u32,
    /// ns since the Unix epoch.
    pub(crate) start_ns: u64,
    /// ns since the Unix epoch, refreshed by the writer.
    pub(crate) heartbeat_ns: AtomicU64,
    /// ns since the Unix epoch of a clean shutdown, 0 while running.
    pub(crate) closed_ns: AtomicU64,
    pub(crate) slow_threshold_ns: u64,
    pub(crate) sample_one_in: u32,
    pub(crate) region_count: u32,
    pub(crate) regions: [RegionDesc; REGION_COUNT],
    /// Fused devices described in `devices` (3.0 on).
    pub(crate) device_count: u32,
    /// One past the highest connection slot ever claimed (3.2 on; 0 in older files, whose
    /// readers scan the whole table): a reader needs to look at no slot from it on.
    pub(crate) connection_high_water: AtomicU32,
    pub(crate) host_name: [u8; NAME_LEN],
    pub(crate) rails: [RailDesc; MAX_NICS],
    pub(crate) devices: [DeviceDesc; MAX_DEVICES],
}

/// One NIC slot's values in one writer lane: `u64`s written only by the lane's thread (plain
/// stores), or by read-modify-writes in the shared lane; 256 bytes. What each word means is
/// declared in [`crate::declared`] and written into the file's declarations region.
#[repr(C, align(128))]
pub(crate) struct RailCounters {
    pub(crate) values: [AtomicU64; RAIL_VALUE_SLOTS],
}

/// One NIC slot's post-to-completion latency histogram (ns), 640 bytes.
#[repr(C, align(128))]
pub(crate) struct LatencyBlock {
    pub(crate) hist: SeqHistogram<LATENCY_BUCKETS>,
    pub(crate) _pad: [u8; 112],
}

/// Everything about one NIC slot in one writer lane: counters then latency, 896 bytes.
#[repr(C, align(128))]
pub(crate) struct RailBlock {
    pub(crate) counters: RailCounters,
    pub(crate) latency: LatencyBlock,
}

/// Per-process counters, 128 bytes. Every word is written by any thread (`fetch_add`); what
/// each means is declared in [`crate::declared`].
#[repr(C, align(128))]
pub(crate) struct ProcessBlock {
    pub(crate) values: [AtomicU64; PROCESS_VALUE_SLOTS],
}

/// One writer lane's ownership and its transfer counts, 128 bytes.
#[repr(C, align(128))]
pub(crate) struct LaneBlock {
    /// 0 while never used, else the kernel id (tid) of the thread that owns the lane (never set
    /// on the shared lane). Claimed by a compare-and-swap; taken over by a later claim once that
    /// thread has exited (src/lanes.rs).
    pub(crate) owner: AtomicU64,
    /// Times the lane was claimed (a thread that exited hands it to the next).
    pub(crate) claims: AtomicU64,
    /// Completed transfers by active rail mask: `[none, sout only, sup only, both]`.
    pub(crate) transfers_by_mask: [AtomicU64; 4],
    pub(crate) _reserved: [u8; 80],
}

/// One connection table slot (Aeron metadata-record style), 128 bytes.
#[repr(C, align(128))]
pub(crate) struct ConnSlot {
    /// `(generation << 32) | state`; the state is written last with Release.
    pub(crate) state: AtomicU64,
    /// IPv4 address as `u32::from(Ipv4Addr)` (a.b.c.d = a << 24 | ...).
    pub(crate) peer_ipv4: AtomicU32,
    pub(crate) peer_port: AtomicU16,
    pub(crate) direction: AtomicU8,
    pub(crate) path_class: AtomicU8,
    pub(crate) mode: AtomicU8,
    /// The fused device's index among the header's devices (3.0 on); its NIC slots carry
    /// `rail_*[0]` (SOUT) and `rail_*[1]` (SUP).
    pub(crate) device: AtomicU8,
    /// Bit per rail (`1 << rail`) that failed over: the connection runs on the others alone
    /// (docs/PROTOCOL.md §10); single writer, 0 while both serve it (3.3 on).
    pub(crate) rails_down: AtomicU8,
    pub(crate) _pad: [u8; 1],
    pub(crate) hint_slot: AtomicU32,
    pub(crate) opened_ns: AtomicU64,
    pub(crate) closed_ns: AtomicU64,
    /// Bytes moved per rail; single writer (the connection's progress thread).
    pub(crate) rail_bytes: [AtomicU64; MAX_RAILS],
    /// Time each rail had at least one of the connection's parts in flight, ns; single writer.
    /// (What the policy agent divides completed bytes by.)
    pub(crate) rail_busy_ns: [AtomicU64; MAX_RAILS],
    /// Bytes per rail whose completion was seen; single writer.
    pub(crate) rail_done_bytes: [AtomicU64; MAX_RAILS],
    /// Parts of the connection in flight on each rail now; single writer (2.2 on, zero before).
    /// (What the policy agent samples for a flow's busy time across connections and processes.)
    pub(crate) rail_in_flight: [AtomicU32; MAX_RAILS],
    /// What NCCL last said about the connection's operations (`setNetAttr`, src/operation.rs);
    /// single writer, 0 until it says something (3.2 on).
    pub(crate) operation: AtomicU64,
    /// When the connection's first failover happened, ns since the Unix epoch; single writer,
    /// 0 while none has (3.3 on).
    pub(crate) failed_over_ns: AtomicU64,
    pub(crate) _reserved: [u8; 16],
}

/// One value declaration (Aeron's counter metadata record), 256 bytes; written before the
/// version is published and never after. A record whose scope is 0 is empty.
#[repr(C, align(128))]
#[derive(Clone, Copy)]
pub(crate) struct DeclarationRecord {
    /// 0 empty, 1 rail, 2 process.
    pub(crate) scope: u8,
    /// 1 counter, 2 gauge.
    pub(crate) kind: u8,
    /// 1 count, 2 bytes.
    pub(crate) unit: u8,
    /// 1 sum, 2 highest, 3 lowest among active lanes.
    pub(crate) merge: u8,
    pub(crate) slot: u16,
    /// The witness slot of merge 3.
    pub(crate) witness: u16,
    pub(crate) _reserved: [u8; 8],
    /// NUL-padded metric name.
    pub(crate) name: [u8; DECLARATION_NAME_LEN],
    /// NUL-padded help text.
    pub(crate) help: [u8; DECLARATION_HELP_LEN],
}

/// One event record: a sequence word and 15 payload words, 128 bytes.
pub(crate) type EventSlot = SeqRecord<EVENT_WORDS>;

pub(crate) const RAILS_OFF: usize = HEADER_LEN;
/// Rail blocks, lane by lane: lane `l`'s block of NIC slot `n` is record `l * MAX_NICS + n`
/// (256 blocks, 229,376 bytes).
pub(crate) const RAILS_LEN: usize = WRITER_LANES * MAX_NICS * size_of::<RailBlock>();
pub(crate) const PROCESS_OFF: usize = RAILS_OFF + RAILS_LEN;
pub(crate) const PROCESS_LEN: usize = size_of::<ProcessBlock>();
pub(crate) const LANES_OFF: usize = PROCESS_OFF + PROCESS_LEN;
pub(crate) const LANES_LEN: usize = WRITER_LANES * size_of::<LaneBlock>();
pub(crate) const CONNECTIONS_OFF: usize = LANES_OFF + LANES_LEN;
pub(crate) const CONNECTIONS_LEN: usize = CONNECTION_SLOTS * size_of::<ConnSlot>();
pub(crate) const RING_OFF: usize = CONNECTIONS_OFF + CONNECTIONS_LEN;
pub(crate) const RING_LEN: usize = size_of::<RingControl>();
pub(crate) const EVENTS_OFF: usize = RING_OFF + RING_LEN;
pub(crate) const EVENTS_LEN: usize = EVENT_CAPACITY * size_of::<EventSlot>();
pub(crate) const DECLARATIONS_OFF: usize = EVENTS_OFF + EVENTS_LEN;
pub(crate) const DECLARATIONS_LEN: usize = DECLARATION_CAPACITY * size_of::<DeclarationRecord>();
/// Total file length written by this version (2,480,640 bytes; 391,680 before 3.2).
pub const FILE_LEN: usize = DECLARATIONS_OFF + DECLARATIONS_LEN;

/// The whole file of this version as one struct: the writer's view of its own mapping (and of
/// the static dummy behind disabled handles). Readers go through the header's region table.
#[repr(C, align(128))]
pub(crate) struct FileImage {
    pub(crate) header: Header,
    pub(crate) rails: [RailBlock; WRITER_LANES * MAX_NICS],
    pub(crate) process: ProcessBlock,
    pub(crate) lanes: [LaneBlock; WRITER_LANES],
    pub(crate) conns: [ConnSlot; CONNECTION_SLOTS],
    pub(crate) ring: RingControl,
    pub(crate) events: [EventSlot; EVENT_CAPACITY],
    pub(crate) declarations: [DeclarationRecord; DECLARATION_CAPACITY],
}

/// Expected stride of each region (a reader of this major refuses any other).
pub(crate) const REGION_STRIDES: [usize; REGION_COUNT] = [
    size_of::<RailBlock>(),
    size_of::<ProcessBlock>(),
    size_of::<ConnSlot>(),
    size_of::<RingControl>(),
    size_of::<EventSlot>(),
    size_of::<LaneBlock>(),
    size_of::<DeclarationRecord>(),
];

/// The region table a writer of this version puts in the header.
pub(crate) const REGION_TABLE: [RegionDesc; REGION_COUNT] = {
    const fn desc(offset: usize, len: usize, stride: usize) -> RegionDesc {
        // Every value is below FILE_LEN, asserted to fit in u32 below.
        RegionDesc {
            offset: offset as u32,
            len: len as u32,
            stride: stride as u32,
            count: (len / stride) as u32,
        }
    }
    [
        desc(RAILS_OFF, RAILS_LEN, REGION_STRIDES[REGION_RAILS]),
        desc(PROCESS_OFF, PROCESS_LEN, REGION_STRIDES[REGION_PROCESS]),
        desc(
            CONNECTIONS_OFF,
            CONNECTIONS_LEN,
            REGION_STRIDES[REGION_CONNECTIONS],
        ),
        desc(RING_OFF, RING_LEN, REGION_STRIDES[REGION_RING]),
        desc(EVENTS_OFF, EVENTS_LEN, REGION_STRIDES[REGION_EVENTS]),
        desc(LANES_OFF, LANES_LEN, REGION_STRIDES[REGION_LANES]),
        desc(
            DECLARATIONS_OFF,
            DECLARATIONS_LEN,
            REGION_STRIDES[REGION_DECLARATIONS],
        ),
    ]
};

// ---- Compile-time layout freeze. Changing any of these is a major version bump. ----

const _: () = {
    assert!(size_of::<RegionDesc>() == 16 && align_of::<RegionDesc>() == 4);
    assert!(size_of::<RailDesc>() == 128 && offset_of!(RailDesc, port) == 64);
    assert!(offset_of!(RailDesc, speed_mbps) == 68 && offset_of!(RailDesc, rail) == 72);
    assert!(size_of::<DeviceDesc>() == 128 && offset_of!(DeviceDesc, nics) == 64);
    assert!(size_of::<Header>() == HEADER_LEN && align_of::<Header>() == 128);
    assert!(offset_of!(Header, magic) == 0);
    assert!(offset_of!(Header, abi_version) == 8);
    assert!(offset_of!(Header, header_len) == 12);
    assert!(offset_of!(Header, file_len) == 16);
    assert!(offset_of!(Header, writer_pid) == 24);
    assert!(offset_of!(Header, rail_count) == 28);
    assert!(offset_of!(Header, start_ns) == 32);
    assert!(offset_of!(Header, heartbeat_ns) == 40);
    assert!(offset_of!(Header, closed_ns) == 48);
    assert!(offset_of!(Header, slow_threshold_ns) == 56);
    assert!(offset_of!(Header, sample_one_in) == 64);
    assert!(offset_of!(Header, region_count) == 68);
    assert!(offset_of!(Header, regions) == 72);
    assert!(offset_of!(Header, device_count) == 184);
    assert!(offset_of!(Header, connection_high_water) == 188);
    assert!(offset_of!(Header, host_name) == 192);
    assert!(offset_of!(Header, rails) == 256);
    assert!(offset_of!(Header, devices) == 2304);
};

const _: () = {
    assert!(size_of::<RailCounters>() == 256 && align_of::<RailCounters>() == 128);
    assert!(offset_of!(RailCounters, values) == 0);
    assert!(size_of::<SeqHistogram<LATENCY_BUCKETS>>() == 16 + 8 * LATENCY_BUCKETS);
    assert!(size_of::<LatencyBlock>() == 640 && offset_of!(LatencyBlock, _pad) == 528);
    assert!(size_of::<RailBlock>() == 896 && offset_of!(RailBlock, latency) == 256);
};

const _: () = {
    assert!(size_of::<ProcessBlock>() == 128 && align_of::<ProcessBlock>() == 128);
    assert!(offset_of!(ProcessBlock, values) == 0);
    assert!(size_of::<LaneBlock>() == 128 && align_of::<LaneBlock>() == 128);
    assert!(offset_of!(LaneBlock, owner) == 0 && offset_of!(LaneBlock, claims) == 8);
    assert!(offset_of!(LaneBlock, transfers_by_mask) == 16);
    assert!(size_of::<ConnSlot>() == 128 && align_of::<ConnSlot>() == 128);
    assert!(offset_of!(ConnSlot, state) == 0);
    assert!(offset_of!(ConnSlot, peer_ipv4) == 8);
    assert!(offset_of!(ConnSlot, peer_port) == 12);
    assert!(offset_of!(ConnSlot, direction) == 14);
    assert!(offset_of!(ConnSlot, path_class) == 15);
    assert!(offset_of!(ConnSlot, mode) == 16 && offset_of!(ConnSlot, device) == 17);
    assert!(offset_of!(ConnSlot, rails_down) == 18);
    assert!(offset_of!(ConnSlot, hint_slot) == 20);
    assert!(offset_of!(ConnSlot, opened_ns) == 24);
    assert!(offset_of!(ConnSlot, closed_ns) == 32);
    assert!(offset_of!(ConnSlot, rail_bytes) == 40);
    assert!(offset_of!(ConnSlot, rail_busy_ns) == 56);
    assert!(offset_of!(ConnSlot, rail_done_bytes) == 72);
    assert!(offset_of!(ConnSlot, rail_in_flight) == 88);
    assert!(offset_of!(ConnSlot, operation) == 96);
    assert!(offset_of!(ConnSlot, failed_over_ns) == 104);
    assert!(offset_of!(ConnSlot, _reserved) == 112);
    assert!(size_of::<RingControl>() == 128 && align_of::<RingControl>() == 128);
    assert!(size_of::<EventSlot>() == 128 && align_of::<EventSlot>() == 8);
    assert!(EVENT_CAPACITY.is_power_of_two());
    assert!(size_of::<DeclarationRecord>() == 256);
    assert!(offset_of!(DeclarationRecord, slot) == 4);
    assert!(offset_of!(DeclarationRecord, witness) == 6);
    assert!(offset_of!(DeclarationRecord, name) == 16);
    assert!(offset_of!(DeclarationRecord, help) == 80);
};

const _: () = {
    assert!(RAILS_OFF == 4352 && PROCESS_OFF == 233_728 && LANES_OFF == 233_856);
    assert!(CONNECTIONS_OFF == 235_904 && RING_OFF == 2_333_056 && EVENTS_OFF == 2_333_184);
    assert!(DECLARATIONS_OFF == 2_464_256 && FILE_LEN == 2_480_640 && LANES_OFF % 128 == 0);
    assert!(RAILS_OFF % 128 == 0 && PROCESS_OFF % 128 == 0 && CONNECTIONS_OFF % 128 == 0);
    assert!(RING_OFF % 128 == 0 && EVENTS_OFF % 128 == 0);
    assert!(FILE_LEN <= u32::MAX as usize);
    assert!(size_of::<FileImage>() == FILE_LEN && align_of::<FileImage>() == 128);
    assert!(offset_of!(FileImage, rails) == RAILS_OFF);
    assert!(offset_of!(FileImage, process) == PROCESS_OFF);
    assert!(offset_of!(FileImage, lanes) == LANES_OFF);
    assert!(offset_of!(FileImage, conns) == CONNECTIONS_OFF);
    assert!(offset_of!(FileImage, ring) == RING_OFF);
    assert!(offset_of!(FileImage, events) == EVENTS_OFF);
    assert!(offset_of!(FileImage, declarations) == DECLARATIONS_OFF);
};
