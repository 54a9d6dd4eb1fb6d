//! The agent hint SHM: file layout and the seqlock reader (docs/AGENT.md, 'Writing your own
//! agent').
//!
//! Why a seqlock: the agent rewrites `sup_bw` at any rate while the plugin reads it on every
//! `isend` in advanced mode. A lock would let a stalled agent stall NCCL; a seqlock lets the
//! writer proceed unconditionally (seq odd while writing, even when done) and lets the reader
//! detect a torn read and retry. The reader gives up after a bounded number of tries, so it never
//! waits on the writer indefinitely; the caller then keeps the last value it read (0 = all SOUT
//! before the first, the safe default: docs/AGENT.md, 'What it does').
//!
//! The reader is generic over [`HintCell`] so the retry logic is tested here with a scripted
//! fake, while the engine implements the cell with `Acquire` atomic loads on the mapped file.

/// Header magic, "MPIH".
pub const HINT_MAGIC: u32 = 0x4D50_4948;
/// Entries in the file (one per registered connection slot).
pub const HINT_MAX_ENTRIES: usize = 256;
/// Bytes of the header: magic u32, max_entries u32, 8 reserved bytes.
pub const HINT_HEADER_LEN: usize = 16;
/// Bytes of one entry: sup_bw u32, seq u32, src_ip u32, dst_ip u32.
pub const HINT_ENTRY_LEN: usize = 16;
/// Bytes of the whole file.
pub const HINT_FILE_LEN: usize = 4112;

const _: () = assert!(HINT_FILE_LEN == HINT_HEADER_LEN + HINT_MAX_ENTRIES * HINT_ENTRY_LEN);

/// Offset of `magic` in the header.
pub const MAGIC_OFFSET: usize = 0;
/// Offset of `max_entries` in the header.
pub const MAX_ENTRIES_OFFSET: usize = 4;
/// Offset of `sup_bw` (parts per 1024) within an entry.
pub const SUP_BW_OFFSET: usize = 0;
/// Offset of the seqlock sequence number within an entry.
pub const SEQ_OFFSET: usize = 4;
/// Offset of the SOUT source IP (network order) within an entry.
pub const SRC_IP_OFFSET: usize = 8;
/// Offset of the SOUT destination IP (network order) within an entry.
pub const DST_IP_OFFSET: usize = 12;

/// Byte offset of entry `slot` in the file. Entries are 16-byte aligned (the file is mapped
/// page aligned), so each `u32` field is naturally aligned for atomic access.
#[inline]
pub const fn entry_offset(slot: usize) -> usize {
    HINT_HEADER_LEN + slot * HINT_ENTRY_LEN
}

/// One entry as seen through the mapping; the engine implements it with `Acquire` atomic loads
/// on the mapped memory. `Acquire` on `load_sup_bw` is what keeps the second `load_seq` from
/// being satisfied before the data load, which the torn-read check relies on.
pub trait HintCell {
    /// Current sequence number (odd while the agent is writing).
    fn load_seq(&self) -> u32;
    /// Current `sup_bw` value.
    fn load_sup_bw(&self) -> u32;
}

/// Seqlock read with at most `max_tries` attempts: returns `sup_bw` read while `seq` was even and
/// unchanged, or `None` when every attempt raced a write (or `max_tries` is 0).
#[inline]
pub fn read_hint(cell: &impl HintCell, max_tries: u32) -> Option<u32> {
    for _ in 0..max_tries {
        let before = cell.load_seq();
        if before % 2 == 1 {
            core::hint::spin_loop();
            continue;
        }
        let sup_bw = cell.load_sup_bw();
        if cell.load_seq() == before {
            return Some(sup_bw);
        }
        core::hint::spin_loop();
    }
    None
}

/// Check a mapped file's header; the error names what was wrong and what was expected.
#[inline]
pub fn check_header(magic: u32, max_entries: u32) -> Result<(), String> {
    if magic != HINT_MAGIC {
        return Err(format!(
            "hint file magic is {magic:#010x}, expected {HINT_MAGIC:#010x} (\"MPIH\"): not an \
             MPIB agent hint file"
        ));
    }
    if max_entries as usize != HINT_MAX_ENTRIES {
        return Err(format!(
            "hint file has max_entries {max_entries}, expected {HINT_MAX_ENTRIES}: agent and \
             plugin disagree on the layout"
        ));
    }
    Ok(())
}

/// Header fields `(magic, max_entries)` from the first bytes of the file, in host order (the
/// agent and the plugin share the host, and the C layout uses native `uint32_t`).
#[inline]
pub fn header_fields(header: &[u8; HINT_HEADER_LEN]) -> (u32, u32) {
    let word = |at: usize| {
        u32::from_ne_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]])
    };
    (word(MAGIC_OFFSET), word(MAX_ENTRIES_OFFSET))
}

/// The header the agent writes (used by tests and the loopback demo agent).
#[inline]
pub fn encode_header() -> [u8; HINT_HEADER_LEN] {
    let mut header = [0u8; HINT_HEADER_LEN];
    header[MAGIC_OFFSET..MAGIC_OFFSET + 4].copy_from_slice(&HINT_MAGIC.to_ne_bytes());
    header[MAX_ENTRIES_OFFSET..MAX_ENTRIES_OFFSET + 4]
        .copy_from_slice(&(HINT_MAX_ENTRIES as u32).to_ne_bytes());
    header
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// A cell that replays a script of `seq` values (one per `load_seq`) and `sup_bw` values
    /// (one per `load_sup_bw`), repeating the last value when the script runs out.
    struct Scripted {
        seqs: Vec<u32>,
        values: Vec<u32>,
        seq_loads: Cell<usize>,
        value_loads: Cell<usize>,
    }

    impl Scripted {
        fn new(seqs: &[u32], values: &[u32]) -> Self {
            Scripted {
                seqs: seqs.to_vec(),
                values: values.to_vec(),
                seq_loads: Cell::new(0),
                value_loads: Cell::new(0),
            }
        }

        fn next(script: &[u32], counter: &Cell<usize>) -> u32 {
            let index = counter.get();
            counter.set(index + 1);
            script[index.min(script.len() - 1)]
        }
    }

    impl HintCell for Scripted {
        fn load_seq(&self) -> u32 {
            Scripted::next(&self.seqs, &self.seq_loads)
        }
        fn load_sup_bw(&self) -> u32 {
            Scripted::next(&self.values, &self.value_loads)
        }
    }

    #[test]
    fn layout_constants() {
        assert_eq!(entry_offset(0), 16);
        assert_eq!(entry_offset(255) + HINT_ENTRY_LEN, HINT_FILE_LEN);
        assert_eq!(&HINT_MAGIC.to_be_bytes(), b"MPIH");
    }

    #[test]
    fn stable_read_first_try() {
        let cell = Scripted::new(&[4, 4], &[300]);
        assert_eq!(read_hint(&cell, 3), Some(300));
        assert_eq!(cell.seq_loads.get(), 2);
    }

    #[test]
    fn torn_read_retried() {
        // First try: seq 4 -> value 100 -> seq 6 (a write happened): retry.
        let cell = Scripted::new(&[4, 6, 6, 6], &[100, 700]);
        assert_eq!(read_hint(&cell, 3), Some(700));
        assert_eq!(cell.value_loads.get(), 2);
    }

    #[test]
    fn odd_seq_retried_without_reading_value() {
        let cell = Scripted::new(&[5, 5, 8, 8], &[512]);
        assert_eq!(read_hint(&cell, 3), Some(512));
        assert_eq!(cell.value_loads.get(), 1);
    }

    #[test]
    fn bound_respected() {
        let writing = Scripted::new(&[1], &[9]);
        assert_eq!(read_hint(&writing, 5), None);
        assert_eq!(writing.seq_loads.get(), 5);
        assert_eq!(writing.value_loads.get(), 0);
        let racing = Scripted::new(&[0, 2, 2, 4, 4, 6], &[1, 2, 3]);
        assert_eq!(read_hint(&racing, 3), None);
        assert_eq!(racing.seq_loads.get(), 6);
        let untouched = Scripted::new(&[0], &[0]);
        assert_eq!(read_hint(&untouched, 0), None);
        assert_eq!(untouched.seq_loads.get(), 0);
    }

    #[test]
    fn header_checks() {
        let (magic, entries) = header_fields(&encode_header());
        assert_eq!(check_header(magic, entries), Ok(()));
        let error = check_header(0, 256).unwrap_err();
        assert!(error.contains("magic") && error.contains("0x4d504948"));
        let error = check_header(HINT_MAGIC, 128).unwrap_err();
        assert!(error.contains("max_entries 128") && error.contains("256"));
    }
}
