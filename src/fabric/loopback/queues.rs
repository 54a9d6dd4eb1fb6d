//! Completion queues and shared receive queues.
//!
//! Both are fixed-capacity rings allocated at creation: the data path (post, poll) never
//! allocates, and a full ring means what it means on hardware (a broken CQ, a refused post)
//! instead of silently growing.

use std::any::Any;
use std::collections::VecDeque;

use super::execute::progress;
use super::{device_name, fabric_error, world, World};
use crate::fabric::{
    AsyncEvent, Completion, CompletionQueue, FabricResult, Rail, SharedReceiveQueue,
};

/// The world's side of a completion queue.
pub(crate) struct CqState {
    /// Identifier (0 until the CQ is stored in the world).
    pub(crate) id: u64,
    /// Owning device.
    device: usize,
    /// Capacity; a completion arriving at a full ring breaks the CQ.
    depth: usize,
    /// Completions not yet polled, oldest first.
    ring: VecDeque<Completion>,
    /// Set once the CQ overflowed: every later poll fails, as `ibv_poll_cq` does.
    broken: bool,
}

impl CqState {
    /// A CQ of `depth` entries on `device`, or `None` when the ring cannot be allocated.
    pub(crate) fn new(device: usize, depth: u32) -> Option<CqState> {
        let depth = usize::try_from(depth).ok()?;
        let mut ring = VecDeque::new();
        ring.try_reserve_exact(depth).ok()?;
        Some(CqState {
            id: 0,
            device,
            depth,
            ring,
            broken: false,
        })
    }
}

/// Delivers `completion` to CQ `cq`. A CQ that is full breaks (the completion is lost, an
/// `AsyncEvent::CqError` is raised on its device, later polls fail); a destroyed CQ swallows
/// the completion, like a CQ destroyed under a live QP on hardware.
pub(crate) fn deliver(world: &mut World, cq: u64, completion: Completion) {
    let Some(index) = world.cq_index(cq) else {
        return;
    };
    let state = &mut world.cqs[index];
    if state.broken {
        return;
    }
    if state.ring.len() >= state.depth {
        state.broken = true;
        let device = state.device;
        world.devices[device].push_event(AsyncEvent::CqError);
        return;
    }
    state.ring.push_back(completion);
}

/// A loopback completion queue handle; dropping it destroys the CQ.
pub(crate) struct LoopbackCq {
    /// Identifier in the world.
    id: u64,
    /// Owning device.
    device: usize,
}

impl LoopbackCq {
    /// A handle on CQ `id`.
    pub(crate) fn new(id: u64, device: usize) -> LoopbackCq {
        LoopbackCq { id, device }
    }

    /// Identifier in the world.
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// Owning device.
    pub(crate) fn device(&self) -> usize {
        self.device
    }
}

impl CompletionQueue for LoopbackCq {
    /// Runs one progress pass of the whole emulated fabric (the NIC works while it is polled),
    /// then copies out up to `out.len()` completions of this CQ.
    fn poll(&mut self, out: &mut [Completion]) -> FabricResult<usize> {
        let mut world = world();
        progress(&mut world);
        let err = |detail: &str| {
            fabric_error(
                "ibv_poll_cq",
                device_name(self.device),
                None,
                libc::EIO,
                detail,
            )
        };
        let Some(index) = world.cq_index(self.id) else {
            return Err(err("the CQ no longer exists"));
        };
        let state = &mut world.cqs[index];
        if state.broken {
            return Err(err("the CQ overflowed (more completions than its depth)"));
        }
        let mut count = 0;
        for slot in out.iter_mut() {
            let Some(completion) = state.ring.pop_front() else {
                break;
            };
            super::execute::restart_if_empty(&mut state.ring);
            *slot = completion;
            count += 1;
        }
        Ok(count)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for LoopbackCq {
    fn drop(&mut self) {
        let mut world = world();
        if let Some(index) = world.cq_index(self.id) {
            world.cqs.remove(index);
        }
    }
}

/// The world's side of a shared receive queue.
pub(crate) struct SrqState {
    /// Identifier (0 until the SRQ is stored in the world).
    pub(crate) id: u64,
    /// Rail of the device handle that created it (the `starve` knob acts per rail).
    rail: Rail,
    /// Capacity.
    depth: usize,
    /// Posted receives' wr_ids, oldest first (consumed in order, as the hardware does).
    ring: VecDeque<u64>,
    /// Receives actually added over the SRQ's lifetime (the `starve` knob caps this).
    accepted: u64,
}

impl SrqState {
    /// An SRQ of `depth` receives, or `None` when the ring cannot be allocated.
    pub(crate) fn new(rail: Rail, depth: u32) -> Option<SrqState> {
        let depth = usize::try_from(depth).ok()?;
        let mut ring = VecDeque::new();
        ring.try_reserve_exact(depth).ok()?;
        Some(SrqState {
            id: 0,
            rail,
            depth,
            ring,
            accepted: 0,
        })
    }

    /// Consumes the oldest receive, returning its wr_id.
    pub(crate) fn take(&mut self) -> Option<u64> {
        self.ring.pop_front()
    }
}

/// A loopback SRQ handle; dropping it destroys the SRQ.
pub(crate) struct LoopbackSrq {
    /// Identifier in the world.
    id: u64,
    /// Owning device.
    device: usize,
}

impl LoopbackSrq {
    /// A handle on SRQ `id`.
    pub(crate) fn new(id: u64, device: usize) -> LoopbackSrq {
        LoopbackSrq { id, device }
    }

    /// Identifier in the world.
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// Owning device.
    pub(crate) fn device(&self) -> usize {
        self.device
    }
}

impl SharedReceiveQueue for LoopbackSrq {
    /// Posts `count` receives, all or nothing: more than the free space is ENOMEM. Under the
    /// `starve` knob the post succeeds but only adds what the rail's allowance has left.
    fn post_receives(&self, count: u32, wr_id: u64) -> FabricResult<()> {
        let mut world = world();
        let world = &mut *world;
        let err = |errno: i32, detail: String| {
            fabric_error(
                "ibv_post_srq_recv",
                device_name(self.device),
                None,
                errno,
                detail,
            )
        };
        let Some(index) = world.srq_index(self.id) else {
            return Err(err(libc::EINVAL, "the SRQ no longer exists".to_string()));
        };
        let state = &mut world.srqs[index];
        let free = state.depth - state.ring.len();
        let count = usize::try_from(count).unwrap_or(usize::MAX);
        if count > free {
            let detail = format!(
                "{count} receives do not fit: {free} of {} free",
                state.depth
            );
            return Err(err(libc::ENOMEM, detail));
        }
        let allowed = match world.faults.starve[state.rail.index()] {
            Some(limit) => {
                let left = limit.saturating_sub(state.accepted);
                count.min(usize::try_from(left).unwrap_or(usize::MAX))
            }
            None => count,
        };
        // Within capacity (checked above), so the ring never grows.
        for _ in 0..allowed {
            state.ring.push_back(wr_id);
        }
        state.accepted = state.accepted.saturating_add(allowed as u64);
        Ok(())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for LoopbackSrq {
    fn drop(&mut self) {
        let mut world = world();
        if let Some(index) = world.srq_index(self.id) {
            world.srqs.remove(index);
        }
    }
}
