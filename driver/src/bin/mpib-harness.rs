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

use std::path::{Path, PathBuf};
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
            "--mpib" => {
                if let Some(word) = value.split_whitespace().find(|w| !w.contains('=')) {
                    return Err(format!("--mpib: {word:?} is not K=V"));
                }
                args.every_case = Settings::words(&value)
            }
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
/// back, then three on switches), each torn down before the next is built. Returns false when
/// the first bed could not be built (the machine cannot make one: no case ran).
fn run_bed(args: &Args, options: &Options, results: &mut Results) -> bool {
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
    for (index, hosts) in counts.into_iter().enumerate() {
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
            scratch: Some(options.scratch.clone()),
        });
        let topology = match built {
            Ok(topology) => topology,
            Err(error) => {
                println!("FAIL bed: cannot build {hosts} hosts: {error}");
                results.failed += 1;
                return index > 0;
            }
        };
        let wiring = if hosts == 2 {
            "back to back"
        } else {
            "a switch per rail"
        };
        let (sout, sup) = (or_unshaped(&args.rates[0]), or_unshaped(&args.rates[1]));
        println!(
            "bed: {hosts} hosts ({wiring}), rails SOUT {sout}, SUP {sup}; scale {}",
            args.scale
        );
        if !run_cases(&topology, &cases, options, results) {
            break;
        }
    }
    true
}

/// Empties `work` for this run's logs, unless it holds something else: only a directory that is
/// empty or holds a harness run's records (`results.jsonl`) is emptied. Emptied, not removed: in
/// the rig it is a directory shared with the host (a mount point).
fn prepare_work(work: &Path) -> Result<(), String> {
    std::fs::create_dir_all(work).map_err(|e| format!("cannot create {}: {e}", work.display()))?;
    let entries: Vec<PathBuf> = std::fs::read_dir(work)
        .map_err(|e| format!("cannot read {}: {e}", work.display()))?
        .flatten()
        .map(|entry| entry.path())
        .collect();
    if !entries.is_empty() && !work.join("results.jsonl").exists() {
        return Err(format!(
            "refusing to empty {}: it is not a harness log directory (no results.jsonl)",
            work.display()
        ));
    }
    for path in entries {
        let _ = std::fs::remove_dir_all(&path).or_else(|_| std::fs::remove_file(&path));
    }
    Ok(())
}

/// The run's private scratch directory, `/tmp/PREFIX.TOPOLOGY-PID-N` (created, never reused);
/// on the bed, under its lock, stale ones of killed runs are removed first.
fn scratch_dir(prefix: &str, name: &str, stale: bool) -> Result<PathBuf, String> {
    let start = format!("{prefix}.{name}-");
    if stale {
        for entry in std::fs::read_dir(std::env::temp_dir())
            .into_iter()
            .flatten()
            .flatten()
        {
            if entry.file_name().to_string_lossy().starts_with(&start) {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
    mpib_driver::temp_dir(&format!("{prefix}.{name}")).map_err(|e| e.to_string())
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
    // Two bed runs with one prefix would tear down each other's namespaces: the lock comes
    // before anything of a running one could be touched.
    let _lock = match args.kind {
        Kind::Bed => match bed::lock(&args.prefix) {
            Ok(lock) => Some(lock),
            Err(error) => {
                println!("FAIL bed: {error}");
                return ExitCode::FAILURE;
            }
        },
        _ => None,
    };
    let work = args
        .work
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("target/{name}/last")));
    let prepared =
        prepare_work(&work).and_then(|()| scratch_dir(&args.prefix, name, args.kind == Kind::Bed));
    let scratch = match prepared {
        Ok(scratch) => scratch,
        Err(error) => {
            eprintln!("mpib-harness: {error}");
            return ExitCode::FAILURE;
        }
    };
    let options = Options {
        only: args.only.clone(),
        max_call_milliseconds: args.max_call_milliseconds,
        work: work.clone(),
        scratch: scratch.clone(),
        test_binaries: args.test_binaries.clone(),
    };
    let mut results = Results::new(name, &work);
    let mut available = true;
    match args.kind {
        Kind::Bed => available = run_bed(&args, &options, &mut results),
        Kind::Rig => {
            let limit = args.process_limit.unwrap_or(Duration::from_secs(240));
            run_cases(
                &Rig::new(&args.bin, limit, &args.every_case),
                &catalog(),
                &options,
                &mut results,
            );
        }
        Kind::Loopback => {
            let plugin = args
                .plugin
                .clone()
                .unwrap_or_else(|| args.bin.join("libnccl_net_mpib.so"));
            let loopback = Loopback::new(&args.bin, &plugin, &args.every_case);
            run_cases(&loopback, &catalog(), &options, &mut results);
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
    if results.passed + results.failed == 0 {
        println!("{name}: no case ran (does --only match a case of this topology? --list)");
    }
    if !available {
        // The machine cannot build the bed: scripts/bed/suite.sh may skip on this status.
        ExitCode::from(3)
    } else if results.failed == 0 && results.passed > 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
