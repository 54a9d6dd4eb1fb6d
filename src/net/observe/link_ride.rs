//! Handshakes carried on a link (issue 32): once two processes share a link, a connection from
//! its connector end to the other costs no TCP connection. The connector's `connect` rides the
//! link held to the acceptor's process (found by the process number the listen handle carries,
//! src/net/setup/oob.rs) with a [`Ride`]: its messages go out as handshake frames under an
//! identifier drawn here, the first one ([`Step::Open`]) naming the listen comm as a claim does
//! on a handshake's own connection (src/net/setup/listener.rs). At the acceptor end, whichever
//! thread reads the link files the open under the listen comm it names ([`ListenOpens`]), where
//! that listen comm's `accept` takes it ([`take_open`]) as a [`Ride`] of its own; the replies go
//! back on the same link. Both ends hold a share of the link while the handshake runs, so it
//! cannot close under it; a ride dropped before its handshake finished tells the other end
//! ([`Step::Abandoned`]), so neither waits for a side that gave up.
//!
//! Everything a peer can fill is bounded: the frames and the handshakes open on one link by
//! `mpib_proto::link_frame`, the opens waiting for one listen comm by [`OPENS_PER_LISTEN_MAX`];
//! an open past them, or naming no open listen comm, is answered with [`Step::Abandoned`] and
//! fails that `connect` alone, never the listen comm or the link.
//!
//! Locks, always in this order: the link registry, a link, the opens. Nothing holding the opens
//! takes a link (a ride is dropped only after the opens' lock is let go).

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddrV4;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use super::{fresh_name, registry, release, Link, LinkKey, LinkState, PathKey};
use crate::proto::link_frame::{self, Step};

/// Opens filed under one listen comm and not yet taken by its `accept`, as for connections on
/// the listening socket (`FILED_MAX` in src/net/setup/listener.rs); past it an open is refused.
pub(crate) const OPENS_PER_LISTEN_MAX: usize = 1024;

/// What a ride can meet instead of the next message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum RideError {
    /// The link ended (the peer's process, or the path): why.
    LinkEnded(String),
    /// The other end gave the handshake up: why.
    Abandoned(String),
}

impl std::fmt::Display for RideError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RideError::LinkEnded(why) => write!(f, "the control link to the peer {why}"),
            RideError::Abandoned(why) => write!(f, "the peer gave the handshake up: {why}"),
        }
    }
}

/// One handshake on a link, from either end; holds a share of the link while it runs.
pub(crate) struct Ride {
    link: Arc<Link>,
    handshake: u64,
    /// The listen comm the connector's first message opens.
    listen: u64,
    /// This is the connector end, and whether its open went out.
    connector: bool,
    opened: bool,
    /// The link's address pair, (this end's, the peer's), read when the ride began: a link
    /// reset since no longer says.
    addresses: (SocketAddrV4, SocketAddrV4),
    /// What the other end hears if the ride is dropped unfinished.
    reason: String,
    finished: bool,
}

impl Ride {
    /// A ride to listen comm `listen` on the link held to `path`, if one is up (and has room
    /// for one more handshake).
    pub(crate) fn start(path: PathKey, listen: u64, now_ns: u64) -> Option<Ride> {
        let registry = registry();
        let link = registry.links.get(&LinkKey::Outgoing(path))?;
        let addresses = link.addresses?;
        let mut state = link.lock();
        state.pump(now_ns);
        let handshake = fresh_name();
        if state.ended.is_some() || !state.inbox.expect(handshake) {
            return None;
        }
        state.comms += 1;
        Some(Ride {
            link: Arc::clone(link),
            handshake,
            listen,
            connector: true,
            opened: false,
            addresses,
            reason: "its connect was dropped before it completed".to_string(),
            finished: false,
        })
    }

    pub(crate) fn link(&self) -> &Arc<Link> {
        &self.link
    }

    /// The link's address pair: (this end's, the peer's).
    pub(crate) fn addresses(&self) -> (SocketAddrV4, SocketAddrV4) {
        self.addresses
    }

    /// Sends the handshake's next message (whole; never waits).
    pub(crate) fn send(&mut self, message: &[u8], now_ns: u64) -> Result<(), RideError> {
        let (step, listen) = match (self.connector, self.opened) {
            (true, false) => (Step::Open, self.listen),
            (true, true) => (Step::ToAcceptor, 0),
            (false, _) => (Step::ToConnector, 0),
        };
        let mut state = self.link.lock();
        if let Some((_, why)) = &state.ended {
            return Err(RideError::LinkEnded(why.clone()));
        }
        state.queue_handshake(step, self.handshake, listen, message);
        self.opened = true;
        state.pump(now_ns);
        match &state.ended {
            Some((_, why)) => Err(RideError::LinkEnded(why.clone())),
            None => Ok(()),
        }
    }

    /// The other end's next message, once it came.
    pub(crate) fn receive(&mut self, now_ns: u64) -> Result<Option<Vec<u8>>, RideError> {
        let mut state = self.link.lock();
        state.pump(now_ns);
        match state.inbox.take(self.handshake) {
            Some(Ok(message)) => Ok(Some(message)),
            Some(Err(why)) => Err(RideError::Abandoned(why)),
            None => match &state.ended {
                Some((_, why)) => Err(RideError::LinkEnded(why.clone())),
                None => Ok(None),
            },
        }
    }

    /// Whether the link this ride is on has ended (tests).
    #[cfg(test)]
    pub(crate) fn link_ended(&self) -> bool {
        self.link.lock().ended.is_some()
    }

    /// What the other end hears if this ride is dropped before [`Ride::finish`].
    pub(crate) fn set_reason(&mut self, reason: &str) {
        self.reason = reason.to_string();
    }

    /// The handshake completed: dropping the ride now tells the other end nothing.
    pub(crate) fn finish(&mut self) {
        self.finished = true;
    }
}

impl Drop for Ride {
    fn drop(&mut self) {
        let (handshake, finished) = (self.handshake, self.finished);
        let reason = std::mem::take(&mut self.reason);
        release(&self.link, |state| {
            state.inbox.forget(handshake);
            if !finished {
                let reason = link_frame::abandon_reason(&reason);
                state.queue_handshake(Step::Abandoned, handshake, 0, reason);
            }
        });
    }
}

/// A connected stream's IPv4 address pair: (this end's, the peer's).
pub(crate) fn address_pair(stream: &std::net::TcpStream) -> Option<(SocketAddrV4, SocketAddrV4)> {
    let v4 = |address: std::io::Result<std::net::SocketAddr>| match address.ok()? {
        std::net::SocketAddr::V4(v4) => Some(v4),
        std::net::SocketAddr::V6(_) => None,
    };
    Some((v4(stream.local_addr())?, v4(stream.peer_addr())?))
}

/// An open a link carried, waiting for its listen comm's `accept`. Its link share and inbox
/// slot were taken when it was filed; [`Ride::adopt`] makes it a ride that gives them back.
struct Opened {
    link: Arc<Link>,
    handshake: u64,
    addresses: (SocketAddrV4, SocketAddrV4),
    request: Vec<u8>,
}

impl Ride {
    fn adopt(open: Opened, reason: &str) -> (Ride, Vec<u8>) {
        let ride = Ride {
            link: open.link,
            handshake: open.handshake,
            listen: 0,
            connector: false,
            opened: true,
            addresses: open.addresses,
            reason: reason.to_string(),
            finished: false,
        };
        (ride, open.request)
    }
}

/// Opens by listen comm; a listen comm is here while it is open.
fn opens() -> MutexGuard<'static, HashMap<u64, VecDeque<Opened>>> {
    static OPENS: OnceLock<Mutex<HashMap<u64, VecDeque<Opened>>>> = OnceLock::new();
    OPENS
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A listen comm's place for the handshakes links carry to it; dropping it (the listen comm
/// closed) refuses those still waiting.
pub(crate) struct ListenOpens {
    listen: u64,
}

impl ListenOpens {
    pub(crate) fn register(listen: u64) -> ListenOpens {
        opens().insert(listen, VecDeque::new());
        ListenOpens { listen }
    }
}

impl Drop for ListenOpens {
    fn drop(&mut self) {
        let waiting = opens().remove(&self.listen).unwrap_or_default();
        // Outside the opens' lock: a ride's drop takes its link's.
        for open in waiting {
            drop(Ride::adopt(open, "the listen comm it named was closed"));
        }
    }
}

/// The next handshake a link carried to listen comm `listen`: its ride and request.
pub(crate) fn take_open(listen: u64) -> Option<(Ride, Vec<u8>)> {
    let open = opens().get_mut(&listen)?.pop_front()?;
    Some(Ride::adopt(open, "its accept failed or was dropped"))
}

impl LinkState {
    /// Files a handshake the peer opened on this link under the listen comm it names, or
    /// refuses it (the peer's `connect` fails, naming why; nothing else does).
    pub(super) fn route_open(&mut self, handshake: u64, listen: u64, request: Vec<u8>) {
        // A link going, or gone, takes nothing in: its connector hears it end and starts again
        // on a connection of its own (src/net/setup/connect.rs).
        let going = self.closing || self.ended.is_some();
        let Some(link) = self.me.upgrade().filter(|_| !going) else {
            return;
        };
        let Some(addresses) = link.addresses else {
            return;
        };
        // The inbox let the open through, so it has the room and the identifier is new.
        if !self.inbox.expect(handshake) {
            let reason = "this link end cannot hold one more handshake";
            return self.queue_handshake(Step::Abandoned, handshake, 0, reason.as_bytes());
        }
        let refused = {
            let mut opens = opens();
            match opens.get_mut(&listen) {
                Some(queue) if queue.len() < OPENS_PER_LISTEN_MAX => {
                    queue.push_back(Opened {
                        link,
                        handshake,
                        addresses,
                        request,
                    });
                    None
                }
                Some(_) => Some(format!(
                    "{OPENS_PER_LISTEN_MAX} handshakes already wait for that listen comm"
                )),
                None => Some(format!("it names no open listen comm ({listen:#x})")),
            }
        };
        match refused {
            // Held until the ride that takes it is dropped (`Ride::adopt`).
            None => self.comms += 1,
            Some(reason) => {
                self.inbox.forget(handshake);
                let reason = link_frame::abandon_reason(&reason);
                self.queue_handshake(Step::Abandoned, handshake, 0, reason);
            }
        }
    }
}

/// Reads every link peers connected to this process that has input, so the handshakes they
/// carry reach their listen comms (a listening socket's `accept` calls it, as often as it
/// reads its socket): one `poll` for all, then only those with bytes.
pub(crate) fn pump_incoming(now_ns: u64) {
    let links: Vec<Arc<Link>> = registry()
        .links
        .iter()
        .filter(|(key, _)| matches!(key, LinkKey::Incoming { .. }))
        .map(|(_, link)| Arc::clone(link))
        .collect();
    let mut polled: Vec<libc::pollfd> = links
        .iter()
        .map(|link| libc::pollfd {
            fd: link.fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    if polled.is_empty() {
        return;
    }
    // SAFETY: `polled` is a live array of its length; zero timeout (never waits). The links are
    // held, so their descriptors are open.
    let ready = unsafe { libc::poll(polled.as_mut_ptr(), polled.len() as libc::nfds_t, 0) };
    for (link, polled) in links.iter().zip(&polled) {
        if ready < 0 || polled.revents != 0 {
            link.lock().pump(now_ns);
        }
    }
}

/// Opens filed for `listen` and not taken yet (tests).
#[cfg(test)]
pub(super) fn opens_waiting(listen: u64) -> usize {
    opens().get(&listen).map_or(0, VecDeque::len)
}
