//! The fault guard: a shrunk file under a guarded mapping reads zeros and is reported; a fault
//! in an unguarded mapping still ends the process (run in a child).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs::{self, File, OpenOptions};
use std::os::unix::process::ExitStatusExt as _;
use std::path::PathBuf;
use std::process::Command;

use memmap2::MmapOptions;

use crate::guard::GuardedRange;
use crate::WriterInfo;

fn temp_file(tag: &str, len: usize) -> (PathBuf, File) {
    let path = std::env::temp_dir().join(format!("mpib-guard-{tag}-{}", std::process::id()));
    let _ = fs::remove_file(&path);
    fs::write(&path, vec![0xab_u8; len]).unwrap();
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    (path, file)
}

#[test]
fn a_shrunk_file_reads_zeros_and_is_reported() {
    let (path, file) = temp_file("shrunk", 3 * 4096);
    let map = MmapOptions::new().map_raw(&file).unwrap();
    let guard = GuardedRange::new(map.as_ptr(), map.len()).unwrap();
    let at = |offset: usize| {
        // SAFETY: inside the mapping, which stays mapped (zero pages after the fault).
        unsafe { map.as_ptr().add(offset).read_volatile() }
    };
    assert_eq!((at(0), at(2 * 4096)), (0xab, 0xab));
    assert!(!guard.faulted());
    // Another process's truncate: the pages past the new end would SIGBUS.
    OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(100)
        .unwrap();
    assert_eq!(at(2 * 4096), 0, "zeros instead of SIGBUS");
    assert!(guard.faulted());
    assert_eq!(
        at(0),
        0,
        "the whole range is replaced, so every reading agrees"
    );
    // SAFETY: inside the (replaced) mapping; writes go to private zero pages.
    unsafe { map.as_mut_ptr().add(4096).write_volatile(7) };
    drop(guard);
    drop(map);
    let _ = fs::remove_file(&path);
}

#[test]
fn ranges_are_reused_and_checked() {
    let (path, file) = temp_file("reuse", 4096);
    let map = MmapOptions::new().map_raw(&file).unwrap();
    for _ in 0..2 * crate::guard::GUARDED_RANGES {
        let guard = GuardedRange::new(map.as_ptr(), map.len()).unwrap();
        assert!(!guard.faulted());
    }
    // SAFETY: one byte past a page-aligned start: not page-aligned.
    let odd = unsafe { map.as_ptr().add(1) };
    let e = GuardedRange::new(odd, 10).unwrap_err();
    assert!(e.to_string().contains("not page-aligned"), "{e}");
    let _ = fs::remove_file(&path);
}

extern "C" fn previous_plain(_: libc::c_int) {
    // SAFETY: _exit is async-signal-safe.
    unsafe { libc::_exit(42) }
}

extern "C" fn previous_siginfo(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: _exit is async-signal-safe.
    unsafe { libc::_exit(43) }
}

/// Install `handler` (as SA_SIGINFO when `siginfo`) or ignore SIGBUS, before the guard.
fn install_previous(handler: libc::sighandler_t, siginfo: bool) {
    // SAFETY: sigaction(2) with a zeroed, filled action.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = handler;
        action.sa_flags = if siginfo { libc::SA_SIGINFO } else { 0 };
        libc::sigemptyset(&mut action.sa_mask);
        assert_eq!(
            libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut()),
            0
        );
    }
}

/// Fault in a mapping no guard covers (the guard is installed, on another range).
fn fault_outside_every_guarded_range() -> u8 {
    let (guarded_path, guarded_file) = temp_file("child-guarded", 4096);
    let guarded = MmapOptions::new().map_raw(&guarded_file).unwrap();
    let guard = GuardedRange::new(guarded.as_ptr(), guarded.len()).unwrap();
    let (path, file) = temp_file("child-bare", 2 * 4096);
    let bare = MmapOptions::new().map_raw(&file).unwrap();
    file.set_len(0).unwrap();
    let _ = fs::remove_file(&guarded_path);
    let _ = fs::remove_file(&path);
    // SAFETY: the access that faults.
    let byte = unsafe { bare.as_ptr().add(4096).read_volatile() };
    drop(guard);
    byte
}

/// The children of the tests below, by `MPIB_GUARD_CHILD`.
#[test]
#[ignore = "run by the guard tests below in a child process"]
fn guard_child() {
    let Some(case) = std::env::var_os("MPIB_GUARD_CHILD") else {
        return;
    };
    match case.to_str().unwrap() {
        "unguarded" => {}
        "previous-plain" => {
            let handler: extern "C" fn(libc::c_int) = previous_plain;
            install_previous(handler as libc::sighandler_t, false);
        }
        "previous-siginfo" => {
            let handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                previous_siginfo;
            install_previous(handler as libc::sighandler_t, true);
        }
        "sent" | "sent-ignored" => {
            // (Rust's runtime has its own SIGBUS handler for stack overflows, which lets a sent
            // signal pass: the default action, as in a C host process, is set first.)
            let previous = if case == "sent-ignored" {
                libc::SIG_IGN
            } else {
                libc::SIG_DFL
            };
            install_previous(previous, false);
            let (path, file) = temp_file("child-sent", 2 * 4096);
            let map = MmapOptions::new().map_raw(&file).unwrap();
            let guard = GuardedRange::new(map.as_ptr(), map.len()).unwrap();
            // SAFETY: kill(2) to this process.
            unsafe { libc::kill(libc::getpid(), libc::SIGBUS) };
            // Ignored: the guard still works afterwards.
            file.set_len(0).unwrap();
            // SAFETY: inside the guarded mapping.
            let byte = unsafe { map.as_ptr().add(4096).read_volatile() };
            assert!(guard.faulted() && byte == 0);
            let _ = fs::remove_file(&path);
            println!("survived a sent SIGBUS");
            return;
        }
        "uninstalled" => {
            let (path, file) = temp_file("child-uninstalled", 2 * 4096);
            let map = MmapOptions::new().map_raw(&file).unwrap();
            let _guard = GuardedRange::new(map.as_ptr(), map.len()).unwrap();
            // What the library's unloading runs: the previous action is back, so even a fault
            // in a still-registered range now ends the process.
            crate::guard::uninstall();
            file.set_len(0).unwrap();
            let _ = fs::remove_file(&path);
            // SAFETY: the access that faults, with the default action in place.
            let byte = unsafe { map.as_ptr().add(4096).read_volatile() };
            println!("survived after uninstall, read {byte}");
            return;
        }
        other => panic!("unknown case {other}"),
    }
    let byte = fault_outside_every_guarded_range();
    println!("survived an unguarded fault, read {byte}");
}

fn run_child(case: &str) -> (std::process::ExitStatus, String) {
    let output = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "tests_guard::guard_child",
            "--ignored",
            "--nocapture",
        ])
        .env("MPIB_GUARD_CHILD", case)
        .output()
        .unwrap();
    (
        output.status,
        String::from_utf8_lossy(&output.stdout).into_owned(),
    )
}

#[test]
fn an_unguarded_fault_still_ends_the_process() {
    let (status, stdout) = run_child("unguarded");
    assert_eq!(status.signal(), Some(libc::SIGBUS), "{status:?}\n{stdout}");
    assert!(!stdout.contains("survived"), "{stdout}");
}

#[test]
fn an_unguarded_fault_goes_to_the_handler_installed_before() {
    let (status, stdout) = run_child("previous-plain");
    assert_eq!(status.code(), Some(42), "{status:?}\n{stdout}");
    let (status, stdout) = run_child("previous-siginfo");
    assert_eq!(status.code(), Some(43), "{status:?}\n{stdout}");
}

#[test]
fn unloading_puts_the_previous_action_back() {
    let (status, stdout) = run_child("uninstalled");
    assert_eq!(status.signal(), Some(libc::SIGBUS), "{status:?}\n{stdout}");
}

#[test]
fn a_sent_sigbus_keeps_its_meaning() {
    // Default action: the process ends, as without the guard.
    let (status, stdout) = run_child("sent");
    assert_eq!(status.signal(), Some(libc::SIGBUS), "{status:?}\n{stdout}");
    // Ignored before: still ignored, and the guard still turns a fault into zeros.
    let (status, stdout) = run_child("sent-ignored");
    assert!(
        status.success() && stdout.contains("survived a sent SIGBUS"),
        "{status:?}\n{stdout}"
    );
}

#[test]
fn a_writer_notices_its_file_shrank_was_replaced_or_removed() {
    use crate::tests::{info, TempDir};
    use crate::ProbesFile;
    let dir = TempDir::new();
    let probes = ProbesFile::create(&dir.0, &info()).unwrap();
    let path = probes.path().unwrap().to_path_buf();
    assert_eq!(probes.lost(), None);
    OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(0)
        .unwrap();
    probes.heartbeat(5); // a store into the header, past the new end
    assert_eq!(
        probes.lost(),
        Some("it shrank under the mapping (truncated by another process)")
    );
    probes.rail(0).add(crate::declared::RAIL_TX_BYTES, 1); // still harmless

    let replaced = ProbesFile::create(
        &dir.0,
        &WriterInfo {
            start_ns: 7,
            ..info()
        },
    )
    .unwrap();
    let other = dir.0.join("other");
    fs::write(&other, b"forged").unwrap();
    fs::rename(&other, replaced.path().unwrap()).unwrap();
    assert_eq!(replaced.lost(), Some("another file was put in its place"));
    let path = replaced.path().unwrap().to_path_buf();
    drop(replaced);
    assert_eq!(fs::read(&path).unwrap(), b"forged", "not ours to remove");

    let removed = ProbesFile::create(
        &dir.0,
        &WriterInfo {
            start_ns: 8,
            ..info()
        },
    )
    .unwrap();
    fs::remove_file(removed.path().unwrap()).unwrap();
    assert_eq!(removed.lost(), Some("it was removed"));
    removed.remove().unwrap();
    assert_eq!(removed.lost(), None, "a clean shutdown is not a loss");
}

#[test]
fn a_reader_survives_a_file_shrinking_under_it() {
    use crate::tests::{info, open_ready, TempDir};
    use crate::{EventCursor, ProbesFile};
    let dir = TempDir::new();
    let probes = ProbesFile::create(&dir.0, &info()).unwrap();
    probes.rail(0).add(crate::declared::RAIL_TX_BYTES, 9);
    let reader = open_ready(probes.path().unwrap());
    assert_eq!(
        reader.snapshot().rails[0].counter(crate::declared::RAIL_TX_BYTES),
        9
    );
    assert!(!reader.faulted());
    let path = probes.path().unwrap();
    OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(64)
        .unwrap();
    let snapshot = reader.snapshot();
    let drained = reader.drain_events(&mut EventCursor::default());
    assert!(
        reader.faulted(),
        "the reader knows its copy is not the writer's"
    );
    assert_eq!(snapshot.rails[0].counter(crate::declared::RAIL_TX_BYTES), 0);
    assert!(drained.records.is_empty());
}

#[test]
fn a_fifo_in_place_of_a_probes_file_is_refused_without_blocking() {
    use crate::tests::TempDir;
    let dir = TempDir::new();
    let path = dir.0.join("mpib-1-2.probes");
    let c_path = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo(3) with a valid path.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
    let e = crate::ProbesReader::open(&path).unwrap_err();
    assert!(e.to_string().contains("not a regular file"), "{e}");
}
