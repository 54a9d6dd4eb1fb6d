//! Byte-exact transfers through every exported version, vanilla mode with default settings: both
//! ends on this host, so intra-island (all bytes on SUP). Only the exported tables are used, via
//! `mpib-driver`. Other settings live in `transfers_islands.rs`, `transfers_advanced.rs` and
//! `transfers_faults.rs` (separate processes).

use std::time::Duration;

use mpib_driver::testing::{
    bounded, exchange_grouped, exchange_sizes, exchange_sizes_in_larger_receives,
    many_outstanding_plan, shared_plugin, slot_capacity, BASIC_SIZES, LARGE_SIZE, LOOPBACK,
};
use mpib_driver::{Pair, Plan, Version};

const LIMIT: Duration = Duration::from_secs(300);

fn with_pair(version: Version, body: impl FnOnce(&mut Pair<'_, '_>) + Send + 'static) {
    bounded(LIMIT, move || {
        let net = shared_plugin(LOOPBACK)
            .net(version)
            .unwrap_or_else(|e| panic!("{e}"));
        let mut pair = Pair::connect(&net).unwrap_or_else(|e| panic!("{e}"));
        body(&mut pair);
        pair.close().unwrap_or_else(|e| panic!("{e}"));
    });
}

fn sizes(version: Version) {
    with_pair(version, move |pair| {
        let case = format!("sizes {version}");
        exchange_sizes(pair, &BASIC_SIZES, &case, 2).unwrap_or_else(|e| panic!("{e}"));
        if matches!(version, Version::V8 | Version::V12) {
            exchange_sizes(pair, &[LARGE_SIZE], &case, 1).unwrap_or_else(|e| panic!("{e}"));
        }
    });
}

fn larger_receives(version: Version) {
    with_pair(version, move |pair| {
        let case = format!("larger receives {version}");
        let sizes = [0, 1, 127, 4097, 65_536 + 3, (1 << 20) + 3];
        exchange_sizes_in_larger_receives(pair, &sizes, slot_capacity, &case)
            .unwrap_or_else(|e| panic!("{e}"));
    });
}

fn grouped(version: Version) {
    with_pair(version, move |pair| {
        exchange_grouped(pair, &format!("grouped {version}")).unwrap_or_else(|e| panic!("{e}"));
    });
}

fn many_outstanding(version: Version) {
    with_pair(version, move |pair| {
        let plan = many_outstanding_plan();
        let report = pair
            .exchange(&plan, 0x256, 0)
            .unwrap_or_else(|e| panic!("{e}"));
        eprintln!(
            "{version}: {} sends / {} receives in flight at most ({} NULL isends, {} NULL irecvs)",
            report.max_sends_in_flight,
            report.max_recvs_in_flight,
            report.null_isends,
            report.null_irecvs
        );
        assert_eq!(report.send_sizes.len(), 256);
    });
}

fn pipelined(version: Version) {
    with_pair(version, move |pair| {
        let cycle = [0usize, 1, 127, 128, 4097, 65_536, 1000, 8191];
        let plan = Plan::pipeline(96, |i| cycle[i % cycle.len()], 16)
            .labelled("pipeline of 96 mixed sizes");
        for iteration in 0..2 {
            pair.exchange(&plan, 0x9199, iteration)
                .unwrap_or_else(|e| panic!("{version}: {e}"));
        }
    });
}

macro_rules! per_version {
    ($($name:ident: $body:ident($version:expr);)*) => {$(
        #[test]
        fn $name() {
            $body($version);
        }
    )*};
}

per_version! {
    sizes_v7: sizes(Version::V7);
    sizes_v8: sizes(Version::V8);
    sizes_v9: sizes(Version::V9);
    sizes_v10: sizes(Version::V10);
    sizes_v11: sizes(Version::V11);
    sizes_v12: sizes(Version::V12);
    larger_receives_v7: larger_receives(Version::V7);
    larger_receives_v8: larger_receives(Version::V8);
    larger_receives_v9: larger_receives(Version::V9);
    larger_receives_v10: larger_receives(Version::V10);
    larger_receives_v11: larger_receives(Version::V11);
    larger_receives_v12: larger_receives(Version::V12);
    grouped_receives_v7: grouped(Version::V7);
    grouped_receives_v8: grouped(Version::V8);
    grouped_receives_v9: grouped(Version::V9);
    grouped_receives_v10: grouped(Version::V10);
    grouped_receives_v11: grouped(Version::V11);
    grouped_receives_v12: grouped(Version::V12);
    many_outstanding_v7: many_outstanding(Version::V7);
    many_outstanding_v8: many_outstanding(Version::V8);
    many_outstanding_v9: many_outstanding(Version::V9);
    many_outstanding_v10: many_outstanding(Version::V10);
    many_outstanding_v11: many_outstanding(Version::V11);
    many_outstanding_v12: many_outstanding(Version::V12);
    pipelined_v8: pipelined(Version::V8);
    pipelined_v12: pipelined(Version::V12);
}

#[test]
fn several_pairs_interleaved() {
    bounded(LIMIT, || {
        let plugin = shared_plugin(LOOPBACK);
        let nets: Vec<_> = [Version::V12, Version::V11, Version::V9]
            .into_iter()
            .map(|v| plugin.net(v).unwrap_or_else(|e| panic!("{e}")))
            .collect();
        let mut pairs: Vec<Pair<'_, '_>> = Vec::new();
        for net in &nets {
            for _ in 0..2 {
                pairs.push(Pair::connect(net).unwrap_or_else(|e| panic!("{e}")));
            }
        }
        for round in 0..4u64 {
            for (i, pair) in pairs.iter_mut().enumerate() {
                let size = 1000 * (i + 1) + round as usize * 4096;
                let plan = Plan::single(size).labelled(format!("pair {i} round {round}"));
                pair.exchange(&plan, i as u64, round)
                    .unwrap_or_else(|e| panic!("{e}"));
            }
        }
        for pair in pairs {
            pair.close().unwrap_or_else(|e| panic!("{e}"));
        }
    });
}
