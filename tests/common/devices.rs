//! What the device tests share: a loopback environment of NIC lists, a child process per case
//! (the plugin's devices are fixed at its first `init`), the conformance cases on a pair of
//! devices, and the checks every device's properties must pass.

#![allow(dead_code)]

use std::time::Duration;

use mpib_driver::testing::{exchange_grouped, exchange_sizes};
use mpib_driver::{child, Net, Pair, PairOptions, Plan, Plugin, Props, Version};

pub const CHILD_LIMIT: Duration = Duration::from_secs(240);

pub fn loopback_env<'a>(sout: &'a str, sup: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        ("MPIB_FABRIC", "loopback"),
        ("MPIB_HCA_SOUT", sout),
        ("MPIB_HCA_SUP", sup),
        ("MPIB_PROBES", "0"),
    ]
}

pub fn run_child(name: &str, env: &[(&str, &str)]) -> String {
    let outcome = child::run_test(name, env, CHILD_LIMIT).unwrap();
    outcome.assert_success(name);
    outcome.output
}

pub fn load() -> Plugin {
    mpib_driver::load_built_plugin().unwrap_or_else(|e| panic!("{e}"))
}

pub fn names(count: usize, name: impl Fn(usize) -> String) -> String {
    (0..count).map(name).collect::<Vec<_>>().join(",")
}

/// The conformance cases, on a pair between device `listen` (receiver) and `connect` (sender).
pub fn conformance_on(net: &Net<'_>, listen: i32, connect: i32) {
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
pub fn check_identities(version: Version, all: &[Props]) {
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

pub fn all_properties(net: &Net<'_>) -> Vec<Props> {
    let count = net.devices().unwrap_or_else(|e| panic!("{e}"));
    (0..count)
        .map(|dev| net.get_properties(dev).unwrap_or_else(|e| panic!("{e}")))
        .collect()
}
