//! One control connection per pair of processes, direction and path, shared by every comm
//! between them.
//!
//! A comm watches its peer through a TCP connection (`peer.rs` says why). Kept per comm, that is
//! a descriptor per comm on each side: 8,000 comms, 8,000 descriptors (issue 22). Instead the
//! first handshake from one process to another over one address pair keeps its TCP connection as
//! a **link**, and later handshakes in that direction ride it and close their own (two processes
//! that both connect to each other hold two links; handshakes made at the same moment may make
//! one more each). Both ends must keep the same connection, so the connector proposes (`Ready`:
//! "the link I hold, or this handshake as a new one") and the acceptor answers (`LinkAnswer`)
//! with the one it keeps: the connector holds a share of the link it proposes until the answer,
//! so its end stays open; the acceptor answers with the new one when it has let go of the
//! proposed link. The acceptor's end takes the TCP user timeout of the first comm it accepted on
//! the link (the connector's key includes its own).
//!
//! What a per-comm connection said by closing is said on a link by a notice naming the comm
//! (each end told the other its name in the handshake): [`Kind::Failed`] with the error's text,
//! [`Kind::Closed`] when a comm is closed (also for a share whose handshake failed after its
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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use crate::net::data::request::now_ns;
use crate::proto::wire::Ready;

/// First bytes of every notice; then the kind, the comm's name, a length and that much UTF-8.
pub(crate) const NOTICE_MAGIC: &[u8; 8] = b"MPIBNTC1";
const NOTICE_HEADER: usize = NOTICE_MAGIC.len() + 1 + 8 + 2;
/// Longest notice text (a longer error is cut at a character boundary).
pub(crate) const NOTICE_TEXT_MAX: usize = 512;
/// Bytes a link keeps for a peer that reads slowly; a notice past this is dropped.
const OUTPUT_MAX: usize = 1 << 20;

/// What a notice says about the comm it names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// The peer's comm failed; the text says why.
    Failed = 1,
    /// The peer closed its comm.
    Closed = 2,
}

/// What this side has heard about one of its comms' peers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Heard {
    /// Nothing: the peer is there as far as the link knows.
    Nothing,
    /// The peer's comm failed, at `since` (ns), and said why.
    Failed { since: u64, text: String },
    /// The peer closed its comm at `since`.
    Closed { since: u64 },
    /// The link itself ended at `since` (the peer's process, or the path to it): `why`.
    LinkEnded { since: u64, why: String },
}

/// This process's number in handshakes: drawn once, so two processes (even with the same pid
/// on two hosts) tell their links apart.
pub(crate) fn process_id() -> u64 {
    static ID: OnceLock<u64> = OnceLock::new();
    *ID.get_or_init(|| {
        let mut bytes = [0u8; 8];
        // SAFETY: `bytes` is writable for its length.
        let got = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
        let drawn = u64::from_le_bytes(bytes);
        if got == 8 && drawn != 0 {
            return drawn;
        }
        // No entropy: the pid and the clock still differ between processes of one host.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        (u64::from(std::process::id()) << 32 ^ nanos) | 1
    })
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
    state: Mutex<LinkState>,
}

struct LinkState {
    stream: TcpStream,
    /// Comms of this side riding the link (and proposals awaiting an answer).
    comms: usize,
    input: Vec<u8>,
    output: Vec<u8>,
    ended: Option<(u64, String)>,
    heard: HashMap<u64, Heard>,
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
        Arc::new(Link {
            id,
            key,
            state: Mutex::new(LinkState {
                stream,
                comms: 0,
                input: Vec::new(),
                output: Vec::new(),
                ended: None,
                heard: HashMap::new(),
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
        state.queue(Kind::Failed, self.peer, text);
        state.pump(now_ns());
    }
}

impl Drop for Attachment {
    fn drop(&mut self) {
        {
            let mut registry = registry();
            let mut state = self.link.lock();
            state.heard.remove(&self.local);
            state.queue(Kind::Closed, self.peer, "");
            state.comms -= 1;
            if state.comms == 0 {
                // The last comm of this side: the link goes (the peer sees its end close).
                let ours = registry
                    .links
                    .get(&self.link.key)
                    .is_some_and(|held| Arc::ptr_eq(held, &self.link));
                if ours {
                    registry.links.remove(&self.link.key);
                }
            }
        }
        // The notice goes out, and what came in is read, outside the registry's lock: closing
        // thousands of comms must not hold up other threads' handshakes on system calls.
        self.link.lock().pump(now_ns());
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
        loop {
            match self.stream.read(&mut buffer) {
                Ok(0) => {
                    self.ended = Some((now_ns, "was closed".to_string()));
                    break;
                }
                Ok(n) => self.input.extend_from_slice(&buffer[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    self.ended = Some((now_ns, format!("failed ({e})")));
                    break;
                }
            }
        }
        self.file_notices(now_ns);
    }

    fn file_notices(&mut self, now_ns: u64) {
        let mut start = 0;
        while let Some(frame) = self.input.get(start..start + NOTICE_HEADER) {
            if &frame[..NOTICE_MAGIC.len()] != NOTICE_MAGIC {
                self.ended = Some((now_ns, "carried bytes that are not a notice".to_string()));
                self.input.clear();
                return;
            }
            let kind = frame[8];
            let comm = u64::from_le_bytes(frame[9..17].try_into().unwrap_or_default());
            let length = usize::from(u16::from_le_bytes([frame[17], frame[18]]));
            let Some(text) = self
                .input
                .get(start + NOTICE_HEADER..start + NOTICE_HEADER + length)
            else {
                break;
            };
            let heard = match kind {
                1 => Heard::Failed {
                    since: now_ns,
                    text: String::from_utf8_lossy(text).into_owned(),
                },
                2 => Heard::Closed { since: now_ns },
                other => {
                    // Both ends speak one handshake version: another kind is not a notice.
                    let why = format!("carried a notice of unknown kind {other}");
                    self.ended = Some((now_ns, why));
                    self.input.clear();
                    return;
                }
            };
            if let Some(slot) = self.heard.get_mut(&comm) {
                // A failure report is kept over a later close (it says why).
                if !matches!(slot, Heard::Failed { .. }) {
                    *slot = heard;
                }
            }
            start += NOTICE_HEADER + length;
        }
        self.input.drain(..start);
    }

    /// Adds a notice to the output (sent by the next [`LinkState::pump`]). A peer that has left
    /// [`OUTPUT_MAX`] unread gets its link shut down: its comms then hear the link end, where a
    /// dropped notice would have left them waiting.
    fn queue(&mut self, kind: Kind, comm: u64, text: &str) {
        let mut end = text.len().min(NOTICE_TEXT_MAX);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        if self.ended.is_some() {
            return;
        }
        if self.output.len() + NOTICE_HEADER + end > OUTPUT_MAX {
            let _ = self.stream.shutdown(std::net::Shutdown::Both);
            self.ended = Some((
                now_ns(),
                format!("was shut down: the peer left {OUTPUT_MAX} bytes of notices unread"),
            ));
            self.output.clear();
            return;
        }
        self.output.extend_from_slice(NOTICE_MAGIC);
        self.output.push(kind as u8);
        self.output.extend_from_slice(&comm.to_le_bytes());
        self.output.extend_from_slice(&(end as u16).to_le_bytes());
        self.output.extend_from_slice(&text.as_bytes()[..end]);
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

/// Proposes for a connection with `names`, over `path`.
pub(crate) fn propose(path: PathKey, names: Names, now_ns: u64) -> Proposal {
    let registry = registry();
    let existing = registry
        .links
        .get(&LinkKey::Outgoing(path))
        .and_then(|link| {
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

/// The connector heard the acceptor's answer `link`: the share of the proposed link, or the
/// handshake's `stream` as a new link (which later connections to `path` then propose).
pub(crate) fn settle(
    proposal: Proposal,
    link: u64,
    path: PathKey,
    stream: &TcpStream,
    names: Names,
) -> std::io::Result<Attachment> {
    if let Some(share) = proposal.existing {
        if share.link.id == link {
            return Ok(share);
        }
        // Not kept: its *closed* notice names a comm the acceptor holds on the new link only,
        // so the acceptor drops it.
    }
    let key = LinkKey::Outgoing(path);
    let created = Link::new(link, key, stream.try_clone()?, path.budget_ms);
    let mut registry = registry();
    registry.links.insert(key, Arc::clone(&created));
    let mut state = created.lock();
    Ok(Attachment::new(Arc::clone(&created), &mut state, names))
}

/// The acceptor's answer to `ready` from process `connector`: a share of the proposed link if
/// this side holds it, else the handshake's `stream` as the new link.
pub(crate) fn answer(
    connector: u64,
    ready: &Ready,
    stream: &TcpStream,
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
    let key = LinkKey::Incoming {
        connector,
        link: ready.fresh_link,
    };
    let created = Link::new(ready.fresh_link, key, stream.try_clone()?, budget_ms);
    registry.links.insert(key, Arc::clone(&created));
    let mut state = created.lock();
    Ok(Attachment::new(Arc::clone(&created), &mut state, names))
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
