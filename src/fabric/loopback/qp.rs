//! Loopback RC queue pairs: connection, posting, and send-queue accounting.
//!
//! Posting only validates and enqueues; the bytes move when progress executes the queue (see
//! [`super::execute`]), so a test observes the same asynchrony the engine sees on hardware.

use std::collections::VecDeque;

use super::{device_name, fabric_error, world, World};
use crate::fabric::{
    FabricError, FabricResult, QpCapabilities, QpSettings, QueuePair, Rail, RemoteQp, WorkRequest,
};

/// How long the kernel waits for ARP inside `ibv_modify_qp(RTR)` (`rdma_resolve_ip`'s
/// timeout; the rig measured 1048-1062 ms, docs/RELIABILITY.md).
const KERNEL_RESOLUTION_WAIT: std::time::Duration = std::time::Duration::from_millis(1000);

/// A posted WR waiting in its QP's in-flight queue.
#[derive(Clone, Copy, Debug)]
pub(crate) struct InFlight {
    /// The WR as posted.
    pub(crate) wr: WorkRequest,
    /// Post sequence number within the QP; selects the inline buffer slot.
    pub(crate) seq: u64,
    /// First progress pass in which the WR may execute (`delay` knob).
    pub(crate) ready_pass: u64,
    /// When the rate model delivers it (ns since the model's epoch; 0 without rates).
    pub(crate) ready_at_ns: u64,
    /// Whether the `fail` knob picked this WR.
    pub(crate) inject_fail: bool,
}

/// Where a connected QP sends.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Peer {
    /// Remote QP number.
    pub(crate) qpn: u32,
    /// Remote GID as given to `connect` (a wrong one makes the peer unreachable).
    pub(crate) gid: [u8; 16],
}

/// The world's side of a QP.
pub(crate) struct QpState {
    /// QP number.
    pub(crate) qpn: u32,
    /// Its place in creation order (progress runs QPs in it).
    pub(crate) created: u64,
    /// Owning device.
    pub(crate) device: usize,
    /// Rail of the device handle that created it.
    pub(crate) rail: Rail,
    /// CQ receiving both its send and its receive completions.
    pub(crate) cq: u64,
    /// SRQ its incoming IMMs consume receives from.
    pub(crate) srq: Option<u64>,
    /// Send queue size.
    max_send_wr: u32,
    /// Inline payload limit, also the size of one inline buffer slot.
    pub(crate) max_inline: u32,
    /// The remote end, once connected.
    pub(crate) peer: Option<Peer>,
    /// Error state: a WR failed; everything behind it was flushed and posts are refused.
    pub(crate) error: bool,
    /// Posted WRs not yet executed, in post order.
    pub(crate) inflight: VecDeque<InFlight>,
    /// Inline payloads, `max_inline` bytes per send-queue slot, slot = seq % max_send_wr.
    pub(crate) inline_buf: Vec<u8>,
    /// Sequence number of the next posted WR.
    next_seq: u64,
    /// Posted WRs not yet retired (the send queue occupancy).
    outstanding: u32,
    /// Executed WRs waiting for a signaled completion to retire them.
    unretired: u32,
}

impl QpState {
    /// The state of a new, unconnected QP, or `None` when its queues cannot be allocated.
    pub(crate) fn new(
        qpn: u32,
        created: u64,
        device: usize,
        rail: Rail,
        cq: u64,
        srq: Option<u64>,
        caps: QpCapabilities,
    ) -> Option<QpState> {
        let slots = usize::try_from(caps.max_send_wr).ok()?;
        let mut inflight = VecDeque::new();
        inflight.try_reserve_exact(slots).ok()?;
        let inline_len = slots.checked_mul(usize::try_from(caps.max_inline).ok()?)?;
        let mut inline_buf = Vec::new();
        inline_buf.try_reserve_exact(inline_len).ok()?;
        inline_buf.resize(inline_len, 0);
        Some(QpState {
            qpn,
            created,
            device,
            rail,
            cq,
            srq,
            max_send_wr: caps.max_send_wr,
            max_inline: caps.max_inline,
            peer: None,
            error: false,
            inflight,
            inline_buf,
            next_seq: 0,
            outstanding: 0,
            unretired: 0,
        })
    }

    /// Byte offset of the inline slot of WR number `seq`.
    pub(crate) fn inline_offset(&self, seq: u64) -> usize {
        let slot = seq % u64::from(self.max_send_wr.max(1));
        // slot < max_send_wr, which fits usize (the buffer was allocated with it).
        usize::try_from(slot).unwrap_or(0) * self.max_inline as usize
    }

    /// Accounts for one executed WR. A signaled completion retires the WR and every unsignaled
    /// one executed before it (their send-queue slots are only known free once a later
    /// completion proves the hardware moved past them, which is why the engine signals
    /// periodically); an unsignaled one stays outstanding until then.
    pub(crate) fn retire(&mut self, completion_generated: bool) {
        if completion_generated {
            self.outstanding = self
                .outstanding
                .saturating_sub(self.unretired.saturating_add(1));
            self.unretired = 0;
        } else {
            self.unretired = self.unretired.saturating_add(1);
        }
    }

    /// Checks that `chain` may be posted as a whole; the error is (errno, detail).
    fn check_post(&self, chain: &[WorkRequest]) -> Result<(), (i32, String)> {
        if self.peer.is_none() {
            return Err((libc::EINVAL, "the QP is not connected".to_string()));
        }
        let free = self.max_send_wr - self.outstanding.min(self.max_send_wr);
        if chain.len() > free as usize {
            let detail = format!(
                "{} WRs do not fit the send queue: {} of {} outstanding",
                chain.len(),
                self.outstanding,
                self.max_send_wr
            );
            return Err((libc::ENOMEM, detail));
        }
        for wr in chain {
            let len = wr.length();
            if wr.inline && len > self.max_inline {
                let detail = format!("inline WR of {len} bytes exceeds {}", self.max_inline);
                return Err((libc::EINVAL, detail));
            }
            if wr.sge.is_some_and(|s| s.addr == 0 && s.length > 0) {
                return Err((libc::EINVAL, format!("WR {:#x} has a null SGE", wr.wr_id)));
            }
        }
        Ok(())
    }
}

/// A loopback QP handle; dropping it destroys the QP (its unexecuted WRs vanish, and WRs of
/// peers still aimed at it complete with `RetryExceeded`).
pub(crate) struct LoopbackQp {
    /// QP number.
    qpn: u32,
    /// Owning device.
    device: usize,
}

impl LoopbackQp {
    /// A handle on QP `qpn`.
    pub(crate) fn new(qpn: u32, device: usize) -> LoopbackQp {
        LoopbackQp { qpn, device }
    }

    /// An error about this QP.
    fn error(&self, verb: &'static str, errno: i32, detail: impl Into<String>) -> FabricError {
        fabric_error(
            verb,
            device_name(self.device),
            Some(self.qpn),
            errno,
            detail,
        )
    }
}

impl QueuePair for LoopbackQp {
    fn qp_num(&self) -> u32 {
        self.qpn
    }

    /// Records the peer. The peer must exist now; whether it connects back is checked when
    /// WRs execute (a WR towards a peer that has not connected yet waits, like a retrying NIC).
    /// While the rail's `arp` knob still holds the address unresolved, the call first waits a
    /// second, as the kernel does inside `ibv_modify_qp(RTR)`, and the address is then known.
    fn connect(&mut self, remote: &RemoteQp, _settings: &QpSettings) -> FabricResult<()> {
        let verb = "ibv_modify_qp";
        let unresolved = {
            let world = world();
            let rail = world.qp_index(self.qpn).map(|index| world.qps[index].rail);
            rail.filter(|rail| world.unresolved[rail.index()] > 0)
        };
        if let Some(rail) = unresolved {
            // Outside the world lock, which stands for the NIC, not the kernel's ARP wait.
            std::thread::sleep(KERNEL_RESOLUTION_WAIT);
            world().unresolved[rail.index()] = 0;
        }
        let gid = super::device::gid_of_endpoint(&remote.endpoint).map_err(|detail| {
            let detail = format!("remote QP {:#x}: {detail}", remote.qp_num);
            self.error(verb, libc::EINVAL, detail)
        })?;
        let mut world = world();
        if world.qp_index(remote.qp_num).is_none() {
            let detail = format!("remote QP {:#x} does not exist", remote.qp_num);
            return Err(self.error(verb, libc::EINVAL, detail));
        }
        let Some(index) = world.qp_index(self.qpn) else {
            return Err(self.error(verb, libc::EINVAL, "the QP no longer exists"));
        };
        let state = &mut world.qps[index];
        if state.error || state.peer.is_some() {
            return Err(self.error(verb, libc::EINVAL, "the QP is not in the RESET/INIT state"));
        }
        state.peer = Some(Peer {
            qpn: remote.qp_num,
            gid,
        });
        Ok(())
    }

    unsafe fn post_send(&mut self, chain: &[WorkRequest]) -> FabricResult<()> {
        let verb = "ibv_post_send";
        let mut world = world();
        let Some(index) = world.qp_index(self.qpn) else {
            return Err(self.error(verb, libc::EINVAL, "the QP no longer exists"));
        };
        if world.qps[index].error {
            // As verbs does: a QP in the error state takes posts and flushes them.
            super::execute::flush_posted(&mut world, index, chain);
            return Ok(());
        }
        if let Err((errno, detail)) = world.qps[index].check_post(chain) {
            return Err(self.error(verb, errno, detail));
        }
        for wr in chain {
            // SAFETY: the caller guarantees (this method's contract) that every local SGE range
            // is valid for reads until the chain completes; inline payloads are read now.
            unsafe { enqueue(&mut world, index, wr) };
        }
        Ok(())
    }

    /// At once, under the world lock: nothing executes or lands outside a progress pass, which
    /// takes the same lock, so the QP is quiesced when this returns.
    fn fail(&mut self) -> FabricResult<()> {
        let mut world = world();
        if let Some(index) = world.qp_index(self.qpn) {
            super::execute::flush(&mut world, index);
        }
        Ok(())
    }

    fn quiesced(&mut self) -> FabricResult<bool> {
        Ok(true)
    }
}

/// Counts one WR towards each armed `heal` knob: at zero the rail's wire is mended and its
/// device says its port is back.
fn heal_step(world: &mut World) {
    for rail in 0..2 {
        match world.heal_left[rail] {
            Some((left, device)) if left <= 1 => {
                world.heal_left[rail] = None;
                world.cut[rail] = false;
                world.devices[device].push_event(crate::fabric::AsyncEvent::PortActive);
            }
            Some((left, device)) => world.heal_left[rail] = Some((left - 1, device)),
            None => {}
        }
    }
}

/// Appends one validated WR to QP `index`'s in-flight queue, applying the `delay` and `fail`
/// knobs and copying an inline payload into the WR's slot.
///
/// # Safety
/// If `wr` is inline, its SGE range must be valid for reads of `wr.length()` bytes.
unsafe fn enqueue(world: &mut World, index: u32, wr: &WorkRequest) {
    let rail = world.qps[index].rail.index();
    world.posted[rail] = world.posted[rail].saturating_add(1);
    world.inflight_wrs += 1;
    let inject_fail = world.faults.fail[rail] == Some(world.posted[rail]);
    heal_step(world);
    let device = world.qps[index].device;
    if world.faults.cut[rail] == Some(world.posted[rail]) {
        world.cut[rail] = true;
        world.heal_left[rail] = world.faults.heal[rail].map(|n| (n, device));
    }
    if world.faults.port_down[rail] == Some(world.posted[rail]) {
        world.devices[device].push_event(crate::fabric::AsyncEvent::PortDown);
        world.heal_left[rail] = world.faults.heal[rail].map(|n| (n, device));
    }
    // A WR posted during pass P may run in pass P + 1; `delay` pushes that back N passes.
    let ready_pass = world
        .pass
        .saturating_add(world.faults.delay[rail])
        .saturating_add(1);
    // The rate model: the WR leaves when its rail's wire is free and arrives a latency later.
    let ready_at_ns = match world.rates_now_ns() {
        Some(now) => {
            let (rail, nic) = (world.qps[index].rail, world.qps[index].device);
            world.rates.admit_on(nic, rail, u64::from(wr.length()), now)
        }
        None => 0,
    };
    let qp = &mut world.qps[index];
    let seq = qp.next_seq;
    qp.next_seq += 1;
    if let (true, Some(sge)) = (wr.inline, wr.sge) {
        let offset = qp.inline_offset(seq);
        let len = sge.length as usize;
        if let Some(dst) = qp.inline_buf.get_mut(offset..offset + len) {
            // SAFETY: the caller guarantees `sge.addr` is readable for `len` bytes (checked
            // non-null by `check_post`); `dst` is exactly `len` bytes of our own buffer, which
            // the caller's memory cannot overlap.
            unsafe { std::ptr::copy(sge.addr as *const u8, dst.as_mut_ptr(), len) };
        }
    }
    qp.outstanding += 1;
    if qp.inflight.is_empty() {
        let busy = (qp.created, qp.qpn);
        // Capacity for every live QP was reserved when it was created: no allocation.
        world.busy.push(busy);
    }
    let qp = &mut world.qps[index];
    // Capacity is max_send_wr and in-flight <= outstanding <= max_send_wr: never grows.
    qp.inflight.push_back(InFlight {
        wr: *wr,
        seq,
        ready_pass,
        ready_at_ns,
        inject_fail,
    });
}

impl Drop for LoopbackQp {
    fn drop(&mut self) {
        let mut world = world();
        if let Some(removed) = world.qps.remove(self.qpn) {
            world.inflight_wrs -= removed.inflight.len();
            let qpn = self.qpn;
            world.busy.retain(|&(_, busy)| busy != qpn);
            // The busy list keeps room for every live QP (posting relies on it).
            let live = world.qps.len().max(world.busy.len());
            if world.busy.capacity() > 64 && live < world.busy.capacity() / 4 {
                world.busy.shrink_to(live * 2);
            }
        }
    }
}
