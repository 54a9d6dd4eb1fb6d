//! `mpib-perf`: what an ncclNet plugin does on your rails, like nccl-tests or perftest's
//! `ib_write_bw`, through the plugin's exported `ncclNetPlugin_vN` table exactly as NCCL's proxy
//! drives it (any plugin, MPIB or not).
//!
//! ```text
//! mpib-perf [--plugin PATH] [--abi N] [--dev N] [--listen [ADDR:]PORT | --peer HOST:PORT]
//!           [--min-size BYTES] [--max-size BYTES] [--step-factor F] [--iters N] [--warmup N]
//!           [--window N] [--group N] [--verify] [--sup-bw N[,N...]] [--json | --csv]
//!           [--timeout S]
//! ```
//!
//! One process (the default): a receiver thread `listen`s and `accept`s, the main thread
//! `connect`s and sends, like `mpib-demo` on the loopback fabric (`MPIB_FABRIC=loopback`). Two
//! processes: `mpib-perf --listen 5000` on the receiving host accepts one TCP connection, and
//! `mpib-perf --peer HOST:5000` on the sending host connects; over that socket the sender ships
//! the sweep (the receiver needs no repeated arguments), the receiver ships its 128-byte listen
//! handle, then its numbers after every size, and both end with a barrier. The sender prints the
//! table. (The loopback fabric lives inside one process, so two processes need real rails.)
//!
//! Per size: `--warmup` untimed iterations, then `--iters` timed ones (default: about 256 MiB
//! per size, 20 to 1000 iterations), each an `irecv` of `--group` buffers and as many `isend`s,
//! at most `--window` requests in flight per direction (NCCL's 8 by default). Sizes go from
//! `--min-size` to `--max-size` (8 B … 256 MiB; K/M/G suffixes are powers of 1024) by
//! `--step-factor` (2). Columns: size, count (timed iterations), GB/s (bytes / time / 1e9, time
//! from the sender's first post to its last completion), Mmsg/s, p50 and p99 µs (each `isend`
//! from its post to the `test` that reports it done), and for MPIB the bytes each rail carried
//! in the timed pass (the plugin's probes file) and the measured SUP share (SUP bytes / total, in
//! parts per 1024). `--json` (one object per row per line) and `--csv` put only rows on stdout;
//! see `output.rs` for the fields.
//!
//! `--sup-bw 512` (or a list, `0,512,1024`, one table block each) runs a test agent in this
//! process and sets `MPIB_MODE=1`, `MPIB_HINT_PATH` and `MPIB_AGENT_SOCKET` for the plugin, so
//! MPIB splits every message at that share; a `--listen` side runs its own agent when the sweep
//! asks for one (MPIB needs both ends in the same mode). Without it the plugin runs with the
//! environment as given. `--verify` fills a pattern per message and checks every byte on the
//! receiver (without it, nothing touches the payload in the timed loop).
//!
//! Every wait is bounded by `--timeout` (60 s): the TCP handshake, `connect`/`accept`, each pass
//! of each size, each message between the sides. Exit status: 0 done; 1 a run failed (the
//! message names the call, the size and the iteration); 2 bad arguments, or a library that cannot
//! be loaded, is not an ncclNet plugin, or lacks the requested ABI.

mod args;
mod group;
mod link;
mod output;
mod pass;
mod sender;
mod sides;
mod sweep;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::mpsc;
use std::time::Duration;

use mpib_driver::plugin::current_profile;
use mpib_driver::{locate_built_plugin, Plugin, Version};

use args::{Args, Parsed, Role};
use group::Group;
use output::Printer;
use sender::SendCtx;
use sides::{Local, Summary};

/// Why the run stopped: bad input (exit 2) or a failed run (exit 1).
#[derive(Debug)]
pub enum Failure {
    /// Bad flags or values (exit 2), with the message.
    Usage(String),
    /// The run failed (exit 1), with the message.
    Run(String),
}

impl Failure {
    /// The message.
    pub fn message(&self) -> &str {
        match self {
            Failure::Usage(m) | Failure::Run(m) => m,
        }
    }

    fn code(&self) -> u8 {
        match self {
            Failure::Usage(_) => 2,
            Failure::Run(_) => 1,
        }
    }
}

impl From<mpib_driver::Error> for Failure {
    fn from(e: mpib_driver::Error) -> Failure {
        Failure::Run(e.to_string())
    }
}

fn main() -> ExitCode {
    let outcome = match args::parse(std::env::args().skip(1)) {
        Ok(Parsed::Help) => {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{}", args::USAGE);
            return ExitCode::SUCCESS;
        }
        Ok(Parsed::Run(args)) => run(&args),
        Err(failure) => Err(failure),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            output::to_stderr(&format!("mpib-perf: {}\n", failure.message()));
            ExitCode::from(failure.code())
        }
    }
}

/// The file NCCL loads for `NCCL_NET_PLUGIN=name`: a path or a file name as given, else
/// `libnccl-net-<name>.so`, looked up by the dynamic loader (LD_LIBRARY_PATH, ld.so.cache).
fn nccl_plugin_file(name: &str) -> PathBuf {
    if name.contains('/') || name.ends_with(".so") {
        PathBuf::from(name)
    } else {
        PathBuf::from(format!("libnccl-net-{name}.so"))
    }
}

/// The plugin, its path and the table to drive. Every failure here is the user's input (exit 2).
fn load(args: &Args) -> Result<(Plugin, String, Version), Failure> {
    let nccl_name = std::env::var("NCCL_NET_PLUGIN")
        .ok()
        .filter(|n| !n.trim().is_empty());
    let path: PathBuf = match (&args.plugin, nccl_name) {
        (Some(path), _) => path.clone(),
        (None, Some(name)) => nccl_plugin_file(name.trim()),
        (None, None) => locate_built_plugin(&current_profile()).map_err(|e| {
            Failure::Usage(format!("no --plugin given, NCCL_NET_PLUGIN unset, and {e}"))
        })?,
    };
    let shown = path.display().to_string();
    // The driver's load errors already name the path and the symbol; drop its "load:" prefix.
    let text = |e: mpib_driver::Error| match e {
        mpib_driver::Error::Load(m) => m,
        other => other.to_string(),
    };
    let plugin = Plugin::load(&path).map_err(|e| {
        Failure::Usage(format!(
            "--plugin {shown}: cannot load the library: {}",
            text(e)
        ))
    })?;
    let version = plugin
        .select_version(args.abi)
        .map_err(|e| Failure::Usage(text(e)))?;
    let net = plugin.net(version).map_err(|e| Failure::Usage(text(e)))?;
    net.check_required_slots().map_err(|e| {
        Failure::Usage(format!(
            "--plugin {shown}: ncclNetPlugin_{version} cannot be driven: {e}"
        ))
    })?;
    drop(net);
    Ok((plugin, shown, version))
}

fn run(args: &Args) -> Result<(), Failure> {
    let need = match args.role {
        Role::OneProcess => {
            (args.sweep.recv_len().saturating_add(args.sweep.send_len())).saturating_mul(args.comms)
        }
        Role::Peer(_) => args.sweep.send_len(),
        Role::Listen(_) => 0, // the sweep comes from the sender; checked when it arrives
    };
    sides::check_memory(&args.sweep, need)?;
    let (plugin, path, version) = load(args)?;
    let mut printer = Printer::new(args.format);
    // Leaked: the receiver thread of a one-process run must be able to outlive a failed sender
    // (it may sit in `accept` until its deadline), and a plugin is never unloaded anyway.
    let plugin: &'static Plugin = Box::leak(Box::new(plugin));
    let path: &'static str = Box::leak(path.into_boxed_str());
    let local = Local {
        plugin,
        path,
        version,
        dev: args.dev,
        timeout: args.timeout,
    };
    let summary = match &args.role {
        Role::OneProcess => one_process(args, local, &mut printer)?,
        Role::Listen(spec) => return listen(args, local, &printer, spec),
        Role::Peer(spec) => peer(args, local, &mut printer, spec)?,
    };
    if let Some(e) = printer.broken() {
        return Err(Failure::Run(e));
    }
    printer.note(&format!(
        "# done: {} rows, {:.1} MiB moved{}",
        summary.rows,
        summary.bytes as f64 / f64::from(1u32 << 20),
        if args.sweep.verify {
            ", every byte verified by the receiver"
        } else {
            ""
        }
    ));
    Ok(())
}

/// Sender on this thread, receiver on another, the handle and the numbers through channels.
fn one_process(
    args: &Args,
    local: Local<'static>,
    printer: &mut Printer,
) -> Result<Summary, Failure> {
    let agent = if args.sweep.splits.iter().any(Option::is_some) {
        Some(sides::start_agent()?)
    } else {
        None
    };
    // Leaked like the plugin: a thread of a failed run may outlive this call.
    let group: &'static Group = Box::leak(Box::new(Group::new(args.comms)));
    let grouped = (args.comms > 1).then_some(group);
    let devices: &'static [i32] = Box::leak(args.devs.clone().into_boxed_slice());
    let mode = match (args.comms, devices.len()) {
        (1, _) => "one process (receiver thread and sender thread)".to_string(),
        (n, 1) => format!("one process, {n} connections moving each row together (--comms)"),
        (n, _) => {
            format!("one process, {n} connections on devices {devices:?} moving each row together")
        }
    };
    let (done_tx, done_rx) = mpsc::channel();
    let mut followers = Vec::new();
    let mut leader_end = None;
    for member in 0..args.comms {
        let local = Local {
            dev: devices[member % devices.len()],
            ..local
        };
        let (mut recv_end, send_end) = link::channel_pair();
        let done = done_tx.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("mpib-perf-recv-{member}"))
            .spawn(move || {
                let _ = done.send(sides::receive(local, &mut recv_end, false, None));
            });
        spawned.map_err(|e| Failure::Run(format!("start the receiver thread: {e}")))?;
        if member == 0 {
            leader_end = Some(send_end);
            continue;
        }
        let (sweep, format, mode) = (args.sweep.clone(), args.format, mode.clone());
        let follower = std::thread::Builder::new()
            .name(format!("mpib-perf-send-{member}"))
            .spawn(move || {
                let mut send_end = send_end;
                let ctx = SendCtx {
                    local,
                    sweep: &sweep,
                    agent: None,
                    mode,
                    group: grouped.map(|g| (g, member)),
                    devices,
                };
                sender::send(&ctx, &mut send_end, &mut Printer::new(format)).map(|_| ())
            })
            .map_err(|e| Failure::Run(format!("start a sender thread: {e}")))?;
        followers.push(follower);
    }
    drop(done_tx);
    let mut send_end = leader_end.ok_or_else(|| Failure::Run("no connection".into()))?;
    let ctx = SendCtx {
        local,
        sweep: &args.sweep,
        agent: agent.as_ref(),
        mode,
        group: grouped.map(|g| (g, 0)),
        devices,
    };
    let sent = sender::send(&ctx, &mut send_end, printer);
    let sent = followers.into_iter().fold(sent, |first, follower| {
        let joined = follower
            .join()
            .unwrap_or_else(|_| Err(Failure::Run("a sender thread panicked".into())));
        match (first, joined) {
            (Ok(summary), Ok(())) => Ok(summary),
            (Err(e), _) | (Ok(_), Err(e)) => Err(e),
        }
    });
    // After a failure the receiver stops at once, except inside `accept`: give it a moment.
    let grace = if sent.is_ok() {
        args.timeout
    } else {
        Duration::from_secs(2)
    };
    let mut received = Ok(Summary { rows: 0, bytes: 0 });
    for _ in 0..args.comms {
        let one = done_rx.recv_timeout(grace).unwrap_or_else(|_| {
            Err(Failure::Run(
                "the receiver thread did not finish (it stopped or panicked)".into(),
            ))
        });
        if received.is_ok() {
            received = one;
        }
    }
    match (sent, received) {
        (Ok(summary), Ok(_)) => Ok(summary),
        // The side that failed first has the cause; the other one only says so.
        (Err(s), Err(r)) if s.message().contains(link::OTHER_SIDE_FAILED) => Err(r),
        (Err(s), _) => Err(s),
        (Ok(_), Err(r)) => Err(r),
    }
}

/// The receiver of two processes.
fn listen(
    args: &Args,
    local: Local<'static>,
    printer: &Printer,
    spec: &str,
) -> Result<(), Failure> {
    let listener = link::bind(spec).map_err(Failure::Usage)?;
    let bound = listener
        .local_addr()
        .map_err(|e| Failure::Run(format!("--listen {spec}: {e}")))?;
    printer.note(&format!(
        "# mpib-perf: listening on {bound} for one `mpib-perf --peer HOST:{}` (within {:?})",
        bound.port(),
        args.timeout
    ));
    if !args.ignored.is_empty() {
        printer.note(&format!(
            "# note: the sweep comes from the sender; ignoring {} here",
            args.ignored.join(" ")
        ));
    }
    let mut tcp = link::accept(&listener, args.timeout).map_err(Failure::Run)?;
    drop(listener);
    printer.note(&format!("# peer connected from {}", tcp.peer()));
    let summary = sides::receive(local, &mut tcp, true, Some(printer))?;
    printer.note(&format!(
        "# done: {} rows, {:.1} MiB received from {}",
        summary.rows,
        summary.bytes as f64 / f64::from(1u32 << 20),
        tcp.peer()
    ));
    Ok(())
}

/// The sender of two processes.
fn peer(
    args: &Args,
    local: Local<'static>,
    printer: &mut Printer,
    spec: &str,
) -> Result<Summary, Failure> {
    let agent = if args.sweep.splits.iter().any(Option::is_some) {
        Some(sides::start_agent()?)
    } else {
        None
    };
    let addrs = link::resolve(spec).map_err(Failure::Usage)?;
    let mut tcp = link::connect(spec, &addrs, args.timeout).map_err(Failure::Run)?;
    let ctx = SendCtx {
        local,
        sweep: &args.sweep,
        agent: agent.as_ref(),
        mode: format!(
            "two processes (this sender, the receiver at {})",
            tcp.peer()
        ),
        group: None,
        devices: &[],
    };
    sender::send(&ctx, &mut tcp, printer)
}
