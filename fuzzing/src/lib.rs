//! MPIB's fuzz targets: one function per decoder of bytes that come from outside the process
//! (a peer, the agent, another process's shared file). Each takes arbitrary bytes and must
//! return without panicking; where the decoder has an encoder, whatever decodes re-encodes to a
//! value that decodes to itself.
//!
//! The same functions run two ways: `fuzz/` wraps each in a libFuzzer target for
//! coverage-guided runs (`scripts/fuzz`), and `tests/corpus.rs` replays every committed
//! corpus and regression input through them under `cargo test`, on the stable toolchain.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

mod files;
mod messages;

pub use files::{hint_file, probes_file};
pub use messages::{
    agent_message, completion_record, cts_entry, handshake, imm, link_frames, tcp_wire,
};

/// A target: arbitrary bytes in, a panic on a bug.
pub type Target = fn(&[u8]);

/// Every target by name (the names of `fuzz/fuzz_targets/*.rs` and `fuzz/corpus/*/`).
pub const TARGETS: [(&str, Target); 9] = [
    ("handshake", handshake),
    ("tcp_wire", tcp_wire),
    ("link_frames", link_frames),
    ("cts_entry", cts_entry),
    ("completion_record", completion_record),
    ("imm", imm),
    ("agent_message", agent_message),
    ("probes_file", probes_file),
    ("hint_file", hint_file),
];

/// A private scratch directory for the file targets, one per process, under the system's temp
/// directory (created on first use with mode 0700).
pub(crate) fn scratch() -> PathBuf {
    static CALL: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!("mpib-fuzz-{}", std::process::id()));
    if !dir.is_dir() {
        use std::os::unix::fs::DirBuilderExt;
        let _ = std::fs::DirBuilder::new().mode(0o700).create(&dir);
    }
    dir.join(format!("input-{}", CALL.fetch_add(1, Ordering::Relaxed)))
}

/// Remove a scratch file (ignoring its absence).
pub(crate) fn discard(path: &Path) {
    let _ = std::fs::remove_file(path);
}
