//! Every `MPIB_*` environment variable, declared once.
//!
//! [`PARAMS`] is the single table: name, default, meaning. The README's variable table is checked
//! against it by a test (`checks/tests/params_doc.rs`), so the two cannot drift. Values are parsed once
//! per `init` into a [`Settings`] snapshot; bad values are an error that names the variable.

use std::fmt;
use std::net::Ipv4Addr;

/// One documented variable.
#[derive(Clone, Copy, Debug)]
pub struct Param {
    /// Environment variable name.
    pub name: &'static str,
    /// Default, as text ("" when required or unset by default).
    pub default: &'static str,
    /// What it does.
    pub doc: &'static str,
}

/// All variables MPIB reads.
pub const PARAMS: &[Param] = &[
    Param {
        name: "MPIB_FABRIC",
        default: "verbs",
        doc: "Backend: `verbs` (libibverbs), `tcp` (RC over TCP between processes and hosts, for NCCL where no RDMA NIC exists) or `loopback` (in-process model, for tests and the demo).",
    },
    Param {
        name: "MPIB_HCA_SOUT",
        default: "",
        doc: "Scale-out NICs, comma-separated: `name` or `name:port` each (e.g. `mlx5_0:1,mlx5_2:1`); one fused NCCL device per SOUT NIC, in PCI order. Loopback default `loop0`. Tcp: an interface `eth0`, `eth0=ADDR` or an IPv4 address.",
    },
    Param {
        name: "MPIB_HCA_SUP",
        default: "",
        doc: "Scale-up NICs, paired with the SOUT NICs in order; fewer SUP NICs are shared by consecutive SOUT NICs (the count must divide). `auto` (or `auto:NIC,...` to name the candidates): each SOUT NIC with the nearest SUP NIC by PCI distance, never across NUMA nodes. Loopback default `loop1`. Tcp: as `MPIB_HCA_SOUT`.",
    },
    Param {
        name: "MPIB_SYSFS",
        default: "/sys",
        doc: "Root of the sysfs tree: the plugin reads NICs' PCI paths and NUMA nodes there (`auto` pairing, `pciPath`), the collector, the agent and `mpib-top` NIC counters (also their `--sysfs`); tests point it at a fake tree.",
    },
    Param {
        name: "MPIB_SOUT_QP",
        default: "2",
        doc: "QPs per connection on the SOUT rail (1-16).",
    },
    Param {
        name: "MPIB_SUP_QP",
        default: "4",
        doc: "QPs per connection on the SUP rail (1-16); none are created for vanilla inter-island.",
    },
    Param {
        name: "MPIB_CTS_SIGNAL_INTERVAL",
        default: "128",
        doc: "A CTS write is signalled every this many slots (power of two, 1-256).",
    },
    Param {
        name: "MPIB_MODE",
        default: "0",
        doc: "0 = vanilla (island policy: intra all SUP, inter all SOUT); 1 = advanced (agent hints).",
    },
    Param {
        name: "MPIB_ISLAND_PREFIX_LEN",
        default: "24",
        doc: "Two SOUT IPv4 addresses sharing this many leading bits are in the same island (0-32).",
    },
    Param {
        name: "MPIB_OOB_IF",
        default: "",
        doc: "Interface whose IPv4 address carries the control connection (auto when unset).",
    },
    Param {
        name: "MPIB_OOB_ADDR",
        default: "",
        doc: "IPv4 address for the control connection; overrides MPIB_OOB_IF.",
    },
    Param {
        name: "MPIB_BDP_BYTES",
        default: "0",
        doc: "Advanced mode: inter-island transfers of at most this many bytes stay on SOUT whatever the hint (0 = off).",
    },
    Param {
        name: "MPIB_SRQ_LOW_WATER",
        default: "8",
        doc: "Receives a receive comm takes from a rail's shared receive queue beyond what its outstanding receives need.",
    },
    Param {
        name: "MPIB_SRQ_HIGH_WATER",
        default: "512",
        doc: "The most receives a receive comm holds of a rail's shared receive queue, and so keeps outstanding.",
    },
    Param {
        name: "MPIB_AGENT_TAG",
        default: "",
        doc: "Advanced mode: several agents on one host; the default paths become /tmp/mpib/TAG/hints and /tmp/mpib/TAG/agent.sock.",
    },
    Param {
        name: "MPIB_AGENT_CONFIG",
        default: "",
        doc: "`mpib-agent` only: its TOML configuration file (policies and rules; reloaded on SIGHUP). Unset: built-in defaults.",
    },
    Param {
        name: "MPIB_HINT_PATH",
        default: "/tmp/mpib/hints",
        doc: "Advanced mode: the agent's hint SHM file (seqlock entries, parts per 1024).",
    },
    Param {
        name: "MPIB_AGENT_SOCKET",
        default: "/tmp/mpib/agent.sock",
        doc: "Advanced mode: the agent's registration socket (assigns each connection a hint slot).",
    },
    Param {
        name: "MPIB_TRUSTED_UIDS",
        default: "",
        doc: "Besides root and the job's own user, the users (uids or names of /etc/passwd, comma separated) \
              who may own the agent's socket, hint file and their directories, and the probes directory \
              (an agent run as a dedicated user; docs/SECURITY.md).",
    },
    Param {
        name: "MPIB_IB_GID_INDEX",
        default: "",
        doc: "RoCE GID table index for both rails; unset: the IPv4-mapped RoCE v2 GID, chosen as NCCL does.",
    },
    Param {
        name: "MPIB_IB_TIMEOUT",
        default: "20",
        doc: "QP local ACK timeout exponent (4.096 us x 2^N per try), 1-31.",
    },
    Param {
        name: "MPIB_IB_RETRY_CNT",
        default: "7",
        doc: "QP transport retry count, 0-7.",
    },
    Param {
        name: "MPIB_ADDR_RESOLVE_TIMEOUT_MS",
        default: "3000",
        doc: "How long `connect`/`accept` keep polling for the peer's RoCE neighbour entry (ARP) before connecting anyway with a WARN naming the rail, addresses and interface; the kernel then resolves inside `ibv_modify_qp` (up to about 1 s) or fails (1-600000).",
    },
    Param {
        name: "MPIB_IB_TC",
        default: "",
        doc: "RoCE traffic class, 0-255; unset: the communicator's trafficClass, else 0.",
    },
    Param {
        name: "MPIB_IB_SL",
        default: "0",
        doc: "InfiniBand service level, 0-15.",
    },
    Param {
        name: "MPIB_IB_PCI_RELAXED_ORDERING",
        default: "2",
        doc: "Relaxed-ordering data MRs: 0 off, 1 on (fail if unsupported), 2 when libibverbs has ibv_reg_mr_iova2.",
    },
    Param {
        name: "MPIB_FORCE_FLUSH",
        default: "0",
        doc: "1: report forceFlush and flush received GPU data with a 1-byte RDMA_READ per rail.",
    },
    Param {
        name: "MPIB_FAILOVER",
        default: "1",
        doc: "1: a connection whose rail fails goes on over the other (both ends must allow it); 0: a failed rail fails the connection.",
    },
    Param {
        name: "MPIB_FAILOVER_WATCHDOG_MS",
        default: "0",
        doc: "A rail whose parts complete nothing for this long while the other rail's complete fails over before its QPs' retries run out (docs/PROTOCOL.md §10); 0: off, the retries decide.",
    },
    Param {
        name: "MPIB_FAILBACK",
        default: "1",
        doc: "1: a rail that failed over is tried again until it is back, and connections return to the split (docs/PROTOCOL.md §11); 0: it stays down for the connection's life.",
    },
    Param {
        name: "MPIB_FAILBACK_HOLD_MS",
        default: "500",
        doc: "Hold-down: a failed rail is tried no sooner than this after it failed or its port came back; doubled (up to MPIB_FAILBACK_BACKOFF_MAX_MS) when it fails again within ten hold-downs of its return.",
    },
    Param {
        name: "MPIB_FAILBACK_BACKOFF_MAX_MS",
        default: "30000",
        doc: "Longest wait between two tries to bring a rail back (each failed try doubles the wait up to it; tries go on for the connection's life).",
    },
    Param {
        name: "MPIB_FAILBACK_ATTEMPT_MS",
        default: "2000",
        doc: "A try to bring a rail back that is not done by then (peer's answer and a write acknowledged on each new queue pair) is given up.",
    },
    Param {
        name: "MPIB_PROBES",
        default: "1",
        doc: "1: write per-rail telemetry to a shared-memory probes file; 0: no file (no-op handles).",
    },
    Param {
        name: "MPIB_PROBES_DIR",
        default: "/dev/shm/mpib",
        doc: "Directory of the probes files (one per process, removed on clean shutdown).",
    },
    Param {
        name: "MPIB_PROBES_GROUP",
        default: "",
        doc: "Group (gid or name of /etc/group) that may read the probes files: a new MPIB_PROBES_DIR is made \
              0750 and each file 0640 with this group (unset: 0700 and 0600, the job's user only).",
    },
    Param {
        name: "MPIB_SLOW_US",
        default: "1000",
        doc: "A transfer slower than this (post to last completion, microseconds) is recorded as an event; 0 disables.",
    },
    Param {
        name: "MPIB_PROBES_SAMPLE",
        default: "0",
        doc: "Also record 1 in N transfers as sampled events (0 = none).",
    },
    Param {
        name: "MPIB_LOOPBACK_FAULTS",
        default: "",
        doc: "Loopback fault knobs, comma separated: `reorder`, `delay=RAIL:N`, `fail=RAIL:N`, \
              `starve=RAIL:N`, `portdown=RAIL:N`, `cut=RAIL:N`, `arp=RAIL:N`, and the NIC limits \
              `max_qp=RAIL:N`, `max_cq=RAIL:N`, `max_srq=RAIL:N`, `max_srq_wr=RAIL:N`, `max_mr=RAIL:N` (see docs/ARCHITECTURE.md).",
    },
    Param {
        name: "MPIB_LOOPBACK_RAILS",
        default: "",
        doc: "Loopback rail rates: `sout=RATE,sup=RATE,loopN=RATE,latency=TIME,shared=RATE,mixed=RATE` (each NIC its own wire; `loopN=` over its rail's rate), then \
              `;TIME:KEY=VALUE,...` phases (see docs/PERFORMANCE.md); empty = memcpy speed.",
    },
];

pub use crate::FabricKind;

pub use mpib_proto::mode::Mode;

/// An invalid variable value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamError {
    /// Variable name.
    pub name: &'static str,
    /// The offending value.
    pub value: String,
    /// What was expected.
    pub expected: String,
}

impl fmt::Display for ParamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}={:?} is invalid: expected {}",
            self.name, self.value, self.expected
        )
    }
}

impl std::error::Error for ParamError {}

/// A snapshot of every variable, parsed and validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// MPIB_FABRIC.
    pub fabric: FabricKind,
    /// MPIB_HCA_SOUT (after the fabric's default applies).
    pub hca_sout: String,
    /// MPIB_HCA_SUP (after the fabric's default applies).
    pub hca_sup: String,
    /// Both lists, parsed and checked against each other.
    pub nics: crate::pairing::NicLists,
    /// MPIB_SYSFS.
    pub sysfs: String,
    /// MPIB_SOUT_QP.
    pub sout_qps: u8,
    /// MPIB_SUP_QP.
    pub sup_qps: u8,
    /// MPIB_CTS_SIGNAL_INTERVAL.
    pub cts_signal_interval: u16,
    /// MPIB_MODE.
    pub mode: Mode,
    /// MPIB_ISLAND_PREFIX_LEN.
    pub island_prefix_len: u8,
    /// MPIB_OOB_IF.
    pub oob_interface: Option<String>,
    /// MPIB_OOB_ADDR.
    pub oob_address: Option<Ipv4Addr>,
    /// MPIB_HINT_PATH.
    pub hint_path: String,
    /// MPIB_AGENT_SOCKET.
    pub agent_socket: String,
    /// MPIB_TRUSTED_UIDS (names resolved), trusted besides root and the effective uid.
    pub trusted_uids: Vec<u32>,
    /// MPIB_IB_GID_INDEX (None = automatic selection).
    pub gid_index: Option<u8>,
    /// MPIB_IB_TIMEOUT.
    pub ib_timeout: u8,
    /// MPIB_IB_RETRY_CNT.
    pub ib_retry_count: u8,
    /// MPIB_ADDR_RESOLVE_TIMEOUT_MS.
    pub addr_resolve_timeout_ms: u32,
    /// MPIB_IB_TC (None = the communicator's traffic class, else 0).
    pub ib_traffic_class: Option<u8>,
    /// MPIB_IB_SL.
    pub ib_service_level: u8,
    /// MPIB_IB_PCI_RELAXED_ORDERING (0 off, 1 on, 2 auto).
    pub relaxed_ordering: u8,
    /// MPIB_FORCE_FLUSH.
    pub force_flush: bool,
    /// MPIB_FAILOVER.
    pub failover: bool,
    /// MPIB_FAILOVER_WATCHDOG_MS, in ns (0: off).
    pub watchdog_ns: u64,
    /// MPIB_FAILBACK and its MPIB_FAILBACK_* timings (None: off).
    pub failback: Option<mpib_proto::failback::FailbackSettings>,
    /// MPIB_PROBES.
    pub probes: bool,
    /// MPIB_PROBES_DIR.
    pub probes_dir: String,
    /// MPIB_PROBES_GROUP (the name resolved).
    pub probes_group: Option<u32>,
    /// MPIB_SLOW_US.
    pub slow_us: u64,
    /// MPIB_PROBES_SAMPLE.
    pub probes_sample: u32,
    /// MPIB_BDP_BYTES.
    pub bdp_bytes: u64,
    /// MPIB_SRQ_LOW_WATER (at most `srq_high_water`).
    pub srq_low_water: u32,
    /// MPIB_SRQ_HIGH_WATER.
    pub srq_high_water: u32,
    /// MPIB_LOOPBACK_FAULTS (parsed by the loopback fabric).
    pub loopback_faults: String,
    /// MPIB_LOOPBACK_RAILS (parsed by the loopback fabric).
    pub loopback_rails: String,
}

impl Settings {
    /// Reads the process environment.
    pub fn from_env() -> Result<Settings, ParamError> {
        Settings::from_lookup(|name| std::env::var(name).ok())
    }

    /// Parses from any name -> value lookup (tests use a map).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Settings, ParamError> {
        let get = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        let fabric = match get("MPIB_FABRIC").as_deref().map(str::trim) {
            None => FabricKind::Verbs,
            Some(name) => FabricKind::from_name(name)
                .ok_or_else(|| invalid("MPIB_FABRIC", name, "`verbs`, `tcp` or `loopback`"))?,
        };
        let default_hca = |loopback_name: &str| match fabric {
            FabricKind::Loopback => loopback_name.to_string(),
            FabricKind::Verbs | FabricKind::Tcp => String::new(),
        };
        let mode = match parse_int(&get, "MPIB_MODE", 0, 0, 1)? {
            0 => Mode::Vanilla,
            _ => Mode::Advanced,
        };
        let cts_signal_interval = parse_int(&get, "MPIB_CTS_SIGNAL_INTERVAL", 128, 1, 256)?;
        if !cts_signal_interval.is_power_of_two() {
            let value = cts_signal_interval.to_string();
            return Err(invalid(
                "MPIB_CTS_SIGNAL_INTERVAL",
                &value,
                "a power of two in 1..=256",
            ));
        }
        let oob_address = match get("MPIB_OOB_ADDR") {
            None => None,
            Some(text) => Some(
                text.trim()
                    .parse::<Ipv4Addr>()
                    .map_err(|_| invalid("MPIB_OOB_ADDR", &text, "an IPv4 address"))?,
            ),
        };
        let agent_dir = agent_directory(get("MPIB_AGENT_TAG"))?;
        let (srq_low_water, srq_high_water) = srq_water_marks(&get)?;
        let hca_sout = get("MPIB_HCA_SOUT").unwrap_or_else(|| default_hca("loop0"));
        let hca_sup = get("MPIB_HCA_SUP").unwrap_or_else(|| default_hca("loop1"));
        let nics = crate::pairing::parse_lists(&hca_sout, &hca_sup).map_err(|e| {
            let value = if e.variable == "MPIB_HCA_SOUT" {
                &hca_sout
            } else {
                &hca_sup
            };
            invalid(e.variable, value, &e.why)
        })?;
        Ok(Settings {
            fabric,
            hca_sout,
            hca_sup,
            nics,
            sysfs: get("MPIB_SYSFS").unwrap_or_else(|| "/sys".to_string()),
            sout_qps: parse_int(&get, "MPIB_SOUT_QP", 2, 1, 16)? as u8,
            sup_qps: parse_int(&get, "MPIB_SUP_QP", 4, 1, 16)? as u8,
            cts_signal_interval: cts_signal_interval as u16,
            mode,
            island_prefix_len: parse_int(&get, "MPIB_ISLAND_PREFIX_LEN", 24, 0, 32)? as u8,
            oob_interface: get("MPIB_OOB_IF"),
            oob_address,
            hint_path: get("MPIB_HINT_PATH").unwrap_or_else(|| format!("{agent_dir}/hints")),
            agent_socket: get("MPIB_AGENT_SOCKET")
                .unwrap_or_else(|| format!("{agent_dir}/agent.sock")),
            trusted_uids: parse_names(&get, "MPIB_TRUSTED_UIDS", crate::users::parse_uids)?
                .unwrap_or_default(),
            gid_index: parse_optional(&get, "MPIB_IB_GID_INDEX", 255)?.map(|v| v as u8),
            ib_timeout: parse_int(&get, "MPIB_IB_TIMEOUT", 20, 1, 31)? as u8,
            ib_retry_count: parse_int(&get, "MPIB_IB_RETRY_CNT", 7, 0, 7)? as u8,
            addr_resolve_timeout_ms: parse_int(
                &get,
                "MPIB_ADDR_RESOLVE_TIMEOUT_MS",
                3_000,
                1,
                600_000,
            )?,
            ib_traffic_class: parse_optional(&get, "MPIB_IB_TC", 255)?.map(|v| v as u8),
            ib_service_level: parse_int(&get, "MPIB_IB_SL", 0, 0, 15)? as u8,
            relaxed_ordering: parse_int(&get, "MPIB_IB_PCI_RELAXED_ORDERING", 2, 0, 2)? as u8,
            force_flush: parse_int(&get, "MPIB_FORCE_FLUSH", 0, 0, 1)? == 1,
            failover: parse_int(&get, "MPIB_FAILOVER", 1, 0, 1)? == 1,
            watchdog_ns: u64::from(parse_int(
                &get,
                "MPIB_FAILOVER_WATCHDOG_MS",
                0,
                0,
                3_600_000,
            )?) * 1_000_000,
            failback: parse_failback(&get)?,
            probes: parse_int(&get, "MPIB_PROBES", 1, 0, 1)? == 1,
            probes_dir: get("MPIB_PROBES_DIR").unwrap_or_else(|| "/dev/shm/mpib".into()),
            probes_group: parse_names(&get, "MPIB_PROBES_GROUP", crate::users::parse_group)?,
            slow_us: u64::from(parse_int(&get, "MPIB_SLOW_US", 1000, 0, u32::MAX)?),
            probes_sample: parse_int(&get, "MPIB_PROBES_SAMPLE", 0, 0, u32::MAX)?,
            bdp_bytes: u64::from(parse_int(&get, "MPIB_BDP_BYTES", 0, 0, u32::MAX)?),
            srq_low_water,
            srq_high_water,
            loopback_faults: get("MPIB_LOOPBACK_FAULTS").unwrap_or_default(),
            loopback_rails: get("MPIB_LOOPBACK_RAILS").unwrap_or_default(),
        })
    }
}

/// MPIB_SRQ_LOW_WATER and MPIB_SRQ_HIGH_WATER: a high mark of 1..=16384 receives (what one
/// shared queue of a verbs device commonly holds), a low mark (the batch) no higher than it.
fn srq_water_marks(get: &impl Fn(&str) -> Option<String>) -> Result<(u32, u32), ParamError> {
    let high = parse_int(get, "MPIB_SRQ_HIGH_WATER", 512, 1, 16_384)?;
    let low = parse_int(get, "MPIB_SRQ_LOW_WATER", 8.min(high), 0, 16_384)?;
    if low > high {
        let value = get("MPIB_SRQ_LOW_WATER").unwrap_or_default();
        let expected = format!("at most MPIB_SRQ_HIGH_WATER ({high})");
        return Err(invalid("MPIB_SRQ_LOW_WATER", &value, &expected));
    }
    Ok((low, high))
}

/// The directory of the agent's default paths: `/tmp/mpib`, or `/tmp/mpib/TAG` with
/// `MPIB_AGENT_TAG=TAG` (the reference interface's way to run several agents on one host). A tag
/// is one path component, so it cannot point anywhere else.
fn agent_directory(tag: Option<String>) -> Result<String, ParamError> {
    let Some(tag) = tag else {
        return Ok("/tmp/mpib".into());
    };
    let tag = tag.trim();
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if tag.len() > 64 || tag == "." || tag == ".." || !tag.chars().all(allowed) {
        return Err(invalid(
            "MPIB_AGENT_TAG",
            tag,
            "at most 64 letters, digits, '.', '_' or '-' (one path component)",
        ));
    }
    Ok(format!("/tmp/mpib/{tag}"))
}

fn invalid(name: &'static str, value: &str, expected: &str) -> ParamError {
    ParamError {
        name,
        value: value.to_string(),
        expected: expected.to_string(),
    }
}

fn parse_int(
    get: &impl Fn(&str) -> Option<String>,
    name: &'static str,
    default: u32,
    min: u32,
    max: u32,
) -> Result<u32, ParamError> {
    let Some(text) = get(name) else {
        return Ok(default);
    };
    match text.trim().parse::<u32>() {
        Ok(value) if (min..=max).contains(&value) => Ok(value),
        _ => Err(invalid(
            name,
            &text,
            &format!("an integer in {min}..={max}"),
        )),
    }
}

/// `MPIB_FAILBACK` and its timings (milliseconds in the variables, nanoseconds out); `None`
/// when off. The hold-down may not exceed the longest wait, which bounds its doubling.
fn parse_failback(
    get: &impl Fn(&str) -> Option<String>,
) -> Result<Option<mpib_proto::failback::FailbackSettings>, ParamError> {
    if parse_int(get, "MPIB_FAILBACK", 1, 0, 1)? == 0 {
        return Ok(None);
    }
    let hold_ms = parse_int(get, "MPIB_FAILBACK_HOLD_MS", 500, 1, 3_600_000)?;
    let max_ms = parse_int(get, "MPIB_FAILBACK_BACKOFF_MAX_MS", 30_000, 1, 86_400_000)?;
    let attempt_ms = parse_int(get, "MPIB_FAILBACK_ATTEMPT_MS", 2_000, 1, 600_000)?;
    if hold_ms > max_ms {
        return Err(invalid(
            "MPIB_FAILBACK_HOLD_MS",
            &hold_ms.to_string(),
            &format!("at most MPIB_FAILBACK_BACKOFF_MAX_MS ({max_ms})"),
        ));
    }
    let ns = |ms: u32| u64::from(ms) * 1_000_000;
    Ok(Some(mpib_proto::failback::FailbackSettings {
        hold_ns: ns(hold_ms),
        backoff_max_ns: ns(max_ms),
        attempt_ns: ns(attempt_ms),
    }))
}

/// A variable of user or group names, resolved by `parse` (whose error says what was expected).
fn parse_names<T>(
    get: &impl Fn(&str) -> Option<String>,
    name: &'static str,
    parse: impl Fn(&str) -> Result<T, String>,
) -> Result<Option<T>, ParamError> {
    get(name)
        .map(|text| {
            parse(&text).map_err(|why| invalid(name, &text, &format!("ids or names; {why}")))
        })
        .transpose()
}

fn parse_optional(
    get: &impl Fn(&str) -> Option<String>,
    name: &'static str,
    max: u32,
) -> Result<Option<u32>, ParamError> {
    match get(name) {
        None => Ok(None),
        Some(_) => parse_int(get, name, 0, 0, max).map(Some),
    }
}

#[cfg(test)]
#[path = "params_tests.rs"]
mod tests;
