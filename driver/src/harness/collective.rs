//! The collectives over several ranks (`mpib-ranks`): on the loopback every rank in one process
//! (one proxy loop for all), elsewhere one process per rank, spread over the hosts in turn so
//! that every ring connection crosses between hosts. Every result word is checked on every rank;
//! a case may cut a rail mid-collective (the ranks must fail it over and end exact, or all fail
//! with `MPIB_FAILOVER=0`) or kill a rank (every other rank gets the plugin's error, none hangs).

use std::time::Duration;

use super::logs::Log;
use super::pair::{arguments, cut, fault_rates, quick_errors, restore};
use super::process::{wait_until, Exit, Process};
use super::run::{Context, Outcome};
use super::topology::{Cut, Kind};
use super::{pause, Settings};

/// One collective case.
#[derive(Clone, Debug)]
pub struct RanksCase {
    /// `--op`: allreduce, alltoall or sendrecv.
    pub op: &'static str,
    /// How many ranks.
    pub ranks: usize,
    /// The table driven.
    pub version: &'static str,
    /// Channels (connections per peer and direction).
    pub channels: usize,
    /// Size flags; `None`: the topology's.
    pub sizes: Option<&'static [&'static str]>,
    /// Rows of results every rank must print, when known.
    pub rows: Option<usize>,
    /// A rail cut on host A's end 3 s in, left cut until every rank has ended.
    pub cut: Option<(usize, Cut)>,
    /// `MPIB_LOOPBACK_FAULTS` at start (the loopback's own cut).
    pub loopback_faults: Option<&'static str>,
    /// With `false`, `MPIB_FAILOVER=0`: a cut must fail every rank with the plugin's error.
    pub failover: bool,
    /// A rank to SIGKILL once every rank has connected.
    pub kill: Option<usize>,
}

impl RanksCase {
    /// A plain case: `op` over `ranks` ranks, 2 channels, through v12, nothing done to it.
    pub fn new(op: &'static str, ranks: usize) -> RanksCase {
        RanksCase {
            op,
            ranks,
            version: "v12",
            channels: 2,
            sizes: None,
            rows: None,
            cut: None,
            loopback_faults: None,
            failover: true,
            kill: None,
        }
    }
}

/// The rows of an nccl-tests-style table: size, count, type, redop, time, algbw, busbw, #wrong.
fn rows(log: &Log) -> Vec<Vec<String>> {
    log.lines_with("uint32")
        .map(|line| {
            line.split_whitespace()
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .filter(|fields| fields.len() == 8 && fields[2] == "uint32")
        .collect()
}

fn start(context: &Context<'_>, case: &RanksCase) -> Vec<Process> {
    let timing = context.topology.timing();
    let mut settings = Settings::words("MPIB_ISLAND_PREFIX_LEN=24");
    if case.cut.is_some() || case.kill.is_some() {
        settings = quick_errors(&settings);
    }
    if let Some(faults) = case.loopback_faults {
        settings.set("MPIB_LOOPBACK_FAULTS", faults);
    }
    if !case.failover {
        settings.set("MPIB_FAILOVER", "0");
    }
    let plugin = context.topology.plugin().display().to_string();
    let mut words = arguments(&[
        "--plugin",
        &plugin,
        "--op",
        case.op,
        "--version",
        case.version,
    ]);
    words.extend(arguments(&[
        "--ranks",
        &case.ranks.to_string(),
        "--channels",
        &case.channels.to_string(),
    ]));
    words.extend(arguments(case.sizes.unwrap_or(timing.rank_sizes)));
    words.extend(arguments(&[
        "--timeout",
        &(timing.data_seconds * 2).to_string(),
    ]));
    if context.topology.kind() == Kind::Loopback {
        return vec![context.start(0, "mpib-ranks", &settings, &words, "ranks.log")];
    }
    context.topology.before_case();
    let rendezvous = context.scratch_path("ring");
    let _ = std::fs::create_dir_all(&rendezvous);
    let hosts = context.topology.hosts().len();
    (0..case.ranks)
        .map(|rank| {
            let mut own = words.clone();
            own.extend(arguments(&[
                "--rank",
                &rank.to_string(),
                "--rendezvous",
                &rendezvous,
            ]));
            context.start(
                rank % hosts,
                "mpib-ranks",
                &settings,
                &own,
                &format!("rank{rank}.log"),
            )
        })
        .collect()
}

/// Runs one collective case.
pub fn run(context: &Context<'_>, case: &RanksCase) -> Outcome {
    let mut outcome = Outcome::default();
    // A cut or a kill must land mid-collective: the rails are slowed to the fault rate.
    let faulted = case.cut.is_some() || case.kill.is_some();
    if faulted && context.topology.kind() != Kind::Loopback {
        fault_rates(context, &mut outcome);
    }
    let mut processes = start(context, case);
    if let Some((rail, how)) = case.cut {
        // The ring is up within a second (every handle written, then connect and accept); the
        // cut lands a few collectives in (each takes about 0.6 s at the bed's fault rate).
        pause(Duration::from_secs(2));
        cut(context, rail, how, &mut outcome);
    }
    let mut victim_alive = false;
    if let Some(victim) = case.kill {
        let rendezvous = context.scratch.join("ring");
        let up = |rank: usize| rendezvous.join(format!("rank-{rank}.connected")).exists();
        let limit = context.topology.timing().process_limit;
        let mut all: Vec<&mut Process> = processes.iter_mut().collect();
        let connected = wait_until(&mut all, limit, || (0..case.ranks).all(up));
        outcome.require(connected, "the ranks never all connected");
        pause(Duration::from_millis(500));
        victim_alive = processes[victim].running();
        processes[victim].kill();
    }
    // No grace: a rank that never sees the failure is a hang, which its deadline shows.
    let exits: Vec<Exit> = processes.iter_mut().map(Process::wait).collect();
    if let Some((rail, _)) = case.cut {
        restore(context, rail, &mut outcome);
    }
    let logs: Vec<Log> = processes.iter().map(|p| Log::read(&p.log)).collect();
    for (index, process) in processes.iter().enumerate() {
        outcome
            .show
            .push((format!("rank process {index}"), process.log.clone()));
    }
    judge(case, &exits, &logs, victim_alive, &mut outcome);
    outcome
}

fn judge(
    case: &RanksCase,
    exits: &[Exit],
    logs: &[Log],
    victim_alive: bool,
    outcome: &mut Outcome,
) {
    let expect_failure = !case.failover || case.kill.is_some();
    for (index, (exit, log)) in exits.iter().zip(logs).enumerate() {
        let who = if exits.len() == 1 {
            "the process".to_string()
        } else {
            format!("rank {index}")
        };
        if case.kill == Some(index) {
            outcome.require(
                victim_alive && *exit == Exit::Signal(libc::SIGKILL),
                format!("{who} was not killed mid-collective (running: {victim_alive}, {exit})"),
            );
        } else if expect_failure {
            let reported = log.has("ncclRemoteError") || log.has("ncclSystemError");
            outcome.require(
                *exit == Exit::Code(1) && reported,
                format!(
                    "{who}: {exit}, expected exit 1 with the plugin's error: {}",
                    log.failure().unwrap_or("no FAILED line")
                ),
            );
        } else {
            outcome.require(
                exit.success(),
                format!(
                    "{who}: {exit}; {}",
                    log.failure().unwrap_or("no FAILED line")
                ),
            );
            if let Some(expected) = case.rows {
                let got = rows(log).len();
                outcome.require(
                    got == expected,
                    format!("{who}: {got} rows of results, expected {expected}"),
                );
            }
        }
    }
    let exact = logs.iter().filter(|log| log.has("PASS")).count();
    outcome.detail = if expect_failure {
        let failed = exits.iter().filter(|exit| **exit == Exit::Code(1)).count();
        format!("{failed} rank process(es) failed with the plugin's error, none hung")
    } else {
        format!(
            "{exact} of {} rank process(es) exact on every size",
            logs.len()
        )
    };
    if let Some(row) = logs.first().map(rows).and_then(|rows| rows.last().cloned()) {
        outcome.detail += &format!(
            ", largest: {} B {} GB/s algbw, {} GB/s busbw",
            row[0], row[5], row[6]
        );
    }
    if case.cut.is_some() || case.loopback_faults.is_some() {
        let over = logs
            .iter()
            .filter(|log| log.has("rail alone (failover)"))
            .count();
        if case.failover {
            outcome.require(over > 0, "no rank failed the cut rail over");
            outcome.detail += &format!(", {over} rank process(es) failed the cut rail over");
        }
    }
}
