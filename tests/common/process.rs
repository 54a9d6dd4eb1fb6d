//! What a child test process reads about itself: its own probes file and its resident memory.
//! Shared by `tests/srq_starvation.rs`, `tests/soak.rs`, `tests/lifecycle.rs` and
//! `benches/registrations.rs` (`#[path]`).

// Each test binary uses part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use mpib_probes::{LoadState, ProbesReader, Snapshot};

/// This process's probes file in `dir` (`mpib-<pid>-*.probes`), if there is one.
pub fn own_probes_path(dir: &Path) -> Option<PathBuf> {
    let prefix = format!("mpib-{}-", std::process::id());
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&prefix))
        })
}

/// A copy of this process's probes file in `dir` (`mpib-<pid>-*.probes`).
pub fn own_probes(dir: &Path) -> Snapshot {
    let path = own_probes_path(dir).expect("this process's probes file");
    match ProbesReader::open(&path) {
        Ok(LoadState::Ready(reader)) => reader.snapshot(),
        other => panic!("probes file {} not ready: {other:?}", path.display()),
    }
}

/// This process's resident set size, KiB (`VmRSS` in /proc/self/status; 0 if unreadable).
pub fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}
