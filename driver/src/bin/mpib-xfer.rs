//! `mpib-xfer`: one side of a rank pair in its own process, driving the built plugin through one
//! exported table (`ncclNetPlugin_v12`, `_v8`, …). Two of them, started at the same time with
//! each host's environment, move the shared conformance cases (`mpib_driver::cases`) across real
//! rails (the Soft-RoCE rig: `scripts/rig/suite.sh`).
//!
//! ```text
//! mpib-xfer --role recv|send --handle-file PATH [--version v12|v8|…] [--cases NAME[,NAME…]]
//!           [--scale rig|loopback] [--expect-class intra|inter] [--no-rail-check] [--dev N]
//!           [--plugin PATH] [--connect-timeout S] [--data-timeout S] [--handle-timeout S]
//!           [--expect-error plugin|bounded [--linger S]]
//! ```
//!
//! The receiver `init`s, `listen`s, writes the 128-byte handle to PATH (atomic rename) and polls
//! `accept`; the sender waits for PATH and polls `connect`. Both walk the same cases in the same
//! order; the receiver checks every byte, the sender the sizes `test` reports, both the bytes per
//! rail (probes file). With `MPIB_MODE=1` the sender serves the test agent at `MPIB_AGENT_SOCKET`
//! and `MPIB_HINT_PATH` (the receiver points at the same paths) and sets each `split-N` case's
//! SUP share. Exit status 0 when every case passed, 1 on the first failure (the message names the
//! version, case, size and iteration), 2 on bad arguments. With `--expect-error` (fault tests:
//! the caller breaks a wire during the run) the roles flip: 0 when the plugin itself reported the
//! failure (`ncclRemoteError` or `ncclSystemError` from a call) or, with `bounded`, when the run
//! also ended at the data deadline (a receiver with nothing in flight on the wire cannot see an RC
//! error: the requests just never complete, but every call returns); 1 when every case passed or
//! the run failed any other way (wrong bytes, a refused call). `--linger S` keeps the process
//! alive, comms open, for S seconds after the expected error, so that the collector can be seen
//! reading the failure from its probes file.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use mpib_driver::cases::{self, Scale};
use mpib_driver::plugin::current_profile;
use mpib_driver::rails::PathClass;
use mpib_driver::xfer::{self, Checks, Listener, SideOptions};
use mpib_driver::{locate_built_plugin, Agent, Plugin, Version};

const USAGE: &str = "usage: mpib-xfer --role recv|send --handle-file PATH [--version v12|v8|...] \
[--cases NAME[,NAME...]] [--scale rig|loopback] [--expect-class intra|inter] [--no-rail-check] [--dev N] \
[--plugin PATH] [--connect-timeout S] [--data-timeout S] [--handle-timeout S] \
[--expect-error plugin|bounded [--linger S]]";

/// What a fault run must end in.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ExpectError {
    /// An error the plugin returned from a call.
    Plugin,
    /// That, or the driver's data deadline.
    Bounded,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    Recv,
    Send,
}

struct Args {
    role: Role,
    version: Version,
    handle_file: PathBuf,
    cases: String,
    scale: Scale,
    expect_class: Option<PathClass>,
    rail_check: bool,
    expect_error: Option<ExpectError>,
    plugin: Option<PathBuf>,
    connect_timeout: Duration,
    data_timeout: Duration,
    handle_timeout: Duration,
    /// `--dev`: the plugin's device this side listens or connects on (0).
    dev: i32,
    /// `--linger`: how long to stay alive, comms open, after an expected error (so that an
    /// observer such as the collector can read the process's probes during the fault).
    linger: Duration,
}

fn seconds(flag: &str, text: &str) -> Result<Duration, String> {
    text.parse::<f64>()
        .ok()
        .filter(|s| *s > 0.0 && s.is_finite())
        .map(Duration::from_secs_f64)
        .ok_or_else(|| format!("{flag} {text:?}: expected a positive number of seconds"))
}

fn parse_args() -> Result<Args, String> {
    let (mut role, mut handle_file) = (None, None);
    let mut args = Args {
        role: Role::Recv,
        version: Version::V12,
        handle_file: PathBuf::new(),
        cases: cases::VANILLA.join(","),
        scale: Scale::Rig,
        expect_class: None,
        rail_check: true,
        expect_error: None,
        plugin: None,
        connect_timeout: Duration::from_secs(60),
        data_timeout: Duration::from_secs(120),
        handle_timeout: Duration::from_secs(120),
        dev: 0,
        linger: Duration::ZERO,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |flag: &str| {
            it.next()
                .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))
        };
        match arg.as_str() {
            "--role" => {
                role = Some(match value("--role")?.as_str() {
                    "recv" => Role::Recv,
                    "send" => Role::Send,
                    other => return Err(format!("--role {other:?}: expected recv or send")),
                })
            }
            "--version" => {
                let text = value("--version")?;
                args.version = xfer::parse_version(&text).map_err(|e| e.to_string())?;
            }
            "--handle-file" => handle_file = Some(PathBuf::from(value("--handle-file")?)),
            "--cases" => args.cases = value("--cases")?,
            "--scale" => {
                args.scale = Scale::parse(&value("--scale")?).map_err(|e| e.to_string())?
            }
            "--expect-class" => {
                let text = value("--expect-class")?;
                args.expect_class = Some(PathClass::parse(&text).map_err(|e| e.to_string())?);
            }
            "--no-rail-check" => args.rail_check = false,
            "--dev" => {
                let text = value("--dev")?;
                args.dev = text
                    .parse::<i32>()
                    .ok()
                    .filter(|d| (0..1024).contains(d))
                    .ok_or_else(|| format!("--dev {text:?}: expected a device number 0..1023"))?;
            }
            "--expect-error" => {
                args.expect_error = Some(match value("--expect-error")?.as_str() {
                    "plugin" => ExpectError::Plugin,
                    "bounded" => ExpectError::Bounded,
                    other => {
                        return Err(format!(
                            "--expect-error {other:?}: expected plugin or bounded"
                        ))
                    }
                })
            }
            "--plugin" => args.plugin = Some(PathBuf::from(value("--plugin")?)),
            "--connect-timeout" => {
                args.connect_timeout = seconds("--connect-timeout", &value("--connect-timeout")?)?
            }
            "--data-timeout" => {
                args.data_timeout = seconds("--data-timeout", &value("--data-timeout")?)?
            }
            "--linger" => args.linger = seconds("--linger", &value("--linger")?)?,
            "--handle-timeout" => {
                args.handle_timeout = seconds("--handle-timeout", &value("--handle-timeout")?)?
            }
            "-h" | "--help" => return Err(USAGE.to_string()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    args.role = role.ok_or_else(|| format!("--role is required\n{USAGE}"))?;
    args.handle_file = handle_file.ok_or_else(|| format!("--handle-file is required\n{USAGE}"))?;
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
    let who = format!(
        "mpib-xfer[{} {}]",
        if args.role == Role::Recv {
            "recv"
        } else {
            "send"
        },
        args.version
    );
    let start = Instant::now();
    match run(&args, &who) {
        Ok(what) => {
            println!(
                "{who}: PASS {what} in {:.1} s",
                start.elapsed().as_secs_f64()
            );
            ExitCode::SUCCESS
        }
        Err(message) => {
            println!(
                "{who}: FAILED after {:.1} s: {message}",
                start.elapsed().as_secs_f64()
            );
            ExitCode::FAILURE
        }
    }
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.to_string())
}

/// The test agent, when this is the sender of an advanced-mode pair.
fn start_agent(who: &str) -> Result<Option<Agent>, String> {
    if env_or("MPIB_MODE", "0").trim() != "1" {
        return Ok(None);
    }
    let hints = PathBuf::from(env_or("MPIB_HINT_PATH", "/tmp/mpib/hints"));
    let socket = PathBuf::from(env_or("MPIB_AGENT_SOCKET", "/tmp/mpib/agent.sock"));
    for path in [&hints, &socket] {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        }
    }
    let agent = Agent::start(&hints, &socket).map_err(|e| format!("test agent: {e}"))?;
    println!(
        "{who}: MPIB_MODE=1: serving the test agent at {} (hints {})",
        socket.display(),
        hints.display()
    );
    Ok(Some(agent))
}

/// Stays alive for `--linger` after an expected error, comms and probes file still open.
fn linger(outcome: Result<String, String>, args: &Args, who: &str) -> Result<String, String> {
    if outcome.is_ok() && !args.linger.is_zero() {
        println!("{who}: lingering {:?} after the error", args.linger);
        std::thread::sleep(args.linger);
    }
    outcome
}

/// `--expect-error`: the walk must have ended in an error the plugin returned from a call
/// (`ncclRemoteError` or `ncclSystemError`), or with `bounded` also at the data deadline; never in
/// success or wrong bytes.
fn expected_error<T>(
    walked: mpib_driver::Result<T>,
    expect: ExpectError,
    who: &str,
) -> Result<String, String> {
    use mpib_driver::abi::{NCCL_REMOTE_ERROR, NCCL_SYSTEM_ERROR};
    match walked {
        Err(e) if matches!(e.code(), Some(NCCL_REMOTE_ERROR | NCCL_SYSTEM_ERROR)) => {
            println!("{who}: the plugin reported the failure as expected: {e}");
            Ok("(the fault was reported by the plugin, as expected)".into())
        }
        Err(e @ mpib_driver::Error::Timeout(_)) if expect == ExpectError::Bounded => {
            println!("{who}: the run ended at the data deadline, as allowed: {e}");
            Ok("(the fault stopped the run at the data deadline; every call returned)".into())
        }
        Err(e) => Err(format!(
            "expected the plugin to report ncclRemoteError or ncclSystemError, got: {e}"
        )),
        Ok(_) => Err(
            "expected the plugin to report ncclRemoteError or ncclSystemError, but every case \
             passed (did the fault land after the last transfer?)"
                .into(),
        ),
    }
}

fn run(args: &Args, who: &str) -> Result<String, String> {
    let cases = cases::parse_list(&args.cases, args.scale).map_err(|e| e.to_string())?;
    // The agent (a thread) starts before the plugin is loaded; it never reads the environment.
    let agent = match args.role {
        Role::Send => start_agent(who)?,
        Role::Recv => None,
    };
    let path = match &args.plugin {
        Some(path) => path.clone(),
        None => locate_built_plugin(&current_profile()).map_err(|e| e.to_string())?,
    };
    let plugin = Plugin::load(&path).map_err(|e| e.to_string())?;
    let net = plugin.net(args.version).map_err(|e| e.to_string())?;
    let options = SideOptions {
        dev: args.dev,
        connect_deadline: args.connect_timeout,
        data_deadline: args.data_timeout,
        ..SideOptions::default()
    };
    let checks = Checks {
        class: args.expect_class,
        rails: args.rail_check,
    };
    let names: Vec<&str> = cases.iter().map(|c| c.name.as_str()).collect();
    let describe = |net: &mpib_driver::Net<'_>| {
        let props = net
            .get_properties(args.dev)
            .map(|p| format!("device \"{}\" {} Mbps", p.name, p.speed))
            .unwrap_or_else(|e| format!("getProperties failed: {e}"));
        println!(
            "{who}: {} ({props}), MPIB_FABRIC={} MPIB_HCA_SOUT={} MPIB_HCA_SUP={} \
             MPIB_OOB_ADDR={} MPIB_ISLAND_PREFIX_LEN={} MPIB_MODE={}; cases {}",
            path.display(),
            env_or("MPIB_FABRIC", "(default)"),
            env_or("MPIB_HCA_SOUT", "(unset)"),
            env_or("MPIB_HCA_SUP", "(unset)"),
            env_or("MPIB_OOB_ADDR", "(unset)"),
            env_or("MPIB_ISLAND_PREFIX_LEN", "(default)"),
            env_or("MPIB_MODE", "0"),
            names.join(",")
        );
    };
    let log = |r: &xfer::CaseResult| println!("{who}: ok {}", r.summary());
    match args.role {
        Role::Recv => {
            // A handle left by an earlier run must not reach this run's sender.
            let _ = std::fs::remove_file(&args.handle_file);
            let listener =
                Listener::new(&net, &options).map_err(|e| format!("init/listen: {e}"))?;
            describe(&net);
            listener
                .publish(&args.handle_file)
                .map_err(|e| e.to_string())?;
            let mut receiver = listener.accept().map_err(|e| e.to_string())?;
            println!("{who}: connected");
            let walked = xfer::walk(&mut receiver, &cases, None, checks, log);
            if let Some(expect) = args.expect_error {
                return linger(expected_error(walked, expect, who), args, who);
            }
            walked.map_err(|e| e.to_string())?;
            receiver.close().map_err(|e| format!("close: {e}"))?;
        }
        Role::Send => {
            let handle = xfer::wait_for_handle(&args.handle_file, args.handle_timeout)
                .map_err(|e| e.to_string())?;
            let mut sender = xfer::Sender::connect(&net, &options, &handle)
                .map_err(|e| format!("init/connect: {e}"))?;
            describe(&net);
            println!("{who}: connected");
            if let Some(agent) = &agent {
                let registrations = agent
                    .wait_for_registrations(1, Duration::from_secs(20))
                    .map_err(|e| format!("the plugin did not register with the agent: {e}"))?;
                println!(
                    "{who}: agent registrations: {:?}",
                    registrations
                        .iter()
                        .map(|r| format!("slot {} {} -> {}", r.slot, r.sout_src, r.sout_dst))
                        .collect::<Vec<_>>()
                );
            }
            let walked = xfer::walk(&mut sender, &cases, agent.as_ref(), checks, log);
            if let Some(expect) = args.expect_error {
                return linger(expected_error(walked, expect, who), args, who);
            }
            walked.map_err(|e| e.to_string())?;
            sender.close().map_err(|e| format!("close: {e}"))?;
        }
    }
    print_slowest_call(&net, who);
    drop(net);
    drop(agent);
    unload(plugin, args.version, who)?;
    Ok(format!("all {} case(s)", cases.len()))
}

/// `dlclose`, as NCCL unloads its net plugin once the last communicator is gone (v7 ... v10
/// with no `finalize` before it), then the check that no plugin thread outlived it: one would
/// wake into unmapped code, so the check waits longer than any plugin thread sleeps (200 ms).
fn unload(plugin: Plugin, version: Version, who: &str) -> Result<(), String> {
    drop(plugin);
    std::thread::sleep(Duration::from_millis(300));
    let left = mpib_driver::running_plugin_threads();
    if !left.is_empty() {
        return Err(format!(
            "{version}: plugin threads outlived dlclose: {}",
            left.join(", ")
        ));
    }
    println!("{who}: unloaded ({version}), no plugin thread left");
    Ok(())
}

/// The slowest exported calls of this side's whole run (NCCL's proxy thread must never wait in
/// one), for the rig suite, as `WHO: LABEL: NAME MS ms (of N NAME calls, M calls in all)`:
/// * `slowest call`: any call;
/// * `slowest connection call`: every call but `init` and the data path: the handshakes,
///   registrations and closes, whose work per call the plugin chooses;
/// * `slowest data call`: `isend`, `irecv`, `test`, `iflush`. On Soft-RoCE these include the
///   emulated NIC's own packet processing, which rxe runs inside `ibv_post_send`.
///
/// `init` is apart: NCCL makes it once per process, before any proxy thread runs, and it
/// cannot be resumed across calls.
fn print_slowest_call(net: &mpib_driver::Net<'_>, who: &str) {
    const DATA: [&str; 4] = ["isend", "irecv", "test", "iflush"];
    let times = net.call_times();
    let all: u64 = times.iter().map(|(_, t)| t.calls).sum();
    let print = |label: &str, keep: &dyn Fn(&str) -> bool| {
        let slowest = times
            .iter()
            .filter(|(name, _)| keep(name))
            .max_by_key(|(_, t)| t.slowest);
        if let Some((name, time)) = slowest {
            println!(
                "{who}: {label}: {name} {:.1} ms (of {} {name} calls, {all} calls in all)",
                time.slowest.as_secs_f64() * 1e3,
                time.calls
            );
        }
    };
    print("slowest call", &|_| true);
    print("slowest connection call", &|name| {
        name != "init" && !DATA.contains(&name)
    });
    print("slowest data call", &|name| DATA.contains(&name));
}
