//! One writer process: its mapped probes file, its event cursor, and the translation of a
//! snapshot into catalog series.

use std::sync::Arc;

use mpib_probes::{
    EventCursor, EventKind, FileInfo, ProbesReader, Scope, SlowTransferRecord, Snapshot, MAX_NICS,
    MAX_RAILS, RAIL_NAMES,
};
use tracing::{debug, info, warn};

use crate::catalog::{self, declared_family, Family};
use crate::connections::{self, ConnectionTotals};
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
    /// The metric model the scan records into.
    pub exporter: &'a Exporter,
    /// The agent's hints, when the file was readable.
    pub hints: Option<&'a HintTable>,
    /// Traces, when an OTLP endpoint is set.
    pub traces: Option<&'a Traces>,
    /// The collector's clock, ns since the Unix epoch.
    pub now_ns: u64,
    /// Connection label sets of a process listed one by one (`--connection-series`).
    pub connection_series: usize,
}

/// The `nccl_device` label: the fused device's name from the header (`mlx5_0+mlx5_1`).
pub(crate) fn device_name(info: &FileInfo, device: u8) -> String {
    info.devices
        .get(usize::from(device))
        .map_or_else(|| format!("unknown-{device}"), |d| d.name.clone())
}

/// A mapped probes file being exported.
pub struct Process {
    reader: ProbesReader,
    pid: String,
    cursor: EventCursor,
    conns: ConnectionTotals,
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
            conns: ConnectionTotals::default(),
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

    /// Record every series of the process once, in the scan of `ctx`.
    pub fn export(&mut self, ctx: &ExportContext<'_>, snap: &Snapshot) {
        self.admit_values(ctx);
        let info = self.reader.info().clone();
        let pid = self.pid.clone();
        let (host, pid) = (info.host.as_str(), pid.as_str());
        let start = info.start_ns;
        let values = self.values.as_deref().unwrap_or_default();
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
        connections::export(ctx, &mut self.conns, &info, pid, &snap.connections);
        self.drain_events(ctx);
        let exporter = ctx.exporter;
        exporter.counter(&catalog::SLOW_TRANSFERS, &process, self.slow_seen, start);
        exporter.counter(&catalog::EVENTS_DROPPED, &process, self.dropped, start);
        let threads = f64::from(snap.lanes_in_use);
        exporter.gauge(&catalog::WRITER_THREADS, &process, threads, start);
        let age_ns = ctx.now_ns.saturating_sub(snap.heartbeat_ns);
        let age = age_ns as f64 / 1e9;
        exporter.gauge(&catalog::WRITER_HEARTBEAT_AGE, &process, age, start);
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
            } else if let Some(failover) = mpib_probes::FailoverEvent::of(&record.transfer) {
                log_failover(self.reader.info(), &failover);
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

fn log_failover(info: &FileInfo, f: &mpib_probes::FailoverEvent) {
    info!(
        host = info.host,
        pid = info.pid,
        peer = %f.peer,
        nccl_device = device_name(info, f.device),
        direction = traces::direction_name(f.direction),
        rail = RAIL_NAMES[f.rail.min(RAIL_NAMES.len() - 1)],
        reported_after_us = f.reported_ns.saturating_sub(f.detected_ns) / 1000,
        duration_us = f.resumed_ns.saturating_sub(f.detected_ns) / 1000,
        replayed_transfers = f.replayed_transfers,
        replayed_bytes = f.replayed_bytes,
        "rail failed over"
    );
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
        operation = t.operation.describe(),
        "slow transfer"
    );
}
