//! The registration socket: the reference agent interface (`include/mpib_agent.h`) on a Unix
//! stream socket, one thread per client with a cap, every read and write bounded in time.
//!
//! Why a thread per client with timeouts: a client that connects and says nothing, or sends half
//! a message, must never stall the others (plugins register from NCCL's proxy thread with a
//! 500 ms budget). Each message must arrive whole within [`CLIENT_TIMEOUT`] (a deadline per
//! message, not per read, so a byte every 0.9 s does not hold a thread), and an idle client is
//! closed after the same time. Past [`MAX_CLIENTS`] at once, new ones wait in the socket's
//! backlog until a thread is free (NCCL's batched setup registers hundreds of connections of
//! a process at once; refusing them left their transfers all-SOUT). Bad input is answered with status 2
//! (invalid request) where a response shape is known, and the connection is closed.
//!
//! The client's pid comes from the socket's peer credentials (`SO_PEERCRED`), not from the
//! `conn_id`, whose pid bits are truncated: it is what ties a connection to a process that may
//! exit without deregistering. Its uid and gid decide whether it may register at all
//! (`--allowed-uids`, `--allowed-gids`: [`crate::access`]); a client refused so is answered
//! status 2 like bad input, counted `not_allowed`, and logged once per uid.

use std::io::{ErrorKind, Read, Write};
use std::os::unix::io::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use mpib_proto::agent_wire::{
    AgentRequest, AgentResponse, AgentStatus, Header, HEADER_LEN, MAX_MESSAGE_LEN, MSG_DEREGISTER,
};

use crate::access::user_label;
use crate::config::Policies;
use crate::log;
use crate::measure::start_ticks;
use crate::slots::Process;
use crate::state::State;

/// How long a client may take to send each whole message (and may stay idle between two).
pub const CLIENT_TIMEOUT: Duration = Duration::from_millis(1000);
/// Clients served at once.
pub const MAX_CLIENTS: usize = 64;

/// What the server threads share.
#[derive(Clone)]
pub struct Shared {
    /// The state.
    pub state: Arc<Mutex<State>>,
    /// The current configuration.
    pub policies: Arc<ArcSwap<Policies>>,
    /// Set to stop.
    pub stop: Arc<AtomicBool>,
}

impl Shared {
    /// Locks the state, recovering it if a thread panicked while holding it (the state stays
    /// consistent between operations: each one is a few map updates).
    pub fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Accepts clients until `shared.stop`; each is served on its own thread.
pub fn serve(listener: UnixListener, shared: Shared) {
    let active = Arc::new(AtomicUsize::new(0));
    if let Err(e) = listener.set_nonblocking(true) {
        log::error(&format!(
            "registration socket: cannot set non-blocking: {e}"
        ));
        return;
    }
    while !shared.stop.load(Ordering::Relaxed) {
        // Only this thread adds to `active`, so a client accepted below always has a thread.
        if active.load(Ordering::Acquire) >= MAX_CLIENTS {
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        let stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            }
            Err(e) => {
                log::warn(&format!("registration socket: accept: {e}"));
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        active.fetch_add(1, Ordering::AcqRel);
        let (client_shared, client_active) = (shared.clone(), Arc::clone(&active));
        let spawned = std::thread::Builder::new()
            .name("mpib-agent-client".into())
            .spawn(move || {
                serve_client(stream, &client_shared);
                client_active.fetch_sub(1, Ordering::AcqRel);
            });
        if let Err(e) = spawned {
            active.fetch_sub(1, Ordering::AcqRel);
            log::warn(&format!(
                "registration socket: cannot start a client thread: {e}"
            ));
        }
    }
}

/// Serves one client's messages until it closes, misbehaves or stalls.
fn serve_client(mut stream: UnixStream, shared: &Shared) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_write_timeout(Some(CLIENT_TIMEOUT));
    let peer = peer_process(&stream);
    let mut messages = 0u64;
    loop {
        let mut buffer = [0u8; MAX_MESSAGE_LEN];
        let deadline = Instant::now() + CLIENT_TIMEOUT;
        match read_full(&mut stream, &mut buffer[..HEADER_LEN], deadline) {
            Ok(0) if messages > 0 => return,
            Ok(0) => return shared.lock().bad_client("silent"),
            Ok(n) if n < HEADER_LEN => return shared.lock().bad_client("short"),
            Ok(_) => {}
            // Idle after a good message: an ordinary close, not a bad client.
            Err(_) if messages > 0 => return,
            Err(_) => return shared.lock().bad_client("silent"),
        }
        let header = match Header::decode(&buffer[..HEADER_LEN]) {
            Ok(header) => header,
            Err(_) => return refuse(&mut stream, shared, 0, "wrong_magic"),
        };
        let Some(expected) = Header::request_len(header.msg_type) else {
            return refuse(&mut stream, shared, header.msg_type, "wrong_type");
        };
        if usize::from(header.msg_len) != expected {
            return refuse(&mut stream, shared, header.msg_type, "wrong_length");
        }
        match read_full(&mut stream, &mut buffer[HEADER_LEN..expected], deadline) {
            Ok(n) if n == expected - HEADER_LEN => {}
            _ => return shared.lock().bad_client("short"),
        }
        let Ok(request) = AgentRequest::decode(&buffer[..expected]) else {
            return refuse(&mut stream, shared, header.msg_type, "wrong_length");
        };
        let Some((process, gid)) = peer else {
            return refuse(&mut stream, shared, header.msg_type, "no_credentials");
        };
        let policies = shared.policies.load();
        if !policies.access.allows(process.uid, gid) {
            return not_allowed(&mut stream, shared, header.msg_type, process, gid);
        }
        let (response, lines) = {
            let mut state = shared.lock();
            (state.handle(process, request, &policies), state.take_log())
        };
        for line in lines {
            log::warn(&line);
        }
        if stream.write_all(response.encode().as_bytes()).is_err() {
            return;
        }
        messages += 1;
    }
}

/// Answers status 2 in the shape of the request's response (a registration's when unknown),
/// counts the client and closes.
fn refuse(stream: &mut UnixStream, shared: &Shared, msg_type: u8, reason: &'static str) {
    shared.lock().bad_client(reason);
    let response = if msg_type == MSG_DEREGISTER {
        AgentResponse::Deregister {
            status: AgentStatus::InvalidRequest,
        }
    } else {
        AgentResponse::Register {
            status: AgentStatus::InvalidRequest,
            hint_slot: 0,
        }
    };
    let _ = stream.write_all(response.encode().as_bytes());
}

/// Refuses a client whose uid and gid the allowed lists leave out; WARNs once per uid (a job
/// retries on every connection: one line per connection would flood the log).
fn not_allowed(stream: &mut UnixStream, shared: &Shared, msg_type: u8, process: Process, gid: u32) {
    let first = shared.lock().refused_uids.insert(process.uid);
    if first {
        log::warn(&format!(
            "registration refused: {} (pid {}, gid {gid}) is not allowed by --allowed-uids / \
             --allowed-gids (MPIB_AGENT_ALLOWED_UIDS / MPIB_AGENT_ALLOWED_GIDS, allowed_uids / \
             allowed_gids); answered status 2, and later refusals of this uid are only counted \
             (mpib_agent_bad_clients_total{{reason=\"not_allowed\"}})",
            user_label(process.uid),
            process.pid
        ));
    }
    refuse(stream, shared, msg_type, "not_allowed");
}

/// Reads until `buffer` is full, EOF, an error or `deadline`; returns the bytes read (an error
/// only when nothing was read).
fn read_full(
    stream: &mut UnixStream,
    buffer: &mut [u8],
    deadline: Instant,
) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buffer.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            if filled == 0 {
                return Err(ErrorKind::TimedOut.into());
            }
            break;
        }
        stream.set_read_timeout(Some(left))?;
        match stream.read(&mut buffer[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if filled == 0 => return Err(e),
            Err(_) => break,
        }
    }
    Ok(filled)
}

/// The connecting process and its gid from `SO_PEERCRED` (as they were at `connect`).
fn peer_process(stream: &UnixStream) -> Option<(Process, u32)> {
    let mut credentials = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: a valid socket descriptor, an out-buffer of the size passed, as getsockopt(2)
    // documents for SO_PEERCRED.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut credentials as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 || credentials.pid <= 0 {
        return None;
    }
    let pid = credentials.pid as u32;
    let process = Process {
        pid,
        start_ticks: start_ticks(pid),
        uid: credentials.uid,
    };
    Some((process, credentials.gid))
}
