//! The reader (the collector's side): open a probes file read-only, check it, copy it.
//!
//! [`ProbesReader::open`] returns an Aeron-style load state instead of guessing:
//!
//! | state | when | what the collector does |
//! |---|---|---|
//! | [`LoadState::AwaitVersion`] | file shorter than the header, or version word still 0 | retry later |
//! | [`LoadState::Incompatible`] | major version differs from this reader's | skip, log once |
//! | [`LoadState::Corrupt`] | bad magic, file shorter than the header says, bad region table | skip, count |
//! | [`LoadState::Ready`] | everything checked | read |
//!
//! The file is mapped read-only, so every atomic access here is a `Relaxed` load (the only
//! kind guaranteed to work on read-only memory), followed by `fence(Acquire)` where ordering
//! matters. All bounds are checked once in `open`; after that, reads cannot leave the mapping.
//! Writers never truncate, but anyone who can write the file can: the mapping is guarded
//! ([`crate::guard`]), so a read past a new end returns zeros and [`ProbesReader::faulted`]
//! says so, instead of a `SIGBUS` ending the reader.

use std::fmt;
use std::fs::File;
use std::io;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use memmap2::{MmapOptions, MmapRaw};

use crate::conn::{read_slot, sample_slot, InFlightSample};
use crate::declared::{declared_in_minor_0, Declared, Merge, Scope, DECLARATIONS};
use crate::guard::GuardedRange;
use crate::layout::{
    ConnSlot, DeclarationRecord, EventSlot, Header, LaneBlock, ProcessBlock, RailBlock, RegionDesc,
    ABI_MAJOR, ABI_VERSION, HEADER_LEN, LATENCY_BUCKETS, MAGIC, MAX_DEVICES, MAX_NICS, MAX_RAILS,
    RAIL_VALUE_SLOTS, REGION_CONNECTIONS, REGION_COUNT, REGION_DECLARATIONS, REGION_EVENTS,
    REGION_LANES, REGION_NAMES, REGION_PROCESS, REGION_RAILS, REGION_RING, REGION_STRIDES,
    REQUIRED_REGIONS, SHARED_LANE, WRITER_LANES,
};
use crate::ring::{Ring, RingControl};
use crate::snapshot::{
    DrainedEvents, EventCursor, FileInfo, LatencySnapshot, RailSnapshot, SlowTransferRecord,
    Snapshot, TransferCounts,
};
use crate::sync::{fence, AtomicU32, AtomicU64, Ordering};
use crate::types::{decode_name, DeviceEntry, RailInfo, SlowTransfer};

/// Why a file was refused as corrupt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Corruption {
    /// The first 8 bytes are not `MPIBPROB`.
    BadMagic,
    /// The file is shorter than its header says.
    Truncated {
        /// Length the header declares.
        expected: u64,
        /// Length on disk.
        actual: u64,
    },
    /// A header field is out of range.
    BadHeader(&'static str),
    /// A region lies outside the file, is misaligned, or has the wrong stride or count.
    BadRegion(&'static str),
}

impl fmt::Display for Corruption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Corruption::BadMagic => f.write_str("bad magic (not an MPIB probes file)"),
            Corruption::Truncated { expected, actual } => {
                write!(
                    f,
                    "truncated: header says {expected} bytes, file has {actual}"
                )
            }
            Corruption::BadHeader(what) => write!(f, "bad header: {what}"),
            Corruption::BadRegion(name) => write!(f, "bad region table entry: {name}"),
        }
    }
}

/// The outcome of [`ProbesReader::open`].
// A reader is made once per file and moved once into the caller's table: its size is no cost.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum LoadState {
    /// The writer has not finished initialising the file (Aeron `AWAIT_VERSION`).
    AwaitVersion,
    /// The file's major version is not this reader's: refused.
    Incompatible {
        /// The file's version word, `(major << 16) | minor`.
        found: u32,
        /// This reader's version word.
        expected: u32,
    },
    /// The file cannot be read safely.
    Corrupt(Corruption),
    /// The file is ready to read.
    Ready(ProbesReader),
}

/// A human-readable version word: `major.minor`.
pub fn version_string(version: u32) -> String {
    format!("{}.{}", version >> 16, version & 0xffff)
}

/// A probes file mapped read-only and checked.
pub struct ProbesReader {
    /// Turns a fault of the mapping (the file shrank after `open`) into zero pages; dropped
    /// before `map`.
    guard: GuardedRange,
    map: MmapRaw,
    path: PathBuf,
    regions: [RegionDesc; REGION_COUNT],
    info: FileInfo,
    declarations: Vec<Declared>,
    refused_declarations: Vec<String>,
    /// The merge rule of each rail word (a `Vec`, to keep `LoadState` small).
    rail_merge: Vec<Merge>,
}

// SAFETY: the mapping is read-only and only read through atomics and immutable fields.
unsafe impl Send for ProbesReader {}
// SAFETY: as for Send.
unsafe impl Sync for ProbesReader {}

impl ProbesReader {
    /// Open and check the probes file at `path` (module docs for the states).
    ///
    /// # Errors
    ///
    /// Opening, stat-ing or mapping the file failed (for example it vanished).
    pub fn open(path: &Path) -> io::Result<LoadState> {
        // O_NONBLOCK: a FIFO put at the path must not block the reader in open(2).
        let file = File::options()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)?;
        ProbesReader::open_file(&file, path)
    }

    /// [`open`](ProbesReader::open) for a file already opened (and checked) by the caller, who
    /// names it `path`: the collector maps the descriptor it checked, so a file swapped in at
    /// the path after the checks is never mapped.
    ///
    /// # Errors
    ///
    /// Stat-ing or mapping the file failed.
    pub fn open_file(file: &File, path: &Path) -> io::Result<LoadState> {
        let metadata = file.metadata()?;
        if !metadata.is_file() {
            let msg = format!("{} is not a regular file", path.display());
            return Err(io::Error::new(io::ErrorKind::InvalidInput, msg));
        }
        let actual = metadata.len();
        if actual < HEADER_LEN as u64 {
            return Ok(LoadState::AwaitVersion);
        }
        // The length checked above, not the file's length at map time: a file that shrinks in
        // between faults (guarded) instead of leaving a mapping shorter than the checks assume.
        let len = usize::try_from(actual).unwrap_or(usize::MAX);
        let map = MmapOptions::new().len(len).map_raw_read_only(file)?;
        // Before the first access: the file may shrink at any time from here on.
        let guard = GuardedRange::new(map.as_ptr(), map.len())?;
        let base = map.as_ptr();
        // SAFETY: the mapping is at least HEADER_LEN bytes and page-aligned; bytes 8..12 are
        // the version word, an AtomicU32 (4-aligned), only ever loaded Relaxed.
        let version_word = unsafe { &*base.add(8).cast::<AtomicU32>() };
        let version = version_word.load(Ordering::Relaxed);
        // SYNC: pairs with the Release store of the version in `ProbesFile::create`.
        fence(Ordering::Acquire);
        if version == 0 {
            return Ok(LoadState::AwaitVersion);
        }
        // SAFETY: as above the mapping holds a whole, 128-aligned Header; the version is
        // published, so its plain fields are initialised and never written again.
        let header = unsafe { &*base.cast::<Header>() };
        if header.magic != MAGIC {
            return Ok(LoadState::Corrupt(Corruption::BadMagic));
        }
        if version >> 16 != u32::from(ABI_MAJOR) {
            let (found, expected) = (version, ABI_VERSION);
            return Ok(LoadState::Incompatible { found, expected });
        }
        if let Err(corruption) = check_header(header, actual) {
            return Ok(LoadState::Corrupt(corruption));
        }
        let info = file_info(header, version);
        let path = path.to_path_buf();
        let regions = header.regions;
        let mut reader = ProbesReader {
            guard,
            map,
            path,
            regions,
            info,
            declarations: Vec::new(),
            refused_declarations: Vec::new(),
            rail_merge: vec![Merge::Sum; RAIL_VALUE_SLOTS],
        };
        reader.load_declarations(header.region_count as usize);
        Ok(LoadState::Ready(reader))
    }

    /// Read the declarations region (minor version 1 on), or take this version's own
    /// declarations for a file of minor version 0, whose words mean the same.
    fn load_declarations(&mut self, region_count: usize) {
        let found: Vec<Result<Option<Declared>, String>> = if region_count > REGION_DECLARATIONS {
            (0..self.regions[REGION_DECLARATIONS].count as usize)
                .map(|i| {
                    // SAFETY: REGION_DECLARATIONS holds DeclarationRecords (checked in `open`)
                    // and `i` is below its count; records are immutable once published.
                    let record =
                        unsafe { self.record::<DeclarationRecord>(REGION_DECLARATIONS, i) };
                    record.decode()
                })
                .collect()
        } else {
            DECLARATIONS
                .iter()
                .filter(|d| declared_in_minor_0(d))
                .map(|d| Ok(Some(Declared::from(d))))
                .collect()
        };
        for entry in found {
            match entry {
                Ok(Some(d)) => {
                    let clash = self
                        .declarations
                        .iter()
                        .any(|o| o.name == d.name || (o.scope == d.scope && o.slot == d.slot));
                    if clash {
                        let why = format!("{:?} repeats a name or a slot", d.name);
                        self.refused_declarations.push(why);
                        continue;
                    }
                    if d.scope == Scope::Rail {
                        self.rail_merge[usize::from(d.slot)] = d.merge;
                    }
                    self.declarations.push(d);
                }
                Ok(None) => {}
                Err(why) => self.refused_declarations.push(why),
            }
        }
    }

    /// The values this file declares (the collector exports each one).
    pub fn declarations(&self) -> &[Declared] {
        &self.declarations
    }

    /// Declaration records this reader could not use, each with the reason.
    pub fn refused_declarations(&self) -> &[String] {
        &self.refused_declarations
    }

    /// Whether the file shrank under the mapping since `open` (another process truncated
    /// it): what was read since is zeros, not the writer's values. Check it after reading.
    pub fn faulted(&self) -> bool {
        self.guard.faulted()
    }

    /// The path this reader opened.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The immutable header fields.
    pub fn info(&self) -> &FileInfo {
        &self.info
    }

    fn header(&self) -> &Header {
        // SAFETY: checked in `open`: the mapping starts with a published Header.
        unsafe { &*self.map.as_ptr().cast::<Header>() }
    }

    /// Record `i` of region `region` as a `T`.
    ///
    /// # Safety
    ///
    /// `T` must be the record type of `region` and `i < regions[region].count`.
    unsafe fn record<T>(&self, region: usize, i: usize) -> &T {
        let desc = self.regions[region];
        let at = desc.offset as usize + i * desc.stride as usize;
        // SAFETY: `open` checked that the region lies inside the mapping, is 128-aligned and
        // has this record type's stride; the caller keeps `i` below the count.
        unsafe { &*self.map.as_ptr().add(at).cast::<T>() }
    }

    /// Last heartbeat, ns since the Unix epoch.
    pub fn heartbeat_ns(&self) -> u64 {
        self.header().heartbeat_ns.load(Ordering::Relaxed)
    }

    /// Clean-shutdown time, ns since the Unix epoch, 0 while the writer runs.
    pub fn closed_ns(&self) -> u64 {
        self.header().closed_ns.load(Ordering::Relaxed)
    }

    /// Whether the file's writer publishes each connection's parts in flight (2.2 on).
    pub fn publishes_in_flight(&self) -> bool {
        // Every 3.x file does (2.2 was the first).
        self.info.abi_version >> 16 >= 3 || self.info.abi_version & 0xffff >= 2
    }

    /// How many connection slots from the first a reader looks at: up to the header's
    /// high-water mark (3.2 on), the whole table in older files. Bounded by the table, whatever
    /// the mark says. Slots above the mark were never claimed, and looking at them would page in
    /// a table that is mostly holes (2 MiB of slots, 3.2 on).
    pub fn connection_slots_used(&self) -> u32 {
        let count = self.regions[REGION_CONNECTIONS].count;
        // `open` admits this major only: the minor says whether the mark is there.
        if self.info.abi_version & 0xffff < 2 {
            return count;
        }
        let mark = self.header().connection_high_water.load(Ordering::Relaxed);
        mark.min(count)
    }

    /// Visits every active connection's in-flight state: cheap enough to call thousands of times
    /// a second (no snapshot, no allocation).
    pub fn sample_in_flight(&self, mut visit: impl FnMut(InFlightSample)) {
        for i in 0..self.connection_slots_used() {
            // SAFETY: REGION_CONNECTIONS holds ConnSlots and `i` is below its count.
            let slot = unsafe { self.record::<ConnSlot>(REGION_CONNECTIONS, i as usize) };
            if let Some(sample) = sample_slot(slot) {
                visit(sample);
            }
        }
    }

    /// Copy every counter, histogram, connection and the dynamic header fields.
    pub fn snapshot(&self) -> Snapshot {
        let header = self.header();
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let rails = (0..self.info.rails.len())
            .map(|rail| self.rail_over_lanes(rail))
            .collect();
        // SAFETY: REGION_PROCESS holds a ProcessBlock; `open` checked count >= 1.
        let process = unsafe { self.record::<ProcessBlock>(REGION_PROCESS, 0) };
        let process = process.values.each_ref().map(load);
        let (mut by_mask, mut lanes_in_use) = ([0u64; 4], 0);
        for lane in 0..WRITER_LANES {
            // SAFETY: REGION_LANES holds LaneBlocks; `open` checked count >= WRITER_LANES.
            let block = unsafe { self.record::<LaneBlock>(REGION_LANES, lane) };
            for (total, word) in by_mask.iter_mut().zip(&block.transfers_by_mask) {
                *total = total.wrapping_add(load(word));
            }
            lanes_in_use += u32::from(writer_thread_alive(self.info.pid, load(&block.owner)));
        }
        let [no_rail, sout_only, sup_only, both] = by_mask;
        let connections = (0..self.connection_slots_used())
            .filter_map(|i| {
                // SAFETY: REGION_CONNECTIONS holds ConnSlots and `i` is below its count.
                let slot = unsafe { self.record::<ConnSlot>(REGION_CONNECTIONS, i as usize) };
                read_slot(slot, i)
            })
            .collect();
        Snapshot {
            pid: self.info.pid,
            start_ns: self.info.start_ns,
            heartbeat_ns: load(&header.heartbeat_ns),
            closed_ns: load(&header.closed_ns),
            rails,
            transfers: TransferCounts {
                no_rail,
                sout_only,
                sup_only,
                both,
            },
            process,
            lanes_in_use,
            connections,
            events_written: self.ring().map_or(0, |r| r.written()),
        }
    }

    /// Rail `rail`'s values and histogram over the writer lanes: each word merged by its
    /// declared rule (sum, highest, or lowest among the lanes that use it), histograms merged.
    fn rail_over_lanes(&self, rail: usize) -> RailSnapshot {
        let mut total = RailSnapshot {
            values: [0; RAIL_VALUE_SLOTS],
            latency: LatencySnapshot {
                buckets: [0; LATENCY_BUCKETS],
                sum: 0,
                consistent: true,
            },
        };
        let mut lowest: [Option<u64>; RAIL_VALUE_SLOTS] = [None; RAIL_VALUE_SLOTS];
        for lane in 0..WRITER_LANES {
            // SAFETY: REGION_RAILS holds RailBlocks; `open` checked count >= WRITER_LANES *
            // MAX_NICS and rail_count <= MAX_NICS.
            let block = unsafe { self.record::<RailBlock>(REGION_RAILS, lane * MAX_NICS + rail) };
            let part = rail_snapshot(block, lane == SHARED_LANE);
            for (slot, merge) in self.rail_merge.iter().enumerate() {
                let (mine, theirs) = (&mut total.values[slot], part.values[slot]);
                match *merge {
                    Merge::Sum => *mine = mine.wrapping_add(theirs),
                    Merge::Highest => *mine = (*mine).max(theirs),
                    Merge::LowestActive { witness } => {
                        if theirs > 0 || part.values[usize::from(witness)] > 0 {
                            let low = &mut lowest[slot];
                            *low = Some(low.map_or(theirs, |l| l.min(theirs)));
                        }
                    }
                }
            }
            total.latency.merge(&part.latency);
        }
        for (slot, low) in lowest.iter().enumerate() {
            if let Some(low) = low {
                total.values[slot] = *low;
            }
        }
        total
    }

    fn ring(&self) -> Option<Ring<'_, { crate::layout::EVENT_WORDS }>> {
        // SAFETY: REGION_RING holds a RingControl; `open` checked count >= 1.
        let ctrl = unsafe { self.record::<RingControl>(REGION_RING, 0) };
        let events = self.regions[REGION_EVENTS];
        let base = self.map.as_ptr().wrapping_add(events.offset as usize);
        // SAFETY: `open` checked that the events region holds `count` EventSlots of stride
        // size_of::<EventSlot>() inside the mapping, 128-aligned.
        let slots =
            unsafe { std::slice::from_raw_parts(base.cast::<EventSlot>(), events.count as usize) };
        Ring::new(ctrl, slots)
    }

    /// Return the intact event records after `cursor` and advance it; lost records (overwritten
    /// before or while being copied) are counted in `dropped`, never returned torn.
    pub fn drain_events(&self, cursor: &mut EventCursor) -> DrainedEvents {
        let mut records = Vec::new();
        let dropped = self.ring().map_or(0, |ring| {
            ring.drain(cursor, |index, words| {
                let transfer = SlowTransfer::decode(&words);
                records.push(SlowTransferRecord { index, transfer });
            })
        });
        DrainedEvents { records, dropped }
    }
}

impl fmt::Debug for ProbesReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProbesReader")
            .field("path", &self.path)
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

fn rail_snapshot(block: &RailBlock, shared: bool) -> RailSnapshot {
    RailSnapshot {
        values: block
            .counters
            .values
            .each_ref()
            .map(|a| a.load(Ordering::Relaxed)),
        latency: if shared {
            block.latency.hist.read_shared()
        } else {
            block.latency.hist.read()
        },
    }
}

fn file_info(header: &Header, version: u32) -> FileInfo {
    let rails = header.rails[..header.rail_count as usize]
        .iter()
        .map(|r| RailInfo {
            device: decode_name(&r.device),
            port: r.port,
            speed_mbps: r.speed_mbps,
        })
        .collect();
    let rail_kinds = header.rails[..header.rail_count as usize]
        .iter()
        .map(|r| usize::from(r.rail))
        .collect();
    // `check_header` refused a device naming a slot past `rail_count`.
    let devices = header.devices[..header.device_count as usize]
        .iter()
        .map(|d| DeviceEntry {
            name: decode_name(&d.name),
            nics: d.nics.map(usize::from),
        })
        .collect();
    FileInfo {
        abi_version: version,
        pid: header.writer_pid,
        start_ns: header.start_ns,
        host: decode_name(&header.host_name),
        rails,
        rail_kinds,
        devices,
        slow_threshold_ns: header.slow_threshold_ns,
        sample_one_in: header.sample_one_in,
    }
}

/// Check the header's lengths and region table against the file's `actual` length.
fn check_header(header: &Header, actual: u64) -> Result<(), Corruption> {
    if header.file_len > actual {
        let expected = header.file_len;
        return Err(Corruption::Truncated { expected, actual });
    }
    let header_len = u64::from(header.header_len);
    if header_len < HEADER_LEN as u64 || header_len > header.file_len {
        return Err(Corruption::BadHeader("header_len"));
    }
    if header.rail_count == 0 || header.rail_count as usize > MAX_NICS {
        return Err(Corruption::BadHeader("rail_count"));
    }
    if header.device_count == 0 || header.device_count as usize > MAX_DEVICES {
        return Err(Corruption::BadHeader("device_count"));
    }
    let nic_count = header.rail_count as usize;
    let devices = &header.devices[..header.device_count as usize];
    if devices
        .iter()
        .any(|d| d.nics.iter().any(|&nic| usize::from(nic) >= nic_count))
    {
        return Err(Corruption::BadHeader("devices"));
    }
    if header.rails[..nic_count]
        .iter()
        .any(|r| usize::from(r.rail) >= MAX_RAILS)
    {
        return Err(Corruption::BadHeader("rails"));
    }
    let region_count = header.region_count as usize;
    if region_count < REQUIRED_REGIONS.max(REGION_COUNT) {
        return Err(Corruption::BadHeader("region_count"));
    }
    for (i, desc) in header.regions.iter().enumerate().take(region_count) {
        check_region(i, desc, header_len, header.file_len)?;
    }
    let counts = header.regions.map(|d| d.count as usize);
    let count_ok = counts[REGION_RAILS] >= WRITER_LANES * MAX_NICS
        && counts[REGION_LANES] >= WRITER_LANES
        && counts[REGION_PROCESS] >= 1
        && counts[REGION_RING] >= 1
        && counts[REGION_EVENTS].is_power_of_two();
    if !count_ok {
        return Err(Corruption::BadHeader("region record counts"));
    }
    Ok(())
}

fn check_region(
    i: usize,
    d: &RegionDesc,
    header_len: u64,
    file_len: u64,
) -> Result<(), Corruption> {
    let (offset, len) = (u64::from(d.offset), u64::from(d.len));
    let fits = offset >= header_len
        && offset % 128 == 0
        && offset + len <= file_len
        && d.stride as usize == REGION_STRIDES[i]
        && u64::from(d.count) * u64::from(d.stride) <= len;
    if fits {
        Ok(())
    } else {
        Err(Corruption::BadRegion(REGION_NAMES[i]))
    }
}

/// Whether lane owner `tid` (0: never used) is a live thread of writer process `pid`. Owners keep
/// their lane after they exit until another thread takes it over (src/lanes.rs), so a reader
/// asks /proc; where the writer's /proc is not visible (another pid namespace) an owner counts
/// as alive.
fn writer_thread_alive(pid: u32, tid: u64) -> bool {
    if tid == 0 {
        return false;
    }
    let process = format!("/proc/{pid}");
    if !Path::new(&process).exists() {
        return true;
    }
    Path::new(&format!("{process}/task/{tid}")).exists()
}
