//! `mpib-harness`: runs the cross-process cases (`mpib_driver::harness::catalog`) over one
//! topology, one record per case.
//!
//! ```text
//! mpib-harness --topology loopback|bed|rig [--only REGEX] [--list] [--work DIR] [--bin DIR]
//!              [--plugin PATH (loopback)]
//!              [--max-call-ms MS] [--process-limit S] [--mpib "K=V ..."]
//!   bed:       [--prefix NAME] [--rate-sout RATE] [--rate-sup RATE] [--fault-rate RATE]
//!              [--scale loopback|rig]
//!   rig:       [--device-tests PATH] [--library-tests PATH]
//! ```
//!
//! Prints `PASS name: detail` / `FAIL name: why` per case and a last line with the counts;
//! writes `results.jsonl` (one JSON object per case) and the logs under `--work`. Exit status 0
//! when every case run passed and at least one ran, 1 otherwise, 2 on bad arguments. The bed
//! needs root (network namespaces); it is torn down on exit, SIGINT or SIGTERM.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use mpib_driver::harness::bed::{self, Bed, BedOptions};
use mpib_driver::harness::catalog::catalog;
use mpib_driver::harness::record::Results;
use mpib_driver::harness::rig::Rig;
use mpib_driver::harness::run::{run_cases, Options};
use mpib_driver::harness::topology::{Kind, Loopback};
use mpib_driver::harness::{catch_signals, stopping, Settings};

const USAGE: &str = "usage: mpib-harness --topology loopback|bed|rig [--only REGEX] [--list] \
[--work DIR] [--bin DIR] [--plugin PATH] [--max-call-ms MS] [--process-limit S] [--mpib \"K=V ...\"] \
[--prefix NAME] [--rate-sout RATE] [--rate-sup RATE] [--fault-rate RATE] [--scale loopback|rig] \
[--device-tests PATH] [--library-tests PATH]";

struct Args {
    kind: Kind,
    only: Option<regex::Regex>,
    list: bool,
    work: Option<PathBuf>,
    bin: PathBuf,
    plugin: Option<PathBuf>,
    max_call_milliseconds: f64,
    process_limit: Option<Duration>,
    every_case: Settings,
    prefix: String,
    rates: [String; 2],
    fault_rate: String,
    scale: String,
    test_binaries: Vec<(String, PathBuf, Vec<String>)>,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        kind: Kind::Loopback,
        only: None,
        list: false,
        work: None,
        bin: PathBuf::from("target/release"),
        plugin: None,
        max_call_milliseconds: 500.0,
        process_limit: None,
        every_case: Settings::default(),
        prefix: "mpib_bed".into(),
        rates: [String::new(), String::new()],
        fault_rate: "200mbit".into(),
        scale: "loopback".into(),
        test_binaries: Vec::new(),
    };
    let mut topology = None;
    let mut words = std::env::args().skip(1);
    while let Some(flag) = words.next() {
        if flag == "--list" {
            args.list = true;
            continue;
        }
        if flag == "--help" || flag == "-h" {
            return Err(USAGE.into());
        }
        let value = words
            .next()
            .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        let number = |v: &str| {
            v.parse::<f64>()
                .map_err(|_| format!("{flag} {v:?}: expected a number"))
        };
        match flag.as_str() {
            "--topology" => {
                topology = Some(
                    Kind::parse(&value)
                        .ok_or_else(|| format!("--topology {value:?}: loopback, bed or rig"))?,
                )
            }
            "--only" if !value.is_empty() => {
                args.only =
                    Some(regex::Regex::new(&value).map_err(|e| format!("--only {value:?}: {e}"))?)
            }
            "--only" => {}
            "--work" => args.work = Some(PathBuf::from(value)),
            "--bin" => args.bin = PathBuf::from(value),
            "--plugin" => args.plugin = Some(PathBuf::from(value)),
            "--max-call-ms" => args.max_call_milliseconds = number(&value)?,
            "--process-limit" => {
                args.process_limit = Some(Duration::from_secs_f64(number(&value)?))
            }
            "--mpib" => args.every_case = Settings::words(&value),
            "--prefix" => args.prefix = value,
            "--rate-sout" => args.rates[0] = value,
            "--rate-sup" => args.rates[1] = value,
            "--fault-rate" => args.fault_rate = value,
            "--scale" => args.scale = value,
            "--device-tests" => {
                let test = (
                    "tests/verbs_device.rs".to_string(),
                    PathBuf::from(value),
                    vec!["--ignored".into(), "--test-threads=1".into()],
                );
                args.test_binaries.push(test)
            }
            "--library-tests" => {
                let words = ["fabric::verbs", "--ignored", "--test-threads=1"]
                    .map(String::from)
                    .to_vec();
                args.test_binaries.push((
                    "lib fabric::verbs".to_string(),
                    PathBuf::from(value),
                    words,
                ))
            }
            _ => return Err(format!("unknown flag {flag}\n{USAGE}")),
        }
    }
    args.kind = topology.ok_or_else(|| format!("--topology is required\n{USAGE}"))?;
    if args.plugin.is_some() && args.kind != Kind::Loopback {
        return Err("--plugin is for the loopback; the bed and the rig load the plugin from --bin by its NCCL name".into());
    }
    Ok(args)
}

/// Runs the bed's cases: one bed per host count the selected cases need (two hosts back to
/// back, then three on switches), each torn down before the next is built.
fn run_bed(args: &Args, options: &Options, results: &mut Results) {
    let _lock = match bed::lock(&args.prefix) {
        Ok(lock) => lock,
        Err(error) => return println!("FAIL bed: {error}"),
    };
    let cases = catalog();
    let mut counts: Vec<usize> = cases
        .iter()
        .filter(|c| c.on.contains(&Kind::Bed))
        .filter(|c| {
            options
                .only
                .as_ref()
                .map_or(true, |only| only.is_match(&c.name))
        })
        .filter_map(|c| c.hosts)
        .collect();
    counts.sort_unstable();
    counts.dedup();
    for hosts in counts {
        if stopping() {
            break;
        }
        let built = Bed::build(BedOptions {
            prefix: args.prefix.clone(),
            hosts,
            rates: args.rates.clone(),
            fault_rate: args.fault_rate.clone(),
            scale: args.scale.clone(),
            process_limit: args.process_limit.unwrap_or(Duration::from_secs(60)),
            bin: args.bin.clone(),
            every_case: args.every_case.clone(),
            scratch: options.scratch.clone(),
        });
        match built {
            Ok(topology) => {
                println!(
                    "bed: {hosts} hosts ({}), rails SOUT {}, SUP {}; scale {}",
                    if hosts == 2 {
                        "back to back"
                    } else {
                        "a switch per rail"
                    },
                    or_unshaped(&args.rates[0]),
                    or_unshaped(&args.rates[1]),
                    args.scale
                );
                run_cases(&topology, &cases, options, results);
            }
            Err(error) => {
                println!("FAIL bed: cannot build {hosts} hosts: {error}");
                results.failed += 1;
            }
        }
    }
}

fn or_unshaped(rate: &str) -> &str {
    if rate.is_empty() {
        "unshaped"
    } else {
        rate
    }
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("mpib-harness: {message}");
            return ExitCode::from(2);
        }
    };
    let name = args.kind.name();
    if args.list {
        for case in catalog().iter().filter(|c| c.on.contains(&args.kind)) {
            println!("{}", case.name);
        }
        return ExitCode::SUCCESS;
    }
    catch_signals();
    let started = Instant::now();
    let work = args
        .work
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("target/{name}/last")));
    // Emptied, not removed: in the rig it is a directory shared with the host (a mount point).
    if let Ok(entries) = std::fs::read_dir(&work) {
        for entry in entries.flatten() {
            let path = entry.path();
            let _ = std::fs::remove_dir_all(&path).or_else(|_| std::fs::remove_file(&path));
        }
    }
    let scratch = PathBuf::from(format!("/tmp/{}.{name}", args.prefix));
    let _ = std::fs::remove_dir_all(&scratch);
    if let Err(error) = std::fs::create_dir_all(&work).and(std::fs::create_dir_all(&scratch)) {
        eprintln!(
            "mpib-harness: cannot create {} or {}: {error}",
            work.display(),
            scratch.display()
        );
        return ExitCode::FAILURE;
    }
    let options = Options {
        only: args.only.clone(),
        max_call_milliseconds: args.max_call_milliseconds,
        work: work.clone(),
        scratch: scratch.clone(),
        test_binaries: args.test_binaries.clone(),
    };
    let mut results = Results::new(name, &work);
    match args.kind {
        Kind::Bed => run_bed(&args, &options, &mut results),
        Kind::Rig => {
            let limit = args.process_limit.unwrap_or(Duration::from_secs(240));
            run_cases(
                &Rig::new(&args.bin, limit, &args.every_case),
                &catalog(),
                &options,
                &mut results,
            )
        }
        Kind::Loopback => {
            let plugin = args
                .plugin
                .clone()
                .unwrap_or_else(|| args.bin.join("libnccl_net_mpib.so"));
            run_cases(
                &Loopback::new(&args.bin, &plugin, &args.every_case),
                &catalog(),
                &options,
                &mut results,
            )
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
    println!(
        "{name}: {} passed, {} failed in {:.1} s (logs: {})",
        results.passed,
        results.failed,
        started.elapsed().as_secs_f64(),
        work.display()
    );
    if results.failed == 0 && results.passed > 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
