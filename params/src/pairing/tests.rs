use super::locality::{nearness, pair_by_locality, Located, Nearness, PciLocation};
use super::{device_order, parse_lists, sup_in_order, NicLists, SupChoice};

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

#[test]
fn single_nics_mean_what_they_always_meant() {
    let lists = parse_lists("mlx5_0:1", "mlx5_1").unwrap();
    assert_eq!(
        lists,
        NicLists {
            sout: strings(&["mlx5_0:1"]),
            sup: SupChoice::Listed(strings(&["mlx5_1"])),
        }
    );
    // Unset stays empty: opening then names the variable that is not set.
    assert_eq!(parse_lists("", "").unwrap().sout, Vec::<String>::new());
}

#[test]
fn lists_pair_in_order_and_a_sup_nic_serves_consecutive_sout_nics() {
    let lists = parse_lists("a, b ,c,d", "x,y").unwrap();
    assert_eq!(lists.sout, strings(&["a", "b", "c", "d"]));
    assert_eq!(sup_in_order(4, 2).unwrap(), vec![0, 0, 1, 1]);
    assert_eq!(sup_in_order(8, 8).unwrap(), (0..8).collect::<Vec<_>>());
    assert_eq!(sup_in_order(8, 4).unwrap(), vec![0, 0, 1, 1, 2, 2, 3, 3]);
    assert_eq!(parse_lists("a", "auto").unwrap().sup, SupChoice::Auto(None));
    assert_eq!(
        parse_lists("a", "auto:x,y").unwrap().sup,
        SupChoice::Auto(Some(strings(&["x", "y"])))
    );
}

#[test]
fn bad_lists_name_the_item() {
    let error = parse_lists("a,b,a", "x").unwrap_err();
    assert_eq!(error.variable, "MPIB_HCA_SOUT");
    assert!(error.why.contains("a appears twice"), "{}", error.why);
    let error = parse_lists("a,b", "x,b").unwrap_err();
    assert!(error
        .why
        .contains("b appears twice in MPIB_HCA_SOUT and MPIB_HCA_SUP"));
    let error = parse_lists("a,,b", "x").unwrap_err();
    assert!(error.why.contains("item 2 is empty"), "{}", error.why);
    let error = parse_lists("a,b,c", "x,y").unwrap_err();
    assert_eq!(error.variable, "MPIB_HCA_SUP");
    assert!(
        error.why.contains("not 3 SOUT NIC(s) and 2 SUP NIC(s)"),
        "{}",
        error.why
    );
    assert!(parse_lists("a", "x,y").is_err(), "more SUP than SOUT NICs");
    let seventeen: Vec<String> = (0..17).map(|i| format!("n{i}")).collect();
    assert!(parse_lists(&seventeen.join(","), "auto").is_err());
}

#[test]
fn devices_follow_the_sout_pci_order_then_the_listed_order() {
    let ids = [Some("0000:c1:00.0"), None, Some("0000:21:00.0"), None];
    assert_eq!(device_order(&ids), vec![2, 0, 1, 3]);
}

fn at(path: &str, node: Option<u32>) -> PciLocation {
    PciLocation::parse(path, node).expect(path)
}

/// Two sockets; on node 0 host bridge pci0000:00 with root port 00:01.0 leading to a switch
/// (downstream ports 02:08.0 and 02:10.0) and root port 00:02.0 with a second switch; on node 1
/// host bridge pci0000:80.
fn node_tree() -> Vec<(&'static str, PciLocation)> {
    let root = "/sys/devices/pci0000:00";
    let switch_a = format!("{root}/0000:00:01.0/0000:01:00.0");
    let switch_b = format!("{root}/0000:00:02.0/0000:10:00.0");
    let far = "/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0";
    vec![
        (
            "sout_a",
            at(&format!("{switch_a}/0000:02:08.0/0000:03:00.0"), Some(0)),
        ),
        (
            "sup_a",
            at(&format!("{switch_a}/0000:02:10.0/0000:04:00.0"), Some(0)),
        ),
        (
            "sout_b",
            at(&format!("{switch_b}/0000:11:08.0/0000:12:00.0"), Some(0)),
        ),
        (
            "sup_b",
            at(&format!("{switch_b}/0000:11:10.0/0000:13:00.0"), Some(0)),
        ),
        (
            "sout_far",
            at(&format!("{far}/0000:82:00.0/0000:83:00.0"), Some(1)),
        ),
        (
            "sup_far",
            at(&format!("{far}/0000:82:04.0/0000:84:00.0"), Some(1)),
        ),
    ]
}

#[test]
fn parsing_keeps_bridges_and_refuses_what_is_not_pci() {
    let location = at(
        "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/net/eth0",
        None,
    );
    assert_eq!(location.host_bridge, "pci0000:00");
    assert_eq!(location.bus_id(), "0000:01:00.0");
    assert!(PciLocation::parse("/sys/devices/virtual/infiniband/rxe0", None).is_none());
    assert!(PciLocation::parse("/sys/devices/pci0000:00", None).is_none());
}

#[test]
fn nearness_ranks_switch_then_root_port_then_host_bridge_then_numa() {
    let tree = node_tree();
    let get = |name: &str| &tree.iter().find(|(n, _)| *n == name).unwrap().1;
    assert_eq!(
        nearness(get("sout_a"), get("sup_a")).0,
        Nearness::SameSwitch
    );
    assert_eq!(
        nearness(get("sout_a"), get("sup_b")).0,
        Nearness::HostBridge
    );
    assert_eq!(
        nearness(get("sout_a"), get("sup_far")).0,
        Nearness::OtherNumaNode
    );
    let port = at("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0", Some(0));
    let function = at("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.1", Some(0));
    assert_eq!(
        nearness(&port, &function).0,
        Nearness::SameSwitch,
        "one device"
    );
    let other_bridge = at("/sys/devices/pci0000:40/0000:40:01.0/0000:41:00.0", Some(0));
    assert_eq!(nearness(&port, &other_bridge).0, Nearness::SameNumaNode);
    let unknown = at("/sys/devices/pci0000:40/0000:40:01.0/0000:41:00.0", None);
    assert_eq!(nearness(&port, &unknown).0, Nearness::NumaUnknown);
    assert!(Nearness::HostBridge.through_cpu() && !Nearness::SameRootPort.through_cpu());
}

fn located(tree: &[(&str, PciLocation)], names: &[&str]) -> Vec<Located> {
    names
        .iter()
        .map(|name| Located {
            name: name.to_string(),
            location: tree.iter().find(|(n, _)| n == name).map(|(_, l)| l.clone()),
        })
        .collect()
}

#[test]
fn auto_pairs_behind_the_same_switch_whatever_the_list_order() {
    let tree = node_tree();
    let sout = located(&tree, &["sout_far", "sout_b", "sout_a"]);
    let sup = located(&tree, &["sup_far", "sup_a", "sup_b"]);
    let pairs = pair_by_locality(&sout, &sup).unwrap();
    let chosen: Vec<&str> = pairs.iter().map(|p| sup[p.sup].name.as_str()).collect();
    assert_eq!(chosen, ["sup_far", "sup_b", "sup_a"]);
    assert!(pairs.iter().all(|p| p.nearness == Nearness::SameSwitch));
    let reversed: Vec<Located> = sup.iter().rev().cloned().collect();
    let again = pair_by_locality(&sout, &reversed).unwrap();
    let chosen_again: Vec<&str> = again
        .iter()
        .map(|p| reversed[p.sup].name.as_str())
        .collect();
    assert_eq!(
        chosen, chosen_again,
        "deterministic whatever the candidates' order"
    );
}

#[test]
fn auto_refuses_cross_numa_and_shares_the_nearest_when_it_must() {
    let tree = node_tree();
    let error = pair_by_locality(
        &located(&tree, &["sout_far"]),
        &located(&tree, &["sup_a", "sup_b"]),
    )
    .unwrap_err();
    assert!(
        error.contains("SOUT NIC sout_far") && error.contains("NUMA node 1"),
        "{error}"
    );
    // Two SOUT NICs, one SUP NIC on their node: shared, the far one through the host bridge.
    let pairs = pair_by_locality(
        &located(&tree, &["sout_a", "sout_b"]),
        &located(&tree, &["sup_a", "sup_far"]),
    )
    .unwrap();
    assert_eq!(pairs[0].sup, 0);
    assert_eq!(pairs[1].sup, 0);
    assert_eq!(pairs[1].nearness, Nearness::HostBridge);
    // Equally near candidates are shared out: the one serving fewer SOUT NICs wins.
    let bridge = "/sys/devices/pci0000:00";
    let mut tree = tree;
    for (name, port) in [("x", "05"), ("y", "06"), ("p", "07"), ("q", "08")] {
        let path = format!("{bridge}/0000:00:{port}.0/0000:{port}:00.0");
        tree.push((name, at(&path, Some(0))));
    }
    let pairs =
        pair_by_locality(&located(&tree, &["y", "x"]), &located(&tree, &["q", "p"])).unwrap();
    // x comes first in bus order and takes p (lower bus id); y then takes q.
    assert_eq!((pairs[0].sup, pairs[1].sup), (0, 1));
    let error =
        pair_by_locality(&located(&tree, &["rxe0"]), &located(&tree, &["sup_a"])).unwrap_err();
    assert!(error.contains("rxe0 has no PCI path"), "{error}");
}

#[test]
fn locations_are_read_from_a_sysfs_tree() {
    let root = std::env::temp_dir().join(format!("mpib-pairing-{}", std::process::id()));
    let function = root.join("devices/pci0000:00/0000:00:01.0/0000:01:00.0");
    std::fs::create_dir_all(&function).unwrap();
    std::fs::write(function.join("numa_node"), "1\n").unwrap();
    let location = PciLocation::read(function.to_str().unwrap()).unwrap();
    assert_eq!(location.numa_node, Some(1));
    std::fs::write(function.join("numa_node"), "-1\n").unwrap();
    assert_eq!(
        PciLocation::read(function.to_str().unwrap())
            .unwrap()
            .numa_node,
        None
    );
    std::fs::remove_dir_all(&root).unwrap();
}
