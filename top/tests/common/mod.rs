//! Real jobs for `mpib-top` to watch: `mpib-perf` on the loopback fabric, with or without
//! `mpib-agent`, in a private directory; everything started is killed on drop.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

#[allow(unused_imports)] // each test binary uses some of them
pub use mpib_testkit::{eventually, workspace_binary};

/// A fresh directory under the temp dir, with `probes/` in it.
pub fn temp_dir(name: &str) -> PathBuf {
    mpib_testkit::temp_dir("top", name)
}

/// A child killed on drop.
pub struct Running(pub Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Running {
    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

/// `mpib-agent run` with its paths in `dir`, adaptive every 50 ms; waits until it serves.
pub fn agent(dir: &Path) -> Running {
    let child = Command::new(workspace_binary("mpib-agent"))
        .arg("run")
        .arg("--hint-path")
        .arg(dir.join("hints"))
        .arg("--socket")
        .arg(dir.join("agent.sock"))
        .arg("--probes-dir")
        .arg(dir.join("probes"))
        .args([
            "--metrics-listen",
            "off",
            "--policy",
            "adaptive",
            "--interval-ms",
            "50",
        ])
        .env_remove("MPIB_AGENT_CONFIG")
        .env_remove("MPIB_AGENT_ALLOWED_UIDS")
        .env_remove("MPIB_AGENT_ALLOWED_GIDS")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("agent.log")).unwrap())
        .spawn()
        .expect("start mpib-agent");
    let running = Running(child);
    assert!(
        eventually(Duration::from_secs(10), || dir
            .join("agent.control")
            .exists()),
        "the agent did not start: {}",
        std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default()
    );
    running
}

/// `mpib-perf` in one process on loopback rails `rails`, 1 MiB messages until killed; in
/// advanced mode with the agent of `dir` when `advanced`.
pub fn perf(dir: &Path, rails: &str, advanced: bool, name: &str) -> Running {
    perf_with(dir, rails, advanced, name, &[])
}

/// [`perf`] with `env` set too.
pub fn perf_with(
    dir: &Path,
    rails: &str,
    advanced: bool,
    name: &str,
    env: &[(&str, &str)],
) -> Running {
    let mut command = Command::new(workspace_binary("mpib-perf"));
    command
        .args([
            "--min-size",
            "1M",
            "--max-size",
            "1M",
            "--iters",
            "16",
            "--warmup",
            "0",
        ])
        .args(["--repeat", "100000", "--csv", "--timeout", "600"])
        .env("MPIB_FABRIC", "loopback")
        .env("MPIB_LOOPBACK_RAILS", rails)
        .env("MPIB_HINT_PATH", dir.join("hints"))
        .env("MPIB_AGENT_SOCKET", dir.join("agent.sock"))
        .env("MPIB_PROBES_DIR", dir.join("probes"))
        .env("MPIB_MODE", if advanced { "1" } else { "0" })
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join(format!("{name}.err"))).unwrap());
    Running(command.spawn().expect("start mpib-perf"))
}

/// The probes file of `pid` in `dir`, once it is there.
pub fn probes_file(dir: &Path, pid: u32) -> PathBuf {
    let prefix = format!("mpib-{pid}-");
    let mut found = None;
    let there = eventually(Duration::from_secs(20), || {
        found = std::fs::read_dir(dir.join("probes"))
            .ok()
            .and_then(|entries| {
                entries.flatten().map(|e| e.path()).find(|p| {
                    p.file_name()
                        .unwrap()
                        .to_string_lossy()
                        .starts_with(&prefix)
                })
            });
        found.is_some()
    });
    assert!(there, "no probes file of pid {pid} in {}", dir.display());
    found.unwrap()
}

/// `mpib-top --once --json` over `dir` with `extra` flags: the document.
pub fn top_json(dir: &Path, extra: &[&str]) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_mpib-top"))
        .arg("--probes-dir")
        .arg(dir.join("probes"))
        .arg("--hint-path")
        .arg(dir.join("hints"))
        .arg("--agent-control")
        .arg(dir.join("agent.control"))
        .args(["--once", "--json"])
        .args(extra)
        .output()
        .expect("run mpib-top");
    assert!(
        out.status.success(),
        "mpib-top failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON document")
}

/// The process of `pid` in a document.
pub fn process(doc: &serde_json::Value, pid: u32) -> Option<&serde_json::Value> {
    doc["processes"]
        .as_array()?
        .iter()
        .find(|p| p["pid"].as_u64() == Some(u64::from(pid)))
}
