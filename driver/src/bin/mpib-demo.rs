//! `mpib-demo`: loads the built plugin through its exported `ncclNetPlugin_v12` table (exactly as
//! NCCL would), connects a sender and a receiver in advanced mode with a test agent, moves a sweep
//! of sizes at `sup_bw` 0, 512 and 1024, verifies every byte, and prints bandwidth and the
//! per-rail split for each size and split.
//!
//! ```text
//! mpib-demo [--plugin PATH] [--iterations N] [--fabric loopback|verbs]
//! ```
//!
//! The plugin does not expose per-rail byte counts through the ABI yet, so the rail columns are
//! the split rule's expectation ("expected split"), not measurements.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use mpib_driver::plugin::current_profile;
use mpib_driver::{
    expected_split, locate_built_plugin, pattern, Agent, Deadlines, Pair, PairOptions, Plan,
    Plugin, Version,
};

const SIZES: [usize; 9] = [
    0,
    1,
    127,
    128,
    4097,
    64 << 10,
    (1 << 20) + 3,
    16 << 20,
    64 << 20,
];
const SUP_BW: [u32; 3] = [0, 512, 1024];

struct Args {
    plugin: Option<PathBuf>,
    iterations: u64,
    fabric: String,
}

const USAGE: &str = "usage: mpib-demo [--plugin PATH] [--iterations N] [--fabric loopback|verbs]";

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        plugin: None,
        iterations: 5,
        fabric: mpib_driver::env::fabric_or_loopback(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |flag: &str| {
            it.next()
                .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))
        };
        match arg.as_str() {
            "--plugin" => args.plugin = Some(PathBuf::from(value("--plugin")?)),
            "--iterations" => {
                let text = value("--iterations")?;
                args.iterations =
                    text.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
                        format!("--iterations {text:?}: expected a positive integer")
                    })?;
            }
            "--fabric" => {
                let fabric = value("--fabric")?;
                if fabric != "loopback" && fabric != "verbs" {
                    return Err(format!(
                        "--fabric {fabric:?}: expected `loopback` or `verbs`"
                    ));
                }
                args.fabric = fabric;
            }
            "-h" | "--help" => return Err(USAGE.to_string()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    Ok(args)
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("mpib-demo: FAILED: {message}");
            ExitCode::FAILURE
        }
    }
}

fn human(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 20 => format!("{} MiB + {}", b >> 20, b & ((1 << 20) - 1)),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

fn run(args: &Args) -> Result<(), String> {
    // Single-threaded so far (the agent's thread never reads the environment).
    let agent = Agent::start_in_temp().map_err(|e| format!("test agent: {e}"))?;
    let mut vars = vec![("MPIB_FABRIC", args.fabric.clone())];
    vars.extend(agent.env());
    {
        let lock = mpib_driver::env::lock();
        let vars: Vec<(&str, Option<&str>)> =
            vars.iter().map(|(k, v)| (*k, Some(v.as_str()))).collect();
        let _ = mpib_driver::env::apply(&lock, &vars);
    }
    let path = match &args.plugin {
        Some(path) => path.clone(),
        None => locate_built_plugin(&current_profile()).map_err(|e| e.to_string())?,
    };
    let plugin = Plugin::load(&path).map_err(|e| e.to_string())?;
    let net = plugin.net(Version::V12).map_err(|e| e.to_string())?;
    let options = PairOptions {
        deadlines: Deadlines {
            connect: Duration::from_secs(10),
            data: Duration::from_secs(120),
        },
        ..PairOptions::default()
    };
    let mut pair = Pair::connect_with(&net, &options)
        .map_err(|e| format!("rank pair setup (init, listen, connect/accept): {e}"))?;
    let props = net.get_properties(0).map_err(|e| e.to_string())?;
    let registrations = agent
        .wait_for_registrations(1, Duration::from_secs(10))
        .map_err(|e| format!("the plugin did not register with the agent: {e}"))?;
    println!(
        "MPIB demo: {} (ncclNetPlugin_v12 \"{}\"), device \"{}\" {} Mbps, MPIB_FABRIC={}, \
         advanced mode (test agent in {}, {} hint slot(s)), {} iteration(s) per row",
        path.display(),
        net.name(),
        props.name,
        props.speed,
        args.fabric,
        agent
            .hint_path()
            .parent()
            .map(|p| p.display().to_string())
            .unwrap_or_default(),
        registrations.len(),
        args.iterations
    );
    println!();
    println!(
        "{:>16} {:>7} {:>12} {:>9}   {:>26} {:>14}",
        "size", "sup_bw", "time/iter", "GB/s", "expected split: SOUT bytes", "SUP bytes"
    );
    let mut moved = 0usize;
    for sup_bw in SUP_BW {
        for r in agent.registrations() {
            agent.set_sup_bw(r.slot, sup_bw);
        }
        for size in SIZES {
            let plan = Plan::single(size).labelled(format!("size {size} sup_bw {sup_bw}"));
            let case = pattern::case_id(&plan.label);
            let mut total = Duration::ZERO;
            for iteration in 0..args.iterations {
                pair.prepare(&plan, case, iteration)
                    .map_err(|e| e.to_string())?;
                let report = pair.run(&plan).map_err(|e| e.to_string())?;
                pair.verify(&plan, case, iteration, &report)
                    .map_err(|e| e.to_string())?;
                total += report.elapsed;
                moved += size;
            }
            let per_iter = total / args.iterations as u32;
            let gbps = (size as f64 * args.iterations as f64) / total.as_secs_f64().max(1e-9) / 1e9;
            let (sout, sup) = expected_split(size, sup_bw);
            println!(
                "{:>16} {:>7} {:>9.1} us {:>9.3}   {:>26} {:>14}",
                human(size),
                sup_bw,
                per_iter.as_secs_f64() * 1e6,
                gbps,
                sout,
                sup
            );
        }
        println!();
    }
    pair.close().map_err(|e| format!("close: {e}"))?;
    let count = SIZES.len() * SUP_BW.len() * args.iterations as usize;
    let mib = moved as f64 / f64::from(1u32 << 20);
    println!(
        "all {count} transfers verified byte for byte ({mib:.1} MiB moved); rail columns are the \
         split rule's expectation (measured per-rail counters are not exposed through the ABI yet)"
    );
    drop(agent);
    Ok(())
}
