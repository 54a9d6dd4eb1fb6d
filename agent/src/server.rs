//! The registration socket: the reference agent interface (`include/mpib_agent.h`) on a Unix
//! stream socket, every client served by one thread that waits on them all ([`crate::clients`]),
//! every message bounded in time.
//!
//! Why one waiting thread: a client that connects and says nothing, or sends half a message,
//! must never stall the others (plugins register from NCCL's proxy thread with a 500 ms
//! budget). With a thread per client and 64 threads, 70 idle connections kept real
//! registrations unanswered; here an idle client costs a table entry until its deadline. Each
//! message must arrive whole within [`CLIENT_TIMEOUT`] (a deadline per message, not per read,
//! so a byte every 0.9 s does not hold a client open), and an idle client is closed after the
//! same time. At most [`MAX_CLIENTS`] are open at once; a newcomer past that takes the place of
//! the oldest idle client (between messages) that has had [`crate::clients::EVICTABLE_AFTER`] to
//! speak (counted `busy` when it had sent nothing), and when none may give its place, newcomers
//! wait in the socket's backlog (NCCL's batched setup registers hundreds of connections of a
//! process at once; refusing them left their transfers all-SOUT). A client is answered one
//! message per round of the loop, so one that pipelines requests is served in turn with the
//! others. Bad input is answered with status 2 (invalid request) where a response shape is
//! known, and the connection is closed.
//!
//! The client's pid comes from the socket's peer credentials (`SO_PEERCRED`), not from the
//! `conn_id`, whose pid bits are truncated: it is what ties a connection to a process that may
//! exit without deregistering. Its uid and gid decide whether it may register at all
//! (`--allowed-uids`, `--allowed-gids`: [`crate::access`]); a client refused so is answered
//! status 2 like bad input, counted `not_allowed`, and logged once per uid.

use std::io::{ErrorKind, Read, Write};
use std::os::unix::io::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use mpib_proto::agent_wire::{
    AgentRequest, AgentResponse, AgentStatus, Header, HEADER_LEN, MAX_MESSAGE_LEN, MSG_DEREGISTER,
};

use crate::access::user_label;
use crate::clients::{self, Accepted, Client};
use crate::config::Policies;
use crate::log;
use crate::measure::start_ticks;
use crate::slots::Process;
use crate::state::State;
use crate::wake::Wake;

/// How long a client may take to send each whole message (and may stay idle between two).
pub const CLIENT_TIMEOUT: Duration = Duration::from_millis(1000);
/// Clients open at once: far more than a batch of NCCL's registrations keeps open (each is
/// answered within a round of the loop), few enough that the descriptors stay well inside the
/// usual limit of 1,024 with the metrics endpoint's.
pub const MAX_CLIENTS: usize = 256;

/// What the server threads share.
#[derive(Clone)]
pub struct Shared {
    /// The state.
    pub state: Arc<Mutex<State>>,
    /// The current configuration.
    pub policies: Arc<ArcSwap<Policies>>,
    /// Set to stop; [`Shared::stopping`] is then notified.
    pub stop: Arc<AtomicBool>,
    /// Notified once when stopping (and never drained): every serving thread polls it.
    pub stopping: Arc<Wake>,
    /// Wakes the policy loop: a registration, a signal.
    pub policy_wake: Arc<Wake>,
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

/// Serves clients until `shared.stop`.
pub fn serve(listener: UnixListener, shared: Shared) {
    if let Err(e) = listener.set_nonblocking(true) {
        log::error(&format!(
            "registration socket: cannot set non-blocking: {e}"
        ));
        return;
    }
    let accept = || match listener.accept() {
        Ok((stream, _)) => {
            stream.set_nonblocking(true)?;
            Ok(Accepted::Client(Registrant::new(stream, shared.clone())))
        }
        Err(e) if e.kind() == ErrorKind::WouldBlock => Ok(Accepted::None),
        Err(e) => Err(e),
    };
    clients::serve(
        "registration socket",
        listener.as_raw_fd(),
        &shared.stop,
        shared.stopping.fd(),
        MAX_CLIENTS,
        accept,
    );
}

/// One client of the registration socket: the message it is receiving and its deadline.
struct Registrant {
    stream: UnixStream,
    shared: Shared,
    peer: Option<(Process, u32)>,
    buffer: [u8; MAX_MESSAGE_LEN],
    /// Bytes of the current message received.
    filled: usize,
    /// The current message's length, once its header is in.
    expected: Option<usize>,
    deadline: Instant,
    /// Messages answered.
    messages: u64,
}

impl Registrant {
    fn new(stream: UnixStream, shared: Shared) -> Registrant {
        let peer = peer_process(&stream);
        Registrant {
            stream,
            shared,
            peer,
            buffer: [0; MAX_MESSAGE_LEN],
            filled: 0,
            expected: None,
            deadline: Instant::now() + CLIENT_TIMEOUT,
            messages: 0,
        }
    }

    /// Reads what has arrived and answers at most one whole message, then returns: one thread
    /// serves every client, and one that pipelines requests faster than they are answered would
    /// otherwise keep it from the others (poll is level-triggered: what is left is read on the
    /// next round, after the other clients). False when the client is done (closed, refused or
    /// failed).
    fn receive(&mut self) -> bool {
        loop {
            let wanted = self.expected.unwrap_or(HEADER_LEN);
            match self.stream.read(&mut self.buffer[self.filled..wanted]) {
                Ok(0) => return self.closed(),
                Ok(n) => self.filled += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => return self.closed(),
            }
            if self.filled < wanted {
                continue;
            }
            if self.expected.is_none() {
                match self.check_header() {
                    Ok(length) => self.expected = Some(length),
                    Err(()) => return false,
                }
                continue;
            }
            if !self.answer() {
                return false;
            }
            self.filled = 0;
            self.expected = None;
            self.messages += 1;
            self.deadline = Instant::now() + CLIENT_TIMEOUT;
            return true;
        }
    }

    /// The client closed (or its socket failed): an ordinary end after a whole message, else
    /// a bad client.
    fn closed(&mut self) -> bool {
        match (self.filled, self.messages) {
            (0, 0) => self.shared.lock().bad_client("silent"),
            (0, _) => {}
            _ => self.shared.lock().bad_client("short"),
        }
        false
    }

    /// The whole message's length from its header, or the client refused.
    fn check_header(&mut self) -> Result<usize, ()> {
        let Ok(header) = Header::decode(&self.buffer[..HEADER_LEN]) else {
            refuse(&mut self.stream, &self.shared, 0, "wrong_magic");
            return Err(());
        };
        let Some(expected) = Header::request_len(header.msg_type) else {
            refuse(
                &mut self.stream,
                &self.shared,
                header.msg_type,
                "wrong_type",
            );
            return Err(());
        };
        if usize::from(header.msg_len) != expected {
            refuse(
                &mut self.stream,
                &self.shared,
                header.msg_type,
                "wrong_length",
            );
            return Err(());
        }
        Ok(expected)
    }

    /// Answers the whole message in the buffer; false when the client is to be closed.
    fn answer(&mut self) -> bool {
        let message = &self.buffer[..self.filled];
        let msg_type = Header::decode(message).map_or(0, |h| h.msg_type);
        let Ok(request) = AgentRequest::decode(message) else {
            refuse(&mut self.stream, &self.shared, msg_type, "wrong_length");
            return false;
        };
        let Some((process, gid)) = self.peer else {
            refuse(&mut self.stream, &self.shared, msg_type, "no_credentials");
            return false;
        };
        let policies = self.shared.policies.load();
        if !policies.access.allows(process.uid, gid) {
            not_allowed(&mut self.stream, &self.shared, msg_type, process, gid);
            return false;
        }
        let (response, refusals) = {
            let mut state = self.shared.lock();
            (state.handle(process, request, &policies), state.take_log())
        };
        // Written unlocked: a user limit's line names the user, which runs getent.
        for refusal in refusals {
            log::warn(&refusal.line());
        }
        if let AgentResponse::Register {
            status: AgentStatus::Success,
            ..
        } = response
        {
            // The policy loop samples the probes only while flows exist: let it look again.
            self.shared.policy_wake.notify();
        }
        // A response is at most 16 bytes into an empty socket buffer: a write that would block
        // is a client that does not read its answers, closed.
        self.stream.write_all(response.encode().as_bytes()).is_ok()
    }
}

impl Client for Registrant {
    fn fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }

    fn events(&self) -> i16 {
        libc::POLLIN
    }

    fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Between messages (an answer is written whole when its request is complete).
    fn idle(&self) -> bool {
        self.filled == 0
    }

    fn ready(&mut self) -> bool {
        self.receive()
    }

    fn timed_out(&mut self) {
        match (self.filled, self.messages) {
            // Idle after a good message: an ordinary close, not a bad client.
            (0, 0) => self.shared.lock().bad_client("silent"),
            (0, _) => {}
            _ => self.shared.lock().bad_client("short"),
        }
    }

    fn evicted(&mut self) {
        // Only an idle client is evicted: one that has said nothing is counted, one between two
        // messages ends as ordinarily as at its idle deadline.
        if self.filled > 0 || self.messages == 0 {
            self.shared.lock().bad_client("busy");
        }
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
    let first = {
        let mut state = shared.lock();
        state.refused_uids.insert(process.uid)
    };
    // Unlocked: naming the user runs getent (once per uid, on this thread).
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::shm::HintFile;
    use mpib_proto::agent_wire::AgentRequest;

    /// A registrant on one end of a socket pair, the other end for the test.
    fn registrant() -> (Registrant, UnixStream) {
        let dir = std::env::temp_dir().join(format!("mpib-agent-server-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (hints, _) = HintFile::open(&dir.join("hints")).unwrap();
        let policies = Policies::default();
        let shared = Shared {
            state: Arc::new(Mutex::new(State::new(hints, &policies))),
            policies: Arc::new(ArcSwap::from_pointee(policies)),
            stop: Arc::new(AtomicBool::new(false)),
            stopping: Arc::new(Wake::new().unwrap()),
            policy_wake: Arc::new(Wake::new().unwrap()),
        };
        let (ours, theirs) = UnixStream::pair().unwrap();
        ours.set_nonblocking(true).unwrap();
        theirs.set_nonblocking(true).unwrap();
        (Registrant::new(ours, shared), theirs)
    }

    /// How many whole responses of `len` bytes wait to be read.
    fn answers(client: &mut UnixStream, len: usize) -> usize {
        let mut buffer = vec![0u8; 4096];
        let mut total = 0;
        loop {
            match client.read(&mut buffer) {
                Ok(0) => break,
                Ok(n) => total += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(total % len, 0, "whole responses");
        total / len
    }

    /// A client that pipelines requests is answered one per readiness, so that the loop goes
    /// round the other clients between two of its requests; the rest wait in its socket.
    #[test]
    fn one_answer_per_readiness() {
        let (mut registrant, mut client) = registrant();
        let request = AgentRequest::Deregister { conn_id: 7 };
        let mut pipelined = Vec::new();
        for _ in 0..5 {
            pipelined.extend_from_slice(request.encode().as_bytes());
        }
        client.write_all(&pipelined).unwrap();
        let len = request.response_len();
        for round in 1..=5 {
            assert!(registrant.ready(), "round {round}: kept open");
            assert_eq!(answers(&mut client, len), 1, "round {round}");
            assert!(registrant.idle());
        }
        assert!(registrant.ready(), "nothing left: waits for more");
        assert_eq!(answers(&mut client, len), 0);
        let unknown = registrant.shared.lock().counters.deregistrations["unknown"];
        assert_eq!(unknown, 5);
        client.write_all(&pipelined[..3]).unwrap();
        assert!(registrant.ready());
        assert!(!registrant.idle(), "mid-message");
    }
}
