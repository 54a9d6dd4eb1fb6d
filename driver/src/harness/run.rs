//! Running cases: a context per case (its log directory, a short scratch directory for handles
//! and sockets, a way to start processes on the topology's hosts), the outcome a scenario
//! returns, and the loop that filters, runs and records the catalog.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::catalog::{Case, Scenario};
use super::logs::{describe_slowest, slowest_of, Log};
use super::process::{Exit, Process};
use super::record::{Record, Results};
use super::topology::Topology;
use super::{collective, pair, rig_cases, slug, stopping, Settings};

/// What the whole run was asked for.
pub struct Options {
    /// Only cases whose name matches.
    pub only: Option<regex::Regex>,
    /// A connection call this slow fails its case (0: off).
    pub max_call_milliseconds: f64,
    /// Logs and records go here (emptied first).
    pub work: PathBuf,
    /// Handles, sockets and rendezvous go here (short paths: a unix socket's is bounded).
    pub scratch: PathBuf,
    /// The verbs device test binaries the rig runs: (case name, binary, its arguments).
    pub test_binaries: Vec<(String, PathBuf, Vec<String>)>,
}

/// What a scenario found.
#[derive(Debug, Default)]
pub struct Outcome {
    /// What it measured (the record's detail on a pass).
    pub detail: String,
    /// Everything that was wrong; the case passes when there is nothing.
    pub problems: Vec<String>,
    /// Logs whose tails a failure shows: (who, path).
    pub show: Vec<(String, PathBuf)>,
}

impl Outcome {
    /// Adds a problem unless `holds`.
    pub fn require(&mut self, holds: bool, problem: impl Into<String>) {
        if !holds {
            self.problems.push(problem.into());
        }
    }
}

/// One case's surroundings.
pub struct Context<'a> {
    /// Where it runs.
    pub topology: &'a dyn Topology,
    /// Its log directory.
    pub dir: PathBuf,
    /// Its scratch directory.
    pub scratch: PathBuf,
    /// A connection call this slow fails it (0: off).
    pub max_call_milliseconds: f64,
}

impl Context<'_> {
    /// Starts `program` (a file in the topology's bin) on `host` with exactly the topology's,
    /// the host's and `settings`' `MPIB_*` variables (none of the harness's own), `arguments`,
    /// and its output in `log` (in the case's directory).
    pub fn start(
        &self,
        host: usize,
        program: &str,
        settings: &Settings,
        arguments: &[String],
        log: &str,
    ) -> Process {
        self.start_limited(
            host,
            program,
            settings,
            arguments,
            log,
            self.topology.timing().process_limit,
        )
    }

    /// [`Context::start`] with its own deadline; `program` may also be an absolute path.
    pub fn start_limited(
        &self,
        host: usize,
        program: &str,
        settings: &Settings,
        arguments: &[String],
        log: &str,
        limit: Duration,
    ) -> Process {
        let program = self.topology.bin().join(program);
        let mut command = self.topology.command(host, &program);
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("MPIB_") {
                command.env_remove(key);
            }
        }
        let shared = self.topology.shared();
        let layered = shared
            .base
            .with(&shared.hosts[host].settings)
            .with(&shared.every_case)
            .with(settings);
        layered.apply(&mut command);
        command.args(arguments);
        Process::start(command, &self.dir.join(log), limit)
    }

    /// A path in the case's scratch directory.
    pub fn scratch_path(&self, name: &str) -> String {
        self.scratch.join(name).display().to_string()
    }

    /// Fails the outcome when a connection call in `logs` took the limit or longer: NCCL's
    /// proxy thread must never wait inside one. Returns "connection <slowest>".
    pub fn check_connection_calls(&self, logs: &[(&str, &Log)], outcome: &mut Outcome) -> String {
        let slowest = slowest_of("slowest connection call", logs);
        let over = slowest.as_ref().is_some_and(|(s, _)| {
            self.max_call_milliseconds > 0.0 && s.milliseconds >= self.max_call_milliseconds
        });
        if over {
            outcome.problems.push(format!(
                "a connection call took {}, over the limit of {} ms",
                describe_slowest(&slowest),
                self.max_call_milliseconds
            ));
        }
        format!("connection {}", describe_slowest(&slowest))
    }
}

/// Requires `exit` to be a success, naming `who`.
pub fn require_success(outcome: &mut Outcome, who: &str, exit: Exit, log: &Log) {
    if !exit.success() {
        let why = log.failure().unwrap_or("no FAILED line");
        outcome.problems.push(format!(
            "{who}: {exit} (143 or signal 9: stopped after the peer failed); {why}"
        ));
    }
}

fn run_one(topology: &dyn Topology, case: &Case, options: &Options, index: usize) -> Record {
    let dir = options.work.join(slug(&case.name));
    let scratch = options.scratch.join(format!("c{index}"));
    let started = Instant::now();
    let mut outcome = Outcome::default();
    if let Err(error) = std::fs::create_dir_all(&dir).and(std::fs::create_dir_all(&scratch)) {
        outcome
            .problems
            .push(format!("cannot create {}: {error}", dir.display()));
    } else {
        topology.before_case();
        // Every case starts from the topology's usual shaping, whatever the one before it left.
        if let Err(error) = topology.normal_rates() {
            outcome
                .problems
                .push(format!("could not shape the rails: {error}"));
        }
        let context = Context {
            topology,
            dir: dir.clone(),
            scratch,
            max_call_milliseconds: options.max_call_milliseconds,
        };
        let found = run_scenario(&context, &case.scenario, options);
        outcome.detail = found.detail;
        outcome.problems.extend(found.problems);
        outcome.show = found.show;
    }
    if stopping() {
        outcome.problems.push("interrupted".to_string());
    }
    let passed = outcome.problems.is_empty();
    let detail = if passed {
        outcome.detail
    } else {
        format!("{} ({})", outcome.problems.join("; "), outcome.detail)
    };
    Record {
        case: case.name.clone(),
        passed,
        detail: format!("{detail}, {:.1} s", started.elapsed().as_secs_f64()),
        seconds: started.elapsed().as_secs_f64(),
        logs: dir,
        show: outcome.show,
    }
}

fn run_scenario(context: &Context<'_>, scenario: &Scenario, options: &Options) -> Outcome {
    match scenario {
        Scenario::Ranks(ranks) => collective::run(context, ranks),
        Scenario::Devices | Scenario::Impaired { .. } | Scenario::Demo => {
            rig_cases::run(context, scenario)
        }
        Scenario::Tests => rig_cases::tests(context, &options.test_binaries),
        _ => pair::run(context, scenario),
    }
}

/// Runs every case of `cases` that is on this topology, fits its hosts and matches `only`;
/// records each. Stops starting cases once the harness is stopping, or when the preflight
/// fails, since every other case would fail the same way; returns false then (no other
/// topology should run either).
pub fn run_cases(
    topology: &dyn Topology,
    cases: &[Case],
    options: &Options,
    results: &mut Results,
) -> bool {
    let hosts = topology.hosts().len();
    for (index, case) in cases.iter().enumerate() {
        if stopping() {
            break;
        }
        let fits = case.on.contains(&topology.kind()) && case.hosts.map_or(true, |h| h == hosts);
        let wanted = options
            .only
            .as_ref()
            .map_or(true, |only| only.is_match(&case.name));
        if !fits || !(wanted || matches!(case.scenario, Scenario::Preflight)) {
            continue;
        }
        let record = run_one(topology, case, options, index);
        let preflight_failed = !record.passed && matches!(case.scenario, Scenario::Preflight);
        results.add(&record);
        if preflight_failed {
            return false;
        }
    }
    !stopping()
}

/// `count` copies of `case`, comma-separated (an mpib-xfer case list).
pub fn repeat(case: &str, count: usize) -> String {
    vec![case; count].join(",")
}

/// Waits `limit` at most for a line containing `needle` in `log`, while `process` runs.
pub fn wait_for_line(log: &Path, needle: &str, process: &mut Process, limit: Duration) -> bool {
    super::process::wait_until(&mut [process], limit, || Log::read(log).has(needle))
}
