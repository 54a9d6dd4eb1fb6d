//! The pair cases where something happens to the wire or a process: a rail cut that must be
//! reported (fault), a flap that must be ridden out, a failback, a killed process, and a stranger
//! hammering the receiver's ports.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use super::logs::Log;
use super::pair::{
    arguments, cut, fault_rates, judge, launch, quick_errors, rail_name, restore, show, since,
    Launch, Pair, GRACE,
};
use super::process::{reap, Process};
use super::run::{repeat, require_success, wait_for_line, Context, Outcome};
use super::topology::Cut;
use super::{pause, Settings};

/// Which side of a pair a case kills.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Host B's `mpib-xfer --role recv`.
    Receiver,
    /// Host A's `mpib-xfer --role send`.
    Sender,
}

/// Ten CASEs whose rail is cut once the sender has passed the first. The sender must get the
/// plugin's error naming the cut rail; the receiver too, or, with nothing in flight, its run ends
/// at its data deadline. The rail comes back once the sender has ended, so that the receiver sees
/// the sender's sockets close. With `bystander`, a SOUT-only pair (vanilla inter-island) runs
/// beside it from before the cut to after it and must pass byte-exact: the other comms go on.
/// Where the topology has a collector, it must show the sender's error completions on the cut
/// rail while they happen (what the MpibErrorCompletions alert watches).
pub fn fault(
    context: &Context<'_>,
    rail: usize,
    how: Cut,
    case: &str,
    settings: &Settings,
    bystander: bool,
) -> Outcome {
    let mut outcome = Outcome::default();
    let started = Instant::now();
    fault_rates(context, &mut outcome);
    let timing = context.topology.timing();
    let mut beside = bystander.then(|| {
        launch(
            context,
            &Launch {
                version: "v12",
                cases: repeat("sizes", timing.bystander_cases),
                settings: Settings::words("MPIB_ISLAND_PREFIX_LEN=32"),
                arguments: arguments(&["--scale", "rig", "--expect-class", "inter"]),
                sub: "bystander",
                ..Launch::default()
            },
        )
    });
    let collector = context.topology.collector();
    let bounded = timing.bounded_receiver_seconds.to_string();
    let data = timing.data_seconds.to_string();
    let mut sender = arguments(&["--expect-error", "plugin", "--data-timeout", &data]);
    if collector.is_some() {
        // Its probes file outlives the error long enough for the collector to read it.
        sender.extend(arguments(&["--linger", "4"]));
    }
    let mut pair = launch(
        context,
        &Launch {
            version: "v12",
            cases: repeat(case, 10),
            settings: quick_errors(settings),
            arguments: arguments(&["--scale", "rig"]),
            receiver: arguments(&["--expect-error", "bounded", "--data-timeout", &bounded]),
            sender,
            ..Launch::default()
        },
    );
    pair.first_case_done(timing.process_limit);
    cut(context, rail, how, &mut outcome);
    let cut_at = Instant::now();
    let beside_ran = beside.as_mut().is_some_and(|b| b.sender.running());
    let name = rail_name(rail);
    let seen = collector.map(|bin| watch_error_completions(context, &bin, name, &mut pair.sender));
    let sender_exit = pair.sender.wait();
    let sender_seconds = since(cut_at);
    restore(context, rail, &mut outcome);
    let receiver_exit = pair.receiver.wait();
    let (receiver_log, sender_log) =
        judge(context, &pair, (receiver_exit, sender_exit), &mut outcome);
    let error = sender_log.nccl_error().unwrap_or_else(|| "no error".into());
    let mut detail = format!("sender: {error} {sender_seconds} s after the cut");
    let named = sender_log.has(&format!("{name} rail ("));
    outcome.require(
        named,
        format!("the sender's error does not name the {name} rail"),
    );
    match seen {
        Some(Some(count)) => {
            detail +=
                &format!(", the collector showed {count} error completion(s) on the {name} rail")
        }
        Some(None) => outcome.problems.push(format!(
            "the collector never showed an error completion on the {name} rail"
        )),
        None => {}
    }
    if let Some(beside) = beside {
        judge_bystander(beside, beside_ran, &mut detail, &mut outcome);
    }
    if receiver_log.has("reported the failure as expected") {
        detail += &format!(
            ", receiver: {}",
            receiver_log.nccl_error().unwrap_or_default()
        );
    } else {
        detail += ", receiver: nothing in flight, stopped at its deadline";
    }
    outcome.detail = format!(
        "{detail}; both exited {} s after the cut, {} s in all{}",
        since(cut_at),
        since(started),
        outcome.detail
    );
    outcome
}

/// The SOUT-only pair beside a fault must have been running at the cut and pass byte-exact.
fn judge_bystander(mut beside: Pair, ran: bool, detail: &mut String, outcome: &mut Outcome) {
    let exits = beside.reap();
    let (receiver, _) = beside.logs();
    let went_on = exits.0.success() && exits.1.success() && ran;
    outcome.require(
        went_on,
        format!(
            "the SOUT-only pair beside it failed ({} / {}, running at the cut: {ran})",
            exits.0, exits.1
        ),
    );
    if went_on {
        *detail += &format!(
            ", the SOUT-only pair beside it went on ({} verified)",
            receiver.rails_summary()
        );
    } else {
        outcome
            .show
            .push(("bystander receiver".into(), beside.receiver.log.clone()));
        outcome
            .show
            .push(("bystander sender".into(), beside.sender.log.clone()));
    }
}

/// Polls the collector (`--once`) while `sender` runs until it shows a non-zero
/// `mpib_rail_error_completions_total` of the sender's own process on `rail`.
fn watch_error_completions(
    context: &Context<'_>,
    collector: &Path,
    rail: &str,
    sender: &mut Process,
) -> Option<String> {
    let probes = context.topology.base().get("MPIB_PROBES_DIR")?.to_string();
    let pid = format!("pid=\"{}\"", sender.pid()?);
    let rail = format!("rail=\"{rail}\"");
    while sender.running() {
        let output = Command::new(collector)
            .args(["--probes-dir", &probes, "--once"])
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&output.stdout);
        let found = text.lines().find_map(|line| {
            let wanted = line.starts_with("mpib_rail_error_completions_total{")
                && line.contains(&rail)
                && line.contains(&pid);
            let value = line.split_whitespace().last()?.parse::<f64>().ok()?;
            (wanted && value > 0.0).then(|| value.to_string())
        });
        if found.is_some() {
            return found;
        }
        pause(Duration::from_millis(300));
    }
    None
}

/// An advanced pair at sup_bw=512 (both rails carry data) with the plugin's default retries whose
/// rail is cut for `seconds` once the sender has passed its first case. Every byte must arrive
/// and no call may fail: a link-down event fails the rail over (the tcp fabric's port is its
/// interface's link), a silent cut only stalls the QPs, which retransmit after it.
pub fn flap(context: &Context<'_>, rail: usize, how: Cut, seconds: f64) -> Outcome {
    let mut outcome = Outcome::default();
    fault_rates(context, &mut outcome);
    let timing = context.topology.timing();
    let data = (timing.data_seconds + 10).to_string();
    let mut words = arguments(&[
        "--scale",
        "rig",
        "--expect-class",
        "intra",
        "--data-timeout",
        &data,
    ]);
    if how == Cut::LinkDown {
        // The rail fails over at the event, so the bytes per rail follow the split only until then.
        words.push("--no-rail-check".into());
    }
    let mut pair = launch(
        context,
        &Launch {
            version: "v12",
            cases: repeat("split-512", timing.flap_cases),
            // The default retries: the flap must be ridden out, not reported.
            settings: Settings::words(
                "MPIB_MODE=1 MPIB_ISLAND_PREFIX_LEN=24 MPIB_IB_RETRY_CNT MPIB_IB_TIMEOUT",
            ),
            arguments: words,
            ..Launch::default()
        },
    );
    pair.first_case_done(timing.process_limit);
    cut(context, rail, how, &mut outcome);
    let cut_at = Instant::now();
    pause(Duration::from_secs_f64(seconds));
    restore(context, rail, &mut outcome);
    let exits = pair.reap();
    let (receiver, sender) = pair.logs();
    outcome.detail = format!(
        "{} case(s) verified byte-exact by the receiver after a {seconds} s flap",
        receiver.cases_passed()
    );
    if sender.has("reported PortDown; going on over") {
        outcome.detail += ", failed over at the link-down event";
    }
    outcome.detail += &format!(", done {} s after it began", since(cut_at));
    judge(context, &pair, exits, &mut outcome);
    outcome
}

/// An advanced pair at sup_bw=512 whose rail is cut for 1 s once the sender has passed its
/// first case, then restored while the cases go on. Every byte must arrive; both sides must
/// fail the rail over and bring it back (docs/PROTOCOL.md §11): the sender once a write on each
/// new queue pair was acknowledged, the receiver at the first IMM on the rail.
pub fn failback(context: &Context<'_>, rail: usize, how: Cut) -> Outcome {
    let mut outcome = Outcome::default();
    fault_rates(context, &mut outcome);
    let timing = context.topology.timing();
    let data = (timing.data_seconds + 10).to_string();
    let mut pair = launch(
        context,
        &Launch {
            version: "v12",
            cases: repeat("split-512", timing.failback_cases),
            settings: quick_errors(&Settings::words(
                "MPIB_MODE=1 MPIB_ISLAND_PREFIX_LEN=24 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=NET",
            )),
            arguments: arguments(&[
                "--scale",
                "rig",
                "--expect-class",
                "intra",
                "--data-timeout",
                &data,
                "--no-rail-check",
            ]),
            ..Launch::default()
        },
    );
    pair.first_case_done(timing.process_limit);
    cut(context, rail, how, &mut outcome);
    pause(Duration::from_secs(1));
    restore(context, rail, &mut outcome);
    let restored = Instant::now();
    let name = rail_name(rail);
    let back_line = format!("the {name} rail is back");
    let log = pair.sender.log.clone();
    let back = wait_for_line(&log, &back_line, &mut pair.sender, Duration::from_secs(6))
        .then(|| since(restored));
    let exits = pair.reap();
    let (receiver, sender) = pair.logs();
    outcome.detail = format!(
        "{} case(s) verified byte-exact by the receiver",
        receiver.cases_passed()
    );
    let rail_words = format!("{name} rail");
    let over = sender.has_in_order(&rail_words, "rail alone (failover)")
        || receiver.has_in_order(&rail_words, "rail alone (failover)");
    outcome.require(over, format!("the {name} rail was not failed over"));
    let both_back = sender.has(&back_line) && receiver.has(&back_line);
    outcome.require(
        both_back,
        format!("the {name} rail is not back on both sides"),
    );
    if both_back {
        outcome.detail += &format!(
            ", both sides brought the {name} rail back and split over it again (the sender {} s after it was restored)",
            back.unwrap_or_else(|| "?".into())
        );
    }
    judge(context, &pair, exits, &mut outcome);
    outcome
}

/// SIGKILLs one side of an advanced pair at sup_bw=512 once the sender has passed its first
/// case; with `cut_first`, that rail's link goes down first and the survivor must have failed it
/// over, so that only its probes on the other rail can tell the peer died. The survivor's calls
/// must return the plugin's error well before its data deadline: no hang.
pub fn killed(context: &Context<'_>, victim: Role, cut_first: Option<usize>) -> Outcome {
    let mut outcome = Outcome::default();
    let started = Instant::now();
    fault_rates(context, &mut outcome);
    let timing = context.topology.timing();
    let survivor_deadline = timing.data_seconds.to_string();
    let survivor_words = arguments(&[
        "--expect-error",
        "plugin",
        "--data-timeout",
        &survivor_deadline,
    ]);
    let mut settings = Settings::words("MPIB_MODE=1 MPIB_ISLAND_PREFIX_LEN=24");
    let mut words = arguments(&["--scale", "rig"]);
    if cut_first.is_some() {
        settings = quick_errors(&settings);
        // The rail fails over: the bytes per rail follow the split only until then.
        words.push("--no-rail-check".into());
    }
    let (receiver, sender) = match victim {
        Role::Receiver => (Vec::new(), survivor_words),
        Role::Sender => (survivor_words, Vec::new()),
    };
    let mut pair = launch(
        context,
        &Launch {
            version: "v12",
            cases: repeat("split-512", timing.flap_cases + 4),
            settings,
            arguments: words,
            receiver,
            sender,
            ..Launch::default()
        },
    );
    pair.first_case_done(timing.process_limit);
    let Pair { receiver, sender } = &mut pair;
    let (victim_process, survivor, survivor_name) = match victim {
        Role::Receiver => (receiver, sender, "sender"),
        Role::Sender => (sender, receiver, "receiver"),
    };
    if let Some(rail) = cut_first {
        cut(context, rail, Cut::LinkDown, &mut outcome);
        let log = survivor.log.clone();
        wait_for_line(&log, "(failover)", survivor, Duration::from_secs(10));
    }
    // A side that ended on its own proves nothing: it must still run when it is killed.
    let alive = victim_process.running();
    victim_process.kill();
    let killed_at = Instant::now();
    let exits = reap(&mut [victim_process, survivor], GRACE);
    if let Some(rail) = cut_first {
        restore(context, rail, &mut outcome);
    }
    let survivor_log = Log::read(&survivor.log);
    outcome.require(
        alive && exits[0] == super::process::Exit::Signal(libc::SIGKILL),
        format!(
            "the victim was not killed mid-run (running: {alive}, {})",
            exits[0]
        ),
    );
    require_success(&mut outcome, survivor_name, exits[1], &survivor_log);
    let mut detail = format!(
        "{survivor_name}: {}",
        survivor_log
            .nccl_error()
            .unwrap_or_else(|| "no error".into())
    );
    if survivor_log.has("control connection") {
        detail += " (the peer's control connection closed)";
    }
    outcome.detail = format!(
        "{detail}; it exited {} s after the kill, {} s in all",
        since(killed_at),
        since(started)
    );
    show(&pair, &mut outcome);
    let (r, s) = pair.logs();
    context.check_connection_calls(&[("host B", &r), ("host A", &s)], &mut outcome);
    outcome
}

/// What the third host runs (scripts/bed/stranger.py, carried in the binary so that the harness
/// needs no path to the repository).
const STRANGER: &str = include_str!("../../../scripts/bed/stranger.py");

/// An advanced pair at sup_bw=512 running 60 cases while a third host hammers every port host
/// B's receiver listens on for 4 s (silent connections past what a rail keeps, scans, junk,
/// hellos with guessed QP numbers and secrets). Every case must pass byte-exact with its split,
/// and the receiver must say it dropped them in a few WARNs with their counts, not one each.
pub fn stranger(context: &Context<'_>) -> Outcome {
    let mut outcome = Outcome::default();
    let script = context.scratch.join("stranger.py");
    if let Err(error) = std::fs::write(&script, STRANGER) {
        outcome
            .problems
            .push(format!("cannot write {}: {error}", script.display()));
        return outcome;
    }
    let mut stranger = match context.topology.stranger(Path::new("python3")) {
        Ok(command) => command,
        Err(error) => {
            outcome
                .problems
                .push(format!("cannot reach the third host: {error}"));
            return outcome;
        }
    };
    fault_rates(context, &mut outcome);
    let mut pair = launch(
        context,
        &Launch {
            version: "v12",
            cases: repeat("split-512", 60),
            settings: Settings::words("MPIB_MODE=1 MPIB_ISLAND_PREFIX_LEN=24"),
            arguments: arguments(&[
                "--scale",
                "rig",
                "--expect-class",
                "intra",
                "--data-timeout",
                "40",
            ]),
            ..Launch::default()
        },
    );
    pair.first_case_done(context.topology.timing().process_limit);
    let ports = listening_ports(context);
    stranger.arg(&script).arg("4").args(&ports);
    let mut attack = Process::start(
        stranger,
        &context.dir.join("stranger.log"),
        Duration::from_secs(30),
    );
    let attack_exit = attack.wait();
    let during = pair.both_running();
    let exits = pair.reap();
    let (receiver, _) = pair.logs();
    let warns = receiver.count("dropped a connection");
    let said = Log::read(&attack.log)
        .tail(1)
        .first()
        .map(|s| s.to_string())
        .unwrap_or_default();
    outcome.detail = format!(
        "{} case(s) verified byte-exact by the receiver; {said}; {warns} throttled WARN(s)",
        receiver.cases_passed()
    );
    outcome.require(
        attack_exit.success(),
        format!("the stranger failed ({attack_exit})"),
    );
    outcome.require(during, "the pair ended before the stranger did");
    outcome.require(
        (1..=6).contains(&warns),
        format!("expected 1 to 6 WARNs about dropped connections, got {warns}"),
    );
    outcome.show.push(("stranger".into(), attack.log.clone()));
    judge(context, &pair, exits, &mut outcome);
    outcome
}

/// The addresses and ports host B listens on over its rails (`ss -Htln`).
fn listening_ports(context: &Context<'_>) -> Vec<String> {
    let host = &context.topology.hosts()[1];
    let output = context
        .topology
        .command(1, Path::new("ss"))
        .arg("-Htln")
        .output();
    let text = output
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    text.lines()
        .filter_map(|line| line.split_whitespace().nth(3))
        .filter(|listen| {
            host.addresses
                .iter()
                .any(|address| listen.starts_with(&format!("{address}:")))
        })
        .map(str::to_string)
        .collect()
}
