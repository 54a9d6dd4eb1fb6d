//! Advanced mode against agents that misbehave: none, one that never accepts, one that accepts
//! and never answers, one that hangs up, one that answers garbage. Every `connect` and `accept`
//! call must return promptly (the registration is polled across calls, never waited for), the
//! connection must come up all-SOUT without a slot, and `close` must not wait for the agent.

use std::io::{Read, Write};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::net::agent::registration::AGENT_DEADLINE;
use crate::net::tests::{connect_pair, env_lock, Pair};

/// Far above a non-blocking call on a loaded 2-core machine, far below a blocking wait.
const PROMPT: Duration = Duration::from_millis(50);

/// How a fake agent treats each client.
#[derive(Clone, Copy)]
enum Misbehaviour {
    /// Never calls `accept` (the kernel still completes connects into the backlog).
    NeverAccepts,
    /// Accepts, reads the request, never answers.
    Silent,
    /// Accepts and closes at once.
    HangsUp,
    /// Answers with bytes that are not a response.
    Garbage,
}

struct FakeAgent {
    dir: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeAgent {
    fn start(behaviour: Misbehaviour) -> FakeAgent {
        let dir = std::env::temp_dir().join(format!(
            "mpib-fake-agent-{}-{}",
            std::process::id(),
            behaviour as u8
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let listener = UnixListener::bind(dir.join("agent.sock")).unwrap();
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut held = Vec::new();
            while !flag.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(2));
                if matches!(behaviour, Misbehaviour::NeverAccepts) {
                    continue;
                }
                let Ok((mut stream, _)) = listener.accept() else {
                    continue;
                };
                stream.set_nonblocking(false).unwrap();
                match behaviour {
                    Misbehaviour::HangsUp => drop(stream),
                    Misbehaviour::Garbage => {
                        let _ = stream.write_all(b"RIPM this is not a response");
                    }
                    _ => {
                        let mut request = [0u8; 28];
                        let _ = stream.read(&mut request);
                        held.push(stream);
                    }
                }
            }
        });
        FakeAgent {
            dir,
            stop,
            thread: Some(thread),
        }
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("agent.sock")
    }
}

impl Drop for FakeAgent {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Connects an advanced-mode pair against the agent socket `socket` and checks that no call
/// waited, that no slot was assigned, and that `close` returns promptly.
fn connects_promptly_without_a_slot(socket: &Path, case: &str) {
    let hints = socket.with_file_name("hints");
    let started = Instant::now();
    let pair: Pair = connect_pair(&[
        ("MPIB_MODE", "1"),
        ("MPIB_AGENT_SOCKET", socket.to_str().unwrap()),
        ("MPIB_HINT_PATH", hints.to_str().unwrap()),
    ]);
    assert!(
        pair.slowest_call < PROMPT,
        "{case}: a connect/accept call took {:?}",
        pair.slowest_call
    );
    assert!(
        started.elapsed() < AGENT_DEADLINE * 4,
        "{case}: connecting took {:?}",
        started.elapsed()
    );
    assert!(
        pair.send.info.agent.is_none() && pair.recv.info.agent.is_none(),
        "{case}"
    );
    let closing = Instant::now();
    crate::net::tests::close(pair);
    assert!(
        closing.elapsed() < PROMPT * 2,
        "{case}: close took {:?}",
        closing.elapsed()
    );
}

#[test]
fn a_misbehaving_agent_never_holds_a_call() {
    let _guard = env_lock();
    for (behaviour, case) in [
        (Misbehaviour::NeverAccepts, "an agent that never accepts"),
        (Misbehaviour::Silent, "an agent that never answers"),
        (Misbehaviour::HangsUp, "an agent that hangs up"),
        (Misbehaviour::Garbage, "an agent that answers garbage"),
    ] {
        let agent = FakeAgent::start(behaviour);
        connects_promptly_without_a_slot(&agent.socket(), case);
    }
}

#[test]
fn no_agent_at_all_falls_back_at_once() {
    let _guard = env_lock();
    let socket =
        std::env::temp_dir().join(format!("mpib-no-agent-{}/agent.sock", std::process::id()));
    connects_promptly_without_a_slot(&socket, "no agent socket");
}
