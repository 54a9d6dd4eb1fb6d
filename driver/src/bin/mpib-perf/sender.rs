//! The sending side: ship the sweep, wait for the handle, `connect`, then per row set the
//! agent's share, a warmup pass, the rails before, the timed pass, the rails after, the
//! receiver's numbers, and a table row; at the end the barrier.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use mpib_driver::net::SendComm;
use mpib_driver::rails::{Direction, Probes};
use mpib_driver::xfer::Sender;
use mpib_driver::{Agent, Error, Net, Props};

use crate::group::Group;
use crate::link::{Link, Msg, RecvStats};
use crate::output::{Printer, Row};
use crate::pass::Timing;
use crate::sides::{at, check_device, passes, unexpected, Local, Region, Summary};
use crate::sweep::{RowSpec, Sweep};
use crate::Failure;

/// What the sender needs per row besides the comm.
pub struct SendCtx<'a> {
    pub local: Local<'a>,
    pub sweep: &'a Sweep,
    pub agent: Option<&'a Agent>,
    /// The header's "mode" words.
    pub mode: String,
    /// `--comms`: the connections this one moves its rows with, and its place among them (the
    /// first prints).
    pub group: Option<(&'a Group, usize)>,
    /// `--dev` as listed: with several, connection `m` is on `devices[m % len]`, and the first
    /// prints each device's rate after the row.
    pub devices: &'a [i32],
}

impl SendCtx<'_> {
    /// Whether this connection prints (the only one, or the first of a group).
    fn leads(&self) -> bool {
        self.group.map_or(true, |(_, member)| member == 0)
    }

    /// Meets the group's other connections, if any.
    fn meet(&self, what: &str) -> mpib_driver::Result<()> {
        match self.group {
            Some((group, _)) => group.meet(what, self.local.timeout).map_err(Error::Io),
            None => Ok(()),
        }
    }
}

/// The sending side, to the end of the sweep, printing a row per size. A failure is also sent to
/// the other side.
pub fn send(
    ctx: &SendCtx<'_>,
    link: &mut dyn Link,
    printer: &mut Printer,
) -> Result<Summary, Failure> {
    let outcome = send_inner(ctx, link, printer);
    if let Err(e) = &outcome {
        link.fail(e.message());
        if let Some((group, member)) = ctx.group {
            group.fail(&format!("connection {member}: {}", e.message()));
        }
    }
    outcome
}

fn send_inner(
    ctx: &SendCtx<'_>,
    link: &mut dyn Link,
    printer: &mut Printer,
) -> Result<Summary, Failure> {
    let local = ctx.local;
    link.send(&Msg::Sweep(ctx.sweep.clone()))
        .map_err(Failure::Run)?;
    let handle = match link
        .recv("the listen handle", local.timeout)
        .map_err(Failure::Run)?
    {
        Msg::Handle(h) => h,
        other => return Err(unexpected("the listen handle", &other)),
    };
    let net = local.plugin.net(local.version)?;
    let mut sender = Sender::connect(&net, &local.options(), &handle)
        .map_err(|e| Failure::Run(format!("sender init/connect: {e}")))?;
    let props = net.get_properties(local.dev)?;
    check_device(ctx.sweep, &props, &local)?;
    if let Some(agent) = ctx.agent {
        let limit = local.timeout.min(Duration::from_secs(10));
        agent.wait_for_registrations(1, limit).map_err(|e| {
            Failure::Usage(format!(
                "--sup-bw: {} did not register its connection with the test agent ({e}); the \
                 SUP share is MPIB's advanced mode (MPIB_MODE=1)",
                local.path
            ))
        })?;
    }
    let probes = rails_probe(ctx.group.is_some());
    if ctx.leads() {
        printer.header(&header_lines(ctx, &net, &props, probes.as_ref()));
    }
    let summary = sender
        .with_region(ctx.sweep.send_len(), |net, comm, buf, mhandle| {
            let region = Region {
                base: buf.as_mut_ptr(),
                mhandle,
            };
            send_rows(ctx, net, comm, region, link, printer, probes.as_ref())
        })
        .map_err(|e| Failure::Run(format!("sender: {e}")))?;
    link.send(&Msg::Done(summary.rows)).map_err(Failure::Run)?;
    match link
        .recv("the receiver's end of the sweep", local.timeout)
        .map_err(Failure::Run)?
    {
        Msg::Done(_) => {}
        other => return Err(unexpected("the end of the sweep", &other)),
    }
    sender
        .close()
        .map_err(|e| Failure::Run(format!("sender close: {e}")))?;
    Ok(summary)
}

/// MPIB's probes file and this process's send connection in it, when there is one (other
/// plugins, or `MPIB_PROBES=0`: no rail columns).
pub struct RailProbe {
    pub probes: Probes,
    /// This connection's slot; `None`: every send connection of the process (`--comms`).
    index: Option<u64>,
}

impl RailProbe {
    fn bytes(&self) -> mpib_driver::Result<(u64, u64)> {
        match self.index {
            Some(index) => Ok(self.probes.at(index)?.rail_bytes),
            None => Ok(self
                .probes
                .connections()?
                .iter()
                .filter(|c| c.direction == Direction::Send)
                .fold((0, 0), |(a, b), c| (a + c.rail_bytes.0, b + c.rail_bytes.1))),
        }
    }
}

fn rails_probe(all: bool) -> Option<RailProbe> {
    let probes = Probes::open_own().ok()?;
    let index = if all {
        None
    } else {
        Some(probes.only(Direction::Send).ok()?.index)
    };
    Some(RailProbe { probes, index })
}

fn send_rows(
    ctx: &SendCtx<'_>,
    net: &Net<'_>,
    comm: &SendComm,
    region: Region<'_>,
    link: &mut dyn Link,
    printer: &mut Printer,
    probe: Option<&RailProbe>,
) -> mpib_driver::Result<Summary> {
    let rows = ctx.sweep.rows();
    let mut summary = Summary { rows: 0, bytes: 0 };
    let mut split = None;
    let started = std::time::Instant::now();
    for spec in &rows {
        if let (Some(agent), Some(share)) = (ctx.agent, spec.split) {
            if split != Some(share) {
                agent.set_sup_bw_all(share);
                split = Some(share);
            }
        }
        if ctx.leads() {
            printer.progress(spec, rows.len());
        }
        let [warmup, timed] = passes(ctx.sweep, *spec, region, ctx.local.timeout);
        let mut watch = || link.peer_failed();
        warmup
            .send(net, comm, &mut watch)
            .map_err(|e| e.context(at(spec, "warmup")))?;
        // Every connection's warmup is done before the rails are read, and the timed pass starts
        // only after the reading: read after the start, a connection already posting its first
        // transfer was missing from the row (1 MiB of 24 in one run of `--comms 3` in five).
        ctx.meet(&at(spec, "the end of the warmup"))?;
        let before = probe.map(RailProbe::bytes).transpose()?;
        ctx.meet(&at(spec, "the start of the timed pass"))?;
        let timing = timed
            .send(net, comm, &mut watch)
            .map_err(|e| e.context(at(spec, "timed")))?;
        if let Some((group, member)) = ctx.group {
            group.add(spec.index, member, timing.bytes, timing.elapsed);
        }
        ctx.meet(&at(spec, "the end of the timed pass"))?;
        let after = probe.map(RailProbe::bytes).transpose()?;
        // The first connection has read the rails: the others may start the next warmup.
        ctx.meet(&at(spec, "the rails' reading"))?;
        let stats = receiver_stats(link, spec, ctx.local.timeout)?;
        if stats.bytes != timing.bytes {
            return Err(Error::Mismatch(format!(
                "{}: the receiver got {} bytes, the sender sent {}",
                at(spec, "timed"),
                stats.bytes,
                timing.bytes
            )));
        }
        let rails = before.zip(after).map(|(b, a)| (a.0 - b.0, a.1 - b.1));
        let mut row = Row {
            at: started.elapsed(),
            unix: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default(),
            ..make_row(ctx.sweep, spec, &timing, &stats, rails)
        };
        if let Some((group, _)) = ctx.group {
            let totals = group.totals(spec.index);
            row.bytes = totals.bytes;
            row.elapsed = totals.elapsed;
            row.iters = spec.iters * group.members() as u64;
        }
        if ctx.leads() {
            printer.row(&row).map_err(Error::Io)?;
            print_devices(ctx, spec, printer);
        }
        summary.rows += 1;
        summary.bytes += row.bytes;
    }
    Ok(summary)
}

/// `--dev` with several devices: one note per device after the row, its connections' bytes over
/// their slowest pass (`# size 4194304 dev 1: 2.991 GB/s`).
fn print_devices(ctx: &SendCtx<'_>, spec: &RowSpec, printer: &Printer) {
    let Some((group, _)) = ctx.group.filter(|_| ctx.devices.len() > 1) else {
        return;
    };
    for (dev, totals) in ctx
        .devices
        .iter()
        .zip(group.totals_by(spec.index, ctx.devices.len()))
    {
        let seconds = totals.elapsed.as_secs_f64();
        let rate = if seconds > 0.0 {
            totals.bytes as f64 / seconds / 1e9
        } else {
            0.0
        };
        printer.note(&format!("# size {} dev {dev}: {rate:.3} GB/s", spec.size));
    }
}

fn receiver_stats(
    link: &mut dyn Link,
    spec: &RowSpec,
    limit: Duration,
) -> mpib_driver::Result<RecvStats> {
    let what = format!("the receiver's numbers for size {}", spec.size);
    match link.recv(&what, limit).map_err(Error::Io)? {
        Msg::Stats(s) if s.row == spec.index => Ok(s),
        Msg::Stats(s) => Err(Error::Io(format!(
            "protocol: the receiver sent numbers for row {}, expected row {}",
            s.row, spec.index
        ))),
        other => Err(Error::Io(unexpected(&what, &other).message().to_string())),
    }
}

fn make_row(
    sweep: &Sweep,
    spec: &RowSpec,
    timing: &Timing,
    stats: &RecvStats,
    rails: Option<(u64, u64)>,
) -> Row {
    Row {
        split: spec.split,
        size: spec.size,
        iters: spec.iters,
        group: sweep.group,
        window: sweep.window,
        bytes: timing.bytes,
        elapsed: timing.elapsed,
        send_p50: timing.percentile(50.0),
        send_p99: timing.percentile(99.0),
        recv_p50: Duration::from_nanos(stats.p50_ns),
        recv_p99: Duration::from_nanos(stats.p99_ns),
        rails,
        verified: sweep.verify,
        at: Duration::ZERO,
        unix: Duration::ZERO,
    }
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.to_string())
}

/// The header: plugin, ABI, device, mode and sweep settings, where the rail numbers come from.
fn header_lines(
    ctx: &SendCtx<'_>,
    net: &Net<'_>,
    props: &Props,
    probe: Option<&RailProbe>,
) -> Vec<String> {
    let s = ctx.sweep;
    let iters = s.iters.map_or_else(
        || "auto (about 256 MiB per size, 20..1000)".into(),
        |n| n.to_string(),
    );
    let splits = match ctx.agent {
        Some(agent) => format!(
            "sup_bw {} via a test agent (MPIB_MODE=1, MPIB_HINT_PATH={})",
            s.splits
                .iter()
                .flatten()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(","),
            agent.hint_path().display()
        ),
        None => format!(
            "the environment as given (MPIB_MODE={}, MPIB_FABRIC={})",
            env_or("MPIB_MODE", "unset"),
            env_or("MPIB_FABRIC", "unset")
        ),
    };
    let rails = match probe {
        Some(p) => format!("from the probes file {}", p.probes.path().display()),
        None => "not available (not MPIB, or MPIB_PROBES=0)".into(),
    };
    vec![
        format!(
            "mpib-perf: plugin {} (ncclNetPlugin_{} \"{}\")",
            ctx.local.path,
            ctx.local.version,
            net.name()
        ),
        format!(
            "device {} \"{}\", {} Mbps, maxRecvs {}",
            ctx.local.dev, props.name, props.speed, props.max_recvs
        ),
        format!("mode: {}", ctx.mode),
        format!(
            "window {}, group {}, warmup {}, iters {iters}, verify {}, timeout {:?}",
            s.window,
            s.group,
            s.warmup,
            if s.verify { "on" } else { "off" },
            ctx.local.timeout
        ),
        format!("split: {splits}"),
        format!("rails: {rails}"),
    ]
}
