//! NCCL's two-thread use of one plugin: its proxy service thread connects and accepts new comms
//! while the proxy progress thread keeps moving data on others (`isend`/`irecv`/`test`). Through
//! the exported v12 table only, every byte verified on both threads.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use mpib_driver::testing::{bounded, exchange_sizes, shared_plugin, LOOPBACK};
use mpib_driver::{Pair, Version};

const LIMIT: Duration = Duration::from_secs(300);
const NEW_COMMS: usize = 20;

#[test]
fn a_service_thread_connects_while_the_proxy_thread_moves_data() {
    let (proxy_rounds, connected) = bounded(LIMIT, || {
        let stop = AtomicBool::new(false);
        std::thread::scope(|scope| {
            let proxy = scope.spawn(|| {
                let net = shared_plugin(LOOPBACK).net(Version::V12).unwrap();
                let mut pair = Pair::connect(&net).unwrap_or_else(|e| panic!("proxy: {e}"));
                let mut rounds = 0;
                // At least a few rounds after the service thread is done, so both overlap.
                while !stop.load(Ordering::Relaxed) || rounds < 5 {
                    let case = format!("proxy round {rounds}");
                    exchange_sizes(&mut pair, &[4097, 1 << 20], &case, 1)
                        .unwrap_or_else(|e| panic!("{case}: {e}"));
                    rounds += 1;
                }
                pair.close().unwrap_or_else(|e| panic!("proxy close: {e}"));
                rounds
            });
            let service = scope.spawn(|| {
                let net = shared_plugin(LOOPBACK).net(Version::V12).unwrap();
                for comm in 0..NEW_COMMS {
                    let mut pair =
                        Pair::connect(&net).unwrap_or_else(|e| panic!("service {comm}: {e}"));
                    let case = format!("service comm {comm}");
                    exchange_sizes(&mut pair, &[0, 65_536], &case, 1)
                        .unwrap_or_else(|e| panic!("{case}: {e}"));
                    pair.close().unwrap_or_else(|e| panic!("{case} close: {e}"));
                }
                stop.store(true, Ordering::Relaxed);
                NEW_COMMS
            });
            let connected = service.join().unwrap();
            (proxy.join().unwrap(), connected)
        })
    });
    assert_eq!(connected, NEW_COMMS);
    assert!(proxy_rounds >= 5, "the proxy thread moved data throughout");
}
