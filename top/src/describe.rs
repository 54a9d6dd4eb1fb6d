//! One process's [`Process`] from its snapshot and the previous one.

use mpib_node::hint::HintTable;
use mpib_probes::{
    ConnectionSnapshot, ConnectionState, Direction, Mode, PathClass, ProbesReader, Snapshot,
    MAX_RAILS, RAIL_NAMES,
};

use crate::frame::{Connection, Device, Process, Rail};
use crate::sample::{rail_words, split_of, values, Rates};

/// `send`, `recv` (or `unknown`).
pub fn direction(d: Direction) -> &'static str {
    match d {
        Direction::Send => "send",
        Direction::Recv => "recv",
        Direction::Unknown(_) => "unknown",
    }
}

fn mode(m: Mode) -> &'static str {
    match m {
        Mode::Vanilla => "vanilla",
        Mode::Advanced => "advanced",
        Mode::Unknown(_) => "unknown",
    }
}

fn path_class(p: PathClass) -> &'static str {
    match p {
        PathClass::IntraIsland => "intra-island",
        PathClass::InterIsland => "inter-island",
        PathClass::Unknown(_) => "unknown",
    }
}

/// The process of one file.
pub fn process(
    reader: &ProbesReader,
    snapshot: &Snapshot,
    rates: &Rates<'_>,
    user: &str,
    hints: Option<&HintTable>,
    now_ns: u64,
) -> Process {
    let info = reader.info();
    let total = |s: &Snapshot| {
        let t = &s.transfers;
        t.no_rail + t.sout_only + t.sup_only + t.both
    };
    // A connection that closed since the previous sample still moved bytes in the interval:
    // its device's rates count them, the table shows the open ones.
    let all: Vec<(bool, Connection)> = snapshot
        .connections
        .iter()
        .map(|c| {
            (
                c.state == ConnectionState::Active,
                connection(reader, c, rates, hints),
            )
        })
        .collect();
    let mut devices: Vec<Device> = (0..info.devices.len())
        .map(|d| device(reader, snapshot, rates, d, all.iter().map(|(_, c)| c)))
        .collect();
    for (_, c) in all.iter().filter(|(open, _)| *open) {
        let Some(device) = devices.get_mut(usize::from(c.device_index)) else {
            continue;
        };
        for rail in device.rails.iter_mut() {
            if c.failed_over.contains(&rail.rail) {
                rail.failed_over_connections += 1;
            }
        }
    }
    let connections = all
        .into_iter()
        .filter_map(|(open, c)| open.then_some(c))
        .collect();
    Process {
        pid: info.pid,
        user: user.to_owned(),
        host: info.host.clone(),
        age_seconds: now_ns.saturating_sub(info.start_ns) as f64 / 1e9,
        transfers_per_second: rates
            .before
            .and_then(|before| rates.per_second(total(snapshot), total(before))),
        devices,
        connections,
        values: values(reader, snapshot, rates, None),
    }
}

/// Bytes per rail since the previous snapshot: the same slot and generation, or all of them
/// for a connection that was not there.
fn connection_bytes(c: &ConnectionSnapshot, rates: &Rates<'_>) -> [Option<f64>; MAX_RAILS] {
    let before = rates.before.and_then(|b| {
        b.connections
            .iter()
            .find(|p| p.index == c.index && p.generation == c.generation)
            .map(|p| p.rail_bytes)
    });
    let before = before.unwrap_or([0; MAX_RAILS]);
    let mut out = [None; MAX_RAILS];
    for (r, slot) in out.iter_mut().enumerate() {
        *slot = rates.per_second(c.rail_bytes[r], before[r]);
    }
    out
}

fn connection(
    reader: &ProbesReader,
    c: &ConnectionSnapshot,
    rates: &Rates<'_>,
    hints: Option<&HintTable>,
) -> Connection {
    let rail_bytes_per_second = connection_bytes(c, rates);
    let advanced = c.info.mode == Mode::Advanced;
    let both = match rail_bytes_per_second {
        [Some(a), Some(b)] => Some([a, b]),
        _ => None,
    };
    Connection {
        index: c.index,
        peer: c.info.peer.to_string(),
        direction: direction(c.info.direction),
        device: reader
            .info()
            .devices
            .get(usize::from(c.info.device))
            .map_or_else(|| format!("#{}", c.info.device), |d| d.name.clone()),
        device_index: c.info.device,
        mode: mode(c.info.mode),
        path: path_class(c.info.path_class),
        flow: advanced.then_some(c.info.hint_slot),
        rail_bytes_per_second,
        bytes_per_second: both.map(|[a, b]| a + b),
        split_asked: hints
            .filter(|_| advanced)
            .and_then(|h| h.sup_bw(c.info.hint_slot)),
        split_applied: both.and_then(split_of),
        operation: crate::frame::Operation::of(&c.operation),
        failed_over: (0..MAX_RAILS)
            .filter(|r| c.rails_down & (1 << r) != 0)
            .map(|r| RAIL_NAMES[r])
            .collect(),
    }
}

fn device<'a>(
    reader: &ProbesReader,
    snapshot: &Snapshot,
    rates: &Rates<'_>,
    index: usize,
    connections: impl Iterator<Item = &'a Connection>,
) -> Device {
    let info = reader.info();
    let entry = &info.devices[index];
    let mine: Vec<&Connection> = connections
        .filter(|c| usize::from(c.device_index) == index)
        .collect();
    let (mut sent, mut received, mut rails) = (0.0, 0.0, [0.0; MAX_RAILS]);
    let (mut asked_weight, mut asked_sum, mut asked_plain) = (0.0, 0.0, Vec::new());
    for c in &mine {
        let Some(bytes) = c.bytes_per_second else {
            continue;
        };
        match c.direction {
            "send" => sent += bytes,
            _ => received += bytes,
        }
        for (r, total) in rails.iter_mut().enumerate() {
            *total += c.rail_bytes_per_second[r].unwrap_or(0.0);
        }
        if let Some(asked) = c.split_asked {
            asked_weight += bytes;
            asked_sum += bytes * f64::from(asked);
            asked_plain.push(asked);
        }
    }
    // Rates need a previous sample (which also sets the seconds between).
    let known = rates.before.is_some();
    let split_asked = if asked_weight > 0.0 {
        Some((asked_sum / asked_weight).round() as u32)
    } else if !asked_plain.is_empty() {
        let n = asked_plain.len() as f64;
        Some((asked_plain.iter().map(|a| f64::from(*a)).sum::<f64>() / n).round() as u32)
    } else {
        None
    };
    Device {
        index,
        name: entry.name.clone(),
        sent_bytes_per_second: known.then_some(sent),
        received_bytes_per_second: known.then_some(received),
        split_asked,
        split_applied: known.then(|| split_of(rails)).flatten(),
        rails: (0..MAX_RAILS)
            .map(|r| rail(reader, snapshot, rates, index, r))
            .collect(),
    }
}

fn rail(
    reader: &ProbesReader,
    snapshot: &Snapshot,
    rates: &Rates<'_>,
    device: usize,
    rail: usize,
) -> Rail {
    let info = reader.info();
    let nic = info.devices[device].nics[rail];
    let nic_info = info.rails.get(nic);
    let shared = info
        .devices
        .iter()
        .enumerate()
        .any(|(d, e)| d != device && e.nics.contains(&nic));
    let now = rail_words(snapshot, nic);
    let before = rates.before.map(|b| rail_words(b, nic));
    let rate = |i: usize| before.and_then(|b| rates.per_second(now[i], b[i]));
    let transfers = |s: &Snapshot| s.rails.get(nic).map_or(0, |r| r.latency.count());
    let retransmissions = match (
        rates.retransmissions_now.get(nic).copied().flatten(),
        rates.retransmissions_before.get(nic).copied().flatten(),
    ) {
        (Some(now), Some(before)) => rates.per_second(now, before),
        _ => None,
    };
    Rail {
        rail: RAIL_NAMES[rail],
        nic: nic_info.map_or_else(String::new, |r| r.device.clone()),
        port: nic_info.map_or(0, |r| r.port),
        shared,
        sent_bytes_per_second: rate(0),
        received_bytes_per_second: rate(1),
        transfers_per_second: rates
            .before
            .and_then(|b| rates.per_second(transfers(snapshot), transfers(b))),
        srq_depth: now[2],
        srq_low_water: now[3],
        srq_high_water: now[4],
        error_completions: now[5],
        error_completions_per_second: rate(5),
        retransmissions_per_second: retransmissions,
        failed_over_connections: 0,
        values: values(reader, snapshot, rates, Some(nic)),
    }
}
