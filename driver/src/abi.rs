//! An independent `#[repr(C)]` view of the NCCL net-plugin ABI, v7 … v12, written from the fact
//! sheet (`docs/NCCL_NET_ABI.md` §1.3–1.4), not from the plugin's own definitions. The size and
//! offset assertions at the bottom are the x86-64 numbers the sheet measured with gcc.

#![allow(missing_docs)]

use std::ffi::{c_char, c_int, c_ulong, c_void};

/// `ncclResult_t`.
pub type NcclResult = c_int;

/// `ncclSuccess`.
pub const NCCL_SUCCESS: NcclResult = 0;
/// `ncclSystemError`.
pub const NCCL_SYSTEM_ERROR: NcclResult = 2;
/// `ncclInternalError`.
pub const NCCL_INTERNAL_ERROR: NcclResult = 3;
/// `ncclInvalidArgument`.
pub const NCCL_INVALID_ARGUMENT: NcclResult = 4;
/// `ncclInvalidUsage`.
pub const NCCL_INVALID_USAGE: NcclResult = 5;
/// `ncclRemoteError`.
pub const NCCL_REMOTE_ERROR: NcclResult = 6;

/// `NCCL_NET_HANDLE_MAXSIZE`.
pub const HANDLE_SIZE: usize = 128;
/// `NCCL_NET_MAX_REQUESTS`: outstanding requests NCCL keeps per comm.
pub const NCCL_NET_MAX_REQUESTS: usize = 32;
/// Request slots per comm in net_ib-style plugins (32 × `maxRecvs` 8).
pub const PLUGIN_REQUEST_SLOTS: usize = 256;
/// `NCCL_PROXY_MAX_SUBS`: length of the sizes array NCCL passes to `test` for receives.
pub const PROXY_MAX_SUBS: usize = 64;
/// `NCCL_PTR_HOST`.
pub const NCCL_PTR_HOST: c_int = 0x1;
/// `NCCL_PTR_CUDA`.
pub const NCCL_PTR_CUDA: c_int = 0x2;
/// `NCCL_PTR_DMABUF`.
pub const NCCL_PTR_DMABUF: c_int = 0x4;
/// `NCCL_NET_DEVICE_HOST`.
pub const NCCL_NET_DEVICE_HOST: c_int = 0;
/// `NCCL_MAX_NET_SIZE_BYTES`: the largest `maxP2pBytes` NCCL accepts (1 TiB).
pub const NCCL_MAX_NET_SIZE_BYTES: usize = 1 << 40;
/// `MAX_NET_SIZE`: NCCL rejects larger `isend`/`irecv` sizes for pre-v9 plugins (1 GiB).
pub const MAX_NET_SIZE: usize = 1 << 30;
/// `NCCL_NET_TRAFFIC_CLASS_UNDEF`.
pub const TRAFFIC_CLASS_UNDEF: c_int = -1;

/// Human name of an `ncclResult_t`.
pub fn result_name(code: NcclResult) -> &'static str {
    match code {
        0 => "ncclSuccess",
        1 => "ncclUnhandledCudaError",
        2 => "ncclSystemError",
        3 => "ncclInternalError",
        4 => "ncclInvalidArgument",
        5 => "ncclInvalidUsage",
        6 => "ncclRemoteError",
        7 => "ncclInProgress",
        8 => "ncclTimeout",
        _ => "unknown ncclResult_t",
    }
}

/// `ncclDebugLogger_t`: C-variadic. The driver always passes NULL (the plugin then logs WARN to
/// stderr); the type is here so the table layouts are exact.
pub type Logger = Option<
    unsafe extern "C" fn(
        level: c_int,
        flags: c_ulong,
        file: *const c_char,
        line: c_int,
        fmt: *const c_char,
        ...
    ),
>;

/// `ncclProfilerCallback_t` (v10+). The driver passes NULL.
pub type ProfilerCallback = Option<
    unsafe extern "C" fn(
        event_handle: *mut *mut c_void,
        event_type: c_int,
        parent: *mut c_void,
        plugin_id: i64,
        data: *mut c_void,
    ) -> NcclResult,
>;

/// `ncclNetProperties_v7_t` (56 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PropertiesV7 {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
    pub net_device_type: c_int,
    pub net_device_version: c_int,
}

/// `ncclNetProperties_v8_t` (64 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PropertiesV8 {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub reg_is_global: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
    pub net_device_type: c_int,
    pub net_device_version: c_int,
}

/// `ncclNetVDeviceProps_v9_t` … `_v11_t` (4 devices, 20 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct VDevicePropsV9 {
    pub ndevs: c_int,
    pub devs: [c_int; 4],
}

/// `ncclNetVDeviceProps_v12_t` (8 devices, 36 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct VDevicePropsV12 {
    pub ndevs: c_int,
    pub devs: [c_int; 8],
}

/// `ncclNetProperties_v9_t` = `_v10_t` (104 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PropertiesV9 {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub reg_is_global: c_int,
    pub force_flush: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
    pub net_device_type: c_int,
    pub net_device_version: c_int,
    pub vprops: VDevicePropsV9,
    pub max_p2p_bytes: usize,
    pub max_coll_bytes: usize,
}

/// `ncclNetProperties_v11_t` (112 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PropertiesV11 {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub reg_is_global: c_int,
    pub force_flush: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
    pub net_device_type: c_int,
    pub net_device_version: c_int,
    pub vprops: VDevicePropsV9,
    pub max_p2p_bytes: usize,
    pub max_coll_bytes: usize,
    pub max_multi_request_size: c_int,
}

/// `ncclNetProperties_v12_t` (128 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PropertiesV12 {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub reg_is_global: c_int,
    pub force_flush: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
    pub net_device_type: c_int,
    pub net_device_version: c_int,
    pub vprops: VDevicePropsV12,
    pub max_p2p_bytes: usize,
    pub max_coll_bytes: usize,
    pub max_multi_request_size: c_int,
    pub rail_id: i16,
    pub plane_id: i16,
}

/// `ncclNetCommConfig_v10_t` … `_v12_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CommConfig {
    pub traffic_class: c_int,
}

/// `ncclNetCommAttr` (v11+).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommAttr {
    pub max_concurrent_peers: i32,
    pub min_concurrent_peers: i32,
    pub max_flows_per_peer: i32,
    pub min_flows_per_peer: i32,
}

/// `ncclNetAttr_v11_t` = `_v12_t` (44 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NetAttr {
    pub send_comm_attr: CommAttr,
    pub recv_comm_attr: CommAttr,
    pub op: u32,
    pub algo: u32,
    pub proto: u32,
}

/// `ncclNetDeviceHandle_v7_t` … `_v12_t` (32 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DeviceHandle {
    pub net_device_type: c_int,
    pub net_device_version: c_int,
    pub handle: *mut c_void,
    pub size: usize,
    pub needs_proxy_progress: c_int,
}

type Void = *mut c_void;
type VoidOut = *mut *mut c_void;
type DevHandleOut = *mut *mut DeviceHandle;

/// Function pointer slot: NULL-able, `extern "C"`, returns `ncclResult_t`.
macro_rules! slot {
    ($($arg:ty),*) => { Option<unsafe extern "C" fn($($arg),*) -> NcclResult> };
}

pub type InitV7 = slot!(Logger);
pub type InitV10 = slot!(Logger, ProfilerCallback);
pub type InitV11 = slot!(VoidOut, u64, *mut CommConfig, Logger, ProfilerCallback);
pub type Devices = slot!(*mut c_int);
pub type ListenV7 = slot!(c_int, Void, VoidOut);
pub type ListenV11 = slot!(Void, c_int, Void, VoidOut);
pub type ConnectV7 = slot!(c_int, Void, VoidOut, DevHandleOut);
pub type ConnectV10 = slot!(c_int, *mut CommConfig, Void, VoidOut, DevHandleOut);
pub type ConnectV11 = slot!(Void, c_int, Void, VoidOut, DevHandleOut);
pub type Accept = slot!(Void, VoidOut, DevHandleOut);
pub type RegMrV7 = slot!(Void, Void, c_int, c_int, VoidOut);
pub type RegMrV8 = slot!(Void, Void, usize, c_int, VoidOut);
pub type RegMrDmaBuf = slot!(Void, Void, usize, c_int, u64, c_int, VoidOut);
pub type DeregMr = slot!(Void, Void);
pub type IsendV7 = slot!(Void, Void, c_int, c_int, Void, VoidOut);
pub type IsendV9 = slot!(Void, Void, usize, c_int, Void, VoidOut);
pub type IsendV10 = slot!(Void, Void, usize, c_int, Void, Void, VoidOut);
pub type IrecvV7 = slot!(
    Void,
    c_int,
    *mut Void,
    *mut c_int,
    *mut c_int,
    *mut Void,
    VoidOut
);
pub type IrecvV9 = slot!(
    Void,
    c_int,
    *mut Void,
    *mut usize,
    *mut c_int,
    *mut Void,
    VoidOut
);
pub type IrecvV10 = slot!(
    Void,
    c_int,
    *mut Void,
    *mut usize,
    *mut c_int,
    *mut Void,
    *mut Void,
    VoidOut
);
pub type Iflush = slot!(Void, c_int, *mut Void, *mut c_int, *mut Void, VoidOut);
pub type Test = slot!(Void, *mut c_int, *mut c_int);
pub type Close = slot!(Void);
pub type GetDeviceMr = slot!(Void, Void, VoidOut);
pub type IrecvConsumed = slot!(Void, c_int, Void);
pub type MakeVDeviceV9 = slot!(*mut c_int, *mut VDevicePropsV9);
pub type MakeVDeviceV12 = slot!(*mut c_int, *mut VDevicePropsV12);
pub type Finalize = slot!(Void);
pub type SetNetAttr = slot!(Void, *mut NetAttr);

/// Declares one `ncclNet_vN_t`.
macro_rules! table {
    ($(#[$meta:meta])* $name:ident {
        init: $init:ty, get_properties: $props:ty, listen: $listen:ty, connect: $connect:ty,
        reg_mr: $regmr:ty, isend: $isend:ty, irecv: $irecv:ty $(, $extra:ident: $extra_ty:ty)*
    }) => {
        $(#[$meta])*
        #[repr(C)]
        pub struct $name {
            pub name: *const c_char,
            pub init: $init,
            pub devices: Devices,
            pub get_properties: slot!(c_int, *mut $props),
            pub listen: $listen,
            pub connect: $connect,
            pub accept: Accept,
            pub reg_mr: $regmr,
            pub reg_mr_dma_buf: RegMrDmaBuf,
            pub dereg_mr: DeregMr,
            pub isend: $isend,
            pub irecv: $irecv,
            pub iflush: Iflush,
            pub test: Test,
            pub close_send: Close,
            pub close_recv: Close,
            pub close_listen: Close,
            pub get_device_mr: GetDeviceMr,
            pub irecv_consumed: IrecvConsumed,
            $(pub $extra: $extra_ty,)*
        }
    };
}

table!(
    /// `ncclNet_v7_t` (152 bytes).
    NetV7 {
        init: InitV7, get_properties: PropertiesV7, listen: ListenV7, connect: ConnectV7,
        reg_mr: RegMrV7, isend: IsendV7, irecv: IrecvV7
    }
);
table!(
    /// `ncclNet_v8_t` (152 bytes).
    NetV8 {
        init: InitV7, get_properties: PropertiesV8, listen: ListenV7, connect: ConnectV7,
        reg_mr: RegMrV8, isend: IsendV7, irecv: IrecvV7
    }
);
table!(
    /// `ncclNet_v9_t` (160 bytes).
    NetV9 {
        init: InitV7, get_properties: PropertiesV9, listen: ListenV7, connect: ConnectV7,
        reg_mr: RegMrV8, isend: IsendV9, irecv: IrecvV9, make_vdevice: MakeVDeviceV9
    }
);
table!(
    /// `ncclNet_v10_t` (160 bytes).
    NetV10 {
        init: InitV10, get_properties: PropertiesV9, listen: ListenV7, connect: ConnectV10,
        reg_mr: RegMrV8, isend: IsendV10, irecv: IrecvV10, make_vdevice: MakeVDeviceV9
    }
);
table!(
    /// `ncclNet_v11_t` (176 bytes).
    NetV11 {
        init: InitV11, get_properties: PropertiesV11, listen: ListenV11, connect: ConnectV11,
        reg_mr: RegMrV8, isend: IsendV10, irecv: IrecvV10, make_vdevice: MakeVDeviceV9,
        finalize: Finalize, set_net_attr: SetNetAttr
    }
);
table!(
    /// `ncclNet_v12_t` (176 bytes).
    NetV12 {
        init: InitV11, get_properties: PropertiesV12, listen: ListenV11, connect: ConnectV11,
        reg_mr: RegMrV8, isend: IsendV10, irecv: IrecvV10, make_vdevice: MakeVDeviceV12,
        finalize: Finalize, set_net_attr: SetNetAttr
    }
);

#[cfg(target_pointer_width = "64")]
mod layout {
    use super::*;
    use std::mem::{offset_of, size_of};

    const _: () = assert!(size_of::<PropertiesV7>() == 56);
    const _: () = assert!(size_of::<PropertiesV8>() == 64);
    const _: () = assert!(size_of::<PropertiesV9>() == 104);
    const _: () = assert!(size_of::<PropertiesV11>() == 112);
    const _: () = assert!(size_of::<PropertiesV12>() == 128);
    const _: () = assert!(size_of::<VDevicePropsV9>() == 20);
    const _: () = assert!(size_of::<VDevicePropsV12>() == 36);
    const _: () = assert!(size_of::<DeviceHandle>() == 32);
    const _: () = assert!(size_of::<NetAttr>() == 44);
    const _: () = assert!(size_of::<CommConfig>() == 4);
    const _: () = assert!(size_of::<NetV7>() == 152);
    const _: () = assert!(size_of::<NetV8>() == 152);
    const _: () = assert!(size_of::<NetV9>() == 160);
    const _: () = assert!(size_of::<NetV10>() == 160);
    const _: () = assert!(size_of::<NetV11>() == 176);
    const _: () = assert!(size_of::<NetV12>() == 176);

    // Offsets from the sheet's table (§1.4).
    const _: () = assert!(offset_of!(PropertiesV7, latency) == 36);
    const _: () = assert!(offset_of!(PropertiesV7, net_device_version) == 52);
    const _: () = assert!(offset_of!(PropertiesV8, speed) == 32);
    const _: () = assert!(offset_of!(PropertiesV8, net_device_version) == 56);
    const _: () = assert!(offset_of!(PropertiesV9, speed) == 36);
    const _: () = assert!(offset_of!(PropertiesV9, vprops) == 64);
    const _: () = assert!(offset_of!(PropertiesV9, max_p2p_bytes) == 88);
    const _: () = assert!(offset_of!(PropertiesV9, max_coll_bytes) == 96);
    const _: () = assert!(offset_of!(PropertiesV11, max_multi_request_size) == 104);
    const _: () = assert!(offset_of!(PropertiesV12, vprops) == 64);
    const _: () = assert!(offset_of!(PropertiesV12, max_p2p_bytes) == 104);
    const _: () = assert!(offset_of!(PropertiesV12, max_coll_bytes) == 112);
    const _: () = assert!(offset_of!(PropertiesV12, max_multi_request_size) == 120);
    const _: () = assert!(offset_of!(PropertiesV12, rail_id) == 124);
    const _: () = assert!(offset_of!(PropertiesV12, plane_id) == 126);
    const _: () = assert!(offset_of!(DeviceHandle, needs_proxy_progress) == 24);
    const _: () = assert!(offset_of!(NetV12, isend) == 10 * 8);
    const _: () = assert!(offset_of!(NetV12, test) == 13 * 8);
    const _: () = assert!(offset_of!(NetV9, make_vdevice) == 19 * 8);
    const _: () = assert!(offset_of!(NetV12, finalize) == 20 * 8);
    const _: () = assert!(offset_of!(NetV12, set_net_attr) == 21 * 8);
}
