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

    /// Reads `device`'s events if the device is due and this caller wins the deadline (at most
    /// one reader per device per interval).
    #[inline]
    pub(crate) fn poll_if_due(&self, now_ns: u64, device: &dyn RailDevice, rail: Rail) {
        let due = self.next_poll_ns.load(Ordering::Relaxed);
        if now_ns < due {
            return;
        }
        let claimed = self
            .next_poll_ns
            .compare_exchange(
                due,
                now_ns + CHECK_INTERVAL_NS,
                Ordering::Relaxed,
                Ordering::Relaxed,
            )
            .is_ok();
        if claimed {
            self.poll(device, rail);
        }
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
            device_health.poll_if_due(now_ns, devices[rail.index()].as_ref(), rail);
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
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;

    use super::*;
    use crate::fabric::{
        Access, CompletionQueue, CqSettings, DeviceInfo, Endpoint, FabricError, FabricResult,
        MemoryKeys, PeerResolution, QpCapabilities, QueuePair, SharedReceiveQueue,
    };

    /// A device that only counts how often its event queue is read.
    struct CountingDevice {
        info: DeviceInfo,
        reads: AtomicUsize,
    }

    fn refused<T>() -> FabricResult<T> {
        Err(FabricError {
            verb: "test",
            device: "counting".into(),
            qp_num: None,
            errno: libc::ENOTSUP,
            detail: "a health test device does nothing else".into(),
        })
    }

    impl RailDevice for CountingDevice {
        fn info(&self) -> &DeviceInfo {
            &self.info
        }
        fn register(&self, _: u64, _: usize, _: Access) -> FabricResult<MemoryKeys> {
            refused()
        }
        fn register_dmabuf(
            &self,
            _: u64,
            _: usize,
            _: u64,
            _: i32,
            _: Access,
        ) -> FabricResult<MemoryKeys> {
            refused()
        }
        fn deregister(&self, _: MemoryKeys) -> FabricResult<()> {
            refused()
        }
        fn create_cq(&self, _: CqSettings) -> FabricResult<Box<dyn CompletionQueue>> {
            refused()
        }
        fn create_srq(&self, _: u32) -> FabricResult<Box<dyn SharedReceiveQueue>> {
            refused()
        }
        fn create_qp(
            &self,
            _: &dyn CompletionQueue,
            _: Option<&dyn SharedReceiveQueue>,
            _: QpCapabilities,
        ) -> FabricResult<Box<dyn QueuePair>> {
            refused()
        }
        fn next_async_event(&self) -> Option<AsyncEvent> {
            self.reads.fetch_add(1, Ordering::Relaxed);
            None
        }
        fn resolve_peer(&self, _: &Endpoint) -> FabricResult<Box<dyn PeerResolution>> {
            refused()
        }
    }

    /// 1,000 comms whose checks all come due in the same interval read each device's event
    /// queue once, not once each (the syscall on verbs); the next interval reads it once more.
    #[test]
    fn many_comms_read_a_devices_events_once_per_interval() {
        let device = |name: &str| {
            Arc::new(CountingDevice {
                info: DeviceInfo {
                    name: name.into(),
                    port: 1,
                    speed_mbps: 100_000,
                    active_mtu: 5,
                    link_layer: crate::fabric::LinkLayer::Ethernet,
                    address: std::net::Ipv4Addr::LOCALHOST.into(),
                    endpoint: Endpoint::default(),
                    guid: 1,
                    pci_path: None,
                    max_qp: 1,
                },
                reads: AtomicUsize::new(0),
            })
        };
        let (sout, sup) = (device("sout"), device("sup"));
        let devices: super::super::resources::Devices = [sout.clone(), sup.clone()];
        let health = [
            Arc::new(DeviceHealth::default()),
            Arc::new(DeviceHealth::default()),
        ];
        let mut watches: Vec<HealthWatch> = (0..1000).map(|_| HealthWatch::new(&health)).collect();
        let qp_nums = [Vec::new(), Vec::new()];
        let reads = || [&sout, &sup].map(|d| d.reads.load(Ordering::Relaxed));
        for (i, watch) in watches.iter_mut().enumerate() {
            assert!(watch
                .check(1_000 + i as u64, &devices, &health, &qp_nums)
                .is_none());
        }
        assert_eq!(reads(), [1, 1], "one read per device for 1,000 comms");
        for watch in &mut watches {
            watch.check(
                1_000 + CHECK_INTERVAL_NS + 5_000,
                &devices,
                &health,
                &qp_nums,
            );
        }
        assert_eq!(reads(), [2, 2], "and one more the next interval");
    }
}
