//! The rank-pair cases: a receiver (`mpib-xfer --role recv`) on host B and a sender on host A
//! walking the shared conformance cases (src/cases.rs) byte-exact, with nothing done to them, or
//! with a rail cut that they must survive (failover) or report (fault). The flaps, failbacks,
//! killed processes and the stranger are in [`super::faults`].

use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::catalog::Scenario;
use super::faults;
use super::logs::Log;
use super::process::{reap, wait_until, Exit, Process};
use super::run::{repeat, require_success, Context, Outcome};
use super::topology::Cut;
use super::Settings;

/// Host A sends, host B receives.
pub const SENDER: usize = 0;
/// Host B.
pub const RECEIVER: usize = 1;
/// Once one side failed, the other gets this long to see it before it is stopped.
pub const GRACE: Duration = Duration::from_secs(10);

/// What one pair runs.
#[derive(Clone, Debug, Default)]
pub struct Launch {
    /// The table (`v12`, ...).
    pub version: &'static str,
    /// mpib-xfer's `--cases`.
    pub cases: String,
    /// The case's settings.
    pub settings: Settings,
    /// Arguments of both sides.
    pub arguments: Vec<String>,
    /// Arguments of the receiver only.
    pub receiver: Vec<String>,
    /// Arguments of the sender only.
    pub sender: Vec<String>,
    /// A subdirectory for a second pair of the same case ("" for the case's own).
    pub sub: &'static str,
    /// Settings of one host only, over the case's: [host A's, host B's].
    pub host_settings: [Settings; 2],
}

/// A running pair.
pub struct Pair {
    /// Host B's process.
    pub receiver: Process,
    /// Host A's process.
    pub sender: Process,
}

impl Pair {
    /// Both logs as they are now: (receiver, sender).
    pub fn logs(&self) -> (Log, Log) {
        (Log::read(&self.receiver.log), Log::read(&self.sender.log))
    }

    /// Waits until the sender has passed its first case, or either side has ended (60 s, or the
    /// topology's process limit, at most).
    pub fn first_case_done(&mut self, limit: Duration) {
        let log = self.sender.log.clone();
        wait_until(&mut [&mut self.receiver, &mut self.sender], limit, || {
            Log::read(&log).cases_passed() > 0
        });
    }

    /// Waits for both; once one failed, the other gets [`GRACE`]. (receiver, sender) exits.
    pub fn reap(&mut self) -> (Exit, Exit) {
        let exits = reap(&mut [&mut self.receiver, &mut self.sender], GRACE);
        (exits[0], exits[1])
    }

    /// Whether both still run.
    pub fn both_running(&mut self) -> bool {
        self.receiver.running() && self.sender.running()
    }
}

/// Words as owned arguments.
pub fn arguments(words: &[&str]) -> Vec<String> {
    words.iter().map(|word| word.to_string()).collect()
}

/// Starts a pair: the receiver first, then the sender, sharing a handle file and an agent socket
/// in the case's scratch directory.
pub fn launch(context: &Context<'_>, spec: &Launch) -> Pair {
    // Every pair starts as the first connection of a boot would (the rig: no neighbours known).
    context.topology.before_case();
    let scratch = context.scratch.join(spec.sub);
    let _ = std::fs::create_dir_all(&scratch);
    let _ = std::fs::create_dir_all(context.dir.join(spec.sub));
    let path = |name: &str| scratch.join(name).display().to_string();
    let mut settings = Settings::default();
    settings.set("MPIB_AGENT_SOCKET", &path("agent.sock"));
    settings.set("MPIB_HINT_PATH", &path("hints"));
    let settings = settings.with(&spec.settings);
    let plugin = context.topology.plugin().display().to_string();
    let start = |role: &str, host: usize, own: &[String]| {
        let mut words = context.topology.xfer_arguments();
        words.extend(arguments(&["--role", role, "--version", spec.version]));
        words.extend(arguments(&[
            "--handle-file",
            &path("handle"),
            "--plugin",
            &plugin,
        ]));
        words.extend(arguments(&["--cases", &spec.cases]));
        words.extend(spec.arguments.iter().cloned());
        words.extend(own.iter().cloned());
        let log = PathBuf::from(spec.sub).join(format!("{role}.log"));
        let own_settings = settings.with(&spec.host_settings[host]);
        context.start(
            host,
            "mpib-xfer",
            &own_settings,
            &words,
            &log.display().to_string(),
        )
    };
    let receiver = start("recv", RECEIVER, &spec.receiver);
    let sender = start("send", SENDER, &spec.sender);
    Pair { receiver, sender }
}

/// The common verdict: both sides exited 0, no connection call waited; the logs are shown on a
/// failure. Returns the logs and "slowest call ..., connection ...".
pub fn judge(
    context: &Context<'_>,
    pair: &Pair,
    exits: (Exit, Exit),
    outcome: &mut Outcome,
) -> (Log, Log) {
    let (receiver, sender) = pair.logs();
    require_success(outcome, "receiver (host B)", exits.0, &receiver);
    require_success(outcome, "sender (host A)", exits.1, &sender);
    show(pair, outcome);
    let calls =
        context.check_connection_calls(&[("host B", &receiver), ("host A", &sender)], outcome);
    let slowest = super::logs::slowest_of(
        "slowest call",
        &[("host B", &receiver), ("host A", &sender)],
    );
    outcome.detail.push_str(&format!(
        ", slowest call {}, {calls}",
        super::logs::describe_slowest(&slowest)
    ));
    (receiver, sender)
}

/// Shows both logs' tails on a failure.
pub fn show(pair: &Pair, outcome: &mut Outcome) {
    outcome
        .show
        .push(("receiver (host B)".into(), pair.receiver.log.clone()));
    outcome
        .show
        .push(("sender (host A)".into(), pair.sender.log.clone()));
}

/// Cuts host A's end of `rail`, or records why it could not.
pub fn cut(context: &Context<'_>, rail: usize, how: Cut, outcome: &mut Outcome) {
    if let Err(error) = context.topology.cut(SENDER, rail, how) {
        outcome.problems.push(format!(
            "could not cut the rail, so nothing was tested: {error}"
        ));
    }
}

/// Undoes [`cut`].
pub fn restore(context: &Context<'_>, rail: usize, outcome: &mut Outcome) {
    if let Err(error) = context.topology.restore(SENDER, rail) {
        outcome
            .problems
            .push(format!("could not restore the rail: {error}"));
    }
}

/// Shapes the rails for a fault case, or records why it could not.
pub fn fault_rates(context: &Context<'_>, outcome: &mut Outcome) {
    if let Err(error) = context.topology.fault_rates() {
        outcome
            .problems
            .push(format!("could not shape the rails: {error}"));
    }
}

/// The rail's name in the plugin's messages.
pub fn rail_name(rail: usize) -> &'static str {
    if rail == 0 {
        "sout"
    } else {
        "sup"
    }
}

/// Seconds since `at`, one decimal.
pub fn since(at: Instant) -> String {
    format!("{:.1}", at.elapsed().as_secs_f64())
}

/// Runs a pair scenario.
pub fn run(context: &Context<'_>, scenario: &Scenario) -> Outcome {
    match scenario {
        Scenario::Preflight => preflight(context),
        Scenario::Pair {
            version,
            cases,
            settings,
            arguments,
        } => plain(context, version, cases, settings, arguments),
        Scenario::Survive {
            rail,
            cut,
            case,
            settings,
        } => survive(context, *rail, *cut, case, settings),
        Scenario::Fault {
            rail,
            cut,
            case,
            settings,
            bystander,
        } => faults::fault(context, *rail, *cut, case, settings, *bystander),
        Scenario::Flap { rail, cut, seconds } => faults::flap(context, *rail, *cut, *seconds),
        Scenario::Failback { rail, cut } => faults::failback(context, *rail, *cut),
        Scenario::Killed { victim, cut_first } => faults::killed(context, *victim, *cut_first),
        Scenario::Stranger => faults::stranger(context),
        _ => Outcome {
            problems: vec!["not a pair scenario".to_string()],
            ..Outcome::default()
        },
    }
}

/// Host B's side alone must load the plugin, initialise its fabric and listen (mpib-xfer
/// describes the net only then); if not, every case would fail the same way.
fn preflight(context: &Context<'_>) -> Outcome {
    let mut outcome = Outcome::default();
    let words = arguments(&[
        "--role",
        "recv",
        "--handle-file",
        &context.scratch_path("handle"),
        "--plugin",
        &context.topology.plugin().display().to_string(),
        "--connect-timeout",
        "0.5",
    ]);
    let mut receiver = context.start(
        RECEIVER,
        "mpib-xfer",
        &Settings::default(),
        &words,
        "recv.log",
    );
    receiver.wait();
    let log = Log::read(&receiver.log);
    let sout = context.topology.hosts()[RECEIVER]
        .settings
        .get("MPIB_HCA_SOUT")
        .unwrap_or("");
    match log.lines_with("device \"").next() {
        Some(line) if line.contains(sout) => {
            let device = &line[line.find("device \"").unwrap_or(0)..];
            outcome.detail = device.split(')').next().unwrap_or(device).to_string();
        }
        _ => {
            outcome.problems.push(format!(
                "host B's side did not describe a device on {sout}: {}",
                log.failure().unwrap_or("no FAILED line")
            ));
            outcome
                .show
                .push(("receiver (host B)".into(), receiver.log.clone()));
        }
    }
    outcome
}

fn plain(
    context: &Context<'_>,
    version: &'static str,
    cases: &str,
    settings: &Settings,
    extra: &[String],
) -> Outcome {
    let mut outcome = Outcome::default();
    let mut pair = launch(
        context,
        &Launch {
            version,
            cases: cases.to_string(),
            settings: settings.clone(),
            arguments: extra.to_vec(),
            ..Launch::default()
        },
    );
    let exits = pair.reap();
    let (receiver, _) = pair.logs();
    outcome.detail = format!("{} verified by the receiver", receiver.rails_summary());
    judge(context, &pair, exits, &mut outcome);
    outcome
}

/// Settings every fault case adds: an error about 0.5 s after a cut (4.096 us x 2^14 x 7), and
/// a retry count below 7, which rxe takes as "retry forever".
pub fn quick_errors(settings: &Settings) -> Settings {
    settings.with(&Settings::words("MPIB_IB_TIMEOUT=14 MPIB_IB_RETRY_CNT=6"))
}

/// Ten CASEs whose rail is cut once the sender has passed the first, until both have ended.
/// With failover every case must pass byte-exact over the other rail and both sides must say
/// they failed the cut rail over. The bytes per rail follow the split only until then.
fn survive(
    context: &Context<'_>,
    rail: usize,
    how: Cut,
    case: &str,
    settings: &Settings,
) -> Outcome {
    let mut outcome = Outcome::default();
    fault_rates(context, &mut outcome);
    let timing = context.topology.timing();
    let data = timing.data_seconds.to_string();
    let mut pair = launch(
        context,
        &Launch {
            version: "v12",
            cases: repeat(case, 10),
            settings: quick_errors(settings),
            arguments: arguments(&["--scale", "rig", "--data-timeout", &data, "--no-rail-check"]),
            ..Launch::default()
        },
    );
    pair.first_case_done(timing.process_limit);
    cut(context, rail, how, &mut outcome);
    let cut_at = Instant::now();
    let exits = pair.reap();
    restore(context, rail, &mut outcome);
    let (receiver, sender) = pair.logs();
    let name = rail_name(rail);
    outcome.detail = format!(
        "{} case(s) verified byte-exact by the receiver, done {} s after the cut",
        receiver.cases_passed(),
        since(cut_at)
    );
    let rail_words = format!("{name} rail");
    let both = sender.has_in_order(&rail_words, "rail alone (failover)")
        && receiver.has_in_order(&rail_words, "rail alone (failover)");
    outcome.require(
        both,
        format!("not failed over from the {name} rail on both sides"),
    );
    judge(context, &pair, exits, &mut outcome);
    outcome
}
