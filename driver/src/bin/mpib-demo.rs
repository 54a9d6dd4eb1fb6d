//! `mpib-demo`: loads the built plugin through its exported `ncclNetPlugin_v12` table (exactly as
//! NCCL would), connects a sender and a receiver in advanced mode with a test agent, moves a sweep
//! of sizes at `sup_bw` 0, 512 and 1024, verifies every byte, and prints bandwidth and the
//! per-rail split for each size and split.
//!
//! ```text
//! mpib-demo [--plugin PATH] [--iterations N] [--max-size BYTES] [--fabric loopback|verbs]
//!           [--peer-env NAME=VALUE]... [--hold SECONDS]
//! ```
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

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

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
    max_size: usize,
    fabric: String,
    peer_env: Vec<(String, String)>,
    /// Hidden: run as the receiving process of the verbs path, with this handle file.
    receiver: Option<PathBuf>,
    /// Seconds to keep the comms (and the probes file) alive after the sweep, for scrapes.
    hold: u64,
}

const USAGE: &str = "usage: mpib-demo [--plugin PATH] [--iterations N] [--max-size BYTES] \
[--fabric loopback|verbs] [--peer-env NAME=VALUE]... [--hold SECONDS]";

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        plugin: None,
        iterations: 5,
        max_size: usize::MAX,
        fabric: mpib_driver::env::fabric_or_loopback(),
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
        (Some(handle), _) => run_receiver(&args, handle),
        (None, "verbs") => run_verbs(&args),
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
    let mut moved = 0usize;
    for sup_bw in SUP_BW {
        for r in agent.registrations() {
            agent.set_sup_bw(r.slot, sup_bw);
        }
        for size in SIZES.into_iter().filter(|s| *s <= args.max_size) {
            moved += loopback_row(args, &mut pair, probes.as_ref(), size, sup_bw)?;
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
    let count = rows * SUP_BW.len() * args.iterations as usize;
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

/// One row of the loopback sweep: `iterations` verified transfers of `size` at `sup_bw`, then
/// the rails' measured bytes checked against the split rule. Returns the bytes moved.
fn loopback_row(
    args: &Args,
    pair: &mut Pair<'_, '_>,
    probes: Option<&mpib_driver::rails::Probes>,
    size: usize,
    sup_bw: u32,
) -> Result<usize, String> {
    let plan = Plan::single(size).labelled(format!("size {size} sup_bw {sup_bw}"));
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
                    "size {size} sup_bw {sup_bw}: the rails carried {measured:?} bytes per \
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
        sup_bw,
        per_iter.as_secs_f64() * 1e6,
        gbps,
        sout,
        sup
    );
    Ok(size * args.iterations as usize)
}

// ------------------------------------------------------------------------------ --fabric verbs

/// The rig's hosts: (SOUT device, SUP device, control address) for A (sender) and B (receiver).
const RIG_A: (&str, &str, &str) = ("rxe_a0", "rxe_a1", "10.100.0.1");
const RIG_B: (&str, &str, &str) = ("rxe_b0", "rxe_b1", "10.100.0.2");

/// One case per row: `size` bytes, `iterations` times, at `sup_bw`.
fn demo_cases(args: &Args) -> Vec<mpib_driver::cases::Case> {
    let mut cases = Vec::new();
    for sup_bw in SUP_BW {
        for size in SIZES.into_iter().filter(|s| *s <= args.max_size) {
            let mut case = mpib_driver::cases::Case::new(&format!("size {size} sup_bw {sup_bw}"));
            case.sup_bw = Some(sup_bw);
            case.push(Plan::single(size), args.iterations);
            cases.push(case);
        }
    }
    cases
}

fn host_env(host: (&str, &str, &str)) -> Vec<(String, String)> {
    vec![
        ("MPIB_HCA_SOUT".into(), host.0.into()),
        ("MPIB_HCA_SUP".into(), host.1.into()),
        ("MPIB_OOB_ADDR".into(), host.2.into()),
    ]
}

fn set_env(vars: &[(String, String)]) {
    let lock = mpib_driver::env::lock();
    let vars: Vec<(&str, Option<&str>)> = vars
        .iter()
        .map(|(k, v)| (k.as_str(), Some(v.as_str())))
        .collect();
    let _ = mpib_driver::env::apply(&lock, &vars);
}

fn plugin_path(args: &Args) -> Result<PathBuf, String> {
    match &args.plugin {
        Some(path) => Ok(path.clone()),
        None => locate_built_plugin(&current_profile()).map_err(|e| e.to_string()),
    }
}

const VERBS_OPTIONS: mpib_driver::xfer::SideOptions = mpib_driver::xfer::SideOptions {
    dev: 0,
    env: Vec::new(),
    connect_deadline: Duration::from_secs(90),
    data_deadline: Duration::from_secs(300),
};

fn checks() -> mpib_driver::xfer::Checks {
    mpib_driver::xfer::Checks {
        class: None,
        rails: mpib_driver::rails::Probes::enabled(),
    }
}

/// The receiving process of the verbs path: same rows, same order, every byte checked.
fn run_receiver(args: &Args, handle: &Path) -> Result<(), String> {
    let path = plugin_path(args)?;
    let plugin = Plugin::load(&path).map_err(|e| e.to_string())?;
    let net = plugin.net(Version::V12).map_err(|e| e.to_string())?;
    let listener = mpib_driver::xfer::Listener::new(&net, &VERBS_OPTIONS)
        .map_err(|e| format!("receiver init/listen: {e}"))?;
    listener.publish(handle).map_err(|e| e.to_string())?;
    let mut receiver = listener.accept().map_err(|e| format!("receiver: {e}"))?;
    mpib_driver::xfer::walk(&mut receiver, &demo_cases(args), None, checks(), |_| {})
        .map_err(|e| format!("receiver: {e}"))?;
    receiver.close().map_err(|e| format!("receiver close: {e}"))
}

struct Peer {
    child: Child,
    dir: PathBuf,
}

impl Peer {
    /// Waits (bounded) for the receiver to exit and says how it did.
    fn finish(mut self, limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Ok(None) => {
                    return Err(format!(
                        "the receiver process did not exit within {limit:?}"
                    ))
                }
                Err(e) => return Err(format!("waiting for the receiver: {e}")),
            }
        };
        if status.success() {
            Ok(())
        } else {
            Err(format!(
                "the receiver process failed ({status}); its message is above"
            ))
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Starts this binary again as the receiving process, with `peer` added to its environment;
/// returns it and the handle file it will write.
fn spawn_receiver(
    args: &Args,
    plugin: &Path,
    peer: &[(String, String)],
) -> Result<(Peer, PathBuf), String> {
    let dir = mpib_driver::temp_dir("mpib-demo").map_err(|e| e.to_string())?;
    let handle = dir.join("handle");
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let mut command = Command::new(exe);
    command
        .args(["--role", "recv", "--fabric", "verbs", "--handle-file"])
        .arg(&handle)
        .args(["--iterations", &args.iterations.to_string()])
        .args(["--max-size", &args.max_size.to_string()])
        .arg("--plugin")
        .arg(plugin)
        .stdin(Stdio::null());
    for (k, v) in peer {
        command.env(k, v);
    }
    match command.spawn() {
        Ok(child) => Ok((Peer { child, dir }, handle)),
        Err(e) => {
            let _ = std::fs::remove_dir_all(&dir);
            Err(format!("start the receiver process: {e}"))
        }
    }
}

/// One row of the verbs table (a blank line between SUP shares).
fn print_row(
    args: &Args,
    cases: &[mpib_driver::cases::Case],
    r: &mpib_driver::xfer::CaseResult,
    last_bw: &mut Option<Option<u32>>,
) {
    let case = cases
        .iter()
        .find(|c| c.name == r.name)
        .expect("a walked case");
    if last_bw.is_some_and(|bw| bw != case.sup_bw) {
        println!();
    }
    *last_bw = Some(case.sup_bw);
    let size = case.steps[0].plan.sends[0].size;
    let per_iter = r.busy / args.iterations as u32;
    let gbps = r.bytes as f64 / r.busy.as_secs_f64().max(1e-9) / 1e9;
    // Per message: the case moved the same message `iterations` times.
    let (sout, sup) = match r.rail_bytes {
        Some((sout, sup)) => (
            (sout / args.iterations).to_string(),
            (sup / args.iterations).to_string(),
        ),
        None => ("(probes off)".into(), "-".into()),
    };
    println!(
        "{:>16} {:>7} {:>9.1} us {:>9.3}   {:>20} {:>14}",
        human(size),
        case.sup_bw.unwrap_or(0),
        per_iter.as_secs_f64() * 1e6,
        gbps,
        sout,
        sup
    );
}

/// Sender in this process (host A, test agent), receiver in a child process (host B).
fn run_verbs(args: &Args) -> Result<(), String> {
    let rig =
        std::env::var_os("MPIB_HCA_SOUT").is_none() && std::env::var_os("MPIB_HCA_SUP").is_none();
    let agent = Agent::start_in_temp().map_err(|e| format!("test agent: {e}"))?;
    let mut common = vec![("MPIB_FABRIC".to_string(), "verbs".to_string())];
    common.extend(agent.env().into_iter().map(|(k, v)| (k.to_string(), v)));
    let mut mine = common.clone();
    let mut peer = common;
    if rig {
        mine.extend(host_env(RIG_A));
        peer.extend(host_env(RIG_B));
    }
    peer.extend(args.peer_env.iter().cloned());
    set_env(&mine);
    let path = plugin_path(args)?;
    let (mut peer_process, handle) = spawn_receiver(args, &path, &peer)?;
    let plugin = Plugin::load(&path).map_err(|e| e.to_string())?;
    let net = plugin.net(Version::V12).map_err(|e| e.to_string())?;
    let handle =
        mpib_driver::xfer::wait_for_handle_while(&handle, Duration::from_secs(120), || {
            match peer_process.child.try_wait() {
                Ok(Some(status)) => Err(mpib_driver::Error::Io(format!(
                "the receiver process exited ({status}) before it listened; its message is above"
            ))),
                _ => Ok(()),
            }
        })
        .map_err(|e| format!("receiver process: {e}"))?;
    let mut sender = mpib_driver::xfer::Sender::connect(&net, &VERBS_OPTIONS, &handle)
        .map_err(|e| format!("rank pair setup (init, connect/accept across processes): {e}"))?;
    let props = net.get_properties(0).map_err(|e| e.to_string())?;
    let registrations = agent
        .wait_for_registrations(1, Duration::from_secs(20))
        .map_err(|e| format!("the plugin did not register with the agent: {e}"))?;
    let show = |vars: &[(String, String)]| {
        vars.iter()
            .filter(|(k, _)| k.starts_with("MPIB_HCA") || k == "MPIB_OOB_ADDR")
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    println!(
        "MPIB demo: {} (ncclNetPlugin_v12 \"{}\"), device \"{}\" {} Mbps, MPIB_FABRIC=verbs, \
         two processes: sender [{}] and receiver [{}]{}, advanced mode ({} hint slot(s)), {} \
         iteration(s) per row",
        path.display(),
        net.name(),
        props.name,
        props.speed,
        show(&mine),
        show(&peer),
        if rig {
            " (the rxe rig's hosts A and B)"
        } else {
            ""
        },
        registrations.len(),
        args.iterations
    );
    println!();
    println!(
        "{:>16} {:>7} {:>12} {:>9}   {:>20} {:>14}",
        "size", "sup_bw", "time/iter", "GB/s", "measured: SOUT bytes", "SUP bytes"
    );
    let cases = demo_cases(args);
    let checks = checks();
    let mut last_bw = None;
    let results = mpib_driver::xfer::walk(&mut sender, &cases, Some(&agent), checks, |r| {
        print_row(args, &cases, r, &mut last_bw)
    })
    .map_err(|e| format!("sender: {e}"))?;
    sender.close().map_err(|e| format!("close: {e}"))?;
    peer_process.finish(Duration::from_secs(60))?;
    let transfers: u64 = results.iter().map(|r| r.transfers).sum();
    let bytes: u64 = results.iter().map(|r| r.bytes).sum();
    println!();
    println!(
        "all {transfers} transfers verified byte for byte by the receiving process ({:.1} MiB \
         moved); each row's rail bytes matched the split rule",
        bytes as f64 / f64::from(1u32 << 20)
    );
    drop(agent);
    Ok(())
}
