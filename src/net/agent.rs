//! Advanced mode's hint SHM (docs/AGENT.md, 'Writing your own agent'): the agent's per-flow SUP
//! share, read with the seqlock on every transfer. The registration that hands out the slot is
//! in [`super::registration`].
//!
//! Only advanced mode (`MPIB_MODE=1`) maps it; vanilla never does. Without it (or without a slot)
//! every transfer goes 100 % SOUT (docs/AGENT.md, 'What it does'), logged once at WARN.

use std::sync::atomic::{AtomicU32, Ordering};

use memmap2::Mmap;

use crate::log;
use crate::params::Settings;
use crate::proto::hint::{
    check_header, entry_offset, read_hint, HintCell, HINT_FILE_LEN, HINT_MAX_ENTRIES, SEQ_OFFSET,
    SUP_BW_OFFSET,
};

/// Seqlock read attempts per transfer before keeping the previous value.
const HINT_TRIES: u32 = 8;

/// Reads one connection's hint entry; without a mapping or a slot it reads 0 (all SOUT).
pub(crate) struct HintReader {
    map: Option<Mmap>,
    slot: usize,
    last: u32,
}

impl HintReader {
    /// The reader for vanilla mode or when the agent is absent: always 0.
    pub(crate) fn none() -> HintReader {
        HintReader {
            map: None,
            slot: 0,
            last: 0,
        }
    }

    /// Maps the hint file read-only for `slot`; on any problem, WARN and read 0.
    pub(crate) fn open(settings: &Settings, slot: u32) -> HintReader {
        if !super::registration::hint_file_trusted(settings) {
            return HintReader::none();
        }
        match map_hints(&settings.hint_path) {
            Ok(map) => HintReader {
                map: Some(map),
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
        let Some(map) = &self.map else { return 0 };
        let cell = MappedCell {
            base: map.as_ptr(),
            offset: entry_offset(self.slot),
        };
        if let Some(value) = read_hint(&cell, HINT_TRIES) {
            self.last = value;
        }
        self.last
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
    let map = map_hints(path)?;
    let cell = MappedCell {
        base: map.as_ptr(),
        offset: entry_offset(slot as usize),
    };
    Ok(read_hint(&cell, HINT_TRIES).unwrap_or(0))
}

fn map_hints(path: &str) -> Result<Mmap, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("cannot open: {e}"))?;
    let len = file
        .metadata()
        .map_err(|e| format!("cannot stat: {e}"))?
        .len();
    if len < HINT_FILE_LEN as u64 {
        return Err(format!("{len} bytes, expected {HINT_FILE_LEN}"));
    }
    // SAFETY: a read-only shared mapping; the agent writes the entries concurrently, which is
    // why every field is read through atomics (`MappedCell`).
    let map = unsafe { Mmap::map(&file) }.map_err(|e| format!("cannot map: {e}"))?;
    let word = |offset: usize| {
        u32::from_ne_bytes([
            map[offset],
            map[offset + 1],
            map[offset + 2],
            map[offset + 3],
        ])
    };
    check_header(word(0), word(4))?;
    Ok(map)
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
