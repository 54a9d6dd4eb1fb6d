//! Which probes files are exported (docs/SECURITY.md, "The collector"): our own file is; a
//! file another local user forged for this process's pid, a group-writable file and a file of
//! an owner `--allowed-uids` leaves out are not, each logged once and counted as `untrusted`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::float_cmp)]

mod common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::time::Duration;

use common::*;
use mpib_probes::declared::RAIL_TX_BYTES;
use mpib_probes::now_ns;

const TX: &str = "mpib_rail_tx_bytes_total";
const UNTRUSTED: [(&str, &str); 1] = [("reason", "untrusted")];

fn args(dir: &TempDir, more: &[&str]) -> Vec<String> {
    let mut args = isolated(dir);
    args.extend(more.iter().map(|s| (*s).to_owned()));
    args
}

/// The SOUT rail's bytes sent as exported for this process, if exported.
fn own_tx(scrape: &Scrape) -> Option<f64> {
    let pid = std::process::id().to_string();
    scrape.get(TX, &[("pid", &pid), ("device", "mlx5_0")])
}

#[test]
fn own_files_are_exported_group_writable_ones_and_unlisted_owners_are_not() {
    let dir = TempDir::new("trust-modes");
    let base = now_ns();
    let own = fixture_file(dir.path(), &writer(std::process::id(), base));
    fill_fixture(&own);
    let uid = fs::metadata(own.path().unwrap()).unwrap().uid();

    let (scrape, stderr) = scrape_isolated(&dir, &[]);
    assert_eq!(own_tx(&scrape), Some(1_000_000.0), "{stderr}");
    assert_eq!(scrape.value("mpib_probes_skipped_total", &UNTRUSTED), 0.0);

    // Only our uid listed: exported as before.
    let (scrape, stderr) = scrape_isolated(&dir, &["--allowed-uids", &uid.to_string()]);
    assert_eq!(own_tx(&scrape), Some(1_000_000.0), "{stderr}");

    // Another uid only: untrusted, named in the log with the owner and mode.
    let other = (uid + 1).to_string();
    let (scrape, stderr) = scrape_isolated(&dir, &["--allowed-uids", &other]);
    assert_eq!(own_tx(&scrape), None, "{stderr}");
    assert_eq!(scrape.value("mpib_probes_skipped_total", &UNTRUSTED), 1.0);
    let line = format!(
        "not exporting probes file {}: owner uid {uid} (",
        own.path().unwrap().display()
    );
    assert_eq!(stderr.matches(&line).count(), 1, "{stderr}");
    assert!(
        stderr.contains("mode 0600: its owner uid") && stderr.contains("--allowed-uids"),
        "{stderr}"
    );

    // Writable by its group: whoever is in it could rewrite the job's numbers.
    let path = own.path().unwrap().to_path_buf();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o664)).unwrap();
    let (scrape, stderr) = scrape_isolated(&dir, &[]);
    assert_eq!(own_tx(&scrape), None, "{stderr}");
    assert_eq!(scrape.value("mpib_probes_skipped_total", &UNTRUSTED), 1.0);
    assert!(
        stderr.contains("mode 0664: its group or others may write it"),
        "{stderr}"
    );
    drop(own);
}

#[test]
fn a_file_another_user_forged_for_our_pid_is_skipped_counted_and_logged_once() {
    let Some(user) = mpib_driver::other_user::other_user_or_skip() else {
        return;
    };
    // A shared probes directory anyone may write, as /dev/shm/mpib may be.
    let dir = TempDir::new("trust-forged");
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o1777)).unwrap();
    let pid = std::process::id();
    let own = fixture_file(dir.path(), &writer(pid, now_ns()));
    fill_fixture(&own);
    // The forgery: a valid file claiming this process, newer than ours (trusted, it would
    // supersede ours), with other numbers, copied in by the other user.
    let staging = TempDir::new("trust-staging");
    let forged_start = now_ns();
    let template = fixture_file(staging.path(), &writer(pid, forged_start));
    template.rail(0).add(RAIL_TX_BYTES, 666);
    template.heartbeat(now_ns());
    let name = format!("mpib-{pid}-{forged_start}.probes");
    let forged = dir.join(&name);
    let source = template.path().unwrap().display().to_string();
    // Probes files are created 0600: let the other user read the template it copies.
    fs::set_permissions(template.path().unwrap(), fs::Permissions::from_mode(0o644)).unwrap();
    fs::set_permissions(staging.path(), fs::Permissions::from_mode(0o755)).unwrap();
    user.run("cp", &[&source, &forged.display().to_string()])
        .unwrap();
    assert_eq!(fs::metadata(&forged).unwrap().uid(), user.uid);

    let args = args(&dir, &["--interval-ms", "20"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let running = Running::start(dir.path(), &args);
    let scrape = running.scrape_until(Duration::from_secs(20), |s| own_tx(s).is_some());
    assert_eq!(own_tx(&scrape), Some(1_000_000.0), "ours, not the forgery");
    // Many scans later: still counted once and logged once.
    std::thread::sleep(Duration::from_millis(400));
    let scrape = Scrape::parse(&running.scrape());
    assert_eq!(scrape.value("mpib_probes_skipped_total", &UNTRUSTED), 1.0);
    assert_eq!(own_tx(&scrape), Some(1_000_000.0));
    let line = format!(
        "not exporting probes file {}: owner uid {} ({}), mode 0644: it claims pid {pid}, which \
         runs as uid",
        forged.display(),
        user.uid,
        user.name
    );
    assert_eq!(running.log_lines(&line), 1, "{:?}", running.log.lock());
    assert_eq!(running.log_lines("not exporting probes file"), 1);
    assert!(
        forged.exists(),
        "the pid is alive: the forgery is not reaped"
    );
    drop(running);
    drop((own, template));
}

#[test]
fn a_file_whose_writer_is_not_visible_is_exported_only_for_a_listed_owner() {
    let dir = TempDir::new("trust-dead");
    let gone = fixture_file(dir.path(), &writer(DEAD_PID, now_ns()));
    fill_fixture(&gone);
    let uid = fs::metadata(gone.path().unwrap()).unwrap().uid();
    let dead = [("pid", "999999999"), ("device", "mlx5_0")];
    let (scrape, stderr) = scrape_isolated(&dir, &[]);
    assert_eq!(scrape.get(TX, &dead), None, "{stderr}");
    assert!(
        stderr.contains("list the owner in --allowed-uids to trust it without its process"),
        "{stderr}"
    );
    // A collector in its own PID namespace sees no writer: the operator names the owners.
    let (scrape, stderr) = scrape_isolated(&dir, &["--allowed-uids", &uid.to_string()]);
    assert_eq!(scrape.get(TX, &dead), Some(1_000_000.0), "{stderr}");
    drop(gone);
}
