//! Engine tests over the loopback fabric, through the internal API the FFI adapters call.

use mpib_probes::declared::{
    CTS_POSTED, RAIL_RECV_COMPLETIONS, RAIL_RX_BYTES, RAIL_SEND_COMPLETIONS, RAIL_TX_BYTES,
    SRQ_HIGH_WATER, SRQ_LOW_WATER,
};
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;
use crate::fabric::Rail;
use crate::proto::island::PathClass;

/// Env and the loopback world are process-wide: serialize the tests that set them, together with
/// the loopback fabric's own fault-knob tests.
pub(crate) fn env_lock() -> impl Drop {
    crate::fabric::loopback::tests::serial("").0
}

pub(crate) struct Pair {
    pub send: Box<SendComm>,
    pub recv: Box<RecvComm>,
    pub ctx: Arc<Context>,
    /// The longest single `connect` or `accept` call while connecting.
    pub slowest_call: Duration,
}

pub(crate) fn connect_pair(vars: &[(&str, &str)]) -> Pair {
    connect_pair_with(vars, vars).unwrap()
}

/// Receiver and sender contexts initialised with different settings (each `init` snapshots env).
pub(crate) fn connect_pair_with(
    recv_vars: &[(&str, &str)],
    send_vars: &[(&str, &str)],
) -> Result<Pair> {
    let recv_ctx = loopback_context(recv_vars);
    let ctx = loopback_context(send_vars);
    let mut handle = [0u8; HANDLE_SIZE];
    let mut listen_comm = listen(&recv_ctx, 0, &mut handle).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let (mut send, mut recv) = (None, None);
    let mut slowest_call = Duration::ZERO;
    let mut timed = |call: &mut dyn FnMut() -> Result<bool>| {
        let started = Instant::now();
        let outcome = call();
        slowest_call = slowest_call.max(started.elapsed());
        outcome
    };
    let result = loop {
        if send.is_some() && recv.is_some() {
            break Ok(());
        }
        assert!(Instant::now() < deadline, "connect/accept did not finish");
        if send.is_none() {
            let step = timed(&mut || {
                connect(&ctx, 0, &mut handle, -1).map(|c| {
                    send = c;
                    send.is_some()
                })
            });
            if let Err(e) = step {
                break Err(e);
            }
        }
        if recv.is_none() {
            let step = timed(&mut || {
                accept(&mut listen_comm).map(|c| {
                    recv = c;
                    recv.is_some()
                })
            });
            if let Err(e) = step {
                break Err(e);
            }
        }
    };
    close_listen(listen_comm).unwrap();
    finalize(recv_ctx).unwrap();
    if let Err(e) = result {
        finalize(ctx).unwrap();
        return Err(e);
    }
    Ok(Pair {
        send: send.unwrap(),
        recv: recv.unwrap(),
        ctx,
        slowest_call,
    })
}

/// A context on the loopback fabric with `vars` set and every other variable of the tests
/// cleared (each `init` snapshots the environment).
pub(crate) fn loopback_context(vars: &[(&str, &str)]) -> Arc<Context> {
    for name in ENV_NAMES {
        std::env::remove_var(name);
    }
    std::env::set_var("MPIB_FABRIC", "loopback");
    for (name, value) in vars {
        std::env::set_var(name, value);
    }
    init(InitParams {
        traffic_class: -1,
        ..Default::default()
    })
    .unwrap()
}

pub(crate) const ENV_NAMES: [&str; 17] = [
    "MPIB_FAILOVER",
    "MPIB_SRQ_LOW_WATER",
    "MPIB_SRQ_HIGH_WATER",
    "MPIB_BDP_BYTES",
    "MPIB_AGENT_SOCKET",
    "MPIB_HINT_PATH",
    "MPIB_PROBES_DIR",
    "MPIB_PROBES_SAMPLE",
    "MPIB_SLOW_US",
    "MPIB_FORCE_FLUSH",
    "MPIB_MODE",
    "MPIB_OOB_ADDR",
    "MPIB_LOOPBACK_FAULTS",
    "MPIB_LOOPBACK_RAILS",
    "MPIB_SOUT_QP",
    "MPIB_SUP_QP",
    "MPIB_ISLAND_PREFIX_LEN",
];

/// Registers host memory on a comm of the pair.
pub(crate) fn host_memory(comm: CommRef<'_>, addr: u64, len: usize) -> Box<MemoryHandle> {
    register_memory(comm, addr, len, PTR_HOST).unwrap()
}

/// One receive buffer without a profiler handle.
pub(crate) fn recv_buffer(
    addr: u64,
    capacity: usize,
    tag: i32,
    memory: &MemoryHandle,
) -> RecvBuffer<'_> {
    RecvBuffer {
        addr,
        capacity,
        tag,
        memory: Some(memory),
        profiler_handle: std::ptr::null_mut(),
    }
}

pub(crate) fn wait(request: NonNull<Request>) -> TestOutcome {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        // SAFETY: a live request from isend/irecv.
        let outcome = unsafe { test(request) }.unwrap();
        if outcome.done {
            return outcome;
        }
        assert!(Instant::now() < deadline, "request did not complete");
    }
}

pub(crate) fn transfer(pair: &Pair, size: usize) {
    let source: Vec<u8> = (0..size.max(1)).map(|i| (i * 7 + size) as u8).collect();
    let mut sink = vec![0u8; size + 64];
    let smh = host_memory(
        CommRef::Send(&pair.send),
        source.as_ptr() as u64,
        size.max(1),
    );
    let rmh = host_memory(
        CommRef::Recv(&pair.recv),
        sink.as_mut_ptr() as u64,
        sink.len(),
    );
    let buffer = recv_buffer(sink.as_mut_ptr() as u64, sink.len(), 9, &rmh);
    let rreq = loop {
        if let Some(r) = irecv(&pair.recv, &[buffer]).unwrap() {
            break r;
        }
    };
    let sreq = loop {
        if let Some(r) = isend(
            &pair.send,
            source.as_ptr() as u64,
            size,
            9,
            &smh,
            std::ptr::null_mut(),
        )
        .unwrap()
        {
            break r;
        }
        // SAFETY: live request.
        let _ = unsafe { test(rreq) }.unwrap();
    };
    let sent = wait(sreq);
    let received = wait(rreq);
    assert_eq!(sent.sizes[0] as usize, size);
    assert_eq!(received.sizes[0] as usize, size, "size {size}");
    assert!(
        sink[..size] == source[..size],
        "bytes differ at size {size}"
    );
    deregister_memory(CommRef::Send(&pair.send), smh).unwrap();
    deregister_memory(CommRef::Recv(&pair.recv), rmh).unwrap();
}

#[test]
fn moves_bytes_intra_island() {
    let _guard = env_lock();
    let pair = connect_pair(&[]);
    for size in [0, 1, 127, 128, 4097, (1 << 20) + 3] {
        transfer(&pair, size);
    }
    let Pair {
        send, recv, ctx, ..
    } = pair;
    close_send(send).unwrap();
    close_recv(recv).unwrap();
    finalize(ctx).unwrap();
}

pub(crate) fn close(pair: Pair) {
    let Pair {
        send, recv, ctx, ..
    } = pair;
    close_send(send).unwrap();
    close_recv(recv).unwrap();
    finalize(ctx).unwrap();
}

#[test]
fn inter_island_creates_no_sup_queue_pairs_and_still_moves_bytes() {
    let _guard = env_lock();
    let pair = connect_pair_with(
        &[("MPIB_OOB_ADDR", "127.0.0.1")],
        &[("MPIB_OOB_ADDR", "127.0.1.1")],
    )
    .unwrap();
    for info in [&pair.send.info, &pair.recv.info] {
        assert_eq!(info.class, PathClass::InterIsland);
        assert_eq!(
            (
                info.layout.count(Rail::ScaleOut),
                info.layout.count(Rail::ScaleUp)
            ),
            (2, 0)
        );
    }
    for size in [0, 129, 65536] {
        transfer(&pair, size);
    }
    close(pair);
}

#[test]
fn a_classification_mismatch_is_refused_with_both_views() {
    let _guard = env_lock();
    // Same address pair, different prefix lengths: the sender says inter, the receiver intra.
    let result = connect_pair_with(
        &[
            ("MPIB_OOB_ADDR", "127.0.0.1"),
            ("MPIB_ISLAND_PREFIX_LEN", "8"),
        ],
        &[
            ("MPIB_OOB_ADDR", "127.0.1.1"),
            ("MPIB_ISLAND_PREFIX_LEN", "24"),
        ],
    );
    let error = result.err().expect("a mismatch must be refused");
    assert_eq!(error.kind, crate::error::ErrorKind::InvalidUsage, "{error}");
    assert!(
        error.message.contains("inter") && error.message.contains("intra"),
        "{error}"
    );
    assert!(error.message.contains("MPIB_ISLAND_PREFIX_LEN"), "{error}");
}

#[test]
fn a_qp_count_mismatch_is_refused() {
    let _guard = env_lock();
    let result = connect_pair_with(&[("MPIB_SUP_QP", "3")], &[("MPIB_SUP_QP", "4")]);
    let error = result.err().expect("a QP count mismatch must be refused");
    assert!(
        error.message.contains("sup=4") && error.message.contains("sup=3"),
        "{error}"
    );
}

#[test]
fn advanced_mode_without_an_agent_goes_all_sout() {
    let _guard = env_lock();
    let dir = std::env::temp_dir().join(format!("mpib-noagent-{}", std::process::id()));
    let socket = dir.join("agent.sock");
    let hints = dir.join("hints");
    let pair = connect_pair(&[
        ("MPIB_MODE", "1"),
        ("MPIB_AGENT_SOCKET", socket.to_str().unwrap()),
        ("MPIB_HINT_PATH", hints.to_str().unwrap()),
    ]);
    assert!(pair.send.info.agent.is_none());
    for size in [0, 4096, 1 << 20] {
        transfer(&pair, size);
    }
    close(pair);
}

pub(crate) fn probes_snapshot(
    dir: &std::path::Path,
) -> (mpib_probes::ProbesReader, mpib_probes::Snapshot) {
    let path = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "probes"))
        .expect("the plugin wrote a probes file");
    match mpib_probes::ProbesReader::open(&path).unwrap() {
        mpib_probes::LoadState::Ready(reader) => {
            let snapshot = reader.snapshot();
            (reader, snapshot)
        }
        _ => panic!("probes file not ready"),
    }
}

#[test]
fn the_bdp_threshold_keeps_small_inter_island_transfers_on_sout() {
    let _guard = env_lock();
    let agent = mpib_driver::Agent::start_in_temp().unwrap();
    agent.set_default_sup_bw(1024);
    let dir = std::env::temp_dir().join(format!("mpib-bdp-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let env: Vec<(&str, String)> = agent.env();
    let mut vars: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    vars.extend([
        ("MPIB_MODE", "1"),
        ("MPIB_BDP_BYTES", "65536"),
        ("MPIB_PROBES_DIR", dir.to_str().unwrap()),
    ]);
    let (mut recv_vars, mut send_vars) = (vars.clone(), vars);
    recv_vars.push(("MPIB_OOB_ADDR", "127.0.0.1"));
    send_vars.push(("MPIB_OOB_ADDR", "127.0.1.1"));
    let pair = connect_pair_with(&recv_vars, &send_vars).unwrap();
    assert_eq!(pair.send.info.class, PathClass::InterIsland);
    // At or under 64 KiB: SOUT, whatever the hint; above it the hint (all SUP) applies.
    for size in [4096usize, 65536, 65537] {
        transfer(&pair, size);
    }
    let (_reader, snapshot) = probes_snapshot(&dir);
    let (sout, sup) = (&snapshot.rails[0], &snapshot.rails[1]);
    assert_eq!(
        (sout.counter(RAIL_TX_BYTES), sup.counter(RAIL_TX_BYTES)),
        (4096 + 65536, 65537)
    );
    close(pair);
}

#[test]
fn probes_count_bytes_per_rail_and_record_sampled_transfers() {
    let _guard = env_lock();
    let dir = std::env::temp_dir().join(format!("mpib-probes-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let pair = connect_pair(&[
        ("MPIB_PROBES_DIR", dir.to_str().unwrap()),
        ("MPIB_PROBES_SAMPLE", "1"),
        ("MPIB_OOB_ADDR", "127.0.0.1"),
    ]);
    // Vanilla intra-island: everything rides SUP; a 0-byte transfer forces SOUT with no bytes.
    let sizes = [4096usize, 1000, 0, 65536];
    for size in sizes {
        transfer(&pair, size);
    }
    let (reader, snapshot) = probes_snapshot(&dir);
    let total: u64 = sizes.iter().map(|s| *s as u64).sum();
    let (sout, sup) = (&snapshot.rails[0], &snapshot.rails[1]);
    assert_eq!(
        (sout.counter(RAIL_TX_BYTES), sup.counter(RAIL_TX_BYTES)),
        (0, total)
    );
    assert_eq!(
        (sout.counter(RAIL_RX_BYTES), sup.counter(RAIL_RX_BYTES)),
        (0, total),
        "receiver counts the same split"
    );
    assert_eq!(
        (snapshot.transfers.sup_only, snapshot.transfers.sout_only),
        (3, 1)
    );
    assert_eq!(sup.counter(RAIL_SEND_COMPLETIONS), 3);
    assert_eq!(sup.counter(RAIL_RECV_COMPLETIONS), 3);
    assert_eq!(
        (sup.gauge(SRQ_LOW_WATER), sup.gauge(SRQ_HIGH_WATER)),
        (8, 512)
    );
    assert!(
        sup.counter(CTS_POSTED) >= 4,
        "CTS ride SUP in vanilla intra-island"
    );
    assert_eq!(snapshot.rails[1].latency.count(), 3);
    let active: Vec<_> = snapshot
        .connections
        .iter()
        .filter(|c| c.rail_bytes.iter().sum::<u64>() > 0)
        .collect();
    assert_eq!(
        active.len(),
        2,
        "one send and one receive connection with bytes"
    );
    let mut cursor = mpib_probes::EventCursor::default();
    let drained = reader.drain_events(&mut cursor);
    assert_eq!(
        drained.records.len(),
        sizes.len(),
        "1-in-1 sampling records every transfer"
    );
    let first = &drained.records[0].transfer;
    assert_eq!((first.size, first.rail_bytes), (4096, [0, 4096]));
    assert!(first.done_ns[1] >= first.post_ns[1] && first.post_ns[1] > 0);
    close(pair);
    assert!(
        std::fs::read_dir(&dir).map_or(true, |mut d| d.next().is_none()),
        "the probes file is removed on clean shutdown"
    );
}

#[test]
fn without_failover_a_port_down_event_fails_the_comm_with_a_system_error() {
    let _guard = env_lock();
    // Vanilla intra-island: data rides SUP; the 3rd WR on SUP raises IBV_EVENT_PORT_ERR there.
    let pair = connect_pair(&[
        ("MPIB_LOOPBACK_FAULTS", "portdown=sup:3"),
        ("MPIB_FAILOVER", "0"),
    ]);
    let deadline = Instant::now() + Duration::from_secs(10);
    let error = loop {
        assert!(
            Instant::now() < deadline,
            "the port-down event was never acted on"
        );
        let outcome =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| transfer(&pair, 4096)));
        if outcome.is_err() {
            // `transfer` unwraps: the failure surfaced as an Err from test/isend/irecv.
            break pair_failure(&pair);
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    assert_eq!(error.kind, crate::error::ErrorKind::System, "{error}");
    assert!(
        error.message.contains("PortDown") && error.message.contains("sup rail"),
        "{error}"
    );
    close(pair);
}

/// The sticky failure of a pair, whichever side saw it first.
fn pair_failure(pair: &Pair) -> crate::error::Error {
    let mut sink = [0u8; 8];
    let rmh = host_memory(CommRef::Recv(&pair.recv), sink.as_mut_ptr() as u64, 8);
    let buffer = recv_buffer(sink.as_mut_ptr() as u64, 8, 1, &rmh);
    let source = [0u8; 8];
    let smh = host_memory(CommRef::Send(&pair.send), source.as_ptr() as u64, 8);
    let send = isend(
        &pair.send,
        source.as_ptr() as u64,
        8,
        1,
        &smh,
        std::ptr::null_mut(),
    );
    let recv = irecv(&pair.recv, &[buffer]);
    deregister_memory(CommRef::Send(&pair.send), smh).unwrap();
    deregister_memory(CommRef::Recv(&pair.recv), rmh).unwrap();
    recv.err().or(send.err()).expect("one side has failed")
}

#[test]
fn two_hundred_receives_in_flight_never_starve_the_srq() {
    let _guard = env_lock();
    let pair = connect_pair(&[]);
    const COUNT: usize = 200;
    let source = [5u8; 64];
    let mut sink = vec![0u8; 64 * COUNT];
    let smh = host_memory(CommRef::Send(&pair.send), source.as_ptr() as u64, 64);
    let rmh = host_memory(
        CommRef::Recv(&pair.recv),
        sink.as_mut_ptr() as u64,
        sink.len(),
    );
    // Bring the SUP SRQ down to exactly its low-water mark (512 posted - 448 consumed = 64,
    // which is not under it, so nothing refills)...
    for _ in 0..448 {
        transfer(&pair, 64);
    }
    // ...then all receives first, without a single test: the SRQ must already hold enough
    // receives for every IMM these CTS can bring.
    let receives: Vec<_> = (0..COUNT)
        .map(|i| {
            let buffer = recv_buffer(sink.as_mut_ptr() as u64 + (i * 64) as u64, 64, 1, &rmh);
            irecv(&pair.recv, &[buffer])
                .unwrap()
                .expect("a slot for every receive")
        })
        .collect();
    let sends: Vec<_> = (0..COUNT)
        .map(|_| loop {
            if let Some(r) = isend(
                &pair.send,
                source.as_ptr() as u64,
                64,
                1,
                &smh,
                std::ptr::null_mut(),
            )
            .unwrap()
            {
                break r;
            }
        })
        .collect();
    for request in receives.into_iter().chain(sends) {
        assert_eq!(wait(request).sizes[0], 64);
    }
    assert!(sink.iter().all(|b| *b == 5));
    deregister_memory(CommRef::Send(&pair.send), smh).unwrap();
    deregister_memory(CommRef::Recv(&pair.recv), rmh).unwrap();
    close(pair);
}

mod agent;
mod failover;
mod handshakes;
mod memory;
mod peer;
mod receives;
mod threads;
mod trust;
