//! The flow's busy time per rail: each instant once, however many of its connections were busy.

use std::collections::BTreeMap;
use std::net::SocketAddrV4;

use mpib_probes::{ConnectionInfo, Direction, Mode, PathClass, ProbesFile, RailInfo, WriterInfo};

use super::*;

const SECOND: u64 = 1_000_000_000;

#[test]
fn concurrent_connections_count_a_rails_busy_time_once() {
    let dir = std::env::temp_dir().join(format!("mpib-agent-measure-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let rails = ["sout0", "sup0"]
        .map(|device| RailInfo {
            device: device.into(),
            port: 1,
            speed_mbps: 100_000,
        })
        .to_vec();
    let file = ProbesFile::create(&dir, &WriterInfo::for_this_process(rails)).unwrap();
    let connections: Vec<_> = (0..4u16)
        .map(|i| {
            let info = ConnectionInfo {
                peer: SocketAddrV4::new([10, 0, 0, 2].into(), 5000 + i),
                direction: Direction::Send,
                path_class: PathClass::IntraIsland,
                mode: Mode::Advanced,
                hint_slot: 0,
            };
            file.claim_connection(&info).unwrap()
        })
        .collect();
    let mut measurer = Measurer::new(&dir, &dir.join("no-sysfs"));
    let users = BTreeMap::new();
    measurer.measure(SECOND, &users); // every connection's baseline
                                      // One second: SUP carried the 4 connections' parts all at once (each busy the whole second,
                                      // 1 GB between them); SOUT carried them one after another (each busy a quarter second,
                                      // 0.5 GB between them). Both rails were busy with the flow the whole second.
    for connection in &connections {
        connection.add_rail_done(1, 250_000_000, SECOND);
        connection.add_rail_done(0, 125_000_000, SECOND / 4);
    }
    let (flows, _) = measurer.measure(SECOND, &users);
    let sample = flows[&0].sample;
    assert_eq!(flows[&0].connections, 4);
    assert_eq!(
        sample.busy_ns,
        [SECOND, SECOND],
        "each instant counted once"
    );
    let rate = |rail| sample.rate(rail).unwrap();
    assert_eq!(
        (rate(0), rate(1)),
        (0.5e9, 1e9),
        "the rails' rates while busy"
    );
    drop(connections);
    drop(file);
    let _ = std::fs::remove_dir_all(&dir);
}
