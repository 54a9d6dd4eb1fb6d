//! No exported call waits: NCCL's proxy thread drives every connection and transfer from one
//! thread, so each call must return promptly and go on at the next one. On the loopback fabric,
//! every call of a connection's whole life (listen, connect and accept until they return a comm,
//! memory registration, grouped and pipelined transfers, flush, test, the closes, init and
//! finalize) must take under 50 ms. Timed by `mpib-driver`'s `Net` around each exported call.

use std::time::Duration;

use mpib_driver::cases::{many_outstanding_plan, pipeline_plan};
use mpib_driver::testing::{bounded, exchange_grouped, exchange_sizes, shared_plugin, LOOPBACK};
use mpib_driver::{Pair, Version};

const LIMIT: Duration = Duration::from_secs(300);
/// Far above any call that does not wait on a loaded 2-core machine; far below the ~1 s a wait
/// for address resolution or a peer would take.
const PROMPT: Duration = Duration::from_millis(50);

#[test]
fn every_exported_call_returns_within_50_ms() {
    let report = bounded(LIMIT, || {
        let mut report = Vec::new();
        for version in [Version::V12, Version::V8] {
            let net = shared_plugin(LOOPBACK).net(version).unwrap();
            for round in 0..3 {
                let mut pair = Pair::connect(&net).unwrap_or_else(|e| panic!("{e}"));
                let case = format!("{version} round {round}");
                exchange_sizes(&mut pair, &[0, 1, 4097, 1 << 20, 4 << 20], &case, 1)
                    .unwrap_or_else(|e| panic!("{case}: {e}"));
                exchange_grouped(&mut pair, &case).unwrap_or_else(|e| panic!("{case}: {e}"));
                for plan in [many_outstanding_plan(), pipeline_plan()] {
                    pair.exchange(&plan, 0xCA11, round)
                        .unwrap_or_else(|e| panic!("{case}: {e}"));
                }
                pair.close().unwrap_or_else(|e| panic!("{case}: {e}"));
            }
            report.push((version, net.call_times()));
        }
        report
    });
    let mut slow = Vec::new();
    for (version, times) in &report {
        for (call, time) in times {
            eprintln!(
                "{version} {call:<12} slowest {:>9.3} ms over {} call(s)",
                time.slowest.as_secs_f64() * 1e3,
                time.calls
            );
            if time.slowest >= PROMPT {
                slow.push(format!("{version} {call}: {:?}", time.slowest));
            }
        }
        let called: Vec<&str> = times.iter().map(|(c, _)| *c).collect();
        for call in [
            "listen", "connect", "accept", "regMr", "isend", "irecv", "test",
        ] {
            assert!(
                called.contains(&call),
                "{version}: `{call}` was never timed"
            );
        }
    }
    assert!(slow.is_empty(), "calls of {PROMPT:?} or more: {slow:?}");
}
