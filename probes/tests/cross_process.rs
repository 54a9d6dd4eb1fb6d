//! Cross-process: this test binary re-executes itself (`current_exe`, marked by an environment
//! variable) as a writer child that fills a probes file while the parent reads it through
//! its own read-only mapping, concurrently and after the writer is done.

#![cfg(not(loom))]
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use mpib_probes::declared::{
    RAIL_RX_BYTES, RAIL_SEND_COMPLETIONS, RAIL_TX_BYTES, SRQ_HIGH_WATER, SRQ_LOW_WATER,
};
use std::env;
use std::fs;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use mpib_probes::{
    ConnectionInfo, ConnectionState, Direction, EventCursor, EventKind, LoadState, Mode, PathClass,
    ProbesFile, ProbesReader, RailInfo, SlowTransfer, WriterInfo, EVENT_CAPACITY,
};

/// Set (to the probes directory) only in the re-executed writer child.
const CHILD_DIR: &str = "MPIB_PROBES_CROSS_PROCESS_WRITER_DIR";
const EVENTS: u64 = 200_000;
const LATENCY_NS: u64 = 100;
/// Heartbeat value the child stores once everything is written.
const DONE: u64 = u64::MAX - 7;
const TIMEOUT: Duration = Duration::from_secs(60);

fn event(i: u64) -> SlowTransfer {
    SlowTransfer {
        kind: if i % 2 == 0 {
            EventKind::SLOW
        } else {
            EventKind::SAMPLED
        },
        direction: Direction::Send,
        rail_mask: (i % 3 + 1) as u8,
        conn_index: i as u32,
        size: i * 3,
        post_ns: [i, i + 1],
        done_ns: [i + 2, i + 3],
        rail_bytes: [i * 2, i],
        sup_bw: (i % 1025) as u32,
        slot: (i % 64) as u32,
        qp_num: [i as u32 ^ 0xaaaa, i as u32 ^ 0x5555],
        peer: SocketAddrV4::new(Ipv4Addr::new(10, 9, 8, 7), (i % 65_536) as u16),
        device: 0,
        operation: mpib_probes::Operation::default(),
    }
}

fn conn_info() -> ConnectionInfo {
    ConnectionInfo {
        peer: SocketAddrV4::new(Ipv4Addr::new(10, 9, 8, 7), 5555),
        direction: Direction::Send,
        path_class: PathClass::InterIsland,
        mode: Mode::Advanced,
        hint_slot: 4,
        device: 0,
    }
}

fn wait_until<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(start.elapsed() < TIMEOUT, "timed out waiting for {what}");
        sleep(Duration::from_millis(2));
    }
}

/// The child's body: write known values, signal DONE, wait for the parent, clean up.
fn run_writer(dir: &Path) {
    let rails = vec![
        RailInfo {
            device: "mlx5_0".into(),
            port: 1,
            speed_mbps: 0,
        },
        RailInfo {
            device: "mlx5_1".into(),
            port: 1,
            speed_mbps: 0,
        },
    ];
    let probes = ProbesFile::create(dir, &WriterInfo::for_this_process(rails)).unwrap();
    let (sout, sup) = (probes.rail(0), probes.rail(1));
    let conn = probes.claim_connection(&conn_info()).unwrap();
    sout.set(SRQ_LOW_WATER, 32);
    sout.set(SRQ_HIGH_WATER, 1024);
    for i in 0..EVENTS {
        sout.add(RAIL_TX_BYTES, 3);
        sup.add(RAIL_RX_BYTES, 5);
        sout.inc(RAIL_SEND_COMPLETIONS);
        sup.record_latency_ns(LATENCY_NS);
        probes.transfers().record((i % 3 + 1) as u8);
        conn.add_split([2, 1]);
        probes.record_slow_transfer(&event(i));
    }
    probes.heartbeat(DONE);
    wait_until("the parent's release file", || {
        dir.join("release").exists().then_some(())
    });
    conn.close();
    probes.remove().unwrap();
}

#[test]
fn writer_child() {
    // In the normal run this is an empty test; the parent below re-executes the binary with
    // CHILD_DIR set and `--exact writer_child` to make it the writer.
    if let Some(dir) = env::var_os(CHILD_DIR) {
        run_writer(Path::new(&dir));
    }
}

struct Cleanup(PathBuf, Option<Child>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(child) = &mut self.1 {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn spawn_writer(dir: &Path) -> Child {
    Command::new(env::current_exe().unwrap())
        .args(["writer_child", "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_DIR, dir)
        .stdout(Stdio::null()) // the child's own harness lines would look like ours; panics go to stderr
        .spawn()
        .unwrap()
}

fn open_when_ready(dir: &Path) -> ProbesReader {
    wait_until("a ready probes file", || {
        let entry = fs::read_dir(dir)
            .ok()?
            .flatten()
            .find(|e| e.path().extension().is_some_and(|x| x == "probes"))?;
        match ProbesReader::open(&entry.path()).ok()? {
            LoadState::Ready(reader) => Some(reader),
            LoadState::AwaitVersion => None,
            other => panic!("unexpected load state {other:?}"),
        }
    })
}

/// Drain once, checking every record against the pattern; returns how many were returned.
fn drain_checked(reader: &ProbesReader, cursor: &mut EventCursor) -> u64 {
    let drained = reader.drain_events(cursor);
    for r in &drained.records {
        assert_eq!(
            r.transfer,
            event(r.index),
            "torn or wrong record {}",
            r.index
        );
    }
    drained.records.len() as u64
}

#[test]
fn parent_reads_what_a_child_process_writes() {
    let dir = env::temp_dir().join(format!("mpib-probes-xproc-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let mut guard = Cleanup(dir.clone(), None);
    let child = spawn_writer(&dir);
    let child_pid = child.id();
    guard.1 = Some(child);

    let reader = open_when_ready(&dir);
    assert_eq!(reader.info().pid, child_pid);
    assert_eq!(reader.info().rails[1].device, "mlx5_1");
    // Read while the child writes: records intact, counters monotonic, histogram consistent.
    let mut cursor = EventCursor::new();
    let mut returned = 0;
    let mut last_tx = 0;
    while reader.heartbeat_ns() != DONE {
        returned += drain_checked(&reader, &mut cursor);
        let snap = reader.snapshot();
        let tx = snap.rails[0].counter(RAIL_TX_BYTES);
        assert!(tx >= last_tx, "counter went backwards");
        last_tx = tx;
        let lat = snap.rails[1].latency;
        if lat.consistent {
            assert_eq!(lat.sum, lat.count() * LATENCY_NS, "inconsistent histogram");
        }
    }
    returned += drain_checked(&reader, &mut cursor);
    let dropped = cursor.dropped_total();
    eprintln!("cross-process: {returned} records returned intact, {dropped} dropped (overwritten)");
    assert_eq!(
        returned + dropped,
        EVENTS,
        "every record returned or dropped"
    );
    assert!(
        returned >= EVENT_CAPACITY as u64,
        "at least the last ring-full survives"
    );

    let snap = reader.snapshot();
    assert_eq!((snap.pid, snap.events_written), (child_pid, EVENTS));
    let (sout, sup) = (snap.rails[0], snap.rails[1]);
    assert_eq!(
        (
            sout.counter(RAIL_TX_BYTES),
            sout.counter(RAIL_SEND_COMPLETIONS),
            sup.counter(RAIL_RX_BYTES)
        ),
        (3 * EVENTS, EVENTS, 5 * EVENTS)
    );
    assert_eq!(
        (sout.gauge(SRQ_LOW_WATER), sout.gauge(SRQ_HIGH_WATER)),
        (32, 1024)
    );
    let lat = snap.rails[1].latency;
    assert!(lat.consistent);
    assert_eq!((lat.count(), lat.buckets[7]), (EVENTS, EVENTS));
    let t = snap.transfers;
    assert_eq!(t.sout_only + t.sup_only + t.both, EVENTS);
    assert_eq!(t.no_rail, 0);
    let conn = &snap.connections[0];
    assert_eq!(
        (conn.state, conn.info),
        (ConnectionState::Active, conn_info())
    );
    assert_eq!(conn.rail_bytes, [2 * EVENTS, EVENTS]);

    fs::write(dir.join("release"), b"").unwrap();
    let status = guard.1.take().unwrap().wait().unwrap();
    assert!(status.success(), "writer child failed: {status}");
    assert!(!reader.path().exists(), "clean shutdown removes the file");
    let after = reader.snapshot();
    assert_ne!(after.closed_ns, 0);
    assert_eq!(after.connections[0].state, ConnectionState::Closed);
}
