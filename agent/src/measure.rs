//! What the agent measures each interval: the plugins' probes files (per connection and rail,
//! completed bytes and busy time) summed per flow, and the NICs' retransmission counters.
//!
//! A flow's sample is the increase, since the previous interval, of the counters of every
//! advanced-mode send connection whose `hint_slot` is the flow's slot, in every live probes file
//! in the directory: all the processes on the host that share the rails (8 ranks on a node, or
//! 8 communicators in one process) are seen together.
//!
//! Trust: a probes file counts for a flow only when its owner is the user of one of the flow's
//! registered connections (from the socket's peer credentials), or the agent's own user or root:
//! another local user cannot steer a flow by writing a file that names its slot. A connection
//! first seen after it opened (an agent restart, a file found late) gives a baseline, not one
//! interval's worth of its whole history. A file is mapped only after the checks every node-side
//! tool makes (`mpib_node::trust`): a regular file, opened without following a link and without
//! blocking (a FIFO cannot stall the loop), that neither its group nor others may write (else
//! anyone in them could rewrite a trusted owner's numbers), whose name and header claim the same
//! pid. A refused file (untrusted, corrupt, of another major version) is left alone until it
//! changes, with a WARN at most once per [`REFUSAL_LOG_EVERY`]; while any is that a job may still
//! write, which slots are in use is not known, as with a file the agent may not read. The writer's process need not be
//! the file's owner's: the owner is what the slot check above trusts. A file counts while its
//! writer runs, by the rule the collector uses (`mpib_node::files::writer_state`). A file
//! truncated while mapped reads as zeros, not `SIGBUS` (the reader's mapping is guarded,
//! docs/SECURITY.md "Shared files"); it is dropped at the next refresh, as is one another file
//! was renamed over (the new one is then looked at afresh).
//!
//! Busy time: a rail is busy for a flow while any of the flow's connections has a part in flight
//! on it, in any process. Summing the connections' own busy times counts an instant once per
//! connection busy in it, and the count differs between the rails (the bottleneck rail's parts
//! overlap across every connection, the other's less), which biased the split (4 sender
//! processes on one flow reached 0.758 of the best fixed split on the bed, docs/PERFORMANCE.md).
//! The files hold totals only, which cannot tell overlapping busy times from consecutive ones, so
//! between measurements the daemon samples every connection's parts in flight (2.2 files on,
//! [`Measurer::sample`]) and a flow's busy time is the interval times the fraction of samples in
//! which any of its connections had a part on the rail. A flow with a connection in an older file
//! (or with no samples) keeps the sum.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use mpib_node::files::{self, Identity, Loaded, WriterState};
use mpib_node::trust::{self, FileCheck, Stat, WriterCheck};
use mpib_probes::{ConnectionState, Direction, InFlightSample, Mode, ProbesReader};

use crate::policy::{Sample, SOUT, SUP};

pub use mpib_node::sysfs::RETRANSMISSION_COUNTERS;

/// How often the daemon samples the connections' parts in flight between measurements: 2,000
/// samples a second put a flow's busy fraction within about 1 % (binomial, p = 0.5, over a
/// 100 ms interval's 200 samples: 3.5 %, averaged further by the policy's estimate).
pub const SAMPLE_EVERY: std::time::Duration = std::time::Duration::from_micros(500);

/// Whether a file of `owner` counts for `slot`: the agent's own user, root, or a user of one of
/// the slot's registered connections.
fn trusted(own_uid: u32, owner: u32, slot: u32, users: &BTreeMap<u32, BTreeSet<u32>>) -> bool {
    owner == own_uid || owner == 0 || users.get(&slot).is_some_and(|u| u.contains(&owner))
}

/// The NICs a connection of fused device `device` uses, by rail: the device's NIC slots from
/// the file's header (probes 3.0).
fn connection_nics(
    info: &mpib_probes::FileInfo,
    device: u8,
) -> impl Iterator<Item = (usize, &mpib_probes::RailInfo)> {
    let nics = info.devices.get(usize::from(device)).map(|d| d.nics);
    [SOUT, SUP]
        .into_iter()
        .filter_map(move |rail| Some((rail, info.rails.get(nics?[rail])?)))
}

/// Each flow's link rate per rail: its NIC's speed, shared evenly among the flows with live
/// connections on that NIC. A SUP NIC that two fused devices share is one capacity: two flows
/// each counting its whole speed would both put the `capacity` share on it and oversubscribe it
/// (docs/AGENT.md, "Shared NICs"). Flows on the same two NICs divide both alike, so their share
/// is unchanged.
fn share_link_rates(
    flows: &mut BTreeMap<u32, FlowMeasurement>,
    devices: &BTreeMap<u32, BTreeSet<(usize, String, u32)>>,
    speeds: &BTreeMap<(String, u32), f64>,
) {
    let mut sharers: BTreeMap<(&str, u32), u32> = BTreeMap::new();
    for (slot, nics) in devices {
        if flows.get(slot).is_some_and(|f| f.connections > 0) {
            let distinct: BTreeSet<(&str, u32)> = nics
                .iter()
                .map(|(_, nic, port)| (nic.as_str(), *port))
                .collect();
            for nic in distinct {
                *sharers.entry(nic).or_default() += 1;
            }
        }
    }
    for (slot, nics) in devices {
        let Some(flow) = flows.get_mut(slot) else {
            continue;
        };
        for (rail, nic, port) in nics {
            let speed = speeds.get(&(nic.clone(), *port)).copied().unwrap_or(0.0);
            let count = sharers
                .get(&(nic.as_str(), *port))
                .copied()
                .unwrap_or(1)
                .max(1);
            let rate = speed / f64::from(count);
            if rate >= flow.sample.link_rate[*rail] {
                flow.sample.link_rate[*rail] = rate;
                flow.sharers[*rail] = count;
            }
        }
    }
}

/// Refused probes files are logged at most this often (with the count of those not logged):
/// a local user who rewrites a refused file every interval must not flood the log.
pub const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(10);

/// One connection's counters at the last read.
#[derive(Clone, Copy, Debug, Default)]
struct Counters {
    done: [u64; 2],
    busy: [u64; 2],
    /// The tick it was last seen at.
    seen: u64,
}

/// Ticks a connection's last counters are kept while it is not seen (a missed read must not
/// make its next reading count its history again).
const FORGET_AFTER_TICKS: u64 = 50;

/// One flow's measurement over the interval.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FlowMeasurement {
    /// The policy's input.
    pub sample: Sample,
    /// Send connections seen for the flow.
    pub connections: usize,
    /// Intra-island connections among them.
    pub intra_island: usize,
    /// Per rail, the flows with live connections on this flow's NIC (itself included; 0 when
    /// unknown): its link rate is the NIC's speed divided by it, and so must a configured rate
    /// be (`[rates]`, state.rs).
    pub sharers: [u32; 2],
    /// Per rail, the flow's open send connections that failed that rail over and run on the
    /// other alone (docs/PROTOCOL.md section 10): the flow is degraded while any does.
    pub failed_over: [usize; 2],
}

/// The reader of probes files and NIC counters, keeping the previous values.
pub struct Measurer {
    dir: PathBuf,
    sysfs: PathBuf,
    /// Open files, their owners, and what the file at the path was when mapped.
    readers: BTreeMap<PathBuf, (ProbesReader, u32, Identity)>,
    /// Files not read (untrusted, corrupt, another version) until they change.
    refused: BTreeMap<PathBuf, Identity>,
    /// When a refusal was last logged, and the refusals not logged since.
    refusals_logged: Option<Instant>,
    refusals_unlogged: u64,
    previous: BTreeMap<(PathBuf, u32, u32), Counters>,
    /// Every device seen so far and its counters' last total.
    nic_previous: BTreeMap<(String, u32), u64>,
    tick: u64,
    last_ns: u64,
    own_uid: u32,
    /// Live probes files on the last read.
    pub files: usize,
    /// Probes files the last refresh could not read: no permission, refused (untrusted,
    /// corrupt, another major version) or not mappable. While any, which slots are in use is
    /// not known (recovered slots are then kept, never reclaimed).
    pub unreadable: usize,
    /// Samples taken since the last measurement, and per flow slot the samples in which each
    /// rail had one of the flow's parts in flight.
    samples: u64,
    busy_samples: BTreeMap<u32, [u64; 2]>,
    /// The last measurement's users per slot (the sampler's trust check).
    users: BTreeMap<u32, BTreeSet<u32>>,
    /// One sample's flows, kept to reuse its allocation.
    sampled: Vec<(u32, [bool; 2])>,
}

impl Measurer {
    /// A measurer of `dir`'s probes files and the NIC counters under the sysfs root `sysfs`
    /// (`/sys`).
    pub fn new(dir: &Path, sysfs: &Path) -> Measurer {
        Measurer {
            dir: dir.to_path_buf(),
            sysfs: sysfs.to_path_buf(),
            readers: BTreeMap::new(),
            refused: BTreeMap::new(),
            refusals_logged: None,
            refusals_unlogged: 0,
            previous: BTreeMap::new(),
            nic_previous: BTreeMap::new(),
            tick: 0,
            last_ns: 0,
            // SAFETY: geteuid has no preconditions.
            own_uid: unsafe { libc::geteuid() },
            files: 0,
            unreadable: 0,
            samples: 0,
            busy_samples: BTreeMap::new(),
            users: BTreeMap::new(),
            sampled: Vec::new(),
        }
    }

    /// Takes one sample of every trusted advanced send connection's parts in flight (see the
    /// module's doc): the daemon calls it about every [`SAMPLE_EVERY`] between measurements.
    pub fn sample(&mut self) {
        self.samples += 1;
        self.sampled.clear();
        for (reader, owner, _) in self.readers.values() {
            if !reader.publishes_in_flight() {
                continue;
            }
            let (own_uid, users, sampled) = (self.own_uid, &self.users, &mut self.sampled);
            reader.sample_in_flight(|connection: InFlightSample| {
                let slot = connection.hint_slot;
                if connection.direction == Direction::Send
                    && connection.mode == Mode::Advanced
                    && slot != u32::MAX
                    && trusted(own_uid, *owner, slot, users)
                {
                    sampled.push((slot, connection.busy));
                }
            });
        }
        // A flow's rail may be busy in several of its connections at once: count the sample
        // once per flow.
        self.sampled.sort_unstable_by_key(|(slot, _)| *slot);
        for flow in self.sampled.chunk_by(|a, b| a.0 == b.0) {
            let counts = self.busy_samples.entry(flow[0].0).or_default();
            for rail in [SOUT, SUP] {
                counts[rail] += u64::from(flow.iter().any(|(_, busy)| busy[rail]));
            }
        }
    }

    /// Reads everything once; `interval_ns` is the time since the previous call, `users` the
    /// users of each slot's registered connections. Returns each flow's measurement by slot,
    /// and every slot a live connection reads.
    pub fn measure(
        &mut self,
        interval_ns: u64,
        users: &BTreeMap<u32, BTreeSet<u32>>,
    ) -> (BTreeMap<u32, FlowMeasurement>, BTreeSet<u32>) {
        self.refresh_files();
        self.tick += 1;
        let previous_ns = std::mem::replace(&mut self.last_ns, mpib_probes::now_ns());
        let mut flows: BTreeMap<u32, FlowMeasurement> = BTreeMap::new();
        let mut in_use = BTreeSet::new();
        let mut devices: BTreeMap<u32, BTreeSet<(usize, String, u32)>> = BTreeMap::new();
        let mut speeds: BTreeMap<(String, u32), f64> = BTreeMap::new();
        let mut readings = Vec::new();
        // Flows with a connection whose file publishes no parts in flight: busy time summed.
        let mut summed = BTreeSet::new();
        for (path, (reader, owner, _)) in &self.readers {
            let info = reader.info();
            for conn in reader.snapshot().connections {
                let slot = conn.info.hint_slot;
                if conn.info.mode != Mode::Advanced || slot == u32::MAX {
                    continue;
                }
                if conn.state == ConnectionState::Active {
                    in_use.insert(slot);
                }
                if conn.info.direction != Direction::Send
                    || !trusted(self.own_uid, *owner, slot, users)
                {
                    continue;
                }
                if !reader.publishes_in_flight() {
                    summed.insert(slot);
                }
                let flow = flows.entry(slot).or_default();
                flow.sample.interval_ns = interval_ns;
                for (rail, desc) in connection_nics(info, conn.info.device) {
                    let rate = f64::from(desc.speed_mbps) * 1e6 / 8.0;
                    let nic = (desc.device.clone(), desc.port);
                    let speed = speeds.entry(nic).or_default();
                    *speed = speed.max(rate);
                    let device = (rail, desc.device.clone(), desc.port);
                    devices.entry(slot).or_default().insert(device);
                }
                if conn.state == ConnectionState::Active {
                    flow.connections += 1;
                    for rail in [SOUT, SUP] {
                        if conn.rails_down & (1 << rail) != 0 {
                            flow.failed_over[rail] += 1;
                        }
                    }
                    if conn.info.path_class == mpib_probes::PathClass::IntraIsland {
                        flow.intra_island += 1;
                    }
                }
                readings.push(((path.clone(), conn.index, conn.generation), conn));
            }
        }
        for (key, conn) in readings {
            let slot = conn.info.hint_slot;
            let (done, busy) = self.increase(key, &conn, previous_ns);
            if let Some(flow) = flows.get_mut(&slot) {
                for rail in [SOUT, SUP] {
                    let sample = &mut flow.sample;
                    sample.done_bytes[rail] = sample.done_bytes[rail].saturating_add(done[rail]);
                    sample.busy_ns[rail] = sample.busy_ns[rail].saturating_add(busy[rail]);
                }
            }
        }
        share_link_rates(&mut flows, &devices, &speeds);
        self.take_samples(&mut flows, &summed, interval_ns);
        self.users.clone_from(users);
        let tick = self.tick;
        self.previous
            .retain(|_, counters| tick - counters.seen <= FORGET_AFTER_TICKS);
        self.add_retransmissions(&mut flows, &devices);
        (flows, in_use)
    }

    /// Replaces each flow's summed busy time with its sampled union (module doc), and starts the
    /// next interval's samples.
    fn take_samples(
        &mut self,
        flows: &mut BTreeMap<u32, FlowMeasurement>,
        summed: &BTreeSet<u32>,
        interval_ns: u64,
    ) {
        let samples = std::mem::take(&mut self.samples);
        if samples > 0 {
            for (slot, flow) in flows.iter_mut().filter(|(slot, _)| !summed.contains(slot)) {
                let counts = self.busy_samples.get(slot).copied().unwrap_or_default();
                for rail in [SOUT, SUP] {
                    let busy =
                        u128::from(interval_ns) * u128::from(counts[rail]) / u128::from(samples);
                    flow.sample.busy_ns[rail] = busy as u64;
                }
            }
        }
        self.busy_samples.clear();
    }

    /// A connection's (completed bytes, busy ns) per rail since its previous reading. First seen
    /// but opened before the previous read (an agent restart, a file found late): a baseline,
    /// since its history is no interval's.
    fn increase(
        &mut self,
        key: (PathBuf, u32, u32),
        conn: &mpib_probes::ConnectionSnapshot,
        previous_ns: u64,
    ) -> ([u64; 2], [u64; 2]) {
        let now = Counters {
            done: conn.rail_done_bytes,
            busy: conn.rail_busy_ns,
            seen: self.tick,
        };
        let before = match self.previous.get(&key) {
            Some(before) => *before,
            None if previous_ns == 0 || conn.opened_ns < previous_ns => now,
            None => Counters::default(),
        };
        self.previous.insert(key, now);
        (
            core::array::from_fn(|r| now.done[r].saturating_sub(before.done[r])),
            core::array::from_fn(|r| now.busy[r].saturating_sub(before.busy[r])),
        )
    }

    fn refresh_files(&mut self) {
        // The probes directory's files, listed by the rule the collector and mpib-top use. A
        // directory that cannot be read now (EMFILE, say) keeps the last refresh's files.
        let listed: BTreeSet<PathBuf> = match files::list(&self.dir) {
            Ok(paths) => paths.into_iter().collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeSet::new(),
            Err(_) => return,
        };
        let now = mpib_probes::now_ns();
        self.readers.retain(|path, (reader, _, mapped)| {
            // Still the file mapped, not shorter, not truncated under the mapping, still written.
            let same =
                Identity::of(path).is_ok_and(|id| id.same_file(mapped) && id.len >= mapped.len);
            listed.contains(path) && same && !reader.faulted() && running(reader, now)
        });
        self.refused.retain(|path, identity| {
            listed.contains(path) && Identity::of(path).is_ok_and(|id| id.unchanged(identity))
        });
        let mut unreadable = 0;
        for path in listed {
            if self.readers.contains_key(&path) || self.refused.contains_key(&path) {
                continue;
            }
            match open(&path, now) {
                Opened::Running(reader, owner, identity) => {
                    self.readers.insert(path, (*reader, owner, identity));
                }
                Opened::Unreadable => unreadable += 1,
                Opened::Refused(identity, why) => {
                    self.log_refusal(&path, &why);
                    self.refused.insert(path, identity);
                }
                Opened::NotNow => {}
            }
        }
        self.files = self.readers.len();
        // A refused file counts while a job may still write it: a leftover of a dead job must
        // not keep every recovered slot forever.
        let refused = self
            .refused
            .keys()
            .filter(|path| may_be_written(path))
            .count();
        self.unreadable = unreadable + refused;
    }

    /// One WARN per [`REFUSAL_LOG_EVERY`] at most; the owner as a uid (no user lookup here:
    /// NSS may be slow, and this is the measuring loop).
    fn log_refusal(&mut self, path: &Path, why: &str) {
        if self
            .refusals_logged
            .is_some_and(|at| at.elapsed() < REFUSAL_LOG_EVERY)
        {
            self.refusals_unlogged += 1;
            return;
        }
        let unlogged = std::mem::take(&mut self.refusals_unlogged);
        let more = match unlogged {
            0 => String::new(),
            n => format!(" ({n} more refused since the last such line)"),
        };
        crate::log::warn(&format!(
            "not reading probes file {}: {why}; skipped until it changes{more}",
            path.display()
        ));
        self.refusals_logged = Some(Instant::now());
    }

    /// Adds, per flow, the increase of the retransmission counters of the devices its rails use.
    fn add_retransmissions(
        &mut self,
        flows: &mut BTreeMap<u32, FlowMeasurement>,
        devices: &BTreeMap<u32, BTreeSet<(usize, String, u32)>>,
    ) {
        let mut increase: BTreeMap<(String, u32), u64> = BTreeMap::new();
        let mut all: BTreeSet<(String, u32)> = devices
            .values()
            .flatten()
            .map(|(_, d, p)| (d.clone(), *p))
            .collect();
        // Every device ever seen is read every tick, so a quiet period's increase is not charged
        // to the next busy interval.
        all.extend(self.nic_previous.keys().cloned());
        for (device, port) in all {
            let Some(total) = self.nic_total(&device, port) else {
                continue;
            };
            let key = (device, port);
            let before = self.nic_previous.insert(key.clone(), total);
            increase.insert(key, before.map_or(0, |b| total.saturating_sub(b)));
        }
        for (slot, rails) in devices {
            if let Some(flow) = flows.get_mut(slot) {
                for (rail, device, port) in rails {
                    let key = (device.clone(), *port);
                    let more = increase.get(&key).copied().unwrap_or(0);
                    let total = &mut flow.sample.retransmissions[*rail];
                    *total = total.saturating_add(more);
                }
            }
        }
    }

    fn nic_total(&self, device: &str, port: u32) -> Option<u64> {
        mpib_node::sysfs::retransmissions(&self.sysfs, device, port)
    }
}

/// A probes file still written: not closed, and its writer's pid running here or its heartbeat
/// recent (a job in another pid namespace), by the collector's rule and default.
fn running(reader: &ProbesReader, now_ns: u64) -> bool {
    files::writer_state(reader, now_ns, files::STALE_AFTER) == WriterState::Running
}

/// Whether a job may still write the file at `path`: the pid its name gives runs here, or it
/// changed within [`files::STALE_AFTER`] (a writer in another PID namespace).
fn may_be_written(path: &Path) -> bool {
    let named_pid_runs = files::parse_name(path).is_some_and(|(pid, _)| pid_alive(pid));
    named_pid_runs || Identity::of(path).is_ok_and(|id| id.age() < files::STALE_AFTER)
}

/// What looking at one listed file found.
enum Opened {
    /// Mapped: its owner and what the file was.
    Running(Box<ProbesReader>, u32, Identity),
    /// Files are 0600 (0640 with MPIB_PROBES_GROUP): an agent that may not read one cannot tell
    /// which slots its connections read.
    Unreadable,
    /// Not to be read until it changes, and why.
    Refused(Identity, String),
    /// Gone, not published yet, replaced meanwhile, or its writer no longer runs: looked at
    /// again next time.
    NotNow,
}

/// Opens and checks the file at `path` as the collector does before mapping it (see the
/// module's doc for the one difference: the writer's user).
fn open(path: &Path, now_ns: u64) -> Opened {
    let Ok(identity) = Identity::of(path) else {
        return Opened::NotNow;
    };
    let owned = |stat: &Stat, why: &str| {
        let why = format!("owner uid {}, mode {:04o}: {why}", stat.uid, stat.mode);
        Opened::Refused(identity, why)
    };
    let (stat, file) = match trust::check_file(path, None) {
        Ok(FileCheck::Passed(stat, file)) => (stat, file),
        Ok(FileCheck::Untrusted(stat, why)) => return owned(&stat, &why),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => return Opened::Unreadable,
        Err(_) => return Opened::NotNow,
    };
    let reader = match files::load(&file, path, "this agent") {
        Ok(Loaded::Ready(reader)) => reader,
        Ok(Loaded::Refused(_, why)) => return Opened::Refused(identity, why),
        Ok(Loaded::NotYet) => return Opened::NotNow,
        // Not mappable now (the guard's table full, say): its slots are not known.
        Err(_) => return Opened::Unreadable,
    };
    match trust::check_writer(path, &stat, reader.info().pid) {
        WriterCheck::Untrusted(why) => return owned(&stat, &why),
        WriterCheck::Trusted | WriterCheck::Dead | WriterCheck::OtherUser(_) => {}
    }
    if !running(&reader, now_ns) || !trust::still_same(path, &identity, &stat) {
        return Opened::NotNow;
    }
    Opened::Running(Box::new(reader), stat.uid, identity)
}

pub use mpib_node::files::pid_alive;

/// A process's start time in clock ticks since boot (`/proc/PID/stat` field 22), 0 if unknown.
pub fn start_ticks(pid: u32) -> u64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0;
    };
    // The command name (field 2) may hold spaces and parentheses: count from the last ')'.
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(19))
        .and_then(|field| field.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
#[path = "measure_tests.rs"]
mod tests;
