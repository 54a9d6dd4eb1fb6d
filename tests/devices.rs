//! Several fused devices per node, through the exported tables only: lists of NIC pairs in
//! `MPIB_HCA_SOUT`/`MPIB_HCA_SUP`, a SUP NIC shared by two SOUT NICs, the conformance cases on
//! every device with its traffic on its own NICs only, a flow per device for the agent, and one
//! pair reporting what it always reported (bad lists and `auto`: tests/devices_lists.rs).
//!
//! Each case needs its environment from the first `init` on, so it runs in a child process.
#![allow(clippy::unwrap_used, clippy::expect_used)] // A failed unwrap fails the test, with its message.

#[path = "common/devices.rs"]
mod devices;

use std::collections::BTreeMap;
use std::time::Duration;

use devices::*;
use mpib_driver::rails::Probes;
use mpib_driver::{child, Net, Pair, PairOptions, Version};
use mpib_probes::declared::{RAIL_RX_BYTES, RAIL_TX_BYTES};
use mpib_probes::{LoadState, ProbesReader};

/// The loopback environment with probes on, in a directory of the test's own.
fn with_probes<'a>(mut env: Vec<(&'a str, &'a str)>, dir: &'a str) -> Vec<(&'a str, &'a str)> {
    env.retain(|(k, _)| *k != "MPIB_PROBES");
    env.push(("MPIB_PROBES_DIR", dir));
    env
}

fn probes_dir(tag: &str) -> String {
    let dir = std::env::temp_dir().join(format!("mpib-devices-{tag}-{}", std::process::id()));
    dir.to_string_lossy().into_owned()
}

/// Bytes each NIC sent and received so far, by NIC name, from this process's probes file; and
/// the probes file's devices as (name, SOUT NIC, SUP NIC).
/// A fused device as the probes file lists it: its name, its SOUT NIC, its SUP NIC.
type ListedDevice = (String, String, String);

fn nic_bytes() -> (BTreeMap<String, u64>, Vec<ListedDevice>) {
    let path = Probes::open_own()
        .unwrap_or_else(|e| panic!("{e}"))
        .path()
        .to_path_buf();
    let LoadState::Ready(reader) = ProbesReader::open(&path).unwrap() else {
        panic!("{} is not ready", path.display());
    };
    let info = reader.info().clone();
    let snapshot = reader.snapshot();
    let bytes = info
        .rails
        .iter()
        .zip(&snapshot.rails)
        .map(|(nic, rail)| {
            let moved = rail.counter(RAIL_TX_BYTES) + rail.counter(RAIL_RX_BYTES);
            (nic.device.clone(), moved)
        })
        .collect();
    let name = |slot: usize| info.rails[slot].device.clone();
    let devices = info
        .devices
        .iter()
        .map(|d| (d.name.clone(), name(d.nics[0]), name(d.nics[1])))
        .collect();
    (bytes, devices)
}

/// Runs the conformance cases on device `dev` and checks that only its two NICs moved bytes,
/// and that its connections are recorded under it.
fn conformance_seen_on_its_nics(net: &Net<'_>, dev: i32, nics: [&str; 2]) {
    let (before, _) = nic_bytes();
    let options = PairOptions {
        dev,
        ..PairOptions::default()
    };
    let pair = Pair::connect_with(net, &options).unwrap_or_else(|e| panic!("{e}"));
    let connections = Probes::open_own().unwrap().connections().unwrap();
    assert!(
        connections.len() == 2 && connections.iter().all(|c| i32::from(c.device) == dev),
        "device {dev}'s connections: {connections:?}"
    );
    pair.close().unwrap();
    conformance_on(net, dev, dev);
    let (after, _) = nic_bytes();
    for (nic, moved) in &after {
        let delta = moved - before.get(nic).copied().unwrap_or(0);
        if nics.contains(&nic.as_str()) {
            continue;
        }
        assert_eq!(
            delta, 0,
            "device {dev} ({nics:?}) moved {delta} bytes on {nic}"
        );
    }
    let own: u64 = nics
        .iter()
        .map(|nic| after[*nic] - before.get(*nic).copied().unwrap_or(0))
        .sum();
    assert!(own > 0, "device {dev} moved nothing on {nics:?}");
}

#[test]
fn eight_pairs_each_pass_the_conformance_cases() {
    let sout = names(8, |i| format!("loop{}", 2 * i));
    let sup = names(8, |i| format!("loop{}", 2 * i + 1));
    let dir = probes_dir("eight");
    run_child(
        "child_eight_pairs",
        &with_probes(loopback_env(&sout, &sup), &dir),
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "runs in a child process started by eight_pairs_each_pass_the_conformance_cases"]
fn child_eight_pairs() {
    if !child::is_child("child_eight_pairs") {
        return;
    }
    let plugin = load();
    for version in Version::ALL {
        let net = plugin.net(version).unwrap();
        let ctx = net.init(0x8).unwrap_or_else(|e| panic!("{e}"));
        let all = all_properties(&net);
        assert_eq!(all.len(), 8, "{version} devices()");
        for (dev, props) in all.iter().enumerate() {
            let expected = format!("loop{}+loop{}", 2 * dev, 2 * dev + 1);
            assert_eq!(
                props.name, expected,
                "{version} device {dev}, in listed order"
            );
            assert_eq!(
                props.speed, 200_000,
                "{version} device {dev}: its own SOUT + SUP"
            );
            assert_eq!(props.max_comms, 32_768, "{version} device {dev}");
        }
        check_identities(version, &all);
        let refused = net.get_properties(8).expect_err("device 8 does not exist");
        assert!(
            refused.code().is_some_and(|c| c != 0),
            "{version}: {refused}"
        );
        net.finalize(ctx).unwrap();
    }
    // Per-device telemetry: each device's traffic on its own two NICs only.
    let net = plugin.net(Version::V12).unwrap();
    let ctx = net.init(0x88).unwrap();
    let (_, devices) = nic_bytes();
    assert_eq!(devices.len(), 8, "the probes file lists every device");
    for (dev, (name, sout, sup)) in devices.iter().enumerate() {
        assert_eq!(*name, format!("{sout}+{sup}"));
        conformance_seen_on_its_nics(&net, dev as i32, [sout, sup]);
    }
    net.finalize(ctx).unwrap();
    // Every device on the newest ABI and an old one; then devices that NCCL's search paired
    // across hosts differently: 3 here, 5 there.
    for version in [Version::V12, Version::V8] {
        let net = plugin.net(version).unwrap();
        for dev in 0..8 {
            conformance_on(&net, dev, dev);
        }
        conformance_on(&net, 3, 5);
        conformance_on(&net, 7, 0);
    }
}

#[test]
fn four_pairs_each_pass_the_conformance_cases() {
    let sout = names(4, |i| format!("loop{}", 2 * i));
    let sup = names(4, |i| format!("loop{}", 2 * i + 1));
    let dir = probes_dir("four");
    run_child(
        "child_four_pairs",
        &with_probes(loopback_env(&sout, &sup), &dir),
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "runs in a child process started by four_pairs_each_pass_the_conformance_cases"]
fn child_four_pairs() {
    if !child::is_child("child_four_pairs") {
        return;
    }
    let plugin = load();
    let net = plugin.net(Version::V11).unwrap();
    let ctx = net.init(0x4).unwrap_or_else(|e| panic!("{e}"));
    let all = all_properties(&net);
    assert_eq!(all.len(), 4);
    check_identities(Version::V11, &all);
    let (_, devices) = nic_bytes();
    for (dev, (_, sout, sup)) in devices.iter().enumerate() {
        conformance_seen_on_its_nics(&net, dev as i32, [sout, sup]);
    }
    conformance_on(&net, 0, 3);
    net.finalize(ctx).unwrap();
}

#[test]
fn eight_sout_nics_share_four_sup_nics() {
    let sout = names(8, |i| format!("loop{i}"));
    let sup = names(4, |i| format!("loop{}", 8 + i));
    let dir = probes_dir("shared");
    run_child(
        "child_shared_sup",
        &with_probes(loopback_env(&sout, &sup), &dir),
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "runs in a child process started by eight_sout_nics_share_four_sup_nics"]
fn child_shared_sup() {
    if !child::is_child("child_shared_sup") {
        return;
    }
    let plugin = load();
    let net = plugin.net(Version::V12).unwrap();
    let ctx = net.init(0x84).unwrap_or_else(|e| panic!("{e}"));
    let all = all_properties(&net);
    assert_eq!(all.len(), 8);
    for (dev, props) in all.iter().enumerate() {
        let expected = format!("loop{dev}+loop{}", 8 + dev / 2);
        assert_eq!(
            props.name, expected,
            "SUP NIC k serves SOUT NICs 2k and 2k+1"
        );
        assert_eq!(
            props.speed, 150_000,
            "SOUT 100000 + half of a shared SUP NIC"
        );
        assert_eq!(
            props.max_comms, 16_384,
            "half the shared SUP NIC's QPs, 4 per comm"
        );
    }
    check_identities(Version::V12, &all);
    let (before, devices) = nic_bytes();
    assert_eq!(
        before.len(),
        12,
        "12 NICs, the shared ones once: {before:?}"
    );
    assert_eq!(
        devices[1],
        ("loop1+loop8".into(), "loop1".into(), "loop8".into())
    );
    for dev in [0, 1, 6] {
        conformance_on(&net, dev, dev);
    }
    // Devices 0 and 1 share loop8: one NIC slot, both devices' bytes in it.
    let (after, _) = nic_bytes();
    let moved = |nic: &str| after[nic] - before[nic];
    conformance_on(&net, 1, 1);
    let (again, _) = nic_bytes();
    assert!(
        again["loop8"] - after["loop8"] > 0,
        "device 1 counts on the shared loop8"
    );
    assert_eq!(
        again["loop0"], after["loop0"],
        "device 1 leaves device 0's SOUT NIC alone"
    );
    assert!(
        moved("loop11") > 0 && moved("loop9") == 0,
        "device 6 is on loop6+loop11"
    );
    net.finalize(ctx).unwrap();
}

#[test]
fn each_device_is_its_own_flow_for_the_agent() {
    let sout = "loop0,loop2";
    let sup = "loop1,loop3";
    run_child("child_flows", &loopback_env(sout, sup));
}

#[test]
#[ignore = "runs in a child process started by each_device_is_its_own_flow_for_the_agent"]
fn child_flows() {
    if !child::is_child("child_flows") {
        return;
    }
    let agent = mpib_driver::Agent::start_in_temp().unwrap_or_else(|e| panic!("{e}"));
    let env: Vec<(String, Option<String>)> = agent
        .env()
        .into_iter()
        .map(|(k, v)| (k.to_string(), Some(v)))
        .collect();
    let plugin = load();
    let net = plugin.net(Version::V12).unwrap();
    let mut pairs = Vec::new();
    for dev in [0, 1] {
        let options = PairOptions {
            dev,
            recv_env: env.clone(),
            send_env: env.clone(),
            ..PairOptions::default()
        };
        pairs.push(Pair::connect_with(&net, &options).unwrap_or_else(|e| panic!("{e}")));
    }
    let registrations = agent
        .wait_for_registrations(4, Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("{e}"));
    // Both sides of each device's connection register; the flow key is the SOUT NICs' pair
    // (loop0's 127.0.0.1, loop2's 127.0.0.3), not the control connection's (127.0.0.1 for
    // every device of a loopback process, as one address serves every device of a host).
    let flows: std::collections::BTreeSet<_> = registrations
        .iter()
        .map(|r| (r.sout_src, r.sout_dst))
        .collect();
    assert_eq!(flows.len(), 2, "one flow per device: {registrations:?}");
    for pair in pairs {
        pair.close().unwrap();
    }
}

#[test]
fn one_pair_reports_what_it_always_reported() {
    run_child("child_one_pair", &loopback_env("loop0", "loop1"));
}

#[test]
#[ignore = "runs in a child process started by one_pair_reports_what_it_always_reported"]
fn child_one_pair() {
    if !child::is_child("child_one_pair") {
        return;
    }
    let plugin = load();
    for version in Version::ALL {
        let net = plugin.net(version).unwrap();
        let ctx = net.init(0x1).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(net.devices().unwrap(), 1);
        let props = net.get_properties(0).unwrap();
        // The values a single-pair node reported before devices were lists.
        assert_eq!(props.name, "loop0+loop1");
        assert_eq!(props.pci_path, None);
        assert_eq!(props.guid, 0x4d50_4942_4c4f_4f00 | 1, "loop0's GUID");
        assert_eq!((props.speed, props.port, props.latency), (200_000, 1, 0.0));
        assert_eq!((props.max_comms, props.max_recvs), (32_768, 8));
        if version.has_vdevice() {
            assert_eq!(props.vprops, Some((1, vec![0])), "{version}");
        }
        if version == Version::V12 {
            assert_eq!((props.rail_id, props.plane_id), (Some(-1), Some(-1)));
        }
        net.finalize(ctx).unwrap();
    }
}
