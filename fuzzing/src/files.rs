//! Targets for the shared files another process writes: the probes file (read by the collector
//! and the agent) and the agent's hint file (read by the plugin on every transfer, and by a
//! restarted agent that takes it over). Each input becomes a file in a private scratch
//! directory; nothing changes the file while it is read.

use std::sync::OnceLock;

use mpib_probes::{EventCursor, LoadState, ProbesFile, ProbesReader, RailInfo, WriterInfo};
use mpib_proto::hint::{encode_header, HINT_FILE_LEN, HINT_HEADER_LEN};

use crate::{discard, scratch};

/// A fresh probes file of this version: a valid, published header and zeroed regions.
#[allow(clippy::expect_used)] // The harness's own setup: without its template no input runs.
fn probes_template() -> &'static [u8] {
    static TEMPLATE: OnceLock<Vec<u8>> = OnceLock::new();
    TEMPLATE.get_or_init(|| {
        let dir = scratch();
        let rail = |device: &str| RailInfo {
            device: device.into(),
            port: 1,
            speed_mbps: 100_000,
        };
        let info = WriterInfo::for_this_process(vec![rail("sout0"), rail("sup0")]);
        let file = ProbesFile::create(&dir, &info).expect("a probes file in the scratch dir");
        let path = file.path().expect("an enabled file").to_path_buf();
        let bytes = std::fs::read(&path).expect("the probes file reads back");
        drop(file);
        let _ = std::fs::remove_dir_all(&dir);
        bytes
    })
}

/// The file the first byte asks for: 0 the rest as the whole file (any length, any header);
/// 1 the rest written over a valid file from offset 0 (header and region table); otherwise
/// the rest as 5-byte patches (`u32` offset, one byte) over a valid file, which reach the
/// regions (counters, connection slots, event records).
fn probes_bytes(mode: u8, rest: &[u8]) -> Vec<u8> {
    if mode % 3 == 0 {
        return rest.to_vec();
    }
    let mut bytes = probes_template().to_vec();
    if mode % 3 == 1 {
        let n = rest.len().min(bytes.len());
        bytes[..n].copy_from_slice(&rest[..n]);
    } else {
        for patch in rest.chunks_exact(5) {
            let offset = u32::from_le_bytes([patch[0], patch[1], patch[2], patch[3]]) as usize;
            let at = offset % bytes.len();
            bytes[at] = patch[4];
        }
    }
    bytes
}

/// A probes file as the collector and the agent read it: open (which checks the header and the
/// region table), copy every counter and connection, drain the event ring twice.
pub fn probes_file(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let path = scratch().with_extension("probes");
    if std::fs::write(&path, probes_bytes(mode, rest)).is_err() {
        return;
    }
    if let Ok(LoadState::Ready(reader)) = ProbesReader::open(&path) {
        read_everything(&reader);
    }
    discard(&path);
}

fn read_everything(reader: &ProbesReader) {
    let snapshot = reader.snapshot();
    assert_eq!(snapshot.rails.len(), reader.info().rails.len());
    let mut cursor = EventCursor::new();
    for _ in 0..2 {
        for record in reader.drain_events(&mut cursor).records {
            assert!(
                record.index < snapshot.events_written,
                "a record past the end"
            );
        }
    }
    let _ = (reader.heartbeat_ns(), reader.closed_ns());
}

/// A hint file as the plugin reads it (map, check the header, read one slot with the seqlock)
/// and as a restarted agent takes it over (reuse, repair or refuse). The first byte picks the
/// slot (its low 7 bits, doubled, so both ends of the table are reached) and, with its high
/// bit, whether the rest is the whole file or goes over a valid header.
pub fn hint_file(data: &[u8]) {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let bytes = if first & 0x80 == 0 {
        rest.to_vec()
    } else {
        let mut bytes = vec![0u8; HINT_FILE_LEN];
        bytes[..HINT_HEADER_LEN].copy_from_slice(&encode_header());
        let n = rest.len().min(HINT_FILE_LEN - HINT_HEADER_LEN);
        bytes[HINT_HEADER_LEN..HINT_HEADER_LEN + n].copy_from_slice(&rest[..n]);
        bytes
    };
    let path = scratch().with_extension("hints");
    if std::fs::write(&path, &bytes).is_err() {
        return;
    }
    let slot = u32::from(first & 0x7f) * 2;
    if let Some(path) = path.to_str() {
        let _ = mpib::net::read_hint_file(path, slot);
    }
    if let Ok((file, _opened)) = mpib_agent::shm::HintFile::open(&path) {
        for (slot, entry) in file.flows() {
            assert_eq!(file.entry(slot), entry);
        }
    }
    discard(&path);
}
