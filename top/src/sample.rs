//! Sampling: each probes file's snapshot against the previous one gives the rates of a
//! [`Frame`]. The fixed columns read the values this version knows by their declarations
//! (`mpib_probes::declared`); every value a file declares, known or not, is listed too, so a
//! value a later plugin adds shows up in `values` with no change here.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::Duration;

use mpib_node::hint::HintTable;
use mpib_probes::declared::{
    RAIL_ERROR_COMPLETIONS, RAIL_RX_BYTES, RAIL_TX_BYTES, SRQ_DEPTH, SRQ_HIGH_WATER, SRQ_LOW_WATER,
};
use mpib_probes::{
    Declared, EventCursor, EventKind, FileInfo, ProbesReader, Scope, Snapshot, ValueKind,
};

use crate::config::Sources;
use crate::frame::{self, Frame, Process, SlowTransfer, Value};
use crate::scan::Scanner;
use crate::{agent, describe, nic};

/// Slow transfers older than this leave the view.
pub const SLOW_WINDOW: Duration = Duration::from_secs(60);
/// Slow transfers shown.
pub const SLOW_SHOWN: usize = 10;
/// Slow transfers kept per process within the window (the event ring holds 1,024).
const SLOW_KEPT: usize = 4096;

/// What one file's last sample left for the next.
struct Previous {
    /// The file it was: device, inode and writer start (a file replaced at the same path
    /// starts afresh).
    file: (u64, u64, u64),
    at_ns: u64,
    snapshot: Option<Snapshot>,
    /// Per NIC slot: the NIC's retransmission total, when it has the counters.
    retransmissions: Vec<Option<u64>>,
    cursor: EventCursor,
    slow: Vec<SlowTransfer>,
}

/// Samples a node's probes files, agent and NICs.
pub struct Sampler {
    sources: Sources,
    scanner: Scanner,
    agent: agent::Asker,
    previous: BTreeMap<PathBuf, Previous>,
    users: HashMap<u32, String>,
    last_ns: Option<u64>,
}

impl Sampler {
    /// A sampler of `sources`.
    pub fn new(sources: Sources) -> Sampler {
        Sampler {
            scanner: Scanner::new(sources.probes_dir.clone(), sources.allowed_uids.clone()),
            agent: agent::Asker::new(sources.agent_control.clone()),
            sources,
            previous: BTreeMap::new(),
            users: HashMap::new(),
            last_ns: None,
        }
    }

    /// One sample: rates since the previous call.
    pub fn sample(&mut self) -> Frame {
        let started = mpib_probes::now_ns();
        let listing = self.scanner.scan();
        let hints = HintTable::load(&self.sources.hint_path).ok();
        let mut frame = Frame {
            time_ns: started,
            interval_seconds: self
                .last_ns
                .map_or(0.0, |last| started.saturating_sub(last) as f64 / 1e9),
            probes_dir: self.sources.probes_dir.display().to_string(),
            probes_dir_error: listing.error,
            skipped: listing.skipped,
            ..Frame::default()
        };
        self.last_ns = Some(started);
        let mut seen = Vec::new();
        for path in listing.shown {
            if let Some(process) = self.sample_file(&path, hints.as_ref(), &mut frame) {
                frame.processes.push(process);
                seen.push(path);
            }
        }
        self.previous.retain(|path, _| seen.contains(path));
        // Asked last: however long the agent takes, it is outside every file's interval.
        frame.agent = self.agent.flows();
        frame.processes.sort_by_key(|p| p.pid);
        frame
            .slowest
            .sort_by(|a, b| b.total_us.total_cmp(&a.total_us).then(a.pid.cmp(&b.pid)));
        frame.slowest.truncate(SLOW_SHOWN);
        frame
    }

    /// One file's process; `None` when it shrank while read (listed in `frame.skipped`).
    fn sample_file(
        &mut self,
        path: &PathBuf,
        hints: Option<&HintTable>,
        frame: &mut Frame,
    ) -> Option<Process> {
        let mapped = self.scanner.mapped.get(path)?;
        // The time of the snapshot itself: what the next sample's rates divide by.
        let at = mpib_probes::now_ns();
        let snapshot = mapped.reader.snapshot();
        if mapped.reader.faulted() {
            let skipped = self.scanner.drop_faulted(path);
            frame.skipped.push(skipped);
            return None;
        }
        let info = mapped.reader.info();
        let file = (mapped.identity.dev, mapped.identity.ino, info.start_ns);
        let retransmissions = nic::retransmissions(&self.sources.sysfs_root, info);
        let uid = mapped.uid;
        let user = self
            .users
            .entry(uid)
            .or_insert_with(|| mpib_node::trust::user_name(uid).unwrap_or_else(|| uid.to_string()));
        let fresh = || Previous {
            file,
            at_ns: 0,
            snapshot: None,
            retransmissions: Vec::new(),
            cursor: EventCursor::new(),
            slow: Vec::new(),
        };
        let mut previous = match self.previous.remove(path) {
            Some(p) if p.file == file => p,
            _ => fresh(),
        };
        let rates = Rates {
            seconds: (previous.at_ns != 0).then(|| at.saturating_sub(previous.at_ns) as f64 / 1e9),
            before: previous.snapshot.as_ref(),
            retransmissions_before: &previous.retransmissions,
            retransmissions_now: &retransmissions,
        };
        let process = describe::process(&mapped.reader, &snapshot, &rates, user, hints, at);
        collect_slow(&mapped.reader, &mut previous, at);
        let mut slowest: Vec<&SlowTransfer> = previous.slow.iter().collect();
        slowest.sort_by(|a, b| b.total_us.total_cmp(&a.total_us));
        frame
            .slowest
            .extend(slowest.into_iter().take(SLOW_SHOWN).cloned());
        self.previous.insert(
            path.clone(),
            Previous {
                at_ns: at,
                snapshot: Some(snapshot),
                retransmissions,
                ..previous
            },
        );
        Some(process)
    }
}

/// The previous snapshot and the time between, for rates.
pub struct Rates<'a> {
    /// Seconds since the previous sample; `None` on the first.
    pub seconds: Option<f64>,
    /// The previous snapshot (`None` on the first).
    pub before: Option<&'a Snapshot>,
    /// The NICs' retransmission totals then.
    pub retransmissions_before: &'a [Option<u64>],
    /// And now.
    pub retransmissions_now: &'a [Option<u64>],
}

impl Rates<'_> {
    /// `(now - before) / seconds`; a counter that went back (a restarted writer) counts from 0.
    pub fn per_second(&self, now: u64, before: u64) -> Option<f64> {
        self.before?;
        let seconds = self.seconds.filter(|s| *s > 0.0)?;
        let delta = if now >= before { now - before } else { now };
        Some(delta as f64 / seconds)
    }
}

/// The value of `d` in `snapshot` for NIC slot `nic` (rail scope) or the process.
pub fn declared_value(snapshot: &Snapshot, d: &Declared, nic: Option<usize>) -> u64 {
    let slot = usize::from(d.slot);
    match (d.scope, nic) {
        (Scope::Rail, Some(i)) => snapshot
            .rails
            .get(i)
            .and_then(|r| r.values.get(slot))
            .copied()
            .unwrap_or(0),
        (Scope::Process, _) => snapshot.process.get(slot).copied().unwrap_or(0),
        (Scope::Rail, None) => 0,
    }
}

/// Every declared value of `scope` as a [`Value`].
pub fn values(
    reader: &ProbesReader,
    snapshot: &Snapshot,
    rates: &Rates<'_>,
    nic: Option<usize>,
) -> Vec<Value> {
    let scope = if nic.is_some() {
        Scope::Rail
    } else {
        Scope::Process
    };
    reader
        .declarations()
        .iter()
        .filter(|d| d.scope == scope)
        .map(|d| {
            let value = declared_value(snapshot, d, nic);
            let counter = d.kind == ValueKind::Counter;
            Value {
                name: d.name.clone(),
                kind: if counter { "counter" } else { "gauge" },
                value,
                per_second: rates
                    .before
                    .filter(|_| counter)
                    .and_then(|before| rates.per_second(value, declared_value(before, d, nic))),
            }
        })
        .collect()
}

/// The values the fixed columns show, for NIC slot `nic`: sent, received, SRQ depth, low and
/// high water, error completions.
pub fn rail_words(snapshot: &Snapshot, nic: usize) -> [u64; 6] {
    let Some(r) = snapshot.rails.get(nic) else {
        return [0; 6];
    };
    [
        r.counter(RAIL_TX_BYTES),
        r.counter(RAIL_RX_BYTES),
        r.gauge(SRQ_DEPTH),
        r.gauge(SRQ_LOW_WATER),
        r.gauge(SRQ_HIGH_WATER),
        r.counter(RAIL_ERROR_COMPLETIONS),
    ]
}

/// Drains the file's new slow transfers into the window, and drops those older than it.
fn collect_slow(reader: &ProbesReader, previous: &mut Previous, now: u64) {
    let info: &FileInfo = reader.info();
    let drained = reader.drain_events(&mut previous.cursor);
    for record in drained.records {
        let t = record.transfer;
        if t.kind != EventKind::SLOW {
            continue; // 1-in-N samples are not slow transfers
        }
        // Rails of the mask that were posted on, as the collector's traces take them.
        let Some((start, end)) = mpib_node::transfers::extent(&t) else {
            continue;
        };
        let rails = mpib_node::transfers::active_rails(&t);
        let mut rail_us = [None; 2];
        for &r in &rails {
            rail_us[r] = Some(t.done_ns[r].saturating_sub(t.post_ns[r]) as f64 / 1e3);
        }
        previous.slow.push(SlowTransfer {
            pid: info.pid,
            peer: t.peer.to_string(),
            direction: describe::direction(t.direction),
            bytes: t.size,
            total_us: end.saturating_sub(start) as f64 / 1e3,
            rail_us,
            rail_bytes: t.rail_bytes,
            sup_bw: t.sup_bw,
            done_ns: end,
            operation: crate::frame::Operation::of(&t.operation),
        });
    }
    let oldest = now.saturating_sub(SLOW_WINDOW.as_nanos() as u64);
    previous.slow.retain(|s| s.done_ns >= oldest);
    // Everything of the window is kept (up to a bound): the ten shown are the slowest of the
    // whole minute, whichever age out first.
    if previous.slow.len() > SLOW_KEPT {
        previous
            .slow
            .sort_by(|a, b| b.total_us.total_cmp(&a.total_us));
        previous.slow.truncate(SLOW_KEPT);
    }
}

/// `sup * 1024 / (sout + sup)` of two byte counts.
pub fn split_of(bytes: [f64; 2]) -> Option<u32> {
    frame::split(bytes[0], bytes[1])
}
