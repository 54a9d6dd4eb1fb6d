//! One sample of the node: what the screen, the text frames and the JSON documents all show.
//! Rates are over the interval since the previous sample (`None` on the first one); shares are
//! in parts per 1024 of the bytes, SUP's part, as the plugin's `sup_bw`.

use serde::Serialize;

/// The node at one instant.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Frame {
    /// When it was taken, ns since the Unix epoch.
    pub time_ns: u64,
    /// Seconds since the previous sample (0 on the first).
    pub interval_seconds: f64,
    /// The probes directory.
    pub probes_dir: String,
    /// Why the directory could not be listed, when it could not.
    pub probes_dir_error: Option<String>,
    /// The processes with a trusted probes file, by pid.
    pub processes: Vec<Process>,
    /// Files not shown, each with its reason.
    pub skipped: Vec<Skipped>,
    /// The agent's flows, or why there are none.
    pub agent: Agent,
    /// The slowest transfers of the last minute, slowest first.
    pub slowest: Vec<SlowTransfer>,
}

/// A probes file that is not shown.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Skipped {
    /// Its path.
    pub path: String,
    /// `version`, `corrupt`, `truncated` or `untrusted`, as the collector's
    /// `mpib_probes_skipped_total{reason}`.
    pub reason: &'static str,
    /// What exactly.
    pub detail: String,
}

/// One process writing probes.
#[derive(Clone, Debug, Serialize)]
pub struct Process {
    /// Its pid.
    pub pid: u32,
    /// Its user's name (or uid).
    pub user: String,
    /// The host it names.
    pub host: String,
    /// Seconds since it opened its probes file.
    pub age_seconds: f64,
    /// Transfers per second, all devices.
    pub transfers_per_second: Option<f64>,
    /// Its fused devices.
    pub devices: Vec<Device>,
    /// Its connections.
    pub connections: Vec<Connection>,
    /// Every process-wide value its file declares.
    pub values: Vec<Value>,
}

/// One fused device (a SOUT NIC and a SUP NIC).
#[derive(Clone, Debug, Serialize)]
pub struct Device {
    /// Its index in the process (NCCL's device number).
    pub index: usize,
    /// Its name (`mlx5_0+mlx5_1`).
    pub name: String,
    /// Bytes per second its connections sent.
    pub sent_bytes_per_second: Option<f64>,
    /// Bytes per second its connections received.
    pub received_bytes_per_second: Option<f64>,
    /// The split the agent asks of its advanced connections, weighted by their bytes.
    pub split_asked: Option<u32>,
    /// The split its connections' bytes took over the interval.
    pub split_applied: Option<u32>,
    /// Its two rails.
    pub rails: Vec<Rail>,
}

/// One NIC of a device.
#[derive(Clone, Debug, Serialize)]
pub struct Rail {
    /// `sout` or `sup`.
    pub rail: &'static str,
    /// The NIC.
    pub nic: String,
    /// Its port.
    pub port: u32,
    /// Whether another device of the process uses the same NIC (its counters are the NIC's).
    pub shared: bool,
    /// Bytes per second the NIC sent for the process.
    pub sent_bytes_per_second: Option<f64>,
    /// Bytes per second it received.
    pub received_bytes_per_second: Option<f64>,
    /// Transfer parts per second it completed.
    pub transfers_per_second: Option<f64>,
    /// Receives the shared queue can still lend.
    pub srq_depth: u64,
    /// The low watermark.
    pub srq_low_water: u64,
    /// The high watermark.
    pub srq_high_water: u64,
    /// Error completions since the process started.
    pub error_completions: u64,
    /// Error completions per second.
    pub error_completions_per_second: Option<f64>,
    /// The NIC's own retransmission counters (sysfs), per second; `None` without them.
    pub retransmissions_per_second: Option<f64>,
    /// Open connections of the device that failed this rail over and run on the other alone
    /// (docs/PROTOCOL.md section 10): the device is degraded while any does.
    pub failed_over_connections: u32,
    /// Every rail value the file declares.
    pub values: Vec<Value>,
}

/// A declared value, whatever the plugin version declares.
#[derive(Clone, Debug, Serialize)]
pub struct Value {
    /// Its exported name.
    pub name: String,
    /// `counter` or `gauge`.
    pub kind: &'static str,
    /// Its value now.
    pub value: u64,
    /// Per second, for a counter.
    pub per_second: Option<f64>,
}

/// One connection.
#[derive(Clone, Debug, Serialize)]
pub struct Connection {
    /// Its slot in the probes file.
    pub index: u32,
    /// The peer's address.
    pub peer: String,
    /// `send` or `recv`.
    pub direction: &'static str,
    /// The device's name.
    pub device: String,
    /// The device's index in the process.
    pub device_index: u8,
    /// `vanilla` or `advanced`.
    pub mode: &'static str,
    /// `intra-island` or `inter-island`.
    pub path: &'static str,
    /// Its agent flow (hint slot), advanced connections only.
    pub flow: Option<u32>,
    /// Bytes per second on each rail (SOUT, SUP).
    pub rail_bytes_per_second: [Option<f64>; 2],
    /// Both rails.
    pub bytes_per_second: Option<f64>,
    /// The split the agent asks (hint file).
    pub split_asked: Option<u32>,
    /// The split its bytes took over the interval.
    pub split_applied: Option<u32>,
    /// What NCCL said its last posted transfer served (`None`: nothing said).
    pub operation: Option<Operation>,
    /// The rails it failed over from (`sout`, `sup`): it runs on the other alone.
    pub failed_over: Vec<&'static str>,
}

/// The agent, seen through its control socket.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Agent {
    /// `--agent-control off`.
    #[default]
    Off,
    /// It did not answer, and why.
    Unavailable {
        /// The reason.
        reason: String,
    },
    /// Its flows.
    Running {
        /// One per flow.
        flows: Vec<Flow>,
    },
}

/// One flow as the agent decides it.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Flow {
    /// Its hint slot.
    pub flow: u32,
    /// The SOUT pair.
    pub sout_pair: String,
    /// `static`, `capacity`, `adaptive` or `pinned`.
    pub policy: String,
    /// The share it asks.
    pub sup_bw: u32,
    /// The share the flow's bytes took.
    pub measured_sup_bw: Option<u32>,
    /// The flow's throughput, bytes per second.
    pub throughput_bytes_per_second: Option<f64>,
    /// Its connections.
    pub connections: u32,
    /// Its send connections the agent read in the probes files on its last measurement
    /// (`None`: an agent older than the column).
    pub measured_connections: Option<u32>,
}

/// What NCCL said (`setNetAttr`, ABI v11 on) a transfer served.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Operation {
    /// `AllReduce`, `Send`, ... (several joined by `|`).
    pub function: String,
    /// `Ring`, `Tree`, ...; `-` for point-to-point calls.
    pub algorithm: String,
    /// `Simple`, `LL`, `LL128`; `-` for point-to-point calls.
    pub protocol: String,
    /// Peers the communicator moves data with at once (`None`: undefined).
    pub peers: Option<u32>,
    /// Flows (channels) per peer (`None`: undefined).
    pub flows_per_peer: Option<u32>,
    /// `AllReduce Ring Simple`: what the screen shows.
    pub name: String,
}

impl Operation {
    /// `None` when NCCL said nothing.
    pub fn of(operation: &mpib_probes::Operation) -> Option<Operation> {
        let count = |n: i32| u32::try_from(n).ok();
        operation.is_known().then(|| Operation {
            function: operation.function_label(),
            algorithm: operation.algorithm_label(),
            protocol: operation.protocol_label(),
            peers: count(operation.peers),
            flows_per_peer: count(operation.flows_per_peer),
            name: operation.name(),
        })
    }
}

/// A slow transfer the plugin recorded.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct SlowTransfer {
    /// The process.
    pub pid: u32,
    /// The peer.
    pub peer: String,
    /// `send` or `recv`.
    pub direction: &'static str,
    /// Its size.
    pub bytes: u64,
    /// From the first post to the last completion, microseconds.
    pub total_us: f64,
    /// Each rail's time (SOUT, SUP), microseconds; `None` for a rail it did not use.
    pub rail_us: [Option<f64>; 2],
    /// Each rail's bytes.
    pub rail_bytes: [u64; 2],
    /// The split it was posted with.
    pub sup_bw: u32,
    /// When it completed, ns since the Unix epoch.
    pub done_ns: u64,
    /// What NCCL said it served (`None`: nothing said).
    pub operation: Option<Operation>,
}

/// `sup * 1024 / (sout + sup)`, rounded; `None` when nothing moved.
pub fn split(sout: f64, sup: f64) -> Option<u32> {
    let total = sout + sup;
    (total > 0.0).then(|| (sup * 1024.0 / total).round() as u32)
}

#[cfg(test)]
mod tests {
    use super::split;

    #[test]
    fn splits_are_parts_per_1024_of_the_bytes() {
        assert_eq!(split(0.0, 0.0), None);
        assert_eq!(split(1.0, 0.0), Some(0));
        assert_eq!(split(0.0, 5.0), Some(1024));
        assert_eq!(split(200.0, 400.0), Some(683));
    }
}
