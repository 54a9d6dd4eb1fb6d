//! One queue pair's protocol, run by its rail's fabric thread: the hello, requests out
//! (WRITE, WRITE_WITH_IMM, READ), requests in (checked against the registry, then landed), and
//! the acknowledgements that complete the sender's WRs.
//!
//! RC semantics kept (src/fabric/mod.rs): order within a QP (one TCP stream carries every
//! request in post order, and the responder executes them in that order); a signaled WR
//! completes only once the responder has executed it and every request before it (cumulative
//! acknowledgements, so a READ's completion also means every earlier write has landed, which is
//! what the flush relies on); one SRQ receive per WRITE_WITH_IMM, consumed after its data, and
//! an empty SRQ holds the QP's incoming stream (RNR retried forever, as `rnr_retry = 7`); an
//! error completes the failing WR with its status, flushes the rest, and leaves the QP in the
//! error state (later posts fail).

use std::collections::VecDeque;
use std::net::SocketAddrV4;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use super::memory::RemoteRight;
use super::shared::Shared;
use super::socket;
use crate::fabric::landing::{store_ordered, POLLED_WRITE_MAX};
use crate::fabric::{Completion, CompletionOpcode, CompletionStatus, SendOpcode, Sge, WorkRequest};
use crate::proto::tcp_wire::{seq_at_or_before, Header, Hello, Kind, HEADER_LEN, HELLO_LEN};

mod completion;
mod incoming;

use self::completion::status_of;

/// Payloads that may reach memory the engine polls are staged and then landed in order
/// (src/fabric/landing.rs); larger ones are received straight into the region.
const STAGE_MAX: usize = POLLED_WRITE_MAX;
/// How often a QP whose incoming stream waits for an SRQ receive tells the peer it is alive.
const KEEPALIVE: Duration = Duration::from_secs(1);
/// Bytes one QP may move per pass before the thread serves the others.
const PASS_BUDGET: usize = 8 << 20;

/// A request sent and not yet answered.
#[derive(Clone, Copy, Debug)]
struct InFlight {
    wr_id: u64,
    seq: u32,
    opcode: SendOpcode,
    signaled: bool,
    sge: Option<Sge>,
}

/// The message being written.
#[derive(Clone, Copy, Debug)]
struct Outgoing {
    header: [u8; HEADER_LEN],
    payload_addr: u64,
    payload_len: usize,
    sent: usize,
    request: Option<InFlight>,
    /// A NAK: once written, this side's QP is in error.
    fatal: bool,
}

/// The message being read.
#[derive(Clone, Copy, Debug)]
struct Incoming {
    header: Header,
    placed: usize,
}

/// How far a payload got in one read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Placement {
    /// Every byte is in.
    Done,
    /// Some bytes came; more may be waiting.
    Partial,
    /// The socket has nothing more now.
    Drained,
}

/// A control message waiting to be written between requests.
#[derive(Clone, Copy, Debug)]
enum Control {
    Ack(u32),
    Nak(u32, CompletionStatus),
    ReadResponse { seq: u32, addr: u64, length: u32 },
}

/// The peer a QP was connected to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct PeerAddress {
    pub address: SocketAddrV4,
    pub qpn: u32,
}

/// One QP as its fabric thread drives it.
pub(super) struct Worker {
    qpn: u32,
    cq: u64,
    srq: Option<u64>,
    /// The connection's secret: the hello of this QP's TCP connection carries it.
    secret: u64,
    socket: Option<OwnedFd>,
    /// The hello the passive side got, kept until `connect` names the peer to check it against.
    hello: Option<Hello>,
    peer: Option<PeerAddress>,
    /// The active side's connect has not finished.
    connecting: bool,
    loopback: bool,
    hello_out: [u8; HELLO_LEN],
    hello_sent: usize,
    queue: VecDeque<WorkRequest>,
    sending: Option<Outgoing>,
    awaiting: VecDeque<InFlight>,
    next_seq: u32,
    /// The sequence number the peer's next request must carry.
    expected_request: u32,
    control: VecDeque<Control>,
    in_header: [u8; HEADER_LEN],
    in_got: usize,
    incoming: Option<Incoming>,
    staging: Box<[u8]>,
    waiting_receive: bool,
    /// This side refused a request: nothing more is read.
    refused: bool,
    /// The newest request executed and not yet acknowledged (one cumulative ACK per pass).
    executed: Option<u32>,
    /// The newest request acknowledged, and when an acknowledgement last went out: a QP whose
    /// incoming stream waits for an SRQ receive repeats it, so the peer knows it is alive
    /// (RC's RNR NAKs, retried forever).
    acknowledged: u32,
    last_acknowledgement: Instant,
    /// How long the peer may leave our requests unanswered: RC's retry budget.
    answer_timeout: Duration,
    /// Since when our oldest request has waited for the peer without a word from it.
    waiting_since: Option<Instant>,
    failed: bool,
}

impl Worker {
    /// A QP not yet connected.
    pub(super) fn new(
        qpn: u32,
        cq: u64,
        srq: Option<u64>,
        max_send_wr: u32,
        secret: u64,
    ) -> Worker {
        let depth = max_send_wr as usize;
        Worker {
            qpn,
            cq,
            srq,
            secret,
            socket: None,
            hello: None,
            peer: None,
            connecting: false,
            loopback: false,
            hello_out: [0; HELLO_LEN],
            hello_sent: HELLO_LEN,
            queue: VecDeque::with_capacity(depth),
            sending: None,
            awaiting: VecDeque::with_capacity(depth),
            next_seq: 1,
            expected_request: 1,
            control: VecDeque::with_capacity(depth),
            in_header: [0; HEADER_LEN],
            in_got: 0,
            incoming: None,
            staging: vec![0u8; STAGE_MAX].into_boxed_slice(),
            waiting_receive: false,
            refused: false,
            executed: None,
            acknowledged: 0,
            last_acknowledgement: Instant::now(),
            answer_timeout: Duration::from_secs(35),
            waiting_since: None,
            failed: false,
        }
    }

    /// The socket, for the epoll set.
    pub(super) fn socket_fd(&self) -> Option<i32> {
        self.socket.as_ref().map(AsRawFd::as_raw_fd)
    }

    /// Whether a passive socket may still be attached.
    pub(super) fn wants_socket(&self) -> bool {
        self.socket.is_none() && !self.loopback && !self.failed
    }

    /// `QueuePair::fail` (a failover): what is queued is flushed and the connection closed, so
    /// that nothing more lands or leaves and the peer's QP fails as one whose packets go
    /// unanswered would.
    pub(super) fn fail_on_request(&mut self, shared: &Shared) {
        let why = format!("QP {} moved to the error state by a failover", self.qpn);
        self.fail(shared, CompletionStatus::Flushed, why);
        self.socket = None;
    }

    /// `connect` named the peer. `socket` is this side's connection when it is the active one.
    /// `Err` when the passive connection taken before is not from that peer: it is dropped,
    /// and the QP waits for its peer's (where it came from and why, for the thread's throttled
    /// WARN).
    pub(super) fn connect(
        &mut self,
        shared: &Shared,
        peer: PeerAddress,
        socket: Option<OwnedFd>,
        user_timeout_ms: u32,
    ) -> Result<(), (std::net::Ipv4Addr, String)> {
        self.peer = Some(peer);
        self.answer_timeout = Duration::from_millis(u64::from(user_timeout_ms));
        self.loopback = peer.qpn == self.qpn && peer.address.port() == shared.port;
        if let Some(socket) = socket {
            self.socket = Some(socket);
            self.connecting = true;
            self.hello_out = Hello {
                target_qpn: peer.qpn,
                source_qpn: self.qpn,
                source_addr: shared.address.octets(),
                source_port: shared.port,
                secret: self.secret,
            }
            .encode();
            self.hello_sent = 0;
        } else if let (Some(fd), Some(hello)) = (self.socket_fd(), self.hello) {
            socket::set_user_timeout(fd, user_timeout_ms);
            if let Err(why) = self.is_from_peer(&hello) {
                self.socket = None;
                self.hello = None;
                return Err((hello.source_addr.into(), why));
            }
        }
        Ok(())
    }

    /// Whether a passive connection whose `hello` came from `sender` (the address the kernel saw)
    /// may be this QP's: it must be waiting for one, the hello must carry the connection's
    /// secret and name the address it really came from, and, once `connect` named the peer, be
    /// that peer. `Err` says why not; the QP is left as it was (a stranger cannot fail it).
    pub(super) fn admits(&self, hello: &Hello, sender: std::net::Ipv4Addr) -> Result<(), String> {
        if !self.wants_socket() {
            return Err(format!("QP {} already has its connection", self.qpn));
        }
        if hello.secret != self.secret {
            return Err(format!(
                "it names QP {} without its connection's secret",
                self.qpn
            ));
        }
        let claimed = std::net::Ipv4Addr::from(hello.source_addr);
        if claimed != sender {
            return Err(format!("it says it comes from {claimed}"));
        }
        self.is_from_peer(hello)
    }

    /// Whether `hello` is from the peer `connect` named (anything, before `connect`).
    fn is_from_peer(&self, hello: &Hello) -> Result<(), String> {
        let Some(peer) = self.peer else {
            return Ok(());
        };
        let from = SocketAddrV4::new(hello.source_addr.into(), hello.source_port);
        if from != peer.address || hello.source_qpn != peer.qpn {
            return Err(format!(
                "it claims QP {} from {from} QP {}, whose peer is {} QP {}",
                self.qpn, hello.source_qpn, peer.address, peer.qpn
            ));
        }
        Ok(())
    }

    /// The passive side's connection arrived with `hello`, which [`Worker::admits`] took. Its
    /// user timeout is the QP's once `connect` gave it, RC's default budget until then.
    pub(super) fn attach(&mut self, socket: OwnedFd, hello: Hello) {
        let timeout = match self.peer {
            Some(_) => self.answer_timeout.as_millis().min(u128::from(u32::MAX)) as u32,
            None => super::device::user_timeout_ms(&crate::fabric::QpSettings::default()),
        };
        socket::set_user_timeout(socket.as_raw_fd(), timeout);
        self.socket = Some(socket);
        self.hello = Some(hello);
    }

    /// Takes WRs posted since the last pass.
    pub(super) fn take(&mut self, posted: &mut VecDeque<WorkRequest>) {
        self.queue.extend(posted.drain(..));
    }

    /// One pass: write what can be written, read what has arrived. `true` when the QP stopped
    /// with work left (its budget ran out) rather than on a socket that has nothing to give.
    pub(super) fn progress(&mut self, shared: &Shared) -> bool {
        if self.failed || self.peer.is_none() {
            return false;
        }
        if self.loopback {
            self.execute_locally(shared);
            return false;
        }
        let Some(fd) = self.socket_fd() else {
            self.unconnected_too_long(shared);
            return false;
        };
        if self.connecting {
            match socket::connect_finished(fd) {
                Ok(false) => return false,
                Ok(true) => self.connecting = false,
                Err(e) => {
                    let peer = self.peer.map(|p| p.address.to_string()).unwrap_or_default();
                    let why = format!("connecting QP {} to {peer}: {e}", self.qpn);
                    self.fail(shared, CompletionStatus::RetryExceeded, why);
                    return false;
                }
            }
        }
        let mut budget = PASS_BUDGET;
        let sent = self.send_some(shared, fd, &mut budget);
        if self.failed {
            return false;
        }
        let received = self.receive_some(shared, fd, &mut budget);
        // Acknowledge what this pass executed, and send it (and any read response) now: a peer
        // whose WRs wait for our answer must not wait for our next wake-up.
        if let Some(seq) = self.executed.take() {
            self.acknowledge(seq);
        } else if self.waiting_receive && self.last_acknowledgement.elapsed() >= KEEPALIVE {
            self.acknowledge(self.acknowledged);
        }
        if self.unanswered_too_long() {
            let why = format!(
                "QP {}: the peer answered none of our requests for {} ms (its link or host is down, or its answers were lost)",
                self.qpn,
                self.answer_timeout.as_millis()
            );
            self.fail(shared, CompletionStatus::RetryExceeded, why);
            return false;
        }
        let answered =
            !self.control.is_empty() && !self.failed && self.send_some(shared, fd, &mut budget);
        (sent || received || answered) && !self.failed
    }

    fn acknowledge(&mut self, seq: u32) {
        self.control.push_back(Control::Ack(seq));
        self.acknowledged = seq;
        self.last_acknowledgement = Instant::now();
    }

    /// Whether requests have waited for an answer longer than RC's retry budget. TCP's own user
    /// timeout covers bytes the peer's kernel never acknowledged; this covers a peer whose kernel
    /// took the bytes but whose answer never came back (a link cut in one direction after the
    /// data passed).
    fn unanswered_too_long(&mut self) -> bool {
        if self.awaiting.is_empty() {
            self.waiting_since = None;
            return false;
        }
        let since = *self.waiting_since.get_or_insert_with(Instant::now);
        since.elapsed() > self.answer_timeout
    }

    /// A passive QP whose peer's connection never came (lost on the way, or the peer gone before
    /// its connect) while requests wait to go: as on RC, whose unanswered request fails once
    /// the retry budget is spent, the oldest fails then, naming why, rather than waiting forever.
    fn unconnected_too_long(&mut self, shared: &Shared) {
        if self.queue.is_empty() {
            self.waiting_since = None;
            return;
        }
        let since = *self.waiting_since.get_or_insert_with(Instant::now);
        if since.elapsed() > self.answer_timeout {
            let why = format!(
                "QP {}: its peer's connection never arrived while requests waited {} ms",
                self.qpn,
                self.answer_timeout.as_millis()
            );
            self.fail(shared, CompletionStatus::RetryExceeded, why);
        }
    }

    /// The QP is being destroyed: send the acknowledgement of what was executed (a peer's last
    /// WRs complete as on hardware, whose NIC acknowledges before the receiver sees the CQE).
    pub(super) fn farewell(&mut self, shared: &Shared) {
        if self.failed || self.loopback {
            return;
        }
        if let Some(seq) = self.executed.take() {
            self.control.push_back(Control::Ack(seq));
        }
        if let Some(fd) = self.socket_fd() {
            if !self.connecting && !self.control.is_empty() {
                let mut budget = PASS_BUDGET;
                self.send_some(shared, fd, &mut budget);
            }
        }
    }

    /// Writes messages until the socket is full, the budget is spent or nothing is left;
    /// `true` when the budget ran out.
    fn send_some(&mut self, shared: &Shared, fd: i32, budget: &mut usize) -> bool {
        while self.hello_sent < HELLO_LEN {
            match socket::send(fd, &self.hello_out[self.hello_sent..], 0, 0) {
                Ok(0) => return false,
                Ok(n) => self.hello_sent += n,
                Err(e) => return self.socket_failed(shared, "sending the hello", e),
            }
        }
        loop {
            if *budget == 0 {
                return true;
            }
            if self.sending.is_none() && !self.next_message(shared) {
                return false;
            }
            let Some(out) = self.sending.as_mut() else {
                return false;
            };
            let header_left = HEADER_LEN.saturating_sub(out.sent);
            let header = &out.header[HEADER_LEN - header_left..];
            let payload_done = out.sent.saturating_sub(HEADER_LEN);
            let payload_addr = out.payload_addr + payload_done as u64;
            let payload_left = (out.payload_len - payload_done).min(*budget);
            match socket::send(fd, header, payload_addr, payload_left) {
                Ok(0) => return false,
                Ok(n) => {
                    out.sent += n;
                    *budget = budget.saturating_sub(n);
                    if out.sent == HEADER_LEN + out.payload_len {
                        let done = *out;
                        self.sending = None;
                        if let Some(request) = done.request {
                            self.awaiting.push_back(request);
                        }
                        if done.fatal {
                            let why = format!("QP {} refused a peer's request", self.qpn);
                            self.fail(shared, CompletionStatus::Flushed, why);
                            return false;
                        }
                    }
                }
                Err(e) if e.raw_os_error() == Some(libc::EFAULT) => {
                    let why = format!("QP {}: the local buffer is not readable: {e}", self.qpn);
                    self.fail(shared, CompletionStatus::LocalProtection, why);
                    return false;
                }
                Err(e) => return self.socket_failed(shared, "sending", e),
            }
        }
    }

    /// Starts the next message: a control message first, then the next posted WR.
    fn next_message(&mut self, shared: &Shared) -> bool {
        if let Some(control) = self.control.pop_front() {
            let (header, payload_addr, payload_len, fatal) = match control {
                Control::Ack(seq) => (Header::reply(Kind::Ack, seq, 0, 0), 0, 0, false),
                Control::Nak(seq, status) => {
                    let code = u8::try_from(status.code()).unwrap_or(u8::MAX);
                    (Header::reply(Kind::Nak, seq, 0, code), 0, 0, true)
                }
                Control::ReadResponse { seq, addr, length } => (
                    Header::reply(Kind::ReadResponse, seq, length, 0),
                    addr,
                    length as usize,
                    false,
                ),
            };
            self.sending = Some(Outgoing {
                header: header.encode(),
                payload_addr,
                payload_len,
                sent: 0,
                request: None,
                fatal,
            });
            return true;
        }
        let Some(wr) = self.queue.pop_front() else {
            return false;
        };
        let length = wr.length();
        if let Some(sge) = wr.sge {
            if !shared
                .registry()
                .local(sge.lkey, sge.addr, u64::from(sge.length))
            {
                self.queue.push_front(wr);
                let why = format!(
                    "QP {}: local range {:#x}+{} is not registered under lkey {:#x}",
                    self.qpn, sge.addr, sge.length, sge.lkey
                );
                self.fail(shared, CompletionStatus::LocalProtection, why);
                return false;
            }
        }
        let seq = self.next_seq;
        self.next_seq = self.next_seq.wrapping_add(1);
        let (kind, imm, payload_len) = match wr.opcode {
            SendOpcode::Write => (Kind::Write, 0, length),
            SendOpcode::WriteWithImm { imm } => (Kind::WriteWithImm, imm, length),
            SendOpcode::Read => (Kind::ReadRequest, 0, 0),
        };
        let header = Header {
            kind,
            flags: u8::from(wr.signaled || kind == Kind::ReadRequest),
            status: 0,
            length,
            seq,
            imm,
            rkey: wr.rkey,
            addr: wr.remote_addr,
        };
        self.sending = Some(Outgoing {
            header: header.encode(),
            payload_addr: wr.sge.map_or(0, |s| s.addr),
            payload_len: payload_len as usize,
            sent: 0,
            request: Some(InFlight {
                wr_id: wr.wr_id,
                seq,
                opcode: wr.opcode,
                signaled: wr.signaled,
                sge: wr.sge,
            }),
            fatal: false,
        });
        true
    }
}
