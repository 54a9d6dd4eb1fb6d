//! Asynchronous device events (port down, device fatal, QP/CQ errors), published per device.
//!
//! The housekeeping thread (`crate::net::observe::housekeeper`) reads each device's event queue every tick (a
//! syscall on verbs; net_ib reads them on a thread per HCA) and publishes the fatal events here,
//! so that every comm on that rail sees a fatal event. The data path loads one atomic generation
//! per rail; the event log behind a mutex is read only when that generation moves.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::fabric::{AsyncEvent, Rail, RailDevice};
use crate::log;

const LOG_CAPACITY: usize = 64;

/// One rail device's published fatal events.
#[derive(Default)]
pub(crate) struct DeviceHealth {
    /// Fatal events published so far (the data path's cheap check).
    generation: AtomicU64,
    /// The most recent fatal events with their generation number.
    log: Mutex<Vec<(u64, AsyncEvent)>>,
    /// Port changes seen so far (down or back), and whether the last one left it down: when a
    /// failed rail is tried again (docs/PROTOCOL.md §11).
    port_changes: AtomicU64,
    port_down: AtomicBool,
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
            if matches!(event, AsyncEvent::PortDown | AsyncEvent::PortActive) {
                self.port_down
                    .store(event == AsyncEvent::PortDown, Ordering::Relaxed);
                // SYNC: pairs with the Acquire load in `port`: a reader that sees the change
                // reads the state it left.
                self.port_changes.fetch_add(1, Ordering::Release);
            }
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

    /// Fatal events published so far.
    #[inline]
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Port changes so far, and whether the port is up after the last one.
    #[inline]
    pub(crate) fn port(&self) -> (u64, bool) {
        let changes = self.port_changes.load(Ordering::Acquire);
        (changes, !self.port_down.load(Ordering::Relaxed))
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
    /// When the generations are next looked at (`now_ns`'s clock): every
    /// [`crate::net::observe::housekeeper::TICK`] at most, so a `test` between looks reads no shared line.
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

    /// `Some((rail, event))` for the first fatal event published since the last look that
    /// concerns this comm; when a look is due, two atomic loads if there is none.
    #[inline]
    pub(crate) fn check(
        &mut self,
        now_ns: u64,
        health: &[std::sync::Arc<DeviceHealth>; 2],
        qp_nums: &[Vec<u32>; 2],
    ) -> Option<(Rail, AsyncEvent)> {
        if now_ns < self.next_check_ns {
            return None;
        }
        self.next_check_ns =
            now_ns.saturating_add(crate::net::observe::housekeeper::TICK.as_nanos() as u64);
        for rail in Rail::ALL {
            let device_health = &health[rail.index()];
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
