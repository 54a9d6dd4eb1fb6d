//! Tests of the exported tables: names, mandatory slots, and argument checks that return before
//! reaching `crate::net` (so they hold whatever state `net` is in).

use std::ffi::{c_int, c_void, CStr};
use std::ptr::{null, null_mut};

use super::tables::*;
use super::types::{NetAttr, NetCommAttr, NetPropertiesV12, NetVDeviceProps};

const INVALID_ARGUMENT: c_int = 4;
/// What NCCL may pre-set `*request` to; it must survive a failed call untouched.
const SENTINEL: *mut c_void = 1 as *mut c_void;

macro_rules! check_common {
    ($table:expr) => {{
        let t = &$table.0;
        // SAFETY: `name` points to a static NUL-terminated string.
        assert_eq!(unsafe { CStr::from_ptr(t.name) }, c"MPIB");
        assert!(t.init.is_some() && t.devices.is_some() && t.get_properties.is_some());
        assert!(t.listen.is_some() && t.connect.is_some() && t.accept.is_some());
        assert!(t.reg_mr.is_some() && t.dereg_mr.is_some());
        assert!(t.isend.is_some() && t.irecv.is_some() && t.iflush.is_some() && t.test.is_some());
        assert!(t.close_send.is_some() && t.close_recv.is_some() && t.close_listen.is_some());
    }};
}

#[test]
fn tables_have_name_and_mandatory_slots() {
    check_common!(ncclNetPlugin_v7);
    check_common!(ncclNetPlugin_v8);
    check_common!(ncclNetPlugin_v9);
    check_common!(ncclNetPlugin_v10);
    check_common!(ncclNetPlugin_v11);
    check_common!(ncclNetPlugin_v12);
    assert!(ncclNetPlugin_v11.0.finalize.is_some());
    assert!(ncclNetPlugin_v12.0.finalize.is_some());
}

#[test]
fn null_handles_are_rejected_without_writing() {
    let t = &ncclNetPlugin_v12.0;
    let mut request = SENTINEL;
    let mut data = [null_mut::<c_void>()];
    let mut sizes = [64_usize];
    let mut tags: [c_int; 1] = [0];
    let mut mhandles = [null_mut::<c_void>()];
    // SAFETY: every pointer is NULL or a live local; no handle is dereferenced
    // because each call fails its NULL check first.
    unsafe {
        let isend = t.isend.expect("isend");
        assert_eq!(
            isend(
                null_mut(),
                null_mut(),
                8,
                0,
                null_mut(),
                null_mut(),
                &mut request
            ),
            4
        );
        assert_eq!(request, SENTINEL);
        let irecv = t.irecv.expect("irecv");
        let (d, s, g, m) = (
            data.as_mut_ptr(),
            sizes.as_mut_ptr(),
            tags.as_mut_ptr(),
            mhandles.as_mut_ptr(),
        );
        assert_eq!(
            irecv(null_mut(), 1, d, s, g, m, null_mut(), &mut request),
            4
        );
        assert_eq!(
            irecv(null_mut(), 9, d, s, g, m, null_mut(), &mut request),
            4
        );
        assert_eq!(
            irecv(null_mut(), 0, d, s, g, m, null_mut(), &mut request),
            4
        );
        assert_eq!(request, SENTINEL);
        let mut done = 7;
        assert_eq!(t.test.expect("test")(null_mut(), &mut done, null_mut()), 4);
        assert_eq!(t.test.expect("test")(SENTINEL, null_mut(), null_mut()), 4);
        assert_eq!(done, 7);
        assert_eq!(
            t.close_send.expect("closeSend")(null_mut()),
            INVALID_ARGUMENT
        );
        assert_eq!(
            t.close_recv.expect("closeRecv")(null_mut()),
            INVALID_ARGUMENT
        );
        assert_eq!(
            t.close_listen.expect("closeListen")(null_mut()),
            INVALID_ARGUMENT
        );
        assert_eq!(
            t.dereg_mr.expect("deregMr")(null_mut(), null_mut()),
            INVALID_ARGUMENT
        );
        let mut mh = SENTINEL;
        assert_eq!(
            t.reg_mr.expect("regMr")(null_mut(), null_mut(), 8, 1, &mut mh),
            4
        );
        assert_eq!(mh, SENTINEL);
    }
}

#[test]
fn int_sizes_are_checked_in_old_versions() {
    let mut request = SENTINEL;
    let mut mh = SENTINEL;
    // SAFETY: NULL comms are rejected before use; outputs are live locals.
    unsafe {
        let isend = ncclNetPlugin_v7.0.isend.expect("isend");
        assert_eq!(
            isend(null_mut(), null_mut(), -1, 0, null_mut(), &mut request),
            4
        );
        let reg_mr = ncclNetPlugin_v7.0.reg_mr.expect("regMr");
        assert_eq!(reg_mr(null_mut(), null_mut(), -5, 1, &mut mh), 4);
    }
    assert_eq!((request, mh), (SENTINEL, SENTINEL));
}

#[test]
fn contexts_are_required_from_v11() {
    let t = &ncclNetPlugin_v11.0;
    let mut handle = [0_u8; 128];
    let mut comm = SENTINEL;
    // SAFETY: NULL contexts are rejected before use; other pointers are live locals.
    unsafe {
        assert_eq!(t.finalize.expect("finalize")(null_mut()), 4);
        let init = t.init.expect("init");
        assert_eq!(init(null_mut(), 1, null_mut(), None, None), 4);
        let listen = t.listen.expect("listen");
        assert_eq!(
            listen(null_mut(), 0, handle.as_mut_ptr().cast(), &mut comm),
            4
        );
        let connect = t.connect.expect("connect");
        assert_eq!(
            connect(
                null_mut(),
                0,
                handle.as_mut_ptr().cast(),
                &mut comm,
                null_mut()
            ),
            4
        );
    }
    assert_eq!(comm, SENTINEL);
}

#[test]
fn optional_entry_points() {
    let t = &ncclNetPlugin_v12.0;
    let mut dptr = SENTINEL;
    let attr = NetAttr {
        send_comm_attr: NetCommAttr {
            max_concurrent_peers: -1,
            min_concurrent_peers: -1,
            max_flows_per_peer: -1,
            min_flows_per_peer: -1,
        },
        recv_comm_attr: NetCommAttr {
            max_concurrent_peers: 4,
            min_concurrent_peers: 1,
            max_flows_per_peer: 2,
            min_flows_per_peer: 1,
        },
        op: 1,
        algo: 2,
        proto: 4,
    };
    let mut vdev = -1;
    let mut props = NetVDeviceProps {
        ndevs: 9,
        devs: [0; 8],
    };
    // SAFETY: every pointer is NULL or a live local.
    unsafe {
        assert_eq!(
            t.get_device_mr.expect("getDeviceMr")(null_mut(), null_mut(), &mut dptr),
            0
        );
        assert!(dptr.is_null());
        assert_eq!(
            t.get_device_mr.expect("getDeviceMr")(null_mut(), null_mut(), null_mut()),
            4
        );
        assert_eq!(
            t.irecv_consumed.expect("irecvConsumed")(null_mut(), 1, SENTINEL),
            0
        );
        let set_net_attr = t.set_net_attr.expect("setNetAttr");
        // A NULL context or attribute pointer is refused (ncclInvalidArgument), not ignored.
        assert_eq!(
            set_net_attr(null_mut(), &attr as *const NetAttr as *mut NetAttr),
            4
        );
        assert_eq!(set_net_attr(null_mut(), null_mut()), 4);
        let make_v_device = t.make_v_device.expect("makeVDevice");
        assert_eq!(make_v_device(&mut vdev, &mut props), 4);
        assert_eq!(make_v_device(&mut vdev, null_mut()), 4);
        assert_eq!(make_v_device(null_mut(), &mut props), 4);
        let get_properties = t.get_properties.expect("getProperties");
        assert_eq!(get_properties(0, null_mut::<NetPropertiesV12>()), 4);
        assert_eq!(t.devices.expect("devices")(null_mut()), 4);
    }
    assert_eq!(vdev, -1);
    let _ = null::<c_void>();
}

/// A pointer to something that is not a live comm of the kind (a zeroed block as large and as
/// aligned as any comm) is refused before ownership is taken: the call fails with
/// ncclInvalidArgument and the block is left alone (no free, no write).
#[test]
fn close_refuses_what_is_not_a_live_comm_and_frees_nothing() {
    use crate::net::{ListenComm, RecvComm, SendComm};
    use std::alloc::{alloc_zeroed, dealloc, Layout};
    use std::mem::{align_of, size_of};
    let size = size_of::<SendComm>()
        .max(size_of::<RecvComm>())
        .max(size_of::<ListenComm>());
    let align = align_of::<SendComm>()
        .max(align_of::<RecvComm>())
        .max(align_of::<ListenComm>());
    let layout = Layout::from_size_align(size, align).unwrap();
    // SAFETY: the layout is non-zero in size.
    let pointer = unsafe { alloc_zeroed(layout) };
    assert!(!pointer.is_null());
    let t = &ncclNetPlugin_v12.0;
    // SAFETY: `pointer` is a live zeroed block the size of any comm; each close reads its first
    // word, finds no magic and returns before taking ownership.
    unsafe {
        let comm = pointer.cast::<c_void>();
        assert_eq!(t.close_send.expect("closeSend")(comm), INVALID_ARGUMENT);
        assert_eq!(t.close_recv.expect("closeRecv")(comm), INVALID_ARGUMENT);
        assert_eq!(t.close_listen.expect("closeListen")(comm), INVALID_ARGUMENT);
        let bytes = std::slice::from_raw_parts(pointer, size);
        assert!(bytes.iter().all(|byte| *byte == 0), "nothing written");
        // Still ours to free: had a close freed it, this would be a double free.
        dealloc(pointer, layout);
    }
}
