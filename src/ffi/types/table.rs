//! The function tables `ncclNet_v7_t` ... `ncclNet_v12_t` (sheet section 1.4).
//!
//! Every member is `Option<fn>` so the Rust type matches C exactly (a function pointer NCCL may
//! find NULL); which members MPIB leaves NULL is decided in [`crate::ffi::tables`]. Every slot is
//! pointer-sized, so slot `k` sits at offset `8 * k`; the asserts pin each one.

use std::ffi::{c_char, c_int, c_void};

use super::{
    assert_layout, NetAttr, NetCommConfig, NetDeviceHandle, NetPropertiesV11, NetPropertiesV12,
    NetPropertiesV7, NetPropertiesV8, NetPropertiesV9, NetVDeviceProps, MAX_DEVS_PER_NIC_V12,
    MAX_DEVS_PER_NIC_V9,
};
use crate::log::LoggerFn;
use crate::net::ProfilerCallback;

/// `init(ncclDebugLogger_t)` (v7 ... v9).
pub type InitV7Fn = unsafe extern "C" fn(logger: Option<LoggerFn>) -> c_int;
/// `init(ncclDebugLogger_t, ncclProfilerCallback_t)` (v10).
pub type InitV10Fn =
    unsafe extern "C" fn(logger: Option<LoggerFn>, profiler: Option<ProfilerCallback>) -> c_int;
/// `init(void** ctx, uint64_t commId, ncclNetCommConfig_t*, logger, profiler)` (v11, v12).
pub type InitV11Fn = unsafe extern "C" fn(
    ctx: *mut *mut c_void,
    comm_id: u64,
    config: *mut NetCommConfig,
    logger: Option<LoggerFn>,
    profiler: Option<ProfilerCallback>,
) -> c_int;
/// `devices(int* ndev)`.
pub type DevicesFn = unsafe extern "C" fn(ndev: *mut c_int) -> c_int;
/// `getProperties(int dev, ncclNetProperties_vN_t* props)`.
pub type GetPropertiesFn<P> = unsafe extern "C" fn(dev: c_int, props: *mut P) -> c_int;
/// `listen(int dev, void* handle, void** listenComm)` (v7 ... v10).
pub type ListenFn =
    unsafe extern "C" fn(dev: c_int, handle: *mut c_void, listen_comm: *mut *mut c_void) -> c_int;
/// `listen(void* ctx, int dev, void* handle, void** listenComm)` (v11, v12).
pub type ListenCtxFn = unsafe extern "C" fn(
    ctx: *mut c_void,
    dev: c_int,
    handle: *mut c_void,
    listen_comm: *mut *mut c_void,
) -> c_int;
/// `connect(int dev, void* handle, void** sendComm, ncclNetDeviceHandle** sendDevComm)`
/// (v7 ... v9).
pub type ConnectFn = unsafe extern "C" fn(
    dev: c_int,
    handle: *mut c_void,
    send_comm: *mut *mut c_void,
    send_dev_comm: *mut *mut NetDeviceHandle,
) -> c_int;
/// `connect(int dev, ncclNetCommConfig_v10_t* config, void* handle, void** sendComm,
/// ncclNetDeviceHandle** sendDevComm)` (v10).
pub type ConnectV10Fn = unsafe extern "C" fn(
    dev: c_int,
    config: *mut NetCommConfig,
    handle: *mut c_void,
    send_comm: *mut *mut c_void,
    send_dev_comm: *mut *mut NetDeviceHandle,
) -> c_int;
/// `connect(void* ctx, int dev, void* handle, void** sendComm, ncclNetDeviceHandle**
/// sendDevComm)` (v11, v12).
pub type ConnectCtxFn = unsafe extern "C" fn(
    ctx: *mut c_void,
    dev: c_int,
    handle: *mut c_void,
    send_comm: *mut *mut c_void,
    send_dev_comm: *mut *mut NetDeviceHandle,
) -> c_int;
/// `accept(void* listenComm, void** recvComm, ncclNetDeviceHandle** recvDevComm)`.
pub type AcceptFn = unsafe extern "C" fn(
    listen_comm: *mut c_void,
    recv_comm: *mut *mut c_void,
    recv_dev_comm: *mut *mut NetDeviceHandle,
) -> c_int;
/// `regMr(void* comm, void* data, S size, int type, void** mhandle)`: `S` is `int` in v7,
/// `size_t` from v8.
pub type RegMrFn<S> = unsafe extern "C" fn(
    comm: *mut c_void,
    data: *mut c_void,
    size: S,
    ptr_type: c_int,
    mhandle: *mut *mut c_void,
) -> c_int;
/// `regMrDmaBuf(void* comm, void* data, size_t size, int type, uint64_t offset, int fd,
/// void** mhandle)`.
pub type RegMrDmaBufFn = unsafe extern "C" fn(
    comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    ptr_type: c_int,
    offset: u64,
    fd: c_int,
    mhandle: *mut *mut c_void,
) -> c_int;
/// `deregMr(void* comm, void* mhandle)`.
pub type DeregMrFn = unsafe extern "C" fn(comm: *mut c_void, mhandle: *mut c_void) -> c_int;
/// `isend(void* sendComm, void* data, S size, int tag, void* mhandle, void** request)`
/// (v7 ... v9; `S` is `int` before v9, `size_t` in v9).
pub type IsendFn<S> = unsafe extern "C" fn(
    send_comm: *mut c_void,
    data: *mut c_void,
    size: S,
    tag: c_int,
    mhandle: *mut c_void,
    request: *mut *mut c_void,
) -> c_int;
/// `isend(void* sendComm, void* data, size_t size, int tag, void* mhandle, void* phandle,
/// void** request)` (v10 ... v12).
pub type IsendV10Fn = unsafe extern "C" fn(
    send_comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    tag: c_int,
    mhandle: *mut c_void,
    phandle: *mut c_void,
    request: *mut *mut c_void,
) -> c_int;
/// `irecv(void* recvComm, int n, void** data, S* sizes, int* tags, void** mhandles,
/// void** request)` (v7 ... v9; `S` is `int` before v9, `size_t` in v9).
pub type IrecvFn<S> = unsafe extern "C" fn(
    recv_comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut S,
    tags: *mut c_int,
    mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> c_int;
/// `irecv(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
/// void** phandles, void** request)` (v10 ... v12).
pub type IrecvV10Fn = unsafe extern "C" fn(
    recv_comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut usize,
    tags: *mut c_int,
    mhandles: *mut *mut c_void,
    phandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> c_int;
/// `iflush(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request)`:
/// `int` sizes in every version.
pub type IflushFn = unsafe extern "C" fn(
    recv_comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut c_int,
    mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> c_int;
/// `test(void* request, int* done, int* sizes)`: `int` sizes in every version.
pub type TestFn =
    unsafe extern "C" fn(request: *mut c_void, done: *mut c_int, sizes: *mut c_int) -> c_int;
/// `closeSend`/`closeRecv`/`closeListen(void* comm)`.
pub type CloseFn = unsafe extern "C" fn(comm: *mut c_void) -> c_int;
/// `getDeviceMr(void* comm, void* mhandle, void** dptr_mhandle)`.
pub type GetDeviceMrFn = unsafe extern "C" fn(
    comm: *mut c_void,
    mhandle: *mut c_void,
    dptr_mhandle: *mut *mut c_void,
) -> c_int;
/// `irecvConsumed(void* recvComm, int n, void* request)`.
pub type IrecvConsumedFn =
    unsafe extern "C" fn(recv_comm: *mut c_void, n: c_int, request: *mut c_void) -> c_int;
/// `makeVDevice(int* d, ncclNetVDeviceProps_vN_t* props)` (v9+).
pub type MakeVDeviceFn<const N: usize> =
    unsafe extern "C" fn(d: *mut c_int, props: *mut NetVDeviceProps<N>) -> c_int;
/// `finalize(void* ctx)` (v11, v12).
pub type FinalizeFn = unsafe extern "C" fn(ctx: *mut c_void) -> c_int;
/// `setNetAttr(void* ctx, ncclNetAttr_t* netAttr)` (v11, v12).
pub type SetNetAttrFn = unsafe extern "C" fn(ctx: *mut c_void, net_attr: *mut NetAttr) -> c_int;

/// Declares one table struct; the members common to every version are spelled out once here.
macro_rules! net_table {
    (
        $(#[$meta:meta])*
        $name:ident {
            init: $init:ty,
            get_properties: $props:ty,
            listen: $listen:ty,
            connect: $connect:ty,
            reg_mr: $reg_mr:ty,
            isend: $isend:ty,
            irecv: $irecv:ty,
            $($(#[$extra_meta:meta])* $extra:ident: $extra_ty:ty,)*
        }
    ) => {
        $(#[$meta])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug)]
        pub struct $name {
            /// `name`: a static NUL-terminated string, read before `init`.
            pub name: *const c_char,
            /// `init`.
            pub init: Option<$init>,
            /// `devices`.
            pub devices: Option<DevicesFn>,
            /// `getProperties`.
            pub get_properties: Option<$props>,
            /// `listen`.
            pub listen: Option<$listen>,
            /// `connect`.
            pub connect: Option<$connect>,
            /// `accept`.
            pub accept: Option<AcceptFn>,
            /// `regMr`.
            pub reg_mr: Option<$reg_mr>,
            /// `regMrDmaBuf` (optional).
            pub reg_mr_dma_buf: Option<RegMrDmaBufFn>,
            /// `deregMr`.
            pub dereg_mr: Option<DeregMrFn>,
            /// `isend`.
            pub isend: Option<$isend>,
            /// `irecv`.
            pub irecv: Option<$irecv>,
            /// `iflush`.
            pub iflush: Option<IflushFn>,
            /// `test`.
            pub test: Option<TestFn>,
            /// `closeSend`.
            pub close_send: Option<CloseFn>,
            /// `closeRecv`.
            pub close_recv: Option<CloseFn>,
            /// `closeListen`.
            pub close_listen: Option<CloseFn>,
            /// `getDeviceMr` (optional).
            pub get_device_mr: Option<GetDeviceMrFn>,
            /// `irecvConsumed` (optional).
            pub irecv_consumed: Option<IrecvConsumedFn>,
            $($(#[$extra_meta])* pub $extra: Option<$extra_ty>,)*
        }
    };
}

/// Offsets of the 19 members every table version shares.
macro_rules! assert_table_layout {
    ($ty:ty, size = $size:expr $(, $extra:ident @ $offset:expr)* $(,)?) => {
        assert_layout!($ty, size = $size, {
            name @ 0, init @ 8, devices @ 16, get_properties @ 24, listen @ 32, connect @ 40,
            accept @ 48, reg_mr @ 56, reg_mr_dma_buf @ 64, dereg_mr @ 72, isend @ 80, irecv @ 88,
            iflush @ 96, test @ 104, close_send @ 112, close_recv @ 120, close_listen @ 128,
            get_device_mr @ 136, irecv_consumed @ 144, $($extra @ $offset,)*
        });
    };
}

net_table! {
    /// `ncclNet_v7_t` (152 bytes): v8 with an `int` `regMr` size and v7 properties.
    NetV7 {
        init: InitV7Fn,
        get_properties: GetPropertiesFn<NetPropertiesV7>,
        listen: ListenFn,
        connect: ConnectFn,
        reg_mr: RegMrFn<c_int>,
        isend: IsendFn<c_int>,
        irecv: IrecvFn<c_int>,
    }
}
assert_table_layout!(NetV7, size = 152);

net_table! {
    /// `ncclNet_v8_t` (152 bytes).
    NetV8 {
        init: InitV7Fn,
        get_properties: GetPropertiesFn<NetPropertiesV8>,
        listen: ListenFn,
        connect: ConnectFn,
        reg_mr: RegMrFn<usize>,
        isend: IsendFn<c_int>,
        irecv: IrecvFn<c_int>,
    }
}
assert_table_layout!(NetV8, size = 152);

net_table! {
    /// `ncclNet_v9_t` (160 bytes): `size_t` isend/irecv sizes, `makeVDevice`.
    NetV9 {
        init: InitV7Fn,
        get_properties: GetPropertiesFn<NetPropertiesV9>,
        listen: ListenFn,
        connect: ConnectFn,
        reg_mr: RegMrFn<usize>,
        isend: IsendFn<usize>,
        irecv: IrecvFn<usize>,
        /// `makeVDevice` (optional).
        make_v_device: MakeVDeviceFn<MAX_DEVS_PER_NIC_V9>,
    }
}
assert_table_layout!(NetV9, size = 160, make_v_device @ 152);

net_table! {
    /// `ncclNet_v10_t` (160 bytes): profiler callback, connect config, profiler handles.
    NetV10 {
        init: InitV10Fn,
        get_properties: GetPropertiesFn<NetPropertiesV9>,
        listen: ListenFn,
        connect: ConnectV10Fn,
        reg_mr: RegMrFn<usize>,
        isend: IsendV10Fn,
        irecv: IrecvV10Fn,
        /// `makeVDevice` (optional).
        make_v_device: MakeVDeviceFn<MAX_DEVS_PER_NIC_V9>,
    }
}
assert_table_layout!(NetV10, size = 160, make_v_device @ 152);

net_table! {
    /// `ncclNet_v11_t` (176 bytes): per-communicator contexts, `finalize`, `setNetAttr`.
    NetV11 {
        init: InitV11Fn,
        get_properties: GetPropertiesFn<NetPropertiesV11>,
        listen: ListenCtxFn,
        connect: ConnectCtxFn,
        reg_mr: RegMrFn<usize>,
        isend: IsendV10Fn,
        irecv: IrecvV10Fn,
        /// `makeVDevice` (optional).
        make_v_device: MakeVDeviceFn<MAX_DEVS_PER_NIC_V9>,
        /// `finalize` (mandatory).
        finalize: FinalizeFn,
        /// `setNetAttr` (optional).
        set_net_attr: SetNetAttrFn,
    }
}
assert_table_layout!(NetV11, size = 176, make_v_device @ 152, finalize @ 160, set_net_attr @ 168);

net_table! {
    /// `ncclNet_v12_t` (176 bytes): v11's table with v12 properties and 8-device `vProps`.
    NetV12 {
        init: InitV11Fn,
        get_properties: GetPropertiesFn<NetPropertiesV12>,
        listen: ListenCtxFn,
        connect: ConnectCtxFn,
        reg_mr: RegMrFn<usize>,
        isend: IsendV10Fn,
        irecv: IrecvV10Fn,
        /// `makeVDevice` (optional).
        make_v_device: MakeVDeviceFn<MAX_DEVS_PER_NIC_V12>,
        /// `finalize` (mandatory).
        finalize: FinalizeFn,
        /// `setNetAttr` (optional).
        set_net_attr: SetNetAttrFn,
    }
}
assert_table_layout!(NetV12, size = 176, make_v_device @ 152, finalize @ 160, set_net_attr @ 168);
