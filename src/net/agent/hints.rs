//! Advanced mode's hint SHM (docs/AGENT.md, 'Writing your own agent'): the agent's per-flow SUP
//! share, read with the seqlock on every transfer. The registration that hands out the slot is
//! in [`crate::net::agent::registration`].
//!
//! Only advanced mode (`MPIB_MODE=1`) maps it; vanilla never does. Without it (or without a slot)
//! every transfer goes 100 % SOUT (docs/AGENT.md, 'What it does'), logged once at WARN.

use std::os::unix::fs::MetadataExt as _;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use memmap2::Mmap;
use mpib_probes::guard::{GuardedRange, Lost};

use crate::log;
use crate::net::observe::telemetry::Telemetry;
use crate::params::Settings;
use crate::proto::hint::{
    check_header, entry_offset, read_hint, HintCell, HINT_FILE_LEN, HINT_MAX_ENTRIES, SEQ_OFFSET,
    SUP_BW_OFFSET,
};

/// Seqlock read attempts per transfer before keeping the previous value.
const HINT_TRIES: u32 = 8;

/// The process's hint mappings, each shared by the connections that read the same path.
static MAPPINGS: Mutex<Vec<Weak<HintMapping>>> = Mutex::new(Vec::new());

/// The hint file mapped once per process and path, shared by every connection reading it.
struct HintMapping {
    /// Turns a fault (the file shrank) into zero pages; dropped before `map`.
    guard: GuardedRange,
    map: Mmap,
    path: String,
    /// The mapped file's device and inode.
    identity: (u64, u64),
    /// 0 while the file is the one mapped and whole, else a [`Lost`] code: set by
    /// [`check_hint_files`] off the data path, read on every send.
    lost: AtomicU8,
}

impl HintMapping {
    /// The process's mapping of `path`, mapped and checked on first use.
    fn shared(path: &str) -> Result<Arc<HintMapping>, String> {
        let mut mappings = MAPPINGS.lock().unwrap_or_else(PoisonError::into_inner);
        mappings.retain(|m| m.strong_count() > 0);
        let live = mappings.iter().filter_map(Weak::upgrade);
        if let Some(mapping) = live
            .filter(|m| m.path == path)
            .find(|m| m.check().is_none())
        {
            return Ok(mapping);
        }
        let (map, guard, identity) = map_hints(path)?;
        let mapping = Arc::new(HintMapping {
            guard,
            map,
            path: path.to_owned(),
            identity,
            lost: AtomicU8::new(0),
        });
        mappings.push(Arc::downgrade(&mapping));
        Ok(mapping)
    }

    /// Why the mapping no longer shows the agent's hints, if it does not: one `stat`, so
    /// never on the data path.
    fn check(&self) -> Option<Lost> {
        self.guard.lost(Path::new(&self.path), self.identity)
    }

    /// What [`check_hint_files`] or the guard found, for the data path: two loads.
    #[inline]
    fn lost(&self) -> Option<&'static str> {
        if self.guard.faulted() {
            return Some(Lost::Shrank.reason());
        }
        Lost::from_code(self.lost.load(Ordering::Relaxed)).map(Lost::reason)
    }
}

/// Check every hint file this process maps: still the file at its path, and whole. Called
/// about once a second by the housekeeping thread (`crate::net::observe::housekeeper`), never from the data
/// path; the connections reading a lost file notice it at their next send.
pub(crate) fn check_hint_files() {
    let mappings = MAPPINGS.lock().unwrap_or_else(PoisonError::into_inner);
    let live: Vec<Arc<HintMapping>> = mappings.iter().filter_map(Weak::upgrade).collect();
    drop(mappings);
    for mapping in live {
        if let Some(lost) = mapping.check() {
            mapping.lost.store(lost.code(), Ordering::Relaxed);
        }
    }
}

/// Reads one connection's hint entry; without a mapping or a slot it reads 0 (all SOUT).
pub(crate) struct HintReader {
    mapping: Option<Arc<HintMapping>>,
    telemetry: Option<Arc<Telemetry>>,
    slot: usize,
    last: u32,
}

impl HintReader {
    /// The reader for vanilla mode or when the agent is absent: always 0.
    pub(crate) fn none() -> HintReader {
        HintReader {
            mapping: None,
            telemetry: None,
            slot: 0,
            last: 0,
        }
    }

    /// Maps the hint file read-only for `slot`; on any problem, WARN and read 0.
    pub(crate) fn open(settings: &Settings, slot: u32, telemetry: Arc<Telemetry>) -> HintReader {
        if !crate::net::agent::registration::hint_file_trusted(settings) {
            return HintReader::none();
        }
        match HintMapping::shared(&settings.hint_path) {
            Ok(mapping) => HintReader {
                mapping: Some(mapping),
                telemetry: Some(telemetry),
                slot: slot as usize,
                last: 0,
            },
            Err(e) => {
                warn!(
                    log::NET,
                    "MPIB_HINT_PATH={}: {e}; transfers go 100% SOUT", settings.hint_path
                );
                HintReader::none()
            }
        }
    }

    /// The agent's current SUP share (parts per 1024); keeps the last value if every try raced.
    pub(crate) fn read(&mut self) -> u32 {
        let Some(mapping) = &self.mapping else {
            return 0;
        };
        if let Some(why) = mapping.lost() {
            self.lose(why);
            return 0;
        }
        let cell = MappedCell {
            base: mapping.map.as_ptr(),
            offset: entry_offset(self.slot),
        };
        if let Some(value) = read_hint(&cell, HINT_TRIES) {
            self.last = value;
        }
        self.last
    }

    /// Stop reading a hint file that is gone: all SOUT from now on, counted per connection and
    /// logged once per process.
    #[cold]
    fn lose(&mut self, why: &str) {
        static WARNED: AtomicBool = AtomicBool::new(false);
        let path = self
            .mapping
            .take()
            .map(|m| m.path.clone())
            .unwrap_or_default();
        if let Some(telemetry) = self.telemetry.take() {
            telemetry.hint_file_lost();
        }
        self.last = 0;
        if !WARNED.swap(true, Ordering::Relaxed) {
            warn!(
                log::NET,
                "MPIB_HINT_PATH={path}: {why}; advanced-mode connections reading it now move all \
                 their bytes on SOUT (counted in mpib_hint_file_lost_total; new connections map \
                 the file again)"
            );
        }
    }
}

/// The plugin's reading of a hint file, once: map it read-only and check it as a connection
/// does, then read entry `slot` with the seqlock (0 when every try raced a write). For tools and
/// the fuzz targets (`fuzzing/`); errors say what was wrong with the file.
pub fn read_hint_file(path: &str, slot: u32) -> Result<u32, String> {
    if slot as usize >= HINT_MAX_ENTRIES {
        return Err(format!(
            "hint slot {slot}, expected below {HINT_MAX_ENTRIES}"
        ));
    }
    let (map, _guard, _) = map_hints(path)?;
    let cell = MappedCell {
        base: map.as_ptr(),
        offset: entry_offset(slot as usize),
    };
    Ok(read_hint(&cell, HINT_TRIES).unwrap_or(0))
}

/// Maps the file at `path` (guarded before the first access) and checks its size and header;
/// the mapping, its guard and the file's device and inode.
fn map_hints(path: &str) -> Result<(Mmap, GuardedRange, (u64, u64)), String> {
    let file = std::fs::File::open(path).map_err(|e| format!("cannot open: {e}"))?;
    let metadata = file.metadata().map_err(|e| format!("cannot stat: {e}"))?;
    let identity = (metadata.dev(), metadata.ino());
    let len = metadata.len();
    if len < HINT_FILE_LEN as u64 {
        return Err(format!("{len} bytes, expected {HINT_FILE_LEN}"));
    }
    // Exactly HINT_FILE_LEN bytes, whatever the file's length is by now: a file that shrank
    // since the check faults (guarded below) instead of leaving a shorter mapping.
    // SAFETY: a read-only shared mapping; the agent writes the entries concurrently, which is
    // why every field is read through atomics (`MappedCell`).
    let map = unsafe { memmap2::MmapOptions::new().len(HINT_FILE_LEN).map(&file) }
        .map_err(|e| format!("cannot map: {e}"))?;
    let guard = GuardedRange::new(map.as_ptr(), map.len()).map_err(|e| e.to_string())?;
    let word = |offset: usize| {
        u32::from_ne_bytes([
            map[offset],
            map[offset + 1],
            map[offset + 2],
            map[offset + 3],
        ])
    };
    check_header(word(0), word(4))?;
    Ok((map, guard, identity))
}

/// One hint entry inside the mapping.
struct MappedCell {
    base: *const u8,
    offset: usize,
}

impl MappedCell {
    fn load(&self, field: usize) -> u32 {
        // SAFETY: `offset + field + 4 <= HINT_FILE_LEN <= map length` (entry_offset stays inside
        // the 256 entries and the mapping was checked to be at least HINT_FILE_LEN); the address is
        // 4-byte aligned (page-aligned base, 16-byte entries); the agent writes it atomically.
        let atomic = unsafe { AtomicU32::from_ptr(self.base.add(self.offset + field) as *mut u32) };
        atomic.load(Ordering::Acquire)
    }
}

impl HintCell for MappedCell {
    fn load_seq(&self) -> u32 {
        self.load(SEQ_OFFSET)
    }
    fn load_sup_bw(&self) -> u32 {
        self.load(SUP_BW_OFFSET)
    }
}
