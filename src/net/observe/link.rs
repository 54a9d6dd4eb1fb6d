//! One control connection per pair of processes, direction and path, shared by every comm
//! between them.
//!
//! A comm watches its peer through a TCP connection (`peer.rs` says why). Kept per comm, that is
//! a descriptor per comm on each side: 8,000 comms, 8,000 descriptors (issue 22). Instead the
//! first handshake from one process to another over one address pair keeps its TCP connection as
//! a **link**, and the comms of later handshakes in that direction share it (two processes that
//! both connect to each other hold two links; handshakes made on connections of their own at the
//! same moment may make one more each). Both ends must keep the same connection, so the connector proposes (`Ready`:
//! "the link I hold, or this handshake as a new one") and the acceptor answers (`LinkAnswer`)
//! with the one it keeps: the connector holds a share of the link it proposes until the answer,
//! so its end stays open; the acceptor answers with the new one when it has let go of the
//! proposed link. The acceptor's end takes the TCP user timeout of the first comm it accepted on
//! the link (the connector's key includes its own).
//!
//! Once a link is up, the handshakes of later connections in its direction ride it too, each
//! under an identifier the connector draws (`link_ride.rs`): a connection after the first to a
//! process costs no TCP connection at all. The frames, and what each end accepts of them, are
//! the sans-IO `mpib_proto::link_frame`.
//!
//! What a per-comm connection said by closing is said on a link by a notice naming the comm
//! (each end told the other its name in the handshake): [`NoticeKind::Failed`] with the error's text,
//! [`NoticeKind::Closed`] when a comm is closed (also for a share whose handshake failed after its
//! proposal went out: the peer drops notices for names it does not hold). A link is closed when
//! its last comm on this side is; a dead process's links close with it.
//!
//! Every comm that checks its peer reads the link (under its lock) and files each complete
//! notice under the comm it names, dropping notices for comms this side no longer has; the
//! housekeeping thread reads every link too ([`pump_all`]), so notices never pile up unread in a
//! process whose comms are all busy or idle (a full window would time the link out under its
//! user timeout). Writes never block: what the socket does not take now waits in the link's
//! output for the next read; a peer that leaves [`OUTPUT_MAX`] unread has its link shut down,
//! so its comms hear the link end rather than nothing.

use std::collections::HashMap;
use std::io::{ErrorKind, Read};
use std::net::{Ipv4Addr, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Duration;

use crate::net::data::request::now_ns;
use crate::proto::link_frame::{self, Decoded, End, Filed, Frame, Inbox, NoticeKind, Step};
use crate::proto::wire::Ready;

pub(crate) use ride::{address_pair, pump_incoming, take_open, ListenOpens, Ride, RideError};

#[path = "link_ride.rs"]
mod ride;

/// Bytes a link keeps for a peer that reads slowly; past this the link is shut down.
const OUTPUT_MAX: usize = 1 << 20;
/// Bytes one pump reads before it files them (the rest waits in the socket for the next).
const INPUT_PER_PUMP: usize = 64 << 10;

/// What this side has heard about one of its comms' peers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Heard {
    /// Nothing: the peer is there as far as the link knows.
    Nothing,
    /// The peer's comm failed, at `since` (ns), and said why.
    Failed { since: u64, text: String },
    /// The peer closed its comm at `since`.
    Closed { since: u64 },
    /// The link itself ended at `since` (the peer's process, or the path to it): `why`;
    /// `path_died` when its socket timed out or found no route (the path, not the process: a
    /// dead process's kernel closes or resets it).
    LinkEnded {
        since: u64,
        why: String,
        path_died: bool,
    },
}

/// This process's number in handshakes: drawn once, so two processes (even with the same pid
/// on two hosts) tell their links apart.
pub(crate) fn process_id() -> u64 {
    static ID: OnceLock<u64> = OnceLock::new();
    *ID.get_or_init(|| crate::random::draw().unwrap_or_else(|_| crate::random::clock_and_pid()))
}

/// A name never used before in this process (comm names and link identifiers; never 0).
pub(crate) fn fresh_name() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Where an outgoing link goes: a link is shared only by comms to the same process over the
/// same address pair with the same user timeout, so its death means the same for all of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct PathKey {
    pub peer_process: u64,
    pub local: Ipv4Addr,
    pub remote: Ipv4Addr,
    pub budget_ms: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum LinkKey {
    /// A link this process connected.
    Outgoing(PathKey),
    /// A link a peer connected: its process and the link's identifier.
    Incoming { connector: u64, link: u64 },
}

#[derive(Default)]
struct Registry {
    links: HashMap<LinkKey, Arc<Link>>,
}

fn registry() -> MutexGuard<'static, Registry> {
    static REGISTRY: OnceLock<Mutex<Registry>> = OnceLock::new();
    REGISTRY
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// One shared control connection.
pub(crate) struct Link {
    id: u64,
    key: LinkKey,
    /// The stream's descriptor (one `poll` finds which links have input: `link_ride.rs`).
    fd: RawFd,
    /// The stream's address pair, (this end's, the peer's), read once: every handshake the
    /// link carries runs over it (`link_ride.rs`).
    addresses: Option<(std::net::SocketAddrV4, std::net::SocketAddrV4)>,
    state: Mutex<LinkState>,
}

struct LinkState {
    stream: TcpStream,
    /// The link itself, for the handshakes its input opens (they hold it).
    me: Weak<Link>,
    /// Comms of this side riding the link, proposals awaiting an answer and handshakes on it.
    comms: usize,
    input: Vec<u8>,
    output: Vec<u8>,
    ended: Option<(u64, String)>,
    /// The link ended because its path died (see [`Heard::LinkEnded`]).
    path_died: bool,
    heard: HashMap<u64, Heard>,
    /// The handshakes on the link and the message each waits for.
    inbox: Inbox,
    /// This side's last share went: the link is out of the registry and shuts down after a
    /// last flush. A handshake it carries in now is not taken (its connector hears the end
    /// and starts it again on a connection of its own: src/net/setup/connect.rs).
    closing: bool,
}

impl Link {
    fn new(id: u64, key: LinkKey, stream: TcpStream, budget_ms: u32) -> Arc<Link> {
        let socket = socket2::SockRef::from(&stream);
        let keepalive = socket2::TcpKeepalive::new()
            .with_time(Duration::from_secs(1))
            .with_interval(Duration::from_secs(1));
        // Best effort: without them only a dead path goes unnoticed.
        let _ = socket.set_tcp_keepalive(&keepalive);
        let _ = socket
            .set_tcp_user_timeout(Some(Duration::from_millis(u64::from(budget_ms.max(1000)))));
        let end = match key {
            LinkKey::Outgoing(_) => End::Connector,
            LinkKey::Incoming { .. } => End::Acceptor,
        };
        Arc::new_cyclic(|me| Link {
            id,
            key,
            fd: stream.as_raw_fd(),
            addresses: address_pair(&stream),
            state: Mutex::new(LinkState {
                stream,
                me: me.clone(),
                comms: 0,
                input: Vec::new(),
                output: Vec::new(),
                ended: None,
                path_died: false,
                heard: HashMap::new(),
                inbox: Inbox::new(end),
                closing: false,
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, LinkState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A comm's share of a link: its name and its peer's, and what it hears. Dropping it tells the
/// peer the comm closed and closes the link with its last share.
pub(crate) struct Attachment {
    link: Arc<Link>,
    local: u64,
    peer: u64,
}

impl Attachment {
    fn new(link: Arc<Link>, state: &mut LinkState, names: Names) -> Attachment {
        state.comms += 1;
        state.heard.insert(names.local, Heard::Nothing);
        Attachment {
            link,
            local: names.local,
            peer: names.peer,
        }
    }

    /// The link's identifier.
    pub(crate) fn link_id(&self) -> u64 {
        self.link.id
    }

    /// Reads what the link has for this side and returns what was heard about this comm's peer.
    pub(crate) fn hear(&self, now_ns: u64) -> Heard {
        let mut state = self.link.lock();
        state.pump(now_ns);
        if let Some((since, why)) = &state.ended {
            // A notice that came first still says more than the end of the link.
            return match state.heard.get(&self.local) {
                Some(heard @ (Heard::Failed { .. } | Heard::Closed { .. })) => heard.clone(),
                _ => Heard::LinkEnded {
                    since: *since,
                    why: why.clone(),
                    path_died: state.path_died,
                },
            };
        }
        state
            .heard
            .get(&self.local)
            .cloned()
            .unwrap_or(Heard::Nothing)
    }

    /// Tells the peer this comm failed, with `text` (best effort, never blocking).
    pub(crate) fn tell_failed(&self, text: &str) {
        let mut state = self.link.lock();
        state.queue_notice(NoticeKind::Failed, self.peer, text);
        state.pump(now_ns());
    }
}

impl Drop for Attachment {
    fn drop(&mut self) {
        let (local, peer) = (self.local, self.peer);
        release(&self.link, |state| {
            state.heard.remove(&local);
            state.queue_notice(NoticeKind::Closed, peer, "");
        });
    }
}

/// Gives back one share of `link` after `last_words` (under its lock): with this side's last
/// share the link leaves the registry and shuts down (the peer sees its end close).
fn release(link: &Arc<Link>, last_words: impl FnOnce(&mut LinkState)) {
    {
        // The registry first, then the link: the order every path takes both in.
        let mut registry = registry();
        let mut state = link.lock();
        last_words(&mut state);
        state.comms = state.comms.saturating_sub(1);
        if state.comms == 0 {
            state.closing = true;
            let ours = registry
                .links
                .get(&link.key)
                .is_some_and(|held| Arc::ptr_eq(held, link));
            if ours {
                registry.links.remove(&link.key);
            }
        }
    }
    // What goes out goes, and what came in is read, outside the registry's lock: closing
    // thousands of comms must not hold up other threads' handshakes on system calls.
    let mut state = link.lock();
    state.pump(now_ns());
    if state.closing && state.ended.is_none() {
        state.end_with(now_ns(), "was closed by this side".to_string());
    }
}

impl LinkState {
    /// Sends what waits, reads what came and files each complete notice.
    fn pump(&mut self, now_ns: u64) {
        self.flush();
        if self.ended.is_some() {
            return;
        }
        let mut buffer = [0u8; 4096];
        // At most INPUT_PER_PUMP a pump, filed before more is read: a peer that keeps sending
        // neither grows the input nor holds the link's lock without end.
        while self.input.len() < INPUT_PER_PUMP {
            match self.stream.read(&mut buffer) {
                Ok(0) => {
                    self.ended = Some((now_ns, "was closed".to_string()));
                    break;
                }
                Ok(n) => self.input.extend_from_slice(&buffer[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    self.path_died = matches!(
                        e.raw_os_error(),
                        Some(libc::ETIMEDOUT | libc::EHOSTUNREACH | libc::ENETUNREACH)
                    );
                    self.ended = Some((now_ns, format!("failed ({e})")));
                    break;
                }
            }
        }
        self.file_frames(now_ns);
        // What filing queued (a refused handshake's answer) goes out now, not at the next read.
        self.flush();
    }

    /// Files every complete frame of the input: notices under the comm they name, handshake
    /// messages in the inbox, new handshakes with the listen comm they name (`link_ride.rs`).
    fn file_frames(&mut self, now_ns: u64) {
        let mut start = 0;
        loop {
            let (frame, used) = match link_frame::decode(&self.input[start..]) {
                Decoded::Frame(frame, used) => (frame, used),
                Decoded::Incomplete => break,
                Decoded::Invalid(what) => return self.end_with(now_ns, format!("carried {what}")),
            };
            let filed = match frame {
                Frame::Notice { kind, comm, text } => {
                    file_notice(&mut self.heard, now_ns, kind, comm, text);
                    None
                }
                Frame::Handshake {
                    step,
                    handshake,
                    listen,
                    payload,
                } => Some(self.inbox.file(step, handshake, listen, payload)),
            };
            start += used;
            match filed {
                None | Some(Filed::Kept | Filed::Ignored) => {}
                Some(Filed::Opened {
                    handshake,
                    listen,
                    request,
                }) => self.route_open(handshake, listen, request),
                Some(Filed::Refused { handshake, reason }) => {
                    self.queue_handshake(Step::Abandoned, handshake, 0, reason.as_bytes());
                }
                Some(Filed::Violation(why)) => return self.end_with(now_ns, why),
            }
        }
        self.input.drain(..start);
    }
}

/// Files a notice under the comm it names (dropped if this side holds no such comm).
fn file_notice(
    heard_by_comm: &mut HashMap<u64, Heard>,
    now_ns: u64,
    kind: NoticeKind,
    comm: u64,
    text: &[u8],
) {
    let heard = match kind {
        NoticeKind::Failed => Heard::Failed {
            since: now_ns,
            text: String::from_utf8_lossy(text).into_owned(),
        },
        NoticeKind::Closed => Heard::Closed { since: now_ns },
    };
    if let Some(slot) = heard_by_comm.get_mut(&comm) {
        // A failure report is kept over a later close (it says why).
        if !matches!(slot, Heard::Failed { .. }) {
            *slot = heard;
        }
    }
}

impl LinkState {
    /// The link carried something its peer never sends: it ends, and its comms hear why.
    fn end_with(&mut self, now_ns: u64, why: String) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
        self.ended = Some((now_ns, why));
        self.input.clear();
    }

    /// Adds a notice to the output (sent by the next [`LinkState::pump`]).
    fn queue_notice(&mut self, kind: NoticeKind, comm: u64, text: &str) {
        if self.has_room(link_frame::notice_len(text)) {
            link_frame::encode_notice(&mut self.output, kind, comm, text);
        }
    }

    /// Adds a handshake frame to the output (sent by the next [`LinkState::pump`]).
    fn queue_handshake(&mut self, step: Step, handshake: u64, listen: u64, payload: &[u8]) {
        let length = link_frame::HANDSHAKE_HEADER + payload.len();
        if self.has_room(length) {
            link_frame::encode_handshake(&mut self.output, step, handshake, listen, payload);
        }
    }

    /// Whether `length` more bytes fit the output. A peer that has left [`OUTPUT_MAX`] unread
    /// gets its link shut down: its comms then hear the link end, where a dropped notice would
    /// have left them waiting.
    fn has_room(&mut self, length: usize) -> bool {
        if self.ended.is_some() {
            return false;
        }
        if self.output.len() + length > OUTPUT_MAX {
            let why = format!("was shut down: the peer left {OUTPUT_MAX} bytes unread");
            self.end_with(now_ns(), why);
            self.output.clear();
            return false;
        }
        true
    }

    fn flush(&mut self) {
        while !self.output.is_empty() {
            // MSG_NOSIGNAL: a peer that is gone must not raise SIGPIPE in the host process
            // (NCCL's programs do not all ignore it).
            let socket = socket2::SockRef::from(&self.stream);
            match socket.send_with_flags(&self.output, libc::MSG_NOSIGNAL) {
                Ok(0) => return,
                Ok(n) => {
                    self.output.drain(..n);
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                // Would block, or the link died (the next read says so).
                Err(_) => return,
            }
        }
    }
}

/// A connection's names on its link: this side's and its peer's (exchanged in the handshake).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Names {
    pub local: u64,
    pub peer: u64,
}

/// The connector's proposal: a share of the link it holds to `path` (then the connection rides
/// it if the acceptor agrees), and a fresh identifier for this handshake's connection otherwise.
pub(crate) struct Proposal {
    pub existing: Option<Attachment>,
    pub fresh_link: u64,
}

/// Proposes for a connection with `names`, over `path`: the link its handshake rides
/// (`riding`), else the one held to `path`.
pub(crate) fn propose(path: PathKey, names: Names, riding: Option<&Ride>, now_ns: u64) -> Proposal {
    let registry = registry();
    let link = match riding {
        Some(ride) => Some(ride.link()),
        None => registry.links.get(&LinkKey::Outgoing(path)),
    };
    let existing = link.and_then(|link| {
        let mut state = link.lock();
        state.pump(now_ns);
        if state.ended.is_some() {
            return None;
        }
        Some(Attachment::new(Arc::clone(link), &mut state, names))
    });
    Proposal {
        existing,
        fresh_link: fresh_name(),
    }
}

/// Why a link could not be kept.
fn no_stream(what: &str) -> std::io::Error {
    std::io::Error::new(ErrorKind::NotConnected, what.to_string())
}

/// The connector heard the acceptor's answer `link`: the share of the proposed link, or the
/// handshake's own `stream` as a new link (which later connections to `path` then propose and
/// ride). A handshake that rode a link has no stream of its own: only its link can be kept.
pub(crate) fn settle(
    proposal: Proposal,
    link: u64,
    path: PathKey,
    stream: Option<&TcpStream>,
    names: Names,
) -> std::io::Result<Attachment> {
    if let Some(share) = proposal.existing {
        if share.link.id == link {
            return Ok(share);
        }
        // Not kept: its *closed* notice names a comm the acceptor holds on the new link only,
        // so the acceptor drops it.
    }
    let stream = stream.ok_or_else(|| {
        no_stream("the acceptor answered a new link for a handshake that rode the existing one")
    })?;
    let key = LinkKey::Outgoing(path);
    let created = Link::new(link, key, stream.try_clone()?, path.budget_ms);
    let mut registry = registry();
    registry.links.insert(key, Arc::clone(&created));
    let mut state = created.lock();
    Ok(Attachment::new(Arc::clone(&created), &mut state, names))
}

/// The acceptor's answer to `ready` from process `connector`: a share of the proposed link if
/// this side holds it, else the handshake's own `stream` as the new link (a handshake that rode
/// a link has none: its link is the one proposed, and this side holds it while the handshake
/// runs).
pub(crate) fn answer(
    connector: u64,
    ready: &Ready,
    stream: Option<&TcpStream>,
    budget_ms: u32,
    names: Names,
    now_ns: u64,
) -> std::io::Result<Attachment> {
    let mut registry = registry();
    if ready.existing_link != 0 {
        let key = LinkKey::Incoming {
            connector,
            link: ready.existing_link,
        };
        if let Some(link) = registry.links.get(&key) {
            let mut state = link.lock();
            state.pump(now_ns);
            if state.ended.is_none() {
                return Ok(Attachment::new(Arc::clone(link), &mut state, names));
            }
        }
    }
    let stream = stream.ok_or_else(|| {
        no_stream("the link this handshake rode is not the one the connector proposed, or ended")
    })?;
    let key = LinkKey::Incoming {
        connector,
        link: ready.fresh_link,
    };
    let created = Link::new(ready.fresh_link, key, stream.try_clone()?, budget_ms);
    registry.links.insert(key, Arc::clone(&created));
    let mut state = created.lock();
    Ok(Attachment::new(Arc::clone(&created), &mut state, names))
}

/// Whether this process holds a link it connected to process `peer_process` (over any path):
/// its handshakes there ride it (src/net/setup/admission.rs lets more run at once).
pub(crate) fn connected_to(peer_process: u64) -> bool {
    peer_process != 0
        && registry()
            .links
            .keys()
            .any(|key| matches!(key, LinkKey::Outgoing(path) if path.peer_process == peer_process))
}

/// Reads and flushes every link of the process (the housekeeping thread, every 100 ms): notices
/// are filed and sent however busy or idle the comms are. The links are taken into `scratch`
/// (the caller's, kept between calls, so a quiet tick allocates nothing: tests/hot_path_tcp.rs
/// counts every thread's allocations) and read outside the registry's lock.
pub(crate) fn pump_all(now_ns: u64, scratch: &mut Vec<Arc<Link>>) {
    scratch.clear();
    scratch.extend(registry().links.values().cloned());
    for link in scratch.iter() {
        link.lock().pump(now_ns);
    }
    scratch.clear();
}

#[cfg(test)]
#[path = "link_tests.rs"]
pub(crate) mod tests;

#[cfg(test)]
impl Attachment {
    /// Shuts the link's connection down under it, as a killed process's kernel does.
    pub(crate) fn shutdown_for_tests(&self) {
        let _ = self.link.lock().stream.shutdown(std::net::Shutdown::Both);
    }
}
