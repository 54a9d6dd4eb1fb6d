//! A TCP rail's fabric thread: what a NIC's engine is to a verbs rail. It accepts the peers'
//! QP connections, moves every QP's bytes and delivers completions, so transfers progress while
//! the engine is between calls (NCCL's proxy thread is then free to serve other comms).
//!
//! Why a thread per rail with epoll, and not progress inside `test`: the engine's calls must
//! not wait, while a TCP peer needs its bytes read before it can send more; a thread that sleeps
//! in `epoll_wait` keeps both sockets draining at wire speed, the same way the rig's NICs do,
//! and costs no syscall on the engine's side while it is busy (src/fabric/tcp/shared.rs).
//! The thread is stopped and joined at the last `finalize`, from the image's fini entry when the
//! plugin is unloaded without one (ABI v7 ... v10), or when the rail's last handle is dropped,
//! whichever comes first (src/net/setup/plugin.rs), so nothing runs after unload.

use std::collections::{HashMap, VecDeque};
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::link_state::LinkState;
use super::shared::{Notice, Shared};
use super::socket::{self, Accepted};
use super::unclaimed::{Outcome, Unclaimed};
use super::worker::{PeerAddress, Worker};
use crate::fabric::AsyncEvent;
use crate::log::Throttle;
use crate::proto::tcp_wire::Hello;

/// epoll token of the eventfd.
const TOKEN_WAKE: u64 = u64::MAX;
/// epoll token of the listener.
const TOKEN_LISTENER: u64 = u64::MAX - 1;
/// epoll token of the interface's link changes (src/fabric/tcp/link_state.rs).
const TOKEN_LINK: u64 = u64::MAX - 2;
/// Longest sleep with nothing to do (a safety net: every change also wakes the thread).
const IDLE_WAIT_MS: i32 = 200;
/// At most one WARN per this interval about connections to the rail's port that were dropped,
/// with their count (as the control listener's, src/net/setup/listener.rs).
const STRANGER_WARN_INTERVAL: Duration = Duration::from_secs(10);
/// After `accept` failed for want of descriptors, when to try again (the connection waits in
/// the backlog meanwhile; the listener raises no new edge for it).
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// The thread's own state.
struct Engine {
    shared: Arc<Shared>,
    epoll: OwnedFd,
    listener: OwnedFd,
    workers: HashMap<u32, Worker>,
    unclaimed: Unclaimed,
    /// The WARN about dropped connections to the rail's port.
    strangers: Throttle,
    /// When `accept` is to be tried again after it failed or the unclaimed connections had no
    /// place (`None`: when the listener is readable).
    accept_retry: Option<Instant>,
    /// Connections wait in the backlog for a place among the unclaimed ones.
    accept_waiting: bool,
    /// The WARN about `accept` failing (the rail's own trouble, not a stranger's).
    accept_failures: Throttle,
    notices: VecDeque<Notice>,
    posted: VecDeque<crate::fabric::WorkRequest>,
    /// The interface's link, the rail's port (`None`: it cannot be watched here).
    link: Option<LinkState>,
}

/// Runs the rail until [`Shared::request_stop`].
pub(super) fn run(shared: Arc<Shared>, listener: OwnedFd) {
    let mut engine = match Engine::new(shared, listener) {
        Ok(engine) => engine,
        Err(e) => {
            warn!(crate::log::NET, "tcp rail thread cannot start: {e}");
            return;
        }
    };
    engine.run();
}

impl Engine {
    fn new(shared: Arc<Shared>, listener: OwnedFd) -> std::io::Result<Engine> {
        // SAFETY: epoll_create1 has no memory preconditions; the descriptor is owned below.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor nothing else owns.
        let epoll = unsafe { OwnedFd::from_raw_fd(fd) };
        let engine = Engine {
            shared,
            epoll,
            listener,
            workers: HashMap::new(),
            unclaimed: Unclaimed::new(),
            strangers: Throttle::new(STRANGER_WARN_INTERVAL),
            accept_retry: None,
            accept_waiting: false,
            accept_failures: Throttle::new(STRANGER_WARN_INTERVAL),
            notices: VecDeque::new(),
            posted: VecDeque::new(),
            link: None,
        };
        watch_fd(&engine.epoll, engine.shared.wake_fd(), TOKEN_WAKE)?;
        watch_fd(&engine.epoll, engine.listener.as_raw_fd(), TOKEN_LISTENER)?;
        let mut engine = engine;
        match LinkState::open(&engine.shared.device) {
            Ok(link) => {
                watch_fd(&engine.epoll, link.fd(), TOKEN_LINK)?;
                engine.link = Some(link);
            }
            Err(e) => info!(
                crate::log::NET,
                "tcp {}: its link state is not watched ({e}): a failed link is found by the QPs' retries alone",
                engine.shared.device
            ),
        }
        Ok(engine)
    }

    fn run(&mut self) {
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; 64];
        let mut busy = true;
        loop {
            let timeout = if busy { 0 } else { self.prepare_to_sleep() };
            // SAFETY: `events` is a live array of the length given.
            let count = unsafe {
                libc::epoll_wait(
                    self.epoll.as_raw_fd(),
                    events.as_mut_ptr(),
                    events.len() as i32,
                    timeout,
                )
            };
            self.shared.set_sleeping(false);
            if self.shared.stopping() {
                return;
            }
            let now = Instant::now();
            let mut accept = self.accept_retry.is_some_and(|at| now >= at);
            for event in events.iter().take(usize::try_from(count).unwrap_or(0)) {
                // Copied out: epoll_event is packed.
                let token = event.u64;
                match token {
                    TOKEN_WAKE => self.shared.drain_wake(),
                    TOKEN_LISTENER => accept = true,
                    TOKEN_LINK => self.link_changed(),
                    _ if Unclaimed::owns(token) => self.unclaimed.mark_readable(token),
                    _ => {}
                }
            }
            // Notices first: a QP's hello may only be claimed once its creation is known.
            self.take_notices();
            if accept {
                self.accept_all(now);
            }
            if !self.unclaimed.is_empty() {
                self.claim(now);
                // Claims freed places: the connections a full table left in the backlog.
                if self.accept_waiting && self.unclaimed.has_room() {
                    self.accept_all(now);
                }
            }
            busy = false;
            for worker in self.workers.values_mut() {
                busy |= worker.progress(&self.shared);
            }
        }
    }

    /// The interface's link changed: a port event for the engine, as a NIC raises one.
    fn link_changed(&mut self) {
        let Some(event) = self.link.as_mut().and_then(LinkState::changed) else {
            return;
        };
        info!(
            crate::log::NET,
            "tcp {}: the link is {}",
            self.shared.device,
            if event == AsyncEvent::PortDown {
                "down"
            } else {
                "up"
            }
        );
        self.shared.raise(event);
    }

    /// Announces the sleep and returns its timeout: 0 when work arrived meanwhile; else until
    /// the nearest hello deadline or `accept` retry, at most [`IDLE_WAIT_MS`].
    fn prepare_to_sleep(&mut self) -> i32 {
        self.shared.set_sleeping(true);
        if !self.shared.state().notices.is_empty() {
            return 0;
        }
        let due = [self.unclaimed.next_deadline(), self.accept_retry];
        match due.into_iter().flatten().min() {
            None => IDLE_WAIT_MS,
            Some(at) => {
                let left = at.saturating_duration_since(Instant::now()).as_millis();
                // Rounded up: a wake a millisecond early would find nothing due and sleep 0.
                (left + 1).min(IDLE_WAIT_MS as u128) as i32
            }
        }
    }

    /// Applies what the engine asked for since the last pass.
    fn take_notices(&mut self) {
        std::mem::swap(&mut self.notices, &mut self.shared.state().notices);
        while let Some(notice) = self.notices.pop_front() {
            // The state lock is held only to read or change a QP's entry, never across a worker
            // call given `shared`: connecting or saying farewell can fail the QP, which takes the
            // lock itself (a stranger's hello claiming a passive QP before `connect` named its
            // peer hung the thread here when the lock was held: issue 34).
            match notice {
                Notice::Created(qpn) => {
                    let created = (self.shared.state().qps.get(&qpn))
                        .map(|qp| Worker::new(qpn, qp.cq, qp.srq, qp.max_send_wr, qp.secret));
                    if let Some(worker) = created {
                        self.workers.insert(qpn, worker);
                    }
                }
                Notice::Connected(qpn) => self.connect_worker(qpn),
                Notice::Posted(qpn) => {
                    let mut state = self.shared.state();
                    if let (Some(qp), Some(worker)) =
                        (state.qps.get_mut(&qpn), self.workers.get_mut(&qpn))
                    {
                        qp.posted_pending = false;
                        std::mem::swap(&mut self.posted, &mut qp.submitted);
                        worker.take(&mut self.posted);
                        std::mem::swap(&mut self.posted, &mut qp.submitted);
                    }
                }
                Notice::Destroyed(qpn) => {
                    if let Some(mut worker) = self.workers.remove(&qpn) {
                        worker.farewell(&self.shared);
                    }
                }
                Notice::Fail(qpn) => {
                    if let Some(worker) = self.workers.get_mut(&qpn) {
                        worker.fail_on_request(&self.shared);
                    }
                    if let Some(qp) = self.shared.state().qps.get_mut(&qpn) {
                        qp.quiesced = true;
                    }
                }
                Notice::Receives => {}
            }
        }
    }

    /// `connect` named QP `qpn`'s peer: its worker connects (or checks the hello that came
    /// first), outside the state lock.
    fn connect_worker(&mut self, qpn: u32) {
        if !self.workers.contains_key(&qpn) {
            return;
        }
        let peer = (self.shared.state().qps.get_mut(&qpn)).and_then(|qp| qp.peer.take());
        let (Some(peer), Some(worker)) = (peer, self.workers.get_mut(&qpn)) else {
            return;
        };
        let active = peer.socket.as_ref().map(AsRawFd::as_raw_fd);
        let address = PeerAddress {
            address: peer.address,
            qpn: peer.qpn,
        };
        let connected = worker.connect(&self.shared, address, peer.socket, peer.user_timeout_ms);
        if let Err((sender, why)) = connected {
            // The passive connection it held was not its peer's: dropped, the QP waits on.
            self.dropped(sender, &why);
        }
        if let Some(fd) = active {
            if let Err(e) = watch_fd(&self.epoll, fd, u64::from(qpn)) {
                warn!(
                    crate::log::NET,
                    "tcp {}: epoll for QP {qpn}: {e}", self.shared.device
                );
            }
        }
    }

    /// Accepts the waiting connections into the unclaimed ones while they have a place (one
    /// pushed out for it once it had its time: src/fabric/tcp/unclaimed.rs); the others wait in
    /// the backlog, tried again when claims free places or the oldest may be pushed out.
    fn accept_all(&mut self, now: Instant) {
        (self.accept_retry, self.accept_waiting) = (None, false);
        loop {
            match self.unclaimed.make_room(now) {
                Ok(None) => {}
                Ok(Some((sender, why))) => self.dropped(sender, &why),
                Err(when) => {
                    (self.accept_retry, self.accept_waiting) = (Some(when), true);
                    return;
                }
            }
            match socket::accept(self.listener.as_raw_fd()) {
                Ok(Accepted::Connection(socket, sender)) => {
                    let fd = socket.as_raw_fd();
                    let token = self.unclaimed.admit(socket, sender, now);
                    if let Err(e) = watch_fd(&self.epoll, fd, token) {
                        warn!(
                            crate::log::NET,
                            "tcp {}: epoll for an accepted connection: {e}", self.shared.device
                        );
                    }
                }
                Ok(Accepted::Again) => {}
                Ok(Accepted::Empty) => break,
                Err(e) => {
                    // Out of descriptors, most likely: the connection waits in the backlog, the
                    // rail goes on, and accepting is tried again shortly.
                    if let Some(count) = self.accept_failures.note(now) {
                        warn!(
                            crate::log::NET,
                            "tcp {}: accept on the rail's port: {e} ({count} time(s) since the \
                             last such warning); trying again every {} ms",
                            self.shared.device,
                            ACCEPT_RETRY.as_millis()
                        );
                    }
                    self.accept_retry = Some(now + ACCEPT_RETRY);
                    break;
                }
            }
        }
    }

    /// Reads the hellos that came, hands each connection to the QP it names if that QP admits
    /// it, and drops the rest without touching any QP.
    fn claim(&mut self, now: Instant) {
        let mut outcomes = Vec::new();
        self.unclaimed.pass(now, &mut outcomes);
        // A hello read now was sent after its QP was created: the notice of that creation is
        // queued by now, so take it before looking the QP up.
        self.take_notices();
        for outcome in outcomes {
            match outcome {
                Outcome::Dropped { sender, why } => self.dropped(sender, &why),
                Outcome::Hello {
                    socket,
                    sender,
                    hello,
                } => {
                    if let Err(why) = self.hand_over(socket, sender, hello) {
                        self.dropped(sender, &why);
                    }
                }
            }
        }
    }

    /// Gives `socket` to the QP `hello` names, if it admits it (src/fabric/tcp/worker.rs).
    fn hand_over(&mut self, socket: OwnedFd, sender: Ipv4Addr, hello: Hello) -> Result<(), String> {
        let Some(worker) = self.workers.get_mut(&hello.target_qpn) else {
            return Err(format!(
                "it names QP {}, which this rail does not have",
                hello.target_qpn
            ));
        };
        worker.admits(&hello, sender)?;
        let fd = socket.as_raw_fd();
        worker.attach(socket, hello);
        // The QP's socket is watched under the QP's token.
        if let Err(e) = rewatch_fd(&self.epoll, fd, u64::from(hello.target_qpn)) {
            warn!(
                crate::log::NET,
                "tcp {}: epoll for QP {}: {e}", self.shared.device, hello.target_qpn
            );
        }
        Ok(())
    }

    /// A connection to the rail's port was dropped: counted, and a WARN at most once per
    /// [`STRANGER_WARN_INTERVAL`].
    fn dropped(&mut self, sender: Ipv4Addr, why: &str) {
        if let Some(count) = self.strangers.note(Instant::now()) {
            warn!(
                crate::log::NET,
                "tcp {}: dropped a connection to the rail's port from {sender}: {why}; {count} \
                 dropped since the last such warning; the rail goes on",
                self.shared.device
            );
        }
    }
}

/// Adds `fd` to the epoll set, edge-triggered: every reader reads until "would block".
fn watch_fd(epoll: &OwnedFd, fd: i32, token: u64) -> std::io::Result<()> {
    control(epoll, libc::EPOLL_CTL_ADD, fd, token)
}

fn rewatch_fd(epoll: &OwnedFd, fd: i32, token: u64) -> std::io::Result<()> {
    control(epoll, libc::EPOLL_CTL_MOD, fd, token)
}

fn control(epoll: &OwnedFd, operation: i32, fd: i32, token: u64) -> std::io::Result<()> {
    let mut event = libc::epoll_event {
        events: (libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLRDHUP | libc::EPOLLET) as u32,
        u64: token,
    };
    // SAFETY: `event` is a live epoll_event; both descriptors are open.
    if unsafe { libc::epoll_ctl(epoll.as_raw_fd(), operation, fd, &mut event) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
