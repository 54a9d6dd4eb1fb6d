//! [`Net`]: one version-neutral driver over the six exported tables `ncclNet_v7_t` … `_v12_t`.
//!
//! Each method converts its arguments the way NCCL's per-version shims do (`int` sizes for v7/v8
//! with the 1 GiB refusal, the v10 `connect` config, the v11+ context), calls the slot through the
//! table read live from the exported static, and turns a non-zero `ncclResult_t` into
//! [`Error::Nccl`] naming the version and call. The `*_raw` methods return the code untouched and
//! accept NULL arguments, for conformance tests.

use std::cell::{Cell, RefCell};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::marker::PhantomData;
use std::ptr::{self, NonNull};
use std::time::{Duration, Instant};

use crate::abi::*;
use crate::env;
use crate::error::{Error, Result};
use crate::plugin::{Plugin, Version};

#[derive(Clone, Copy)]
enum Table {
    V7(*const NetV7),
    V8(*const NetV8),
    V9(*const NetV9),
    V10(*const NetV10),
    V11(*const NetV11),
    V12(*const NetV12),
}

/// Reads a slot whose type is the same in every version.
macro_rules! common_slot {
    ($net:expr, $slot:ident) => {
        // SAFETY: the table pointer is the exported static of exactly this version (see
        // `Net::from_table`), alive while the borrowed `Plugin` is loaded.
        unsafe {
            match $net.table {
                Table::V7(t) => (*t).$slot,
                Table::V8(t) => (*t).$slot,
                Table::V9(t) => (*t).$slot,
                Table::V10(t) => (*t).$slot,
                Table::V11(t) => (*t).$slot,
                Table::V12(t) => (*t).$slot,
            }
        }
    };
}

mod data;
mod props;

use props::props_from;

/// An opaque listen comm.
#[derive(Debug)]
pub struct ListenComm(NonNull<c_void>);
/// An opaque send comm.
#[derive(Debug)]
pub struct SendComm(NonNull<c_void>);
/// An opaque receive comm.
#[derive(Debug)]
pub struct RecvComm(NonNull<c_void>);
/// A memory registration (`mhandle`).
#[derive(Debug)]
pub struct MemHandle(*mut c_void);
/// An outstanding request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request(NonNull<c_void>);

macro_rules! as_ptr {
    ($($ty:ident),*) => {$(
        impl $ty {
            /// The plugin's pointer.
            pub fn as_ptr(&self) -> *mut c_void {
                self.0.as_ptr()
            }
        }
    )*};
}
as_ptr!(ListenComm, SendComm, RecvComm, Request);

impl MemHandle {
    /// The plugin's pointer.
    pub fn as_ptr(&self) -> *mut c_void {
        self.0
    }
}

/// A comm that `regMr`/`deregMr` accept (send or receive).
pub trait DataComm {
    /// The plugin's pointer.
    fn comm_ptr(&self) -> *mut c_void;
}
impl DataComm for SendComm {
    fn comm_ptr(&self) -> *mut c_void {
        self.as_ptr()
    }
}
impl DataComm for RecvComm {
    fn comm_ptr(&self) -> *mut c_void {
        self.as_ptr()
    }
}

/// One buffer of a (grouped) receive or flush.
#[derive(Clone, Copy, Debug)]
pub struct RecvBuf {
    /// Destination.
    pub data: *mut c_void,
    /// Capacity in bytes.
    pub size: usize,
    /// Tag the matching `isend` carries.
    pub tag: i32,
    /// Registration covering the buffer.
    pub mhandle: *mut c_void,
}

/// A per-communicator context from `init` (v11+); a placeholder for older versions.
#[derive(Debug)]
pub struct NetCtx {
    ptr: *mut c_void,
    comm_id: u64,
    _config: Box<CommConfig>,
}

impl NetCtx {
    /// The plugin's context pointer (NULL before v11).
    pub fn as_ptr(&self) -> *mut c_void {
        self.ptr
    }
    /// The communicator id passed to `init`.
    pub fn comm_id(&self) -> u64 {
        self.comm_id
    }
}

/// `getProperties`, whatever the version; fields a version lacks are `None`.
#[allow(missing_docs)]
#[derive(Clone, Debug, PartialEq)]
pub struct Props {
    pub name: String,
    pub pci_path: Option<String>,
    pub guid: u64,
    pub ptr_support: i32,
    pub reg_is_global: Option<i32>,
    pub force_flush: Option<i32>,
    pub speed: i32,
    pub port: i32,
    pub latency: f32,
    pub max_comms: i32,
    pub max_recvs: i32,
    pub net_device_type: i32,
    pub net_device_version: i32,
    /// `vProps.ndevs` and the first `ndevs` entries (clamped to the array length).
    pub vprops: Option<(i32, Vec<i32>)>,
    pub max_p2p_bytes: Option<usize>,
    pub max_coll_bytes: Option<usize>,
    pub max_multi_request_size: Option<i32>,
    pub rail_id: Option<i16>,
    pub plane_id: Option<i16>,
}

/// How long one kind of exported call took: the slowest call and how many there were.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallTime {
    /// The slowest single call.
    pub slowest: Duration,
    /// Calls made.
    pub calls: u64,
}

/// A version-neutral view of one exported table.
pub struct Net<'p> {
    version: Version,
    table: Table,
    initialized: Cell<bool>,
    call_times: RefCell<Vec<(&'static str, CallTime)>>,
    connect_config: Box<CommConfig>,
    _plugin: PhantomData<&'p Plugin>,
}

fn undef_config() -> Box<CommConfig> {
    Box::new(CommConfig {
        traffic_class: TRAFFIC_CLASS_UNDEF,
    })
}

fn c_string(p: *const c_char) -> Option<String> {
    // SAFETY: the plugin hands out NUL-terminated strings valid while it is loaded.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// Names the NULL slots among the required ones of the table at `$t` (plus `$extra`).
macro_rules! missing_slots {
    ($t:expr $(, $extra:ident)*) => {{
        // SAFETY: see `common_slot!`.
        let t = unsafe { &*$t };
        let slots = [
            ("init", t.init.is_some()),
            ("devices", t.devices.is_some()),
            ("getProperties", t.get_properties.is_some()),
            ("listen", t.listen.is_some()),
            ("connect", t.connect.is_some()),
            ("accept", t.accept.is_some()),
            ("regMr", t.reg_mr.is_some()),
            ("deregMr", t.dereg_mr.is_some()),
            ("isend", t.isend.is_some()),
            ("irecv", t.irecv.is_some()),
            ("iflush", t.iflush.is_some()),
            ("test", t.test.is_some()),
            ("closeSend", t.close_send.is_some()),
            ("closeRecv", t.close_recv.is_some()),
            ("closeListen", t.close_listen.is_some()),
            $((stringify!($extra), t.$extra.is_some()),)*
        ];
        slots.into_iter().filter(|(_, set)| !set).map(|(name, _)| name).collect::<Vec<_>>()
    }};
}

impl Net<'_> {
    /// # Safety
    /// `table` must be the address of the exported `ncclNet_vN_t` for `version`, valid for as
    /// long as the returned `Net` lives.
    pub(crate) unsafe fn from_table(version: Version, table: *const c_void) -> Self {
        let table = match version {
            Version::V7 => Table::V7(table.cast()),
            Version::V8 => Table::V8(table.cast()),
            Version::V9 => Table::V9(table.cast()),
            Version::V10 => Table::V10(table.cast()),
            Version::V11 => Table::V11(table.cast()),
            Version::V12 => Table::V12(table.cast()),
        };
        Net {
            version,
            table,
            initialized: Cell::new(false),
            call_times: RefCell::new(Vec::new()),
            connect_config: undef_config(),
            _plugin: PhantomData,
        }
    }

    /// The ABI version driven.
    pub fn version(&self) -> Version {
        self.version
    }

    /// Run one exported call, keeping its duration: the slowest of each kind and how many
    /// (NCCL's proxy thread drives everything from one thread, so no call may wait).
    pub(crate) fn timed<T>(&self, call: &'static str, f: impl FnOnce() -> T) -> T {
        let started = Instant::now();
        let out = f();
        let took = started.elapsed();
        let mut times = self.call_times.borrow_mut();
        match times.iter_mut().find(|(name, _)| *name == call) {
            Some((_, time)) => {
                time.calls += 1;
                time.slowest = time.slowest.max(took);
            }
            None => times.push((
                call,
                CallTime {
                    slowest: took,
                    calls: 1,
                },
            )),
        }
        out
    }

    /// The slowest duration and the number of every exported call made through this `Net` so
    /// far, by the call's name in the ABI (`connect`, `accept`, `isend`, `test`, ...).
    pub fn call_times(&self) -> Vec<(&'static str, CallTime)> {
        self.call_times.borrow().clone()
    }

    /// The slowest single call so far, with its name.
    pub fn slowest_call(&self) -> Option<(&'static str, Duration)> {
        self.call_times
            .borrow()
            .iter()
            .map(|(name, time)| (*name, time.slowest))
            .max_by_key(|(_, slowest)| *slowest)
    }

    fn need<F>(&self, f: Option<F>, slot: &'static str) -> Result<F> {
        f.ok_or(Error::NullSlot {
            version: self.version,
            slot,
        })
    }

    fn check(
        &self,
        code: NcclResult,
        call: &'static str,
        detail: impl FnOnce() -> String,
    ) -> Result<()> {
        if code == NCCL_SUCCESS {
            Ok(())
        } else {
            Err(Error::Nccl {
                version: self.version,
                call,
                code,
                detail: detail(),
            })
        }
    }

    fn int_size(&self, size: usize, what: &str) -> Result<c_int> {
        if self.version.int_sizes() && size > MAX_NET_SIZE {
            return Err(Error::Refused(format!(
                "{what} of {size} bytes on {}: NCCL refuses sizes over 1 GiB for pre-v9 plugins",
                self.version
            )));
        }
        c_int::try_from(size)
            .map_err(|_| Error::Refused(format!("{what} of {size} bytes does not fit an int")))
    }

    /// The `name` field.
    pub fn name(&self) -> String {
        let name = common_slot!(self, name);
        c_string(name).unwrap_or_default()
    }

    /// Checks that every slot NCCL calls without a NULL check is set (sheet §1.6).
    pub fn check_required_slots(&self) -> Result<()> {
        let missing = match self.table {
            Table::V7(t) => missing_slots!(t),
            Table::V8(t) => missing_slots!(t),
            Table::V9(t) => missing_slots!(t),
            Table::V10(t) => missing_slots!(t),
            Table::V11(t) => missing_slots!(t, finalize),
            Table::V12(t) => missing_slots!(t, finalize),
        };
        match missing.first() {
            None => Ok(()),
            Some(slot) => Err(Error::NullSlot {
                version: self.version,
                slot,
            }),
        }
    }

    /// `init` with the process environment as it is (under the driver's env lock).
    pub fn init(&self, comm_id: u64) -> Result<NetCtx> {
        self.init_with_env(comm_id, &[])
    }

    /// `init` with `vars` applied to the process environment for the duration of the call (the
    /// plugin snapshots `MPIB_*` at `init`), restored afterwards. v11/v12: every call is a new
    /// communicator context (`commId`, config `{trafficClass: -1}`, NULL logger and profiler).
    /// Older versions: the plugin's `init` runs once per `Net` (NCCL calls it once per process);
    /// later calls return a placeholder context.
    pub fn init_with_env(&self, comm_id: u64, vars: &[(&str, Option<&str>)]) -> Result<NetCtx> {
        let mut config = undef_config();
        let config_ptr: *mut CommConfig = &mut *config;
        let mut ctx: *mut c_void = ptr::null_mut();
        let lock = env::lock();
        let saved = env::apply(&lock, vars);
        let outcome = self.call_init(comm_id, config_ptr, &mut ctx);
        env::restore(&lock, saved);
        drop(lock);
        outcome?;
        self.initialized.set(true);
        Ok(NetCtx {
            ptr: ctx,
            comm_id,
            _config: config,
        })
    }

    fn call_init(
        &self,
        comm_id: u64,
        config: *mut CommConfig,
        ctx: &mut *mut c_void,
    ) -> Result<()> {
        let code = self.timed("init", || -> Result<NcclResult> {
            // SAFETY: (all arms) the table is the exported static of this version; the arguments are
            // valid pointers or the NULL callbacks the ABI allows.
            Ok(unsafe {
                match self.table {
                    Table::V11(t) => {
                        self.need((*t).init, "init")?(ctx, comm_id, config, None, None)
                    }
                    Table::V12(t) => {
                        self.need((*t).init, "init")?(ctx, comm_id, config, None, None)
                    }
                    _ if self.initialized.get() => NCCL_SUCCESS,
                    Table::V10(t) => self.need((*t).init, "init")?(None, None),
                    Table::V9(t) => self.need((*t).init, "init")?(None),
                    Table::V8(t) => self.need((*t).init, "init")?(None),
                    Table::V7(t) => self.need((*t).init, "init")?(None),
                }
            })
        })?;
        self.check(code, "init", || format!("commId {comm_id:#x}"))
    }

    /// `finalize(ctx)` for v11/v12; nothing for older versions (NCCL emulates it).
    pub fn finalize(&self, ctx: NetCtx) -> Result<()> {
        let f = match self.table {
            // SAFETY: see `common_slot!`.
            Table::V11(t) => unsafe { (*t).finalize },
            // SAFETY: see `common_slot!`.
            Table::V12(t) => unsafe { (*t).finalize },
            _ => return Ok(()),
        };
        let f = self.need(f, "finalize")?;
        // SAFETY: `ctx` came from this table's `init` and is finalized once (taken by value).
        let code = self.timed("finalize", || unsafe { f(ctx.ptr) });
        self.check(code, "finalize", || format!("commId {:#x}", ctx.comm_id))
    }

    /// `setNetAttr(ctx, attr)` (v11, v12), as NCCL's proxy calls it before operations whose
    /// attributes changed; refused for older versions, whose tables have no such entry.
    pub fn set_net_attr(&self, ctx: &NetCtx, attr: &crate::abi::NetAttr) -> Result<()> {
        let f = match self.table {
            // SAFETY: see `common_slot!`.
            Table::V11(t) => unsafe { (*t).set_net_attr },
            // SAFETY: see `common_slot!`.
            Table::V12(t) => unsafe { (*t).set_net_attr },
            _ => {
                let version = self.version;
                return Err(Error::Refused(format!("{version:?} has no setNetAttr")));
            }
        };
        let f = self.need(f, "setNetAttr")?;
        let mut attr = *attr;
        // SAFETY: `ctx` came from this table's `init` and is live; `attr` is a valid struct.
        let code = self.timed("setNetAttr", || unsafe { f(ctx.ptr, &mut attr) });
        self.check(code, "setNetAttr", || format!("{attr:?}"))
    }

    /// `devices(ndev)` with a caller-chosen pointer (may be NULL).
    ///
    /// # Safety
    /// `out` is NULL or valid for writing an `int`.
    pub unsafe fn devices_raw(&self, out: *mut c_int) -> Result<NcclResult> {
        let f = self.need(common_slot!(self, devices), "devices")?;
        // SAFETY: forwarded to the caller's contract.
        Ok(unsafe { f(out) })
    }

    /// `devices`.
    pub fn devices(&self) -> Result<i32> {
        let mut n: c_int = -1;
        // SAFETY: `n` is a valid int.
        let code = unsafe { self.devices_raw(&mut n) }?;
        self.check(code, "devices", String::new)?;
        Ok(n)
    }

    /// `getProperties(dev, props)` with a caller-chosen pointer (may be NULL).
    ///
    /// # Safety
    /// `props` is NULL or valid for writing this version's properties struct.
    pub unsafe fn get_properties_raw(&self, dev: i32, props: *mut c_void) -> Result<NcclResult> {
        macro_rules! go {
            ($t:expr) => {{
                // SAFETY: table validity as in `common_slot!`; `props` per the caller's contract.
                unsafe { self.need((*$t).get_properties, "getProperties")?(dev, props.cast()) }
            }};
        }
        Ok(match self.table {
            Table::V7(t) => go!(t),
            Table::V8(t) => go!(t),
            Table::V9(t) => go!(t),
            Table::V10(t) => go!(t),
            Table::V11(t) => go!(t),
            Table::V12(t) => go!(t),
        })
    }

    /// `getProperties(dev)`, converted to [`Props`].
    pub fn get_properties(&self, dev: i32) -> Result<Props> {
        // Big enough and aligned for every version's struct; zeroed so unset pointers read NULL.
        let mut raw = [0u64; 16];
        // SAFETY: `raw` is 128 bytes, 8-aligned: the largest properties struct (v12).
        let code = unsafe { self.get_properties_raw(dev, raw.as_mut_ptr().cast()) }?;
        self.check(code, "getProperties", || format!("dev {dev}"))?;
        // SAFETY: the plugin filled the struct for this version; the reads match its layout.
        Ok(unsafe { props_from(self.version, raw.as_ptr().cast()) })
    }

    /// `makeVDevice(&d, {ndevs, devs})` (v9+).
    pub fn make_vdevice(&self, devs: &[i32]) -> Result<i32> {
        let mut d: c_int = -1;
        let ndevs = devs.len() as c_int;
        macro_rules! v9 {
            ($t:expr) => {{
                let mut props = VDevicePropsV9 {
                    ndevs,
                    devs: [0; 4],
                };
                props
                    .devs
                    .iter_mut()
                    .zip(devs)
                    .for_each(|(slot, dev)| *slot = *dev);
                // SAFETY: see `common_slot!`; `d` and `props` are valid for the call.
                unsafe { self.need((*$t).make_vdevice, "makeVDevice")?(&mut d, &mut props) }
            }};
        }
        let code = match self.table {
            Table::V7(_) | Table::V8(_) => {
                return Err(Error::Refused(format!(
                    "{} has no makeVDevice",
                    self.version
                )))
            }
            Table::V9(t) => v9!(t),
            Table::V10(t) => v9!(t),
            Table::V11(t) => v9!(t),
            Table::V12(t) => {
                let mut props = VDevicePropsV12 {
                    ndevs,
                    devs: [0; 8],
                };
                props
                    .devs
                    .iter_mut()
                    .zip(devs)
                    .for_each(|(slot, dev)| *slot = *dev);
                // SAFETY: as above.
                unsafe { self.need((*t).make_vdevice, "makeVDevice")?(&mut d, &mut props) }
            }
        };
        self.check(code, "makeVDevice", || format!("devs {devs:?}"))?;
        Ok(d)
    }
}
