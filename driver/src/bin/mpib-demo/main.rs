//! `mpib-demo`: loads the built plugin through its exported `ncclNetPlugin_v12` table (exactly as
//! NCCL would), connects a sender and a receiver, moves a sweep of sizes, verifies every byte, and
//! prints bandwidth and the per-rail split for each size and split.
//!
//! ```text
//! mpib-demo [--plugin PATH] [--iterations N] [--max-size BYTES] [--fabric loopback|verbs]
//!           [--mode vanilla|advanced] [--peer-env NAME=VALUE]... [--hold SECONDS]
//! ```
//!
//! `--mode advanced` (the default) runs with a test agent and sweeps the sizes at `sup_bw` 0, 512
//! and 1024. `--mode vanilla` starts no agent, sets `MPIB_MODE=0` and sweeps the sizes once: on
//! loopback both ends are 127.0.0.1, so the path is intra-island and every byte rides SUP (the
//! split rule at `sup_bw` 1024; the `sup_bw` column reads `vanilla`). Vanilla is loopback only.
//!
//! The rail columns are the bytes each rail really carried, read from the plugin's own probes file
//! and checked against the split rule (a mismatch fails the run). `--hold` keeps the comms open
//! that long after the sweep so a collector can scrape the run.
//!
//! `--fabric loopback` (the default) runs both ends in this process over the in-process fabric.
//! `--fabric verbs` runs the receiver in a second process (this binary again, with `--role
//! recv`), because the plugin opens its two rails once per process and each "host" has its own:
//! this process is the sender (host A) and serves the test agent, the child is the receiver
//! (host B). With neither `MPIB_HCA_SOUT` nor `MPIB_HCA_SUP` set,
//! the verbs path uses the Soft-RoCE rig's devices (`scripts/rxe-vm`): A = rxe_a0 + rxe_a1 at
//! 10.100.0.1, B = rxe_b0 + rxe_b1 at 10.100.0.2. Otherwise the receiver inherits this process's
//! environment, changed by each `--peer-env NAME=VALUE`.

mod verbs;

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
/// Vanilla intra-island puts every byte on SUP: the split rule at this share.
const VANILLA_INTRA_SUP_BW: u32 = 1024;

/// `--mode`: the plugin's `MPIB_MODE`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// `MPIB_MODE=0`, no agent: the plugin's own per-path rule.
    Vanilla,
    /// `MPIB_MODE=1` with the test agent setting each row's SUP share.
    Advanced,
}

struct Args {
    plugin: Option<PathBuf>,
    iterations: u64,
    max_size: usize,
    fabric: String,
    mode: Mode,
    peer_env: Vec<(String, String)>,
    /// Hidden: run as the receiving process of the verbs path, with this handle file.
    receiver: Option<PathBuf>,
    /// Seconds to keep the comms (and the probes file) alive after the sweep, for scrapes.
    hold: u64,
}

const USAGE: &str = "usage: mpib-demo [--plugin PATH] [--iterations N] [--max-size BYTES] \
[--fabric loopback|verbs] [--mode vanilla|advanced] [--peer-env NAME=VALUE]... \
[--hold SECONDS]";

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        plugin: None,
        iterations: 5,
        max_size: usize::MAX,
        fabric: mpib_driver::env::fabric_or_loopback(),
        mode: Mode::Advanced,
        peer_env: Vec::new(),
        receiver: None,
        hold: 0,
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
            "--mode" => {
                args.mode = match value("--mode")?.as_str() {
                    "vanilla" => Mode::Vanilla,
                    "advanced" => Mode::Advanced,
                    other => {
                        return Err(format!(
                            "--mode {other:?}: expected `vanilla` or `advanced`"
                        ))
                    }
                };
            }
            "--max-size" => {
                let text = value("--max-size")?;
                args.max_size = text
                    .parse()
                    .map_err(|_| format!("--max-size {text:?}: expected a number of bytes"))?;
            }
            "--peer-env" => {
                let text = value("--peer-env")?;
                let (name, v) = text
                    .split_once('=')
                    .ok_or_else(|| format!("--peer-env {text:?}: expected NAME=VALUE"))?;
                args.peer_env.push((name.to_string(), v.to_string()));
            }
            "--role" => {
                let role = value("--role")?;
                if role != "recv" {
                    return Err(format!("--role {role:?}: only `recv` (internal)"));
                }
            }
            "--handle-file" => args.receiver = Some(PathBuf::from(value("--handle-file")?)),
            "--hold" => {
                let text = value("--hold")?;
                args.hold = text
                    .parse()
                    .map_err(|_| format!("--hold {text:?}: expected a number of seconds"))?;
            }
            "-h" | "--help" => return Err(USAGE.to_string()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    if args.mode == Mode::Vanilla && args.fabric == "verbs" {
        return Err(
            "--mode vanilla runs on the loopback fabric only; --fabric verbs (or \
                    MPIB_FABRIC=verbs) drives advanced mode with its test agent"
                .to_string(),
        );
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
    let outcome = match (&args.receiver, args.fabric.as_str()) {
        (Some(handle), _) => verbs::run_receiver(&args, handle),
        (None, "verbs") => verbs::run_verbs(&args),
        (None, _) => run(&args),
    };
    match outcome {
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

/// Advanced: starts the test agent. Sets the plugin's environment (`MPIB_MODE=0` in vanilla).
fn start_mode(args: &Args) -> Result<Option<Agent>, String> {
    // Single-threaded so far (the agent's thread never reads the environment).
    let agent = match args.mode {
        Mode::Advanced => Some(Agent::start_in_temp().map_err(|e| format!("test agent: {e}"))?),
        Mode::Vanilla => None,
    };
    let mut vars = vec![("MPIB_FABRIC", args.fabric.clone())];
    match &agent {
        Some(agent) => vars.extend(agent.env()),
        None => vars.push(("MPIB_MODE", "0".to_string())),
    }
    {
        let lock = mpib_driver::env::lock();
        let vars: Vec<(&str, Option<&str>)> =
            vars.iter().map(|(k, v)| (*k, Some(v.as_str()))).collect();
        let _ = mpib_driver::env::apply(&lock, &vars);
    }
    Ok(agent)
}

/// The banner's words for the mode; advanced waits for the plugin to register with the agent.
fn describe_mode(agent: Option<&Agent>) -> Result<String, String> {
    let Some(agent) = agent else {
        return Ok("vanilla mode (MPIB_MODE=0, no agent)".to_string());
    };
    let registrations = agent
        .wait_for_registrations(1, Duration::from_secs(10))
        .map_err(|e| format!("the plugin did not register with the agent: {e}"))?;
    let dir = agent.hint_path().parent().map(|p| p.display().to_string());
    Ok(format!(
        "advanced mode (test agent in {}, {} hint slot(s))",
        dir.unwrap_or_default(),
        registrations.len()
    ))
}

fn run(args: &Args) -> Result<(), String> {
    let agent = start_mode(args)?;
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
    println!(
        "MPIB demo: {} (ncclNetPlugin_v12 \"{}\"), device \"{}\" {} Mbps, MPIB_FABRIC={}, \
         {}, {} iteration(s) per row",
        path.display(),
        net.name(),
        props.name,
        props.speed,
        args.fabric,
        describe_mode(agent.as_ref())?,
        args.iterations
    );
    println!();
    // The plugin's own probes file says which rail carried each byte; the demo checks it
    // against the split rule (a mismatch is an error, like a corrupted byte).
    let probes = if mpib_driver::rails::Probes::enabled() {
        Some(mpib_driver::rails::Probes::open_own().map_err(|e| format!("probes file: {e}"))?)
    } else {
        None
    };
    if let Some(probes) = &probes {
        println!("probes file: {}", probes.path().display());
    }
    println!(
        "{:>16} {:>7} {:>12} {:>9}   {:>26} {:>14}",
        "size", "sup_bw", "time/iter", "GB/s", "measured: SOUT bytes", "SUP bytes"
    );
    // The SUP shares swept: the agent's in advanced mode, the plugin's own rule (None) in vanilla.
    let shares = match &agent {
        Some(_) => SUP_BW.map(Some).to_vec(),
        None => vec![None],
    };
    let mut moved = 0usize;
    for &share in &shares {
        if let (Some(agent), Some(sup_bw)) = (&agent, share) {
            for r in agent.registrations() {
                agent.set_sup_bw(r.slot, sup_bw);
            }
        }
        for size in SIZES.into_iter().filter(|s| *s <= args.max_size) {
            moved += loopback_row(args, &mut pair, probes.as_ref(), size, share)?;
        }
        println!();
    }
    if args.hold > 0 {
        println!(
            "holding the comms open for {} s (probes stay readable)",
            args.hold
        );
        std::thread::sleep(Duration::from_secs(args.hold));
    }
    pair.close().map_err(|e| format!("close: {e}"))?;
    let rows = SIZES.iter().filter(|s| **s <= args.max_size).count();
    let count = rows * shares.len() * args.iterations as usize;
    let mib = moved as f64 / f64::from(1u32 << 20);
    println!(
        "all {count} transfers verified byte for byte ({mib:.1} MiB moved); the rail columns are \
         the bytes the plugin's probes counted on each rail, checked against the split rule"
    );
    drop(agent);
    Ok(())
}

/// Bytes each rail carried for this process's send connection, per the plugin's probes.
fn sent_bytes(probes: Option<&mpib_driver::rails::Probes>) -> Result<Option<(u64, u64)>, String> {
    match probes {
        None => Ok(None),
        Some(p) => p
            .only(mpib_driver::rails::Direction::Send)
            .map(|c| Some(c.rail_bytes))
            .map_err(|e| e.to_string()),
    }
}

/// One row of the loopback sweep: `iterations` verified transfers of `size` at the agent's
/// `share` (`None`: vanilla, intra-island on loopback, so all SUP), then the rails' measured bytes
/// checked against the split rule. Returns the bytes moved.
fn loopback_row(
    args: &Args,
    pair: &mut Pair<'_, '_>,
    probes: Option<&mpib_driver::rails::Probes>,
    size: usize,
    share: Option<u32>,
) -> Result<usize, String> {
    let sup_bw = share.unwrap_or(VANILLA_INTRA_SUP_BW);
    let column = share.map_or_else(|| "vanilla".to_string(), |bw| bw.to_string());
    let plan = Plan::single(size).labelled(format!("size {size} sup_bw {column}"));
    let case = pattern::case_id(&plan.label);
    let mut total = Duration::ZERO;
    let before = sent_bytes(probes)?;
    for iteration in 0..args.iterations {
        pair.prepare(&plan, case, iteration)
            .map_err(|e| e.to_string())?;
        let report = pair.run(&plan).map_err(|e| e.to_string())?;
        pair.verify(&plan, case, iteration, &report)
            .map_err(|e| e.to_string())?;
        total += report.elapsed;
    }
    let per_iter = total / args.iterations as u32;
    let gbps = (size as f64 * args.iterations as f64) / total.as_secs_f64().max(1e-9) / 1e9;
    let expected = expected_split(size, sup_bw);
    let (sout, sup) = match (before, sent_bytes(probes)?) {
        (Some(before), Some(after)) => {
            let n = args.iterations;
            let measured = ((after.0 - before.0) / n, (after.1 - before.1) / n);
            if measured != (expected.0 as u64, expected.1 as u64) {
                return Err(format!(
                    "size {size} sup_bw {column}: the rails carried {measured:?} bytes per \
                     transfer, the split rule says {expected:?}"
                ));
            }
            (measured.0.to_string(), measured.1.to_string())
        }
        _ => ("(probes off)".to_string(), "-".to_string()),
    };
    println!(
        "{:>16} {:>7} {:>9.1} us {:>9.3}   {:>26} {:>14}",
        human(size),
        column,
        per_iter.as_secs_f64() * 1e6,
        gbps,
        sout,
        sup
    );
    Ok(size * args.iterations as usize)
}
