//! Whole-file tests: the writer and the reader through a real file in a temporary directory.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::types::tests::sample_transfer;
use crate::*;

/// A directory removed when dropped.
pub(crate) struct TempDir(pub(crate) PathBuf);

impl TempDir {
    pub(crate) fn new() -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!(
            "mpib-probes-unit-{}-{}-{n}",
            std::process::id(),
            now_ns()
        ));
        fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

pub(crate) fn info() -> WriterInfo {
    WriterInfo {
        pid: 4242,
        start_ns: 0x0123_4567_89ab_cdef,
        host: "node-a".into(),
        rails: vec![
            RailInfo {
                device: "mlx5_0".into(),
                port: 1,
                speed_mbps: 200_000,
            },
            RailInfo {
                device: "mlx5_3".into(),
                port: 2,
                speed_mbps: 400_000,
            },
        ],
        slow_threshold_ns: 500_000,
        sample_one_in: 1000,
    }
}

pub(crate) fn open_ready(path: &Path) -> ProbesReader {
    match ProbesReader::open(path).unwrap() {
        LoadState::Ready(reader) => reader,
        other => panic!("not ready: {other:?}"),
    }
}

fn open_state(bytes: &[u8], dir: &Path) -> LoadState {
    let path = dir.join("patched.probes");
    fs::write(&path, bytes).unwrap();
    ProbesReader::open(&path).unwrap()
}

fn le32(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap())
}

#[test]
fn golden_header_bytes() {
    let dir = TempDir::new();
    let probes = ProbesFile::create(&dir.0, &info()).unwrap();
    let path = probes.path().unwrap().to_path_buf();
    assert_eq!(
        path.file_name().unwrap(),
        "mpib-4242-81985529216486895.probes"
    );
    let bytes = fs::read(&path).unwrap();
    assert_eq!(bytes.len(), FILE_LEN);
    #[rustfmt::skip]
    let golden: [u8; 72] = [
        b'M', b'P', b'I', b'B', b'P', b'R', b'O', b'B', // magic
        0x00, 0x00, 0x02, 0x00, // abi_version 2.0
        0x00, 0x02, 0x00, 0x00, // header_len 512
        0x00, 0x9b, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, // file_len 170752
        0x92, 0x10, 0x00, 0x00, // writer_pid 4242
        0x02, 0x00, 0x00, 0x00, // rail_count 2
        0xef, 0xcd, 0xab, 0x89, 0x67, 0x45, 0x23, 0x01, // start_ns
        0xef, 0xcd, 0xab, 0x89, 0x67, 0x45, 0x23, 0x01, // heartbeat_ns = start_ns
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // closed_ns
        0x20, 0xa1, 0x07, 0x00, 0x00, 0x00, 0x00, 0x00, // slow_threshold_ns 500000
        0xe8, 0x03, 0x00, 0x00, // sample_one_in 1000
        0x06, 0x00, 0x00, 0x00, // region_count 6
    ];
    assert_eq!(bytes[..72], golden);
    // Region table: (offset, len, stride, count).
    let regions: Vec<[u32; 4]> = (0..6)
        .map(|r| core::array::from_fn(|f| le32(&bytes, 72 + r * 16 + f * 4)))
        .collect();
    let expected = [
        [512, 28_672, 896, 32],
        [29_184, 128, 128, 1],
        [31_360, 8192, 128, 64],
        [39_552, 128, 128, 1],
        [39_680, 131_072, 128, 1024],
        [29_312, 2048, 128, 16],
    ];
    assert_eq!(regions, expected);
    assert!(bytes[168..192].iter().all(|b| *b == 0), "reserved is zero");
    assert_eq!(&bytes[192..199], b"node-a\0");
    assert_eq!(&bytes[256..263], b"mlx5_0\0");
    assert_eq!(le32(&bytes, 256 + 64), 1);
    assert_eq!(le32(&bytes, 256 + 68), 200_000, "rail 0 speed_mbps");
    assert_eq!(&bytes[384..391], b"mlx5_3\0");
    assert_eq!(le32(&bytes, 384 + 64), 2);
    assert!(bytes[512..].iter().all(|b| *b == 0), "regions start zeroed");
}

#[test]
fn counters_round_trip_through_a_file() {
    let dir = TempDir::new();
    let probes = ProbesFile::create(&dir.0, &info()).unwrap();
    let (sout, sup) = (probes.rail(RAIL_SOUT), probes.rail(RAIL_SUP));
    sout.add_tx_bytes(1000);
    sout.add_tx_bytes(24);
    sout.add_rx_bytes(7);
    sout.add_wrs_posted(3);
    sout.inc_send_cqes();
    sout.inc_recv_cqes();
    sout.inc_recv_cqes();
    sout.set_srq_depth(9);
    sout.set_srq_depth(8);
    sout.set_srq_watermarks(16, 512);
    sout.inc_srq_refills();
    sout.inc_srq_low_water_hits();
    sout.inc_mask_mismatches();
    sout.inc_protocol_errors();
    sout.inc_cts_posted();
    sout.inc_cts_signaled();
    sout.inc_error_completions();
    sout.record_latency_ns(1500);
    sout.record_latency_ns(0);
    sup.add_tx_bytes(5);
    probes.rail(7).add_tx_bytes(1 << 40); // out of range: disabled handle, not rail 1
    for mask in [1, 1, 2, 3, 3, 3, 0, 7] {
        probes.transfers().record(mask);
    }
    probes.heartbeat(99);

    let reader = open_ready(probes.path().unwrap());
    let info = reader.info();
    assert_eq!(
        (info.pid, info.host.as_str(), info.abi_version),
        (4242, "node-a", ABI_VERSION)
    );
    assert_eq!(info.rails[1].device, "mlx5_3");
    assert_eq!(info.rails[1].speed_mbps, 400_000);
    let snap = reader.snapshot();
    assert_eq!((snap.pid, snap.heartbeat_ns, snap.closed_ns), (4242, 99, 0));
    let c = snap.rails[0].counters;
    let expected = RailCounterValues {
        tx_bytes: 1024,
        rx_bytes: 7,
        wrs_posted: 3,
        send_cqes: 1,
        recv_cqes: 2,
        srq_depth: 8,
        srq_low_water: 16,
        srq_high_water: 512,
        srq_refills: 1,
        srq_low_water_hits: 1,
        mask_mismatches: 1,
        protocol_errors: 1,
        cts_posted: 1,
        cts_signaled: 1,
        error_completions: 1,
    };
    assert_eq!(c, expected);
    let lat = snap.rails[0].latency;
    assert!(lat.consistent);
    assert_eq!(
        (lat.count(), lat.sum, lat.buckets[11], lat.buckets[0]),
        (2, 1500, 1, 1)
    );
    assert_eq!(snap.rails[1].counters.tx_bytes, 5);
    let t = snap.transfers;
    assert_eq!((t.no_rail, t.sout_only, t.sup_only, t.both), (1, 2, 1, 4));
    probes.remove().unwrap();
    assert_eq!(
        reader.snapshot().rails[0].counters.tx_bytes,
        1024,
        "mapping outlives unlink"
    );
    assert_ne!(reader.closed_ns(), 0);
}

#[test]
fn disabled_handles_are_no_ops() {
    let probes = ProbesFile::disabled();
    assert!(!probes.is_enabled() && probes.path().is_none());
    let rail = probes.rail(0);
    rail.add_tx_bytes(5);
    rail.record_latency_ns(77);
    probes.transfers().record(3);
    probes.heartbeat(1);
    probes.record_slow_transfer(&sample_transfer(0));
    assert!(probes.claim_connection(&conn_info(1)).is_none());
    RailProbe::disabled().inc_cts_posted();
    TransferProbe::disabled().record(1);
    probes.remove().unwrap();
}

#[test]
fn disabled_writes_reach_no_file() {
    let dir = TempDir::new();
    let probes = ProbesFile::disabled();
    probes.rail(1).add_tx_bytes(5);
    probes.transfers().record(3);
    probes.record_slow_transfer(&sample_transfer(0));
    let real = ProbesFile::create(&dir.0, &info()).unwrap();
    let snap = open_ready(real.path().unwrap()).snapshot();
    assert_eq!(snap.rails[0].counters, RailCounterValues::default());
    assert_eq!(
        (snap.transfers, snap.events_written),
        (TransferCounts::default(), 0)
    );
}

fn conn_info(port: u16) -> ConnectionInfo {
    ConnectionInfo {
        peer: SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 2), port),
        direction: Direction::Recv,
        path_class: PathClass::IntraIsland,
        mode: Mode::Vanilla,
        hint_slot: 12,
    }
}

#[test]
fn connection_claim_and_release_through_a_file() {
    let dir = TempDir::new();
    let probes = ProbesFile::create(&dir.0, &info()).unwrap();
    let reader = open_ready(probes.path().unwrap());
    let held: Vec<_> = (0..CONNECTION_SLOTS as u16)
        .map(|p| probes.claim_connection(&conn_info(p)).unwrap())
        .collect();
    assert!(
        probes.claim_connection(&conn_info(999)).is_none(),
        "table full"
    );
    held[3].add_split([100, 200]);
    probes.inc_agent_unavailable();
    probes.inc_agent_unavailable();
    let snap = reader.snapshot();
    assert_eq!(
        (snap.connections.len(), snap.claim_failures),
        (CONNECTION_SLOTS, 1)
    );
    assert_eq!(snap.agent_unavailable, 2);
    let c3 = snap.connections[3];
    assert_eq!(
        (c3.index, c3.info, c3.rail_bytes),
        (3, conn_info(3), [100, 200])
    );
    assert_eq!(c3.state, ConnectionState::Active);
    drop(held);
    let snap = reader.snapshot();
    assert!(snap
        .connections
        .iter()
        .all(|c| c.state == ConnectionState::Closed));
    assert_eq!(snap.connections[3].rail_bytes, [100, 200]);
}

#[test]
fn event_ring_overwrites_oldest_through_a_file() {
    let dir = TempDir::new();
    let probes = ProbesFile::create(&dir.0, &info()).unwrap();
    let reader = open_ready(probes.path().unwrap());
    let mut cursor = EventCursor::new();
    probes.record_slow_transfer(&sample_transfer(0));
    let first = reader.drain_events(&mut cursor);
    assert_eq!((first.records.len(), first.dropped), (1, 0));
    assert_eq!(first.records[0].transfer, sample_transfer(0));
    let total = EVENT_CAPACITY as u32 + 10;
    for i in 1..=total {
        probes.record_slow_transfer(&sample_transfer(i));
    }
    let next = reader.drain_events(&mut cursor);
    assert_eq!((next.records.len(), next.dropped), (EVENT_CAPACITY, 10));
    let first_kept = next.records[0];
    assert_eq!((first_kept.index, first_kept.transfer.conn_index), (11, 11));
    assert!(next
        .records
        .iter()
        .all(|r| r.transfer == sample_transfer(r.index as u32)));
    assert_eq!(reader.snapshot().events_written, u64::from(total) + 1);
    assert_eq!(probes.events_written(), u64::from(total) + 1);
}

#[test]
fn reader_states() {
    let dir = TempDir::new();
    let probes = ProbesFile::create(&dir.0, &info()).unwrap();
    let good = fs::read(probes.path().unwrap()).unwrap();
    let state = |bytes: &[u8]| open_state(bytes, &dir.0);
    assert!(matches!(state(&good), LoadState::Ready(_)));
    assert!(matches!(state(&[]), LoadState::AwaitVersion));
    assert!(matches!(state(&good[..100]), LoadState::AwaitVersion));
    let mut unpublished = good.clone();
    unpublished[8..12].copy_from_slice(&[0; 4]);
    assert!(matches!(state(&unpublished), LoadState::AwaitVersion));

    let mut newer_major = good.clone();
    newer_major[8..12].copy_from_slice(&0x0003_0003u32.to_le_bytes());
    match state(&newer_major) {
        LoadState::Incompatible { found, expected } => {
            assert_eq!(
                (version_string(found), version_string(expected)),
                ("3.3".into(), "2.0".into())
            );
        }
        other => panic!("{other:?}"),
    }
    let mut newer_minor = good.clone();
    newer_minor[8..12].copy_from_slice(&0x0002_0007u32.to_le_bytes());
    assert!(
        matches!(state(&newer_minor), LoadState::Ready(_)),
        "minor is compatible"
    );

    let corrupt = |bytes: &[u8]| match state(bytes) {
        LoadState::Corrupt(c) => c,
        other => panic!("{other:?}"),
    };
    let mut bad_magic = good.clone();
    bad_magic[0] = b'X';
    assert_eq!(corrupt(&bad_magic), Corruption::BadMagic);
    let truncated = corrupt(&good[..FILE_LEN - 128]);
    let actual = (FILE_LEN - 128) as u64;
    assert_eq!(
        truncated,
        Corruption::Truncated {
            expected: FILE_LEN as u64,
            actual
        }
    );
    assert!(truncated.to_string().contains("truncated"));
    let mut out_of_bounds = good.clone();
    out_of_bounds[72 + 4 * 16..72 + 4 * 16 + 4].copy_from_slice(&200_000u32.to_le_bytes());
    assert_eq!(corrupt(&out_of_bounds), Corruption::BadRegion("events"));
    let mut bad_stride = good.clone();
    bad_stride[72 + 8..72 + 12].copy_from_slice(&64u32.to_le_bytes());
    assert_eq!(corrupt(&bad_stride), Corruption::BadRegion("rails"));
    let mut no_rails = good.clone();
    no_rails[28..32].copy_from_slice(&0u32.to_le_bytes());
    assert_eq!(corrupt(&no_rails), Corruption::BadHeader("rail_count"));
}

#[test]
fn create_remove_and_drop() {
    let dir = TempDir::new();
    let nested = dir.0.join("a/b");
    let probes = ProbesFile::create(&nested, &info()).unwrap();
    let path = probes.path().unwrap().to_path_buf();
    assert!(path.exists(), "parent directories are created");
    let again = ProbesFile::create(&nested, &info()).unwrap_err();
    assert_eq!(again.kind(), std::io::ErrorKind::AlreadyExists);
    probes.remove().unwrap();
    probes.remove().unwrap();
    assert!(!path.exists());
    let one_rail = WriterInfo {
        start_ns: 1,
        rails: info().rails[..1].to_vec(),
        ..info()
    };
    let dropped = ProbesFile::create(&nested, &one_rail).unwrap();
    let path = dropped.path().unwrap().to_path_buf();
    assert_eq!(open_ready(&path).snapshot().rails.len(), 1);
    drop(dropped);
    assert!(!path.exists(), "dropping the owner removes the file");
    let none = WriterInfo {
        rails: Vec::new(),
        ..info()
    };
    let err = ProbesFile::create(&nested, &none).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
}
