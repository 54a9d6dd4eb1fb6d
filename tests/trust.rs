//! Local trust, the plugin's side (docs/SECURITY.md, 'The plugin'), through the plugin loaded as
//! NCCL loads it: paths another local user could write are refused (advanced mode for the agent's
//! paths, probes for the probes directory) with one WARN naming the path, its owner and its mode,
//! and data still moves byte-exactly; a trusted layout works as before; the probes directory and
//! files are made for the job's user only, or for one group.
//!
//! Each case runs in a child process (the plugin reads its variables at `init`). The second local
//! user comes from `mpib_driver::other_user` (created with `useradd`, commands under `setpriv`);
//! without root the cases that need it print `SKIPPED` and pass.
#![allow(clippy::unwrap_used, clippy::expect_used)] // A failed unwrap fails the test, with its message.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use mpib_driver::other_user::{other_user, other_user_or_skip};
use mpib_driver::rails::{Direction, Probes};
use mpib_driver::testing::{bounded, exchange_sizes, shared_plugin, BASIC_SIZES};
use mpib_driver::{child, Agent, Pair, Version};

const CHILD_LIMIT: Duration = Duration::from_secs(120);

/// A fresh directory under the system temp dir, removed at the end.
struct Base(PathBuf);

impl Base {
    fn new(name: &str, mode: u32) -> Base {
        let dir = mpib_driver::temp_dir(&format!("mpib-trust-{name}")).unwrap();
        chmod(&dir, mode);
        Base(dir)
    }

    fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Base {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn text(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// Runs child test `name` with `env` and returns its output; fails unless it passed.
fn run(name: &str, env: &[(&str, &str)]) -> String {
    let outcome = child::run_test(name, env, CHILD_LIMIT).unwrap();
    eprintln!("{}", outcome.output);
    outcome.assert_success(name);
    outcome.output
}

/// The WARN lines of a child's output that refuse something.
fn refusals(output: &str) -> Vec<&str> {
    output
        .lines()
        .filter(|l| l.contains("is refused for this path") || l.contains("probes disabled"))
        .collect()
}

/// Advanced mode against the test agent at `dir/hints` and `dir/agent.sock`; the child checks
/// where the bytes went (`expect`: `refused` all SOUT, `trusted` all SUP).
fn advanced(dir: &Path, probes: &Path, expect: &str, hint_mode: &str) -> String {
    let (hints, socket) = (dir.join("hints"), dir.join("agent.sock"));
    run(
        "child_advanced",
        &[
            ("MPIB_MODE", "1"),
            ("MPIB_HINT_PATH", text(&hints)),
            ("MPIB_AGENT_SOCKET", text(&socket)),
            ("MPIB_PROBES_DIR", text(probes)),
            ("MPIB_DRIVER_TRUST_EXPECT", expect),
            ("MPIB_DRIVER_TRUST_HINT_MODE", hint_mode),
        ],
    )
}

#[test]
fn a_squatted_agent_directory_refuses_advanced_mode() {
    let Some(user) = other_user_or_skip() else {
        return;
    };
    // Like /tmp: sticky, root's, open to all; the other user makes the agent's directory first.
    let base = Base::new("squat", 0o1777);
    let squatted = base.join("mpib");
    user.run("mkdir", &["-m", "0755", text(&squatted)]).unwrap();
    let output = advanced(&squatted, &base.join("probes"), "refused", "");
    let warned = refusals(&output);
    assert_eq!(warned.len(), 1, "one WARN: {warned:#?}");
    let expected = format!(
        "advanced mode is refused for this path: MPIB_AGENT_SOCKET {}: directory {} is owned by \
         uid {} (mpib-other), mode 0755; expected owner root",
        text(&squatted.join("agent.sock")),
        text(&squatted),
        user.uid
    );
    assert!(warned[0].contains(&expected), "{}", warned[0]);
}

#[test]
fn a_group_writable_hint_file_refuses_advanced_mode() {
    let base = Base::new("hint-mode", 0o700);
    let output = advanced(&base.0, &base.join("probes"), "refused", "664");
    let warned = refusals(&output);
    assert_eq!(warned.len(), 1, "one WARN: {warned:#?}");
    let expected = format!(
        "advanced mode is refused for this path: MPIB_HINT_PATH {} is owned by uid",
        text(&base.join("hints"))
    );
    assert!(warned[0].contains(&expected), "{}", warned[0]);
    assert!(
        warned[0].contains("mode 0664; expected owner root")
            && warned[0].contains("not writable by group or others"),
        "{}",
        warned[0]
    );
}

#[test]
fn a_trusted_agent_directory_keeps_advanced_mode() {
    let base = Base::new("trusted", 0o700);
    let output = advanced(&base.0, &base.join("probes"), "trusted", "");
    assert_eq!(refusals(&output), Vec::<&str>::new());
}

/// One vanilla pair with `env`; the child prints `PROBES <path> <mode> <gid>`, `PROBES none`, and
/// `READ_BY_OTHER <ok|failed>` when asked.
fn vanilla(env: &[(&str, &str)]) -> String {
    run("child_vanilla", env)
}

fn probes_line(output: &str) -> Vec<&str> {
    let line = output
        .lines()
        // The test harness prints `test child_vanilla ... ` on the same line first.
        .find_map(|l| l.split_once("PROBES ").map(|(_, rest)| rest))
        .unwrap_or_else(|| panic!("no PROBES line in:\n{output}"));
    line.split(' ').collect()
}

#[test]
fn a_probes_directory_of_another_user_disables_probes() {
    let Some(user) = other_user_or_skip() else {
        return;
    };
    let base = Base::new("probes-squat", 0o1777);
    let dir = base.join("probes");
    user.run("mkdir", &["-m", "0755", text(&dir)]).unwrap();
    let output = vanilla(&[("MPIB_PROBES_DIR", text(&dir))]);
    assert_eq!(probes_line(&output), ["none"]);
    let warned = refusals(&output);
    assert_eq!(warned.len(), 1, "one WARN: {warned:#?}");
    let expected = format!(
        "probes disabled for this process: MPIB_PROBES_DIR {} is owned by uid {} (mpib-other), \
         mode 0755; expected owner root",
        text(&dir),
        user.uid
    );
    assert!(warned[0].contains(&expected), "{}", warned[0]);
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "no file there");
}

#[test]
fn a_missing_probes_directory_is_made_private_and_the_file_0600() {
    let base = Base::new("probes-new", 0o755);
    let dir = base.join("probes");
    let output = vanilla(&[("MPIB_PROBES_DIR", text(&dir))]);
    assert_eq!(probes_line(&output)[1], "600", "{output}");
    assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o7777, 0o700);
    assert_eq!(refusals(&output), Vec::<&str>::new());
}

#[test]
fn an_admin_made_sticky_probes_directory_is_used() {
    let base = Base::new("probes-admin", 0o755);
    let dir = base.join("probes");
    std::fs::create_dir(&dir).unwrap();
    for mode in [0o1777, 0o1733] {
        chmod(&dir, mode);
        let output = vanilla(&[("MPIB_PROBES_DIR", text(&dir))]);
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            assert_eq!(probes_line(&output)[1], "600", "{mode:o}: {output}");
        }
    }
}

#[test]
fn a_probes_group_makes_the_directory_and_file_readable_by_it() {
    let Some(user) = other_user_or_skip() else {
        return;
    };
    let group = group_name(user.gid).unwrap_or_else(|| user.gid.to_string());
    let base = Base::new("probes-group", 0o755);
    let dir = base.join("probes");
    let output = vanilla(&[
        ("MPIB_PROBES_DIR", text(&dir)),
        ("MPIB_PROBES_GROUP", &group),
        ("MPIB_DRIVER_TRUST_READER", "1"),
    ]);
    let probes = probes_line(&output);
    assert_eq!(probes[1..], ["640", &user.gid.to_string()], "{output}");
    let meta = std::fs::metadata(&dir).unwrap();
    assert_eq!((meta.mode() & 0o7777, meta.gid()), (0o750, user.gid));
    assert!(output.contains("READ_BY_OTHER ok"), "{output}");
}

#[test]
fn a_probes_group_that_does_not_exist_fails_init_naming_it() {
    let output = run(
        "child_bad_group",
        &[("MPIB_PROBES_GROUP", "no-such-group-mpib")],
    );
    assert!(
        output.contains("MPIB_PROBES_GROUP=\"no-such-group-mpib\" is invalid"),
        "{output}"
    );
}

fn group_name(gid: u32) -> Option<String> {
    let groups = std::fs::read_to_string("/etc/group").ok()?;
    groups.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        (fields.len() > 2 && fields[2] == gid.to_string()).then(|| fields[0].to_owned())
    })
}

fn connect_and_exchange(case: &str) -> (Pair<'static, 'static>, Probes) {
    let plugin = shared_plugin(&[("MPIB_FABRIC", "loopback")]);
    let net = Box::leak(Box::new(plugin.net(Version::V12).unwrap()));
    let mut pair = Pair::connect(net).unwrap_or_else(|e| panic!("{case}: {e}"));
    exchange_sizes(&mut pair, &BASIC_SIZES, case, 2).unwrap_or_else(|e| panic!("{case}: {e}"));
    let probes = Probes::open_own();
    (pair, probes.unwrap_or_else(|e| panic!("{case}: {e}")))
}

#[test]
#[ignore = "runs in a child process started by the advanced-mode tests"]
fn child_advanced() {
    if !child::is_child("child_advanced") {
        return;
    }
    bounded(CHILD_LIMIT, || {
        let var = |name: &str| std::env::var(name).unwrap_or_default();
        let agent = Agent::start(
            Path::new(&var("MPIB_HINT_PATH")),
            Path::new(&var("MPIB_AGENT_SOCKET")),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        // Were the hints read, every byte would go on SUP.
        agent.set_default_sup_bw(1024);
        if let Ok(mode) = u32::from_str_radix(&var("MPIB_DRIVER_TRUST_HINT_MODE"), 8) {
            chmod(agent.hint_path(), mode);
        }
        let (pair, probes) = connect_and_exchange("trust advanced");
        let sent = probes
            .connections()
            .unwrap()
            .into_iter()
            .find(|c| c.direction == Direction::Send)
            .expect("the send connection's probes");
        let (sout, sup) = sent.rail_bytes;
        let registered = agent.registrations().len();
        eprintln!("rail bytes sout={sout} sup={sup}, registrations {registered}");
        if var("MPIB_DRIVER_TRUST_EXPECT") == "trusted" {
            assert!(
                sout == 0 && sup > 0 && registered > 0,
                "advanced mode was not used"
            );
        } else {
            assert!(
                sup == 0 && sout > 0 && registered == 0,
                "advanced mode was used"
            );
        }
        pair.close().unwrap();
    });
}

#[test]
#[ignore = "runs in a child process started by the probes tests"]
fn child_vanilla() {
    if !child::is_child("child_vanilla") {
        return;
    }
    bounded(CHILD_LIMIT, || {
        let plugin = shared_plugin(&[("MPIB_FABRIC", "loopback")]);
        let net = plugin.net(Version::V12).unwrap();
        let mut pair = Pair::connect(&net).unwrap_or_else(|e| panic!("{e}"));
        exchange_sizes(&mut pair, &BASIC_SIZES, "trust vanilla", 2).unwrap();
        match Probes::open_own() {
            Ok(probes) => {
                let meta = std::fs::metadata(probes.path()).unwrap();
                let mode = meta.mode() & 0o7777;
                println!("PROBES {} {mode:o} {}", text(probes.path()), meta.gid());
                if std::env::var("MPIB_DRIVER_TRUST_READER").is_ok() {
                    let user = other_user().unwrap();
                    let read = user.run("head", &["-c", "8", text(probes.path())]);
                    let ok = read.is_ok_and(|magic| magic == "MPIBPROB");
                    println!("READ_BY_OTHER {}", if ok { "ok" } else { "failed" });
                }
            }
            Err(_) => println!("PROBES none"),
        }
        pair.close().unwrap();
    });
}

#[test]
#[ignore = "runs in a child process started by a_probes_group_that_does_not_exist_fails_init_naming_it"]
fn child_bad_group() {
    if !child::is_child("child_bad_group") {
        return;
    }
    let plugin = shared_plugin(&[("MPIB_FABRIC", "loopback")]);
    let net = plugin.net(Version::V12).unwrap();
    match net.init(0xBAD) {
        Ok(_) => panic!("init succeeded with MPIB_PROBES_GROUP=no-such-group-mpib"),
        Err(e) => eprintln!("init failed as expected: {e}"),
    }
}
