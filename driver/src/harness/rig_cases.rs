//! The cases only the rig can run: netem impairments, two fused devices per host told apart by
//! their NICs' hardware counters, the verbs device tests, and the main job.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::catalog::Scenario;
use super::logs::Log;
use super::pair::{arguments, cut, judge, launch, restore, since, Launch};
use super::rig::{counters_grown, nic_counters};
use super::run::{Context, Outcome};
use super::topology::Cut;
use super::Settings;

/// Unsets a host's NIC settings, for programs that choose both hosts' NICs themselves.
const NO_HOST: &str = "MPIB_HCA_SOUT MPIB_HCA_SUP MPIB_OOB_ADDR";

/// Runs a rig scenario.
pub fn run(context: &Context<'_>, scenario: &Scenario) -> Outcome {
    match scenario {
        Scenario::Impaired { rail, netem } => impaired(context, *rail, netem),
        Scenario::Devices => devices(context),
        Scenario::Demo => demo(context),
        _ => Outcome {
            problems: vec!["not a rig scenario".into()],
            ..Outcome::default()
        },
    }
}

/// An advanced pair at sup_bw=512 (both rails carry data, default retry settings) whose wire
/// `rail` netem impairs for the whole run. Every byte must still arrive; the NICs' retry
/// counters show what it cost.
fn impaired(context: &Context<'_>, rail: usize, netem: &'static str) -> Outcome {
    let mut outcome = Outcome::default();
    cut(context, rail, Cut::Impair(netem), &mut outcome);
    let before = nic_counters();
    let mut pair = launch(
        context,
        &Launch {
            version: "v12",
            cases: "split-512".into(),
            settings: Settings::words("MPIB_MODE=1 MPIB_ISLAND_PREFIX_LEN=24"),
            arguments: arguments(&["--expect-class", "intra"]),
            ..Launch::default()
        },
    );
    let exits = pair.reap();
    restore(context, rail, &mut outcome);
    let (receiver, _) = pair.logs();
    outcome.detail = format!(
        "{} verified by the receiver; NIC counters: {}",
        receiver.rails_summary(),
        counters_grown(&before, &nic_counters())
    );
    judge(context, &pair, exits, &mut outcome);
    outcome
}

/// Two NIC pairs per host (the rig boots with four rails), so two fused devices; the
/// conformance cases at sup_bw=512 on device 1, then on device 0, byte-exact. Each device's
/// traffic must show in its own four NICs' packet counters and in none of the other's.
fn devices(context: &Context<'_>) -> Outcome {
    let mut outcome = Outcome::default();
    if !std::path::Path::new("/sys/class/infiniband/rxe_a3").exists() {
        outcome
            .problems
            .push("no rxe_a3: the rig booted with two rails per host, not four".into());
        return outcome;
    }
    let mut details = Vec::new();
    for device in [1usize, 0] {
        let before = nic_counters();
        let mut host_settings = [Settings::default(), Settings::default()];
        for (index, l) in ['a', 'b'].into_iter().enumerate() {
            host_settings[index] = Settings::words(&format!(
                "MPIB_HCA_SOUT=rxe_{l}0,rxe_{l}2 MPIB_HCA_SUP=rxe_{l}1,rxe_{l}3"
            ));
        }
        let sub = if device == 1 { "device1" } else { "device0" };
        let mut pair = launch(
            context,
            &Launch {
                version: "v12",
                cases: "sizes@512,larger@512,grouped@512,outstanding@512,pipeline@512".into(),
                settings: Settings::words("MPIB_MODE=1 MPIB_ISLAND_PREFIX_LEN=24"),
                arguments: arguments(&["--expect-class", "intra", "--dev", &device.to_string()]),
                sub,
                host_settings,
                ..Launch::default()
            },
        );
        let exits = pair.reap();
        let after = nic_counters();
        let mut device_outcome = Outcome::default();
        judge(context, &pair, exits, &mut device_outcome);
        outcome.problems.extend(
            device_outcome
                .problems
                .into_iter()
                .map(|p| format!("device {device}: {p}")),
        );
        outcome.show.extend(device_outcome.show);
        let moved = |nic: &str| {
            let packets = |counters: &std::collections::BTreeMap<String, u64>| {
                ["sent_pkts", "rcvd_pkts"]
                    .iter()
                    .map(|c| counters.get(&format!("{nic}.{c}")).copied().unwrap_or(0))
                    .sum::<u64>()
            };
            packets(&after).saturating_sub(packets(&before))
        };
        let own: Vec<String> = ['a', 'b']
            .iter()
            .flat_map(|l| {
                [
                    format!("rxe_{l}{}", 2 * device),
                    format!("rxe_{l}{}", 2 * device + 1),
                ]
            })
            .collect();
        let mut detail = format!("device {device}:");
        for nic in [
            "rxe_a0", "rxe_a1", "rxe_a2", "rxe_a3", "rxe_b0", "rxe_b1", "rxe_b2", "rxe_b3",
        ] {
            let packets = moved(nic);
            if own.iter().any(|o| o == nic) {
                detail += &format!(" {nic}+{packets}");
                outcome.require(
                    packets > 0,
                    format!("device {device} moved nothing on its {nic}"),
                );
            } else {
                outcome.require(
                    packets == 0,
                    format!(
                        "device {device} moved {packets} packets on {nic}, another device's NIC"
                    ),
                );
            }
        }
        details.push(detail);
    }
    outcome.detail = format!(
        "the conformance cases on each device, packets on its own NICs only: {}",
        details.join("; ")
    );
    outcome
}

/// The main job the README runs, on the rig's verbs NICs.
fn demo(context: &Context<'_>) -> Outcome {
    let mut outcome = Outcome::default();
    let plugin = context.topology.plugin().display().to_string();
    let words = arguments(&[
        "--fabric",
        "verbs",
        "--iterations",
        "2",
        "--max-size",
        "16777216",
        "--plugin",
        &plugin,
    ]);
    // The demo picks the rig's two hosts itself when no NIC is named: none of host A's settings.
    let mut demo = context.start_limited(
        0,
        "mpib-demo",
        &Settings::words(NO_HOST),
        &words,
        "demo.log",
        Duration::from_secs(600),
    );
    let exit = demo.wait();
    let log = Log::read(&demo.log);
    let verified = log
        .text_lines()
        .find(|line| line.starts_with("all ") && line.contains(" transfers verified"));
    outcome.require(
        exit.success() && verified.is_some(),
        format!("{exit}: {}", log.failure().unwrap_or("no FAILED line")),
    );
    outcome.detail = verified.unwrap_or("no transfer verified").to_string();
    outcome.show.push(("mpib-demo".into(), demo.log.clone()));
    outcome
}

/// The verbs device tests, built on the host and run here: (case name, binary, arguments).
pub fn tests(context: &Context<'_>, binaries: &[(String, PathBuf, Vec<String>)]) -> Outcome {
    let mut outcome = Outcome::default();
    let started = Instant::now();
    let mut settings = Settings::words(NO_HOST);
    settings.set("MPIB_TEST_DEVICE_A", "rxe_a0");
    settings.set("MPIB_TEST_DEVICE_B", "rxe_b0");
    let mut passed = 0;
    for (index, (name, binary, words)) in binaries.iter().enumerate() {
        let log = format!("tests{index}.log");
        let mut run = context.start_limited(
            0,
            &binary.display().to_string(),
            &settings,
            words,
            &log,
            Duration::from_secs(300),
        );
        let exit = run.wait();
        let text = Log::read(&run.log);
        let count: usize = text
            .lines_with("test result: ok.")
            .filter_map(|line| line.split_whitespace().nth(3)?.parse::<usize>().ok())
            .sum();
        let ok = exit.success() && text.has("test result: ok") && !text.has("test result: FAILED");
        outcome.require(
            ok,
            format!(
                "{name}: {exit}: {}",
                text.lines_with("FAILED")
                    .chain(text.lines_with("panicked at"))
                    .take(3)
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
        );
        outcome.show.push((name.clone(), run.log.clone()));
        passed += count;
    }
    outcome.require(!binaries.is_empty(), "no test binary was given");
    outcome.detail = format!(
        "{passed} test(s) passed in {} binary(ies), {} s",
        binaries.len(),
        since(started)
    );
    outcome
}
