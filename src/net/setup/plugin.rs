//! Process-global plugin state: the fabric and both rails, opened at the first `init` and closed
//! after the last `finalize`; per-communicator contexts snapshot the settings (v11+ calls `init`
//! once per communicator).
//!
//! Nothing here survives `dlclose`: the only threads are the housekeeper (`crate::net::observe::housekeeper`,
//! one per process) and the tcp fabric's (one per rail, `src/fabric/tcp/thread.rs`), stopped and
//! joined at the last `finalize` and, for a plugin never finalized (ABI v7 ... v10 have no
//! `finalize`), from the image's fini entry; neither `atexit` hooks nor thread-local destructors
//! are registered (either would pin the image), so NCCL's unload after the last communicator
//! unmaps the library (tests/lifecycle.rs).

use std::ffi::c_void;
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};

use crate::error::{Error, Result};
use crate::fabric::Fabric;
use crate::log;
use crate::params::Settings;
use crate::proto::qp_layout::QpLayout;

use crate::net::data::send::MAX_TRANSFER;
use crate::net::observe::attributes::NetAttributes;
use crate::net::observe::housekeeper::{Housekeeper, Watched};
use crate::net::observe::telemetry::Telemetry;
use crate::net::setup::budget::{self, limits, Need};
use crate::net::setup::descriptors;
use crate::net::setup::devices::{self, FusedDevice};
use crate::net::{Properties, MAX_RECVS};

/// NCCL's profiler callback (v10+): `ncclResult_t (*)(void** eHandle, int type, void* pHandle,
/// int64_t pluginId, void* extData)`.
pub type ProfilerCallback = unsafe extern "C" fn(
    event_handle: *mut *mut c_void,
    event_type: i32,
    parent_handle: *mut c_void,
    plugin_id: i64,
    data: *mut c_void,
) -> i32;

/// What an `init` call carries, whatever the ABI version.
#[derive(Clone, Copy, Debug, Default)]
pub struct InitParams {
    /// NCCL's communicator id (v11+; 0 before).
    pub comm_id: u64,
    /// Communicator traffic class (-1 = undefined).
    pub traffic_class: i32,
    /// Profiler callback (v10+), if NCCL passed one.
    pub profiler: Option<ProfilerCallback>,
    /// NCCL's logger, if passed.
    pub logger: Option<crate::log::LoggerFn>,
}

/// The opened fabric, NICs and fused devices, shared by every context and comm.
pub(crate) struct Opened {
    /// Kept so the backend outlives every device it opened.
    _fabric: Arc<dyn Fabric>,
    /// The fused devices, in NCCL's order.
    pub devices: Vec<Arc<FusedDevice>>,
    force_flush: bool,
    /// The process's probes file.
    pub telemetry: Arc<Telemetry>,
    /// What one comm holds of each rail's NIC at most (`maxComms`), from the opening settings.
    per_comm: [Need; 2],
    /// Reads the devices' async events and checks the shared files, off the data path; stopped
    /// at the last `finalize`, even if a comm NCCL never closed still holds the rails.
    housekeeper: Mutex<Option<Housekeeper>>,
    /// The process that opened the rails and started their threads: a child forked from it
    /// inherits this state but none of the threads, and must not join them when it exits.
    opener: u32,
}

impl Opened {
    /// Fused device `dev`, or an error naming the devices that exist.
    pub(crate) fn device(&self, dev: i32) -> Result<&Arc<FusedDevice>> {
        usize::try_from(dev)
            .ok()
            .and_then(|index| self.devices.get(index))
            .ok_or_else(|| {
                Error::invalid_argument(format!(
                    "device {dev} does not exist: MPIB exposes {} fused device(s), 0 to {}",
                    self.devices.len(),
                    self.devices.len().saturating_sub(1)
                ))
            })
    }

    /// Stops and joins every thread of the plugin: the housekeeper, then each rail's fabric
    /// threads (a SUP NIC shared by several devices is stopped once, then found stopped).
    /// No-op when stopped already.
    fn stop_threads(&self) {
        let housekeeper = self
            .housekeeper
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        drop(housekeeper);
        for device in &self.devices {
            for rail in &device.devices {
                rail.stop_threads();
            }
        }
    }
}

/// A per-communicator context (v11+), or the process-wide one for older ABIs.
pub struct Context {
    /// Settings snapshot taken at this `init`.
    pub settings: Settings,
    /// Communicator id.
    pub comm_id: u64,
    /// Traffic class from the communicator config (-1 = undefined).
    pub traffic_class: i32,
    /// NCCL's profiler callback.
    pub profiler: Option<ProfilerCallback>,
    /// What NCCL last said about the communicator's operations (`setNetAttr`), read by every
    /// comm made with this context.
    pub(crate) attributes: Arc<NetAttributes>,
    pub(crate) plugin: Arc<Opened>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("comm_id", &self.comm_id)
            .field("settings", &self.settings)
            .finish()
    }
}

struct Global {
    opened: Option<Arc<Opened>>,
    references: usize,
}

static GLOBAL: Mutex<Global> = Mutex::new(Global {
    opened: None,
    references: 0,
});

/// Runs when the image is unloaded (`dlclose`) or the process exits, from the ELF fini array
/// (which, unlike an `atexit` hook or a thread-local destructor, does not pin the image): stops
/// every thread of a plugin that was never finalized — the housekeeper and the tcp fabric's rail
/// threads — as with ABI v7 ... v10, which have no `finalize`, so that no thread runs in code
/// about to be unmapped (tests/lifecycle.rs, every ABI on every fabric). Never blocks on a lock
/// another thread holds, never unwinds.
extern "C" fn stop_threads_at_unload() {
    let _ = std::panic::catch_unwind(|| {
        let global = match GLOBAL.try_lock() {
            Ok(global) => global,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return,
        };
        match &global.opened {
            Some(opened) if opened.opener == std::process::id() => opened.stop_threads(),
            // A forked child exiting: the threads were its parent's (joining them would hang).
            _ => {}
        }
    });
}

#[used]
#[link_section = ".fini_array"]
static STOP_THREADS_AT_UNLOAD: extern "C" fn() = stop_threads_at_unload;

fn global() -> MutexGuard<'static, Global> {
    // A panic while holding the lock cannot leave `Global` inconsistent (two plain fields).
    GLOBAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

pub(crate) fn init(params: InitParams) -> Result<Arc<Context>> {
    log::set_logger(params.logger);
    let settings = Settings::from_env()?;
    let mut global = global();
    let opened = match &global.opened {
        Some(opened) => Arc::clone(opened),
        None => {
            let opened = Arc::new(open(&settings)?);
            global.opened = Some(Arc::clone(&opened));
            opened
        }
    };
    global.references += 1;
    Ok(Arc::new(Context {
        settings,
        comm_id: params.comm_id,
        traffic_class: params.traffic_class,
        profiler: params.profiler,
        attributes: Arc::default(),
        plugin: opened,
    }))
}

pub(crate) fn finalize(ctx: Arc<Context>) -> Result<()> {
    let mut global = global();
    if global.references == 0 {
        return Err(Error::invalid_usage("finalize without a matching init"));
    }
    global.references -= 1;
    if global.references == 0 {
        // Comms still open keep their rails alive through their own references; the probes
        // file goes now (clean shutdown), its mapping when the last comm closes.
        if let Some(opened) = global.opened.take() {
            opened.telemetry.remove();
            // Now, not when the last reference goes: a connect NCCL abandoned half way keeps
            // one, and no thread may outlive the last finalize (a later dlclose unmaps its code).
            // A comm still open then fails its next call, saying the rail was stopped.
            opened.stop_threads();
        }
        info!(
            log::INIT,
            "finalized; rails closed once their last comm closes"
        );
    }
    drop(ctx);
    Ok(())
}

fn opened() -> Result<Arc<Opened>> {
    global()
        .opened
        .clone()
        .ok_or_else(|| Error::invalid_usage("the plugin is not initialised: call init first"))
}

pub(crate) fn device_count() -> Result<i32> {
    opened().map(|opened| i32::try_from(opened.devices.len()).unwrap_or(i32::MAX))
}

/// `maxComms`: the NICs' QPs and CQs over what a connection takes (src/net/setup/budget.rs), and
/// the receive connections their shared receive queues can serve; a shared SUP NIC's divided
/// among its devices.
fn max_comms(device: &FusedDevice, sharers: u32, per_comm: [Need; 2]) -> i32 {
    let [sout, sup] = &device.devices;
    let limits = [limits(sout.info()), limits(sup.info())];
    let by_objects = budget::max_comms(limits, sharers, per_comm);
    let by_queues = device
        .receives
        .iter()
        .zip([1, sharers])
        .map(|(receives, share)| receives.connections_at_most() / share)
        .min()
        .unwrap_or(u32::MAX);
    by_objects
        .min(i32::try_from(by_queues).unwrap_or(i32::MAX))
        .max(1)
}

pub(crate) fn properties(dev: i32) -> Result<Properties> {
    let opened = opened()?;
    let device = opened.device(dev)?;
    let [sout, sup] = &device.devices;
    let (sout, sup) = (sout.info(), sup.info());
    // A SUP NIC shared by several devices gives each its share of its speed and of its QPs.
    let sharers = device.sup_sharers.max(1);
    let speed = u64::from(sout.speed_mbps) + u64::from(sup.speed_mbps) / u64::from(sharers);
    let several = opened.devices.len() > 1;
    Ok(Properties {
        name: device.name.as_ptr(),
        pci_path: device
            .pci_path
            .as_ref()
            .map_or(std::ptr::null(), |p| p.as_ptr()),
        guid: sout.guid,
        ptr_support: crate::net::data::memory::pointer_support(&device.devices),
        reg_is_global: 0,
        force_flush: i32::from(opened.force_flush),
        speed: speed.min(i32::MAX as u64) as i32,
        port: i32::from(sout.port),
        latency: 0.0,
        max_comms: max_comms(device, sharers, opened.per_comm),
        max_recvs: MAX_RECVS as i32,
        // The device itself, as NCCL's own plugins report a device they expose: NCCL reads a
        // plugin's vProps only for devices made by makeVDevice (docs/NCCL_NET_ABI.md §1.7).
        vdev_count: 1,
        vdev_devices: [dev, 0],
        max_p2p_bytes: MAX_TRANSFER as usize,
        max_coll_bytes: MAX_TRANSFER as usize,
        max_multi_request_size: 1,
        // With several devices, the SOUT NIC's position in PCI order: device k is the same NIC
        // position on every host, what a rail-optimised fabric wires to one leaf (§1.7). One
        // device stays undefined, as it always was.
        rail_id: if several {
            i16::try_from(dev).unwrap_or(-1)
        } else {
            -1
        },
        plane_id: -1,
    })
}

fn open(settings: &Settings) -> Result<Opened> {
    // Logged: the first open of a process is the slowest call of a run (on the rig, libibverbs'
    // first device list, which loads every provider library, takes 105-160 ms; RELIABILITY.md).
    let started = std::time::Instant::now();
    descriptors::raise_soft_limit();
    let fabric: Arc<dyn Fabric> = crate::fabric::select(settings)?;
    let fused = devices::open(&fabric, settings)?;
    // "opened mlx5_0+mlx5_1 on the verbs fabric ...": the form scripts/nccl/check_lib.py reads
    // (the device names, comma-separated, are one word).
    let names: Vec<String> = fused.devices.iter().map(|d| d.label()).collect();
    let speeds: Vec<String> = fused
        .nics
        .iter()
        .map(|nic| {
            let info = nic.device.info();
            match fused.devices.len() {
                1 => format!("{} {} Mbps", nic.rail, info.speed_mbps),
                _ => format!("{} {} {} Mbps", nic.rail, info.name, info.speed_mbps),
            }
        })
        .collect();
    info!(
        log::INIT,
        "opened {} on the {} fabric in {} ms: {}",
        names.join(","),
        fabric.name(),
        started.elapsed().as_millis(),
        speeds.join(", ")
    );
    let telemetry = Arc::new(Telemetry::open(settings, &fused.nics, &fused.devices));
    for (slot, nic) in fused.nics.iter().enumerate() {
        nic.registrations.observe(Arc::clone(&telemetry), slot);
    }
    let housekeeper = Housekeeper::start(Watched {
        nics: fused
            .nics
            .iter()
            .map(|nic| (Arc::clone(&nic.device), Arc::clone(&nic.health), nic.rail))
            .collect(),
        telemetry: Arc::clone(&telemetry),
    })?;
    Ok(Opened {
        // A receiving comm with both rails takes the most: what maxComms divides by.
        per_comm: Need::of(
            QpLayout::new(
                settings.sout_qps,
                settings.sup_qps,
                crate::params::Mode::Advanced,
                crate::proto::island::PathClass::IntraIsland,
            ),
            true,
            settings.force_flush,
        ),
        housekeeper: Mutex::new(Some(housekeeper)),
        opener: std::process::id(),
        _fabric: fabric,
        devices: fused.devices,
        force_flush: settings.force_flush,
        telemetry,
    })
}
