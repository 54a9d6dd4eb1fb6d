//! A topology: the hosts a case's processes run on, how a command reaches a host, and what can
//! be done to its wires. The cases ([`super::catalog`]) say what to run and judge; a topology
//! says where, so one case runs unchanged on the loopback, the bed and the rig.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::Settings;

/// Which topology, for a case's list of those it runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// One host, no network: collectives with every rank in one process.
    Loopback,
    /// Network namespaces over veth pairs, the tcp fabric.
    Bed,
    /// The Soft-RoCE VM: rxe NICs, the verbs fabric.
    Rig,
}

impl Kind {
    /// The name used on the command line and in records.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Loopback => "loopback",
            Kind::Bed => "bed",
            Kind::Rig => "rig",
        }
    }

    /// Whether a topology of this kind can make `cut` while a case runs: the bed's kernel has
    /// no netem, the rig cuts wires with netem rather than links, the loopback cuts a rail only
    /// from its start (`MPIB_LOOPBACK_FAULTS`).
    pub fn can(self, cut: Cut) -> bool {
        match self {
            Kind::Loopback => false,
            Kind::Bed => !matches!(cut, Cut::Impair(_)),
            Kind::Rig => cut != Cut::LinkDown,
        }
    }

    /// The kind named `name`.
    pub fn parse(name: &str) -> Option<Kind> {
        [Kind::Loopback, Kind::Bed, Kind::Rig]
            .into_iter()
            .find(|kind| kind.name() == name)
    }
}

/// What a case does to a rail's wire at host A's end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cut {
    /// The link goes down: a port event on the host, and on the peer where it is cabled back to
    /// back (a pulled cable).
    LinkDown,
    /// Every packet host A sends on the wire is dropped; the carrier stays up and the peer's
    /// packets still arrive, so only the QPs' retries find it.
    OneWay,
    /// A `netem` impairment for the whole run (the rig's kernel has netem; the bed's has not).
    Impair(&'static str),
}

impl Cut {
    /// How a case name says it.
    pub fn describe(self) -> String {
        match self {
            Cut::LinkDown => "link down".to_string(),
            Cut::OneWay => "cut one way".to_string(),
            Cut::Impair(netem) => format!("netem {netem}"),
        }
    }
}

/// One host: what its processes are told about their NICs, and how to reach it.
#[derive(Clone, Debug)]
pub struct Host {
    /// The network namespace its processes run in, if any.
    pub namespace: Option<String>,
    /// Its `MPIB_HCA_SOUT`, `MPIB_HCA_SUP` and `MPIB_OOB_ADDR`.
    pub settings: Settings,
    /// The network interface under each rail (SOUT, SUP), where cuts land.
    pub wires: [String; 2],
    /// Its address on each rail.
    pub addresses: [String; 2],
}

/// Sizes and deadlines that follow the topology's speed (the rig's emulated CPUs are slower).
#[derive(Clone, Debug)]
pub struct Timing {
    /// A process still running after this is killed (nothing may hang).
    pub process_limit: Duration,
    /// Data deadline of a receiver that may have nothing in flight at a cut.
    pub bounded_receiver_seconds: u32,
    /// Data deadline of a process that must see a fault or outlast one.
    pub data_seconds: u32,
    /// Cases of the flap, failback and killed pairs.
    pub flap_cases: usize,
    /// Cases of the failback pair (they must outlast the cut, the hold-down and the return).
    pub failback_cases: usize,
    /// Cases of the SOUT-only pair beside a fault (it must outlast the fault).
    pub bystander_cases: usize,
    /// `mpib-ranks` size flags for the collectives over rank processes.
    pub rank_sizes: &'static [&'static str],
}

/// What every topology has.
#[derive(Clone, Debug)]
pub struct Shared {
    /// Which kind it is.
    pub kind: Kind,
    /// Its hosts; host 0 is A (the sender of a pair), host 1 is B (the receiver).
    pub hosts: Vec<Host>,
    /// Settings every process gets (the fabric, probes), below the host's and the case's.
    pub base: Settings,
    /// Settings the caller added for every case (`--mpib`): over the host's, under the case's.
    pub every_case: Settings,
    /// The directory of the built binaries.
    pub bin: PathBuf,
    /// Its sizes and deadlines.
    pub timing: Timing,
}

/// Where a case's processes run and what can be done to their wires.
pub trait Topology {
    /// What it has.
    fn shared(&self) -> &Shared;
    /// Which kind this is.
    fn kind(&self) -> Kind {
        self.shared().kind
    }
    /// Its hosts; host 0 is A (the sender of a pair), host 1 is B (the receiver).
    fn hosts(&self) -> &[Host] {
        &self.shared().hosts
    }
    /// Its sizes and deadlines.
    fn timing(&self) -> &Timing {
        &self.shared().timing
    }
    /// Settings every process gets (the fabric, probes), below the host's and the case's.
    fn base(&self) -> &Settings {
        &self.shared().base
    }
    /// Arguments every `mpib-xfer` gets, before the case's own (which win).
    fn xfer_arguments(&self) -> Vec<String> {
        Vec::new()
    }
    /// The directory of the built binaries.
    fn bin(&self) -> &Path {
        &self.shared().bin
    }
    /// The plugin under its NCCL name.
    fn plugin(&self) -> PathBuf;
    /// A command that runs `program` on host `host`.
    fn command(&self, host: usize, program: &Path) -> Command {
        match &self.hosts()[host].namespace {
            Some(namespace) => {
                let mut command = Command::new("ip");
                command.args(["netns", "exec", namespace]).arg(program);
                command
            }
            None => Command::new(program),
        }
    }
    /// Applies `cut` to host `host`'s end of rail `rail`.
    fn cut(&self, host: usize, rail: usize, cut: Cut) -> Result<(), String>;
    /// Undoes any cut of that rail: back up, at its usual shaping.
    fn restore(&self, host: usize, rail: usize) -> Result<(), String>;
    /// Shapes the rails for a fault case, so that the run outlasts the fault whatever the CPU.
    fn fault_rates(&self) -> Result<(), String> {
        Ok(())
    }
    /// The rails back at their usual shaping.
    fn normal_rates(&self) -> Result<(), String> {
        Ok(())
    }
    /// Called before each case (the rig empties its neighbour tables, as after a boot).
    fn before_case(&self) {}
    /// A command that runs `program` on a third host that reaches host B's ports and nothing
    /// else, if the topology has one.
    fn stranger(&self, program: &Path) -> Result<Command, String> {
        let _ = program;
        Err(format!("the {} has no stranger host", self.kind().name()))
    }
    /// The collector binary, where a case should watch its metrics during a fault.
    fn collector(&self) -> Option<PathBuf> {
        None
    }
}

/// Runs `program args` to its end and turns a failure into a message naming the command.
pub fn run_command(program: &str, args: &[&str]) -> Result<(), String> {
    let output = Command::new(program)
        .args(args)
        .output()
        .map_err(|error| format!("{program}: {error}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`{program} {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// One host and no network: the ranks of a collective all in one process, on the loopback
/// fabric (its rails are in-process queues; a rail is cut by `MPIB_LOOPBACK_FAULTS`, set when
/// the process starts, since nothing outside can reach it).
pub struct Loopback {
    shared: Shared,
    plugin: PathBuf,
}

impl Loopback {
    /// The loopback topology over the binaries in `bin` and `plugin`, with `every_case` over its
    /// settings.
    pub fn new(bin: &Path, plugin: &Path, every_case: &Settings) -> Loopback {
        let host = Host {
            namespace: None,
            settings: Settings::default(),
            wires: ["sout".to_string(), "sup".to_string()],
            addresses: ["127.0.0.1".to_string(), "127.0.0.1".to_string()],
        };
        let timing = Timing {
            process_limit: Duration::from_secs(120),
            bounded_receiver_seconds: 6,
            data_seconds: 30,
            flap_cases: 8,
            failback_cases: 30,
            bystander_cases: 12,
            rank_sizes: &["--min-size", "4", "--max-size", "4M", "--step-factor", "16"],
        };
        let shared = Shared {
            kind: Kind::Loopback,
            hosts: vec![host],
            base: Settings::words("MPIB_FABRIC=loopback"),
            every_case: every_case.clone(),
            bin: bin.to_path_buf(),
            timing,
        };
        Loopback {
            shared,
            plugin: plugin.to_path_buf(),
        }
    }
}

impl Topology for Loopback {
    fn shared(&self) -> &Shared {
        &self.shared
    }
    fn plugin(&self) -> PathBuf {
        self.plugin.clone()
    }
    fn cut(&self, _: usize, _: usize, cut: Cut) -> Result<(), String> {
        Err(format!(
            "the loopback cannot {} a rail while it runs (MPIB_LOOPBACK_FAULTS at start does)",
            cut.describe()
        ))
    }
    fn restore(&self, _: usize, _: usize) -> Result<(), String> {
        Ok(())
    }
}
