//! `#[repr(C)]` mirrors of every struct the NCCL net tables v7 ... v12 use.
//!
//! Layouts come from the fact sheet (`docs/NCCL_NET_ABI.md` sections 1.3 and 1.4, offsets measured
//! with gcc on x86-64; aarch64 Linux is LP64 with the same layout). Every size and every field
//! offset is pinned by a compile-time assert next to its struct, so a typo cannot ship.
//!
//! Field names are the C names in `snake_case`; each field's doc names its C spelling.

use std::ffi::{c_int, c_void};

mod properties;
mod table;

pub use properties::{
    FromProperties, NetPropertiesV10, NetPropertiesV11, NetPropertiesV12, NetPropertiesV7,
    NetPropertiesV8, NetPropertiesV9,
};
pub use table::{NetV10, NetV11, NetV12, NetV7, NetV8, NetV9};

/// Pins a struct's size and field offsets at compile time:
/// `assert_layout!(Type, size = 32, { field @ 0, other @ 8 });`
macro_rules! assert_layout {
    ($ty:ty, size = $size:expr, { $($field:ident @ $offset:expr),* $(,)? }) => {
        const _: () = assert!(core::mem::size_of::<$ty>() == $size);
        $(const _: () = assert!(core::mem::offset_of!($ty, $field) == $offset);)*
    };
}
pub(crate) use assert_layout;

/// `ncclNetDeviceType` value for a host-driven plugin (`NCCL_NET_DEVICE_HOST`).
pub const NET_DEVICE_HOST: c_int = 0;
/// `NCCL_NET_DEVICE_INVALID_VERSION`: the device version a HOST plugin reports.
pub const NET_DEVICE_INVALID_VERSION: c_int = 0;
/// `NCCL_NET_MAX_DEVS_PER_NIC` for ABI v9 ... v11.
pub const MAX_DEVS_PER_NIC_V9: usize = 4;
/// `NCCL_NET_MAX_DEVS_PER_NIC` for ABI v12.
pub const MAX_DEVS_PER_NIC_V12: usize = 8;

/// `ncclNetVDeviceProps_vN_t`: the physical devices behind a virtual one.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NetVDeviceProps<const N: usize> {
    /// `ndevs`: how many entries of `devs` are used.
    pub ndevs: c_int,
    /// `devs`: physical device indices.
    pub devs: [c_int; N],
}

/// `ncclNetVDeviceProps_v9_t` (also v10 and v11): 4 devices, 20 bytes.
pub type NetVDevicePropsV9 = NetVDeviceProps<MAX_DEVS_PER_NIC_V9>;
/// `ncclNetVDeviceProps_v12_t`: 8 devices, 36 bytes.
pub type NetVDevicePropsV12 = NetVDeviceProps<MAX_DEVS_PER_NIC_V12>;

assert_layout!(NetVDevicePropsV9, size = 20, { ndevs @ 0, devs @ 4 });
assert_layout!(NetVDevicePropsV12, size = 36, { ndevs @ 0, devs @ 4 });

/// `ncclNetDeviceHandle_v7_t` ... `_v12_t` (identical in every version): what a device-offload
/// plugin hands back from `connect`/`accept`. MPIB is a HOST plugin and never creates one.
#[repr(C)]
#[derive(Debug)]
pub struct NetDeviceHandle {
    /// `netDeviceType` (`ncclNetDeviceType`).
    pub net_device_type: c_int,
    /// `netDeviceVersion`.
    pub net_device_version: c_int,
    /// `handle`.
    pub handle: *mut c_void,
    /// `size`.
    pub size: usize,
    /// `needsProxyProgress`.
    pub needs_proxy_progress: c_int,
}

assert_layout!(NetDeviceHandle, size = 32, {
    net_device_type @ 0,
    net_device_version @ 4,
    handle @ 8,
    size @ 16,
    needs_proxy_progress @ 24,
});

/// `ncclNetCommConfig_v10_t` ... `_v12_t`: per-communicator settings.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NetCommConfig {
    /// `trafficClass` (-1 = `NCCL_NET_TRAFFIC_CLASS_UNDEF`).
    pub traffic_class: c_int,
}

assert_layout!(NetCommConfig, size = 4, { traffic_class @ 0 });

/// `ncclNetCommAttr`: concurrency hints for one side of a connection (-1 = undefined).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NetCommAttr {
    /// `maxConcurrentPeers`.
    pub max_concurrent_peers: i32,
    /// `minConcurrentPeers`.
    pub min_concurrent_peers: i32,
    /// `maxFlowsPerPeer`.
    pub max_flows_per_peer: i32,
    /// `minFlowsPerPeer`.
    pub min_flows_per_peer: i32,
}

assert_layout!(NetCommAttr, size = 16, {
    max_concurrent_peers @ 0,
    min_concurrent_peers @ 4,
    max_flows_per_peer @ 8,
    min_flows_per_peer @ 12,
});

/// `ncclNetAttr_v11_t` / `_v12_t`: the hints `setNetAttr` carries.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NetAttr {
    /// `sendCommAttr`.
    pub send_comm_attr: NetCommAttr,
    /// `recvCommAttr`.
    pub recv_comm_attr: NetCommAttr,
    /// `op`: bit mask over `ncclFunc_t`.
    pub op: u32,
    /// `algo`: bit mask over algorithms.
    pub algo: u32,
    /// `proto`: bit mask over protocols.
    pub proto: u32,
}

assert_layout!(NetAttr, size = 44, {
    send_comm_attr @ 0,
    recv_comm_attr @ 16,
    op @ 32,
    algo @ 36,
    proto @ 40,
});
