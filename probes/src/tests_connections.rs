//! The connection table through a file: every slot claimed and read back, a claim failure
//! counted, and readers looking no further than the high-water mark (3.2 on).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::net::{Ipv4Addr, SocketAddrV4};

use crate::declared::{CONNECTIONS_WITHOUT_AGENT, CONNECTION_CLAIM_FAILURES};
use crate::tests::{info, open_ready, open_state, TempDir};
use crate::*;

pub(crate) fn conn_info(port: u16) -> ConnectionInfo {
    ConnectionInfo {
        peer: SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 2), port),
        direction: Direction::Recv,
        path_class: PathClass::IntraIsland,
        mode: Mode::Vanilla,
        hint_slot: 12,
        device: 0,
    }
}

/// Readers look at the slots below the high-water mark only (3.2 on), all of them in an older
/// file, and never past the table whatever the mark says; the 2 MiB table of a file with a few
/// connections takes a few pages on disk.
#[test]
fn a_reader_looks_no_further_than_the_connection_mark() {
    use std::os::unix::fs::MetadataExt as _;
    let dir = TempDir::new();
    let probes = ProbesFile::create(&dir.0, &info()).unwrap();
    let path = probes.path().unwrap().to_path_buf();
    assert_eq!(open_ready(&path).connection_slots_used(), 0);
    let held: Vec<_> = (0..3)
        .map(|p| probes.claim_connection(&conn_info(p)).unwrap())
        .collect();
    let reader = open_ready(&path);
    assert_eq!(reader.connection_slots_used(), 3);
    assert_eq!(reader.snapshot().connections.len(), 3);
    let allocated = fs::metadata(&path).unwrap().blocks() * 512;
    assert!(
        allocated < 1 << 20,
        "{allocated} bytes allocated for a {FILE_LEN}-byte file with 3 connections"
    );
    let bytes = fs::read(&path).unwrap();
    let mut older = bytes.clone();
    older[8..12].copy_from_slice(&0x0003_0001u32.to_le_bytes());
    older[188..192].copy_from_slice(&[0; 4]);
    let LoadState::Ready(older) = open_state(&older, &dir.0) else {
        panic!("a 3.1 file is readable")
    };
    assert_eq!(older.connection_slots_used(), CONNECTION_SLOTS as u32);
    assert_eq!(older.snapshot().connections.len(), 3);
    let mut lying = bytes;
    lying[188..192].copy_from_slice(&u32::MAX.to_le_bytes());
    let LoadState::Ready(lying) = open_state(&lying, &dir.0) else {
        panic!("a file whose mark is past its table is still readable")
    };
    assert_eq!(lying.connection_slots_used(), CONNECTION_SLOTS as u32);
    drop(held);
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
    probes.add(CONNECTIONS_WITHOUT_AGENT, 1);
    probes.add(CONNECTIONS_WITHOUT_AGENT, 1);
    let snap = reader.snapshot();
    assert_eq!(
        (
            snap.connections.len(),
            snap.process_counter(CONNECTION_CLAIM_FAILURES)
        ),
        (CONNECTION_SLOTS, 1)
    );
    assert_eq!(snap.process_counter(CONNECTIONS_WITHOUT_AGENT), 2);
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
