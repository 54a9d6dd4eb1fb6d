//! Conformance of the built plugin as NCCL sees it: only through the exported
//! `ncclNetPlugin_v7` … `_v12` tables of `libnccl-net-mpib.so`, loaded with
//! `dlopen(RTLD_NOW | RTLD_LOCAL)` by `mpib-driver` (never through the `mpib` crate's internals).
//!
//! Every test runs with `MPIB_FABRIC=loopback` (two loopback rails of 100000 Mbps). Cases that need
//! another environment from the first `init` on, or a real unload, run in a child process.
#![allow(clippy::unwrap_used, clippy::expect_used)] // A failed unwrap fails the test, with its message.

use std::ptr;
use std::time::Duration;

use mpib_driver::abi::{
    HANDLE_SIZE, NCCL_INVALID_ARGUMENT, NCCL_INVALID_USAGE, NCCL_MAX_NET_SIZE_BYTES,
    NCCL_NET_DEVICE_HOST, NCCL_PTR_HOST,
};
use mpib_driver::net::RecvBuf;
use mpib_driver::testing::{bounded, exchange_sizes, shared_plugin, LOOPBACK};
use mpib_driver::{child, Error, Pair, Plan, Plugin, Props, Version};

const LIMIT: Duration = Duration::from_secs(180);
const CHILD_LIMIT: Duration = Duration::from_secs(120);

fn plugin() -> &'static Plugin {
    shared_plugin(LOOPBACK)
}

fn check_properties(version: Version, p: &Props) {
    assert_eq!(
        p.speed, 200_000,
        "{version} speed: two loopback rails of 100000 Mbps each"
    );
    assert_eq!(
        p.net_device_type, NCCL_NET_DEVICE_HOST,
        "{version} netDeviceType"
    );
    assert_eq!(p.max_recvs, 8, "{version} maxRecvs");
    assert_eq!(p.ptr_support, NCCL_PTR_HOST, "{version} ptrSupport");
    assert!(!p.name.is_empty(), "{version} device name");
    assert!(p.max_comms >= 1, "{version} maxComms {}", p.max_comms);
    if version.has_vdevice() {
        assert_eq!(p.force_flush, Some(0), "{version} forceFlush");
        assert_eq!(
            p.vprops,
            Some((1, vec![0])),
            "{version} vProps: the device itself"
        );
        let max = p.max_p2p_bytes.expect("v9+ has maxP2pBytes");
        assert!(
            max > 0 && max <= NCCL_MAX_NET_SIZE_BYTES,
            "{version} maxP2pBytes {max}"
        );
    }
}

#[test]
fn every_version_is_exported_with_name_mpib_and_required_slots() {
    bounded(LIMIT, || {
        for version in Version::ALL {
            assert_eq!(
                plugin().name(version).unwrap_or_else(|e| panic!("{e}")),
                "MPIB"
            );
            let net = plugin().net(version).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(net.name(), "MPIB", "{version}");
            net.check_required_slots().unwrap_or_else(|e| panic!("{e}"));
        }
    });
}

#[test]
fn init_devices_and_properties() {
    bounded(LIMIT, || {
        for version in Version::ALL {
            let net = plugin().net(version).unwrap();
            let ctx = net.init(0xC0F).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(
                net.devices().unwrap_or_else(|e| panic!("{e}")),
                1,
                "{version} devices"
            );
            let props = net.get_properties(0).unwrap_or_else(|e| panic!("{e}"));
            check_properties(version, &props);
            match net.get_properties(1) {
                Err(e) => assert!(e.code().is_some_and(|c| c != 0), "{version}: {e}"),
                Ok(p) => panic!("{version} getProperties(1) succeeded: {p:?}"),
            }
            net.finalize(ctx).unwrap_or_else(|e| panic!("{e}"));
        }
    });
}

#[test]
fn make_vdevice_is_invalid_usage() {
    bounded(LIMIT, || {
        for version in Version::ALL.into_iter().filter(|v| v.has_vdevice()) {
            let net = plugin().net(version).unwrap();
            let ctx = net.init(0xDE).unwrap_or_else(|e| panic!("{e}"));
            let err = net
                .make_vdevice(&[0, 0])
                .expect_err("makeVDevice must be refused");
            assert_eq!(err.code(), Some(NCCL_INVALID_USAGE), "{version}: {err}");
            assert_eq!(net.devices().unwrap(), 1, "{version}: still one device");
            net.finalize(ctx).unwrap();
        }
    });
}

#[test]
fn null_arguments_are_invalid_argument() {
    bounded(LIMIT, || {
        for version in Version::ALL {
            let net = plugin().net(version).unwrap();
            let ctx = net.init(0x4E).unwrap_or_else(|e| panic!("{e}"));
            let mut pair = Pair::connect(&net).unwrap_or_else(|e| panic!("{e}"));
            pair.reserve(8192, 8192).unwrap();
            let expect = |what: &str, code: Result<i32, Error>| {
                let code = code.unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(code, NCCL_INVALID_ARGUMENT, "{version} {what}");
            };
            // SAFETY: NULL arguments are what is being tested; the plugin must reject them.
            expect("devices(NULL)", unsafe { net.devices_raw(ptr::null_mut()) });
            // SAFETY: as above.
            expect("getProperties(0, NULL)", unsafe {
                net.get_properties_raw(0, ptr::null_mut())
            });
            let mut out = ptr::null_mut();
            // SAFETY: as above; `out` is writable.
            expect("listen(handle NULL)", unsafe {
                net.listen_raw(&ctx, 0, ptr::null_mut(), &mut out)
            });
            assert!(
                out.is_null(),
                "{version} listen wrote a comm despite the error"
            );
            let mut handle = [0u8; HANDLE_SIZE];
            let h = handle.as_mut_ptr().cast();
            // SAFETY: as above; `handle` is 128 bytes.
            expect("listen(listenComm NULL)", unsafe {
                net.listen_raw(&ctx, 0, h, ptr::null_mut())
            });
            let mut done = 0;
            // SAFETY: as above.
            expect("test(NULL request)", unsafe {
                net.test_raw(ptr::null_mut(), &mut done, ptr::null_mut())
            });
            let (data, mh) = pair.send_buffer(0);
            let mh = mh.as_ptr();
            let send = pair.send_comm().as_ptr();
            // SAFETY: a live comm and registered buffer; only the request pointer is NULL.
            expect("isend(request NULL)", unsafe {
                net.isend_raw(send, data, 16, 0, mh, ptr::null_mut())
            });
            let (data, mh) = pair.recv_buffer(0);
            let buf = RecvBuf {
                data,
                size: 16,
                tag: 0,
                mhandle: mh.as_ptr(),
            };
            let recv = pair.recv_comm().as_ptr();
            // SAFETY: as above.
            expect("irecv(request NULL)", unsafe {
                net.irecv_raw(recv, &[buf], ptr::null_mut())
            });
            // The comms still work after the refused calls.
            exchange_sizes(&mut pair, &[4097], "after NULL arguments", 1)
                .unwrap_or_else(|e| panic!("{e}"));
            pair.close().unwrap_or_else(|e| panic!("{e}"));
            net.finalize(ctx).unwrap_or_else(|e| panic!("{e}"));
        }
    });
}

#[test]
fn iflush_returns_a_null_request() {
    bounded(LIMIT, || {
        for version in Version::ALL {
            let net = plugin().net(version).unwrap();
            let mut pair = Pair::connect(&net).unwrap_or_else(|e| panic!("{e}"));
            let plan = Plan::single(4097);
            pair.exchange(&plan, 0xF1, 0)
                .unwrap_or_else(|e| panic!("{e}"));
            let (data, mh) = pair.recv_buffer(plan.recvs[0][0].offset);
            let buf = RecvBuf {
                data,
                size: 4097,
                tag: 0,
                mhandle: mh.as_ptr(),
            };
            // SAFETY: the buffer was just received into and is registered on this comm.
            let request =
                unsafe { net.iflush(pair.recv_comm(), &[buf]) }.unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(request, None, "{version} iflush returned a request");
            pair.close().unwrap_or_else(|e| panic!("{e}"));
        }
    });
}

#[test]
fn test_accepts_null_sizes() {
    bounded(LIMIT, || {
        for version in Version::ALL {
            let net = plugin().net(version).unwrap();
            let mut pair = Pair::connect(&net).unwrap_or_else(|e| panic!("{e}"));
            for size in [0, 4097, 65_536] {
                let plan = Plan::single(size).with_null_sizes();
                pair.exchange(&plan, 0x5, size as u64)
                    .unwrap_or_else(|e| panic!("{e}"));
            }
            pair.close().unwrap_or_else(|e| panic!("{e}"));
        }
    });
}

#[test]
fn irecv_ignores_a_preset_request() {
    bounded(LIMIT, || {
        for version in Version::ALL {
            let net = plugin().net(version).unwrap();
            let mut pair = Pair::connect(&net).unwrap_or_else(|e| panic!("{e}"));
            let plan = Plan::pipeline(16, |i| 1 + 509 * i, 8).with_preset_request();
            pair.exchange(&plan.labelled("*request = (void*)1"), 0x1, 0)
                .unwrap_or_else(|e| panic!("{e}"));
            pair.close().unwrap_or_else(|e| panic!("{e}"));
        }
    });
}

#[test]
fn pre_v9_sizes_over_1_gib_are_refused_like_nccl() {
    for version in [Version::V7, Version::V8] {
        let net = plugin().net(version).unwrap();
        let mut request = ptr::null_mut();
        let null = ptr::null_mut();
        // SAFETY: the driver refuses the size before reaching the plugin (as NCCL's v8 shim does),
        // so the NULL comm and buffer are never used.
        let result = unsafe { net.isend_raw(null, null, (1 << 30) + 1, 0, null, &mut request) };
        assert!(
            matches!(result, Err(Error::Refused(_))),
            "{version}: {result:?}"
        );
    }
}

#[test]
fn unknown_rail_makes_init_fail() {
    let env = [("MPIB_FABRIC", "loopback"), ("MPIB_HCA_SUP", "nosuch")];
    let outcome = child::run_test("child_unknown_rail", &env, CHILD_LIMIT).unwrap();
    outcome.assert_success("child_unknown_rail");
}

#[test]
#[ignore = "runs in a child process started by unknown_rail_makes_init_fail"]
fn child_unknown_rail() {
    if !child::is_child("child_unknown_rail") {
        return;
    }
    let plugin = mpib_driver::load_built_plugin().unwrap_or_else(|e| panic!("{e}"));
    for version in Version::ALL {
        let net = plugin.net(version).unwrap();
        match net.init(0xBAD) {
            Ok(_) => panic!("{version} init succeeded with MPIB_HCA_SUP=nosuch"),
            Err(e) => {
                assert!(e.code().is_some_and(|c| c != 0), "{version}: {e}");
                eprintln!("{version}: init failed as expected: {e}");
            }
        }
    }
}

#[test]
fn unload_and_reload() {
    let outcome = child::run_test("child_unload_reload", LOOPBACK, CHILD_LIMIT).unwrap();
    outcome.assert_success("child_unload_reload");
}

#[test]
#[ignore = "runs in a child process started by unload_and_reload"]
fn child_unload_reload() {
    if !child::is_child("child_unload_reload") {
        return;
    }
    for round in 0..3u64 {
        let plugin = mpib_driver::load_built_plugin().unwrap_or_else(|e| panic!("{e}"));
        for version in Version::ALL {
            // NCCL reads `name` straight after dlsym, before any init.
            assert_eq!(
                plugin.name(version).unwrap(),
                "MPIB",
                "round {round} {version}"
            );
        }
        for version in [Version::V12, Version::V11] {
            let net = plugin.net(version).unwrap();
            let mut pair = Pair::connect(&net).unwrap_or_else(|e| panic!("round {round}: {e}"));
            let case = format!("reload round {round}");
            exchange_sizes(&mut pair, &[0, 4097, 1 << 20], &case, 1)
                .unwrap_or_else(|e| panic!("round {round}: {e}"));
            // closeSend, closeRecv and finalize of both contexts, as NCCL does before dlclose.
            pair.close()
                .unwrap_or_else(|e| panic!("round {round}: {e}"));
        }
        drop(plugin); // dlclose; nothing else in this process holds the library
        eprintln!("round {round}: loaded, moved bytes, finalized, unloaded");
    }
}
