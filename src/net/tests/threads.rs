//! Several threads driving comms of one context at once, as NCCL's proxy threads do (one per
//! communicator): every byte arrives and the probes' totals equal the bytes moved.

use mpib_probes::declared::{RAIL_RX_BYTES, RAIL_TX_BYTES, WRITER_LANE_OVERFLOWS};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;
use crate::net::tests::{env_lock, probes_snapshot, transfer, Pair, ENV_NAMES};

const THREADS: usize = 8;
const TRANSFERS: usize = 100;

/// The sizes thread `thread` moves: small, medium and split-sized, different per thread.
fn size_of(thread: usize, k: usize) -> usize {
    [0, 1, 4097, 65_536 + thread, 300_000 + 17 * thread][k % 5]
}

/// One context for both sides of `count` pairs, so one probes file counts every byte twice
/// (sent and received).
fn pairs_in_one_context(vars: &[(&str, &str)], count: usize) -> Vec<Pair> {
    for name in ENV_NAMES {
        std::env::remove_var(name);
    }
    std::env::set_var("MPIB_FABRIC", "loopback");
    for (name, value) in vars {
        std::env::set_var(name, value);
    }
    let ctx = init(InitParams {
        traffic_class: -1,
        ..Default::default()
    })
    .unwrap();
    (0..count)
        .map(|_| {
            let mut handle = [0u8; HANDLE_SIZE];
            let mut listen_comm = listen(&ctx, 0, &mut handle).unwrap();
            let deadline = Instant::now() + Duration::from_secs(10);
            let (mut send, mut recv) = (None, None);
            while send.is_none() || recv.is_none() {
                assert!(Instant::now() < deadline, "connect/accept did not finish");
                if send.is_none() {
                    send = connect(&ctx, 0, &mut handle, -1).unwrap();
                }
                if recv.is_none() {
                    recv = accept(&mut listen_comm).unwrap();
                }
            }
            close_listen(listen_comm).unwrap();
            Pair {
                send: send.unwrap(),
                recv: recv.unwrap(),
                ctx: Arc::clone(&ctx),
                slowest_call: Duration::ZERO,
            }
        })
        .collect()
}

#[test]
fn eight_threads_on_eight_comms_count_every_byte_exactly() {
    let _guard = env_lock();
    let agent = mpib_driver::Agent::start_in_temp().unwrap();
    agent.set_default_sup_bw(512); // both rails carry parts of the larger transfers
    let dir = std::env::temp_dir().join(format!("mpib-threads-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let env = agent.env();
    let mut vars: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    vars.extend([
        ("MPIB_MODE", "1"),
        ("MPIB_PROBES_DIR", dir.to_str().unwrap()),
        ("MPIB_OOB_ADDR", "127.0.0.1"),
    ]);
    let pairs = pairs_in_one_context(&vars, THREADS);
    std::thread::scope(|scope| {
        for (thread, pair) in pairs.iter().enumerate() {
            scope.spawn(move || {
                for k in 0..TRANSFERS {
                    transfer(pair, size_of(thread, k)); // checks every byte
                }
            });
        }
    });
    let (_reader, snapshot) = probes_snapshot(&dir);
    let moved: u64 = (0..THREADS)
        .flat_map(|t| (0..TRANSFERS).map(move |k| size_of(t, k) as u64))
        .sum();
    let rails = &snapshot.rails;
    let sent: u64 = rails.iter().map(|r| r.counter(RAIL_TX_BYTES)).sum();
    let received: u64 = rails.iter().map(|r| r.counter(RAIL_RX_BYTES)).sum();
    assert_eq!(
        (sent, received),
        (moved, moved),
        "probes totals vs bytes moved"
    );
    assert!(
        rails.iter().all(|r| r.counter(RAIL_TX_BYTES) > 0),
        "both rails carried bytes: {rails:?}"
    );
    let t = snapshot.transfers;
    let transfers = t.no_rail + t.sout_only + t.sup_only + t.both;
    assert_eq!(transfers, (THREADS * TRANSFERS) as u64);
    let by_connection: u64 = snapshot
        .connections
        .iter()
        .filter(|c| c.info.direction == mpib_probes::Direction::Send)
        .map(|c| c.rail_bytes.iter().sum::<u64>())
        .sum();
    assert_eq!(by_connection, moved, "per-connection bytes of the senders");
    assert_eq!(snapshot.process_counter(WRITER_LANE_OVERFLOWS), 0);
    let ctx = Arc::clone(&pairs[0].ctx);
    for pair in pairs {
        close_send(pair.send).unwrap();
        close_recv(pair.recv).unwrap();
    }
    finalize(ctx).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
