//! Lists that cannot be used fail `init` naming the item, and `MPIB_HCA_SUP=auto` pairs by PCI
//! distance over a fake sysfs tree (`MPIB_SYSFS`): same switch first, a WARN for a pair that
//! meets only at the host bridge, never across NUMA nodes. Each case runs in a child process.
#![allow(clippy::unwrap_used, clippy::expect_used)] // A failed unwrap fails the test, with its message.

#[path = "common/devices.rs"]
mod devices;

use std::path::{Path, PathBuf};

use devices::*;
use mpib_driver::{child, Version};

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
fn auto_warns_about_a_pair_that_meets_only_at_the_host_bridge() {
    let sysfs = two_socket_node("bridge");
    let root = sysfs.path().to_str().unwrap().to_string();
    // loop4's only candidate, loop5, is behind the other switch of the same host bridge.
    let mut env = loopback_env("loop4", "auto:loop5");
    env.push(("MPIB_SYSFS", &root));
    let output = run_child("child_host_bridge", &env);
    assert!(
        output.contains(
            "device 0 loop4+loop5: paired by PCI distance, meeting only at the host bridge"
        ) && output.contains("NVIDIA/nccl#2310"),
        "one WARN naming the pair and why:\n{output}"
    );
}

#[test]
#[ignore = "runs in a child process started by auto_warns_about_a_pair_that_meets_only_at_the_host_bridge"]
fn child_host_bridge() {
    if !child::is_child("child_host_bridge") {
        return;
    }
    let plugin = load();
    let net = plugin.net(Version::V12).unwrap();
    let ctx = net.init(0xB).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(net.get_properties(0).unwrap().name, "loop4+loop5");
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
