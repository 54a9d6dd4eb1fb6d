//! The scan: find probes files, follow each writer through its life, export.
//!
//! Life of a file, as seen by one scan:
//!
//! | seen | action |
//! |---|---|
//! | new, `AwaitVersion` | retried next scan; reaped if its pid (from the name) is gone and it is older than `stale_after` |
//! | new, `Incompatible` / `Corrupt` | one log line, counted once by reason (`version`, `corrupt`, `truncated`), not reopened until the file changes; reaped like the above |
//! | new, `Ready` | exported from this scan on (after the old series of a restarted writer are gone) |
//! | shorter than when opened | dropped without touching the mapping, counted `truncated` |
//! | `closed_ns` set, or gone from the directory | exported one last time, then its series expire |
//! | a newer file of the same `host`/`pid` | superseded: a restart, exported one last time |
//! | pid gone and heartbeat older than `stale_after` | exported one last time, then reaped (unlinked, counted, logged) |
//! | new, untrusted (`trust`: a symlink, writable by group or others, an owner not allowed, a forgery) | one log line, counted once (`untrusted`), not reopened until the file, its owner or its mode changes; reaped like a refused file |
//! | new, `Ready`, its pid not running | not exported (its owner cannot be checked); retried next scan; reaped when closed or its heartbeat is older than `stale_after` |

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mpib_probes::{version_string, Corruption, LoadState, ProbesReader};
use tracing::{debug, info, warn};

use crate::catalog;
use crate::config::Config;
use crate::export::{has_process, Exporter, Histograms};
use crate::files::{self, Identity};
use crate::hint::{HintError, HintTable};
use crate::process::{ExportContext, Process};
use crate::sysfs;
use crate::traces::Traces;

mod reaping;
use crate::trust::{self, FileCheck, Stat, WriterCheck};

/// Refusal reasons, in `mpib_probes_skipped_total{reason}` order.
const REASONS: [&str; 4] = ["version", "corrupt", "truncated", "untrusted"];
const VERSION: usize = 0;
const CORRUPT: usize = 1;
const TRUNCATED: usize = 2;
const UNTRUSTED: usize = 3;

struct Tracked {
    process: Process,
    identity: Identity,
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
    idle_timeout: Duration,
    exporter: Arc<Exporter>,
    traces: Option<Arc<Traces>>,
    tracked: BTreeMap<PathBuf, Tracked>,
    finished: BTreeMap<PathBuf, Finished>,
    refused: BTreeMap<PathBuf, Identity>,
    retired: HashMap<(String, u32), Instant>,
    /// Histogram lines of writers that went away (since when), kept while the recorder still
    /// has their other series.
    fading: HashMap<(String, u32), (Instant, Vec<String>)>,
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
    /// A collector for `config`, sending traces to `traces` when set. Series of writers that
    /// went away expire after 3 scan intervals.
    pub fn new(config: Config, traces: Option<Arc<Traces>>) -> Collector {
        let idle_timeout = (config.interval * 3).max(Duration::from_millis(100));
        let exporter = Exporter::new(idle_timeout);
        if config.metrics_endpoint().is_some() {
            exporter.record_points();
        }
        Collector {
            host: host_name(),
            idle_timeout,
            exporter: Arc::new(exporter),
            traces,
            config,
            tracked: BTreeMap::new(),
            finished: BTreeMap::new(),
            refused: BTreeMap::new(),
            retired: HashMap::new(),
            fading: HashMap::new(),
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

    /// The full Prometheus text.
    pub fn render(&self) -> String {
        self.exporter.render()
    }

    /// One pass: discover, follow, export, reap.
    pub fn scan(&mut self) {
        let exporter = Arc::clone(&self.exporter);
        let _scan = exporter.scan_guard();
        let traces = self.traces.clone();
        let hints = self.load_hints();
        let ctx = ExportContext {
            exporter: &exporter,
            hints: hints.as_ref(),
            traces: traces.as_deref(),
            now_ns: mpib_probes::now_ns(),
            connection_series: self.config.connection_series,
        };
        let mut histograms = Vec::new();
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
            self.step(&path, &ctx, &mut histograms);
        }
        self.reap_finished(ctx.now_ns);
        self.reap_refused();
        self.export_nics();
        self.export_health();
        self.expire_fading();
        let fading = self
            .fading
            .iter()
            .map(|((host, pid), (_, lines))| (host.clone(), *pid, lines.clone()))
            .collect();
        exporter.set_histograms(Histograms {
            live: histograms,
            fading,
        });
        exporter.finish_points(ctx.now_ns);
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
        let reason = match ProbesReader::open_file(&file, path) {
            Err(e) => return self.cannot_open(path, &e),
            Ok(LoadState::AwaitVersion) => {
                debug!("probes file {shown} not published yet; retrying next scan");
                self.reap_unreadable(path, &identity, "never published");
                return;
            }
            Ok(LoadState::Ready(reader)) => return self.track(path, identity, &stat, reader),
            Ok(LoadState::Incompatible { found, expected }) => {
                warn!(
                    "refusing probes file {shown}: it has ABI version {}, this collector reads {} \
                     (the major must match); skipped until the file changes",
                    version_string(found),
                    version_string(expected)
                );
                VERSION
            }
            Ok(LoadState::Corrupt(c)) => {
                warn!("refusing probes file {shown}: {c}; skipped until the file changes");
                if matches!(c, Corruption::Truncated { .. }) {
                    TRUNCATED
                } else {
                    CORRUPT
                }
            }
        };
        self.skipped[reason] += 1;
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
            WriterCheck::Dead if trust::dead_file_is_stale(&reader, self.config.stale_after) => {
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

    fn step(&mut self, path: &Path, ctx: &ExportContext<'_>, histograms: &mut Vec<String>) {
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
        let heartbeat_age = Duration::from_nanos(ctx.now_ns.saturating_sub(snap.heartbeat_ns));
        if snap.closed_ns != 0 {
            self.finish(path, ctx, Finish::Closed);
        } else if !files::pid_alive(snap.pid) && heartbeat_age > self.config.stale_after {
            self.finish(path, ctx, Finish::Dead);
        } else if !self.held(path) {
            if let Some(t) = self.tracked.get_mut(path) {
                histograms.extend(t.process.export(ctx, &snap));
                self.declarations_refused += t.process.take_refused();
                t.exported = true;
                let info = t.process.info();
                self.fading.remove(&(info.host.clone(), info.pid));
            }
        }
    }

    /// Stop exporting a file another process truncated (its values are gone): counted as
    /// `truncated`, refused until it changes.
    fn drop_truncated(&mut self, path: &Path, now: Identity, how: &str) {
        warn!("probes file {} {how}; dropped", path.display());
        self.skipped[TRUNCATED] += 1;
        if let Some(t) = self.tracked.remove(path) {
            self.retire(&t);
        }
        self.refused.insert(path.to_path_buf(), now);
    }

    /// Whether a new writer must wait for the old series of its `host`/`pid` to expire
    /// (`Counter::absolute` never goes down).
    fn held(&mut self, path: &Path) -> bool {
        let Some(t) = self.tracked.get(path) else {
            return false;
        };
        let info = t.process.info();
        let key = (info.host.clone(), info.pid);
        let Some(since) = self.retired.get(&key) else {
            return false;
        };
        let waited = since.elapsed();
        let present = has_process(&self.exporter.recorder_text(), &key.0, key.1);
        if present && waited < self.idle_timeout * 10 {
            debug!(
                "pid {} restarted: waiting for its old series to expire",
                key.1
            );
            return true;
        }
        if present {
            warn!(
                "pid {}: old series still present after {waited:?}; exporting anyway",
                key.1
            );
        }
        self.retired.remove(&key);
        false
    }

    /// Drop the histogram lines of writers whose other series have expired.
    fn expire_fading(&mut self) {
        if self.fading.is_empty() {
            return;
        }
        let text = self.exporter.recorder_text();
        let limit = self.idle_timeout * 10;
        self.fading.retain(|(host, pid), (since, _)| {
            has_process(&text, host, *pid) && since.elapsed() < limit
        });
    }

    fn retire(&mut self, t: &Tracked) {
        if t.exported {
            let info = t.process.info();
            self.retired
                .insert((info.host.clone(), info.pid), Instant::now());
        }
    }

    /// Stop exporting the file at `path`: one last export (whose histogram lines stay in the
    /// scrape as long as the recorder keeps the other series), then `how`.
    fn finish(&mut self, path: &Path, ctx: &ExportContext<'_>, how: Finish) {
        let Some(mut t) = self.tracked.remove(path) else {
            return;
        };
        let snap = t.process.reader().snapshot();
        // A file truncated meanwhile reads as zeros: no last export of those.
        if t.exported && !t.process.reader().faulted() {
            let lines = t.process.export(ctx, &snap);
            let info = t.process.info();
            let until = Instant::now() + self.idle_timeout;
            self.fading
                .insert((info.host.clone(), info.pid), (until, lines));
        }
        self.retire(&t);
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
