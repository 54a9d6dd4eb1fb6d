//! What the integration tests of the node-side tools (`mpib-agent`, `mpib-top`, the drivers)
//! share, written once: a private directory per test, the workspace's built binaries, polling
//! with a bound, a free port. A dev-dependency only: nothing here ships.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// A fresh directory under the temp dir for test `name` of suite `suite`, with an empty
/// `probes/` in it (what a previous run left there is removed first).
pub fn temp_dir(suite: &str, name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mpib-{suite}-it-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("probes")).expect("create the test directory");
    dir
}

/// A built binary of the workspace, found beside the test executable (`cargo test --workspace`
/// builds every binary of every package before it runs a test).
pub fn workspace_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable");
    for dir in exe.ancestors().skip(1).take(3) {
        let candidate = dir.join(name);
        if candidate.is_file() {
            return candidate;
        }
    }
    panic!(
        "{name} not found next to {}: build the workspace first (cargo build --workspace)",
        exe.display()
    );
}

/// Polls `check` every 20 ms until it holds (true) or `limit` passes (false, after a last try).
pub fn eventually(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if check() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A TCP port of 127.0.0.1 that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_test_directory_starts_empty_with_probes_in_it() {
        let dir = temp_dir("testkit", "fresh");
        std::fs::write(dir.join("left"), b"x").unwrap();
        let again = temp_dir("testkit", "fresh");
        assert_eq!(dir, again);
        assert!(!again.join("left").exists() && again.join("probes").is_dir());
        let _ = std::fs::remove_dir_all(&again);
    }

    #[test]
    fn eventually_says_whether_the_check_held_in_time() {
        let mut calls = 0;
        assert!(eventually(Duration::from_secs(1), || {
            calls += 1;
            calls == 3
        }));
        assert!(!eventually(Duration::from_millis(50), || false));
    }
}
