//! What one client can take from the agent (docs/SECURITY.md, "The agent", issue 34): hint
//! slots past its process's limit, and the registration socket or metrics endpoint by holding
//! idle connections. Each case is a real agent process and real sockets; the timing bounds are
//! liveness bounds (the plugin's 500 ms registration budget, a 2 s scrape), not measurements.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{free_port, metrics, register, request, temp_dir, Agent};
use mpib_proto::agent_wire::{AgentRequest, AgentResponse, AgentStatus};

/// A register request for a made-up SOUT pair `10.9.X.Y -> 10.8.X.Y` numbered `n`.
fn made_up(conn_id: u32, n: u32) -> AgentRequest {
    let [_, _, x, y] = n.to_be_bytes();
    AgentRequest::Register {
        conn_id,
        sout_src: [10, 9, x, y],
        sout_dst: [10, 8, x, y],
        sup_src: [10, 7, x, y],
        sup_dst: [10, 6, x, y],
    }
}

fn status_of(response: AgentResponse) -> AgentStatus {
    match response {
        AgentResponse::Register { status, .. } | AgentResponse::Deregister { status } => status,
    }
}

/// Child side of `one_process_cannot_take_every_slot`: another process registers a new pair
/// and exits 0 when it got a slot.
#[test]
fn child_registers_a_new_pair() {
    let Ok(socket) = std::env::var("MPIB_AGENT_TEST_BOUNDS_SOCKET") else {
        return;
    };
    let status = status_of(request(std::path::Path::new(&socket), register(5, 200)));
    std::process::exit(if status == AgentStatus::Success { 0 } else { 1 });
}

/// The issue's first case: one process registers 300 made-up flows. It gets 64 slots (a
/// quarter of the 256), the rest are answered status 1, counted `process_limit` and logged in
/// one line, and another process still gets a slot.
#[test]
fn one_process_cannot_take_every_slot() {
    let dir = temp_dir("process-limit");
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let agent = Agent::start(&dir, &["--metrics-listen", &listen]);
    let socket = agent.socket();
    let mut served = 0;
    for n in 0..300 {
        match status_of(request(&socket, made_up(n, n))) {
            AgentStatus::Success => served += 1,
            AgentStatus::NoFreeSlots => {}
            other => panic!("flow {n}: {other:?}"),
        }
    }
    assert_eq!(served, 64, "{}", agent.status());
    let child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_registers_a_new_pair", "--nocapture"])
        .env("MPIB_AGENT_TEST_BOUNDS_SOCKET", &socket)
        .status()
        .unwrap();
    assert!(
        child.success(),
        "another process got no slot: {}",
        agent.status()
    );
    let text = metrics(port);
    let refused = r#"mpib_agent_registrations_total{host="#;
    let limited = text
        .lines()
        .find(|l| l.starts_with(refused) && l.contains(r#"result="process_limit""#))
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok());
    assert_eq!(limited, Some(236.0), "{text}");
    let log = agent.log_text();
    // One line per 10 s, not one per refusal: one, or two should the 236 refusals of a loaded
    // machine straddle a period.
    let lines = log.matches("registration of a new flow refused").count();
    assert!((1..=2).contains(&lines), "{lines} lines: {log}");
    assert!(
        log.contains("the per-process limit (--max-flows-per-process"),
        "{log}"
    );
}

/// The limit is a setting: with `--max-flows-per-process 256` one process takes every slot (as
/// before the limit), with the variable at 2 it gets 2.
#[test]
fn the_process_limit_is_configurable() {
    let dir = temp_dir("process-limit-set");
    let agent = Agent::start(
        &dir,
        &[
            "--max-flows-per-process",
            "256",
            "--max-flows-per-user",
            "256",
        ],
    );
    let served = (0..256)
        .filter(|n| status_of(request(&agent.socket(), made_up(*n, *n))) == AgentStatus::Success)
        .count();
    assert_eq!(served, 256);
    drop(agent);
    let dir = temp_dir("process-limit-env");
    let agent = Agent::start_with_env(&dir, &[], &[("MPIB_AGENT_MAX_FLOWS_PER_PROCESS", "2")]);
    let served = (0..5)
        .filter(|n| status_of(request(&agent.socket(), made_up(*n, *n))) == AgentStatus::Success)
        .count();
    assert_eq!(served, 2);
}

/// The issue's second case, past the cap: 300 idle connections to the registration socket
/// (more than the 256 it keeps open), then real registrations, each answered within 2 s (the
/// plugin waits 500 ms; the bound leaves room for a loaded test machine). Before, 64 idle
/// connections held every client thread for a second: registrations took 3.8 s.
#[test]
fn idle_connections_do_not_stop_a_registration() {
    let dir = temp_dir("idle-registration");
    let agent = Agent::start(&dir, &[]);
    let socket = agent.socket();
    let idle: Vec<UnixStream> = (0..300)
        .map(|_| UnixStream::connect(&socket).unwrap())
        .collect();
    // Old enough to be evicted (100 ms), younger than their deadline (1 s).
    std::thread::sleep(Duration::from_millis(300));
    for n in 0..3 {
        let started = Instant::now();
        let status = status_of(request(&socket, register(n, 2)));
        let waited = started.elapsed();
        assert_eq!(status, AgentStatus::Success);
        assert!(
            waited < Duration::from_secs(2),
            "registration {n} answered after {waited:?}"
        );
    }
    drop(idle);
    let status = agent.status();
    assert!(status.contains("slots 1/256"), "{status}");
}

/// The issue's third case: 130 idle connections to the metrics port (more than the 64 it keeps
/// open), then a scrape answered within 3 s (a loaded machine's margin over a 2 s bound); the
/// oldest idle connection was closed to make room. Before, connections were served one at a
/// time with a 2 s read timeout: the scrape took 6 s.
#[test]
fn idle_connections_do_not_stop_a_scrape() {
    let dir = temp_dir("idle-metrics");
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let agent = Agent::start(&dir, &["--metrics-listen", &listen]);
    let mut idle: Vec<TcpStream> = (0..130)
        .map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    for _ in 0..3 {
        let started = Instant::now();
        let text = metrics(port);
        let waited = started.elapsed();
        assert!(
            waited < Duration::from_secs(3),
            "scrape answered after {waited:?}"
        );
        assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
        assert!(text.contains("\nmpib_agent_slots_total{"), "{text}");
    }
    let oldest = &mut idle[0];
    oldest
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let mut byte = [0u8; 1];
    assert_eq!(
        oldest.read(&mut byte).unwrap(),
        0,
        "the oldest idle connection is closed to make room"
    );
    drop(agent);
}

/// Pipelines deregistrations of an unknown id on one connection, keeping a window of them
/// unanswered (small enough that the agent's answers always fit its socket buffer, so it never
/// has cause to close the connection), until `stop`. Returns the answers read and whether the
/// connection was still open at the stop.
fn pipeline(socket: PathBuf, stop: Arc<AtomicBool>, started: Arc<AtomicBool>) -> (u64, bool) {
    const WINDOW: usize = 128;
    let request = AgentRequest::Deregister { conn_id: 0xdead };
    let one = request.encode().as_bytes().to_vec();
    let len = request.response_len();
    let mut stream = UnixStream::connect(socket).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(1)))
        .unwrap();
    stream.write_all(&one.repeat(WINDOW)).unwrap();
    let mut buffer = vec![0u8; len * WINDOW];
    let (mut answered, mut partial) = (0u64, 0usize);
    while !stop.load(Ordering::Relaxed) {
        let n = match stream.read(&mut buffer) {
            Ok(0) => return (answered, false),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(_) => return (answered, false),
        };
        partial += n;
        let whole = partial / len;
        partial %= len;
        answered += whole as u64;
        if answered >= WINDOW as u64 {
            started.store(true, Ordering::Relaxed);
        }
        if stream.write_all(&one.repeat(whole)).is_err() {
            return (answered, false);
        }
    }
    (answered, true)
}

/// One client pipelining valid requests as fast as they are answered (reading the answers as
/// they come) does not keep the serving thread from the others: registrations on other
/// connections are still answered within 2 s, and the pipelining client is still served.
/// Before, the thread answered one client until its socket was drained, which a pipelining
/// client never lets happen: every other client starved.
#[test]
fn a_pipelining_client_does_not_starve_the_others() {
    let dir = temp_dir("pipelining");
    let agent = Agent::start(&dir, &[]);
    let stop = Arc::new(AtomicBool::new(false));
    let started = Arc::new(AtomicBool::new(false));
    let pipeliner = {
        let (socket, stop, started) = (agent.socket(), Arc::clone(&stop), Arc::clone(&started));
        std::thread::spawn(move || pipeline(socket, stop, started))
    };
    assert!(
        common::eventually(Duration::from_secs(10), || started.load(Ordering::Relaxed)),
        "the pipelining client was not answered"
    );
    for n in 0..3 {
        let begun = Instant::now();
        let status = status_of(request(&agent.socket(), register(n, 3)));
        let waited = begun.elapsed();
        assert_eq!(status, AgentStatus::Success);
        assert!(
            waited < Duration::from_secs(2),
            "registration {n} answered after {waited:?} beside a pipelining client"
        );
    }
    stop.store(true, Ordering::Relaxed);
    let (answered, open) = pipeliner.join().unwrap();
    assert!(
        open,
        "the pipelining client was closed after {answered} answers"
    );
    let status = agent.status();
    assert!(status.contains("slots 1/256"), "{status}");
}

/// Whether the agent still holds `stream` open (nothing to read, no end of file).
fn still_open(stream: &mut TcpStream) -> bool {
    stream.set_nonblocking(true).unwrap();
    let mut byte = [0u8; 1];
    let open =
        matches!(stream.read(&mut byte), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
    stream.set_nonblocking(false).unwrap();
    open
}

/// A full metrics endpoint closes nobody until a newcomer needs a place, and then the oldest
/// idle connection, not an older one that has sent part of its request: that scraper is
/// answered when it completes it. Before, the oldest connection was closed as soon as the table
/// was full, whatever it was doing and whether or not anyone waited.
#[test]
fn only_an_idle_connection_gives_its_place_and_only_to_a_newcomer() {
    let dir = temp_dir("evict-idle");
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let agent = Agent::start(&dir, &["--metrics-listen", &listen]);
    let mut partial = TcpStream::connect(("127.0.0.1", port)).unwrap();
    partial.write_all(b"GET /metrics HTTP/1.0\r\n").unwrap();
    std::thread::sleep(Duration::from_millis(200));
    // With `partial`, exactly the 64 the endpoint keeps open.
    let mut idle: Vec<TcpStream> = (0..63)
        .map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect();
    // Past the 100 ms a client has to speak: the old loop evicted the oldest here.
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        still_open(&mut partial),
        "closed mid-request, nobody waiting"
    );
    assert!(still_open(&mut idle[0]), "closed with nobody waiting");
    let text = metrics(port);
    assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
    idle[0]
        .set_read_timeout(Some(Duration::from_secs(3)))
        .unwrap();
    let mut byte = [0u8; 1];
    assert_eq!(
        idle[0].read(&mut byte).unwrap(),
        0,
        "the oldest idle connection gave its place to the scrape"
    );
    assert!(still_open(&mut idle[1]), "one place was needed");
    partial.write_all(b"Host: x\r\n\r\n").unwrap();
    partial
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut reply = String::new();
    let _ = partial.read_to_string(&mut reply);
    assert!(reply.starts_with("HTTP/1.1 200 OK"), "{reply}");
    drop(agent);
}
