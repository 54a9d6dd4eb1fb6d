//! The receiver, and what both sides share. The same code runs whether the other side is a
//! thread of this process or a process on another host (only the [`Link`] differs); the sender
//! is in `sender.rs`.
//!
//! Receiver: wait for the sweep, (two processes with `--sup-bw`: start its own test agent so its
//! plugin is in advanced mode too, which MPIB requires of both ends), `init` + `listen`, send the
//! handle, `accept`, then per row a warmup pass and a timed pass, sending its numbers after each
//! row; at the end the barrier. Either side that fails tells the other, which stops at once
//! instead of at its deadline.

use std::time::Duration;

use mpib_driver::abi::MAX_NET_SIZE;
use mpib_driver::net::{MemHandle, RecvComm};
use mpib_driver::xfer::{Listener, SideOptions};
use mpib_driver::{pattern, Agent, Error, Net, Plugin, Props, Version};

use crate::link::{Link, Msg, RecvStats};
use crate::output::Printer;
use crate::pass::Pass;
use crate::sweep::{RowSpec, Sweep};
use crate::Failure;

/// This process's plugin and settings.
#[derive(Clone, Copy)]
pub struct Local<'a> {
    pub plugin: &'a Plugin,
    pub path: &'a str,
    pub version: Version,
    pub dev: i32,
    pub timeout: Duration,
}

impl Local<'_> {
    /// The driver's side options: every deadline is `--timeout`.
    pub fn options(&self) -> SideOptions {
        SideOptions {
            dev: self.dev,
            env: Vec::new(),
            connect_deadline: self.timeout,
            data_deadline: self.timeout,
        }
    }
}

/// What a side moved.
pub struct Summary {
    pub rows: usize,
    pub bytes: u64,
}

/// A protocol error: `got` arrived where `what` was due.
pub fn unexpected(what: &str, got: &Msg) -> Failure {
    let kind = match got {
        Msg::Sweep(_) => "the sweep",
        Msg::Handle(_) => "a handle",
        Msg::Stats(_) => "row numbers",
        Msg::Done(_) => "the end of the sweep",
        Msg::Failed(_) => "a failure",
    };
    Failure::Run(format!(
        "protocol: expected {what} from the other side, got {kind}"
    ))
}

/// Starts a test agent and points this process's plugin at it (advanced mode). Called before any
/// `init`, while the environment is still ours to change (the agent's thread never reads it).
pub fn start_agent() -> Result<Agent, Failure> {
    let agent =
        Agent::start_in_temp().map_err(|e| Failure::Run(format!("--sup-bw: test agent: {e}")))?;
    let vars = agent.env();
    let lock = mpib_driver::env::lock();
    let vars: Vec<(&str, Option<&str>)> =
        vars.iter().map(|(k, v)| (*k, Some(v.as_str()))).collect();
    let _ = mpib_driver::env::apply(&lock, &vars);
    Ok(agent)
}

/// Refuses sweeps the device or the ABI cannot take, naming the flag.
pub fn check_device(sweep: &Sweep, props: &Props, local: &Local<'_>) -> Result<(), Failure> {
    let max = sweep.max_size();
    if i64::try_from(sweep.group).unwrap_or(i64::MAX) > i64::from(props.max_recvs) {
        return Err(Failure::Usage(format!(
            "--group {}: device {} \"{}\" takes at most {} buffers per irecv (maxRecvs)",
            sweep.group, local.dev, props.name, props.max_recvs
        )));
    }
    if local.version.int_sizes() && max > MAX_NET_SIZE {
        return Err(Failure::Usage(format!(
            "--max-size {max}: ncclNetPlugin_{} takes messages up to {MAX_NET_SIZE} bytes (int \
             sizes); use --abi 9 or newer",
            local.version
        )));
    }
    if let Some(limit) = props.max_p2p_bytes.filter(|l| max > *l) {
        return Err(Failure::Usage(format!(
            "--max-size {max}: device {} \"{}\" reports maxP2pBytes {limit}",
            local.dev, props.name
        )));
    }
    Ok(())
}

/// Refuses a sweep whose buffers (`need` bytes in this process) would not fit in memory
/// (registration pins them), before allocating anything, rather than dying on a failed
/// allocation.
pub fn check_memory(s: &Sweep, need: usize) -> Result<(), Failure> {
    // SAFETY: sysconf only reads system configuration.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    let physical =
        u64::try_from(pages.max(0)).unwrap_or(0) * u64::try_from(page.max(0)).unwrap_or(0);
    if physical > 0 && need as u64 > physical / 2 {
        return Err(Failure::Usage(format!(
            "--max-size {} with --window {}, --group {}{}: the buffers need {} MiB, over half of \
             this machine's {} MiB; lower --max-size, --window or --group{}",
            s.max_size(),
            s.window,
            s.group,
            if s.verify { " and --verify" } else { "" },
            need >> 20,
            physical >> 20,
            if s.verify { ", or drop --verify" } else { "" }
        )));
    }
    Ok(())
}

/// The warmup and timed passes of `spec` (both sides derive the same pattern seeds).
pub fn passes<'a>(
    sweep: &'a Sweep,
    spec: RowSpec,
    region: Region<'a>,
    timeout: Duration,
) -> [Pass<'a>; 2] {
    let stride = sweep.stride();
    let pass = |phase: &str, iters: u64| Pass {
        sweep,
        stride,
        row: spec,
        iters,
        seed: pattern::case_id(&format!("mpib-perf row {} {phase}", spec.index)),
        deadline: timeout,
        base: region.base,
        mhandle: region.mhandle,
    };
    [pass("warmup", sweep.warmup), pass("timed", spec.iters)]
}

/// "sup_bw 512, size 4096": where a failure happened.
pub fn at(spec: &RowSpec, phase: &str) -> String {
    let split = spec
        .split
        .map_or_else(String::new, |s| format!("sup_bw {s}, "));
    format!("{split}size {}, {phase} pass", spec.size)
}

/// The receiving side, to the end of the sweep. A failure is also sent to the other side.
/// `own_process`: this receiver is a process of its own (`--listen`), so it checks its own
/// buffer memory and, for `--sup-bw`, runs its own test agent; in one process the main thread
/// did both for the two sides.
pub fn receive(
    local: Local<'_>,
    link: &mut dyn Link,
    own_process: bool,
    printer: Option<&Printer>,
) -> Result<Summary, Failure> {
    let outcome = receive_inner(local, link, own_process, printer);
    if let Err(e) = &outcome {
        link.fail(e.message());
    }
    outcome
}

fn receive_inner(
    local: Local<'_>,
    link: &mut dyn Link,
    own_process: bool,
    printer: Option<&Printer>,
) -> Result<Summary, Failure> {
    let sweep = match link
        .recv("the sweep parameters", local.timeout)
        .map_err(Failure::Run)?
    {
        Msg::Sweep(s) => s,
        other => return Err(unexpected("the sweep parameters", &other)),
    };
    if own_process {
        check_memory(&sweep, sweep.recv_len())?;
    }
    let advanced = sweep.splits.iter().any(Option::is_some);
    let _agent = if own_process && advanced {
        Some(start_agent()?)
    } else {
        None
    };
    let net = local.plugin.net(local.version)?;
    let listener = Listener::new(&net, &local.options())
        .map_err(|e| Failure::Run(format!("receiver init/listen: {e}")))?;
    link.send(&Msg::Handle(listener.handle()))
        .map_err(Failure::Run)?;
    let mut receiver = listener
        .accept()
        .map_err(|e| Failure::Run(format!("receiver: {e}")))?;
    let props = net.get_properties(local.dev)?;
    check_device(&sweep, &props, &local)?;
    if let Some(printer) = printer {
        printer.note(&format!(
            "# receiver: {} (ncclNetPlugin_{}), device {} \"{}\"; {} rows from the sender{}",
            local.path,
            local.version,
            local.dev,
            props.name,
            sweep.rows().len(),
            if advanced {
                ", advanced mode (own test agent)"
            } else {
                ""
            }
        ));
    }
    let summary = receiver
        .with_region(sweep.recv_len(), |net, comm, buf, mhandle| {
            let region = Region {
                base: buf.as_mut_ptr(),
                mhandle,
            };
            receive_rows(net, comm, region, &sweep, local, link)
        })
        .map_err(|e| Failure::Run(format!("receiver: {e}")))?;
    match link
        .recv("the end of the sweep", local.timeout)
        .map_err(Failure::Run)?
    {
        Msg::Done(_) => {}
        other => return Err(unexpected("the end of the sweep", &other)),
    }
    link.send(&Msg::Done(summary.rows)).map_err(Failure::Run)?;
    receiver
        .close()
        .map_err(|e| Failure::Run(format!("receiver close: {e}")))?;
    Ok(summary)
}

fn receive_rows(
    net: &Net<'_>,
    comm: &RecvComm,
    region: Region<'_>,
    sweep: &Sweep,
    local: Local<'_>,
    link: &mut dyn Link,
) -> mpib_driver::Result<Summary> {
    let mut summary = Summary { rows: 0, bytes: 0 };
    for spec in sweep.rows() {
        let [warmup, timed] = passes(sweep, spec, region, local.timeout);
        let mut watch = || link.peer_failed();
        warmup
            .recv(net, comm, &mut watch)
            .map_err(|e| e.context(at(&spec, "warmup")))?;
        let timing = timed
            .recv(net, comm, &mut watch)
            .map_err(|e| e.context(at(&spec, "timed")))?;
        let stats = RecvStats {
            row: spec.index,
            elapsed_ns: nanos(timing.elapsed),
            p50_ns: nanos(timing.percentile(50.0)),
            p99_ns: nanos(timing.percentile(99.0)),
            bytes: timing.bytes,
        };
        link.send(&Msg::Stats(stats)).map_err(Error::Io)?;
        summary.rows += 1;
        summary.bytes += timing.bytes;
    }
    Ok(summary)
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The registered region `with_region` lends: its first byte and its registration.
#[derive(Clone, Copy)]
pub struct Region<'r> {
    pub base: *mut u8,
    pub mhandle: &'r MemHandle,
}
