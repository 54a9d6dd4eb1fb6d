//! One listening socket per fused device and address per process, shared by every listen comm
//! on it.
//!
//! NCCL makes every `listen` of a batch before any `connect` (`ncclTransportP2pSetup`,
//! docs/NCCL_NET_ABI.md "Connection setup"): with a socket per listen comm, 8,192 listens held
//! 8,192 descriptors before the first handshake, and a process ran out at the batch's accepts
//! (issue 32). Here a listen comm is a name on the device's one socket: its handle carries the
//! socket's address and a random 64-bit listen id, and the connector opens each handshake with a
//! claim naming that id ([`CLAIM_LEN`] bytes: [`CLAIM_MAGIC`] then the id). Whichever listen
//! comm's `accept` runs next takes every connection waiting on the socket, reads the claims that
//! have arrived and files each connection under the listen comm it names; then it takes its own
//! next one.
//!
//! What arrives is a stranger's until its claim checks out: a connection that closes, sends
//! anything but a claim, names a listen comm that does not exist (any more), or says nothing
//! for [`CLAIM_DEADLINE`] is dropped on its own, without failing the `accept` that found it or
//! the listen comm it named; at most [`UNCLAIMED_MAX`] are taken in before their claims arrive
//! (the rest wait in the kernel's backlog), and the WARN about dropped ones is rate-limited with
//! a count. Running out of descriptors still fails the `accept`, naming the limit
//! (src/net/setup/descriptors.rs). The socket goes with the last listen comm that holds it.
//!
//! A process's first handshake towards another comes here (and a handshake started again after
//! its link ended, or from a handle that does not name its process); the later ones ride the
//! link that first one made (src/net/observe/link_ride.rs), and an `accept` takes them from
//! there ([`Incoming::Link`]), reading the links peers made to this process as often as the
//! socket.

use std::collections::{HashMap, VecDeque};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

use socket2::Socket;

use crate::error::Result;
use crate::log;
use crate::net::data::request::now_ns;
use crate::net::observe::link::{self, Ride};
use crate::net::setup::descriptors::socket_error;
use crate::net::setup::oob::{listen_on, Transfer};

/// First bytes of a handshake connection ("MPIBCLM1"), before the listen id.
pub(crate) const CLAIM_MAGIC: [u8; 8] = *b"MPIBCLM1";
/// Bytes of a claim: the magic, then the listen id (little-endian).
pub(crate) const CLAIM_LEN: usize = 16;
/// How long an accepted connection may take to send its claim (a connector sends it the moment
/// its TCP connection is up, at its next `connect` call).
pub(crate) const CLAIM_DEADLINE: Duration = Duration::from_secs(10);
/// Connections waiting for their claim at once, per socket; past it no more are accepted until
/// some are claimed or dropped (the others wait in the kernel's backlog), so that a flood of
/// strangers delays real handshakes by at most [`CLAIM_DEADLINE`] and never drops one.
pub(crate) const UNCLAIMED_MAX: usize = 256;
/// Connections filed under one listen comm and not yet taken by its `accept`; past it the
/// newest is dropped (its connector hears the socket close).
pub(crate) const FILED_MAX: usize = 1024;
/// The socket and the waiting claims are read at most once per this interval, whichever listen
/// comm's `accept` comes: a batch calls every one of thousands in turn.
const PUMP_INTERVAL: Duration = Duration::from_micros(20);
/// At most one WARN about dropped strangers per this interval, with the count since the last.
const WARN_INTERVAL: Duration = Duration::from_secs(10);

/// The claim a connector sends first on a handshake connection.
pub(crate) fn claim(listen_id: u64) -> [u8; CLAIM_LEN] {
    let mut bytes = [0u8; CLAIM_LEN];
    bytes[..8].copy_from_slice(&CLAIM_MAGIC);
    bytes[8..].copy_from_slice(&listen_id.to_le_bytes());
    bytes
}

/// The listen id a claim names, or why the bytes are no claim.
pub(crate) fn read_claim(bytes: &[u8; CLAIM_LEN]) -> std::result::Result<u64, String> {
    if bytes[..8] != CLAIM_MAGIC {
        return Err(format!("no MPIB claim (first bytes {:02x?})", &bytes[..8]));
    }
    let mut id = [0u8; 8];
    id.copy_from_slice(&bytes[8..]);
    Ok(u64::from_le_bytes(id))
}

/// Which of `waiting` have bytes (or their end, or an error) to read: one `poll` for all of
/// them, so that a pump reads only those (a batch keeps up to a hundred waiting for the claim
/// their connector sends at its next call). All, if `poll` itself fails.
fn readable(waiting: &VecDeque<Unclaimed>) -> Vec<bool> {
    let mut polled: Vec<libc::pollfd> = waiting
        .iter()
        .map(|one| libc::pollfd {
            fd: one.socket.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    if polled.is_empty() {
        return Vec::new();
    }
    // SAFETY: `polled` is a live array of its length; zero timeout (never waits).
    let ready = unsafe { libc::poll(polled.as_mut_ptr(), polled.len() as libc::nfds_t, 0) };
    if ready < 0 {
        return vec![true; polled.len()];
    }
    polled.iter().map(|p| p.revents != 0).collect()
}

/// Errors `accept(2)` reports for a connection that failed before it was taken, which its
/// manual says to treat like EAGAIN (retry): they say nothing about the listening socket.
fn connection_error(errno: i32) -> bool {
    [
        libc::ECONNABORTED,
        libc::EPROTO,
        libc::ENETDOWN,
        libc::ENOPROTOOPT,
        libc::EHOSTDOWN,
        libc::ENONET,
        libc::EHOSTUNREACH,
        libc::EOPNOTSUPP,
        libc::ENETUNREACH,
        libc::ECONNRESET,
    ]
    .contains(&errno)
}

/// A listen id nobody can guess (a stranger who could would reach a listen comm's accept).
pub(crate) fn fresh_listen_id() -> Result<u64> {
    crate::random::unguessable("listen id")
}

/// A handshake for a listen comm, as its `accept` takes it.
pub(crate) enum Incoming {
    /// On a connection of its own, claimed for the listen comm.
    Socket(Socket),
    /// On a link from the connector's process, with the request that opened it.
    Link(Ride, Vec<u8>),
}

/// An accepted connection whose claim is still arriving.
struct Unclaimed {
    socket: Socket,
    peer: SocketAddrV4,
    claim: Transfer<CLAIM_LEN>,
    since: Instant,
}

struct State {
    socket: Socket,
    /// Connections filed under each live listen comm, oldest first.
    filed: HashMap<u64, VecDeque<Socket>>,
    unclaimed: VecDeque<Unclaimed>,
    /// The WARN about dropped strangers.
    dropped: log::Throttle,
    /// When the socket and the waiting claims were last read.
    pumped: Option<Instant>,
}

/// One device's listening socket on one address, shared by its listen comms.
pub(crate) struct SharedListener {
    address: SocketAddrV4,
    state: Mutex<State>,
}

/// Listeners by (device index, address), held while a listen comm uses one.
type Registry = HashMap<(usize, Ipv4Addr), Weak<SharedListener>>;

fn registry() -> MutexGuard<'static, Registry> {
    static REGISTRY: OnceLock<Mutex<Registry>> = OnceLock::new();
    REGISTRY
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl SharedListener {
    /// Device `device`'s listener on `address`, made if no listen comm holds one, with
    /// `listen_id` registered on it.
    pub(crate) fn join(device: usize, address: Ipv4Addr, listen_id: u64) -> Result<Arc<Self>> {
        let mut registry = registry();
        let listener = match registry.get(&(device, address)).and_then(Weak::upgrade) {
            Some(listener) => listener,
            None => {
                let (socket, bound) = listen_on(address)?;
                let listener = Arc::new(SharedListener {
                    address: bound,
                    state: Mutex::new(State {
                        socket,
                        filed: HashMap::new(),
                        unclaimed: VecDeque::new(),
                        dropped: log::Throttle::new(WARN_INTERVAL),
                        pumped: None,
                    }),
                });
                registry.retain(|_, weak| weak.strong_count() > 0);
                registry.insert((device, address), Arc::downgrade(&listener));
                listener
            }
        };
        drop(registry);
        listener.state().filed.insert(listen_id, VecDeque::new());
        Ok(listener)
    }

    /// Where the socket accepts (what listen handles carry).
    pub(crate) fn address(&self) -> SocketAddrV4 {
        self.address
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Each change to the state is whole under the lock: a panic leaves it consistent.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Forgets `listen_id` (its listen comm closed): what was filed under it is dropped, and a
    /// later claim naming it is a stranger's.
    pub(crate) fn leave(&self, listen_id: u64) {
        let filed = self.state().filed.remove(&listen_id);
        drop(filed);
    }

    /// The next handshake for `listen_id`, after taking in what waits on the socket and the
    /// links. Never waits; fails only when the socket itself does (EMFILE, ...), not for a
    /// stranger.
    pub(crate) fn next_for(&self, listen_id: u64) -> Result<Option<Incoming>> {
        if let Some((ride, request)) = link::take_open(listen_id) {
            return Ok(Some(Incoming::Link(ride, request)));
        }
        if let Some(socket) = self.next_for_at(listen_id, Instant::now())? {
            return Ok(Some(Incoming::Socket(socket)));
        }
        Ok(link::take_open(listen_id).map(|(ride, request)| Incoming::Link(ride, request)))
    }

    /// The next connection claimed for `listen_id` on the socket.
    fn next_for_at(&self, listen_id: u64, now: Instant) -> Result<Option<Socket>> {
        let mut state = self.state();
        let filed = |state: &mut State| state.filed.get_mut(&listen_id)?.pop_front();
        if let Some(socket) = filed(&mut state) {
            return Ok(Some(socket));
        }
        // In NCCL's batch every listen comm's `accept` is called in turn: the socket is read
        // at most once per PUMP_INTERVAL, not once per call (two system calls at least).
        let due = state.pumped.map_or(true, |last| {
            now.saturating_duration_since(last) >= PUMP_INTERVAL
        });
        if !due {
            return Ok(None);
        }
        state.pumped = Some(now);
        // Claims first: what is filed makes room for the connections still in the backlog.
        state.read_claims(now);
        state.accept_pending(self.address, now)?;
        state.read_claims(now);
        let socket = filed(&mut state);
        drop(state);
        // The links too, outside the socket's lock (a link's reader takes the opens' lock).
        link::pump_incoming(now_ns());
        Ok(socket)
    }

    /// Connections waiting for a claim (tests).
    #[cfg(test)]
    pub(crate) fn unclaimed(&self) -> usize {
        self.state().unclaimed.len()
    }
}

impl State {
    /// Takes the connections waiting on the socket, while fewer than [`UNCLAIMED_MAX`] wait for
    /// their claim.
    fn accept_pending(&mut self, address: SocketAddrV4, now: Instant) -> Result<()> {
        // Linux's accept(2) takes a descriptor before it looks for a connection: with none
        // left it fails even when nothing waits, and most handshakes ride links, not the
        // socket. So it is called only when a connection waits.
        let mut polled = libc::pollfd {
            fd: self.socket.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, zero timeout (never waits).
        if unsafe { libc::poll(&mut polled, 1, 0) } == 0 {
            return Ok(());
        }
        while self.unclaimed.len() < UNCLAIMED_MAX {
            let (socket, peer) = match self.socket.accept() {
                Ok(accepted) => accepted,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                // What accept(2) passes on of a connection that failed before it was taken (its
                // peer went, or the network): that connection's, not this listen's.
                Err(e) if e.raw_os_error().is_some_and(connection_error) => {
                    self.drop_stranger(&format!("accept on {address}: {e}"), now);
                    continue;
                }
                Err(e) => return Err(socket_error(&format!("accept on {address}"), &e)),
            };
            let Some(peer) = peer.as_socket_ipv4() else {
                self.drop_stranger("a connection with no IPv4 peer", now);
                continue;
            };
            if socket.set_nonblocking(true).is_err() {
                self.drop_stranger(&format!("{peer}: cannot make its socket non-blocking"), now);
                continue;
            }
            socket.set_nodelay(true).ok();
            self.unclaimed.push_back(Unclaimed {
                socket,
                peer,
                claim: Transfer::incoming(),
                since: now,
            });
        }
        Ok(())
    }

    /// Reads what has arrived of each waiting claim; files the complete ones, drops the bad and
    /// those past [`CLAIM_DEADLINE`].
    fn read_claims(&mut self, now: Instant) {
        let readable = readable(&self.unclaimed);
        let waiting = std::mem::take(&mut self.unclaimed);
        for (mut one, readable) in waiting.into_iter().zip(readable) {
            let received = if readable {
                let mut stream: std::net::TcpStream = one.socket.into();
                let received = one.claim.receive(&mut stream, &one.peer.to_string());
                one.socket = stream.into();
                received
            } else {
                Ok(false)
            };
            match received {
                Ok(true) => self.file(one, now),
                Ok(false) if now.saturating_duration_since(one.since) < CLAIM_DEADLINE => {
                    self.unclaimed.push_back(one);
                }
                Ok(false) => {
                    let why = format!("{}: no claim within {CLAIM_DEADLINE:?}", one.peer);
                    self.drop_stranger(&why, now);
                }
                Err(error) => self.drop_stranger(&format!("{}: {error}", one.peer), now),
            }
        }
    }

    fn file(&mut self, one: Unclaimed, now: Instant) {
        let id = match read_claim(one.claim.bytes()) {
            Ok(id) => id,
            Err(why) => return self.drop_stranger(&format!("{}: {why}", one.peer), now),
        };
        match self.filed.get_mut(&id) {
            Some(queue) if queue.len() < FILED_MAX => queue.push_back(one.socket),
            Some(_) => {
                let why = format!("{}: {FILED_MAX} connections wait for that listen", one.peer);
                self.drop_stranger(&why, now);
            }
            None => {
                let why = format!("{}: it names no open listen comm ({id:#x})", one.peer);
                self.drop_stranger(&why, now);
            }
        }
    }

    /// Counts a dropped connection and WARNs at most once per [`WARN_INTERVAL`].
    fn drop_stranger(&mut self, why: &str, now: Instant) {
        if let Some(count) = self.dropped.note(now) {
            warn!(
                log::NET | log::INIT,
                "listen: dropped a connection that is no MPIB handshake ({why}); {count} dropped since \
                 the last such warning; the listen comms go on"
            );
        }
    }
}

#[cfg(test)]
#[path = "listener_tests.rs"]
mod tests;
