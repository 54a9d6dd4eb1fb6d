//! The agent's configuration: paths from the plugin's own variables (so both sides agree), flags
//! that override them, and a TOML file of policies and rules that SIGHUP reloads.
//!
//! Why the plugin's variables: an agent and the jobs it serves must name the same hint file and
//! socket. A reload (SIGHUP) applies the policies, rules, rates, tuning and interval; the paths,
//! the control socket, the metrics address and the sysfs root are read at start only (a reload
//! that changes them logs that a restart is needed). Reading `MPIB_HINT_PATH`, `MPIB_AGENT_SOCKET`, `MPIB_AGENT_TAG` and `MPIB_PROBES_DIR`
//! through the plugin's own parser (`mpib_params::params`, the crate the plugin parses its settings with) means one definition of their defaults.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use mpib_proto::hint::HINT_MAX_ENTRIES;
use serde::Deserialize;

use crate::access::{parse_ids, Access, Kind};
use crate::policy::PolicyKind;
use crate::slots::FlowLimits;

/// The flow limits' range: at least one flow, at most every slot (no limit).
pub const FLOW_LIMIT_RANGE: std::ops::RangeInclusive<usize> = 1..=HINT_MAX_ENTRIES;

/// Checks a flow limit from `name` (a flag, variable or file key).
pub fn check_flow_limit(name: &str, value: usize) -> Result<usize, String> {
    if FLOW_LIMIT_RANGE.contains(&value) {
        Ok(value)
    } else {
        Err(format!(
            "{name} = {value}: expected {}..{} (flows; {} = no limit beyond the slots)",
            FLOW_LIMIT_RANGE.start(),
            FLOW_LIMIT_RANGE.end(),
            FLOW_LIMIT_RANGE.end()
        ))
    }
}

/// Where things are; fixed for the life of the process (a reload that changes them says a
/// restart is needed and keeps them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Paths {
    /// The hint file.
    pub hint_path: PathBuf,
    /// The registration socket.
    pub socket_path: PathBuf,
    /// The operators' control socket (`status`, `set`).
    pub control_path: PathBuf,
    /// Where the plugins' probes files are.
    pub probes_dir: PathBuf,
    /// The Prometheus endpoint, `None` when off.
    pub metrics_listen: Option<SocketAddr>,
    /// The sysfs root, `/sys` (NIC retransmission counters under `class/infiniband`), as
    /// `MPIB_SYSFS` names it for the plugin, the collector and `mpib-top`.
    pub sysfs: PathBuf,
}

/// The reloadable part.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Policies {
    /// Policy of flows no rule matches.
    pub default: PolicyKind,
    /// Measuring and deciding interval, ms.
    pub interval_ms: u64,
    /// Link rates that override what the devices report (shaped or emulated rails).
    pub rates: RateOverride,
    /// The adaptive loop's tuning.
    pub adaptive: AdaptiveTuning,
    /// Rules, first match wins.
    #[serde(rename = "rule")]
    pub rules: Vec<Rule>,
    /// Prometheus endpoint, `"off"` for none (read at start only; flag `--metrics-listen`).
    pub metrics_listen: Option<String>,
    /// Control socket (read at start only; flag `--control`).
    pub control_path: Option<PathBuf>,
    /// The sysfs root, `/sys` (read at start only; flag `--sysfs`).
    pub sysfs: Option<PathBuf>,
    /// Users who may register, uids or names, comma-separated (flag `--allowed-uids`).
    pub allowed_uids: Option<String>,
    /// Groups whose members (by the gid they connect with) may register (flag
    /// `--allowed-gids`).
    pub allowed_gids: Option<String>,
    /// Flows one process may have connections in (flag `--max-flows-per-process`): past it, a
    /// registration that needs a new slot is answered "no free slots" (slots.rs, `FlowLimits`).
    pub max_flows_per_process: usize,
    /// Flows the processes of one user may have connections in, together, while another user
    /// has connections (flag `--max-flows-per-user`; slots.rs, `FlowLimits`).
    pub max_flows_per_user: usize,
    /// The two lists resolved to ids, with the flags applied (`Options::load_policies`).
    #[serde(skip)]
    pub access: Access,
}

impl Default for Policies {
    fn default() -> Self {
        Policies {
            default: PolicyKind::Capacity,
            interval_ms: 100,
            rates: RateOverride::default(),
            adaptive: AdaptiveTuning::default(),
            rules: Vec::new(),
            metrics_listen: None,
            control_path: None,
            sysfs: None,
            allowed_uids: None,
            allowed_gids: None,
            max_flows_per_process: FlowLimits::DEFAULT.per_process,
            max_flows_per_user: FlowLimits::DEFAULT.per_user,
            access: Access::default(),
        }
    }
}

/// Configured link rates in Gbit/s (0 = use the device's).
#[derive(Clone, Copy, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RateOverride {
    /// SOUT rail.
    pub sout_gbps: f64,
    /// SUP rail.
    pub sup_gbps: f64,
}

/// The adaptive loop's knobs (docs/AGENT.md explains each).
#[derive(Clone, Copy, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdaptiveTuning {
    /// Share a new flow starts at (parts per 1024); 0 starts on the safe all-SOUT side.
    pub start_sup_bw: u32,
    /// Largest change per interval.
    pub max_step: u32,
    /// A change is made only when the rates predict at least this gain (a fraction; 0.01 is
    /// 1 %): the hysteresis that keeps measurement noise from moving the split.
    pub min_gain: f64,
    /// Share given to a rail that has no measurement yet, to measure it.
    pub probe_step: u32,
    /// When both rails together are more than this fraction below the best single rail, the flow
    /// goes to that rail.
    pub mixing_margin: f64,
    /// How long a single-rail or overload decision holds before the loop tries again, ms.
    pub hold_ms: u64,
    /// Without fresh telemetry for this long the loop holds; twice as long, it falls back to
    /// `capacity`, ms.
    pub stale_ms: u64,
    /// A rail whose rate relative to the other rail's falls below this fraction of the
    /// estimates' ratio for two intervals right after its share grew is treated as overloaded
    /// (a finish-time outlier).
    pub collapse_ratio: f64,
    /// NIC retransmissions per GB the flow completed on a rail above which the rail is treated
    /// as overloaded (the port's counters are shared with other flows: a few are noise).
    pub overload_retransmissions_per_gb: f64,
}

impl Default for AdaptiveTuning {
    fn default() -> Self {
        AdaptiveTuning {
            start_sup_bw: 0,
            max_step: 256,
            min_gain: 0.01,
            probe_step: 128,
            mixing_margin: 0.05,
            hold_ms: 10_000,
            stale_ms: 2_000,
            collapse_ratio: 0.5,
            overload_retransmissions_per_gb: 100.0,
        }
    }
}

/// A rule: flows whose SOUT pair (and path class, when given) match get its policy.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// SOUT source subnet, `a.b.c.d/len` (default: any).
    #[serde(default)]
    pub src: Option<String>,
    /// SOUT destination subnet.
    #[serde(default)]
    pub dst: Option<String>,
    /// `intra` or `inter` island (default: either).
    #[serde(default)]
    pub class: Option<String>,
    /// The policy.
    pub policy: PolicyKind,
    /// For `static`: the share, parts per 1024.
    #[serde(default)]
    pub sup_bw: Option<u32>,
}

/// An IPv4 subnet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Subnet {
    base: u32,
    prefix: u8,
}

impl Subnet {
    /// Parses `a.b.c.d/len` or a bare address (a /32).
    pub fn parse(text: &str) -> Result<Subnet, String> {
        let (address, prefix) = text.split_once('/').unwrap_or((text, "32"));
        let address: Ipv4Addr = address
            .trim()
            .parse()
            .map_err(|_| format!("{text:?} is not an IPv4 subnet like 10.0.0.0/24"))?;
        let prefix: u8 = prefix
            .trim()
            .parse()
            .ok()
            .filter(|p| *p <= 32)
            .ok_or_else(|| format!("{text:?}: the prefix length must be 0..32"))?;
        Ok(Subnet {
            base: u32::from(address) & mask(prefix),
            prefix,
        })
    }

    /// Whether `address` is inside.
    pub fn contains(&self, address: Ipv4Addr) -> bool {
        u32::from(address) & mask(self.prefix) == self.base
    }
}

fn mask(prefix: u8) -> u32 {
    if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(prefix))
    }
}

impl Policies {
    /// Parses and checks a TOML text; the error names the file's item that was wrong.
    pub fn from_toml(text: &str) -> Result<Policies, String> {
        if text
            .lines()
            .any(|line| line.trim_start().starts_with("sysfs_root"))
        {
            return Err(
                "sysfs_root is gone: delete the line for the default, or write `sysfs = \"DIR\"` \
                 with DIR the directory above class/infiniband (the sysfs root, as MPIB_SYSFS \
                 and --sysfs name it; docs/AGENT.md, \"Upgrading\")"
                    .into(),
            );
        }
        let mut policies: Policies = toml::from_str(text).map_err(|e| e.to_string())?;
        policies.check()?;
        let resolve = |key: &str, list: &Option<String>, kind| {
            list.as_deref()
                .map(|value| parse_ids(value, kind).map_err(|e| format!("{key}: {e}")))
                .transpose()
        };
        policies.access = Access {
            uids: resolve("allowed_uids", &policies.allowed_uids, Kind::Users)?,
            gids: resolve("allowed_gids", &policies.allowed_gids, Kind::Groups)?,
        };
        Ok(policies)
    }

    /// Reads `path`.
    pub fn load(path: &Path) -> Result<Policies, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("config {}: cannot read: {e}", path.display()))?;
        Policies::from_toml(&text).map_err(|e| format!("config {}: {e}", path.display()))
    }

    fn check(&self) -> Result<(), String> {
        if !(10..=60_000).contains(&self.interval_ms) {
            return Err(format!(
                "interval_ms = {}: expected 10..60000",
                self.interval_ms
            ));
        }
        check_flow_limit("max_flows_per_process", self.max_flows_per_process)?;
        check_flow_limit("max_flows_per_user", self.max_flows_per_user)?;
        let tuning = &self.adaptive;
        if tuning.start_sup_bw > 1024 || !(1..=1024).contains(&tuning.max_step) {
            return Err("adaptive: start_sup_bw must be 0..1024 and max_step 1..1024".into());
        }
        let fractions = [tuning.mixing_margin, tuning.collapse_ratio, tuning.min_gain];
        if !fractions.iter().all(|f| (0.0..1.0).contains(f)) {
            return Err(
                "adaptive: mixing_margin, collapse_ratio and min_gain must be in [0, 1)".into(),
            );
        }
        const DAY_MS: u64 = 86_400_000;
        if tuning.hold_ms > DAY_MS || tuning.stale_ms > DAY_MS {
            return Err("adaptive: hold_ms and stale_ms must be at most 86400000 (a day)".into());
        }
        let threshold = tuning.overload_retransmissions_per_gb;
        if threshold.is_nan() || threshold < 0.0 {
            return Err("adaptive: overload_retransmissions_per_gb must be 0 or more".into());
        }
        if self.rates.sout_gbps < 0.0 || self.rates.sup_gbps < 0.0 {
            return Err("rates: sout_gbps and sup_gbps must not be negative".into());
        }
        for (index, rule) in self.rules.iter().enumerate() {
            let at =
                |what: String| format!("rule {} ([[rule]] number {}): {what}", index, index + 1);
            for subnet in [&rule.src, &rule.dst].into_iter().flatten() {
                Subnet::parse(subnet).map_err(at)?;
            }
            if let Some(class) = &rule.class {
                if class != "intra" && class != "inter" {
                    return Err(at(format!(
                        "class = {class:?}: expected \"intra\" or \"inter\""
                    )));
                }
            }
            match (rule.policy, rule.sup_bw) {
                (PolicyKind::Static, Some(v)) if v <= 1024 => {}
                (PolicyKind::Static, _) => {
                    return Err(at("policy \"static\" needs sup_bw = 0..1024".into()))
                }
                (_, Some(_)) => return Err(at("sup_bw is only for policy \"static\"".into())),
                _ => {}
            }
        }
        Ok(())
    }

    /// The flow limits.
    pub fn flow_limits(&self) -> FlowLimits {
        FlowLimits {
            per_process: self.max_flows_per_process,
            per_user: self.max_flows_per_user,
        }
    }

    /// The interval as a duration.
    pub fn interval(&self) -> Duration {
        Duration::from_millis(self.interval_ms)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_full_file_parses() {
        let p = Policies::from_toml(
            r#"
            default = "adaptive"
            interval_ms = 50
            [rates]
            sout_gbps = 100
            sup_gbps = 200
            [adaptive]
            max_step = 128
            [[rule]]
            src = "10.0.0.0/24"
            dst = "10.0.1.7"
            policy = "static"
            sup_bw = 512
            [[rule]]
            class = "inter"
            policy = "capacity"
            "#,
        )
        .unwrap();
        assert_eq!(p.default, PolicyKind::Adaptive);
        assert_eq!(
            (p.rules.len(), p.adaptive.max_step, p.adaptive.hold_ms),
            (2, 128, 10_000)
        );
        let subnet = Subnet::parse("10.0.0.0/24").unwrap();
        assert!(subnet.contains(Ipv4Addr::new(10, 0, 0, 200)));
        assert!(!subnet.contains(Ipv4Addr::new(10, 0, 1, 1)));
        assert!(Subnet::parse("0.0.0.0/0")
            .unwrap()
            .contains(Ipv4Addr::new(1, 2, 3, 4)));
    }

    #[test]
    fn the_old_sysfs_key_is_refused_naming_the_new_one() {
        let error = Policies::from_toml("sysfs_root = \"/sys/class/infiniband\"\n").unwrap_err();
        assert!(error.contains("sysfs = "), "{error}");
        let policies = Policies::from_toml("sysfs = \"/fake\"\n").unwrap();
        assert_eq!(policies.sysfs, Some("/fake".into()));
    }

    #[test]
    fn the_packaged_example_parses_to_the_defaults() {
        let text = include_str!("../../packaging/agent.toml");
        let example = Policies::from_toml(text).unwrap();
        let defaults = Policies {
            metrics_listen: Some("127.0.0.1:9465".into()),
            ..Policies::default()
        };
        assert_eq!(example, defaults);
    }

    #[test]
    fn allowed_lists_resolve_names() {
        let p = Policies::from_toml("allowed_uids = \"root, 7\"\nallowed_gids = \"0\"").unwrap();
        assert_eq!(p.access.uids, Some([0, 7].into()));
        assert_eq!(p.access.gids, Some([0].into()));
        assert_eq!(Policies::default().access, Access::default());
    }

    #[test]
    fn flow_limits_come_from_the_file() {
        let p = Policies::from_toml("max_flows_per_process = 8\nmax_flows_per_user = 256").unwrap();
        assert_eq!(
            p.flow_limits(),
            FlowLimits {
                per_process: 8,
                per_user: 256
            }
        );
        assert_eq!(Policies::default().flow_limits(), FlowLimits::DEFAULT);
    }

    #[test]
    fn bad_files_name_the_item() {
        let cases = [
            ("default = \"fastest\"", "fastest"),
            ("interval_ms = 1", "interval_ms"),
            ("colour = 1", "colour"),
            ("[[rule]]\npolicy = \"static\"", "rule 0"),
            (
                "[[rule]]\nsrc = \"10.0.0.0/33\"\npolicy = \"capacity\"",
                "prefix",
            ),
            ("[[rule]]\nclass = \"near\"\npolicy = \"capacity\"", "near"),
            ("[[rule]]\npolicy = \"adaptive\"\nsup_bw = 3", "only for"),
            (
                "allowed_uids = \"root,nobody-mpib-x\"",
                "allowed_uids: no user named",
            ),
            ("allowed_gids = \"\"", "allowed_gids"),
            (
                "max_flows_per_process = 0",
                "max_flows_per_process = 0: expected 1..256",
            ),
            ("max_flows_per_user = 257", "max_flows_per_user = 257"),
            ("max_flows_per_user = -1", "max_flows_per_user"),
        ];
        for (text, needle) in cases {
            let error = Policies::from_toml(text).err().unwrap();
            assert!(error.contains(needle), "{text:?}: {error}");
        }
    }
}
