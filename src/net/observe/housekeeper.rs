//! The plugin's housekeeping thread: the upkeep that needs syscalls, kept off NCCL's data path.
//!
//! Every [`TICK`] it reads the rail devices' async event queues (a `read()` each on verbs) and
//! publishes the fatal events ([`DeviceHealth`]); every 100 ms it reads and flushes the control
//! links (`crate::net::observe::link::pump_all`); about once a second it checks that the probes
//! file and the hint files this process maps are still the files at their paths and whole (a
//! `stat` each, and the hint mappings' list under its lock). What it finds reaches the data path
//! through atomics only, so `isend`, `irecv` and `test` do no syscall, take no lock and allocate
//! nothing however many connections there are (tests/hot_path.rs). net_ib reads async events on
//! a thread per device for the same reason.
//!
//! One thread per process, started with the rails and joined at the last `finalize` (or when the
//! rails are dropped first): comms NCCL leaves open past it get no more event reads, and a
//! `dlclose` after it finds no thread running in the image. It is a native thread that registers
//! nothing in its caller (`crate::native_thread`), so the image really unmaps
//! (tests/lifecycle.rs).

use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::fabric::{Rail, RailDevice};
use crate::native_thread::NativeThread;

use mpib_probes::declared::RAIL_PORT_DOWN;

use crate::net::observe::health::DeviceHealth;
use crate::net::observe::telemetry::Telemetry;

/// How often the device event queues are read.
pub(crate) const TICK: Duration = Duration::from_millis(10);
/// How often the shared files are checked, in ticks (about a second).
const FILE_CHECK_TICKS: u32 = 100;
/// How often the control links are read and flushed, in ticks (100 ms: as often as a waiting
/// comm reads its own, `crate::net::observe::peer::CHECK_INTERVAL_NS`).
const LINK_TICKS: u32 = 10;

/// Set, the thread reads no control link: a test that needs a link read only where it reads
/// it (src/net/tests/handshakes.rs) sets it, and tests that call `pump_all` themselves are not
/// held up by it.
#[cfg(test)]
pub(crate) static LINKS_PAUSED: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

fn links_paused() -> bool {
    #[cfg(test)]
    return LINKS_PAUSED.load(std::sync::atomic::Ordering::Relaxed);
    #[cfg(not(test))]
    false
}

/// What the thread watches: each NIC (in probes-slot order) with its published events.
pub(crate) struct Watched {
    pub nics: Vec<(Arc<dyn RailDevice>, Arc<DeviceHealth>, Rail)>,
    pub telemetry: Arc<Telemetry>,
}

/// The stop request, with the condition variable that cuts the thread's sleep short.
#[derive(Default)]
struct Stop {
    requested: Mutex<bool>,
    wake: Condvar,
}

/// The running thread; dropping it stops and joins it.
pub(crate) struct Housekeeper {
    stop: Arc<Stop>,
    thread: Option<NativeThread>,
}

impl Housekeeper {
    /// Starts the thread; an error names why the system refused it.
    pub(crate) fn start(watched: Watched) -> Result<Housekeeper> {
        let stop = Arc::new(Stop::default());
        let signal = Arc::clone(&stop);
        let thread = NativeThread::spawn("mpib-housekeep", move || run(&watched, &signal))
            .map_err(|e| Error::system(format!("cannot start the housekeeping thread: {e}")))?;
        Ok(Housekeeper {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Housekeeper {
    fn drop(&mut self) {
        *self
            .stop
            .requested
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = true;
        self.stop.wake.notify_all();
        if let Some(thread) = self.thread.take() {
            thread.join();
        }
    }
}

/// The thread's loop: sleep a tick (or until asked to stop), then the upkeep that is due.
fn run(watched: &Watched, stop: &Stop) {
    let mut ticks = 0u32;
    // Room for the links of a typical process up front (it grows to the peak once, then stays).
    let mut links = Vec::with_capacity(64);
    // Port changes published so far per NIC, so that the gauge is written only on a change.
    let mut ports_seen = vec![0u64; watched.nics.len()];
    let mut requested = stop
        .requested
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    loop {
        let (guard, _) = stop
            .wake
            .wait_timeout(requested, TICK)
            .unwrap_or_else(PoisonError::into_inner);
        requested = guard;
        if *requested {
            return;
        }
        for (slot, (device, health, rail)) in watched.nics.iter().enumerate() {
            health.poll(device.as_ref(), *rail);
            let (changes, up) = health.port();
            if changes != ports_seen[slot] {
                ports_seen[slot] = changes;
                watched
                    .telemetry
                    .nic(slot)
                    .set(RAIL_PORT_DOWN, u64::from(!up));
            }
        }
        ticks += 1;
        if ticks % LINK_TICKS == 0 && !links_paused() {
            let now_ns = crate::net::data::request::now_ns();
            crate::net::observe::link::pump_all(now_ns, &mut links);
        }
        if ticks % FILE_CHECK_TICKS == 0 {
            watched.telemetry.check_file();
            crate::net::agent::hints::check_hint_files();
        }
    }
}
