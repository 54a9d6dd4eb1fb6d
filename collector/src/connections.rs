//! A process's connections as series: one label set at a time up to a limit, and every
//! connection summed per fused device, peer host and direction.
//!
//! A process NCCL drives at scale has thousands of connections (every channel to every peer),
//! and the receive side's peer label carries the connector's port, which differs per
//! connection. One series per label set would make the series count grow with the job, so the
//! collector lists the first `--connection-series` label sets of each process one by one
//! (`mpib_connection_*`), and sums every connection into `mpib_peer_*`, whose labels hold the
//! peer's address without its port (docs/OBSERVABILITY.md, "How many series").
//!
//! Which label sets are listed does not change while the process lives: a label set listed once
//! keeps its series (a counter that stopped and restarted under a lower limit would count its
//! bytes twice in a `rate`), and one first seen past the limit is never listed. Totals are
//! monotonic across slot reuse: when a slot shows a new generation, the old connection's last
//! bytes move into the retired totals of its listed label set (if any) and of its peer.

use std::collections::{BTreeMap, BTreeSet};

use mpib_probes::{
    ConnectionSnapshot, ConnectionState, FileInfo, Mode, PathClass, MAX_RAILS, RAIL_NAMES,
};

use crate::catalog;
use crate::process::{device_name, ExportContext};
use crate::traces;

/// Labels of a connection (without `host`/`pid`): NCCL device, peer, direction, path class,
/// mode.
type ConnectionKey = [String; 5];

/// Labels of a peer (without `host`/`pid`): NCCL device, peer host (no port), direction.
type PeerKey = [String; 3];

/// Byte totals per listed label set and per peer.
#[derive(Default)]
pub(crate) struct ConnectionTotals {
    /// Per slot: the generation seen, the connection's labels and its bytes.
    live: BTreeMap<u32, (u32, ConnectionKey, [u64; MAX_RAILS])>,
    /// The label sets listed one by one: each listed when first seen, while fewer than the
    /// limit were.
    listed: BTreeSet<ConnectionKey>,
    /// Bytes of closed connections (slots reused since) per listed label set.
    retired: BTreeMap<ConnectionKey, [u64; MAX_RAILS]>,
    /// Bytes of closed connections (slots reused since) per peer, every connection.
    retired_peers: BTreeMap<PeerKey, [u64; MAX_RAILS]>,
}

fn add_into(total: &mut [u64; MAX_RAILS], bytes: &[u64; MAX_RAILS]) {
    for (t, b) in total.iter_mut().zip(bytes) {
        *t = t.wrapping_add(*b);
    }
}

fn peer_key(key: &ConnectionKey) -> PeerKey {
    let host = key[1].rsplit_once(':').map_or(key[1].as_str(), |(h, _)| h);
    [key[0].clone(), host.to_owned(), key[2].clone()]
}

fn code_name(known: Option<&'static str>, code: u8) -> String {
    known.map_or_else(|| format!("unknown-{code}"), str::to_owned)
}

fn connection_key(info: &FileInfo, c: &ConnectionSnapshot) -> ConnectionKey {
    let path = match c.info.path_class {
        PathClass::IntraIsland => Some("intra"),
        PathClass::InterIsland => Some("inter"),
        PathClass::Unknown(_) => None,
    };
    let mode = match c.info.mode {
        Mode::Vanilla => Some("vanilla"),
        Mode::Advanced => Some("advanced"),
        Mode::Unknown(_) => None,
    };
    [
        device_name(info, c.info.device),
        c.info.peer.to_string(),
        traces::direction_name(c.info.direction),
        code_name(path, c.info.path_class.code()),
        code_name(mode, c.info.mode.code()),
    ]
}

impl ConnectionTotals {
    /// Takes in a snapshot's connections, listing new label sets while fewer than `limit` are.
    fn update(&mut self, info: &FileInfo, connections: &[ConnectionSnapshot], limit: usize) {
        for c in connections {
            let key = connection_key(info, c);
            match self.live.get_mut(&c.index) {
                Some((generation, _, bytes)) if *generation == c.generation => {
                    for (old, new) in bytes.iter_mut().zip(c.rail_bytes) {
                        *old = (*old).max(new);
                    }
                }
                _ => {
                    if self.listed.len() < limit {
                        self.listed.insert(key.clone());
                    }
                    let entry = (c.generation, key, c.rail_bytes);
                    if let Some((_, old_key, old_bytes)) = self.live.insert(c.index, entry) {
                        self.retire(old_key, &old_bytes);
                    }
                }
            }
        }
    }

    fn retire(&mut self, key: ConnectionKey, bytes: &[u64; MAX_RAILS]) {
        add_into(self.retired_peers.entry(peer_key(&key)).or_default(), bytes);
        if self.listed.contains(&key) {
            add_into(self.retired.entry(key).or_default(), bytes);
        }
    }

    /// Bytes per listed label set, closed connections included.
    fn listed_totals(&self) -> BTreeMap<&ConnectionKey, [u64; MAX_RAILS]> {
        let mut out: BTreeMap<&ConnectionKey, [u64; MAX_RAILS]> =
            self.retired.iter().map(|(k, v)| (k, *v)).collect();
        for (_, key, bytes) in self.live.values() {
            if self.listed.contains(key) {
                add_into(out.entry(key).or_default(), bytes);
            }
        }
        out
    }

    /// Bytes per peer, every connection, closed ones included.
    fn peer_totals(&self) -> BTreeMap<PeerKey, [u64; MAX_RAILS]> {
        let mut out = self.retired_peers.clone();
        for (_, key, bytes) in self.live.values() {
            add_into(out.entry(peer_key(key)).or_default(), bytes);
        }
        out
    }
}

/// Exports a snapshot's connections: the listed label sets' series, every peer's, and how
/// many open connections have no series of their own.
pub(crate) fn export(
    ctx: &ExportContext<'_>,
    totals: &mut ConnectionTotals,
    info: &FileInfo,
    pid: &str,
    connections: &[ConnectionSnapshot],
) {
    let (host, start) = (info.host.as_str(), info.start_ns);
    totals.update(info, connections, ctx.connection_series);
    for (key, bytes) in totals.listed_totals() {
        let [device, peer, direction, path, mode] = key.each_ref().map(String::as_str);
        for (rail, value) in RAIL_NAMES.iter().zip(bytes) {
            let labels = [host, pid, device, peer, direction, path, mode, rail];
            ctx.exporter
                .counter(&catalog::CONNECTION_BYTES, &labels, value, start);
        }
    }
    for (key, bytes) in totals.peer_totals() {
        let [device, peer, direction] = key.each_ref().map(String::as_str);
        for (rail, value) in RAIL_NAMES.iter().zip(bytes) {
            let labels = [host, pid, device, peer, direction, rail];
            ctx.exporter
                .counter(&catalog::PEER_BYTES, &labels, value, start);
        }
    }
    let mut ratios: BTreeMap<ConnectionKey, (f64, u32)> = BTreeMap::new();
    let mut open_per_peer: BTreeMap<PeerKey, u32> = BTreeMap::new();
    let mut unlisted = 0u32;
    for c in connections
        .iter()
        .filter(|c| c.state == ConnectionState::Active)
    {
        let key = connection_key(info, c);
        *open_per_peer.entry(peer_key(&key)).or_default() += 1;
        if !totals.listed.contains(&key) {
            unlisted += 1;
            continue;
        }
        let slot = c.info.hint_slot.to_string();
        let labels = [
            host, pid, &key[0], &key[1], &key[2], &key[3], &key[4], &slot,
        ];
        ctx.exporter
            .gauge(&catalog::CONNECTION_INFO, &labels, 1.0, start);
        let ratio = ctx.hints.and_then(|h| h.sup_ratio(c.info.hint_slot));
        if let (Mode::Advanced, Some(ratio)) = (c.info.mode, ratio) {
            let entry = ratios.entry(key).or_insert((0.0, 0));
            entry.0 += ratio;
            entry.1 += 1;
        }
    }
    for (key, (sum, n)) in ratios {
        let labels = [host, pid, &key[0], &key[1], &key[2], &key[3], &key[4]];
        let mean = sum / f64::from(n.max(1));
        ctx.exporter
            .gauge(&catalog::CONNECTION_HINT_SUP_RATIO, &labels, mean, start);
    }
    for (key, open) in open_per_peer {
        let labels = [host, pid, &key[0], &key[1], &key[2]];
        ctx.exporter
            .gauge(&catalog::PEER_CONNECTIONS, &labels, f64::from(open), start);
    }
    let unlisted = f64::from(unlisted);
    ctx.exporter.gauge(
        &catalog::CONNECTIONS_UNLISTED,
        &[host, pid],
        unlisted,
        start,
    );
    export_operations(ctx, info, pid, connections);
    export_degraded(ctx, info, pid, connections);
}

/// Open connections that failed a rail over, per fused device and failed rail, with the age of
/// the oldest failover: a series for every device of the file and rail, 0 while none has (a few
/// series per process; the alert and the dashboard need them there from the start).
fn export_degraded(
    ctx: &ExportContext<'_>,
    info: &FileInfo,
    pid: &str,
    connections: &[ConnectionSnapshot],
) {
    // Per device and rail: the connections, and the earliest failover among them.
    let mut degraded = vec![[(0u32, u64::MAX); MAX_RAILS]; info.devices.len()];
    let open = connections
        .iter()
        .filter(|c| c.state == ConnectionState::Active && c.rails_down != 0);
    for c in open {
        let Some(device) = degraded.get_mut(usize::from(c.info.device)) else {
            continue;
        };
        for (rail, entry) in device.iter_mut().enumerate() {
            if c.rails_down & (1 << rail) != 0 {
                entry.0 += 1;
                entry.1 = entry.1.min(c.failed_over_ns);
            }
        }
    }
    let (host, start) = (info.host.as_str(), info.start_ns);
    for (index, rails) in degraded.iter().enumerate() {
        let device = device_name(info, index as u8);
        for (rail, (count, since_ns)) in RAIL_NAMES.iter().zip(rails) {
            let labels = [host, pid, device.as_str(), rail];
            let exporter = ctx.exporter;
            exporter.gauge(
                &catalog::DEGRADED_CONNECTIONS,
                &labels,
                f64::from(*count),
                start,
            );
            let age = match count {
                0 => 0.0,
                _ => ctx.now_ns.saturating_sub(*since_ns) as f64 / 1e9,
            };
            exporter.gauge(&catalog::DEGRADED_SECONDS, &labels, age, start);
        }
    }
}

/// Open connections per device, direction and the operation NCCL said their last transfer
/// served: a handful of series whatever the connections (NCCL's functions, algorithms and
/// protocols are few).
fn export_operations(
    ctx: &ExportContext<'_>,
    info: &FileInfo,
    pid: &str,
    connections: &[ConnectionSnapshot],
) {
    let mut counts: BTreeMap<[String; 5], u32> = BTreeMap::new();
    let open = connections
        .iter()
        .filter(|c| c.state == ConnectionState::Active);
    for c in open.filter(|c| c.operation.is_known()) {
        let key = [
            device_name(info, c.info.device),
            traces::direction_name(c.info.direction),
            c.operation.function_label(),
            c.operation.algorithm_label(),
            c.operation.protocol_label(),
        ];
        *counts.entry(key).or_default() += 1;
    }
    let (host, start) = (info.host.as_str(), info.start_ns);
    for (key, n) in counts {
        let [device, direction, function, algorithm, protocol] = key.each_ref().map(String::as_str);
        let labels = [host, pid, device, direction, function, algorithm, protocol];
        ctx.exporter.gauge(
            &catalog::CONNECTIONS_BY_OPERATION,
            &labels,
            f64::from(n),
            start,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mpib_probes::{ConnectionInfo, Direction};
    use std::net::{Ipv4Addr, SocketAddrV4};

    fn conn(index: u32, generation: u32, port: u16, bytes: [u64; 2]) -> ConnectionSnapshot {
        ConnectionSnapshot {
            index,
            generation,
            state: ConnectionState::Active,
            info: ConnectionInfo {
                peer: SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 2), port),
                direction: Direction::Send,
                path_class: PathClass::InterIsland,
                mode: Mode::Vanilla,
                hint_slot: 0,
                device: 0,
            },
            opened_ns: 1,
            closed_ns: 0,
            rail_bytes: bytes,
            rail_busy_ns: [0; 2],
            rail_done_bytes: [0; 2],
            rail_in_flight: [0; 2],
            operation: mpib_probes::Operation::default(),
            rails_down: 0,
            failed_over_ns: 0,
        }
    }

    fn file_info() -> FileInfo {
        FileInfo {
            abi_version: mpib_probes::ABI_VERSION,
            pid: 7,
            start_ns: 1,
            host: "h".into(),
            rails: Vec::new(),
            rail_kinds: Vec::new(),
            devices: vec![mpib_probes::DeviceEntry {
                name: "mlx5_0+mlx5_1".into(),
                nics: [0, 1],
            }],
            slow_threshold_ns: 0,
            sample_one_in: 0,
        }
    }

    #[test]
    fn totals_stay_monotonic_across_slot_reuse_and_sum_equal_labels() {
        let info = file_info();
        let mut totals = ConnectionTotals::default();
        let both = [conn(0, 1, 5000, [100, 10]), conn(1, 1, 5000, [1, 1])];
        totals.update(&info, &both, 8);
        let key = connection_key(&info, &conn(0, 1, 5000, [0, 0]));
        assert_eq!(totals.listed_totals()[&key], [101, 11]);
        // Slot 0 invisible (being reclaimed).
        totals.update(&info, &[conn(1, 1, 5000, [2, 2])], 8);
        assert_eq!(totals.listed_totals()[&key], [102, 12]);
        let reused = [conn(0, 2, 5000, [5, 0]), conn(1, 1, 5000, [2, 2])];
        totals.update(&info, &reused, 8);
        assert_eq!(totals.listed_totals()[&key], [107, 12]);
        assert_eq!(key[2..], ["send", "inter", "vanilla"]);
        assert_eq!(key[..2], ["mlx5_0+mlx5_1", "10.0.0.2:5000"]);
        assert_eq!(device_name(&info, 3), "unknown-3");
    }

    /// Past the limit, label sets get no series of their own; their bytes still reach the
    /// peer's, which stay monotonic when their slots are reused; which label sets are listed
    /// never changes.
    #[test]
    fn label_sets_past_the_limit_count_in_their_peer_only() {
        let info = file_info();
        let mut totals = ConnectionTotals::default();
        // Five connections to one host, each from its own port: two are listed.
        let first: Vec<_> = (0..5)
            .map(|i| conn(i, 1, 6000 + i as u16, [10, 1]))
            .collect();
        totals.update(&info, &first, 2);
        let listed: Vec<String> = totals
            .listed_totals()
            .keys()
            .map(|k| k[1].clone())
            .collect();
        assert_eq!(listed, ["10.0.0.2:6000", "10.0.0.2:6001"]);
        let peer = ["mlx5_0+mlx5_1".to_owned(), "10.0.0.2".into(), "send".into()];
        assert_eq!(totals.peer_totals()[&peer], [50, 5]);
        // Slot 4 (unlisted) and slot 0 (listed) reused by new label sets; a higher limit now
        // lists the newcomers, never takes a listed one away.
        let next = [conn(0, 2, 7000, [3, 0]), conn(4, 2, 7004, [4, 0])];
        totals.update(&info, &next, 3);
        let listed: Vec<String> = totals
            .listed_totals()
            .keys()
            .map(|k| k[1].clone())
            .collect();
        assert_eq!(listed, ["10.0.0.2:6000", "10.0.0.2:6001", "10.0.0.2:7000"]);
        assert_eq!(
            totals.listed_totals()[&connection_key(&info, &first[0])],
            [10, 1]
        );
        assert_eq!(
            totals.peer_totals()[&peer],
            [57, 5],
            "50 retired and live, plus 3 and 4"
        );
        assert_eq!(
            totals.retired.len(),
            1,
            "only listed label sets are kept once closed"
        );
    }
}
