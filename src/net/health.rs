//! Asynchronous device events (port down, device fatal, QP/CQ errors) without a thread.
//!
//! net_ib reads them on one detached thread per HCA; MPIB must survive `dlclose` (NCCL 2.28+), so
//! it starts none. Instead the device's (non-blocking) event queue is read at most once every
//! [`CHECK_INTERVAL_NS`] per device, by whichever comm's `test` first finds it due and wins the
//! compare-and-swap on the device's deadline: one syscall per device per interval however many
//! comms there are. Events are published per device so that every comm on that rail sees a
//! fatal event, whichever comm read it. The data path only loads the deadline and one atomic
//! generation per rail; the event log behind a mutex is read only when that generation moves.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::fabric::{AsyncEvent, Rail, RailDevice};
use crate::log;

/// How often a comm looks at the device event queues (10 ms: a syscall per look on verbs).
pub(crate) const CHECK_INTERVAL_NS: u64 = 10_000_000;
const LOG_CAPACITY: usize = 64;

/// One rail device's published fatal events.
#[derive(Default)]
pub(crate) struct DeviceHealth {
    /// Fatal events published so far (the data path's cheap check).
    generation: AtomicU64,
    /// When the device's event queue is next due to be read (ns, `now_ns`'s clock).
    next_poll_ns: AtomicU64,
    /// The most recent fatal events with their generation number.
    log: Mutex<Vec<(u64, AsyncEvent)>>,
}

impl DeviceHealth {
    fn log(&self) -> MutexGuard<'_, Vec<(u64, AsyncEvent)>> {
        self.log
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Drains `device`'s pending events, logging each and publishing the fatal ones. Port down
    /// counts as fatal for the comms on the rail: their QPs are failing or about to.
    pub(crate) fn poll(&self, device: &dyn RailDevice, rail: Rail) {
        while let Some(event) = device.next_async_event() {
            let fatal = event.is_fatal() || event == AsyncEvent::PortDown;
            let name = &device.info().name;
            if !fatal {
                info!(
                    log::NET,
                    "async event on the {rail} rail ({name}): {event:?}"
                );
                continue;
            }
            warn!(
                log::NET,
                "async event on the {rail} rail ({name}): {event:?}"
            );
            let mut log = self.log();
            let generation = self.generation.load(Ordering::Relaxed) + 1;
            if log.len() == LOG_CAPACITY {
                log.remove(0);
            }
            log.push((generation, event));
            // SYNC: pairs with the Acquire load in `generation`: a reader that sees the new
            // generation finds the event in the log.
            self.generation.store(generation, Ordering::Release);
        }
    }

    /// Whether the caller, at `now_ns`, is the one to read the device's events this interval:
    /// true for at most one caller per [`CHECK_INTERVAL_NS`], whichever wins the deadline.
    #[inline]
    fn claim_poll(&self, now_ns: u64) -> bool {
        let due = self.next_poll_ns.load(Ordering::Relaxed);
        now_ns >= due
            && self
                .next_poll_ns
                .compare_exchange(
                    due,
                    now_ns + CHECK_INTERVAL_NS,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
    }

    /// Fatal events published so far.
    #[inline]
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The first event after generation `seen` that concerns a comm owning `qp_nums` (device-wide
    /// events concern every comm; a QP error only its owner).
    pub(crate) fn fatal_since(&self, seen: u64, qp_nums: &[u32]) -> Option<AsyncEvent> {
        self.log()
            .iter()
            .filter(|(generation, _)| *generation > seen)
            .map(|(_, e)| *e)
            .find(|event| match event {
                AsyncEvent::QpFatal { qp_num } => qp_nums.contains(qp_num),
                _ => true,
            })
    }
}

/// A comm's view of its rails' health.
pub(crate) struct HealthWatch {
    next_check_ns: u64,
    seen: [u64; 2],
}

impl HealthWatch {
    /// Starts watching from the rails' current generations (older events are not this comm's).
    pub(crate) fn new(health: &[std::sync::Arc<DeviceHealth>; 2]) -> HealthWatch {
        HealthWatch {
            next_check_ns: 0,
            seen: [health[0].generation(), health[1].generation()],
        }
    }

    /// Polls the devices when due; `Some((rail, event))` for the first fatal event that concerns
    /// this comm.
    #[inline]
    pub(crate) fn check(
        &mut self,
        now_ns: u64,
        devices: &super::resources::Devices,
        health: &[std::sync::Arc<DeviceHealth>; 2],
        qp_nums: &[Vec<u32>; 2],
    ) -> Option<(Rail, AsyncEvent)> {
        if now_ns < self.next_check_ns {
            return None;
        }
        self.next_check_ns = now_ns + CHECK_INTERVAL_NS;
        for rail in Rail::ALL {
            let device_health = &health[rail.index()];
            if device_health.claim_poll(now_ns) {
                device_health.poll(devices[rail.index()].as_ref(), rail);
            }
            let generation = device_health.generation();
            if generation == self.seen[rail.index()] {
                continue;
            }
            let event = device_health.fatal_since(self.seen[rail.index()], &qp_nums[rail.index()]);
            self.seen[rail.index()] = generation;
            if let Some(event) = event {
                return Some((rail, event));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 1,000 comms whose checks all come due in one interval: one of them reads the device's
    /// event queue (the syscall on verbs), not each; the next interval, one more.
    #[test]
    fn many_comms_read_a_devices_events_once_per_interval() {
        let health = DeviceHealth::default();
        let claims = |from: u64| (0..1000).filter(|i| health.claim_poll(from + i)).count();
        assert_eq!(claims(1_000), 1, "one read for 1,000 comms");
        assert_eq!(claims(2_000), 0, "none again within the interval");
        assert_eq!(
            claims(1_000 + CHECK_INTERVAL_NS),
            1,
            "one more the next interval"
        );
    }
}
