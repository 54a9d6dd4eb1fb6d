//! The plugin's side of the probes: one shared-memory file per process (`mpib-probes`), written
//! by plain loads and stores from the data path, read by the `mpib-collector` sidecar.
//!
//! `MPIB_PROBES=0` gives a disabled file whose handles write into a static dummy, so the data path
//! never branches on it. Failing to create the file is not fatal: it is logged and the plugin runs
//! with probes disabled (telemetry must never take training down).

use mpib_probes::declared::{
    CONNECTIONS_WITHOUT_AGENT, HINT_FILE_LOST, RAIL_FAILBACKS, RAIL_FAILOVERS,
};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use mpib_probes::{
    ConnectionInfo as ProbeConnection, ConnectionProbe, DeviceEntry, Direction, EventKind,
    Mode as ProbeMode, PathClass as ProbeClass, ProbesFile, RailInfo, RailProbe, SlowTransfer,
    TransferProbe, WriterInfo,
};

use crate::fabric::Rail;
use crate::log;
use crate::params::{Mode, Settings};
use crate::proto::island::PathClass;
use crate::trust::Trusted;

use crate::net::data::request::now_ns;
use crate::net::observe::probes_access;
use crate::net::setup::comm::ConnectionInfo;
use crate::net::setup::devices::{FusedDevice, Nic};

/// The process's probes file and the policy for slow-transfer events.
pub(crate) struct Telemetry {
    file: ProbesFile,
    slow_threshold_ns: u64,
    sample_one_in: u32,
    /// Unix-epoch ns minus monotonic ns, so event times need no clock syscall.
    epoch_offset_ns: u64,
    /// Whether the loss of the file was logged.
    lost: AtomicBool,
}

impl Telemetry {
    /// Creates the probes file for the opened NICs and the devices made of them (or a disabled
    /// one). A NIC's slot in the file is its index in `nics`.
    pub(crate) fn open(
        settings: &Settings,
        nics: &[Nic],
        devices: &[Arc<FusedDevice>],
    ) -> Telemetry {
        let epoch_offset_ns = mpib_probes::now_ns().saturating_sub(now_ns());
        let slow_threshold_ns = settings.slow_us.saturating_mul(1000);
        let disabled = |file| Telemetry {
            file,
            slow_threshold_ns,
            sample_one_in: 0,
            epoch_offset_ns,
            lost: AtomicBool::new(false),
        };
        if !settings.probes {
            return disabled(ProbesFile::disabled());
        }
        let rails = nics
            .iter()
            .map(|nic| RailInfo {
                device: nic.device.info().name.clone(),
                port: u32::from(nic.device.info().port),
                speed_mbps: nic.device.info().speed_mbps,
            })
            .collect();
        let devices = devices
            .iter()
            .map(|device| DeviceEntry {
                name: device.label(),
                nics: device.nic_slots,
            })
            .collect();
        let dir = Path::new(&settings.probes_dir);
        let trusted = Trusted::new(&settings.trusted_uids);
        if let Err(why) = probes_access::prepare_dir(dir, settings.probes_group, &trusted) {
            warn!(
                log::INIT,
                "probes disabled for this process: {why}; data transfer goes on"
            );
            return disabled(ProbesFile::disabled());
        }
        let mut info = WriterInfo::for_this_process(rails);
        info.devices = devices;
        info.slow_threshold_ns = slow_threshold_ns;
        info.sample_one_in = settings.probes_sample;
        match ProbesFile::create(dir, &info) {
            Ok(file) => {
                if let (Some(gid), Some(path)) = (settings.probes_group, file.path()) {
                    if let Err(e) = probes_access::share_file(path, gid) {
                        warn!(log::INIT, "probes: {e}; the file stays 0600");
                    }
                }
                info!(
                    log::INIT,
                    "probes: {}",
                    file.path()
                        .map(|p| p.display().to_string())
                        .unwrap_or_default()
                );
                Telemetry {
                    file,
                    slow_threshold_ns,
                    sample_one_in: settings.probes_sample,
                    epoch_offset_ns,
                    lost: AtomicBool::new(false),
                }
            }
            Err(e) => {
                warn!(
                    log::INIT,
                    "probes disabled: cannot create a file in MPIB_PROBES_DIR={}: {e}",
                    settings.probes_dir
                );
                disabled(ProbesFile::disabled())
            }
        }
    }

    /// Counters of the NIC at `slot` (its index among the opened NICs).
    #[inline]
    pub(crate) fn nic(&self, slot: usize) -> RailProbe<'_> {
        self.file.rail(slot)
    }

    /// Transfers-by-mask counters.
    #[inline]
    pub(crate) fn transfers(&self) -> TransferProbe<'_> {
        self.file.transfers()
    }

    /// Unix-epoch ns of a monotonic timestamp from [`now_ns`].
    #[inline]
    pub(crate) fn epoch_ns(&self, monotonic_ns: u64) -> u64 {
        monotonic_ns + self.epoch_offset_ns
    }

    /// Refreshes the writer heartbeat (one store).
    #[inline]
    pub(crate) fn heartbeat(&self, monotonic_ns: u64) {
        self.file.heartbeat(self.epoch_ns(monotonic_ns));
    }

    /// One WARN when another process shrank, removed or replaced the probes file: the plugin
    /// goes on writing into memory nobody reads (a shrunk file's pages became private zero
    /// pages, see `mpib_probes::guard`), and moving data. One `stat`: called about once a
    /// second by the housekeeping thread (`crate::net::observe::housekeeper`), never from the data path.
    pub(crate) fn check_file(&self) {
        if self.lost.load(Ordering::Relaxed) {
            return;
        }
        if let Some(why) = self.file.lost() {
            if !self.lost.swap(true, Ordering::Relaxed) {
                let path = self.file.path().map(|p| p.display().to_string());
                warn!(
                    log::INIT,
                    "probes file {}: {why}; this process's telemetry stops (data transfer goes on)",
                    path.unwrap_or_default()
                );
            }
        }
    }

    /// Whether a transfer that took `duration_ns` is recorded, and why; `sequence` drives 1-in-N
    /// sampling.
    #[inline]
    pub(crate) fn event_kind(&self, duration_ns: u64, sequence: u64) -> Option<EventKind> {
        if self.slow_threshold_ns > 0 && duration_ns >= self.slow_threshold_ns {
            Some(EventKind::SLOW)
        } else if self.sample_one_in > 0 && sequence % u64::from(self.sample_one_in) == 0 {
            Some(EventKind::SAMPLED)
        } else {
            None
        }
    }

    /// Appends a slow-transfer event.
    #[inline]
    pub(crate) fn record(&self, transfer: &SlowTransfer) {
        self.file.record_slow_transfer(transfer);
    }

    /// Counts an advanced-mode connection that got no hint slot from the agent.
    pub(crate) fn agent_unavailable(&self) {
        self.file.add(CONNECTIONS_WITHOUT_AGENT, 1);
    }

    /// Counts an advanced-mode connection that stopped reading a hint file that shrank, was
    /// replaced or was removed.
    pub(crate) fn hint_file_lost(&self) {
        self.file.add(HINT_FILE_LOST, 1);
    }

    /// Removes the file (clean shutdown); dropping the last reference does it too.
    pub(crate) fn remove(&self) {
        if let Err(e) = self.file.remove() {
            warn!(log::INIT, "probes: cannot remove the file: {e}");
        }
    }
}

/// A connection's slot in the probes file, kept alive with the file it points into.
pub(crate) struct ConnectionTelemetry {
    /// Declared first: dropped (slot marked closed) before `telemetry` may unmap the file.
    probe: ConnectionProbe<'static>,
    telemetry: Arc<Telemetry>,
    /// The file's NIC slots of the connection's SOUT and SUP NICs.
    nics: [usize; 2],
}

impl ConnectionTelemetry {
    /// Claims a slot for `info` (a disabled probe when the table is full or probes are off).
    pub(crate) fn claim(
        telemetry: &Arc<Telemetry>,
        info: &ConnectionInfo,
        send: bool,
    ) -> ConnectionTelemetry {
        let claim = ProbeConnection {
            peer: info.peer,
            direction: if send {
                Direction::Send
            } else {
                Direction::Recv
            },
            path_class: match info.class {
                PathClass::IntraIsland => ProbeClass::IntraIsland,
                PathClass::InterIsland => ProbeClass::InterIsland,
            },
            mode: match info.mode {
                Mode::Vanilla => ProbeMode::Vanilla,
                Mode::Advanced => ProbeMode::Advanced,
            },
            hint_slot: info.agent.as_ref().map_or(u32::MAX, |a| a.hint_slot),
            device: u8::try_from(info.device_index).unwrap_or(u8::MAX),
        };
        let claimed = telemetry.file.claim_connection(&claim);
        // SAFETY: the probe borrows the mapping owned by `telemetry.file`; the Arc stored beside
        // it keeps that file (and its mapping, which never moves) alive for as long as the
        // probe, which is declared first and so dropped first.
        let probe = match claimed {
            // SAFETY: see above; `telemetry` (an Arc of the file's owner) is stored beside it.
            Some(probe) => unsafe { extend_lifetime(probe) },
            None => ConnectionProbe::disabled(),
        };
        ConnectionTelemetry {
            probe,
            telemetry: Arc::clone(telemetry),
            nics: info.nic_slots,
        }
    }

    /// A connection that has not claimed a slot (yet): counts only into the counters of its
    /// NICs (`nics`, their slots in the file).
    pub(crate) fn unclaimed(telemetry: &Arc<Telemetry>, nics: [usize; 2]) -> ConnectionTelemetry {
        ConnectionTelemetry {
            probe: ConnectionProbe::disabled(),
            telemetry: Arc::clone(telemetry),
            nics,
        }
    }

    /// Counters of the connection's NIC on `rail` (a NIC two devices share counts once).
    #[inline]
    pub(crate) fn rail(&self, rail: Rail) -> RailProbe<'_> {
        self.telemetry.file.rail(self.nics[rail.index()])
    }

    /// Bytes this connection moved on `rail`.
    #[inline]
    pub(crate) fn add_rail_bytes(&self, rail: Rail, bytes: u64) {
        self.probe.add_rail_bytes(rail.index(), bytes);
    }

    /// The process's telemetry.
    #[inline]
    pub(crate) fn telemetry(&self) -> &Telemetry {
        &self.telemetry
    }

    /// Index of the slot (for events).
    #[inline]
    pub(crate) fn index(&self) -> u32 {
        self.probe.index()
    }

    /// A part of `bytes` completed on `rail` after `busy_ns` more of busy time, leaving
    /// `in_flight` parts on it.
    #[inline]
    pub(crate) fn add_rail_done(&self, rail: Rail, bytes: u64, busy_ns: u64, in_flight: u32) {
        self.probe.add_rail_done(rail.index(), bytes, busy_ns);
        self.probe.set_rail_in_flight(rail.index(), in_flight);
    }

    /// `in_flight` parts of this connection are on `rail` now.
    #[inline]
    pub(crate) fn set_rail_in_flight(&self, rail: Rail, in_flight: u32) {
        self.probe.set_rail_in_flight(rail.index(), in_flight);
    }

    /// Bytes this connection moved per rail.
    #[inline]
    pub(crate) fn add_split(&self, bytes: [u64; 2]) {
        self.probe.add_split(bytes);
    }

    /// What NCCL says of the operation a transfer posted now serves (src/net/observe/attributes.rs).
    #[inline]
    pub(crate) fn set_operation(&self, word: u64) {
        self.probe.set_operation(word);
    }

    /// This end of the connection failed `rail` over (docs/PROTOCOL.md §10): counted on the
    /// rail's NIC and marked in the connection's slot.
    #[cold]
    pub(crate) fn rail_failed(&self, rail: Rail) {
        self.rail(rail).inc(RAIL_FAILOVERS);
        self.probe.rail_failed(rail.index());
    }

    /// `rail` came back for this end of the connection (docs/PROTOCOL.md §11): counted on the
    /// rail's NIC and cleared in the connection's slot.
    #[cold]
    pub(crate) fn rail_restored(&self, rail: Rail) {
        self.rail(rail).inc(RAIL_FAILBACKS);
        self.probe.rail_restored(rail.index());
    }
}

/// Widens a probe's lifetime.
///
/// # Safety
/// The caller keeps the `ProbesFile` the probe borrows alive (and unmoved) for as long as the
/// returned probe exists.
unsafe fn extend_lifetime(probe: ConnectionProbe<'_>) -> ConnectionProbe<'static> {
    // SAFETY: same type up to the lifetime; liveness is the caller's contract.
    unsafe { std::mem::transmute::<ConnectionProbe<'_>, ConnectionProbe<'static>>(probe) }
}

// Every NIC and every fused device the pairing accepts has a slot in the probes file.
const _: () = assert!(
    crate::pairing::MAX_NICS <= mpib_probes::MAX_NICS
        && crate::pairing::MAX_NICS <= mpib_probes::MAX_DEVICES
);
