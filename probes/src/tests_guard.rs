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

/// The child of `an_unguarded_fault_still_ends_the_process`.
#[test]
#[ignore = "run by an_unguarded_fault_still_ends_the_process in a child process"]
fn child_faults_outside_every_guarded_range() {
    if std::env::var_os("MPIB_GUARD_CHILD").is_none() {
        return;
    }
    let (guarded_path, guarded_file) = temp_file("child-guarded", 4096);
    let guarded = MmapOptions::new().map_raw(&guarded_file).unwrap();
    let _guard = GuardedRange::new(guarded.as_ptr(), guarded.len()).unwrap();
    let (path, file) = temp_file("child-bare", 2 * 4096);
    let bare = MmapOptions::new().map_raw(&file).unwrap();
    file.set_len(0).unwrap();
    let _ = fs::remove_file(&guarded_path);
    let _ = fs::remove_file(&path);
    // SAFETY: the access that faults; the process must die here.
    let byte = unsafe { bare.as_ptr().add(4096).read_volatile() };
    println!("survived an unguarded fault, read {byte}");
}

#[test]
fn an_unguarded_fault_still_ends_the_process() {
    let output = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "tests_guard::child_faults_outside_every_guarded_range",
            "--ignored",
            "--nocapture",
        ])
        .env("MPIB_GUARD_CHILD", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        output.status.signal(),
        Some(libc::SIGBUS),
        "{:?}\n{stdout}",
        output.status
    );
    assert!(!stdout.contains("survived"), "{stdout}");
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
