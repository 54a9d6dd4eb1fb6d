//! A TCP rail: the device handle, its completion queues, shared receive queues and queue pairs.
//! Every handle keeps the rail's [`Core`] alive; the last one dropped stops and joins the rail's
//! thread.

use std::any::Any;
use std::collections::VecDeque;
use std::net::SocketAddrV4;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use super::shared::{CqRing, Notice, Peer, QpShared, Shared, SrqRing};
use super::socket;
use crate::fabric::pages::check_depth;
use crate::fabric::{
    Access, AsyncEvent, Completion, CompletionQueue, CqSettings, DeviceInfo, Endpoint, FabricError,
    FabricResult, MemoryKeys, PeerResolution, QpCapabilities, QpSettings, QueuePair, RailDevice,
    RemoteQp, SharedReceiveQueue, WorkRequest,
};
use crate::native_thread::NativeThread;

/// Largest CQ, SRQ and send queue (the ConnectX limits the other fabrics use too).
const MAX_CQE: u32 = (1 << 22) - 1;
pub(super) const MAX_SRQ_WR: u32 = (1 << 15) - 1;
const MAX_QP_WR: u32 = 1 << 15;

/// QP numbers are unique in the process (a peer names our QP by number in its hello), counted
/// from a random start: a stranger who reaches a rail port cannot guess the number a hello must
/// name (issue 34; docs/SECURITY.md).
static NEXT_QPN: AtomicU32 = AtomicU32::new(0);
/// Memory keys, unique in the process so a key used on the wrong rail fails; lkey and rkey
/// differ so that one used for the other fails, as it may on hardware. Counted from a random
/// even start, so a remote key names no region by guess.
static NEXT_KEY: AtomicU32 = AtomicU32::new(0);

/// Where the process's QP numbers and memory keys start: drawn once, at the first use of
/// either (QP numbers at least 0x100 and keys at least 0x10, clear of the values that mean
/// "none"; a range of 2^30 above each, so neither wraps in a process's life).
pub(super) fn random_starts() -> (u32, u32) {
    static STARTS: std::sync::OnceLock<(u32, u32)> = std::sync::OnceLock::new();
    *STARTS.get_or_init(|| {
        let drawn = crate::random::draw().unwrap_or_else(|error| {
            // No entropy (a kernel without getrandom): the clock and pid, guessable at a
            // stretch, and said so.
            warn!(
                crate::log::NET,
                "tcp fabric: getrandom failed ({error}); QP numbers and memory keys start from the clock"
            );
            crate::random::clock_and_pid()
        });
        let qpn = 0x100 + (drawn as u32 & 0x3FFF_FFFF);
        let key = (0x10 + ((drawn >> 32) as u32 & 0x3FFF_FFFF)) & !1;
        (qpn, key)
    })
}

/// The next QP number of the process.
pub(super) fn next_qpn() -> u32 {
    random_starts()
        .0
        .wrapping_add(NEXT_QPN.fetch_add(1, Ordering::Relaxed))
}

/// The next lkey of the process (its rkey is the next number).
fn next_lkey() -> u32 {
    random_starts()
        .1
        .wrapping_add(NEXT_KEY.fetch_add(2, Ordering::Relaxed))
}

/// The rail's thread and shared state; dropping it stops and joins the thread.
pub(super) struct Core {
    pub shared: Arc<Shared>,
    thread: Mutex<Option<NativeThread>>,
}

impl Core {
    pub(super) fn new(shared: Arc<Shared>, thread: NativeThread) -> Core {
        Core {
            shared,
            thread: Mutex::new(Some(thread)),
        }
    }

    fn error(
        &self,
        verb: &'static str,
        qp: Option<u32>,
        errno: i32,
        detail: impl Into<String>,
    ) -> FabricError {
        FabricError {
            verb,
            device: self.shared.device.clone(),
            qp_num: qp,
            errno,
            detail: detail.into(),
        }
    }
}

impl Core {
    /// Asks the rail's thread to end and joins it (no-op once joined).
    pub(super) fn stop(&self) {
        self.shared.request_stop();
        let thread = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(thread) = thread {
            thread.join();
        }
    }

    /// The error of a call that needs the rail's thread after it was stopped.
    fn stopped(&self, verb: &'static str, qp: Option<u32>) -> Option<FabricError> {
        self.shared.stopping().then(|| {
            self.error(
                verb,
                qp,
                libc::ESHUTDOWN,
                "the rail's thread was stopped (the plugin was finalized or is being unloaded)",
            )
        })
    }
}

impl Drop for Core {
    fn drop(&mut self) {
        self.stop();
    }
}

/// An opened TCP rail.
pub(super) struct TcpDevice {
    pub core: Arc<Core>,
    pub info: DeviceInfo,
}

impl RailDevice for TcpDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn register(&self, addr: u64, len: usize, access: Access) -> FabricResult<MemoryKeys> {
        let verb = "ibv_reg_mr";
        let len64 = crate::fabric::pages::check_registration(addr, len)
            .map_err(|(errno, detail)| self.core.error(verb, None, errno, detail))?;
        let lkey = next_lkey();
        let keys = MemoryKeys {
            lkey,
            rkey: lkey.wrapping_add(1),
        };
        self.core
            .shared
            .registry_mut()
            .add(addr, len64, access, keys);
        Ok(keys)
    }

    fn register_dmabuf(
        &self,
        _: u64,
        _: usize,
        _: u64,
        _: i32,
        _: Access,
    ) -> FabricResult<MemoryKeys> {
        Err(self.core.error(
            "ibv_reg_dmabuf_mr",
            None,
            libc::EOPNOTSUPP,
            "the tcp fabric moves host memory only (no DMA-BUF)",
        ))
    }

    fn deregister(&self, keys: MemoryKeys) -> FabricResult<()> {
        if self.core.shared.registry_mut().remove(keys) {
            return Ok(());
        }
        Err(self.core.error(
            "ibv_dereg_mr",
            None,
            libc::EINVAL,
            format!(
                "no registration with lkey {:#x} rkey {:#x}",
                keys.lkey, keys.rkey
            ),
        ))
    }

    fn create_cq(&self, settings: CqSettings) -> FabricResult<Box<dyn CompletionQueue>> {
        let depth = check_depth(settings.depth, MAX_CQE)
            .map_err(|d| self.core.error("ibv_create_cq", None, libc::EINVAL, d))?;
        let mut ring = VecDeque::new();
        ring.try_reserve_exact(depth as usize).map_err(|_| {
            self.core.error(
                "ibv_create_cq",
                None,
                libc::ENOMEM,
                "cannot allocate the CQ ring",
            )
        })?;
        let mut state = self.core.shared.state();
        let id = state.take_id();
        state.cqs.insert(
            id,
            CqRing {
                depth: depth as usize,
                ring,
                broken: false,
            },
        );
        Ok(Box::new(TcpCq {
            core: Arc::clone(&self.core),
            id,
        }))
    }

    fn create_srq(&self, depth: u32) -> FabricResult<Box<dyn SharedReceiveQueue>> {
        let depth = check_depth(depth, MAX_SRQ_WR)
            .map_err(|d| self.core.error("ibv_create_srq", None, libc::EINVAL, d))?;
        let mut ring = VecDeque::new();
        ring.try_reserve_exact(depth as usize).map_err(|_| {
            self.core.error(
                "ibv_create_srq",
                None,
                libc::ENOMEM,
                "cannot allocate the SRQ ring",
            )
        })?;
        let mut state = self.core.shared.state();
        let id = state.take_id();
        state.srqs.insert(
            id,
            SrqRing {
                depth: depth as usize,
                ring,
            },
        );
        Ok(Box::new(TcpSrq {
            core: Arc::clone(&self.core),
            id,
        }))
    }

    fn create_qp(
        &self,
        cq: &dyn CompletionQueue,
        srq: Option<&dyn SharedReceiveQueue>,
        caps: QpCapabilities,
    ) -> FabricResult<Box<dyn QueuePair>> {
        if let Some(stopped) = self.core.stopped("ibv_create_qp", None) {
            return Err(stopped);
        }
        let einval = |detail: &str| self.core.error("ibv_create_qp", None, libc::EINVAL, detail);
        let cq = cq
            .as_any()
            .downcast_ref::<TcpCq>()
            .filter(|c| Arc::ptr_eq(&c.core, &self.core))
            .ok_or_else(|| einval("the CQ is not one of this tcp rail's"))?;
        let srq = match srq {
            None => None,
            Some(s) => Some(
                s.as_any()
                    .downcast_ref::<TcpSrq>()
                    .filter(|s| Arc::ptr_eq(&s.core, &self.core))
                    .ok_or_else(|| einval("the SRQ is not one of this tcp rail's"))?
                    .id,
            ),
        };
        let depth = check_depth(caps.max_send_wr, MAX_QP_WR)
            .map_err(|d| einval(&format!("max_send_wr: {d}")))?;
        if caps.max_inline > 0 {
            return Err(einval(
                "tcp QPs carry no inline data (max_inline must be 0)",
            ));
        }
        let qpn = next_qpn();
        let mut submitted = VecDeque::new();
        submitted.try_reserve_exact(depth as usize).map_err(|_| {
            self.core.error(
                "ibv_create_qp",
                None,
                libc::ENOMEM,
                "cannot allocate the send queue",
            )
        })?;
        let mut state = self.core.shared.state();
        state.qps.insert(
            qpn,
            QpShared {
                cq: cq.id,
                srq,
                max_send_wr: depth,
                secret: caps.secret,
                submitted,
                outstanding: 0,
                error: None,
                peer: None,
                connected: false,
                posted_pending: false,
                fail_requested: false,
                quiesced: false,
            },
        );
        self.core.shared.notify(state, Notice::Created(qpn));
        Ok(Box::new(TcpQp {
            core: Arc::clone(&self.core),
            qpn,
        }))
    }

    fn next_async_event(&self) -> Option<AsyncEvent> {
        self.core.shared.state().events.pop_front()
    }

    fn resolve_peer(&self, peer: &Endpoint) -> FabricResult<Box<dyn PeerResolution>> {
        let peer = super::socket_address(peer)
            .map_err(|detail| self.core.error("resolve peer", None, libc::EPROTO, detail))?;
        Ok(Box::new(Resolved(peer)))
    }

    fn stop_threads(&self) {
        self.core.stop();
    }
}

/// TCP needs no neighbour resolution before a QP connects: `connect(2)` runs in the background.
struct Resolved(SocketAddrV4);

impl PeerResolution for Resolved {
    fn poll(&mut self) -> FabricResult<bool> {
        Ok(true)
    }

    fn describe(&self) -> String {
        format!("tcp peer {} (nothing to resolve)", self.0)
    }
}

/// A completion queue of a TCP rail.
pub(super) struct TcpCq {
    core: Arc<Core>,
    id: u64,
}

impl CompletionQueue for TcpCq {
    fn poll(&mut self, out: &mut [Completion]) -> FabricResult<usize> {
        if let Some(stopped) = self.core.stopped("ibv_poll_cq", None) {
            return Err(stopped);
        }
        let mut state = self.core.shared.state();
        let Some(ring) = state.cqs.get_mut(&self.id) else {
            return Err(self
                .core
                .error("ibv_poll_cq", None, libc::EIO, "the CQ no longer exists"));
        };
        if ring.broken {
            return Err(self.core.error(
                "ibv_poll_cq",
                None,
                libc::EIO,
                "the CQ overflowed (more completions than its depth)",
            ));
        }
        let mut count = 0;
        for slot in out.iter_mut() {
            let Some(completion) = ring.ring.pop_front() else {
                break;
            };
            *slot = completion;
            count += 1;
        }
        Ok(count)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for TcpCq {
    fn drop(&mut self) {
        self.core.shared.state().cqs.remove(&self.id);
    }
}

/// A shared receive queue of a TCP rail.
pub(super) struct TcpSrq {
    core: Arc<Core>,
    id: u64,
}

impl SharedReceiveQueue for TcpSrq {
    fn post_receives(&self, count: u32, wr_id: u64) -> FabricResult<()> {
        let mut state = self.core.shared.state();
        let Some(ring) = state.srqs.get_mut(&self.id) else {
            return Err(self.core.error(
                "ibv_post_srq_recv",
                None,
                libc::EINVAL,
                "the SRQ no longer exists",
            ));
        };
        let free = ring.depth - ring.ring.len();
        if count as usize > free {
            let detail = format!("{count} receives do not fit: {free} of {} free", ring.depth);
            return Err(self
                .core
                .error("ibv_post_srq_recv", None, libc::ENOMEM, detail));
        }
        for _ in 0..count {
            ring.ring.push_back(wr_id);
        }
        self.core.shared.notify(state, Notice::Receives);
        Ok(())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for TcpSrq {
    fn drop(&mut self) {
        self.core.shared.state().srqs.remove(&self.id);
    }
}

/// A queue pair of a TCP rail: one TCP connection to its peer QP.
pub(super) struct TcpQp {
    core: Arc<Core>,
    qpn: u32,
}

/// RC's transport timeout ([`QpSettings::retry_budget_ms`]).
pub(super) fn user_timeout_ms(settings: &QpSettings) -> u32 {
    settings.retry_budget_ms()
}

impl QueuePair for TcpQp {
    fn qp_num(&self) -> u32 {
        self.qpn
    }

    fn connect(&mut self, remote: &RemoteQp, settings: &QpSettings) -> FabricResult<()> {
        let shared = &self.core.shared;
        let peer_address = super::socket_address(&remote.endpoint).map_err(|detail| {
            let detail = format!("remote QP {}: {detail}", remote.qp_num);
            self.core
                .error("ibv_modify_qp", Some(self.qpn), libc::EINVAL, detail)
        })?;
        let timeout = user_timeout_ms(settings);
        // The side with the smaller (address, port, QP) opens the connection; the other accepts.
        let local = (u32::from(shared.address), shared.port, self.qpn);
        let far = (
            u32::from(*peer_address.ip()),
            peer_address.port(),
            remote.qp_num,
        );
        let socket = if local < far {
            Some(
                socket::start_connect(shared.address, peer_address, timeout).map_err(|e| {
                    self.core.error(
                        "connect",
                        Some(self.qpn),
                        e.raw_os_error().unwrap_or(0),
                        format!("towards {peer_address} QP {}: {e}", remote.qp_num),
                    )
                })?,
            )
        } else {
            None
        };
        let mut state = shared.state();
        let Some(qp) = state.qps.get_mut(&self.qpn) else {
            return Err(self.core.error(
                "ibv_modify_qp",
                Some(self.qpn),
                libc::EINVAL,
                "the QP no longer exists",
            ));
        };
        if qp.connected {
            return Err(self.core.error(
                "ibv_modify_qp",
                Some(self.qpn),
                libc::EINVAL,
                "the QP is already connected",
            ));
        }
        qp.connected = true;
        qp.peer = Some(Peer {
            address: peer_address,
            qpn: remote.qp_num,
            user_timeout_ms: timeout,
            socket,
        });
        shared.notify(state, Notice::Connected(self.qpn));
        Ok(())
    }

    unsafe fn post_send(&mut self, chain: &[WorkRequest]) -> FabricResult<()> {
        if let Some(stopped) = self.core.stopped("ibv_post_send", Some(self.qpn)) {
            return Err(stopped);
        }
        let shared = &self.core.shared;
        let mut state = shared.state();
        let fail = |errno: i32, detail: String| {
            self.core
                .error("ibv_post_send", Some(self.qpn), errno, detail)
        };
        let Some(qp) = state.qps.get_mut(&self.qpn) else {
            return Err(fail(libc::EINVAL, "the QP no longer exists".to_string()));
        };
        if qp.error.is_some() {
            // As verbs does: a QP in the error state takes posts and flushes them, completing
            // each signaled one with WR_FLUSH_ERR (the engine then learns the rail failed).
            let (cq, qpn) = (qp.cq, self.qpn);
            for wr in chain.iter().filter(|wr| wr.signaled) {
                state.deliver(cq, Completion::flushed(wr, qpn, 0));
            }
            return Ok(());
        }
        if !qp.connected {
            return Err(fail(libc::EINVAL, "the QP is not connected".to_string()));
        }
        if let Some(wr) = chain.iter().find(|w| w.inline) {
            return Err(fail(
                libc::EINVAL,
                format!(
                    "WR {:#x} asks for inline data, which tcp QPs do not carry",
                    wr.wr_id
                ),
            ));
        }
        let free = qp.max_send_wr - qp.outstanding;
        if chain.len() > free as usize {
            let detail = format!(
                "{} WRs do not fit: {free} of {} send queue slots free",
                chain.len(),
                qp.max_send_wr
            );
            return Err(fail(libc::ENOMEM, detail));
        }
        qp.outstanding += chain.len() as u32;
        qp.submitted.extend(chain.iter().copied());
        if qp.posted_pending {
            drop(state);
            shared.wake_if_sleeping();
        } else {
            qp.posted_pending = true;
            shared.notify(state, Notice::Posted(self.qpn));
        }
        Ok(())
    }

    /// Asks the rail thread, which alone lands and sends for the QP, to fail it between two of
    /// its steps; [`QueuePair::quiesced`] says when it has.
    fn fail(&mut self) -> FabricResult<()> {
        let shared = &self.core.shared;
        let mut state = shared.state();
        match state.qps.get_mut(&self.qpn) {
            Some(qp) if !qp.fail_requested => {
                qp.fail_requested = true;
                shared.notify(state, Notice::Fail(self.qpn));
            }
            _ => {}
        }
        Ok(())
    }

    fn quiesced(&mut self) -> FabricResult<bool> {
        if let Some(stopped) = self.core.stopped("ibv_modify_qp(ERR)", Some(self.qpn)) {
            return Err(stopped);
        }
        let state = self.core.shared.state();
        Ok(state.qps.get(&self.qpn).map_or(true, |qp| qp.quiesced))
    }
}

impl Drop for TcpQp {
    fn drop(&mut self) {
        let mut state = self.core.shared.state();
        state.qps.remove(&self.qpn);
        self.core.shared.notify(state, Notice::Destroyed(self.qpn));
    }
}
