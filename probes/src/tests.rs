//! Whole-file tests: the writer and the reader through a real file in a temporary directory.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::declared::{
    CTS_POSTED, CTS_SIGNALED, MASK_MISMATCHES, PROTOCOL_ERRORS, RAIL_ERROR_COMPLETIONS,
    RAIL_RECV_COMPLETIONS, RAIL_RX_BYTES, RAIL_SEND_COMPLETIONS, RAIL_TX_BYTES, RAIL_WORK_REQUESTS,
    SRQ_DEPTH, SRQ_HIGH_WATER, SRQ_LOW_WATER, SRQ_LOW_WATER_HITS, SRQ_REFILLS,
};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::declared::{self, Declaration, Merge, RailCounter, ValueKind, ValueUnit};
use crate::tests_connections::conn_info;
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
        devices: vec![DeviceEntry {
            name: "mlx5_0+mlx5_3".into(),
            nics: [0, 1],
        }],
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

pub(crate) fn open_state(bytes: &[u8], dir: &Path) -> LoadState {
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
        0x03, 0x00, 0x03, 0x00, // abi_version 3.3
        0x00, 0x11, 0x00, 0x00, // header_len 4352
        0x00, 0xda, 0x25, 0x00, 0x00, 0x00, 0x00, 0x00, // file_len 2480640
        0x92, 0x10, 0x00, 0x00, // writer_pid 4242
        0x02, 0x00, 0x00, 0x00, // rail_count (NIC slots) 2
        0xef, 0xcd, 0xab, 0x89, 0x67, 0x45, 0x23, 0x01, // start_ns
        0xef, 0xcd, 0xab, 0x89, 0x67, 0x45, 0x23, 0x01, // heartbeat_ns = start_ns
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // closed_ns
        0x20, 0xa1, 0x07, 0x00, 0x00, 0x00, 0x00, 0x00, // slow_threshold_ns 500000
        0xe8, 0x03, 0x00, 0x00, // sample_one_in 1000
        0x07, 0x00, 0x00, 0x00, // region_count 7
    ];
    assert_eq!(bytes[..72], golden);
    // Region table: (offset, len, stride, count).
    let regions: Vec<[u32; 4]> = (0..7)
        .map(|r| core::array::from_fn(|f| le32(&bytes, 72 + r * 16 + f * 4)))
        .collect();
    let expected = [
        [4352, 229_376, 896, 256],
        [233_728, 128, 128, 1],
        [235_904, 2_097_152, 128, 16_384],
        [2_333_056, 128, 128, 1],
        [2_333_184, 131_072, 128, 1024],
        [233_856, 2048, 128, 16],
        [2_464_256, 16_384, 256, 64],
    ];
    assert_eq!(regions, expected);
    assert_eq!(le32(&bytes, 184), 1, "device_count");
    assert_eq!(le32(&bytes, 188), 0, "no connection slot claimed yet");
    // The first declaration record: rail, counter, bytes, sum, slot 0, its name.
    let record = &bytes[2_464_256..2_464_256 + 256];
    assert_eq!(record[..8], [1, 1, 2, 1, 0, 0, 0, 0]);
    assert_eq!(&record[16..41], b"mpib_rail_tx_bytes_total\0");
    let depth = &bytes[2_464_256 + 5 * 256..][..8];
    assert_eq!(
        depth,
        [1, 2, 1, 3, 5, 0, 7, 0],
        "srq_depth: gauge, lowest active, witness 7"
    );
    assert_eq!(&bytes[192..199], b"node-a\0");
    assert_eq!(&bytes[256..263], b"mlx5_0\0");
    assert_eq!(le32(&bytes, 256 + 64), 1);
    assert_eq!(le32(&bytes, 256 + 68), 200_000, "NIC slot 0 speed_mbps");
    assert_eq!(bytes[256 + 72], 0, "NIC slot 0 serves SOUT");
    assert_eq!(&bytes[384..391], b"mlx5_3\0");
    assert_eq!(le32(&bytes, 384 + 64), 2);
    assert_eq!(bytes[384 + 72], 1, "NIC slot 1 serves SUP");
    assert_eq!(&bytes[2304..2318], b"mlx5_0+mlx5_3\0", "device 0's name");
    assert_eq!(bytes[2304 + 64..2304 + 66], [0, 1], "device 0's NIC slots");
    assert!(
        bytes[4352..2_464_256].iter().all(|b| *b == 0),
        "regions start zeroed"
    );
}

/// A value the crate does not declare, as a test fixture or a newer writer would add it.
const WIDGETS: RailCounter = RailCounter::at(22);
const FIXTURE_DECLARATION: Declaration = WIDGETS.declare(
    ValueUnit::Count,
    Merge::Sum,
    "mpib_fixture_widgets_total",
    "Widgets.",
);

#[test]
fn a_reader_learns_values_from_the_file() {
    let dir = TempDir::new();
    let mut declarations = DECLARATIONS.to_vec();
    declarations.push(FIXTURE_DECLARATION);
    let probes = ProbesFile::create_declaring(&dir.0, &info(), &declarations).unwrap();
    probes.rail(RAIL_SUP).add(WIDGETS, 3);
    probes.rail(RAIL_SUP).add(WIDGETS, 4);
    let reader = open_ready(probes.path().unwrap());
    let found = reader.declarations();
    assert_eq!(found.len(), DECLARATIONS.len() + 1);
    assert_eq!(found.last(), Some(&Declared::from(&FIXTURE_DECLARATION)));
    assert!(reader.refused_declarations().is_empty());
    assert_eq!(reader.snapshot().rails[RAIL_SUP].values[22], 7);
}

#[test]
fn bad_declarations_are_refused_by_name() {
    let dir = TempDir::new();
    let refuse = |extra: Declaration| {
        let mut declarations = DECLARATIONS.to_vec();
        declarations.push(extra);
        let err = ProbesFile::create_declaring(&dir.0, &info(), &declarations).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
        err.to_string()
    };
    let same_slot = RailCounter::at(0).declare(ValueUnit::Count, Merge::Sum, "mpib_x_total", "");
    assert!(refuse(same_slot).contains("\"mpib_x_total\""));
    let bad_name = WIDGETS.declare(ValueUnit::Count, Merge::Sum, "Mpib-X", "");
    assert!(refuse(bad_name).contains("[a-z0-9_]"));
    let summed_max = WIDGETS.declare(ValueUnit::Count, Merge::Highest, "mpib_y_total", "");
    assert!(refuse(summed_max).contains("Merge::Sum"));

    // A record a reader cannot use is skipped with its reason; the others stay.
    let probes = ProbesFile::create(&dir.0, &info()).unwrap();
    let mut bytes = fs::read(probes.path().unwrap()).unwrap();
    bytes[2_464_256 + 256] = 9; // the second record's scope
    let LoadState::Ready(reader) = open_state(&bytes, &dir.0) else {
        panic!("still readable")
    };
    assert_eq!(reader.declarations().len(), DECLARATIONS.len() - 1);
    let refused = reader.refused_declarations();
    assert_eq!(refused.len(), 1);
    assert!(refused[0].contains("mpib_rail_rx_bytes_total") && refused[0].contains("scope 9"));
}

#[test]
fn this_versions_declarations_are_valid() {
    declared::check(DECLARATIONS).unwrap();
    for d in DECLARATIONS {
        assert!(d.name.starts_with("mpib_"), "{}", d.name);
        let total = d.name.ends_with("_total");
        assert_eq!(total, d.kind == ValueKind::Counter, "{}", d.name);
        assert!(!d.help.is_empty(), "{}", d.name);
    }
}

#[test]
fn counters_round_trip_through_a_file() {
    let dir = TempDir::new();
    let probes = ProbesFile::create(&dir.0, &info()).unwrap();
    let (sout, sup) = (probes.rail(RAIL_SOUT), probes.rail(RAIL_SUP));
    sout.add(RAIL_TX_BYTES, 1000);
    sout.add(RAIL_TX_BYTES, 24);
    sout.add(RAIL_RX_BYTES, 7);
    sout.add(RAIL_WORK_REQUESTS, 3);
    sout.inc(RAIL_SEND_COMPLETIONS);
    sout.add(RAIL_RECV_COMPLETIONS, 2);
    sout.set(SRQ_DEPTH, 9);
    sout.set(SRQ_DEPTH, 8);
    sout.set(SRQ_LOW_WATER, 16);
    sout.set(SRQ_HIGH_WATER, 512);
    let once = [
        SRQ_REFILLS,
        SRQ_LOW_WATER_HITS,
        MASK_MISMATCHES,
        PROTOCOL_ERRORS,
    ];
    for counter in once
        .into_iter()
        .chain([CTS_POSTED, CTS_SIGNALED, RAIL_ERROR_COMPLETIONS])
    {
        sout.inc(counter);
    }
    sout.record_latency_ns(1500);
    sout.record_latency_ns(0);
    sup.add(RAIL_TX_BYTES, 5);
    probes.rail(7).add(RAIL_TX_BYTES, 1 << 40); // out of range: disabled handle, not rail 1
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
    let rail = &snap.rails[0];
    let counters = [
        (RAIL_TX_BYTES, 1024),
        (RAIL_RX_BYTES, 7),
        (RAIL_WORK_REQUESTS, 3),
        (RAIL_SEND_COMPLETIONS, 1),
        (RAIL_RECV_COMPLETIONS, 2),
        (SRQ_REFILLS, 1),
        (SRQ_LOW_WATER_HITS, 1),
        (MASK_MISMATCHES, 1),
        (PROTOCOL_ERRORS, 1),
        (CTS_POSTED, 1),
        (CTS_SIGNALED, 1),
        (RAIL_ERROR_COMPLETIONS, 1),
    ];
    for (counter, value) in counters {
        assert_eq!(rail.counter(counter), value, "{counter:?}");
    }
    let gauges = [(SRQ_DEPTH, 8), (SRQ_LOW_WATER, 16), (SRQ_HIGH_WATER, 512)];
    for (gauge, value) in gauges {
        assert_eq!(rail.gauge(gauge), value, "{gauge:?}");
    }
    let used: u64 = rail.values[15..].iter().sum();
    assert_eq!(used, 0, "undeclared words stay 0");
    let lat = snap.rails[0].latency;
    assert!(lat.consistent);
    assert_eq!(
        (lat.count(), lat.sum, lat.buckets[11], lat.buckets[0]),
        (2, 1500, 1, 1)
    );
    assert_eq!(snap.rails[1].counter(RAIL_TX_BYTES), 5);
    let t = snap.transfers;
    assert_eq!((t.no_rail, t.sout_only, t.sup_only, t.both), (1, 2, 1, 4));
    probes.remove().unwrap();
    assert_eq!(
        reader.snapshot().rails[0].counter(RAIL_TX_BYTES),
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
    rail.add(RAIL_TX_BYTES, 5);
    rail.record_latency_ns(77);
    probes.transfers().record(3);
    probes.heartbeat(1);
    probes.record_slow_transfer(&sample_transfer(0));
    assert!(probes.claim_connection(&conn_info(1)).is_none());
    RailProbe::disabled().inc(CTS_POSTED);
    TransferProbe::disabled().record(1);
    probes.remove().unwrap();
}

#[test]
fn disabled_writes_reach_no_file() {
    let dir = TempDir::new();
    let probes = ProbesFile::disabled();
    probes.rail(1).add(RAIL_TX_BYTES, 5);
    probes.transfers().record(3);
    probes.record_slow_transfer(&sample_transfer(0));
    let real = ProbesFile::create(&dir.0, &info()).unwrap();
    let snap = open_ready(real.path().unwrap()).snapshot();
    assert_eq!(snap.rails[0].values, [0; RAIL_VALUE_SLOTS]);
    assert_eq!(
        (snap.transfers, snap.events_written),
        (TransferCounts::default(), 0)
    );
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
    newer_major[8..12].copy_from_slice(&0x0004_0003u32.to_le_bytes());
    match state(&newer_major) {
        LoadState::Incompatible { found, expected } => {
            assert_eq!(
                (version_string(found), version_string(expected)),
                ("4.3".into(), "3.3".into())
            );
        }
        other => panic!("{other:?}"),
    }
    // A 2.x file (one slot per rail, a 512-byte header) is of another major.
    let mut older_major = good.clone();
    older_major[8..12].copy_from_slice(&0x0002_0002u32.to_le_bytes());
    assert!(matches!(
        state(&older_major),
        LoadState::Incompatible { .. }
    ));
    let mut newer_minor = good.clone();
    newer_minor[8..12].copy_from_slice(&0x0003_0007u32.to_le_bytes());
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
    let mut no_devices = good.clone();
    no_devices[184..188].copy_from_slice(&0u32.to_le_bytes());
    assert_eq!(corrupt(&no_devices), Corruption::BadHeader("device_count"));
    let mut missing_nic = good.clone();
    missing_nic[2304 + 65] = 2; // device 0's SUP NIC slot, of 2
    assert_eq!(corrupt(&missing_nic), Corruption::BadHeader("devices"));
    let mut third_rail = good.clone();
    third_rail[256 + 72] = 2; // NIC slot 0 serving rail 2
    assert_eq!(corrupt(&third_rail), Corruption::BadHeader("rails"));
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
        devices: vec![DeviceEntry::of_rails(&info().rails[..1])],
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

/// Three NICs, two devices sharing the SUP NIC: each NIC's counters are its own, the shared
/// NIC's are one, and a connection names its device.
#[test]
fn devices_and_nic_slots_round_trip() {
    let dir = TempDir::new();
    let nic = |name: &str| RailInfo {
        device: name.into(),
        port: 1,
        speed_mbps: 100_000,
    };
    let info = WriterInfo {
        rails: vec![nic("mlx5_0"), nic("mlx5_2"), nic("mlx5_1")],
        devices: vec![
            DeviceEntry {
                name: "mlx5_0+mlx5_1".into(),
                nics: [0, 2],
            },
            DeviceEntry {
                name: "mlx5_2+mlx5_1".into(),
                nics: [1, 2],
            },
        ],
        ..info()
    };
    let probes = ProbesFile::create(&dir.0, &info).unwrap();
    for (slot, bytes) in [(0, 10), (1, 20), (2, 5), (2, 7)] {
        probes.rail(slot).add(RAIL_TX_BYTES, bytes);
    }
    let connection = probes
        .claim_connection(&ConnectionInfo {
            device: 1,
            ..conn_info(9)
        })
        .unwrap();
    let reader = open_ready(probes.path().unwrap());
    assert_eq!(reader.info().rail_kinds, [0, 0, 1]);
    assert_eq!(reader.info().devices, info.devices);
    let snapshot = reader.snapshot();
    let sent: Vec<u64> = snapshot
        .rails
        .iter()
        .map(|r| r.counter(RAIL_TX_BYTES))
        .collect();
    assert_eq!(sent, [10, 20, 12], "the shared SUP NIC counts once");
    assert_eq!(snapshot.connections[0].info.device, 1);
    drop(connection);
    let bad = WriterInfo {
        devices: vec![DeviceEntry {
            name: "x".into(),
            nics: [0, 3],
        }],
        ..info
    };
    let error = ProbesFile::create(&dir.0, &bad).unwrap_err();
    assert!(
        error
            .to_string()
            .contains("device x names NIC slots [0, 3] of 3"),
        "{error}"
    );
}
