//! Several fused devices per node, through the exported tables only: lists of NIC pairs in
//! `MPIB_HCA_SOUT`/`MPIB_HCA_SUP`, a SUP NIC shared by two SOUT NICs, `MPIB_HCA_SUP=auto` over a
//! fake sysfs PCI tree (`MPIB_SYSFS`), bad lists, and the conformance cases on every device.
//!
//! Each case needs its environment from the first `init` on, so it runs in a child process.

use std::path::{Path, PathBuf};
use std::time::Duration;

use std::collections::BTreeMap;

use mpib_driver::rails::Probes;
use mpib_driver::testing::{exchange_grouped, exchange_sizes};
use mpib_driver::{child, Net, Pair, PairOptions, Plan, Plugin, Props, Version};
use mpib_probes::declared::{RAIL_RX_BYTES, RAIL_TX_BYTES};
use mpib_probes::{LoadState, ProbesReader};

const CHILD_LIMIT: Duration = Duration::from_secs(240);

fn loopback_env<'a>(sout: &'a str, sup: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        ("MPIB_FABRIC", "loopback"),
        ("MPIB_HCA_SOUT", sout),
        ("MPIB_HCA_SUP", sup),
        ("MPIB_PROBES", "0"),
    ]
}

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

fn run_child(name: &str, env: &[(&str, &str)]) -> String {
    let outcome = child::run_test(name, env, CHILD_LIMIT).unwrap();
    outcome.assert_success(name);
    outcome.output
}

fn load() -> Plugin {
    mpib_driver::load_built_plugin().unwrap_or_else(|e| panic!("{e}"))
}

fn names(count: usize, name: impl Fn(usize) -> String) -> String {
    (0..count).map(name).collect::<Vec<_>>().join(",")
}

/// The conformance cases, on a pair between device `listen` (receiver) and `connect` (sender).
fn conformance_on(net: &Net<'_>, listen: i32, connect: i32) {
    let options = PairOptions {
        dev: listen,
        connect_dev: Some(connect),
        ..PairOptions::default()
    };
    let case = format!("{} device {listen} <- {connect}", net.version());
    let mut pair = Pair::connect_with(net, &options).unwrap_or_else(|e| panic!("{case}: {e}"));
    let sizes = [0, 1, 4095, 4097, 65_536, 1 << 20];
    exchange_sizes(&mut pair, &sizes, &case, 2).unwrap_or_else(|e| panic!("{case}: {e}"));
    exchange_grouped(&mut pair, &case).unwrap_or_else(|e| panic!("{case}: {e}"));
    let larger = Plan::pipeline(64, |i| (i * 4099) % 300_000, 8).with_capacities(|s| s + 512);
    pair.exchange(&larger, 7, 0)
        .unwrap_or_else(|e| panic!("{case} larger receives: {e}"));
    pair.close().unwrap_or_else(|e| panic!("{case}: {e}"));
}

/// Every device: its own name, GUID and (GUID, port), vProps naming itself, railId its index.
fn check_identities(version: Version, all: &[Props]) {
    for (dev, props) in all.iter().enumerate() {
        let dev = dev as i32;
        if version.has_vdevice() {
            assert_eq!(props.vprops, Some((1, vec![dev])), "{version} device {dev}");
        }
        if version == Version::V12 {
            assert_eq!(
                props.rail_id,
                Some(dev as i16),
                "{version} device {dev} railId"
            );
            assert_eq!(props.plane_id, Some(-1), "{version} device {dev} planeId");
        }
        for (other, second) in all.iter().enumerate().skip(dev as usize + 1) {
            assert_ne!(
                props.name, second.name,
                "{version} devices {dev} and {other}"
            );
            assert_ne!(
                (props.guid, props.port),
                (second.guid, second.port),
                "{version} devices {dev} and {other}: NCCL charges bandwidth per (guid, port)"
            );
        }
    }
}

fn all_properties(net: &Net<'_>) -> Vec<Props> {
    let count = net.devices().unwrap_or_else(|e| panic!("{e}"));
    (0..count)
        .map(|dev| net.get_properties(dev).unwrap_or_else(|e| panic!("{e}")))
        .collect()
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
    run_child("child_four_pairs", &with_probes(loopback_env(&sout, &sup), &dir));
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

/// Each bad pair of lists, and what the error must name.
const BAD_LISTS: [(&str, &str, &str); 7] = [
    ("loop0,loop2,loop0", "loop1", "loop0 appears twice"),
    (
        "loop0,loop2,loop4",
        "loop1,loop3",
        "not 3 SOUT NIC(s) and 2 SUP NIC(s)",
    ),
    ("loop0,loop2", "loop1,loop2", "loop2 appears twice"),
    ("loop0,,loop2", "loop1", "item 2 is empty"),
    ("loop0,loop99", "loop1", "no loopback device named `loop99`"),
    ("loop0", "loop0:1", "loop0 port 1 twice"),
    ("loop0", "auto", "SOUT NIC loop0 has no PCI path"),
];

#[test]
fn bad_lists_fail_init_naming_the_item() {
    let output = run_child(
        "child_bad_lists",
        &[("MPIB_FABRIC", "loopback"), ("MPIB_PROBES", "0")],
    );
    // The error reaches NCCL's log (here stderr: the driver passes no logger).
    for (sout, sup, named) in BAD_LISTS {
        assert!(
            output.contains(named),
            "{sout} / {sup}: no `{named}` in\n{output}"
        );
    }
}

#[test]
#[ignore = "runs in a child process started by bad_lists_fail_init_naming_the_item"]
fn child_bad_lists() {
    if !child::is_child("child_bad_lists") {
        return;
    }
    let plugin = load();
    let net = plugin.net(Version::V12).unwrap();
    for (sout, sup, _) in BAD_LISTS {
        let vars = [("MPIB_HCA_SOUT", Some(sout)), ("MPIB_HCA_SUP", Some(sup))];
        match net.init_with_env(0xBAD, &vars) {
            Ok(_) => panic!("init succeeded with MPIB_HCA_SOUT={sout} MPIB_HCA_SUP={sup}"),
            Err(e) => assert!(e.code().is_some_and(|c| c != 0), "{sout} / {sup}: {e}"),
        }
    }
}

/// A fake sysfs tree: `class/infiniband/NAME/device` links into `devices/pci.../BDF`, each
/// function with its `numa_node`.
struct FakeSysfs {
    root: PathBuf,
}

impl FakeSysfs {
    fn new(tag: &str) -> FakeSysfs {
        let root = std::env::temp_dir().join(format!("mpib-sysfs-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("class/infiniband")).unwrap();
        FakeSysfs { root }
    }

    /// Places NIC `name` at `pci_path` (below `devices/`) on `numa_node`.
    fn place(&self, name: &str, pci_path: &str, numa_node: i32) -> &FakeSysfs {
        let function = self.root.join("devices").join(pci_path);
        std::fs::create_dir_all(&function).unwrap();
        std::fs::write(function.join("numa_node"), format!("{numa_node}\n")).unwrap();
        let class = self.root.join("class/infiniband").join(name);
        std::fs::create_dir_all(&class).unwrap();
        std::os::unix::fs::symlink(&function, class.join("device")).unwrap();
        self
    }

    fn path(&self) -> &Path {
        &self.root
    }
}

impl Drop for FakeSysfs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// Two switches under one host bridge on node 0 (loop4 and loop1 behind the first, loop0 and
/// loop5 behind the second), and loop2 and loop3 on node 1.
fn two_socket_node(tag: &str) -> FakeSysfs {
    let sysfs = FakeSysfs::new(tag);
    let switch_a = "pci0000:00/0000:00:01.0/0000:01:00.0";
    let switch_b = "pci0000:00/0000:00:02.0/0000:10:00.0";
    let far = "pci0000:80/0000:80:01.0/0000:81:00.0";
    sysfs
        .place("loop4", &format!("{switch_a}/0000:02:08.0/0000:03:00.0"), 0)
        .place("loop1", &format!("{switch_a}/0000:02:10.0/0000:04:00.0"), 0)
        .place("loop0", &format!("{switch_b}/0000:11:08.0/0000:12:00.0"), 0)
        .place("loop5", &format!("{switch_b}/0000:11:10.0/0000:13:00.0"), 0)
        .place("loop2", &format!("{far}/0000:82:00.0/0000:83:00.0"), 1)
        .place("loop3", &format!("{far}/0000:82:04.0/0000:84:00.0"), 1);
    sysfs
}

#[test]
fn auto_pairs_by_pci_distance_in_pci_order() {
    let sysfs = two_socket_node("auto");
    let root = sysfs.path().to_str().unwrap().to_string();
    let mut env = loopback_env("loop0,loop4", "auto:loop5,loop1,loop3");
    env.push(("MPIB_SYSFS", &root));
    run_child("child_auto", &env);
}

#[test]
#[ignore = "runs in a child process started by auto_pairs_by_pci_distance_in_pci_order"]
fn child_auto() {
    if !child::is_child("child_auto") {
        return;
    }
    let plugin = load();
    let net = plugin.net(Version::V12).unwrap();
    let ctx = net.init(0xA).unwrap_or_else(|e| panic!("{e}"));
    let all = all_properties(&net);
    let names: Vec<&str> = all.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(
        names,
        ["loop4+loop1", "loop0+loop5"],
        "SOUT PCI order, same switch"
    );
    let path = |dev: usize| all[dev].pci_path.clone().unwrap_or_default();
    assert!(
        path(0).ends_with("/0000:03:00.0"),
        "the SOUT NIC's pciPath: {}",
        path(0)
    );
    assert!(path(1).ends_with("/0000:12:00.0"), "{}", path(1));
    check_identities(Version::V12, &all);
    conformance_on(&net, 1, 0);
    net.finalize(ctx).unwrap();
}

#[test]
fn auto_never_pairs_across_numa_nodes() {
    let sysfs = two_socket_node("numa");
    let root = sysfs.path().to_str().unwrap().to_string();
    let mut env = loopback_env("loop2", "auto:loop1,loop5");
    env.push(("MPIB_SYSFS", &root));
    let output = run_child("child_cross_numa", &env);
    assert!(
        output.contains("SOUT NIC loop2") && output.contains("never pairs across NUMA nodes"),
        "the error names the NIC:\n{output}"
    );
}

#[test]
#[ignore = "runs in a child process started by auto_never_pairs_across_numa_nodes"]
fn child_cross_numa() {
    if !child::is_child("child_cross_numa") {
        return;
    }
    let plugin = load();
    let net = plugin.net(Version::V12).unwrap();
    let error = net
        .init(0xC)
        .expect_err("loop2 has no SUP candidate on NUMA node 1");
    assert!(error.code().is_some_and(|c| c != 0), "{error}");
}
