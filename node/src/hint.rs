//! The agent's hint file (advanced mode), read without mapping it.
//!
//! Layout (host byte order, 4112 bytes): a 16-byte header `{magic u32 = 0x4D504948 ("MPIH"),
//! max_entries u32 = 256, 8 reserved}`, then 256 entries `{sup_bw u32, seq u32, src_ip u32,
//! dst_ip u32}`. The agent updates an entry as a seqlock (seq odd while writing). The
//! collector reads the whole file twice and keeps an entry only when both copies agree and its
//! seq is even, retrying a few times; an entry that never settles is left out of this scan.

use std::fs;
use std::path::Path;

// The layout is declared once, in the sans-IO crate the plugin and the agent also use.
use mpib_proto::hint::{
    check_header as check_fields, encode_header, entry_offset, header_fields, HINT_HEADER_LEN,
    SEQ_OFFSET, SUP_BW_OFFSET,
};
pub use mpib_proto::hint::{HINT_FILE_LEN, HINT_MAGIC, HINT_MAX_ENTRIES as HINT_ENTRIES};
const TRIES: usize = 4;

/// Why a hint file was not used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HintError {
    /// The file does not exist (no agent): the ratio metric is simply absent.
    Missing,
    /// The file exists but is not a hint file of this layout.
    Invalid(String),
}

/// The settled entries of one read: `sup_bw` per slot, `None` where it did not settle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HintTable {
    sup_bw: Vec<Option<u32>>,
}

impl HintTable {
    /// Read `path`.
    ///
    /// # Errors
    ///
    /// [`HintError::Missing`] when the file is absent; [`HintError::Invalid`] when it is
    /// unreadable, short, or has the wrong magic or entry count.
    pub fn load(path: &Path) -> Result<HintTable, HintError> {
        let read = || match read_regular(path) {
            Ok(bytes) => Ok(bytes),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(HintError::Missing),
            Err(e) => Err(HintError::Invalid(format!("cannot read: {e}"))),
        };
        let first = read()?;
        check_header(&first)?;
        let mut sup_bw = vec![None; HINT_ENTRIES];
        let mut previous = first;
        for _ in 0..TRIES {
            let current = read()?;
            check_header(&current)?;
            for (slot, value) in sup_bw.iter_mut().enumerate() {
                if value.is_none() {
                    *value = settled(&previous, &current, slot);
                }
            }
            if sup_bw.iter().all(Option::is_some) {
                break;
            }
            previous = current;
        }
        Ok(HintTable { sup_bw })
    }

    /// The agent's `sup_bw` (parts per 1024) for `slot`, if it settled.
    pub fn sup_bw(&self, slot: u32) -> Option<u32> {
        self.sup_bw.get(slot as usize).copied().flatten()
    }

    /// `sup_bw / 1024`, at most 1.
    pub fn sup_ratio(&self, slot: u32) -> Option<f64> {
        self.sup_bw(slot)
            .map(|bw| (f64::from(bw) / 1024.0).min(1.0))
    }
}

fn word(bytes: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&bytes[at..at + 4]);
    u32::from_ne_bytes(w)
}

fn check_header(bytes: &[u8]) -> Result<(), HintError> {
    if bytes.len() < HINT_FILE_LEN {
        let len = bytes.len();
        return Err(HintError::Invalid(format!(
            "{len} bytes, expected {HINT_FILE_LEN}"
        )));
    }
    let mut header = [0u8; HINT_HEADER_LEN];
    header.copy_from_slice(&bytes[..HINT_HEADER_LEN]);
    let (magic, entries) = header_fields(&header);
    check_fields(magic, entries).map_err(HintError::Invalid)
}

/// `sup_bw` of `slot` when both copies agree on an even seq and the value.
fn settled(a: &[u8], b: &[u8], slot: usize) -> Option<u32> {
    let at = entry_offset(slot);
    let (bw_a, seq_a) = (word(a, at + SUP_BW_OFFSET), word(a, at + SEQ_OFFSET));
    let (bw_b, seq_b) = (word(b, at + SUP_BW_OFFSET), word(b, at + SEQ_OFFSET));
    (seq_a % 2 == 0 && seq_a == seq_b && bw_a == bw_b).then_some(bw_a)
}

/// A hint file image with `entries` (`(slot, sup_bw, seq)`) set; for tests and demos.
pub fn encode(entries: &[(u32, u32, u32)]) -> Vec<u8> {
    let mut bytes = vec![0u8; HINT_FILE_LEN];
    bytes[..HINT_HEADER_LEN].copy_from_slice(&encode_header());
    for &(slot, sup_bw, seq) in entries {
        let at = entry_offset(slot as usize);
        bytes[at + SUP_BW_OFFSET..at + SUP_BW_OFFSET + 4].copy_from_slice(&sup_bw.to_ne_bytes());
        bytes[at + SEQ_OFFSET..at + SEQ_OFFSET + 4].copy_from_slice(&seq.to_ne_bytes());
    }
    bytes
}

/// The file's bytes, at most one more than a hint file holds. Opened without blocking and
/// refused unless it is (or a link leads to) a regular file: a FIFO put at the path by another
/// user (the directory is under /tmp) must not stall the reader. Links are followed: a hint path
/// may name the agent's file through one (dashboards/e2e/run.sh does).
fn read_regular(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    if !file.metadata()?.file_type().is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    let mut bytes = Vec::with_capacity(HINT_FILE_LEN);
    file.take(HINT_FILE_LEN as u64 + 1)
        .read_to_end(&mut bytes)?;
    Ok(bytes)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn reads_settled_entries_and_clamps() {
        let path = std::env::temp_dir().join(format!("mpib-hint-unit-{}", std::process::id()));
        assert_eq!(HintTable::load(&path), Err(HintError::Missing));
        fs::write(&path, encode(&[(3, 256, 2), (4, 2048, 6), (5, 100, 7)])).unwrap();
        let table = HintTable::load(&path).unwrap();
        assert_eq!(table.sup_ratio(3), Some(0.25));
        assert_eq!(table.sup_ratio(4), Some(1.0));
        assert_eq!(table.sup_ratio(5), None, "odd seq: being written");
        assert_eq!(table.sup_ratio(9), Some(0.0));
        assert_eq!(table.sup_ratio(300), None);
        let mut bad = encode(&[]);
        bad[0] = 0;
        fs::write(&path, &bad).unwrap();
        assert!(
            matches!(HintTable::load(&path), Err(HintError::Invalid(e)) if e.contains("magic"))
        );
        fs::write(&path, [0u8; 10]).unwrap();
        assert!(matches!(HintTable::load(&path), Err(HintError::Invalid(_))));
        fs::remove_file(&path).unwrap();
    }

    #[test]
    fn a_fifo_at_the_path_is_refused_without_blocking_and_a_link_is_followed() {
        let dir = std::env::temp_dir().join(format!("mpib-hint-fifo-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("hints");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        let refused = HintTable::load(&fifo);
        assert!(
            matches!(&refused, Err(HintError::Invalid(e)) if e.contains("not a regular file")),
            "{refused:?}"
        );
        let real = dir.join("real");
        fs::write(&real, encode(&[(3, 256, 2)])).unwrap();
        let link = dir.join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert_eq!(HintTable::load(&link).unwrap().sup_ratio(3), Some(0.25));
        let to_fifo = dir.join("to-fifo");
        std::os::unix::fs::symlink(&fifo, &to_fifo).unwrap();
        assert!(matches!(
            HintTable::load(&to_fifo),
            Err(HintError::Invalid(_))
        ));
        fs::remove_dir_all(&dir).unwrap();
    }
}
