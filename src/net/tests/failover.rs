//! Failover through the engine's entry points (docs/PROTOCOL.md §10): a rail cut (the loopback's
//! `cut` knob: every WR on the rail fails, either way) or one failed WR (`fail`) at a point of a
//! pipeline of transfers in flight; every transfer must complete once, byte-exact, with no
//! request failing, over the surviving rail. Without a survivor, or with `MPIB_FAILOVER=0`, the
//! comm fails with an error that says why.

use std::ptr::NonNull;
use std::time::{Duration, Instant};

use super::*;

/// Bytes of transfer `index`: sizes that take the single-IMM path and the record path alike.
fn size_of(index: usize) -> usize {
    [1, 4096, 65_537, 300_000, 0, 8191][index % 6] + index
}

/// `count` transfers, each in its own buffers, and how far each side has got.
// The registrations stay the boxes `register_memory` hands out and `deregister_memory` takes.
#[allow(clippy::vec_box)]
struct Pipeline<'a> {
    pair: &'a Pair,
    sources: Vec<Vec<u8>>,
    sinks: Vec<Vec<u8>>,
    send_memory: Vec<Box<MemoryHandle>>,
    recv_memory: Vec<Box<MemoryHandle>>,
    receives: Vec<NonNull<Request>>,
    sends: Vec<NonNull<Request>>,
    received: usize,
    sent: usize,
}

impl<'a> Pipeline<'a> {
    fn new(pair: &'a Pair, count: usize) -> Pipeline<'a> {
        let sources: Vec<Vec<u8>> = (0..count)
            .map(|i| {
                (0..size_of(i).max(1))
                    .map(|b| (b * 13 + i * 7) as u8)
                    .collect()
            })
            .collect();
        let mut sinks: Vec<Vec<u8>> = (0..count).map(|i| vec![0xEE; size_of(i) + 64]).collect();
        let send_memory = (sources.iter())
            .map(|s| host_memory(CommRef::Send(&pair.send), s.as_ptr() as u64, s.len()))
            .collect();
        let recv_memory = (sinks.iter_mut())
            .map(|s| host_memory(CommRef::Recv(&pair.recv), s.as_mut_ptr() as u64, s.len()))
            .collect();
        Pipeline {
            pair,
            sources,
            sinks,
            send_memory,
            recv_memory,
            receives: Vec::with_capacity(count),
            sends: Vec::with_capacity(count),
            received: 0,
            sent: 0,
        }
    }

    /// One `irecv` if fewer than `depth` receives are pending.
    fn post_receive(&mut self, depth: usize) -> Result<()> {
        let next = self.receives.len();
        if next == self.sinks.len() || next >= self.received + depth {
            return Ok(());
        }
        let sink = &mut self.sinks[next];
        let buffer = recv_buffer(
            sink.as_mut_ptr() as u64,
            sink.len(),
            3,
            &self.recv_memory[next],
        );
        if let Some(request) = irecv(&self.pair.recv, &[buffer])? {
            self.receives.push(request);
        }
        Ok(())
    }

    /// One `isend` if fewer than `depth` sends are pending.
    fn post_send(&mut self, depth: usize) -> Result<()> {
        let next = self.sends.len();
        if next == self.sources.len() || next >= self.sent + depth {
            return Ok(());
        }
        let (source, memory) = (&self.sources[next], &self.send_memory[next]);
        let null = std::ptr::null_mut();
        let addr = source.as_ptr() as u64;
        if let Some(request) = isend(&self.pair.send, addr, size_of(next), 3, memory, null)? {
            self.sends.push(request);
        }
        Ok(())
    }

    /// `test` on the oldest pending receive; checks its size and bytes once it is done.
    fn test_receive(&mut self) -> Result<()> {
        let index = self.received;
        let Some(request) = self.receives.get(index) else {
            return Ok(());
        };
        // SAFETY: a live request from irecv.
        let outcome = unsafe { test(*request) }?;
        if outcome.done {
            let (size, sink) = (size_of(index), &self.sinks[index]);
            assert_eq!(outcome.sizes[0] as usize, size, "receive {index}'s size");
            assert!(
                sink[..size] == self.sources[index][..size],
                "receive {index}'s bytes"
            );
            assert!(
                sink[size..].iter().all(|b| *b == 0xEE),
                "receive {index} wrote past its size"
            );
            self.flush(index)?;
            self.received += 1;
        }
        Ok(())
    }

    /// What NCCL does after a receive into GPU memory: `iflush` it and `test` the flush until
    /// it is done (nothing to wait for without `MPIB_FORCE_FLUSH`).
    fn flush(&mut self, index: usize) -> Result<()> {
        let sink = &mut self.sinks[index];
        let buffer = recv_buffer(
            sink.as_mut_ptr() as u64,
            sink.len(),
            3,
            &self.recv_memory[index],
        );
        let Some(request) = iflush(&self.pair.recv, &[buffer])? else {
            return Ok(());
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        // SAFETY: a live request from iflush, tested until done.
        while !unsafe { test(request) }?.done {
            assert!(
                Instant::now() < deadline,
                "the flush of receive {index} never completed"
            );
        }
        Ok(())
    }

    /// `test` on the oldest pending send; checks its size once it is done.
    fn test_send(&mut self) -> Result<()> {
        let Some(request) = self.sends.get(self.sent) else {
            return Ok(());
        };
        // SAFETY: a live request from isend.
        let outcome = unsafe { test(*request) }?;
        if outcome.done {
            assert_eq!(outcome.sizes[0] as usize, size_of(self.sent));
            self.sent += 1;
        }
        Ok(())
    }

    /// Drives both sides with up to `depth` requests pending each until every transfer is
    /// done; the first error any call returns.
    fn run(&mut self, depth: usize) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(20);
        let count = self.sources.len();
        while self.received < count || self.sent < count {
            let (received, sent) = (self.received, self.sent);
            assert!(
                Instant::now() < deadline,
                "stalled: {received} receives, {sent} sends done"
            );
            self.post_receive(depth)?;
            self.post_send(depth)?;
            self.test_receive()?;
            self.test_send()?;
        }
        Ok(())
    }
}

impl Drop for Pipeline<'_> {
    fn drop(&mut self) {
        for memory in self.send_memory.drain(..) {
            deregister_memory(CommRef::Send(&self.pair.send), memory).unwrap();
        }
        for memory in self.recv_memory.drain(..) {
            deregister_memory(CommRef::Recv(&self.pair.recv), memory).unwrap();
        }
    }
}

/// Runs `count` transfers with up to `depth` in flight on each side and checks every byte and
/// size; the first error any call returns.
fn pipeline(pair: &Pair, count: usize, depth: usize) -> Result<()> {
    Pipeline::new(pair, count).run(depth)
}

/// A pair on the loopback fabric with `faults` and `vars` (the sender's control address
/// `sender_address` when given), the pipeline run over it.
fn run_with(
    faults: &str,
    vars: &[(&str, &str)],
    sender_address: Option<&str>,
) -> (Pair, Result<()>) {
    let mut receiver = vec![("MPIB_LOOPBACK_FAULTS", faults)];
    receiver.extend_from_slice(vars);
    let mut sender = receiver.clone();
    if let Some(address) = sender_address {
        sender.push(("MPIB_OOB_ADDR", address));
    }
    let pair = connect_pair_with(&receiver, &sender).unwrap();
    let outcome = pipeline(&pair, 96, 12);
    (pair, outcome)
}

#[test]
fn a_cut_rail_fails_over_and_every_transfer_completes_once() {
    let _guard = env_lock();
    // Vanilla intra-island: data and the CTS ride SUP; advanced without an agent: SOUT.
    // Tight holdings (no batch beyond need, 16 receives at most) and a slow survivor: receives
    // awaiting their replay are still outstanding while new ones are posted.
    let tight = [("MPIB_SRQ_LOW_WATER", "0"), ("MPIB_SRQ_HIGH_WATER", "16")];
    for (faults, mode, failed, extra) in [
        ("cut=sup:1", "0", Rail::ScaleUp, &[][..]),
        ("cut=sup:7", "0", Rail::ScaleUp, &[]),
        ("cut=sup:40", "0", Rail::ScaleUp, &[]),
        ("fail=sup:9", "0", Rail::ScaleUp, &[]),
        ("portdown=sup:5", "0", Rail::ScaleUp, &[]),
        ("cut=sup:9,delay=sout:30", "0", Rail::ScaleUp, &tight),
        ("cut=sout:1", "1", Rail::ScaleOut, &[]),
        ("cut=sout:25", "1", Rail::ScaleOut, &[]),
        ("fail=sout:12", "1", Rail::ScaleOut, &[]),
        ("cut=sout:14,delay=sup:30", "1", Rail::ScaleOut, &tight),
        // NCCL's flush after each receive: the flush reads of the cut rail fail too.
        (
            "cut=sup:12",
            "0",
            Rail::ScaleUp,
            &[("MPIB_FORCE_FLUSH", "1")],
        ),
    ] {
        let mut vars = vec![("MPIB_MODE", mode)];
        vars.extend_from_slice(extra);
        let (pair, outcome) = run_with(faults, &vars, None);
        if let Err(e) = outcome {
            panic!("{faults} (mode {mode}): {e}");
        }
        // A port event is read every housekeeping tick: transfers go on until both ends act.
        let down = crate::proto::rail_mask::RailMask::of(failed);
        let deadline = Instant::now() + Duration::from_secs(5);
        while (pair.send.rails_down(), pair.recv.rails_down()) != (down, down) {
            assert!(Instant::now() < deadline, "{faults}: both ends fail over");
            pipeline(&pair, 6, 3).unwrap_or_else(|e| panic!("{faults} (mode {mode}): {e}"));
        }
        // The connection goes on over the survivor afterwards too.
        pipeline(&pair, 12, 4).unwrap_or_else(|e| panic!("{faults} ({mode}), after: {e}"));
        close(pair);
    }
}

#[test]
fn without_failover_or_a_survivor_a_cut_rail_fails_the_comm_saying_why() {
    let _guard = env_lock();
    let (pair, outcome) = run_with("cut=sup:7", &[("MPIB_FAILOVER", "0")], None);
    let error = outcome.expect_err("MPIB_FAILOVER=0 keeps failing fast");
    assert!(error.message.contains("sup rail"), "{error}");
    close(pair);
    // Vanilla inter-island has no SUP QP: nothing to go on over.
    let (pair, outcome) = run_with(
        "cut=sout:7",
        &[("MPIB_OOB_ADDR", "127.0.0.1")],
        Some("127.0.1.1"),
    );
    let error = outcome.expect_err("no survivor");
    assert!(error.message.contains("no sup rail survives"), "{error}");
    close(pair);
}

/// What operators see: each end counts the failover on the failed rail's NIC and marks it in
/// its connection slot, with the time; the replays count on the survivor.
#[test]
fn a_failover_is_counted_and_marked_in_the_probes() {
    use mpib_probes::declared::{RAIL_FAILOVERS, RAIL_REPLAYED_BYTES};
    let _guard = env_lock();
    let dir = std::env::temp_dir().join(format!("mpib-failover-probes-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let directory = dir.to_str().unwrap();
    let vars = [("MPIB_PROBES_DIR", directory), ("MPIB_MODE", "0")];
    let (pair, outcome) = run_with("cut=sup:20", &vars, None);
    outcome.unwrap();
    let (reader, snapshot) = probes_snapshot(&dir);
    let (sout, sup) = (&snapshot.rails[0], &snapshot.rails[1]);
    assert_eq!(
        (sout.counter(RAIL_FAILOVERS), sup.counter(RAIL_FAILOVERS)),
        (0, 2)
    );
    assert!(
        sout.counter(RAIL_REPLAYED_BYTES) > 0,
        "what the cut caught was replayed"
    );
    assert_eq!(sup.counter(RAIL_REPLAYED_BYTES), 0);
    let open = snapshot.connections.iter();
    let marked: Vec<_> = open.filter(|c| c.rails_down != 0).collect();
    assert_eq!(marked.len(), 2, "both ends of the connection");
    for connection in marked {
        assert_eq!(connection.rails_down, 1 << mpib_probes::RAIL_SUP);
        assert!(connection.failed_over_ns >= connection.opened_ns);
    }
    // One event per end, the collector's span: found, reported, over, in that order; the
    // sender's replays as counted.
    let mut cursor = mpib_probes::EventCursor::default();
    let drained = reader.drain_events(&mut cursor);
    let events: Vec<_> = (drained.records.iter())
        .filter_map(|r| mpib_probes::FailoverEvent::of(&r.transfer))
        .collect();
    assert_eq!(events.len(), 2, "{events:?}");
    for event in &events {
        assert_eq!((event.rail, event.epoch), (mpib_probes::RAIL_SUP, 1));
        assert!(event.detected_ns > 0 && event.detected_ns <= event.reported_ns);
        assert!(event.reported_ns <= event.resumed_ns);
    }
    let sent = events
        .iter()
        .find(|e| e.direction == mpib_probes::Direction::Send);
    let sent = sent.expect("the sending end's");
    assert_eq!(sent.replayed_bytes, sout.counter(RAIL_REPLAYED_BYTES));
    assert!(sent.replayed_transfers > 0);
    close(pair);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A rail that comes back (the loopback's `heal` knob mends the wire and raises a port-active
/// event) is tried again after the hold-down, and both ends split over it again
/// (docs/PROTOCOL.md §11): counted once per end, unmarked in the slots, bytes on it again.
#[test]
fn a_rail_that_comes_back_is_split_over_again() {
    use mpib_probes::declared::{RAIL_FAILBACKS, RAIL_FAILOVERS, RAIL_TX_BYTES};
    let _guard = env_lock();
    for (case, (faults, mode, rail, flush)) in [
        ("cut=sup:20,heal=sup:300", "0", Rail::ScaleUp, "0"),
        ("portdown=sup:9,heal=sup:150", "0", Rail::ScaleUp, "0"),
        ("cut=sout:25,heal=sout:300", "1", Rail::ScaleOut, "0"),
        // NCCL's flush after each receive: the flush QP of the rail is made again too.
        ("cut=sup:20,heal=sup:300", "0", Rail::ScaleUp, "1"),
    ]
    .into_iter()
    .enumerate()
    {
        let dir = std::env::temp_dir().join(format!("mpib-failback-{}-{case}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let directory = dir.to_str().unwrap();
        let vars = [
            ("MPIB_PROBES_DIR", directory),
            ("MPIB_MODE", mode),
            ("MPIB_FAILBACK_HOLD_MS", "20"),
            ("MPIB_FORCE_FLUSH", flush),
        ];
        let (pair, outcome) = run_with(faults, &vars, None);
        outcome.unwrap_or_else(|e| panic!("{faults}: {e}"));
        // Both ends fail over (a port event is read every housekeeping tick), then both take
        // the rail back, transfers going on meanwhile.
        let (reader, _) = probes_snapshot(&dir);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let snapshot = reader.snapshot();
            let counts = (
                snapshot.rails[rail.index()].counter(RAIL_FAILOVERS),
                snapshot.rails[rail.index()].counter(RAIL_FAILBACKS),
            );
            let up = pair.send.rails_down().is_empty() && pair.recv.rails_down().is_empty();
            if counts == (2, 2) && up {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{faults}: back on both ends: {counts:?}"
            );
            pipeline(&pair, 6, 3).unwrap_or_else(|e| panic!("{faults}: {e}"));
        }
        let before = reader.snapshot();
        pipeline(&pair, 24, 6).unwrap_or_else(|e| panic!("{faults}, after: {e}"));
        let after = reader.snapshot();
        let (was, now) = (&before.rails[rail.index()], &after.rails[rail.index()]);
        assert_eq!(now.counter(RAIL_FAILBACKS), 2, "{faults}: once per end");
        assert!(
            now.counter(RAIL_TX_BYTES) > was.counter(RAIL_TX_BYTES),
            "{faults}: the {rail} rail carries bytes again"
        );
        let marked = after
            .connections
            .iter()
            .filter(|c| c.rails_down != 0)
            .count();
        assert_eq!(marked, 0, "{faults}: no end marked degraded");
        close(pair);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// With `MPIB_FAILBACK=0` a rail that comes back stays unused for the connection's life.
#[test]
fn without_failback_a_rail_that_comes_back_stays_down() {
    let _guard = env_lock();
    let vars = [("MPIB_FAILBACK", "0"), ("MPIB_FAILBACK_HOLD_MS", "1")];
    let (pair, outcome) = run_with("cut=sup:20,heal=sup:100", &vars, None);
    outcome.unwrap();
    let until = Instant::now() + Duration::from_millis(300);
    while Instant::now() < until {
        pipeline(&pair, 6, 3).unwrap();
    }
    let down = crate::proto::rail_mask::RailMask::SCALE_UP;
    assert_eq!(
        (pair.send.rails_down(), pair.recv.rails_down()),
        (down, down)
    );
    close(pair);
}

/// The progress watchdog (`MPIB_FAILOVER_WATCHDOG_MS`, `proto::watchdog`): with the split at
/// 512, every SUP work request held far longer than the test runs (the loopback's `delay` knob:
/// a silent stall, no error completion) while SOUT's complete, SUP fails over once its parts
/// made no progress for 50 ms, and every transfer completes over SOUT. Without the watchdog
/// nothing would fail the rail until its QPs' retries ran out.
#[test]
fn the_watchdog_fails_a_stalled_rail_over_while_the_other_completes() {
    let _guard = env_lock();
    let agent = mpib_driver::Agent::start_in_temp().unwrap();
    agent.set_default_sup_bw(512);
    let env: Vec<(&str, String)> = agent.env();
    let mut vars: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    vars.extend([("MPIB_MODE", "1"), ("MPIB_FAILOVER_WATCHDOG_MS", "50")]);
    let started = Instant::now();
    let (pair, outcome) = run_with("delay=sup:1000000000", &vars, None);
    outcome.unwrap();
    let sup = crate::proto::rail_mask::RailMask::SCALE_UP;
    assert_eq!((pair.send.rails_down(), pair.recv.rails_down()), (sup, sup));
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the stall was found by the watchdog, not a timeout"
    );
    close(pair);
}

/// What operators see of a NIC's port: down after a port-down event, up again after the
/// port-active one (the loopback's `portdown` and `heal` knobs), published by the housekeeping
/// thread for the NIC (`mpib_rail_port_down`).
#[test]
fn a_nics_port_state_is_published_as_it_changes() {
    use mpib_probes::declared::RAIL_PORT_DOWN;
    let _guard = env_lock();
    let dir = std::env::temp_dir().join(format!("mpib-port-state-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let vars = [
        ("MPIB_PROBES_DIR", dir.to_str().unwrap()),
        ("MPIB_FAILBACK_HOLD_MS", "20"),
    ];
    // Down at the 9th SUP work request; back some 2,000 work requests later (past the pipeline
    // `run_with` runs, so that the down state is there to be seen first).
    let (pair, outcome) = run_with("portdown=sup:9,heal=sup:2000", &vars, None);
    outcome.unwrap();
    let (reader, _) = probes_snapshot(&dir);
    let port_down = || reader.snapshot().rails[mpib_probes::RAIL_SUP].gauge(RAIL_PORT_DOWN);
    let deadline = Instant::now() + Duration::from_secs(5);
    while port_down() != 1 {
        // Published on the housekeeping thread's next tick.
        assert!(Instant::now() < deadline, "the port is shown down");
        std::thread::sleep(Duration::from_millis(5));
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while port_down() != 0 {
        assert!(Instant::now() < deadline, "the port is shown up again");
        pipeline(&pair, 6, 3).unwrap();
    }
    close(pair);
    let _ = std::fs::remove_dir_all(&dir);
}
