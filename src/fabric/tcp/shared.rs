//! What the engine's handles (CQ, SRQ, QP) and a rail's fabric thread share: one mutex-guarded
//! state, the memory registry, and an eventfd that wakes the thread.
//!
//! The mutex stands where a NIC has its doorbells and completion queues: the engine takes it to
//! post or poll (short, bounded work, no syscall but the wake), the fabric thread to take new
//! work and deliver completions. Socket I/O never happens under it, so a post or a poll never
//! waits for the network. The eventfd is written only while the thread sleeps (`sleeping`), so a
//! busy rail costs no syscall per post.

use std::collections::{HashMap, VecDeque};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::memory::Registry;
use crate::fabric::{AsyncEvent, Completion, WorkRequest};

/// Work for the fabric thread, in the order it was asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Notice {
    /// A QP was created.
    Created(u32),
    /// `connect` gave the QP its peer.
    Connected(u32),
    /// WRs were posted on the QP.
    Posted(u32),
    /// The QP was destroyed.
    Destroyed(u32),
    /// `QueuePair::fail`: the QP goes to the error state.
    Fail(u32),
    /// Receives were posted on an SRQ (a QP waiting for one may go on).
    Receives,
}

/// Where a QP's peer is, as `connect` learned it.
#[derive(Debug)]
pub(super) struct Peer {
    /// The peer rail's listening address.
    pub address: SocketAddrV4,
    /// The peer's QP number.
    pub qpn: u32,
    /// TCP_USER_TIMEOUT: how long unacknowledged bytes may wait before the QP fails, from the
    /// QP's timeout and retry count as RC computes it.
    pub user_timeout_ms: u32,
    /// The socket this side opened towards the peer (`None`: the peer connects to us, or the
    /// QP is connected to itself).
    pub socket: Option<OwnedFd>,
}

/// The shared side of a QP.
#[derive(Debug)]
pub(super) struct QpShared {
    /// CQ receiving its completions.
    pub cq: u64,
    /// SRQ its incoming WRITE_WITH_IMM consume.
    pub srq: Option<u64>,
    /// Send queue depth.
    pub max_send_wr: u32,
    /// The connection's secret, which the hello of its TCP connection must carry.
    pub secret: u64,
    /// Posted WRs the thread has not taken yet (capacity `max_send_wr`, never grown).
    pub submitted: VecDeque<WorkRequest>,
    /// Posted WRs not yet completed (taken or not): the send queue's occupancy.
    pub outstanding: u32,
    /// Set once the QP is in the error state: why.
    pub error: Option<String>,
    /// The peer, from `connect` until the thread takes it.
    pub peer: Option<Peer>,
    /// Whether `connect` was called.
    pub connected: bool,
    /// Whether a `Posted` notice is queued and not yet taken.
    pub posted_pending: bool,
    /// `QueuePair::fail` was called: whether it asked the thread yet.
    pub fail_requested: bool,
    /// The thread has put the QP in the error state at `QueuePair::fail`'s request: nothing
    /// more lands at it or leaves it, and its completions are in its CQ.
    pub quiesced: bool,
}

/// A completion queue's ring.
#[derive(Debug)]
pub(super) struct CqRing {
    pub depth: usize,
    pub ring: VecDeque<Completion>,
    /// Overflowed: every later poll fails, as `ibv_poll_cq` does.
    pub broken: bool,
}

/// A shared receive queue's ring of receive wr_ids.
#[derive(Debug)]
pub(super) struct SrqRing {
    pub depth: usize,
    pub ring: VecDeque<u64>,
}

/// Everything behind the mutex.
#[derive(Debug, Default)]
pub(super) struct State {
    pub qps: HashMap<u32, QpShared>,
    pub cqs: HashMap<u64, CqRing>,
    pub srqs: HashMap<u64, SrqRing>,
    pub notices: VecDeque<Notice>,
    pub events: VecDeque<AsyncEvent>,
    next_id: u64,
}

impl State {
    /// A fresh CQ/SRQ identifier.
    pub(super) fn take_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Delivers a completion to CQ `cq`. A full CQ breaks (as on hardware: the completion is
    /// lost, `CqError` is raised, later polls fail); a destroyed one swallows it.
    pub(super) fn deliver(&mut self, cq: u64, completion: Completion) {
        let Some(ring) = self.cqs.get_mut(&cq) else {
            return;
        };
        if ring.broken {
            return;
        }
        if ring.ring.len() >= ring.depth {
            ring.broken = true;
            if self.events.len() < 64 {
                self.events.push_back(AsyncEvent::CqError);
            }
            return;
        }
        ring.ring.push_back(completion);
    }

    /// Takes the oldest receive of SRQ `srq`.
    pub(super) fn take_receive(&mut self, srq: u64) -> Option<u64> {
        self.srqs.get_mut(&srq)?.ring.pop_front()
    }
}

/// One rail's shared state.
#[derive(Debug)]
pub(super) struct Shared {
    /// The rail's name, for errors (`eth1`).
    pub device: String,
    /// The rail's address.
    pub address: Ipv4Addr,
    /// The rail's listening port.
    pub port: u16,
    /// Memory registrations.
    registry: RwLock<Registry>,
    state: Mutex<State>,
    /// eventfd the thread sleeps on.
    wake: OwnedFd,
    /// Set by the thread just before it sleeps.
    sleeping: AtomicBool,
    /// Tells the thread to end.
    stop: AtomicBool,
}

impl Shared {
    /// The state of a rail listening on `address:port`.
    pub(super) fn new(device: String, address: Ipv4Addr, port: u16) -> std::io::Result<Shared> {
        // SAFETY: eventfd has no memory preconditions; the descriptor is owned below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Shared {
            device,
            address,
            port,
            registry: RwLock::default(),
            state: Mutex::default(),
            // SAFETY: `fd` is a fresh descriptor nothing else owns.
            wake: unsafe { OwnedFd::from_raw_fd(fd) },
            sleeping: AtomicBool::new(false),
            stop: AtomicBool::new(false),
        })
    }

    /// Locks the state. A poisoned lock is recovered: every holder leaves it consistent between
    /// statements that could panic, and the seam must not panic.
    pub(super) fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The registry, for checking and landing bytes.
    pub(super) fn registry(&self) -> RwLockReadGuard<'_, Registry> {
        self.registry.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The registry, for registering and deregistering.
    pub(super) fn registry_mut(&self) -> RwLockWriteGuard<'_, Registry> {
        self.registry.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `notice` for the thread and wakes it if it sleeps.
    pub(super) fn notify(&self, mut state: MutexGuard<'_, State>, notice: Notice) {
        state.notices.push_back(notice);
        drop(state);
        self.wake_if_sleeping();
    }

    /// Wakes the thread if it is about to sleep or sleeping.
    pub(super) fn wake_if_sleeping(&self) {
        if self.sleeping.load(Ordering::SeqCst) {
            self.wake();
        }
    }

    /// Writes the eventfd.
    pub(super) fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live local to our eventfd; a full counter (EAGAIN)
        // already means "awake".
        unsafe { libc::write(self.wake.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// The eventfd, for the thread's epoll set.
    pub(super) fn wake_fd(&self) -> i32 {
        self.wake.as_raw_fd()
    }

    /// Queues an async event for `RailDevice::next_async_event` (at most 64 wait; a rail whose
    /// events nobody reads drops the newest).
    pub(super) fn raise(&self, event: AsyncEvent) {
        let mut state = self.state();
        if state.events.len() < 64 {
            state.events.push_back(event);
        }
    }

    /// Clears the eventfd after a wake.
    pub(super) fn drain_wake(&self) {
        let mut value: u64 = 0;
        // SAFETY: reads 8 bytes into a live local from our non-blocking eventfd.
        unsafe { libc::read(self.wake.as_raw_fd(), (&mut value as *mut u64).cast(), 8) };
    }

    /// The thread announces it will sleep; it must then look for notices once more before it
    /// does (a poster that saw `sleeping == false` queued its notice before this store).
    pub(super) fn set_sleeping(&self, sleeping: bool) {
        self.sleeping.store(sleeping, Ordering::SeqCst);
    }

    /// Asks the thread to end and wakes it.
    pub(super) fn request_stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.wake();
    }

    /// Whether the thread was asked to end.
    pub(super) fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }
}
