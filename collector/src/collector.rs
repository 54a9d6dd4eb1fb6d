//! The scan: find probes files, follow each writer through its life, export.
//!
//! Life of a file, as seen by one scan:
//!
//! | seen | action |
//! |---|---|
//! | new, `AwaitVersion` | retried next scan; reaped if its pid (from the name) is gone and it is older than `stale_after` |
//! | new, `Incompatible` / `Corrupt` | one log line, counted once by reason (`version`, `corrupt`, `truncated`), not reopened until the file changes; reaped like the above |
//! | new, `Ready` | exported from this scan on (a restarted writer's series replace the old writer's at once) |
//! | shorter than when opened | dropped without touching the mapping, counted `truncated` |
//! | `closed_ns` set, or gone from the directory | exported one last time; those last values linger for 3 scans (`export`) |
//! | a newer file of the same `host`/`pid` | superseded: a restart, exported one last time |
//! | pid gone and heartbeat older than `stale_after` | exported one last time, then reaped (unlinked, counted, logged) |
//! | new, untrusted (`trust`: a symlink, writable by group or others, an owner not allowed, a forgery) | one log line, counted once (`untrusted`), not reopened until the file, its owner or its mode changes; reaped like a refused file |
//! | new, `Ready`, its pid not running | not exported (its owner cannot be checked); retried next scan; reaped when closed or its heartbeat is older than `stale_after` |

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use mpib_probes::{version_string, ProbesReader};
use tracing::{debug, info, warn};

use crate::catalog;
use crate::config::Config;
use crate::export::Exporter;
use crate::files::{self, Identity, Loaded, WriterState};
use crate::hint::{HintError, HintTable};
use crate::process::{ExportContext, Process};
use crate::sysfs;
use crate::traces::Traces;

mod reaping;
use crate::trust::{self, FileCheck, Stat, WriterCheck};

/// Refusal reasons, in `mpib_probes_skipped_total{reason}` order.
const REASONS: [&str; 4] = ["version", "corrupt", "truncated", "untrusted"];
const TRUNCATED: usize = 2;
const UNTRUSTED: usize = 3;

struct Tracked {
    process: Process,
    identity: Identity,
    /// Whether a scan exported it: only then is its last export kept (lingers).
    exported: bool,
}

struct Finished {
    reader: ProbesReader,
    identity: Identity,
    superseded: bool,
}

#[derive(Clone, Copy)]
enum Finish {
    Vanished,
    Closed,
    Superseded,
    Dead,
}

/// The collector's state between scans.
pub struct Collector {
    config: Config,
    host: String,
    exporter: Arc<Exporter>,
    traces: Option<Arc<Traces>>,
    tracked: BTreeMap<PathBuf, Tracked>,
    finished: BTreeMap<PathBuf, Finished>,
    refused: BTreeMap<PathBuf, Identity>,
    skipped: [u64; REASONS.len()],
    reaped: u64,
    declarations_refused: u64,
    /// When this collector started, ns since the Unix epoch: the start of its own series.
    started_ns: u64,
    /// When the host booted: the start of the NIC counters' series.
    boot_ns: u64,
    files_found: usize,
    dir_note: Option<String>,
    hint_note: Option<String>,
    quiet: BTreeSet<PathBuf>,
}

/// The collector's own host name (`/proc/sys/kernel/hostname`), `unknown` if unreadable.
pub fn host_name() -> String {
    fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".to_owned())
}

impl Collector {
    /// A collector for `config`, sending traces to `traces` when set. The last values of a
    /// writer that went away linger for 3 scans (`export`).
    pub fn new(config: Config, traces: Option<Arc<Traces>>) -> Collector {
        let exporter = Exporter::new();
        Collector {
            host: host_name(),
            exporter: Arc::new(exporter),
            traces,
            config,
            tracked: BTreeMap::new(),
            finished: BTreeMap::new(),
            refused: BTreeMap::new(),
            skipped: [0; REASONS.len()],
            reaped: 0,
            declarations_refused: 0,
            started_ns: mpib_probes::now_ns(),
            boot_ns: sysfs::boot_time_ns().unwrap_or_else(mpib_probes::now_ns),
            files_found: 0,
            dir_note: None,
            hint_note: None,
            quiet: BTreeSet::new(),
        }
    }

    /// The exporter (for the HTTP endpoint).
    pub fn exporter(&self) -> Arc<Exporter> {
        Arc::clone(&self.exporter)
    }

    /// The last scan as Prometheus text.
    pub fn render(&self) -> String {
        self.exporter.render()
    }

    /// One pass: discover, follow, export, reap.
    pub fn scan(&mut self) {
        let exporter = Arc::clone(&self.exporter);
        let traces = self.traces.clone();
        let hints = self.load_hints();
        let ctx = ExportContext {
            exporter: &exporter,
            hints: hints.as_ref(),
            traces: traces.as_deref(),
            now_ns: mpib_probes::now_ns(),
            connection_series: self.config.connection_series,
        };
        let listed = self.list();
        let gone: Vec<PathBuf> = self
            .tracked
            .keys()
            .filter(|p| listed.binary_search(p).is_err())
            .cloned()
            .collect();
        for path in gone {
            self.finish(&path, &ctx, Finish::Vanished);
        }
        self.finished.retain(|p, _| listed.binary_search(p).is_ok());
        self.refused.retain(|p, _| listed.binary_search(p).is_ok());
        for path in &listed {
            let known = self.tracked.contains_key(path)
                || self.finished.contains_key(path)
                || self.refused.contains_key(path);
            if !known {
                self.open(path);
            }
        }
        self.supersede(&ctx);
        let paths: Vec<PathBuf> = self.tracked.keys().cloned().collect();
        for path in paths {
            self.step(&path, &ctx);
        }
        self.reap_finished(ctx.now_ns);
        self.reap_refused();
        self.export_nics();
        self.export_health();
        exporter.finish_scan(ctx.now_ns);
    }

    fn list(&mut self) -> Vec<PathBuf> {
        let dir = &self.config.probes_dir;
        let (paths, note) = match files::list(dir) {
            Ok(paths) if paths.is_empty() => (paths, Some("empty".to_owned())),
            Ok(paths) => (paths, None),
            Err(e) if e.kind() == io::ErrorKind::NotFound => (Vec::new(), Some("missing".into())),
            Err(e) => (Vec::new(), Some(format!("cannot read: {e}"))),
        };
        self.files_found = paths.len();
        if note != self.dir_note {
            match note.as_deref() {
                Some("empty") => info!(
                    "no probes files in {}; exporting only the collector's own metrics",
                    dir.display()
                ),
                Some("missing") => info!(
                    "probes directory {} does not exist (yet); exporting only the collector's own metrics",
                    dir.display()
                ),
                Some(other) => warn!("probes directory {}: {other}", dir.display()),
                None => {}
            }
            self.dir_note = note;
        }
        paths
    }

    fn load_hints(&mut self) -> Option<HintTable> {
        let path = &self.config.hint_path;
        let (table, note) = match HintTable::load(path) {
            Ok(table) => (Some(table), None),
            Err(HintError::Missing) => (None, None),
            Err(HintError::Invalid(e)) => (None, Some(e)),
        };
        if note != self.hint_note {
            if let Some(e) = &note {
                warn!("ignoring hint file {}: {e}", path.display());
            }
            self.hint_note = note;
        }
        table
    }

    fn open(&mut self, path: &Path) {
        let Ok(identity) = Identity::of(path) else {
            return;
        };
        let shown = path.display();
        let (stat, file) = match trust::check_file(path, self.config.allowed_uids.as_ref()) {
            Ok(FileCheck::Passed(stat, file)) => (stat, file),
            Ok(FileCheck::Untrusted(stat, why)) => {
                return self.distrust(path, identity, &stat, &why)
            }
            Err(e) => return self.cannot_open(path, &e),
        };
        let (reason, detail) = match files::load(&file, path, "this collector") {
            Err(e) => return self.cannot_open(path, &e),
            Ok(Loaded::NotYet) => {
                debug!("probes file {shown} not published yet; retrying next scan");
                self.reap_unreadable(path, &identity, "never published");
                return;
            }
            Ok(Loaded::Ready(reader)) => return self.track(path, identity, &stat, reader),
            Ok(Loaded::Refused(reason, detail)) => (reason, detail),
        };
        warn!("refusing probes file {shown}: {detail}; skipped until the file changes");
        if let Some(index) = REASONS.iter().position(|r| *r == reason) {
            self.skipped[index] += 1;
        }
        self.refused.insert(path.to_path_buf(), identity);
    }

    /// A gone file is no error; another error is logged once.
    fn cannot_open(&mut self, path: &Path, e: &io::Error) {
        if e.kind() != io::ErrorKind::NotFound && self.quiet.insert(path.to_path_buf()) {
            warn!("cannot open probes file {}: {e}", path.display());
        }
    }

    /// Whether the operator listed `uid` in `--allowed-uids`.
    fn listed(&self, uid: u32) -> bool {
        self.config
            .allowed_uids
            .as_ref()
            .is_some_and(|uids| uids.contains(&uid))
    }

    /// Export a ready file from this scan on when its writer is trusted: the process it claims
    /// runs as the file's owner (or the owner is root). An untrusted file is refused; a file
    /// whose pid is not running is left for the next scan, or reaped as a dead writer's.
    fn track(&mut self, path: &Path, identity: Identity, stat: &Stat, reader: ProbesReader) {
        let info = reader.info();
        match trust::check_writer(path, stat, info.pid) {
            WriterCheck::Trusted if trust::still_same(path, &identity, stat) => {}
            WriterCheck::Trusted => return, // replaced meanwhile: look again next scan
            // An owner the operator listed is trusted without its process (below).
            WriterCheck::OtherUser(_) if self.listed(stat.uid) => {}
            WriterCheck::Untrusted(why) | WriterCheck::OtherUser(why) => {
                return self.distrust(path, identity, stat, &why)
            }
            WriterCheck::Dead if self.writer_state(&reader) != WriterState::Running => {
                let why = "writer pid is gone and its file is closed or stale";
                return self.reap(path, info.pid, why);
            }
            // An owner the operator listed is trusted without its process: what a collector
            // in its own PID namespace (no writer visible, or another process with the same
            // number) relies on.
            WriterCheck::Dead if self.listed(stat.uid) => {}
            WriterCheck::Dead => {
                if self.quiet.insert(path.to_path_buf()) {
                    info!(
                        "not exporting probes file {}: its writer pid {} is not running (or not \
                         visible here), so its owner cannot be checked against it; list the \
                         owner in --allowed-uids to trust it without its process",
                        path.display(),
                        info.pid
                    );
                }
                return;
            }
        }
        let nics: Vec<String> = info
            .rails
            .iter()
            .map(|r| format!("{}:{}", r.device, r.port))
            .collect();
        let devices: Vec<&str> = info.devices.iter().map(|d| d.name.as_str()).collect();
        info!(
            "exporting probes file {}: pid {} on {}, ABI {}, NICs [{}], devices [{}]",
            path.display(),
            info.pid,
            info.host,
            version_string(info.abi_version),
            nics.join(", "),
            devices.join(", ")
        );
        let process = Process::new(reader);
        let tracked = Tracked {
            process,
            identity,
            exported: false,
        };
        self.tracked.insert(path.to_path_buf(), tracked);
    }

    /// Refuse an untrusted file: one WARN, counted once, not reopened until it changes.
    fn distrust(&mut self, path: &Path, identity: Identity, stat: &Stat, why: &str) {
        warn!(
            "not exporting probes file {}: owner {}, mode {:04o}: {why}; skipped until the \
             file, its owner or its mode changes",
            path.display(),
            trust::user_label(stat.uid),
            stat.mode
        );
        self.skipped[UNTRUSTED] += 1;
        self.refused.insert(path.to_path_buf(), identity);
    }

    /// Keep only the newest file (largest `start_ns`) of each `host`/`pid`.
    fn supersede(&mut self, ctx: &ExportContext<'_>) {
        let mut newest: HashMap<(String, u32), u64> = HashMap::new();
        for t in self.tracked.values() {
            let info = t.process.info();
            let start = newest.entry((info.host.clone(), info.pid)).or_insert(0);
            *start = (*start).max(info.start_ns);
        }
        let old: Vec<PathBuf> = self
            .tracked
            .iter()
            .filter(|(_, t)| {
                let info = t.process.info();
                newest[&(info.host.clone(), info.pid)] != info.start_ns
            })
            .map(|(p, _)| p.clone())
            .collect();
        for path in old {
            info!(
                "probes file {} superseded by a newer file of the same pid (writer restart)",
                path.display()
            );
            self.finish(&path, ctx, Finish::Superseded);
        }
    }

    fn step(&mut self, path: &Path, ctx: &ExportContext<'_>) {
        let Some(t) = self.tracked.get(path) else {
            return;
        };
        let now = Identity::of(path).ok();
        let Some(now) = now.filter(|id| id.same_file(&t.identity)) else {
            self.finish(path, ctx, Finish::Vanished);
            return;
        };
        if now.len < t.identity.len {
            let how = format!("shrank from {} to {} bytes", t.identity.len, now.len);
            return self.drop_truncated(path, now, &how);
        }
        let snap = t.process.reader().snapshot();
        if t.process.reader().faulted() {
            // Truncated between the size check and the read: the guard gave zeros.
            return self.drop_truncated(path, now, "shrank while being read");
        }
        let stale_after = self.config.stale_after;
        match files::writer_state(t.process.reader(), ctx.now_ns, stale_after) {
            WriterState::Closed => self.finish(path, ctx, Finish::Closed),
            WriterState::Gone => self.finish(path, ctx, Finish::Dead),
            WriterState::Running => {
                if let Some(t) = self.tracked.get_mut(path) {
                    t.process.export(ctx, &snap);
                    self.declarations_refused += t.process.take_refused();
                    t.exported = true;
                }
            }
        }
    }

    /// The state of a file's writer now, by the collector's `--stale-after`.
    fn writer_state(&self, reader: &ProbesReader) -> WriterState {
        files::writer_state(reader, mpib_probes::now_ns(), self.config.stale_after)
    }

    /// Stop exporting a file another process truncated (its values are gone): counted as
    /// `truncated`, refused until it changes.
    fn drop_truncated(&mut self, path: &Path, now: Identity, how: &str) {
        warn!("probes file {} {how}; dropped", path.display());
        self.skipped[TRUNCATED] += 1;
        self.tracked.remove(path);
        self.refused.insert(path.to_path_buf(), now);
    }

    /// Stop exporting the file at `path`: one last export, whose values linger (`export`),
    /// then `how`.
    fn finish(&mut self, path: &Path, ctx: &ExportContext<'_>, how: Finish) {
        let Some(mut t) = self.tracked.remove(path) else {
            return;
        };
        let snap = t.process.reader().snapshot();
        // A file truncated meanwhile reads as zeros: no last export of those.
        if t.exported && !t.process.reader().faulted() {
            t.process.export(ctx, &snap);
            let info = t.process.info();
            let exporter = ctx.exporter;
            exporter.linger(&info.host, info.pid, info.start_ns);
        }
        let pid = t.process.info().pid;
        match how {
            Finish::Vanished => debug!("probes file {} is gone", path.display()),
            Finish::Closed | Finish::Superseded => {
                let superseded = matches!(how, Finish::Superseded);
                let reader = t.process.into_reader();
                let identity = t.identity;
                let finished = Finished {
                    reader,
                    identity,
                    superseded,
                };
                self.finished.insert(path.to_path_buf(), finished);
            }
            Finish::Dead => self.reap(path, pid, "writer pid is gone and its heartbeat is stale"),
        }
    }

    fn export_nics(&self) {
        let mut ports = BTreeSet::new();
        for t in self.tracked.values().filter(|t| t.exported) {
            for rail in &t.process.info().rails {
                ports.insert((rail.device.clone(), rail.port));
            }
        }
        for (device, port) in ports {
            let port_label = port.to_string();
            let counters = sysfs::read_port_counters(&self.config.sysfs_root, &device, port);
            for (name, value) in counters {
                let labels = [self.host.as_str(), &device, &port_label, &name];
                self.exporter
                    .counter(&catalog::NIC_COUNTER, &labels, value, self.boot_ns);
            }
        }
    }

    fn export_health(&self) {
        let (host, start) = ([self.host.as_str()], self.started_ns);
        let exporter = &self.exporter;
        let files = self.files_found as f64;
        exporter.gauge(&catalog::PROBES_FILES, &host, files, start);
        for (reason, count) in REASONS.iter().zip(self.skipped) {
            let labels = [self.host.as_str(), reason];
            exporter.counter(&catalog::PROBES_SKIPPED, &labels, count, start);
        }
        exporter.counter(&catalog::PROBES_REAPED, &host, self.reaped, start);
        let refused = self.declarations_refused;
        exporter.counter(&catalog::DECLARATIONS_REFUSED, &host, refused, start);
        let (ok, failed) = exporter.otlp_exports();
        for (result, count) in [("ok", ok), ("failed", failed)] {
            let labels = [self.host.as_str(), result];
            exporter.counter(&catalog::OTLP_METRIC_EXPORTS, &labels, count, start);
        }
    }
}
