//! In-process loopback fabric: a deterministic model of RDMA RC semantics behind the fabric seam.
//!
//! Why it exists: the engine must be testable (unit, integration, CI, the demo) on machines with
//! no RDMA hardware, and its hardest bugs (credit accounting, completion order across rails, error
//! completions) must be reproducible on demand. This backend therefore models exactly the parts of
//! RC semantics the engine relies on, and nothing it must not rely on:
//!
//! * Sixteen devices, `loop0` … `loop15` (port 1 only), as many NICs as a large node has, each
//!   with its own memory-region table, GID and GUID; keys are unique in the process, so a key
//!   used on the wrong device fails like it would on hardware. The rate model and the fault
//!   knobs act per rail (the rail a device was opened as), not per device.
//! * RDMA_WRITE / RDMA_WRITE_WITH_IMM executed in order within a QP, with no promise across QPs
//!   or rails; one SRQ receive consumed per IMM; bounded CQs that break on overflow; error
//!   completions that put the QP in the error state and flush everything behind them; a send
//!   queue whose slots are only freed by signaled completions.
//! * Deterministic fault knobs ([`LoopbackFabric::new`]).
//!
//! Execution details the engine may observe:
//! * Posting only validates and enqueues (the whole chain or nothing); WRs execute during the
//!   next progress pass, which every `CompletionQueue::poll` of any loopback CQ runs first.
//! * A WR checks its local SGE against the local device's registrations (`LocalProtection`),
//!   then the remote range against the peer device's registrations with `remote_write`
//!   (`RemoteAccess`; a zero-byte write checks no rkey, as on hardware). An IMM then takes the
//!   oldest receive of the peer QP's SRQ (none: `ReceiverNotReady`, nothing placed), the bytes
//!   are copied, and the receiver's `RecvRdmaWithImm` completion goes to the peer QP's CQ.
//! * A peer that was destroyed, is in error, is connected to another QP, or was given with a
//!   GID other than its device's, never answers: `RetryExceeded`. A peer that exists but has not
//!   connected yet makes the WR wait (a NIC keeps retrying), keeping the QP's order.
//! * An error completion is always generated; the QP then enters the error state, the WRs
//!   behind it are flushed (`Flushed`, completions only for signaled ones), and so is whatever
//!   is posted on it afterwards, as verbs does.
//! * Send-queue slots are freed only by generated completions: a signaled completion retires
//!   its WR and every unsignaled WR executed before it.
//! * Inline WRs are copied at post time (their lkey is not checked, as on hardware).
//! * `register` fails with EFAULT on unmapped memory (`ibv_reg_mr` pins pages), so a bogus
//!   registration cannot become a segfault during execution.
//!
//! # The world and its lock
//! Sender and receiver comms of one process (or two separately created [`LoopbackFabric`]
//! values) must reach the same devices, exactly like two processes reach the same NICs. All state
//! therefore lives in one process-global `World` behind a `Mutex`. That mutex stands for the
//! NIC's own internal serialisation (doorbells, the on-chip scheduler): the plugin's code takes
//! no lock of its own to use the seam, and the "hardware" makes progress only while some CQ is
//! polled (`CompletionQueue::poll`), which keeps every run deterministic.
//!
//! # Fault knobs are per fabric, stored globally
//! The knobs are given to [`LoopbackFabric::new`], but the world they act on is global, so
//! creating a fabric stores its knobs in the world (the last fabric created wins) and restarts
//! the `fail` counters. Tests that set knobs must therefore not run concurrently with other tests
//! that use the loopback world in the same process: crate tests hold `loopback::tests::serial`.

mod device;
mod execute;
mod faults;
mod qp;
mod queues;
mod rates;
mod table;
#[cfg(test)]
pub(crate) mod tests;
#[cfg(test)]
mod tests_errors;
#[cfg(test)]
mod tests_faults;
#[cfg(test)]
mod tests_rates;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use self::device::{DeviceState, LoopbackDevice};
use self::faults::Faults;
use self::qp::QpState;
use self::queues::{CqState, SrqState};
use self::rates::RateModel;
use self::table::Table;
use super::{Fabric, FabricError, FabricResult, Rail, RailDevice};

/// The device names, indexed by the device's position in [`World::devices`].
const DEVICE_NAMES: [&str; DEVICES] = [
    "loop0", "loop1", "loop2", "loop3", "loop4", "loop5", "loop6", "loop7", "loop8", "loop9",
    "loop10", "loop11", "loop12", "loop13", "loop14", "loop15",
];
/// How many NICs the world has.
const DEVICES: usize = 16;

/// First memory key handed out; keys are never 0 so a zeroed key is always invalid.
const FIRST_KEY: u32 = 0x10;

/// The emulated hardware: every device, queue and registration of the process.
pub(crate) struct World {
    /// Per-device state, indexed like [`DEVICE_NAMES`].
    pub(crate) devices: [DeviceState; DEVICES],
    /// The knobs of the most recently created [`LoopbackFabric`].
    pub(crate) faults: Faults,
    /// WRs posted per rail since the knobs were stored (the `fail` knob counts these).
    pub(crate) posted: [u64; 2],
    /// Per rail, whether its wire is cut (the `cut` knob fired): every WR on it fails.
    pub(crate) cut: [bool; 2],
    /// Per rail, WRs left before it heals (the `heal` knob, armed when `cut` or `portdown`
    /// fired), and the device whose port then comes back.
    pub(crate) heal_left: [Option<(u64, usize)>; 2],
    /// Per rail, the resolution polls left before peers' addresses resolve (the `arp` knob).
    pub(crate) unresolved: [u64; 2],
    /// Progress passes run so far (the `delay` knob counts these).
    pub(crate) pass: u64,
    /// The rail rates (`MPIB_LOOPBACK_RAILS`) and their wire clocks.
    pub(crate) rates: RateModel,
    /// The spec `rates` was parsed from (a fabric created with the same spec keeps the clocks).
    rates_spec: String,
    /// Time 0 of the rate model's clocks and schedule.
    rates_epoch: Option<Instant>,
    /// QPs created so far: each QP's place in creation order, the order progress runs them in.
    pub(crate) created_qps: u64,
    /// Next memory key (an lkey; its rkey is the following number).
    pub(crate) next_key: u32,
    /// Live QPs by number.
    pub(crate) qps: Table<u32, QpState>,
    /// WRs queued on every QP, not yet executed (progress skips the walk at 0).
    pub(crate) inflight_wrs: usize,
    /// The QPs with WRs in flight, as (place in creation order, QP number): progress visits
    /// only these, so a pass costs the same beside 10 idle QPs or 100,000. Its capacity is kept
    /// at least the QP count, so posting never allocates.
    pub(crate) busy: Vec<(u64, u32)>,
    /// Live completion queues by identifier.
    pub(crate) cqs: Table<u64, CqState>,
    /// Live shared receive queues by identifier.
    pub(crate) srqs: Table<u64, SrqState>,
}

impl World {
    /// The empty world (const so that it can initialise a `static` without lazy machinery).
    const fn new() -> World {
        World {
            devices: [DeviceState::EMPTY; DEVICES],
            faults: Faults {
                reorder: false,
                delay: [0, 0],
                fail: [None, None],
                starve: [None, None],
                port_down: [None, None],
                cut: [None, None],
                heal: [None, None],
                unresolved: [0, 0],
                limits: [[None; 5]; 2],
            },
            unresolved: [0, 0],
            posted: [0, 0],
            cut: [false, false],
            heal_left: [None, None],
            pass: 0,
            rates: RateModel::new(),
            rates_spec: String::new(),
            rates_epoch: None,
            created_qps: 0,
            next_key: FIRST_KEY,
            qps: Table::new(),
            inflight_wrs: 0,
            busy: Vec::new(),
            cqs: Table::new(),
            srqs: Table::new(),
        }
    }

    /// `Some(qpn)`, the key [`World::qps`] is indexed by, while the QP numbered `qpn` lives.
    pub(crate) fn qp_index(&self, qpn: u32) -> Option<u32> {
        self.qps.contains(qpn).then_some(qpn)
    }

    /// `Some(id)`, the key [`World::cqs`] is indexed by, while the CQ `id` lives.
    pub(crate) fn cq_index(&self, id: u64) -> Option<u64> {
        self.cqs.contains(id).then_some(id)
    }

    /// `Some(id)`, the key [`World::srqs`] is indexed by, while the SRQ `id` lives.
    pub(crate) fn srq_index(&self, id: u64) -> Option<u64> {
        self.srqs.contains(id).then_some(id)
    }

    /// Nanoseconds since the rate model took effect, or `None` when no rates are modelled (then
    /// the clock is not even read: the fabric runs as fast as before).
    pub(crate) fn rates_now_ns(&self) -> Option<u64> {
        if !self.rates.active() {
            return None;
        }
        let elapsed = self.rates_epoch?.elapsed().as_nanos();
        Some(u64::try_from(elapsed).unwrap_or(u64::MAX))
    }

    /// Installs the rail rates of a new fabric. The same spec as the one in force keeps its
    /// clocks and schedule running: every `init` of a process creates a fabric, and a second
    /// communicator must not restart a schedule (or forget the queued bytes) of the first.
    fn set_rates(&mut self, spec: &str, model: RateModel) {
        if self.rates_epoch.is_some() && self.rates_spec == spec {
            return;
        }
        self.rates = model;
        self.rates_spec = spec.to_string();
        self.rates_epoch = Some(Instant::now());
    }
}

/// The one world of the process.
static WORLD: Mutex<World> = Mutex::new(World::new());

/// Locks the world. A poisoned lock (a test panicked while holding it) is recovered rather than
/// propagated: the seam promises not to panic, and the world's invariants are re-checked by
/// every operation that relies on them.
pub(crate) fn world() -> MutexGuard<'static, World> {
    WORLD
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Builds a [`FabricError`]; every loopback error goes through here so they all look alike.
pub(crate) fn fabric_error(
    verb: &'static str,
    device: &str,
    qp_num: Option<u32>,
    errno: i32,
    detail: impl Into<String>,
) -> FabricError {
    FabricError {
        verb,
        device: device.to_string(),
        qp_num,
        errno,
        detail: detail.into(),
    }
}

/// The name of device `index` (`?` for an index that cannot occur, rather than a panic).
pub(crate) fn device_name(index: usize) -> &'static str {
    DEVICE_NAMES.get(index).copied().unwrap_or("?")
}

/// The loopback backend of the fabric seam (selected with `MPIB_FABRIC=loopback`).
#[derive(Debug)]
pub struct LoopbackFabric {
    /// This fabric's knobs (also stored in the world when the fabric was created).
    faults: Faults,
    /// The rate model's first phase, for the speed each device reports (`MPIB_LOOPBACK_RAILS`).
    speeds: Arc<RateModel>,
    /// `MPIB_SYSFS`: a device with a `class/infiniband/loopN/device` link there reports that
    /// PCI path (tests place loopback NICs on a fake PCI tree); none does under the real `/sys`.
    sysfs: Option<String>,
}

impl LoopbackFabric {
    /// Creates the fabric with the fault knobs `faults` (the `MPIB_LOOPBACK_FAULTS` value): a
    /// comma-separated list of
    ///
    /// * `reorder`: progress runs the SUP rail's QPs before the SOUT rail's, and within a rail
    ///   the QPs in reverse creation order (order within one QP is kept, as RC guarantees);
    /// * `delay=RAIL:N`: WRs posted on RAIL wait N progress passes before they may execute;
    /// * `fail=RAIL:N`: the N-th WR (1-based) posted on RAIL's QPs anywhere in the process
    ///   completes with `RetryExceeded`, putting its QP in the error state;
    /// * `starve=RAIL:N`: each SRQ of RAIL accepts only N receives over its lifetime; later
    ///   posts succeed but add nothing, so a later IMM finds the SRQ empty;
    /// * `portdown=RAIL:N`: posting the N-th WR on RAIL raises a port-error async event;
    /// * `cut=RAIL:N`: posting the N-th WR on RAIL cuts the rail: that WR and every later one on
    ///   any of RAIL's QPs, either way, fails with `RetryExceeded` and lands nothing;
    /// * `heal=RAIL:N`: N WRs (on any rail) after RAIL's `cut` or `portdown` fired, the rail is
    ///   mended and its device raises a port-active event (a rail that comes back);
    /// * `arp=RAIL:N`: peers' addresses on RAIL resolve only after N polls of a
    ///   [`PeerResolution`](crate::fabric::PeerResolution); a QP connected on RAIL before that
    ///   waits one second inside `connect`, like the kernel's address resolution inside
    ///   `ibv_modify_qp` on RoCE (and the address is resolved afterwards);
    ///
    /// with RAIL `sout` or `sup`. The world is process-global, so the knobs are stored there:
    /// the most recently created fabric's knobs apply to every loopback resource, and creating a
    /// fabric restarts the `fail` counters and mends a cut rail.
    ///
    /// `rails` (the `MPIB_LOOPBACK_RAILS` value) gives the rails rates, a base latency, a shared
    /// cap and a mixing cap, on a schedule (see [`rates`] and docs/PERFORMANCE.md); empty: as
    /// fast as memory copies go. Like the knobs, the rates are the world's: the last fabric
    /// created with a different spec replaces them and restarts the schedule's clock.
    ///
    /// # Errors
    /// A malformed knob or rate: the error names the variable and the bad token.
    pub fn new(faults: &str, rails: &str) -> Result<LoopbackFabric, FabricError> {
        let faults = Faults::parse(faults)?;
        let model = RateModel::parse(rails)?;
        let speeds = Arc::new(model.clone());
        let mut world = world();
        world.faults = faults;
        world.posted = [0, 0];
        world.cut = [false, false];
        world.heal_left = [None, None];
        world.unresolved = faults.unresolved;
        world.set_rates(rails.trim(), model);
        Ok(LoopbackFabric {
            faults,
            speeds,
            sysfs: None,
        })
    }

    /// Reads devices' PCI paths under the sysfs tree `root` (`MPIB_SYSFS`).
    pub fn with_sysfs(mut self, root: &str) -> LoopbackFabric {
        self.sysfs = Some(root.to_string());
        self
    }

    /// Whether this fabric was created with any fault knob (for logs).
    pub fn has_faults(&self) -> bool {
        self.faults != Faults::default()
    }
}

impl Fabric for LoopbackFabric {
    fn name(&self) -> &'static str {
        "loopback"
    }

    fn device_names(&self) -> Vec<String> {
        DEVICE_NAMES.iter().map(|n| n.to_string()).collect()
    }

    /// Sender and receiver live in this process: the control connection stays on 127.0.0.1.
    fn control_address(&self, _sout: &dyn RailDevice) -> Option<std::net::Ipv4Addr> {
        Some(std::net::Ipv4Addr::LOCALHOST)
    }

    fn open(&self, spec: &str, rail: Rail) -> FabricResult<Arc<dyn RailDevice>> {
        let index = parse_spec(spec)?;
        let speed = self.speeds.initial_speed_mbps(index, rail);
        let pci_path = self
            .sysfs
            .as_deref()
            .and_then(|root| crate::fabric::rdma_pci_path(root, device_name(index)));
        let mut device = LoopbackDevice::new(index, rail, speed, pci_path);
        device.limit(self.faults.limits[rail.index()]);
        Ok(Arc::new(device))
    }
}

/// Resolves `name` or `name:port` to a device index; only port 1 exists.
fn parse_spec(spec: &str) -> FabricResult<usize> {
    let (name, port) = match spec.split_once(':') {
        Some((name, port)) => (name, Some(port)),
        None => (spec, None),
    };
    let unknown = |why: String| {
        fabric_error(
            "ibv_open_device",
            spec,
            None,
            libc::ENODEV,
            format!(
                "{why}; available devices: {} (port 1)",
                DEVICE_NAMES.join(", ")
            ),
        )
    };
    let index = DEVICE_NAMES
        .iter()
        .position(|n| *n == name)
        .ok_or_else(|| unknown(format!("no loopback device named `{name}`")))?;
    match port {
        None => Ok(index),
        Some(port) if port.trim().parse::<u32>() == Ok(1) => Ok(index),
        Some(port) => Err(unknown(format!("device `{name}` has no port `{port}`"))),
    }
}
