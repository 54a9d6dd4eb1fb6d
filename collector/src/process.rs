//! One writer process: its mapped probes file, its event cursor, and the translation of a
//! snapshot into catalog series.

use std::collections::BTreeMap;
use std::sync::Arc;

use mpib_probes::{
    ConnectionSnapshot, ConnectionState, EventCursor, EventKind, FileInfo, Mode, PathClass,
    ProbesReader, Scope, SlowTransferRecord, Snapshot, MAX_NICS, MAX_RAILS, RAIL_NAMES,
};
use tracing::{debug, info, warn};

use crate::catalog::{self, declared_family, Family};
use crate::export::Exporter;
use crate::hint::HintTable;
use crate::latency;
use crate::traces::{self, Traces};

/// INFO lines about slow transfers per process and scan; the rest are summarised.
const SLOW_LOG_LINES: usize = 20;

/// A value the file declares and the family it is exported as.
struct DeclaredValue {
    scope: Scope,
    slot: usize,
    family: Arc<Family>,
}

/// What a scan hands to every process it exports.
pub struct ExportContext<'a> {
    /// The recorder.
    pub exporter: &'a Exporter,
    /// The agent's hints, when the file was readable.
    pub hints: Option<&'a HintTable>,
    /// Traces, when an OTLP endpoint is set.
    pub traces: Option<&'a Traces>,
    /// The collector's clock, ns since the Unix epoch.
    pub now_ns: u64,
}

/// Labels of a connection (without `host`/`pid`): NCCL device, peer, direction, path class,
/// mode.
type ConnKey = [String; 5];

/// Byte totals per connection label set, monotonic across slot reuse: when a slot shows a
/// new generation, the old connection's last bytes move into `retired`.
#[derive(Default)]
struct ConnTotals {
    live: BTreeMap<u32, (u32, ConnKey, [u64; MAX_RAILS])>,
    retired: BTreeMap<ConnKey, [u64; MAX_RAILS]>,
}

impl ConnTotals {
    fn update(&mut self, info: &FileInfo, conns: &[ConnectionSnapshot]) {
        for c in conns {
            let key = conn_key(info, c);
            match self.live.get_mut(&c.index) {
                Some((generation, _, bytes)) if *generation == c.generation => {
                    for (old, new) in bytes.iter_mut().zip(c.rail_bytes) {
                        *old = (*old).max(new);
                    }
                }
                _ => {
                    let entry = (c.generation, key, c.rail_bytes);
                    if let Some((_, old_key, old_bytes)) = self.live.insert(c.index, entry) {
                        let total = self.retired.entry(old_key).or_default();
                        for (t, b) in total.iter_mut().zip(old_bytes) {
                            *t = t.wrapping_add(b);
                        }
                    }
                }
            }
        }
    }

    fn totals(&self) -> BTreeMap<&ConnKey, [u64; MAX_RAILS]> {
        let mut out: BTreeMap<&ConnKey, [u64; MAX_RAILS]> =
            self.retired.iter().map(|(k, v)| (k, *v)).collect();
        for (_, key, bytes) in self.live.values() {
            let total = out.entry(key).or_default();
            for (t, b) in total.iter_mut().zip(bytes) {
                *t = t.wrapping_add(*b);
            }
        }
        out
    }
}

fn code_name(known: Option<&'static str>, code: u8) -> String {
    known.map_or_else(|| format!("unknown-{code}"), str::to_owned)
}

/// The `nccl_device` label: the fused device's name from the header (`mlx5_0+mlx5_1`).
pub(crate) fn device_name(info: &FileInfo, device: u8) -> String {
    info.devices
        .get(usize::from(device))
        .map_or_else(|| format!("unknown-{device}"), |d| d.name.clone())
}

fn conn_key(info: &FileInfo, c: &ConnectionSnapshot) -> ConnKey {
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

/// A mapped probes file being exported.
pub struct Process {
    reader: ProbesReader,
    pid: String,
    cursor: EventCursor,
    conns: ConnTotals,
    slow_seen: u64,
    dropped: u64,
    /// The file's declared values, admitted on the first export.
    values: Option<Vec<DeclaredValue>>,
    /// Declarations refused since the collector last asked.
    newly_refused: u64,
}

impl Process {
    /// Start exporting `reader` (events from the start of its ring).
    pub fn new(reader: ProbesReader) -> Process {
        let pid = reader.info().pid.to_string();
        Process {
            reader,
            pid,
            cursor: EventCursor::default(),
            conns: ConnTotals::default(),
            slow_seen: 0,
            dropped: 0,
            values: None,
            newly_refused: 0,
        }
    }

    /// Declarations of this file refused since the last call (each counted once).
    pub fn take_refused(&mut self) -> u64 {
        std::mem::take(&mut self.newly_refused)
    }

    /// Admit the file's declarations as families (once), logging and counting the refused.
    fn admit_values(&mut self, ctx: &ExportContext<'_>) {
        if self.values.is_some() {
            return;
        }
        let path = self.reader.path().display().to_string();
        for why in self.reader.refused_declarations() {
            warn!("probes file {path}: not exporting a declaration: {why}");
            self.newly_refused += 1;
        }
        let mut values = Vec::new();
        for d in self.reader.declarations() {
            let family = declared_family(d).and_then(|f| ctx.exporter.admit(f));
            match family {
                Ok(family) => values.push(DeclaredValue {
                    scope: d.scope,
                    slot: usize::from(d.slot),
                    family,
                }),
                Err(why) => {
                    warn!("probes file {path}: not exporting a declaration: {why}");
                    self.newly_refused += 1;
                }
            }
        }
        self.values = Some(values);
    }

    /// The header fields.
    pub fn info(&self) -> &FileInfo {
        self.reader.info()
    }

    /// The file's reader.
    pub fn reader(&self) -> &ProbesReader {
        &self.reader
    }

    /// Give the reader back (the process is no longer exported).
    pub fn into_reader(self) -> ProbesReader {
        self.reader
    }

    /// Export everything once; returns this process's latency histogram series.
    pub fn export(&mut self, ctx: &ExportContext<'_>, snap: &Snapshot) -> Vec<String> {
        self.admit_values(ctx);
        let info = self.reader.info().clone();
        let pid = self.pid.clone();
        let (host, pid) = (info.host.as_str(), pid.as_str());
        let start = info.start_ns;
        let values = self.values.as_deref().unwrap_or_default();
        let mut histograms = Vec::new();
        // One series per NIC slot: a SUP NIC that two devices share is one NIC, counted once.
        for (i, rail) in snap.rails.iter().enumerate().take(MAX_NICS) {
            let (device, port) = info
                .rails
                .get(i)
                .map_or((String::new(), String::new()), |r| {
                    (r.device.clone(), r.port.to_string())
                });
            let kind = info
                .rail_kinds
                .get(i)
                .copied()
                .unwrap_or(0)
                .min(MAX_RAILS - 1);
            let labels = [host, pid, RAIL_NAMES[kind], device.as_str(), port.as_str()];
            for value in values.iter().filter(|v| v.scope == Scope::Rail) {
                export_value(ctx, &value.family, &labels, rail.values[value.slot], start);
            }
            histograms.push(latency::series_text(&labels, &rail.latency));
            let point = latency::value(&rail.latency);
            ctx.exporter
                .histogram(&catalog::TRANSFER_LATENCY, &labels, point, start);
        }
        let process = [host, pid];
        for value in values.iter().filter(|v| v.scope == Scope::Process) {
            export_value(
                ctx,
                &value.family,
                &process,
                snap.process[value.slot],
                start,
            );
        }
        let masks = [
            ("sout", snap.transfers.sout_only),
            ("sup", snap.transfers.sup_only),
            ("both", snap.transfers.both),
        ];
        for (mask, value) in masks {
            ctx.exporter
                .counter(&catalog::TRANSFERS, &[host, pid, mask], value, start);
        }
        self.export_connections(ctx, snap);
        self.drain_events(ctx);
        let exporter = ctx.exporter;
        exporter.counter(&catalog::SLOW_TRANSFERS, &process, self.slow_seen, start);
        exporter.counter(&catalog::EVENTS_DROPPED, &process, self.dropped, start);
        let threads = f64::from(snap.lanes_in_use);
        exporter.gauge(&catalog::WRITER_THREADS, &process, threads, start);
        let age_ns = ctx.now_ns.saturating_sub(snap.heartbeat_ns);
        let age = age_ns as f64 / 1e9;
        exporter.gauge(&catalog::WRITER_HEARTBEAT_AGE, &process, age, start);
        histograms
    }

    fn export_connections(&mut self, ctx: &ExportContext<'_>, snap: &Snapshot) {
        let info = self.reader.info();
        let (host, pid) = (info.host.as_str(), self.pid.as_str());
        let start = info.start_ns;
        self.conns.update(info, &snap.connections);
        for (key, bytes) in self.conns.totals() {
            for (r, value) in bytes.iter().enumerate() {
                let [device, peer, direction, path, mode] = key.each_ref().map(String::as_str);
                let labels = [
                    host,
                    pid,
                    device,
                    peer,
                    direction,
                    path,
                    mode,
                    RAIL_NAMES[r],
                ];
                ctx.exporter
                    .counter(&catalog::CONNECTION_BYTES, &labels, *value, start);
            }
        }
        let mut ratios: BTreeMap<ConnKey, (f64, u32)> = BTreeMap::new();
        for c in &snap.connections {
            if c.state != ConnectionState::Active {
                continue;
            }
            let key = conn_key(info, c);
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
    }

    fn drain_events(&mut self, ctx: &ExportContext<'_>) {
        let drained = self.reader.drain_events(&mut self.cursor);
        self.dropped = self.dropped.wrapping_add(drained.dropped);
        let mut logged = 0;
        for record in &drained.records {
            if record.transfer.kind == EventKind::SLOW {
                self.slow_seen += 1;
                if logged < SLOW_LOG_LINES {
                    log_slow(self.reader.info(), record);
                    logged += 1;
                }
            } else {
                debug!(pid = self.pid, index = record.index, "sampled transfer");
            }
            if let Some(traces) = ctx.traces {
                traces.emit(self.reader.info(), record);
            }
        }
        let slow = drained
            .records
            .iter()
            .filter(|r| r.transfer.kind == EventKind::SLOW)
            .count();
        if slow > logged {
            info!(
                pid = self.pid,
                "{} more slow transfers not logged",
                slow - logged
            );
        }
    }
}

/// Export one declared value as its family's kind.
fn export_value(
    ctx: &ExportContext<'_>,
    family: &Arc<Family>,
    labels: &[&str],
    value: u64,
    start: u64,
) {
    match family.kind {
        catalog::Kind::Counter => ctx.exporter.counter(family, labels, value, start),
        _ => ctx.exporter.gauge(family, labels, value as f64, start),
    }
}

fn log_slow(info: &FileInfo, record: &SlowTransferRecord) {
    let t = &record.transfer;
    let rails = traces::active_rails(t);
    let start = rails.iter().map(|&r| t.post_ns[r]).min().unwrap_or(0);
    let end = rails.iter().map(|&r| t.done_ns[r]).max().unwrap_or(start);
    let names: Vec<&str> = rails.iter().map(|&r| RAIL_NAMES[r]).collect();
    info!(
        host = info.host,
        pid = info.pid,
        peer = %t.peer,
        nccl_device = device_name(info, t.device),
        direction = traces::direction_name(t.direction),
        size = t.size,
        duration_us = end.saturating_sub(start) / 1000,
        rails = names.join("+"),
        sout_bytes = t.rail_bytes[0],
        sup_bytes = t.rail_bytes[1],
        sup_bw = t.sup_bw,
        "slow transfer"
    );
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
        let mut totals = ConnTotals::default();
        totals.update(
            &info,
            &[conn(0, 1, 5000, [100, 10]), conn(1, 1, 5000, [1, 1])],
        );
        let key = conn_key(&info, &conn(0, 1, 5000, [0, 0]));
        assert_eq!(totals.totals()[&key], [101, 11]);
        totals.update(&info, &[conn(1, 1, 5000, [2, 2])]); // slot 0 invisible (being reclaimed)
        assert_eq!(totals.totals()[&key], [102, 12]);
        totals.update(&info, &[conn(0, 2, 5000, [5, 0]), conn(1, 1, 5000, [2, 2])]);
        assert_eq!(totals.totals()[&key], [107, 12]);
        assert_eq!(key[2..], ["send", "inter", "vanilla"]);
        assert_eq!(key[..2], ["mlx5_0+mlx5_1", "10.0.0.2:5000"]);
        assert_eq!(device_name(&info, 3), "unknown-3");
    }
}
