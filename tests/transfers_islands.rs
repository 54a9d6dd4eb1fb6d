//! Vanilla mode across islands (v11/v12, whose `init` snapshots the environment per
//! communicator): the receiver's context gets `MPIB_OOB_ADDR=127.0.0.1`, the sender's
//! `MPIB_OOB_ADDR=127.0.1.1` — a different /24, so inter-island: no SUP QPs, all bytes on SOUT.
//! Transfers must still verify. The intra-island control case pins both ends to 127.0.0.1.

use std::time::Duration;

use mpib_driver::testing::{
    bounded, exchange_grouped, exchange_sizes, many_outstanding_plan, shared_plugin, BASIC_SIZES,
    LARGE_SIZE, LOOPBACK,
};
use mpib_driver::{Pair, PairOptions, Version};

const LIMIT: Duration = Duration::from_secs(300);

fn oob(addr: &str) -> Vec<(String, Option<String>)> {
    vec![("MPIB_OOB_ADDR".to_string(), Some(addr.to_string()))]
}

fn islands(version: Version, recv_addr: &'static str, send_addr: &'static str) {
    bounded(LIMIT, move || {
        let net = shared_plugin(LOOPBACK)
            .net(version)
            .unwrap_or_else(|e| panic!("{e}"));
        let options = PairOptions {
            recv_env: oob(recv_addr),
            send_env: oob(send_addr),
            ..PairOptions::default()
        };
        let mut pair = Pair::connect_with(&net, &options).unwrap_or_else(|e| panic!("{e}"));
        let case = format!("{version} {recv_addr} <- {send_addr}");
        exchange_sizes(&mut pair, &BASIC_SIZES, &case, 2).unwrap_or_else(|e| panic!("{case}: {e}"));
        if version == Version::V12 {
            exchange_sizes(&mut pair, &[LARGE_SIZE], &case, 1)
                .unwrap_or_else(|e| panic!("{case}: {e}"));
        }
        exchange_grouped(&mut pair, &case).unwrap_or_else(|e| panic!("{case}: {e}"));
        pair.exchange(&many_outstanding_plan(), 0x1515, 0)
            .unwrap_or_else(|e| panic!("{case}: {e}"));
        pair.close().unwrap_or_else(|e| panic!("{case}: {e}"));
    });
}

#[test]
fn inter_island_v12() {
    islands(Version::V12, "127.0.0.1", "127.0.1.1");
}

#[test]
fn inter_island_v11() {
    islands(Version::V11, "127.0.0.1", "127.0.1.1");
}

#[test]
fn intra_island_pinned_v12() {
    islands(Version::V12, "127.0.0.1", "127.0.0.1");
}

#[test]
fn intra_island_pinned_v11() {
    islands(Version::V11, "127.0.0.1", "127.0.0.1");
}
