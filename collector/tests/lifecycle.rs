//! File life cycle: no files, refused files (version, corrupt, truncated), a file not yet
//! published, a dead writer reaped, a writer restart, a clean exit.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::float_cmp)]

mod common;

use mpib_probes::declared::RAIL_TX_BYTES;
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::time::{Duration, SystemTime};

use common::*;
use mpib_probes::{now_ns, ProbesFile};

const HEALTH: [&str; 5] = [
    "mpib_otlp_metric_exports_total",
    "mpib_probes_files",
    "mpib_probes_skipped_total",
    "mpib_probes_reaped_total",
    "mpib_probes_declarations_refused_total",
];
const MINUTE_NS: u64 = 60_000_000_000;

fn args_of(dir: &TempDir, more: &[&str]) -> Vec<String> {
    let mut args = isolated(dir);
    args.extend(more.iter().map(|s| (*s).to_owned()));
    args
}

fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

#[test]
fn no_files_exports_only_health_metrics() {
    let dir = TempDir::new("empty");
    for probes_dir in [dir.path().to_path_buf(), dir.join("missing")] {
        let args = args_of(&dir, &[]);
        let out = run_once(&probes_dir, &strs(&args));
        assert!(out.status.success());
        let scrape = Scrape::parse(&String::from_utf8(out.stdout).unwrap());
        assert!(
            scrape
                .samples
                .iter()
                .all(|s| HEALTH.contains(&s.name.as_str())),
            "{}",
            scrape.text
        );
        assert_eq!(scrape.value("mpib_probes_files", &[]), 0.0);
        assert_eq!(scrape.matching("mpib_probes_skipped_total", &[]).len(), 4);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            stderr
                .matches("exporting only the collector's own metrics")
                .count(),
            1,
            "{stderr}"
        );
    }
    // Served: the note is logged once, not once per scan.
    let args = args_of(&dir, &["--interval-ms", "20"]);
    let running = Running::start(dir.path(), &strs(&args));
    running.scrape_until(Duration::from_secs(10), |s| {
        s.get("mpib_probes_files", &[]).is_some()
    });
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(running.log_lines("no probes files"), 1);
}

/// Patch the version word (offset 8) to major 2.
fn patch_version(path: &std::path::Path) {
    let file = OpenOptions::new().write(true).open(path).unwrap();
    let next_major = u32::from(mpib_probes::ABI_MAJOR) + 1;
    file.write_at(&(next_major << 16).to_ne_bytes(), 8).unwrap();
}

#[test]
fn refused_files_are_counted_and_logged_once() {
    let dir = TempDir::new("refused");
    let pid = std::process::id();
    let base = now_ns();
    let version = ProbesFile::create(dir.path(), &writer(pid, base + 1)).unwrap();
    patch_version(version.path().unwrap());
    let truncated = ProbesFile::create(dir.path(), &writer(pid, base + 2)).unwrap();
    // Never touch `truncated`'s counters after this: its mapping is longer than the file.
    OpenOptions::new()
        .write(true)
        .open(truncated.path().unwrap())
        .unwrap()
        .set_len(8192)
        .unwrap();
    let corrupt = ProbesFile::create(dir.path(), &writer(pid, base + 3)).unwrap();
    let file = OpenOptions::new()
        .write(true)
        .open(corrupt.path().unwrap())
        .unwrap();
    file.write_at(b"X", 0).unwrap();
    // Not published yet (version word 0): retried, never counted.
    fs::write(
        dir.join(&format!("mpib-{pid}-{}.probes", base + 4)),
        vec![0u8; 1024],
    )
    .unwrap();

    let args = args_of(&dir, &["--interval-ms", "50"]);
    let running = Running::start(dir.path(), &strs(&args));
    let count = |s: &Scrape, reason| s.get("mpib_probes_skipped_total", &[("reason", reason)]);
    running.scrape_until(Duration::from_secs(10), |s| {
        count(s, "corrupt") == Some(1.0)
    });
    std::thread::sleep(Duration::from_millis(500)); // about 10 more scans
    let scrape = Scrape::parse(&running.scrape());
    for reason in ["version", "corrupt", "truncated"] {
        assert_eq!(
            count(&scrape, reason),
            Some(1.0),
            "{reason}:\n{}",
            scrape.text
        );
    }
    assert_eq!(scrape.value("mpib_probes_files", &[]), 4.0);
    assert!(scrape.matching("mpib_rail_tx_bytes_total", &[]).is_empty());
    assert_eq!(
        running.log_lines("it has ABI version 4.0, this collector reads 3.3"),
        1
    );
    assert_eq!(
        running.log_lines("truncated: header says 2480640 bytes, file has 8192"),
        1
    );
    assert_eq!(running.log_lines("bad magic"), 1);
    assert_eq!(running.log_lines("refusing"), 3);
    drop(running);
    drop((version, truncated, corrupt));
}

#[test]
fn dead_writers_are_reaped_live_ones_kept() {
    let dir = TempDir::new("reap");
    let old = now_ns() - 2 * MINUTE_NS;
    let dead = ProbesFile::create(dir.path(), &writer(DEAD_PID, old)).unwrap();
    dead.rail(0).add(RAIL_TX_BYTES, 5);
    let dead_path = dead.path().unwrap().to_path_buf();
    let fresh_dead_pid = ProbesFile::create(dir.path(), &writer(DEAD_PID - 1, now_ns())).unwrap();
    let live_old_heartbeat =
        ProbesFile::create(dir.path(), &writer(std::process::id(), old)).unwrap();
    // Never published by a dead pid, untouched for 2 minutes.
    let stuck = dir.join(&format!("mpib-{}-5.probes", DEAD_PID - 2));
    fs::write(&stuck, vec![0u8; 1024]).unwrap();
    File::options()
        .write(true)
        .open(&stuck)
        .unwrap()
        .set_modified(SystemTime::now() - Duration::from_secs(120))
        .unwrap();

    let args = args_of(&dir, &[]);
    let out = run_once(dir.path(), &strs(&args));
    assert!(out.status.success());
    let scrape = Scrape::parse(&String::from_utf8(out.stdout).unwrap());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!dead_path.exists() && !stuck.exists(), "{stderr}");
    assert!(fresh_dead_pid.path().unwrap().exists() && live_old_heartbeat.path().unwrap().exists());
    assert_eq!(scrape.value("mpib_probes_reaped_total", &[]), 2.0);
    assert_eq!(stderr.matches("reaped probes file").count(), 2, "{stderr}");
    let age = |pid: u32| {
        scrape.get(
            "mpib_writer_heartbeat_age_seconds",
            &[("pid", &pid.to_string())],
        )
    };
    assert_eq!(age(DEAD_PID), None, "a reaped writer is not exported");
    // Its owner cannot be checked against a process: kept, not exported (docs/SECURITY.md).
    assert_eq!(
        age(DEAD_PID - 1),
        None,
        "a writer whose pid is gone is not exported"
    );
    assert_eq!(
        stderr
            .matches("is not running (or not visible here), so its owner")
            .count(),
        1
    );
    assert!(age(std::process::id()).unwrap() > 100.0);
}

#[test]
fn restart_resets_the_series_and_the_old_file_is_reaped() {
    let dir = TempDir::new("restart");
    let pid = std::process::id();
    let first = ProbesFile::create(dir.path(), &writer(pid, now_ns() - 1000)).unwrap();
    first.rail(0).add(RAIL_TX_BYTES, 1000);
    first.heartbeat(now_ns());
    let first_path = first.path().unwrap().to_path_buf();
    let args = args_of(&dir, &["--interval-ms", "100", "--stale-after", "1s"]);
    let running = Running::start(dir.path(), &strs(&args));
    let tx = |s: &Scrape| s.get("mpib_rail_tx_bytes_total", &[("rail", "sout")]);
    running.scrape_until(Duration::from_secs(10), |s| tx(s) == Some(1000.0));

    // The same pid starts again (the old writer crashed: its file stays behind).
    let second = ProbesFile::create(dir.path(), &writer(pid, now_ns())).unwrap();
    second.rail(0).add(RAIL_TX_BYTES, 10);
    let seen = std::sync::Mutex::new(Vec::new());
    running.scrape_until(Duration::from_secs(15), |s| {
        seen.lock().unwrap().push(tx(s));
        second.heartbeat(now_ns());
        tx(s) == Some(10.0)
    });
    for value in seen.lock().unwrap().iter() {
        assert!(
            matches!(value, None | Some(1000.0) | Some(10.0)),
            "{value:?}"
        );
    }
    // The old file's heartbeat is now older than --stale-after: reaped.
    let scrape = running.scrape_until(Duration::from_secs(15), |s| {
        second.heartbeat(now_ns());
        s.get("mpib_probes_reaped_total", &[]) == Some(1.0)
    });
    assert!(!first_path.exists());
    assert_eq!(scrape.value("mpib_probes_files", &[]), 1.0);
    assert_eq!(running.log_lines("superseded"), 1);

    // A clean exit: the file goes away and so do its series.
    // Its latency histogram stays as long as its other series.
    second.remove().unwrap();
    let hist = |s: &Scrape| s.get("mpib_transfer_latency_seconds_count", &[("rail", "sout")]);
    running.scrape_until(Duration::from_secs(10), |s| {
        assert!(tx(s).is_none() || hist(s).is_some(), "{}", s.text);
        tx(s).is_none()
    });
    drop(first);
}
