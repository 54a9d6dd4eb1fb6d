//! The production backend of the fabric seam: real libibverbs through `rdma-sys`. This is the
//! only module of the project that names `rdma_sys`.
//!
//! # Ownership
//! Every verbs object is wrapped in a type whose `Drop` destroys it, and children hold their
//! parents through `Arc`, so teardown order follows from ownership (as in rust-ibverbs):
//!
//! ```text
//! VerbsDevice ─▶ DeviceInner (context, PD, MR table)
//! VerbsCq ─▶ CqInner ─▶ DeviceInner        VerbsSrq ─▶ SrqInner ─▶ DeviceInner
//! VerbsQp ─▶ CqInner, SrqInner, DeviceInner
//! ```
//!
//! A QP is destroyed before the CQ and SRQ it uses even if the engine drops their handles
//! first; memory registrations still open when the device goes away are deregistered before
//! its PD. Teardown failures are logged (WARN, `NCCL_NET`) and counted
//! ([`VerbsFabric::teardown_failures`]), never panicked on.
//!
//! # Versions
//! Only IBVERBS_1.0/1.1 symbols are linked; newer verbs are found at run time (see
//! [`VerbsFabric::symbol_support`]). The `static inline` data-path verbs are called through the
//! provider's ops table, as `verbs.h` does. No thread is ever started: async events are read
//! without blocking by [`RailDevice::next_async_event`].
//!
//! # Errors
//! Every [`FabricError`] names the verb (`ibv_modify_qp(RTR)`, ...), the device as
//! `name:port (rail)`, the QP number when there is one, the errno and a detail.

mod attrs;
mod device;
mod endpoint;
mod events;
pub use endpoint::PortAddress;
mod gid;
mod library;
mod memory;
mod neighbour;
mod qp;
mod queues;
mod sys;
#[cfg(test)]
mod tests;

use std::ffi::CStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use library::{ibv_free_device_list, ibv_get_device_list, ibv_get_device_name};
use rdma_sys::ibv_device;

use super::{Fabric, FabricError, FabricResult, Rail, RailDevice};
use crate::log;
use crate::params::Settings;

pub use self::device::VerbsDevice;
pub use self::memory::gdr_supported;
pub use self::qp::VerbsQp;
pub use self::queues::{VerbsCq, VerbsSrq};
pub use self::sys::SymbolSupport;

/// Teardown failures since the image was loaded (destroy/dealloc/dereg verbs that failed).
static TEARDOWN_FAILURES: AtomicU64 = AtomicU64::new(0);

/// Records a failed teardown verb: WARN log and the counter.
pub(crate) fn teardown_failed(verb: &str, device: &str, rc: i32) {
    TEARDOWN_FAILURES.fetch_add(1, Ordering::Relaxed);
    let errno = sys::rc_errno(rc);
    warn!(
        log::NET,
        "teardown: {verb} failed on device {device}: errno {errno} ({})",
        std::io::Error::from_raw_os_error(errno)
    );
}

/// Builds a [`FabricError`].
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

/// The libibverbs backend (`MPIB_FABRIC=verbs`, the default).
#[derive(Debug)]
pub struct VerbsFabric {
    /// `MPIB_IB_GID_INDEX`.
    gid_index: Option<u8>,
    /// `MPIB_IB_PCI_RELAXED_ORDERING` (0 off, 1 required, 2 when available).
    relaxed_ordering: u8,
    /// `MPIB_SYSFS`: where devices' PCI paths are found.
    sysfs: String,
}

impl VerbsFabric {
    /// Creates the backend with the transport settings it needs at open and registration time.
    /// Finding no device is not an error here: [`Fabric::open`] reports it with the (empty)
    /// list of devices.
    ///
    /// # Errors
    /// libibverbs cannot be loaded (the error names it and its package), or
    /// `MPIB_IB_PCI_RELAXED_ORDERING` outside 0..=2.
    pub fn new(settings: &Settings) -> Result<VerbsFabric, FabricError> {
        // Opened here, not linked: without rdma-core only this fabric is unavailable.
        if let Err(why) = library::load() {
            return Err(fabric_error("dlopen", "-", None, libc::ENOENT, why));
        }
        if settings.relaxed_ordering > 2 {
            return Err(fabric_error(
                "ibv_reg_mr_iova2",
                "-",
                None,
                libc::EINVAL,
                format!(
                    "MPIB_IB_PCI_RELAXED_ORDERING={} (expected 0, 1 or 2)",
                    settings.relaxed_ordering
                ),
            ));
        }
        let support = sys::symbol_support();
        info!(
            log::INIT,
            "verbs: libibverbs has ibv_reg_mr_iova2: {}, ibv_reg_dmabuf_mr: {}, ibv_query_port_speed: {}; GPUDirect RDMA (peermem): {}",
            support.reg_mr_iova2,
            support.reg_dmabuf_mr,
            support.query_port_speed,
            gdr_supported()
        );
        Ok(VerbsFabric {
            gid_index: settings.gid_index,
            relaxed_ordering: settings.relaxed_ordering,
            sysfs: settings.sysfs.clone(),
        })
    }

    /// Which optional libibverbs entry points the loaded library provides.
    pub fn symbol_support() -> SymbolSupport {
        // Without libibverbs there is no optional verb either: the flags read false.
        let _ = library::load();
        sys::symbol_support()
    }

    /// Opens `spec` (`name` or `name:port`, port 1 by default) as `rail`, returning the
    /// concrete device: [`Fabric::open`] without the type erasure, so that the engine can ask
    /// [`VerbsDevice::dmabuf_supported`] for `ptrSupport`.
    ///
    /// # Errors
    /// An unknown name (the detail lists the devices that exist), a port that is not ACTIVE,
    /// no usable GID, or a failed verb.
    pub fn open_device(&self, spec: &str, rail: Rail) -> FabricResult<Arc<VerbsDevice>> {
        let (name, port) = parse_spec(spec)?;
        let list = DeviceList::get().map_err(|errno| {
            fabric_error(
                "ibv_get_device_list",
                spec,
                None,
                errno,
                "no RDMA subsystem (available devices: none)",
            )
        })?;
        let Some(device) = list.find(name) else {
            let names = list.names();
            let available = if names.is_empty() {
                "none".to_string()
            } else {
                names.join(", ")
            };
            return Err(fabric_error(
                "ibv_open_device",
                spec,
                None,
                libc::ENODEV,
                format!("no RDMA device named `{name}`; available devices: {available}"),
            ));
        };
        let options = device::OpenOptions {
            port,
            rail,
            gid_index: self.gid_index,
            relaxed_ordering: self.relaxed_ordering,
            sysfs: &self.sysfs,
        };
        // SAFETY: `device` comes from the list, which stays alive until after the open.
        let opened = unsafe { VerbsDevice::open(device, name, options) }?;
        drop(list);
        Ok(Arc::new(opened))
    }

    /// Number of teardown verbs (destroy, dealloc, dereg, close) that failed so far.
    pub fn teardown_failures() -> u64 {
        TEARDOWN_FAILURES.load(Ordering::Relaxed)
    }
}

impl Fabric for VerbsFabric {
    fn name(&self) -> &'static str {
        "verbs"
    }

    fn device_names(&self) -> Vec<String> {
        DeviceList::get().map(|l| l.names()).unwrap_or_default()
    }

    fn open(&self, spec: &str, rail: Rail) -> FabricResult<Arc<dyn RailDevice>> {
        let device: Arc<dyn RailDevice> = self.open_device(spec, rail)?;
        Ok(device)
    }

    fn places_by_pci(&self) -> bool {
        true
    }
}

/// Splits `name` or `name:port` (port 1 by default).
pub(crate) fn parse_spec(spec: &str) -> FabricResult<(&str, u8)> {
    let spec = spec.trim();
    let bad = |detail: String| fabric_error("ibv_open_device", spec, None, libc::EINVAL, detail);
    let (name, port) = match spec.split_once(':') {
        None => (spec, 1),
        Some((name, port)) => match port.trim().parse::<u8>() {
            Ok(p) if p >= 1 => (name, p),
            _ => return Err(bad(format!("`{port}` is not a port number (1-255)"))),
        },
    };
    if name.is_empty() {
        return Err(bad("empty device name".to_string()));
    }
    Ok((name, port))
}

/// The result of `ibv_get_device_list`, freed on drop.
struct DeviceList {
    list: *mut *mut ibv_device,
    len: usize,
}

impl DeviceList {
    /// Lists the devices; `Err(errno)` when libibverbs cannot (no RDMA subsystem at all).
    fn get() -> Result<DeviceList, i32> {
        let mut count: std::ffi::c_int = 0;
        sys::clear_errno();
        // SAFETY: `count` is a valid out-parameter; the returned array is owned by `DeviceList`.
        let list = unsafe { ibv_get_device_list(&mut count) };
        if list.is_null() {
            return Err(sys::errno());
        }
        Ok(DeviceList {
            list,
            len: usize::try_from(count).unwrap_or(0),
        })
    }

    /// The device pointers.
    fn devices(&self) -> impl Iterator<Item = *mut ibv_device> + '_ {
        // SAFETY: `list` holds `len` valid device pointers while `self` lives.
        (0..self.len).map(move |i| unsafe { *self.list.add(i) })
    }

    /// Name of one device of the list.
    fn name_of(device: *mut ibv_device) -> String {
        // SAFETY: `device` comes from a live list; the name is a NUL-terminated string it owns.
        let name = unsafe { ibv_get_device_name(device) };
        if name.is_null() {
            return String::new();
        }
        // SAFETY: non-null, NUL-terminated, alive as long as the list.
        unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned()
    }

    fn names(&self) -> Vec<String> {
        self.devices().map(DeviceList::name_of).collect()
    }

    fn find(&self, name: &str) -> Option<*mut ibv_device> {
        self.devices().find(|d| DeviceList::name_of(*d) == name)
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: `list` came from ibv_get_device_list and is freed exactly once.
        unsafe { ibv_free_device_list(self.list) };
    }
}
