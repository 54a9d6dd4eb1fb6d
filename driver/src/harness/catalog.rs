//! Every case, defined once: what it runs, what it checks (in the scenario), and the topologies
//! it runs on. A case whose fault a topology cannot make (netem on the bed, a link down in the
//! rig) lists only those that can; its twin with the other fault is named for what it does.

use super::collective::RanksCase;
use super::faults::Role;
use super::topology::{Cut, Kind};
use super::Settings;

/// What a case does.
#[derive(Clone, Debug)]
pub enum Scenario {
    /// Host B alone loads the plugin and listens: if not, nothing else can pass.
    Preflight,
    /// A pair walking `cases` byte-exact.
    Pair {
        /// The table.
        version: &'static str,
        /// mpib-xfer's `--cases`.
        cases: String,
        /// The case's settings.
        settings: Settings,
        /// mpib-xfer arguments of both sides.
        arguments: Vec<String>,
    },
    /// A rail cut mid-run and left cut: failover, every byte exact.
    Survive {
        /// The rail (0 SOUT, 1 SUP).
        rail: usize,
        /// How.
        cut: Cut,
        /// The mpib-xfer case run ten times.
        case: &'static str,
        /// The case's settings.
        settings: Settings,
    },
    /// A rail cut mid-run with nothing to fail over to: the error names the rail.
    Fault {
        /// The rail.
        rail: usize,
        /// How.
        cut: Cut,
        /// The mpib-xfer case run ten times.
        case: &'static str,
        /// The case's settings.
        settings: Settings,
        /// A SOUT-only pair beside it must go on.
        bystander: bool,
    },
    /// A rail cut for a while with the default retries: every byte arrives.
    Flap {
        /// The rail.
        rail: usize,
        /// How.
        cut: Cut,
        /// For how long.
        seconds: f64,
    },
    /// A rail cut for 1 s, then back: failed over, then brought back.
    Failback {
        /// The rail.
        rail: usize,
        /// How.
        cut: Cut,
    },
    /// One side SIGKILLed mid-run (after a rail's link went down, with `cut_first`).
    Killed {
        /// Which side.
        victim: Role,
        /// A rail taken down first.
        cut_first: Option<usize>,
    },
    /// A third host hammers the receiver's ports mid-run.
    Stranger,
    /// A collective over several ranks.
    Ranks(RanksCase),
    /// A netem impairment for a whole run.
    Impaired {
        /// The rail.
        rail: usize,
        /// netem's arguments.
        netem: &'static str,
    },
    /// Two fused devices per host.
    Devices,
    /// The verbs device test binaries.
    Tests,
    /// The main job.
    Demo,
}

/// A case: its name, where it runs, what it does.
#[derive(Clone, Debug)]
pub struct Case {
    /// The name in records (unique).
    pub name: String,
    /// The topologies it runs on.
    pub on: &'static [Kind],
    /// The hosts it needs, when not any.
    pub hosts: Option<usize>,
    /// What it does.
    pub scenario: Scenario,
}

const BED: &[Kind] = &[Kind::Bed];
const RIG: &[Kind] = &[Kind::Rig];
const BOTH: &[Kind] = &[Kind::Bed, Kind::Rig];
const LOOPBACK: &[Kind] = &[Kind::Loopback];

fn case(name: impl Into<String>, on: &'static [Kind], scenario: Scenario) -> Case {
    Case {
        name: name.into(),
        on,
        hosts: Some(2),
        scenario,
    }
}

fn words(text: &str) -> Vec<String> {
    text.split_whitespace().map(str::to_string).collect()
}

const INTRA: &str = "MPIB_ISLAND_PREFIX_LEN=24";
const INTER: &str = "MPIB_ISLAND_PREFIX_LEN=32";
const ADVANCED: &str = "MPIB_MODE=1 MPIB_ISLAND_PREFIX_LEN=24";
const VANILLA: &str = "sizes,larger,grouped,outstanding,pipeline";

fn pair(version: &'static str, cases: &str, settings: &str, arguments: &str) -> Scenario {
    Scenario::Pair {
        version,
        cases: cases.into(),
        settings: Settings::words(settings),
        arguments: words(arguments),
    }
}

/// The conformance pairs: every case for the tables both topologies run in full (v12, v8),
/// vanilla intra-island and one advanced split for the others on the bed.
fn pairs() -> Vec<Case> {
    let mut cases = Vec::new();
    for version in ["v12", "v11", "v10", "v9", "v8", "v7"] {
        let full = matches!(version, "v12" | "v8");
        let on = if full { BOTH } else { BED };
        cases.push(case(
            format!("{version} vanilla intra-island"),
            on,
            pair(version, VANILLA, INTRA, "--expect-class intra"),
        ));
        if !full {
            cases.push(case(
                format!("{version} advanced sup_bw=512"),
                BED,
                pair(version, "split-512", ADVANCED, "--expect-class intra"),
            ));
            continue;
        }
        cases.push(case(
            format!("{version} vanilla inter-island"),
            BOTH,
            pair(version, VANILLA, INTER, "--expect-class inter"),
        ));
        for bw in [0, 256, 512, 1024] {
            let split = format!("split-{bw}");
            cases.push(case(
                format!("{version} advanced sup_bw={bw}"),
                BOTH,
                pair(version, &split, ADVANCED, "--expect-class intra"),
            ));
        }
        cases.push(case(
            format!("{version} grouped receives (advanced, sup_bw=512)"),
            BOTH,
            pair(
                version,
                "grouped@512,outstanding@512",
                ADVANCED,
                "--expect-class intra",
            ),
        ));
    }
    cases
}

fn rail_label(rail: usize) -> &'static str {
    if rail == 0 {
        "SOUT"
    } else {
        "SUP"
    }
}

/// A cut case: the rail, how it is cut, what the name adds, the mpib-xfer case run ten times,
/// the case's settings, the topologies.
type CutRow = (
    usize,
    Cut,
    &'static str,
    &'static str,
    &'static str,
    &'static [Kind],
);

const DOWN: Cut = Cut::LinkDown;
const ONE_WAY: Cut = Cut::OneWay;
const ON_IT: &str = "advanced sup_bw=512, control connection on it";
const NO_FAILOVER: &str = "MPIB_ISLAND_PREFIX_LEN=24 MPIB_FAILOVER=0";
const NO_FAILOVER_ADVANCED: &str = "MPIB_MODE=1 MPIB_ISLAND_PREFIX_LEN=24 MPIB_FAILOVER=0";
const BESIDE: &str = "MPIB_FAILOVER=0, vanilla intra-island, a SOUT-only pair beside it";
const NONE_SURVIVES: &str = "vanilla inter-island: no rail survives";

/// Failover: the rail stays cut, every byte arrives over the other.
const SURVIVE: &[CutRow] = &[
    (1, DOWN, "vanilla intra-island", "sizes", INTRA, BED),
    (1, DOWN, "advanced sup_bw=512", "split-512", ADVANCED, BED),
    (0, DOWN, ON_IT, "split-512", ADVANCED, BED),
    (1, ONE_WAY, "vanilla intra-island", "sizes", INTRA, RIG),
    (
        1,
        ONE_WAY,
        "advanced sup_bw=512",
        "split-512",
        ADVANCED,
        BOTH,
    ),
    (0, ONE_WAY, ON_IT, "split-512", ADVANCED, RIG),
];

/// Faults: nothing to fail over to (the bystander pair runs beside the first two).
const FAULTS: &[CutRow] = &[
    (1, DOWN, BESIDE, "sizes", NO_FAILOVER, BED),
    (1, ONE_WAY, BESIDE, "sizes", NO_FAILOVER, RIG),
    (
        0,
        DOWN,
        "MPIB_FAILOVER=0, advanced sup_bw=512",
        "split-512",
        NO_FAILOVER_ADVANCED,
        BED,
    ),
    (
        0,
        ONE_WAY,
        "MPIB_FAILOVER=0, advanced sup_bw=512",
        "split-512",
        NO_FAILOVER_ADVANCED,
        RIG,
    ),
    (0, DOWN, NONE_SURVIVES, "sizes", INTER, BED),
    (0, ONE_WAY, NONE_SURVIVES, "sizes", INTER, BOTH),
];

/// The cuts: failover, fault (nothing to fail over to), flap and failback.
fn cuts() -> Vec<Case> {
    let mut cases = Vec::new();
    for &(rail, cut, what, case_name, settings, on) in SURVIVE {
        let name = format!(
            "v12 failover: {} {} mid-run, {what}",
            rail_label(rail),
            cut.describe()
        );
        let settings = Settings::words(settings);
        cases.push(case(
            name,
            on,
            Scenario::Survive {
                rail,
                cut,
                case: case_name,
                settings,
            },
        ));
    }
    for &(rail, cut, what, case_name, settings, on) in FAULTS {
        let name = format!(
            "v12 fault: {} {} mid-run, {what}",
            rail_label(rail),
            cut.describe()
        );
        let (settings, bystander) = (Settings::words(settings), what == BESIDE);
        let scenario = Scenario::Fault {
            rail,
            cut,
            case: case_name,
            settings,
            bystander,
        };
        cases.push(case(name, on, scenario));
    }
    for (rail, cut, on) in [
        (1, DOWN, BED),
        (0, DOWN, BED),
        (1, ONE_WAY, RIG),
        (0, ONE_WAY, RIG),
    ] {
        let name = format!(
            "v12 flap: {} {} 2.5 s, default retries",
            rail_label(rail),
            cut.describe()
        );
        cases.push(case(
            name,
            on,
            Scenario::Flap {
                rail,
                cut,
                seconds: 2.5,
            },
        ));
    }
    for (rail, cut, on) in [(1, DOWN, BED), (0, DOWN, BED), (1, ONE_WAY, BOTH)] {
        let name = format!(
            "v12 failback: {} {} 1 s, back while cases go on",
            rail_label(rail),
            cut.describe()
        );
        cases.push(case(name, on, Scenario::Failback { rail, cut }));
    }
    cases
}

fn ranks(name: &str, on: &'static [Kind], hosts: Option<usize>, ranks: RanksCase) -> Case {
    Case {
        name: name.into(),
        on,
        hosts,
        scenario: Scenario::Ranks(ranks),
    }
}

/// The collectives over rank processes, spread over the bed's and the rig's hosts.
fn across_hosts() -> Vec<Case> {
    let mut cases = every_table_across_hosts();
    cases.extend(faults_across_hosts());
    cases
}

/// A ring all-reduce over rank processes through every table: on the bed all of them, on the
/// rig those it runs in full (v12, v8). Each process unloads as NCCL does (no `finalize` before
/// v11).
fn every_table_across_hosts() -> Vec<Case> {
    let mut cases = vec![ranks(
        "v12 ranks: all-to-all over 4 rank processes, 2 per host",
        BOTH,
        Some(2),
        RanksCase::new("alltoall", 4),
    )];
    for version in ["v12", "v11", "v10", "v9", "v8", "v7"] {
        let on = if matches!(version, "v12" | "v8") {
            BOTH
        } else {
            BED
        };
        let name = format!("{version} ranks: ring all-reduce over 4 rank processes, 2 per host");
        cases.push(ranks(
            &name,
            on,
            Some(2),
            RanksCase {
                version,
                ..RanksCase::new("allreduce", 4)
            },
        ));
    }
    cases
}

/// Collectives with something done to them, and across more than two hosts.
fn faults_across_hosts() -> Vec<Case> {
    let cut: &'static [&'static str] = &["--min-size", "4M", "--max-size", "4M", "--iters", "10"];
    let long: &'static [&'static str] =
        &["--min-size", "16M", "--max-size", "16M", "--iters", "1000"];
    vec![
        ranks(
            "v12 ranks: ring all-reduce over 4 rank processes, SUP link down mid-collective",
            BED,
            Some(2),
            RanksCase {
                sizes: Some(cut),
                cut: Some((1, DOWN)),
                ..RanksCase::new("allreduce", 4)
            },
        ),
        ranks(
            "v12 ranks: a rank process SIGKILLed mid all-reduce, the others fail and none hangs",
            BED,
            Some(2),
            RanksCase {
                sizes: Some(long),
                kill: Some(1),
                ..RanksCase::new("allreduce", 4)
            },
        ),
        ranks(
            "v12 ranks: ring all-reduce over 6 rank processes on 3 hosts (a switch per rail)",
            BED,
            Some(3),
            RanksCase::new("allreduce", 6),
        ),
        ranks(
            "v12 ranks: all-to-all over 6 rank processes on 3 hosts (a switch per rail)",
            BED,
            Some(3),
            RanksCase::new("alltoall", 6),
        ),
    ]
}

/// The collectives with every rank in one process on the loopback: every ABI, many ranks'
/// connections in one batch, the loopback's own rail cut.
fn in_one_process() -> Vec<Case> {
    let mut cases = Vec::new();
    let six_sizes = Some(6);
    for version in ["v12", "v11", "v10", "v9", "v8", "v7"] {
        let name = format!("{version} ranks: ring all-reduce over 4 ranks in one process");
        let case = RanksCase {
            version,
            rows: six_sizes,
            ..RanksCase::new("allreduce", 4)
        };
        cases.push(ranks(&name, LOOPBACK, None, case));
    }
    for (op, what, version) in [
        ("alltoall", "all-to-all", "v12"),
        ("alltoall", "all-to-all", "v8"),
        ("sendrecv", "send/recv", "v12"),
        ("sendrecv", "send/recv", "v7"),
    ] {
        let name = format!("{version} ranks: {what} over 4 ranks in one process");
        cases.push(ranks(
            &name,
            LOOPBACK,
            None,
            RanksCase {
                version,
                rows: six_sizes,
                ..RanksCase::new(op, 4)
            },
        ));
    }
    let many: &'static [&'static str] = &[
        "--min-size",
        "48K",
        "--max-size",
        "3M",
        "--step-factor",
        "64",
        "--iters",
        "1",
    ];
    cases.push(ranks(
        "v12 ranks: all-to-all over 12 ranks in one process (132 connections each way in one batch)",
        LOOPBACK,
        None,
        RanksCase { channels: 1, sizes: Some(many), rows: Some(2), ..RanksCase::new("alltoall", 12) },
    ));
    let cut: &'static [&'static str] = &["--min-size", "1M", "--max-size", "4M", "--iters", "3"];
    for (failover, name) in [
        (
            true,
            "v12 ranks: SUP cut mid all-reduce in one process, failed over exactly",
        ),
        (
            false,
            "v12 ranks: SUP cut mid all-reduce in one process, MPIB_FAILOVER=0: every rank fails",
        ),
    ] {
        let faults = Some("cut=sup:40");
        let case = RanksCase {
            sizes: Some(cut),
            loopback_faults: faults,
            failover,
            ..RanksCase::new("allreduce", 3)
        };
        cases.push(ranks(name, LOOPBACK, None, case));
    }
    cases
}

/// Processes killed, the stranger, and the rig's own cases.
fn others() -> Vec<Case> {
    let mut cases = vec![
        case("v12 stranger: a third host scans, floods and forges hellos at the receiver's ports mid-run", BED, Scenario::Stranger),
        case("v12 killed: receiver process SIGKILLed mid-run", BOTH, Scenario::Killed { victim: Role::Receiver, cut_first: None }),
        case("v12 killed: sender process SIGKILLed mid-run", BOTH, Scenario::Killed { victim: Role::Sender, cut_first: None }),
        case(
            "v12 killed after failover: SOUT link down (the control connection's), then the sender SIGKILLed",
            BED,
            Scenario::Killed { victim: Role::Sender, cut_first: Some(0) },
        ),
        case(
            "v12 killed after failover: SOUT link down (the control connection's), then the receiver SIGKILLed",
            BED,
            Scenario::Killed { victim: Role::Receiver, cut_first: Some(0) },
        ),
    ];
    for rail in [0, 1] {
        for (what, netem) in [
            ("1 % loss", "loss 1%"),
            ("1 % corruption", "corrupt 1%"),
            ("10 ms delay", "delay 10ms"),
        ] {
            let name = format!("v12 impaired: {what} on {}", rail_label(rail));
            cases.push(case(name, RIG, Scenario::Impaired { rail, netem }));
        }
    }
    cases.push(case(
        "v12 devices: two NIC pairs per host, each device's traffic on its own NICs",
        RIG,
        Scenario::Devices,
    ));
    cases.push(case(
        "mpib-demo --fabric verbs (the main job)",
        RIG,
        Scenario::Demo,
    ));
    cases
}

/// Every case, in the order they run.
pub fn catalog() -> Vec<Case> {
    let mut cases = vec![
        case(
            "preflight: the fabric initialises and listens on host B",
            BED,
            Scenario::Preflight,
        ),
        case(
            "verbs device tests (tests/verbs_device.rs, the ignored fabric::verbs lib tests)",
            RIG,
            Scenario::Tests,
        ),
    ];
    cases.extend(pairs());
    cases.extend(cuts());
    cases.extend(across_hosts());
    cases.extend(in_one_process());
    cases.extend(others());
    cases
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_every_case_runs_somewhere_it_can() {
        let cases = catalog();
        let mut names: Vec<&str> = cases.iter().map(|c| c.name.as_str()).collect();
        names.sort_unstable();
        let before = names.len();
        names.dedup();
        assert_eq!(names.len(), before, "a case name is used twice");
        for case in &cases {
            assert!(!case.on.is_empty(), "{} runs nowhere", case.name);
            let cut = match &case.scenario {
                Scenario::Survive { cut, .. }
                | Scenario::Fault { cut, .. }
                | Scenario::Flap { cut, .. }
                | Scenario::Failback { cut, .. } => Some(*cut),
                _ => None,
            };
            if let Some(cut) = cut {
                for kind in case.on {
                    assert!(
                        kind.can(cut),
                        "{}: the {} cannot make it",
                        case.name,
                        kind.name()
                    );
                }
            }
        }
    }

    #[test]
    fn the_loopback_runs_every_table() {
        let loopback: Vec<String> = catalog()
            .into_iter()
            .filter(|c| c.on.contains(&Kind::Loopback))
            .map(|c| c.name)
            .collect();
        for version in ["v7", "v8", "v9", "v10", "v11", "v12"] {
            assert!(
                loopback
                    .iter()
                    .any(|name| name.starts_with(&format!("{version} "))),
                "{version}"
            );
        }
    }
}
