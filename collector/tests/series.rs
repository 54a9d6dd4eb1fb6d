//! How many series a process at NCCL's counts exports: 4,096 connections to 64 peer hosts
//! (each receive connection with a peer port of its own, as the connector's socket gives it).
//! The connection families stay bounded by `--connection-series`; every connection is still
//! counted in the per-peer sums. docs/OBSERVABILITY.md ("How many series") quotes the counts
//! this prints.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::float_cmp)]

mod common;

use common::*;
use mpib_probes::{ConnectionProbe, Direction, Mode, PathClass, ProbesFile};

/// Peer hosts of the process.
const HOSTS: u16 = 64;
/// Connections per peer host and direction.
const PER_HOST: u16 = 32;

/// 2,048 send connections (32 to each host's listener, one label set per host) and 2,048
/// receive connections (each from its own port), 3 bytes on SOUT and 5 on SUP each.
fn many_connections(probes: &ProbesFile) -> Vec<ConnectionProbe<'_>> {
    let mut held = Vec::new();
    for (direction, port_base) in [(Direction::Send, 40_000), (Direction::Recv, 50_000)] {
        for host in 0..HOSTS {
            for n in 0..PER_HOST {
                let port = match direction {
                    Direction::Send => port_base,
                    _ => port_base + n,
                };
                let peer = [10, 1, (host / 256) as u8, host as u8];
                let info = conn_info(
                    peer,
                    port,
                    direction,
                    PathClass::InterIsland,
                    Mode::Vanilla,
                    0,
                );
                let claimed = probes.claim_connection(&info).unwrap();
                claimed.add_split([3, 5]);
                held.push(claimed);
            }
        }
    }
    held
}

fn count(scrape: &Scrape, prefix: &str) -> usize {
    scrape
        .samples
        .iter()
        .filter(|s| s.name.starts_with(prefix))
        .count()
}

fn sum(scrape: &Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    scrape.matching(name, labels).iter().map(|s| s.value).sum()
}

#[test]
fn thousands_of_connections_export_a_bounded_number_of_series() {
    let dir = TempDir::new("series");
    let probes = ProbesFile::create(dir.path(), &live_writer()).unwrap();
    let held = many_connections(&probes);
    let connections = held.len();
    assert_eq!(connections, 4096);
    for (limit, listed_sets) in [("128", 128), ("0", 0), ("16384", 64 + 2048)] {
        let (scrape, _) = scrape_isolated(&dir, &["--connection-series", limit]);
        let claim_failures = scrape.value("mpib_connection_claim_failures_total", &[]);
        assert_eq!(claim_failures, 0.0, "every one has a slot");
        // Listed: the 64 send label sets first (claimed first), then receive ones.
        let info = scrape.matching("mpib_connection_info", &[]).len();
        let bytes = scrape.matching("mpib_connection_bytes_total", &[]).len();
        assert_eq!(
            (info, bytes),
            (listed_sets, 2 * listed_sets),
            "limit {limit}"
        );
        let listed_connections = match listed_sets {
            0 => 0,
            n => 2048 + (n - 64),
        };
        let unlisted = scrape.value("mpib_connections_unlisted", &[]);
        assert_eq!(unlisted as usize, connections - listed_connections);
        // Every connection in the peer sums, whatever the limit.
        let peers = scrape.matching("mpib_peer_connections", &[]);
        assert_eq!(peers.len(), 2 * usize::from(HOSTS));
        assert_eq!(sum(&scrape, "mpib_peer_connections", &[]), 4096.0);
        let one_host = [("peer_host", "10.1.0.7"), ("direction", "recv")];
        let on_sup = [one_host[0], one_host[1], ("rail", "sup")];
        assert_eq!(scrape.value("mpib_peer_connections", &one_host), 32.0);
        assert_eq!(scrape.value("mpib_peer_bytes_total", &on_sup), 32.0 * 5.0);
        assert_eq!(sum(&scrape, "mpib_peer_bytes_total", &[]), 4096.0 * 8.0);
        eprintln!(
            "--connection-series {limit}: {} series in all, {} of mpib_connection_*, {} of \
             mpib_peer_*",
            scrape.samples.len(),
            count(&scrape, "mpib_connection_"),
            count(&scrape, "mpib_peer_")
        );
    }
    drop(held);
}
