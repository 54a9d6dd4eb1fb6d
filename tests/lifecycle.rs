//! The library's life cycle as a long job sees it: 100 rounds of dlopen → init → connect →
//! transfer → close → finalize → dlclose in one process leave no thread, file descriptor,
//! mapping or memory behind (read from /proc/self between rounds), and each dlclose unmaps the
//! library itself; every ABI v7 ... v12 on the loopback and tcp fabrics unloads as NCCL unloads
//! it (no `finalize` before v11) and leaves no plugin thread running. In a child process, so
//! nothing else in it holds the library or its resources.
#![allow(clippy::unwrap_used, clippy::expect_used)] // A failed unwrap fails the test, with its message.

use std::time::Duration;

use mpib_driver::testing::exchange_sizes;
use mpib_driver::{child, running_plugin_threads, Pair, Version};

#[path = "common/process.rs"]
mod process;
use process::rss_kib;

const ROUNDS: usize = 100;
/// Rounds before the baseline: allocator arenas, lazily bound symbols and the first loads'
/// one-time work settle first.
const WARM_UP: usize = 5;
const CHILD_LIMIT: Duration = Duration::from_secs(600);

/// What a leak would grow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Resources {
    threads: usize,
    fds: usize,
    mappings: usize,
    rss_kib: u64,
}

fn count_entries(dir: &str) -> usize {
    std::fs::read_dir(dir).map_or(0, |d| d.count())
}

fn resources() -> Resources {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    Resources {
        threads: count_entries("/proc/self/task"),
        fds: count_entries("/proc/self/fd"),
        mappings: maps.lines().count(),
        rss_kib: rss_kib(),
    }
}

/// Runs `child_rounds` in a child process with `fabric` (and its own probes directory).
fn rounds_in_a_child(name: &str, fabric: &[(&str, &str)]) {
    let probes = std::env::temp_dir().join(format!("mpib-{name}-{}", std::process::id()));
    let dir = probes.to_str().unwrap().to_string();
    let mut env = fabric.to_vec();
    env.push(("MPIB_PROBES_DIR", dir.as_str()));
    let outcome = child::run_test("child_rounds", &env, CHILD_LIMIT).unwrap();
    let _ = std::fs::remove_dir_all(&probes);
    outcome.assert_success("child_rounds");
    for line in outcome.output.lines().filter(|l| l.starts_with("after ")) {
        eprintln!("{line}");
    }
}

#[test]
fn a_hundred_load_use_unload_rounds_leak_nothing() {
    rounds_in_a_child("lifecycle", &[("MPIB_FABRIC", "loopback")]);
}

/// The same over the tcp fabric, whose rails each run a thread: every round's threads, sockets
/// and listeners must be gone once the round's comms are closed and the plugin finalized.
#[test]
fn a_hundred_rounds_over_tcp_leak_no_thread_or_socket() {
    rounds_in_a_child("lifecycle-tcp", &TCP);
}

/// The tcp fabric's rails, both on this host's loopback interface.
const TCP: [(&str, &str); 3] = [
    ("MPIB_FABRIC", "tcp"),
    ("MPIB_HCA_SOUT", "127.0.0.1"),
    ("MPIB_HCA_SUP", "lo=127.0.0.2"),
];

/// NCCL unloads its net plugin when its last communicator goes; ABI v7 ... v10 have no
/// `finalize`, so the plugin's threads (the housekeeper, and on tcp one per rail) must be stopped
/// from the image's fini entry, or their next wake-up runs unmapped code (on tcp the process died
/// of SIGSEGV within 200 ms of `dlclose`). Every ABI in turn, in one child per fabric: closes,
/// `finalize` where the table has one, `dlclose`, then no plugin thread runs and the image is
/// unmapped.
#[test]
fn every_abi_unloads_without_leaving_a_thread_on_loopback() {
    unload_rounds_in_a_child(&[("MPIB_FABRIC", "loopback")]);
}

/// [`every_abi_unloads_without_leaving_a_thread_on_loopback`] over the tcp fabric.
#[test]
fn every_abi_unloads_without_leaving_a_thread_on_tcp() {
    unload_rounds_in_a_child(&TCP);
}

fn unload_rounds_in_a_child(fabric: &[(&str, &str)]) {
    let outcome = child::run_test("child_unload_every_abi", fabric, CHILD_LIMIT).unwrap();
    outcome.assert_success("child_unload_every_abi");
}

/// Fails unless `dlclose` unmapped `image` (nothing pinned it).
fn assert_unmapped(image: &std::path::Path, label: &str) {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let image = image.to_string_lossy();
    assert!(
        !maps.lines().any(|line| line.ends_with(image.as_ref())),
        "{label}: {image} is still mapped after dlclose"
    );
}

#[test]
#[ignore = "runs in a child process started by every_abi_unloads_without_leaving_a_thread_on_*"]
fn child_unload_every_abi() {
    if !child::is_child("child_unload_every_abi") {
        return;
    }
    for version in Version::ALL {
        let label = format!("v{}", version.number());
        let plugin = mpib_driver::load_built_plugin().unwrap_or_else(|e| panic!("{e}"));
        let image = std::fs::canonicalize(plugin.path()).unwrap();
        let net = plugin.net(version).unwrap();
        let mut pair = Pair::connect(&net).unwrap_or_else(|e| panic!("{label}: {e}"));
        exchange_sizes(&mut pair, &[0, 4097, 1 << 20], &label, 1)
            .unwrap_or_else(|e| panic!("{label}: {e}"));
        // closeSend, closeRecv, deregMr, and finalize only where the table has one (v11+).
        pair.close().unwrap_or_else(|e| panic!("{label}: {e}"));
        let running = running_plugin_threads();
        assert!(
            version.has_context() || running.iter().any(|t| t == "mpib-housekeep"),
            "{label}: the housekeeper runs while the plugin is loaded and not finalized ({running:?})"
        );
        let tcp = std::env::var("MPIB_FABRIC").is_ok_and(|f| f == "tcp");
        assert!(
            !tcp || version.has_context() || running.iter().any(|t| t.starts_with("mpib-tcp-")),
            "{label}: the tcp rail threads run while the plugin is loaded and not finalized \
             ({running:?})"
        );
        drop(net);
        drop(plugin); // dlclose
                      // Longer than any plugin thread's sleep (the tcp rail thread's 200 ms): a thread left
                      // running would wake into unmapped code and take the process down.
        std::thread::sleep(Duration::from_millis(300));
        let left = running_plugin_threads();
        assert!(
            left.is_empty(),
            "{label}: plugin threads outlived dlclose: {left:?}"
        );
        assert_unmapped(&image, &label);
        eprintln!("{label}: unloaded, no plugin thread left");
    }
}

/// A process that forks once the plugin's threads run (a data loader, a launcher) has a child
/// that inherits the plugin's state but none of its threads; when that child calls `exit`, the
/// fini entry must not join its parent's threads, which it would wait for forever.
#[test]
fn a_forked_child_exits_without_waiting_for_its_parents_threads() {
    let outcome = child::run_test("child_forks", &TCP, CHILD_LIMIT).unwrap();
    outcome.assert_success("child_forks");
}

#[test]
#[ignore = "runs in a child process started by a_forked_child_exits_without_waiting_for_its_parents_threads"]
fn child_forks() {
    if !child::is_child("child_forks") {
        return;
    }
    let plugin = mpib_driver::load_built_plugin().unwrap_or_else(|e| panic!("{e}"));
    let net = plugin.net(Version::V8).unwrap();
    let mut pair = Pair::connect(&net).unwrap_or_else(|e| panic!("{e}"));
    exchange_sizes(&mut pair, &[4097], "before the fork", 1).unwrap_or_else(|e| panic!("{e}"));
    let running = running_plugin_threads();
    assert!(
        running.iter().any(|t| t.starts_with("mpib-tcp-")),
        "the rail threads run before the fork ({running:?})"
    );
    // SAFETY: the child calls only `exit`, which runs the fini entries (what is tested).
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        // SAFETY: ends the forked child as a C program's `exit` would.
        unsafe { libc::exit(0) };
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut status = 0;
    // SAFETY: waits for our own child without blocking.
    while unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } == 0 {
        if std::time::Instant::now() > deadline {
            // SAFETY: our own child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("the forked child did not exit within 10 s (its exit waited for threads it does not have)");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the forked child ended with status {status:#x}"
    );
    exchange_sizes(&mut pair, &[4097], "after the fork", 2).unwrap_or_else(|e| panic!("{e}"));
    pair.close().unwrap_or_else(|e| panic!("{e}"));
    drop(net);
    drop(plugin);
}

#[test]
#[ignore = "runs in a child process started by a_hundred_load_use_unload_rounds_leak_nothing"]
fn child_rounds() {
    if !child::is_child("child_rounds") {
        return;
    }
    let mut baseline = None;
    for round in 0..ROUNDS {
        if round == WARM_UP {
            baseline = Some(resources());
        }
        let plugin = mpib_driver::load_built_plugin().unwrap_or_else(|e| panic!("{e}"));
        let image = std::fs::canonicalize(plugin.path()).unwrap();
        let net = plugin.net(Version::V12).unwrap();
        let mut pair = Pair::connect(&net).unwrap_or_else(|e| panic!("round {round}: {e}"));
        let case = format!("round {round}");
        exchange_sizes(&mut pair, &[0, 4097, 1 << 20], &case, 1)
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        pair.close()
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        drop(net);
        drop(plugin); // dlclose
                      // Nothing pins the image (no thread-exit destructor registered from it): dlclose
                      // unmapped it, so a later dlopen starts from fresh statics.
        assert_unmapped(&image, &case);
    }
    let (before, after) = (baseline.unwrap(), resources());
    eprintln!("after {WARM_UP} rounds: {before:?}; after {ROUNDS}: {after:?}");
    assert_eq!(after.threads, before.threads, "threads left behind");
    assert_eq!(after.fds, before.fds, "file descriptors left behind");
    assert_eq!(after.mappings, before.mappings, "mappings left behind");
    // 95 rounds of 1 MiB transfers: a leak of even one buffer per round would add ~95 MiB.
    let grown = after.rss_kib.saturating_sub(before.rss_kib);
    assert!(
        grown < 16 * 1024,
        "RSS grew {grown} KiB over {} rounds",
        ROUNDS - WARM_UP
    );
}
