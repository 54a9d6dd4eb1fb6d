//! What the agent measures each interval: the plugins' probes files (per connection and rail,
//! completed bytes and busy time) summed per flow, and the NICs' retransmission counters.
//!
//! A flow's sample is the increase, since the previous interval, of the counters of every
//! advanced-mode send connection whose `hint_slot` is the flow's slot, in every live probes file
//! in the directory: all the processes on the host that share the rails (8 ranks on a node, or
//! 8 communicators in one process) are seen together.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use mpib_probes::{ConnectionState, Direction, LoadState, Mode, ProbesReader};

use crate::policy::{Sample, SOUT, SUP};

/// NIC counters (sysfs `hw_counters`) that count retransmissions or their causes, summed. rxe,
/// mlx5 and others name them differently; the ones a device lacks are skipped.
pub const RETRANSMISSION_COUNTERS: &[&str] = &[
    "completer_retry_err",
    "retry_exceeded_err",
    "local_ack_timeout_err",
    "packet_seq_err",
    "out_of_sequence",
    "rnr_nak_retry_err",
];

/// One connection's counters at the last read.
#[derive(Clone, Copy, Debug, Default)]
struct Counters {
    done: [u64; 2],
    busy: [u64; 2],
}

/// One flow's measurement over the interval.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FlowMeasurement {
    /// The policy's input.
    pub sample: Sample,
    /// Send connections seen for the flow.
    pub connections: usize,
    /// Intra-island connections among them.
    pub intra_island: usize,
}

/// The reader of probes files and NIC counters, keeping the previous values.
pub struct Measurer {
    dir: PathBuf,
    sysfs_root: PathBuf,
    readers: BTreeMap<PathBuf, ProbesReader>,
    previous: BTreeMap<(PathBuf, u32, u32), Counters>,
    nic_previous: BTreeMap<(String, u32), u64>,
    /// Live probes files on the last read.
    pub files: usize,
}

impl Measurer {
    /// A measurer of `dir`'s probes files and the NIC counters under `sysfs_root`.
    pub fn new(dir: &Path, sysfs_root: &Path) -> Measurer {
        Measurer {
            dir: dir.to_path_buf(),
            sysfs_root: sysfs_root.to_path_buf(),
            readers: BTreeMap::new(),
            previous: BTreeMap::new(),
            nic_previous: BTreeMap::new(),
            files: 0,
        }
    }

    /// Reads everything once; `interval_ns` is the time since the previous call. Returns each
    /// flow's measurement by slot, and every slot a live connection reads.
    pub fn measure(&mut self, interval_ns: u64) -> (BTreeMap<u32, FlowMeasurement>, BTreeSet<u32>) {
        self.refresh_files();
        let mut flows: BTreeMap<u32, FlowMeasurement> = BTreeMap::new();
        let mut in_use = BTreeSet::new();
        let mut seen = BTreeSet::new();
        let mut devices: BTreeMap<u32, BTreeSet<(usize, String, u32)>> = BTreeMap::new();
        for (path, reader) in &self.readers {
            let info = reader.info();
            let snapshot = reader.snapshot();
            for conn in &snapshot.connections {
                let slot = conn.info.hint_slot;
                if conn.info.mode != Mode::Advanced || slot == u32::MAX {
                    continue;
                }
                if conn.state == ConnectionState::Active {
                    in_use.insert(slot);
                }
                if conn.info.direction != Direction::Send {
                    continue;
                }
                let key = (path.clone(), conn.index, conn.generation);
                let now = Counters {
                    done: conn.rail_done_bytes,
                    busy: conn.rail_busy_ns,
                };
                let before = self.previous.get(&key).copied().unwrap_or_default();
                seen.insert(key.clone());
                self.previous.insert(key, now);
                let flow = flows.entry(slot).or_default();
                flow.sample.interval_ns = interval_ns;
                for rail in [SOUT, SUP] {
                    flow.sample.done_bytes[rail] +=
                        now.done[rail].saturating_sub(before.done[rail]);
                    flow.sample.busy_ns[rail] += now.busy[rail].saturating_sub(before.busy[rail]);
                    if let Some(desc) = info.rails.get(rail) {
                        let rate = f64::from(desc.speed_mbps) * 1e6 / 8.0;
                        flow.sample.link_rate[rail] = flow.sample.link_rate[rail].max(rate);
                        let device = (rail, desc.device.clone(), desc.port);
                        devices.entry(slot).or_default().insert(device);
                    }
                }
                if conn.state == ConnectionState::Active {
                    flow.connections += 1;
                    if conn.info.path_class == mpib_probes::PathClass::IntraIsland {
                        flow.intra_island += 1;
                    }
                }
            }
        }
        self.previous.retain(|key, _| seen.contains(key));
        self.add_retransmissions(&mut flows, &devices);
        (flows, in_use)
    }

    fn refresh_files(&mut self) {
        let listed: BTreeSet<PathBuf> = match std::fs::read_dir(&self.dir) {
            Ok(entries) => entries
                .filter_map(Result::ok)
                .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "probes"))
                .collect(),
            Err(_) => BTreeSet::new(),
        };
        self.readers.retain(|path, reader| {
            listed.contains(path) && reader.closed_ns() == 0 && pid_alive(reader.info().pid)
        });
        for path in listed {
            if self.readers.contains_key(&path) {
                continue;
            }
            if let Ok(LoadState::Ready(reader)) = ProbesReader::open(&path) {
                if reader.closed_ns() == 0 && pid_alive(reader.info().pid) {
                    self.readers.insert(path, reader);
                }
            }
        }
        self.files = self.readers.len();
    }

    /// Adds, per flow, the increase of the retransmission counters of the devices its rails use.
    fn add_retransmissions(
        &mut self,
        flows: &mut BTreeMap<u32, FlowMeasurement>,
        devices: &BTreeMap<u32, BTreeSet<(usize, String, u32)>>,
    ) {
        let mut increase: BTreeMap<(String, u32), u64> = BTreeMap::new();
        let all: BTreeSet<(String, u32)> = devices
            .values()
            .flatten()
            .map(|(_, d, p)| (d.clone(), *p))
            .collect();
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
                    flow.sample.retransmissions[*rail] += increase.get(&key).copied().unwrap_or(0);
                }
            }
        }
    }

    fn nic_total(&self, device: &str, port: u32) -> Option<u64> {
        let dir = self
            .sysfs_root
            .join(device)
            .join("ports")
            .join(port.to_string())
            .join("hw_counters");
        let mut any = false;
        let mut total = 0u64;
        for name in RETRANSMISSION_COUNTERS {
            if let Ok(text) = std::fs::read_to_string(dir.join(name)) {
                if let Ok(value) = text.trim().parse::<u64>() {
                    total = total.saturating_add(value);
                    any = true;
                }
            }
        }
        any.then_some(total)
    }
}

/// Whether `pid` exists (`/proc/PID`); an error other than "not found" counts as alive.
pub fn pid_alive(pid: u32) -> bool {
    pid != 0
        && match std::fs::metadata(format!("/proc/{pid}")) {
            Ok(_) => true,
            Err(e) => e.kind() != std::io::ErrorKind::NotFound,
        }
}

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
