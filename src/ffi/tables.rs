//! The exported tables `ncclNetPlugin_v7` ... `ncclNetPlugin_v12`: the only dynamic symbols of
//! the cdylib (`tests/exports.rs` checks it). They are statics, not functions: NCCL `dlsym`s
//! each name and reads the struct (v12 even calls through it live, `name` before `init`).
//!
//! MPIB fills every slot: the optional `regMrDmaBuf`, `getDeviceMr`, `irecvConsumed`,
//! `makeVDevice` and `setNetAttr` included (see `docs/NCCL_NET_ABI.md` section 1.6).

#![allow(non_upper_case_globals)] // the exported names are NCCL's

use std::ffi::{c_char, c_int};

use super::adapters as a;
use super::types::{
    NetPropertiesV11, NetPropertiesV12, NetPropertiesV7, NetPropertiesV8, NetPropertiesV9, NetV10,
    NetV11, NetV12, NetV7, NetV8, NetV9, MAX_DEVS_PER_NIC_V12, MAX_DEVS_PER_NIC_V9,
};

/// The plugin's name as NCCL matches it (`NCCL_NET=MPIB`, case-insensitive).
pub const PLUGIN_NAME: &std::ffi::CStr = c"MPIB";

/// A function table that may live in a `static`.
#[repr(transparent)]
pub struct SyncTable<T>(pub T);

/// Marks the table types [`SyncTable`] may hold.
pub trait NetTable: sealed::Sealed {}
mod sealed {
    /// Only the six table types.
    pub trait Sealed {}
}
macro_rules! net_tables {
    ($($ty:ty),*) => {$(impl sealed::Sealed for $ty {} impl NetTable for $ty {})*};
}
net_tables!(NetV7, NetV8, NetV9, NetV10, NetV11, NetV12);

// SAFETY: a net table is immutable after compilation and holds only function pointers (which
// are `Sync`) and `name`, a pointer to a `'static` NUL-terminated string that is never written;
// sharing such a struct between threads (NCCL's application, service and progress threads)
// cannot race.
unsafe impl<T: NetTable> Sync for SyncTable<T> {}

const NAME: *const c_char = PLUGIN_NAME.as_ptr();

/// NCCL 2.19: ABI v7.
#[no_mangle]
pub static ncclNetPlugin_v7: SyncTable<NetV7> = SyncTable(NetV7 {
    name: NAME,
    init: Some(a::init_v7),
    devices: Some(a::devices),
    get_properties: Some(a::get_properties::<NetPropertiesV7>),
    listen: Some(a::listen_v7),
    connect: Some(a::connect_v7),
    accept: Some(a::accept),
    reg_mr: Some(a::reg_mr::<c_int>),
    reg_mr_dma_buf: Some(a::reg_mr_dma_buf),
    dereg_mr: Some(a::dereg_mr),
    isend: Some(a::isend_v7::<c_int>),
    irecv: Some(a::irecv_v7::<c_int>),
    iflush: Some(a::iflush),
    test: Some(a::test),
    close_send: Some(a::close_send),
    close_recv: Some(a::close_recv),
    close_listen: Some(a::close_listen),
    get_device_mr: Some(a::get_device_mr),
    irecv_consumed: Some(a::irecv_consumed),
});

/// NCCL 2.20 - 2.23: ABI v8.
#[no_mangle]
pub static ncclNetPlugin_v8: SyncTable<NetV8> = SyncTable(NetV8 {
    name: NAME,
    init: Some(a::init_v7),
    devices: Some(a::devices),
    get_properties: Some(a::get_properties::<NetPropertiesV8>),
    listen: Some(a::listen_v7),
    connect: Some(a::connect_v7),
    accept: Some(a::accept),
    reg_mr: Some(a::reg_mr::<usize>),
    reg_mr_dma_buf: Some(a::reg_mr_dma_buf),
    dereg_mr: Some(a::dereg_mr),
    isend: Some(a::isend_v7::<c_int>),
    irecv: Some(a::irecv_v7::<c_int>),
    iflush: Some(a::iflush),
    test: Some(a::test),
    close_send: Some(a::close_send),
    close_recv: Some(a::close_recv),
    close_listen: Some(a::close_listen),
    get_device_mr: Some(a::get_device_mr),
    irecv_consumed: Some(a::irecv_consumed),
});

/// NCCL 2.24 - 2.25: ABI v9.
#[no_mangle]
pub static ncclNetPlugin_v9: SyncTable<NetV9> = SyncTable(NetV9 {
    name: NAME,
    init: Some(a::init_v7),
    devices: Some(a::devices),
    get_properties: Some(a::get_properties::<NetPropertiesV9>),
    listen: Some(a::listen_v7),
    connect: Some(a::connect_v7),
    accept: Some(a::accept),
    reg_mr: Some(a::reg_mr::<usize>),
    reg_mr_dma_buf: Some(a::reg_mr_dma_buf),
    dereg_mr: Some(a::dereg_mr),
    isend: Some(a::isend_v7::<usize>),
    irecv: Some(a::irecv_v7::<usize>),
    iflush: Some(a::iflush),
    test: Some(a::test),
    close_send: Some(a::close_send),
    close_recv: Some(a::close_recv),
    close_listen: Some(a::close_listen),
    get_device_mr: Some(a::get_device_mr),
    irecv_consumed: Some(a::irecv_consumed),
    make_v_device: Some(a::make_v_device::<MAX_DEVS_PER_NIC_V9>),
});

/// NCCL 2.26 - 2.27: ABI v10.
#[no_mangle]
pub static ncclNetPlugin_v10: SyncTable<NetV10> = SyncTable(NetV10 {
    name: NAME,
    init: Some(a::init_v10),
    devices: Some(a::devices),
    get_properties: Some(a::get_properties::<NetPropertiesV9>),
    listen: Some(a::listen_v7),
    connect: Some(a::connect_v10),
    accept: Some(a::accept),
    reg_mr: Some(a::reg_mr::<usize>),
    reg_mr_dma_buf: Some(a::reg_mr_dma_buf),
    dereg_mr: Some(a::dereg_mr),
    isend: Some(a::isend_v10),
    irecv: Some(a::irecv_v10),
    iflush: Some(a::iflush),
    test: Some(a::test),
    close_send: Some(a::close_send),
    close_recv: Some(a::close_recv),
    close_listen: Some(a::close_listen),
    get_device_mr: Some(a::get_device_mr),
    irecv_consumed: Some(a::irecv_consumed),
    make_v_device: Some(a::make_v_device::<MAX_DEVS_PER_NIC_V9>),
});

/// NCCL 2.28 - 2.29: ABI v11.
#[no_mangle]
pub static ncclNetPlugin_v11: SyncTable<NetV11> = SyncTable(NetV11 {
    name: NAME,
    init: Some(a::init_v11),
    devices: Some(a::devices),
    get_properties: Some(a::get_properties::<NetPropertiesV11>),
    listen: Some(a::listen_v11),
    connect: Some(a::connect_v11),
    accept: Some(a::accept),
    reg_mr: Some(a::reg_mr::<usize>),
    reg_mr_dma_buf: Some(a::reg_mr_dma_buf),
    dereg_mr: Some(a::dereg_mr),
    isend: Some(a::isend_v10),
    irecv: Some(a::irecv_v10),
    iflush: Some(a::iflush),
    test: Some(a::test),
    close_send: Some(a::close_send),
    close_recv: Some(a::close_recv),
    close_listen: Some(a::close_listen),
    get_device_mr: Some(a::get_device_mr),
    irecv_consumed: Some(a::irecv_consumed),
    make_v_device: Some(a::make_v_device::<MAX_DEVS_PER_NIC_V9>),
    finalize: Some(a::finalize),
    set_net_attr: Some(a::set_net_attr),
});

/// NCCL 2.30: ABI v12.
#[no_mangle]
pub static ncclNetPlugin_v12: SyncTable<NetV12> = SyncTable(NetV12 {
    name: NAME,
    init: Some(a::init_v11),
    devices: Some(a::devices),
    get_properties: Some(a::get_properties::<NetPropertiesV12>),
    listen: Some(a::listen_v11),
    connect: Some(a::connect_v11),
    accept: Some(a::accept),
    reg_mr: Some(a::reg_mr::<usize>),
    reg_mr_dma_buf: Some(a::reg_mr_dma_buf),
    dereg_mr: Some(a::dereg_mr),
    isend: Some(a::isend_v10),
    irecv: Some(a::irecv_v10),
    iflush: Some(a::iflush),
    test: Some(a::test),
    close_send: Some(a::close_send),
    close_recv: Some(a::close_recv),
    close_listen: Some(a::close_listen),
    get_device_mr: Some(a::get_device_mr),
    irecv_consumed: Some(a::irecv_consumed),
    make_v_device: Some(a::make_v_device::<MAX_DEVS_PER_NIC_V12>),
    finalize: Some(a::finalize),
    set_net_attr: Some(a::set_net_attr),
});
