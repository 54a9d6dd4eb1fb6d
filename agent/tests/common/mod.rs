//! A running `mpib-agent` in a private directory, and the raw wire to talk to it.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mpib_proto::agent_wire::{AgentRequest, AgentResponse};
use mpib_proto::hint::{entry_offset, HINT_FILE_LEN};
#[allow(unused_imports)] // each test binary uses some of them
pub use mpib_testkit::{eventually, free_port, workspace_binary};

/// A fresh directory under the temp dir, with `probes/` in it.
pub fn temp_dir(name: &str) -> PathBuf {
    mpib_testkit::temp_dir("agent", name)
}

/// A running agent.
pub struct Agent {
    pub child: Child,
    pub dir: PathBuf,
    pub log: PathBuf,
}

impl Agent {
    /// Starts `mpib-agent run` with its paths in `dir` and `extra` flags; waits until it serves.
    pub fn start(dir: &Path, extra: &[&str]) -> Agent {
        Agent::start_with_env(dir, extra, &[])
    }

    /// [`Agent::start`] with variables set for the agent.
    pub fn start_with_env(dir: &Path, extra: &[&str], vars: &[(&str, &str)]) -> Agent {
        let log = dir.join(format!("agent-{}.log", Instant::now().elapsed().as_nanos()));
        let child = Command::new(env!("CARGO_BIN_EXE_mpib-agent"))
            .arg("run")
            .arg("--hint-path")
            .arg(dir.join("hints"))
            .arg("--socket")
            .arg(dir.join("agent.sock"))
            .arg("--probes-dir")
            .arg(dir.join("probes"))
            .args(["--metrics-listen", "off"])
            .args(extra)
            .env_remove("MPIB_AGENT_CONFIG")
            .env_remove("MPIB_AGENT_ALLOWED_UIDS")
            .env_remove("MPIB_AGENT_ALLOWED_GIDS")
            .env_remove("MPIB_AGENT_MAX_FLOWS_PER_PROCESS")
            .env_remove("MPIB_AGENT_MAX_FLOWS_PER_USER")
            .envs(vars.iter().copied())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("start mpib-agent");
        let agent = Agent {
            child,
            dir: dir.to_path_buf(),
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while UnixStream::connect(agent.socket()).is_err() || !agent.control().exists() {
            assert!(
                Instant::now() < deadline,
                "mpib-agent did not start: {}",
                agent.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        agent
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.join("agent.sock")
    }

    pub fn control(&self) -> PathBuf {
        self.dir.join("agent.control")
    }

    pub fn hints(&self) -> PathBuf {
        self.dir.join("hints")
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `mpib-agent ARGS --control ...`: (exit code, stdout, stderr).
    pub fn command(&self, args: &[&str]) -> (i32, String, String) {
        let out = Command::new(env!("CARGO_BIN_EXE_mpib-agent"))
            .args(args)
            .arg("--control")
            .arg(self.control())
            .output()
            .expect("run mpib-agent");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    pub fn status(&self) -> String {
        let (code, out, err) = self.command(&["status"]);
        assert_eq!(code, 0, "status failed: {err}");
        out
    }

    /// Sends a signal.
    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, signal) };
    }

    /// SIGTERM and wait; the exit code.
    pub fn stop(mut self) -> i32 {
        self.signal(libc::SIGTERM);
        let status = self.child.wait().expect("wait for mpib-agent");
        status.code().unwrap_or(-1)
    }

    /// SIGKILL and wait.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Entry `slot` of the hint file: (sup_bw, seq, src, dst).
    pub fn entry(&self, slot: usize) -> (u32, u32, Ipv4Addr, Ipv4Addr) {
        let bytes = std::fs::read(self.hints()).expect("read the hint file");
        assert_eq!(bytes.len(), HINT_FILE_LEN);
        let at = entry_offset(slot);
        let word = |i: usize| {
            let w = &bytes[at + 4 * i..at + 4 * i + 4];
            [w[0], w[1], w[2], w[3]]
        };
        (
            u32::from_ne_bytes(word(0)),
            u32::from_ne_bytes(word(1)),
            Ipv4Addr::from(word(2)),
            Ipv4Addr::from(word(3)),
        )
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One request on a new connection; the response.
pub fn request(socket: &Path, request: AgentRequest) -> AgentResponse {
    let mut stream = UnixStream::connect(socket).expect("connect to the agent");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    stream
        .write_all(request.encode().as_bytes())
        .expect("send the request");
    let mut response = vec![0u8; request.response_len()];
    stream.read_exact(&mut response).expect("read the response");
    AgentResponse::decode(&response).expect("a valid response")
}

/// A register request for SOUT `10.0.0.1 -> 10.0.0.dst` (SUP `10.1.0.1 -> 10.1.0.dst`).
pub fn register(conn_id: u32, dst: u8) -> AgentRequest {
    AgentRequest::Register {
        conn_id,
        sout_src: [10, 0, 0, 1],
        sout_dst: [10, 0, 0, dst],
        sup_src: [10, 1, 0, 1],
        sup_dst: [10, 1, 0, dst],
    }
}

/// `GET /metrics` from the endpoint on `port`: the whole reply, head and body.
pub fn metrics(port: u16) -> String {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    let _ = stream.read_to_string(&mut text);
    text
}
