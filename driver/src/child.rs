//! Running one test of the current test binary in a fresh child process, for cases that need a
//! process of their own: a different environment from the first `init` on (the plugin's global
//! state is per process), or a real `dlclose` that no other test's handle prevents.
//!
//! The child test is an `#[ignore]`d test that starts with
//! `if !child::is_child("name") { return; }`; the parent calls [`run_test`] with the same name.

use std::io::Read;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// Names the test a child process was started for.
pub const CHILD_VAR: &str = "MPIB_DRIVER_CHILD";

/// What the child did.
#[derive(Debug)]
pub struct ChildOutcome {
    /// Exit status (`None` when it was killed at the deadline).
    pub status: Option<ExitStatus>,
    /// Its stdout, then its stderr.
    pub output: String,
}

impl ChildOutcome {
    /// Exited with status 0 after running exactly one test (a name that matched nothing would
    /// also exit 0, having run no test).
    pub fn success(&self) -> bool {
        self.status.is_some_and(|s| s.success())
            && self.output.contains("test result: ok. 1 passed")
    }

    /// Panics with the child's output unless it succeeded.
    pub fn assert_success(&self, name: &str) {
        assert!(
            self.success(),
            "child test `{name}` failed ({:?}); its output:\n{}",
            self.status,
            self.output
        );
    }
}

/// True in a child started by [`run_test`] for `name`.
pub fn is_child(name: &str) -> bool {
    std::env::var(CHILD_VAR).is_ok_and(|v| v == name)
}

/// Runs test `name` of the current executable alone in a child process with `env` added, and
/// kills it after `timeout`.
pub fn run_test(name: &str, env: &[(&str, &str)], timeout: Duration) -> Result<ChildOutcome> {
    let exe = std::env::current_exe()?;
    let mut command = Command::new(exe);
    command
        .args([
            name,
            "--exact",
            "--nocapture",
            "--test-threads=1",
            "--include-ignored",
        ])
        .env(CHILD_VAR, name)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        command.env(k, v);
    }
    let mut child = command
        .spawn()
        .map_err(|e| Error::Io(format!("spawn child for {name}: {e}")))?;
    let mut stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    let out_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut output = out_reader.join().unwrap_or_default();
    output += &err_reader.join().unwrap_or_default();
    if status.is_none() {
        output += &format!("\n[killed after {timeout:?}]");
    }
    Ok(ChildOutcome { status, output })
}
