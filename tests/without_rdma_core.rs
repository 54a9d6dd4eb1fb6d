//! The plugin on a machine without rdma-core: libibverbs is opened by the verbs fabric, not
//! linked (src/fabric/verbs/library.rs), so in a private mount namespace where
//! `libibverbs.so.1` cannot be loaded (an empty file bound over it) the plugin still loads and
//! moves bytes over the loopback and tcp fabrics, and `MPIB_FABRIC=verbs` fails `init` with an
//! error naming the library and the package that provides it.
//!
//! Each case runs in a child process of this test binary (the plugin's fabric is chosen once
//! per process) started under `unshare --mount`, which needs root, as the suite runs.
#![allow(clippy::unwrap_used, clippy::expect_used)] // A failed unwrap fails the test, with its message.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::Duration;

use mpib_driver::testing::{bounded, exchange_sizes, shared_plugin, BASIC_SIZES};
use mpib_driver::{Pair, Version};

/// Names the child case a process was started for.
const CHILD: &str = "MPIB_WITHOUT_RDMA_CORE_CHILD";
const LIMIT: Duration = Duration::from_secs(120);

/// The file the dynamic loader would open for `libibverbs.so.1`.
fn library_file() -> PathBuf {
    let listing = Command::new("ldconfig")
        .arg("-p")
        .output()
        .expect("ldconfig -p");
    let text = String::from_utf8_lossy(&listing.stdout);
    let path = text
        .lines()
        .filter(|line| line.trim_start().starts_with("libibverbs.so.1 "))
        .find_map(|line| line.split("=> ").nth(1))
        .expect("libibverbs.so.1 in the loader cache (the build needs libibverbs-dev)");
    PathBuf::from(path.trim())
}

/// Runs child case `name` where libibverbs cannot be loaded.
fn run_child(name: &str) -> Output {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "hiding libibverbs takes a mount namespace: run the suite as root"
    );
    let exe = std::env::current_exe().unwrap();
    let script = "mount --bind /dev/null \"$1\" && shift && exec \"$@\"";
    let mut command = Command::new("unshare");
    command
        .args([
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            script,
            "sh",
        ])
        .arg(library_file())
        .arg(exe)
        .args([
            name,
            "--exact",
            "--nocapture",
            "--ignored",
            "--test-threads=1",
        ])
        .env(CHILD, name);
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("MPIB_") {
            command.env_remove(key);
        }
    }
    let output = bounded(LIMIT, move || {
        command.output().expect("unshare (util-linux)")
    });
    let text = format!(
        "{}\n--- stdout\n{}--- stderr\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success() && text.contains("test result: ok. 1 passed"),
        "child {name}: {text}"
    );
    output
}

fn is_child(name: &str) -> bool {
    std::env::var(CHILD).is_ok_and(|value| value == name)
}

/// In the child: libibverbs really cannot be loaded here.
fn assert_libibverbs_absent() {
    // SAFETY: a NUL-terminated name; a handle, if any, is closed at once.
    let handle = unsafe { libc::dlopen(c"libibverbs.so.1".as_ptr(), libc::RTLD_NOW) };
    assert!(
        handle.is_null(),
        "libibverbs.so.1 still loads: the namespace did not hide it"
    );
}

/// Moves the basic sizes through table `version` with the fabric `vars` choose.
fn move_bytes(vars: &'static [(&'static str, &'static str)], version: Version) {
    assert_libibverbs_absent();
    bounded(LIMIT, move || {
        let net = shared_plugin(vars)
            .net(version)
            .unwrap_or_else(|e| panic!("{e}"));
        let mut pair = Pair::connect(&net).unwrap_or_else(|e| panic!("{e}"));
        exchange_sizes(&mut pair, &BASIC_SIZES, "without rdma-core", 2)
            .unwrap_or_else(|e| panic!("{e}"));
        pair.close().unwrap_or_else(|e| panic!("{e}"));
    });
}

#[test]
#[ignore = "a child of without_libibverbs_the_software_fabrics_load_and_move_bytes"]
fn child_loopback() {
    if is_child("child_loopback") {
        move_bytes(&[("MPIB_FABRIC", "loopback")], Version::V12);
    }
}

#[test]
#[ignore = "a child of without_libibverbs_the_software_fabrics_load_and_move_bytes"]
fn child_tcp() {
    if is_child("child_tcp") {
        let tcp = &[
            ("MPIB_FABRIC", "tcp"),
            ("MPIB_HCA_SOUT", "lo=127.0.0.1"),
            ("MPIB_HCA_SUP", "lo=127.0.0.2"),
            ("MPIB_OOB_ADDR", "127.0.0.1"),
        ];
        move_bytes(tcp, Version::V8);
    }
}

#[test]
#[ignore = "a child of without_libibverbs_the_verbs_fabric_fails_init_naming_it"]
fn child_verbs() {
    if is_child("child_verbs") {
        assert_libibverbs_absent();
        let net = shared_plugin(&[("MPIB_FABRIC", "verbs")])
            .net(Version::V12)
            .unwrap_or_else(|e| panic!("{e}"));
        match net.init(1) {
            Ok(_) => panic!("init succeeded with MPIB_FABRIC=verbs and no libibverbs"),
            Err(error) => eprintln!("init failed as it should: {error}"),
        }
    }
}

/// Hiding libibverbs takes a mount namespace, so root (the test command runs as root); without
/// it the case says so and checks nothing.
fn skipped_without_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    if euid != 0 {
        eprintln!(
            "SKIPPED: hiding libibverbs takes a mount namespace (root); this runs as uid {euid}"
        );
    }
    euid != 0
}

#[test]
fn without_libibverbs_the_software_fabrics_load_and_move_bytes() {
    if skipped_without_root() {
        return;
    }
    run_child("child_loopback");
    run_child("child_tcp");
}

#[test]
fn without_libibverbs_the_verbs_fabric_fails_init_naming_it() {
    if skipped_without_root() {
        return;
    }
    let output = run_child("child_verbs");
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(
        said.contains("libibverbs.so.1") && said.contains("libibverbs1"),
        "the error names the library and its package: {said}"
    );
}
