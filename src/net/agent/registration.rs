//! Advanced mode's registration with the policy agent, without ever blocking
//! (docs/ARCHITECTURE.md, 'Advanced mode and the agent').
//!
//! Why non-blocking: NCCL's proxy thread drives every connection and transfer of a communicator
//! from one thread, so `connect`, `accept` and `close` must return promptly even when the agent
//! is stuck (it accepted but never answers) or gone. The registration is therefore a stage of
//! the connection's state machine ([`PendingRegistration::poll`] once per `connect`/`accept`
//! call) on a non-blocking socket with an overall deadline; deregistration on `close` sends its
//! request and does not wait for the answer. Without an agent (nothing listening, a refusal, a
//! full backlog, a malformed answer or the deadline) the connection still works and every
//! transfer goes 100 % SOUT (docs/AGENT.md, 'What it does'), logged once at WARN.
//!
//! Every send passes `MSG_NOSIGNAL`: the host is a C program (NCCL) whose SIGPIPE would end the
//! job if the agent closed its end first.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::time::{Duration, Instant};

use socket2::{Domain, SockAddr, Socket, Type};

use crate::log;
use crate::params::Settings;
use crate::proto::agent_wire::{
    conn_id, AgentRequest, AgentResponse, Header, Message, HEADER_LEN, MAX_MESSAGE_LEN,
};
use crate::proto::hint::HINT_MAX_ENTRIES;
use crate::trust::{check_shared_path, is_missing, Trusted};

use crate::net::observe::telemetry::Telemetry;

/// How long a connection waits, across calls, for the agent's answer (it is local: an answer
/// takes microseconds; this only bounds a stuck agent).
pub(crate) const AGENT_DEADLINE: Duration = Duration::from_millis(500);

static CONNECTION_COUNTER: AtomicU16 = AtomicU16::new(0);

/// Whether a connection without a slot was already reported at WARN in this process.
static WARNED: AtomicBool = AtomicBool::new(false);

/// The first connection left without a hint slot is a WARN; the next ones are INFO (a job of
/// thousands of connections must not flood the log), all counted in the probes file.
fn report_without_slot(message: std::fmt::Arguments<'_>) {
    if WARNED.swap(true, Ordering::Relaxed) {
        info!(log::NET, "{message}");
    } else {
        warn!(
            log::NET,
            "{message} (further connections without a slot: INFO, and counted in the probes \
             file's mpib_connections_without_agent_total)"
        );
    }
}

/// A registered connection; deregistered (without waiting) on drop.
#[derive(Debug)]
pub(crate) struct AgentRegistration {
    socket_path: String,
    conn_id: u32,
    /// The slot the agent assigned.
    pub hint_slot: u32,
}

/// A registration in flight: the request is being sent or the answer awaited.
pub(crate) struct PendingRegistration {
    socket: Socket,
    request: Message,
    /// Bytes of the answer to `request`.
    expected: usize,
    sent: usize,
    response: [u8; MAX_MESSAGE_LEN],
    received: usize,
    deadline: Instant,
    conn_id: u32,
    socket_path: String,
    /// "10.0.0.1->10.0.0.2" for messages.
    flow: String,
}

impl PendingRegistration {
    /// Starts registering the connection's SOUT pair ([`sout_pair`]) and SUP pair (the SUP
    /// rails' addresses). `None`, with a WARN, when no agent can be reached.
    pub(crate) fn start(
        settings: &Settings,
        local: Ipv4Addr,
        peer: Ipv4Addr,
        sup: (Ipv4Addr, Ipv4Addr),
    ) -> Option<PendingRegistration> {
        let id = conn_id(
            std::process::id(),
            CONNECTION_COUNTER.fetch_add(1, Ordering::Relaxed),
        );
        let request = AgentRequest::Register {
            conn_id: id,
            sout_src: local.octets(),
            sout_dst: peer.octets(),
            sup_src: sup.0.octets(),
            sup_dst: sup.1.octets(),
        };
        let flow = format!("{local}->{peer}");
        match connect_trusted(settings) {
            Ok(socket) => Some(PendingRegistration {
                socket,
                request: request.encode(),
                expected: request.response_len(),
                sent: 0,
                response: [0; MAX_MESSAGE_LEN],
                received: 0,
                deadline: Instant::now() + AGENT_DEADLINE,
                conn_id: id,
                socket_path: settings.agent_socket.clone(),
                flow,
            }),
            Err(Unreachable::Unavailable(e)) => {
                report_without_slot(format_args!(
                    "MPIB_MODE=1 but the agent at MPIB_AGENT_SOCKET={} is unavailable ({e}); \
                     connection {flow} goes 100% SOUT",
                    settings.agent_socket
                ));
                None
            }
            Err(Unreachable::Refused(why)) => {
                report_without_slot(format_args!(
                    "MPIB_MODE=1 but advanced mode is refused for this path: {why}; connection \
                     {flow} goes 100% SOUT"
                ));
                None
            }
        }
    }

    /// Moves the exchange on without waiting. `None`: not finished, call again; `Some(None)`: no
    /// registration (the reason was logged at WARN); `Some(Some(_))`: registered.
    pub(crate) fn poll(&mut self) -> Option<Option<AgentRegistration>> {
        match self.step() {
            Ok(None) if Instant::now() < self.deadline => None,
            Ok(None) => Some(self.give_up(&format!(
                "no answer within {} ms",
                AGENT_DEADLINE.as_millis()
            ))),
            Ok(Some(response)) => Some(self.accept(response)),
            Err(e) => Some(self.give_up(&e)),
        }
    }

    /// The registration stage of connect/accept: polls `pending` (`None`: no agent was
    /// reachable, so the stage is over without a registration). `None` while still in flight.
    /// A connection that ends the stage without a slot is counted in the probes file
    /// (`agent_unavailable`).
    pub(crate) fn poll_stage(
        pending: &mut Option<PendingRegistration>,
        telemetry: &Telemetry,
    ) -> Option<Option<AgentRegistration>> {
        let outcome = match pending {
            None => Some(None),
            Some(pending) => pending.poll(),
        };
        if let Some(None) = outcome {
            telemetry.agent_unavailable();
        }
        outcome
    }

    /// Sends what is left of the request, then reads what has arrived of the answer.
    fn step(&mut self) -> Result<Option<AgentResponse>, String> {
        let bytes = self.request.as_bytes();
        while self.sent < bytes.len() {
            match self
                .socket
                .send_with_flags(&bytes[self.sent..], libc::MSG_NOSIGNAL)
            {
                Ok(n) => self.sent += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) => return Err(format!("sending the registration: {e}")),
            }
        }
        let expected = self.expected;
        while self.received < expected {
            // The header first: a response announcing another length is refused before more
            // bytes are read.
            let want = if self.received < HEADER_LEN {
                HEADER_LEN
            } else {
                expected
            };
            match read_some(&self.socket, &mut self.response[self.received..want]) {
                Ok(0) => return Err("the agent closed the connection".into()),
                Ok(n) => self.received += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) => return Err(format!("reading the answer: {e}")),
            }
            if self.received == HEADER_LEN {
                let header = Header::decode(&self.response)?;
                if usize::from(header.msg_len) != expected {
                    return Err(format!(
                        "the answer announces {} bytes; a registration's is {expected}",
                        header.msg_len
                    ));
                }
            }
        }
        AgentResponse::decode(&self.response[..expected]).map(Some)
    }

    fn accept(&self, response: AgentResponse) -> Option<AgentRegistration> {
        match response.slot() {
            // slot() < HINT_MAX_ENTRIES (256): fits u32.
            Some(slot) => Some(AgentRegistration {
                socket_path: self.socket_path.clone(),
                conn_id: self.conn_id,
                hint_slot: slot as u32,
            }),
            None => self.give_up(&format!(
                "it answered {response:?} (slots are 0..{HINT_MAX_ENTRIES})"
            )),
        }
    }

    fn give_up(&self, why: &str) -> Option<AgentRegistration> {
        report_without_slot(format_args!(
            "agent at {} did not register connection {} ({why}); its transfers go 100% SOUT",
            self.socket_path, self.flow
        ));
        None
    }
}

impl Drop for AgentRegistration {
    /// Deregisters without waiting for the answer: `close` must not block on the agent.
    fn drop(&mut self) {
        let request = AgentRequest::Deregister {
            conn_id: self.conn_id,
        }
        .encode();
        let sent = connect_nonblocking(&self.socket_path)
            .and_then(|socket| socket.send_with_flags(request.as_bytes(), libc::MSG_NOSIGNAL));
        match sent {
            Ok(n) if n == request.as_bytes().len() => {}
            Ok(n) => info!(
                log::NET,
                "agent deregistration of {:#x}: only {n} bytes went out", self.conn_id
            ),
            Err(e) => info!(
                log::NET,
                "agent deregistration of {:#x} failed: {e}", self.conn_id
            ),
        }
    }
}

/// Why a connection gets no agent.
pub(crate) enum Unreachable {
    /// Nothing (or nothing usable) answers at the socket.
    Unavailable(std::io::Error),
    /// A shared path or the agent's user is not trusted (docs/SECURITY.md, 'The plugin').
    Refused(String),
}

/// Connects to the agent once its socket, the hint file and the agent's user are trusted: whoever
/// can replace them could answer registrations and steer the split. Only a missing path is left
/// to fail as before (nothing to trust; the connect or the mapping reports it).
pub(crate) fn connect_trusted(settings: &Settings) -> Result<Socket, Unreachable> {
    let trusted = Trusted::new(&settings.trusted_uids);
    for (path, what) in [
        (&settings.agent_socket, "MPIB_AGENT_SOCKET"),
        (&settings.hint_path, "MPIB_HINT_PATH"),
    ] {
        let path = Path::new(path);
        if let Some(checked) = existing_or_parent(path) {
            check_shared_path(checked, what, &trusted).map_err(Unreachable::Refused)?;
        }
    }
    let socket = connect_nonblocking(&settings.agent_socket).map_err(Unreachable::Unavailable)?;
    // The listener's credentials, recorded by the kernel at listen(): a socket file of a trusted
    // user may still be served by someone else's process (bound by them, then handed over).
    let uid = peer_uid(&socket).map_err(Unreachable::Unavailable)?;
    if trusted.contains(uid) {
        return Ok(socket);
    }
    Err(Unreachable::Refused(format!(
        "MPIB_AGENT_SOCKET {}: the agent serving it runs as uid {uid}{}; expected {}",
        settings.agent_socket,
        crate::trust::user_name(uid).map_or_else(String::new, |n| format!(" ({n})")),
        trusted.describe()
    )))
}

/// The path to check for `path`: itself, or, while it is missing, its directory (so that a file
/// created there later by someone else cannot pass unchecked); `None` when neither exists.
fn existing_or_parent(path: &Path) -> Option<&Path> {
    if !is_missing(path) {
        return Some(path);
    }
    path.parent()
        .filter(|dir| !dir.as_os_str().is_empty() && !is_missing(dir))
}

/// Re-checks the hint file right before it is mapped (`HintReader::open`): false, with the WARN of
/// a connection without a slot, when it is no longer trusted.
pub(crate) fn hint_file_trusted(settings: &Settings) -> bool {
    let trusted = Trusted::new(&settings.trusted_uids);
    let Some(path) = existing_or_parent(Path::new(&settings.hint_path)) else {
        return true;
    };
    match check_shared_path(path, "MPIB_HINT_PATH", &trusted) {
        Ok(()) => true,
        Err(why) => {
            report_without_slot(format_args!(
                "MPIB_MODE=1 but advanced mode is refused for this path: {why}; the connection \
                 goes 100% SOUT"
            ));
            false
        }
    }
}

/// The effective uid of the process that listens at the other end (`SO_PEERCRED`).
fn peer_uid(socket: &Socket) -> std::io::Result<u32> {
    use std::os::fd::AsRawFd;
    let mut credentials = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: a valid socket descriptor, and `credentials`/`len` describe a writable ucred.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            std::ptr::addr_of_mut!(credentials).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(credentials.uid)
}

/// A non-blocking Unix stream socket connected to `path`. A Unix socket connects at once or not
/// at all (EAGAIN when the listener's backlog is full: treated as no agent).
fn connect_nonblocking(path: &str) -> std::io::Result<Socket> {
    let socket = Socket::new(Domain::UNIX, Type::STREAM.cloexec(), None)?;
    socket.set_nonblocking(true)?;
    socket.connect(&SockAddr::unix(path)?)?;
    Ok(socket)
}

/// `recv` into an initialised buffer.
fn read_some(socket: &Socket, buffer: &mut [u8]) -> std::io::Result<usize> {
    use std::io::Read;
    let mut reader: &Socket = socket;
    reader.read(buffer)
}

/// The IPv4 address the agent knows a rail by: the device's address when it is IPv4 (or
/// IPv4-mapped), 0.0.0.0 otherwise (InfiniBand, IPv6): the agent identifies SUP flows by IPv4
/// pairs.
pub(crate) fn ipv4_of(address: IpAddr) -> Ipv4Addr {
    match address {
        IpAddr::V4(v4) => v4,
        IpAddr::V6(v6) => v6.to_ipv4_mapped().unwrap_or(Ipv4Addr::UNSPECIFIED),
    }
}

/// The SOUT pair a connection's flow is keyed by: its SOUT NIC's address and the peer's, so that
/// every fused device is its own flow (its own hint slot) even though all of a host's devices
/// share one control address. Where a NIC has no IPv4 address (native InfiniBand reports `::`),
/// the control connection's pair, as before devices were lists.
pub(crate) fn sout_pair(
    local_nic: IpAddr,
    peer_nic: IpAddr,
    control: (Ipv4Addr, Ipv4Addr),
) -> (Ipv4Addr, Ipv4Addr) {
    match (ipv4_of(local_nic), ipv4_of(peer_nic)) {
        (local, peer) if !local.is_unspecified() && !peer.is_unspecified() => (local, peer),
        _ => control,
    }
}

/// A rail's address as the handshake carries it (`RailEndpoint::address`, IPv6 with IPv4
/// addresses IPv4-mapped).
pub(crate) fn address_of_wire(bytes: [u8; 16]) -> IpAddr {
    Ipv6Addr::from(bytes).to_canonical()
}
