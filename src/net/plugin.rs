//! Process-global plugin state: devices opened at the first `init`, released at the last
//! `finalize`; per-communicator contexts snapshot the settings.

use std::ffi::c_void;
use std::sync::Arc;

use crate::error::Result;
use crate::params::Settings;

use super::Properties;

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

/// A per-communicator context (v11+), or the process-wide one for older ABIs.
#[derive(Debug)]
pub struct Context {
    /// Settings snapshot taken at this `init`.
    pub settings: Settings,
    /// Communicator id.
    pub comm_id: u64,
    /// Traffic class from the communicator config (-1 = undefined).
    pub traffic_class: i32,
    /// NCCL's profiler callback.
    pub profiler: Option<ProfilerCallback>,
}

pub(super) fn init(params: InitParams) -> Result<Arc<Context>> {
    let _ = params;
    todo!()
}

pub(super) fn finalize(ctx: Arc<Context>) -> Result<()> {
    let _ = ctx;
    todo!()
}

pub(super) fn device_count() -> Result<i32> {
    todo!()
}

pub(super) fn properties(dev: i32) -> Result<Properties> {
    let _ = dev;
    todo!()
}
