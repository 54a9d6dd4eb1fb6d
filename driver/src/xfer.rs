//! One side of a rank pair, for runs where the receiver and the sender live in different
//! processes (the verbs rig: `mpib-xfer`) or on different threads of one process (the loopback
//! runs of the same cases, [`run_in_process`]).
//!
//! The receiver `init`s, `listen`s and publishes the 128-byte handle (a file, atomically renamed
//! into place, or a channel); the sender waits for it and `connect`s; both poll non-blocking
//! `connect`/`accept` under a deadline. Then each side walks the same [`Case`] list in the same
//! order with a one-sided, NCCL-proxy-like loop (post while the plugin accepts and the window
//! allows, test every outstanding request, bounded by a deadline). The receiver checks every byte
//! against the pattern of (case, step, iteration, message) and the guard bytes after every
//! buffer; the sender checks the sizes `test` reports. With probes on, both sides also check
//! which rail carried the bytes (see [`crate::rails`]). Every failure names the version, the case,
//! the plan (which names the size) and the iteration.

use std::ffi::c_void;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::abi::{HANDLE_SIZE, NCCL_PTR_HOST, PROXY_MAX_SUBS};
use crate::agent::Agent;
use crate::cases::{Case, Step};
use crate::error::{Error, Result};
use crate::net::{
    DataComm, ListenComm, MemHandle, Net, NetCtx, RecvBuf, RecvComm, Request, SendComm,
};
use crate::pattern;
use crate::plan::{Plan, GUARD};
use crate::plugin::{Plugin, Version};
use crate::rails::{Connection, Direction, PathClass, Probes};

/// Environment changes applied around one side's `init`.
pub type EnvVars = Vec<(String, Option<String>)>;

/// How one side is set up.
#[derive(Clone, Debug)]
pub struct SideOptions {
    /// Device (MPIB exposes device 0).
    pub dev: i32,
    /// Variables set around `init` (v11+ snapshot them per communicator; older versions once per
    /// process).
    pub env: EnvVars,
    /// Bound on the connect/accept loop.
    pub connect_deadline: Duration,
    /// Bound on one iteration of one step.
    pub data_deadline: Duration,
}

impl Default for SideOptions {
    fn default() -> SideOptions {
        SideOptions {
            dev: 0,
            env: Vec::new(),
            connect_deadline: Duration::from_secs(60),
            data_deadline: Duration::from_secs(120),
        }
    }
}

fn env_refs(vars: &[(String, Option<String>)]) -> Vec<(&str, Option<&str>)> {
    vars.iter()
        .map(|(k, v)| (k.as_str(), v.as_deref()))
        .collect()
}

static NEXT_COMM_ID: AtomicU64 = AtomicU64::new(0x5846_0000);

fn comm_id() -> u64 {
    (u64::from(std::process::id()) << 32) | NEXT_COMM_ID.fetch_add(1, Ordering::Relaxed)
}

struct Region {
    buf: Vec<u8>,
    mhandle: Option<MemHandle>,
}

impl Region {
    fn new() -> Region {
        Region {
            buf: Vec::new(),
            mhandle: None,
        }
    }

    fn reserve(&mut self, net: &Net<'_>, comm: &impl DataComm, len: usize) -> Result<()> {
        if self.buf.len() >= len && self.mhandle.is_some() {
            return Ok(());
        }
        if let Some(mh) = self.mhandle.take() {
            net.dereg_mr(comm, mh)?;
        }
        self.buf = vec![0u8; len.max(4096)];
        let (ptr, size) = (self.buf.as_mut_ptr().cast(), self.buf.len());
        // SAFETY: host memory owned by this region, deregistered before it is freed or replaced
        // (or leaked after a failed run, see `teardown`).
        self.mhandle = Some(unsafe { net.reg_mr(comm, ptr, size, NCCL_PTR_HOST) }?);
        Ok(())
    }

    fn mhandle(&self) -> &MemHandle {
        self.mhandle.as_ref().expect("reserved")
    }
}

/// Parses `v12`, `12`, `v8`, … (any exported version, v7 to v12).
pub fn parse_version(text: &str) -> Result<Version> {
    let number = text.trim().trim_start_matches('v').parse::<u32>().ok();
    Version::ALL
        .into_iter()
        .find(|v| Some(v.number()) == number)
        .ok_or_else(|| Error::Refused(format!("version {text:?}: expected v7 ... v12")))
}

/// Where a failure happened: "v12 case sizes step 3 (size 4097) iteration 1".
fn at(version: Version, case: &Case, index: usize, step: &Step, iteration: u64) -> String {
    format!(
        "{version} case {} step {index} ({}) iteration {iteration}",
        case.name, step.plan.label
    )
}

/// A receiver that is listening: its handle can be shipped to the sender.
pub struct Listener<'n, 'p> {
    net: &'n Net<'p>,
    ctx: Option<NetCtx>,
    listen: Option<ListenComm>,
    handle: [u8; HANDLE_SIZE],
    options: SideOptions,
}

impl<'n, 'p> Listener<'n, 'p> {
    /// `init` (with `options.env`), then `listen`.
    pub fn new(net: &'n Net<'p>, options: &SideOptions) -> Result<Listener<'n, 'p>> {
        let ctx = net.init_with_env(comm_id(), &env_refs(&options.env))?;
        let mut handle = [0u8; HANDLE_SIZE];
        let listen = match net.listen(&ctx, options.dev, &mut handle) {
            Ok(listen) => listen,
            Err(e) => {
                let _ = net.finalize(ctx);
                return Err(e);
            }
        };
        Ok(Listener {
            net,
            ctx: Some(ctx),
            listen: Some(listen),
            handle,
            options: options.clone(),
        })
    }

    /// The handle `listen` filled.
    pub fn handle(&self) -> [u8; HANDLE_SIZE] {
        self.handle
    }

    /// Writes the handle to `path` atomically (a temporary file renamed into place).
    pub fn publish(&self, path: &Path) -> Result<()> {
        write_handle(path, &self.handle)
    }

    /// Polls the non-blocking `accept` until it returns a comm (bounded by the connect
    /// deadline), then `closeListen`.
    pub fn accept(mut self) -> Result<Receiver<'n, 'p>> {
        let net = self.net;
        let version = net.version();
        let limit = self.options.connect_deadline;
        let listen = self.listen.take().expect("listening");
        let start = Instant::now();
        let outcome = loop {
            match net.accept(&listen) {
                Ok(Some(comm)) => break Ok(comm),
                Ok(None) => {}
                Err(e) => break Err(e.context(format!("{version} accept"))),
            }
            if start.elapsed() > limit {
                break Err(Error::Timeout(format!(
                    "{version} accept: no connection after {limit:?} (did the sender start and \
                     read the handle?)"
                )));
            }
            std::thread::sleep(Duration::from_micros(200));
        };
        let closed = net.close_listen(listen);
        let comm = outcome?;
        let receiver = Receiver {
            net,
            ctx: self.ctx.take(),
            comm: Some(comm),
            region: Region::new(),
            tainted: false,
            data_deadline: self.options.data_deadline,
        };
        closed?;
        Ok(receiver)
    }
}

impl Drop for Listener<'_, '_> {
    fn drop(&mut self) {
        if let Some(listen) = self.listen.take() {
            let _ = self.net.close_listen(listen);
        }
        if let Some(ctx) = self.ctx.take() {
            let _ = self.net.finalize(ctx);
        }
    }
}

/// Writes a handle to `path` through a temporary file and a rename, so a reader never sees a
/// partial handle.
pub fn write_handle(path: &Path, handle: &[u8; HANDLE_SIZE]) -> Result<()> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "handle".into());
    let temporary = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    std::fs::write(&temporary, handle)
        .and_then(|()| std::fs::rename(&temporary, path))
        .map_err(|e| Error::Io(format!("write handle {}: {e}", path.display())))
}

/// Waits (bounded) until `path` holds a whole handle and returns it.
pub fn wait_for_handle(path: &Path, limit: Duration) -> Result<[u8; HANDLE_SIZE]> {
    wait_for_handle_while(path, limit, || Ok(()))
}

/// [`wait_for_handle`], giving up as soon as `alive` fails (e.g. the receiver process exited).
pub fn wait_for_handle_while(
    path: &Path,
    limit: Duration,
    mut alive: impl FnMut() -> Result<()>,
) -> Result<[u8; HANDLE_SIZE]> {
    let start = Instant::now();
    loop {
        match std::fs::read(path) {
            Ok(bytes) if bytes.len() == HANDLE_SIZE => {
                let mut handle = [0u8; HANDLE_SIZE];
                handle.copy_from_slice(&bytes);
                return Ok(handle);
            }
            Ok(bytes) => {
                return Err(Error::Io(format!(
                    "{}: {} bytes, expected a {HANDLE_SIZE}-byte handle",
                    path.display(),
                    bytes.len()
                )))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::Io(format!("read {}: {e}", path.display()))),
        }
        alive()?;
        if start.elapsed() > limit {
            return Err(Error::Timeout(format!(
                "no handle at {} after {limit:?} (did the receiver start and listen?)",
                path.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The posting and testing loop both sides share: `post(i)` posts item `i` (`None`: "try again
/// later"), `test(i, request)` tests it (`true`: done).
struct Loop<'a> {
    what: &'a str,
    count: usize,
    window: usize,
    deadline: Duration,
}

impl Loop<'_> {
    fn run(
        &self,
        mut post: impl FnMut(usize) -> Result<Option<Request>>,
        mut test: impl FnMut(usize, &Request) -> Result<bool>,
    ) -> Result<()> {
        let (mut next, mut out) = (0usize, Vec::<(usize, Request)>::new());
        let start = Instant::now();
        while next < self.count || !out.is_empty() {
            let mut progressed = false;
            while next < self.count && out.len() < self.window {
                match post(next)? {
                    Some(request) => {
                        out.push((next, request));
                        next += 1;
                        progressed = true;
                    }
                    None => break,
                }
            }
            let mut i = 0;
            while i < out.len() {
                let (index, request) = out[i];
                if test(index, &request)? {
                    out.swap_remove(i);
                    progressed = true;
                } else {
                    i += 1;
                }
            }
            if start.elapsed() > self.deadline {
                let pending: Vec<usize> = out.iter().map(|(i, _)| *i).take(8).collect();
                return Err(Error::Timeout(format!(
                    "not done after {:?}: {} of {} {} posted, #{pending:?} still outstanding{}",
                    self.deadline,
                    next,
                    self.count,
                    self.what,
                    if next < self.count {
                        format!(", #{next} refused (NULL request) until the end")
                    } else {
                        String::new()
                    }
                )));
            }
            if !progressed {
                std::thread::yield_now();
            }
        }
        Ok(())
    }
}

/// The receiving side of a connected pair.
pub struct Receiver<'n, 'p> {
    net: &'n Net<'p>,
    ctx: Option<NetCtx>,
    comm: Option<RecvComm>,
    region: Region,
    tainted: bool,
    data_deadline: Duration,
}

impl Receiver<'_, '_> {
    /// The ABI version driven.
    pub fn version(&self) -> Version {
        self.net.version()
    }

    /// Posts every grouped receive of `plan` (at most `max_recvs_in_flight` at once), tests them
    /// to completion, then checks the reported sizes, every byte and the guards. Returns the time
    /// from the first post to the last completion.
    pub fn run_plan(&mut self, plan: &Plan, seed: u64, iteration: u64) -> Result<Duration> {
        if self.tainted {
            return Err(Error::Contract(
                "an earlier step failed; the receiver is unusable".into(),
            ));
        }
        let net = self.net;
        let comm = self.comm.as_ref().expect("connected");
        self.region.reserve(net, comm, plan.recv_len())?;
        for r in plan.recvs.iter().flatten() {
            self.region.buf[r.offset..r.offset + r.capacity + GUARD].fill(pattern::POISON);
        }
        let mut sizes: Vec<Vec<i32>> = plan.recvs.iter().map(|g| vec![-1; g.len()]).collect();
        let start = Instant::now();
        let base = self.region.buf.as_mut_ptr();
        let mhandle = self.region.mhandle().as_ptr();
        let looped = Loop {
            what: "irecv",
            count: plan.recvs.len(),
            window: plan.max_recvs_in_flight,
            deadline: self.data_deadline,
        }
        .run(
            |g| {
                let bufs: Vec<RecvBuf> = plan.recvs[g]
                    .iter()
                    .map(|r| RecvBuf {
                        // SAFETY: offsets lie within the region (`recv_len` was reserved).
                        data: unsafe { base.add(r.offset) }.cast::<c_void>(),
                        size: r.capacity,
                        tag: r.tag,
                        mhandle,
                    })
                    .collect();
                // SAFETY: the buffers lie in the registered region, which outlives the request (a
                // failed run leaks it instead of freeing it).
                unsafe { net.irecv(comm, &bufs) }
                    .map_err(|e| e.context(format!("irecv #{g} (n={})", bufs.len())))
            },
            |g, request| {
                let mut got = [0i32; PROXY_MAX_SUBS];
                let done = net
                    .test(request, Some(&mut got[..]))
                    .map_err(|e| e.context(format!("test of irecv #{g}")))?;
                if done {
                    sizes[g].copy_from_slice(&got[..plan.recvs[g].len()]);
                }
                Ok(done)
            },
        );
        let busy = start.elapsed();
        if let Err(e) = looped {
            self.tainted = true;
            return Err(e);
        }
        self.verify(plan, seed, iteration, &sizes)?;
        Ok(busy)
    }

    fn verify(&self, plan: &Plan, seed: u64, iteration: u64, sizes: &[Vec<i32>]) -> Result<()> {
        for (g, group) in plan.recvs.iter().enumerate() {
            for (b, r) in group.iter().enumerate() {
                let sent = plan.sends[r.source].size;
                let where_ = || format!("irecv #{g} buffer {b} (tag {}, {sent} bytes)", r.tag);
                let got = sizes[g][b];
                if usize::try_from(got).ok() != Some(sent) {
                    return Err(Error::Mismatch(format!(
                        "{}: test reported size {got}, sent {sent}",
                        where_()
                    )));
                }
                let data = &self.region.buf[r.offset..r.offset + sent];
                let message = pattern::seed(seed, iteration, r.source as u64);
                if let Some((i, expected, found)) = pattern::first_mismatch(data, message) {
                    return Err(Error::Mismatch(format!(
                        "{}: byte {i} is {found:#04x}, expected {expected:#04x}",
                        where_()
                    )));
                }
                let tail = &self.region.buf[r.offset + sent..r.offset + r.capacity + GUARD];
                if let Some(i) = pattern::first_unpoisoned(tail) {
                    return Err(Error::Mismatch(format!(
                        "{}: byte {} written past the message (capacity {})",
                        where_(),
                        sent + i,
                        r.capacity
                    )));
                }
            }
        }
        Ok(())
    }

    /// `deregMr`, `closeRecv`, `finalize`; everything is attempted, the first error returned.
    pub fn close(mut self) -> Result<()> {
        self.teardown()
    }

    fn teardown(&mut self) -> Result<()> {
        let net = self.net;
        let mut first = Ok(());
        if self.tainted {
            // Requests may still point into the region: never free it.
            std::mem::forget(std::mem::take(&mut self.region.buf));
        }
        if let (Some(comm), Some(mh)) = (self.comm.as_ref(), self.region.mhandle.take()) {
            first = first.and(net.dereg_mr(comm, mh));
        }
        if let Some(comm) = self.comm.take() {
            first = first.and(net.close_recv(comm));
        }
        if let Some(ctx) = self.ctx.take() {
            first = first.and(net.finalize(ctx));
        }
        first
    }
}

impl Drop for Receiver<'_, '_> {
    fn drop(&mut self) {
        let _ = self.teardown();
    }
}

/// The sending side of a connected pair.
pub struct Sender<'n, 'p> {
    net: &'n Net<'p>,
    ctx: Option<NetCtx>,
    comm: Option<SendComm>,
    region: Region,
    tainted: bool,
    data_deadline: Duration,
}

impl<'n, 'p> Sender<'n, 'p> {
    /// `init` (with `options.env`), then the non-blocking `connect` with `handle` until it
    /// returns a comm (bounded by the connect deadline).
    pub fn connect(
        net: &'n Net<'p>,
        options: &SideOptions,
        handle: &[u8; HANDLE_SIZE],
    ) -> Result<Sender<'n, 'p>> {
        let version = net.version();
        let ctx = net.init_with_env(comm_id(), &env_refs(&options.env))?;
        let mut shipped = *handle;
        let start = Instant::now();
        let outcome = loop {
            match net.connect(&ctx, options.dev, &mut shipped) {
                Ok(Some(comm)) => break Ok(comm),
                Ok(None) => {}
                Err(e) => break Err(e.context(format!("{version} connect"))),
            }
            if start.elapsed() > options.connect_deadline {
                break Err(Error::Timeout(format!(
                    "{version} connect: not connected after {:?}",
                    options.connect_deadline
                )));
            }
            std::thread::sleep(Duration::from_micros(200));
        };
        match outcome {
            Ok(comm) => Ok(Sender {
                net,
                ctx: Some(ctx),
                comm: Some(comm),
                region: Region::new(),
                tainted: false,
                data_deadline: options.data_deadline,
            }),
            Err(e) => {
                let _ = net.finalize(ctx);
                Err(e)
            }
        }
    }

    /// The ABI version driven.
    pub fn version(&self) -> Version {
        self.net.version()
    }

    /// Fills every send of `plan` with its pattern, posts them in order (at most
    /// `max_sends_in_flight` at once), tests them to completion and checks the sizes `test`
    /// reports. Returns the time from the first post to the last completion.
    pub fn run_plan(&mut self, plan: &Plan, seed: u64, iteration: u64) -> Result<Duration> {
        if self.tainted {
            return Err(Error::Contract(
                "an earlier step failed; the sender is unusable".into(),
            ));
        }
        let net = self.net;
        let comm = self.comm.as_ref().expect("connected");
        self.region.reserve(net, comm, plan.send_len())?;
        for (i, s) in plan.sends.iter().enumerate() {
            let message = pattern::seed(seed, iteration, i as u64);
            pattern::fill(&mut self.region.buf[s.offset..s.offset + s.size], message);
        }
        let mut sizes = vec![-1i32; plan.sends.len()];
        let start = Instant::now();
        let base = self.region.buf.as_mut_ptr();
        let mhandle = self.region.mhandle();
        let looped = Loop {
            what: "isend",
            count: plan.sends.len(),
            window: plan.max_sends_in_flight,
            deadline: self.data_deadline,
        }
        .run(
            |i| {
                let s = plan.sends[i];
                // SAFETY: the bytes lie in the registered region and stay untouched until the
                // send is done (a failed run leaks the region).
                unsafe { net.isend(comm, base.add(s.offset).cast(), s.size, s.tag, mhandle) }
                    .map_err(|e| e.context(format!("isend #{i} (size {}, tag {})", s.size, s.tag)))
            },
            |i, request| {
                let mut got = [-1i32; 1];
                let done = net
                    .test(request, Some(&mut got[..]))
                    .map_err(|e| e.context(format!("test of isend #{i}")))?;
                if done {
                    sizes[i] = got[0];
                }
                Ok(done)
            },
        );
        let busy = start.elapsed();
        if let Err(e) = looped {
            self.tainted = true;
            return Err(e);
        }
        for (i, (s, got)) in plan.sends.iter().zip(&sizes).enumerate() {
            if usize::try_from(*got).ok() != Some(s.size) {
                return Err(Error::Mismatch(format!(
                    "isend #{i} (tag {}): test reported size {got}, sent {}",
                    s.tag, s.size
                )));
            }
        }
        Ok(busy)
    }

    /// `deregMr`, `closeSend`, `finalize`; everything is attempted, the first error returned.
    pub fn close(mut self) -> Result<()> {
        self.teardown()
    }

    fn teardown(&mut self) -> Result<()> {
        let net = self.net;
        let mut first = Ok(());
        if self.tainted {
            std::mem::forget(std::mem::take(&mut self.region.buf));
        }
        if let (Some(comm), Some(mh)) = (self.comm.as_ref(), self.region.mhandle.take()) {
            first = first.and(net.dereg_mr(comm, mh));
        }
        if let Some(comm) = self.comm.take() {
            first = first.and(net.close_send(comm));
        }
        if let Some(ctx) = self.ctx.take() {
            first = first.and(net.finalize(ctx));
        }
        first
    }
}

impl Drop for Sender<'_, '_> {
    fn drop(&mut self) {
        let _ = self.teardown();
    }
}

/// One side of the walk over the case list.
pub trait Side {
    /// Send or receive.
    const DIRECTION: Direction;
    /// The ABI version driven.
    fn version(&self) -> Version;
    /// Runs one plan once; returns the time from the first post to the last completion.
    fn run_plan(&mut self, plan: &Plan, seed: u64, iteration: u64) -> Result<Duration>;
}

impl Side for Receiver<'_, '_> {
    const DIRECTION: Direction = Direction::Recv;
    fn version(&self) -> Version {
        Receiver::version(self)
    }
    fn run_plan(&mut self, plan: &Plan, seed: u64, iteration: u64) -> Result<Duration> {
        Receiver::run_plan(self, plan, seed, iteration)
    }
}

impl Side for Sender<'_, '_> {
    const DIRECTION: Direction = Direction::Send;
    fn version(&self) -> Version {
        Sender::version(self)
    }
    fn run_plan(&mut self, plan: &Plan, seed: u64, iteration: u64) -> Result<Duration> {
        Sender::run_plan(self, plan, seed, iteration)
    }
}

/// What the walk checks besides the bytes.
#[derive(Clone, Copy, Debug, Default)]
pub struct Checks {
    /// Fail unless the plugin classified the connection so.
    pub class: Option<PathClass>,
    /// Compare each case's bytes per rail (from the probes file) with the split rule.
    pub rails: bool,
}

/// One case done.
#[derive(Clone, Debug)]
pub struct CaseResult {
    /// Its name.
    pub name: String,
    /// Messages moved.
    pub transfers: u64,
    /// Payload bytes moved.
    pub bytes: u64,
    /// Bytes on (SOUT, SUP), when the rails were checked.
    pub rail_bytes: Option<(u64, u64)>,
    /// Wall time (pattern fills and checks included).
    pub elapsed: Duration,
    /// Time with requests in flight (first post to last completion, summed over the plans).
    pub busy: Duration,
}

impl CaseResult {
    /// `sizes: 34 transfers, 10.50 MB in 1.20 s (9.1 MB/s in flight), rails SOUT 0 B / SUP …`.
    pub fn summary(&self) -> String {
        let mb = self.bytes as f64 / 1e6;
        let secs = self.elapsed.as_secs_f64();
        let busy = self.busy.as_secs_f64();
        let rails = match self.rail_bytes {
            Some((sout, sup)) => format!(", rails SOUT {sout} B / SUP {sup} B as expected"),
            None => String::new(),
        };
        format!(
            "{}: {} transfers, {mb:.2} MB in {secs:.2} s ({:.1} MB/s in flight){rails}",
            self.name,
            self.transfers,
            mb / busy.max(1e-9)
        )
    }
}

/// The split the plugin must apply to a message of `size` bytes on `connection` in `case`:
/// vanilla intra-island all SUP, vanilla inter-island all SOUT, advanced the agent's share.
pub fn expected_rails(connection: &Connection, case: &Case, size: usize) -> (usize, usize) {
    if connection.advanced {
        crate::expected_split(size, case.sup_bw.unwrap_or(0))
    } else {
        match connection.class {
            PathClass::Intra => (0, size),
            PathClass::Inter => (size, 0),
        }
    }
}

/// Walks `cases` in order on one side. The sender sets the agent's hints to each case's SUP
/// share first (advanced mode; cases without one run at 0). `log` gets one line per case.
pub fn walk(
    side: &mut impl Side,
    cases: &[Case],
    agent: Option<&Agent>,
    checks: Checks,
    mut log: impl FnMut(&CaseResult),
) -> Result<Vec<CaseResult>> {
    let version = side.version();
    let probes = if checks.rails || checks.class.is_some() {
        Some(Probes::open_own().map_err(|e| e.context("rail check (set MPIB_PROBES=1)"))?)
    } else {
        None
    };
    let connection = match &probes {
        Some(p) => Some(p.only(side_direction(side))?),
        None => None,
    };
    if let (Some(want), Some(c)) = (checks.class, connection) {
        if c.class != want {
            return Err(Error::Mismatch(format!(
                "{version}: the plugin classified the connection as {:?}-island, expected \
                 {want:?}-island (check MPIB_OOB_ADDR and MPIB_ISLAND_PREFIX_LEN)",
                c.class
            )));
        }
    }
    let mut results = Vec::new();
    for case in cases {
        if let Some(agent) = agent {
            agent.set_sup_bw_all(case.sup_bw.unwrap_or(0));
        }
        let before = match (&probes, connection) {
            (Some(p), Some(c)) if checks.rails => Some(p.at(c.index)?),
            _ => None,
        };
        let start = Instant::now();
        let mut busy = Duration::ZERO;
        for (index, step) in case.steps.iter().enumerate() {
            for iteration in 0..step.iterations {
                busy += side
                    .run_plan(&step.plan, step.seed, iteration)
                    .map_err(|e| e.context(at(version, case, index, step, iteration)))?;
            }
        }
        let elapsed = start.elapsed();
        let mut rail_bytes = None;
        if let (Some(p), Some(before)) = (&probes, before) {
            let after = p.at(before.index)?;
            let moved = (
                after.rail_bytes.0 - before.rail_bytes.0,
                after.rail_bytes.1 - before.rail_bytes.1,
            );
            let expected = case.rail_bytes(|size| expected_rails(&before, case, size));
            if moved != expected {
                return Err(Error::Mismatch(format!(
                    "{version} case {}: {:?} bytes per rail (SOUT, SUP) = {moved:?}, expected \
                     {expected:?} ({}, {:?}-island, sup_bw {:?})",
                    case.name,
                    side_direction(side),
                    if before.advanced {
                        "advanced"
                    } else {
                        "vanilla"
                    },
                    before.class,
                    case.sup_bw
                )));
            }
            rail_bytes = Some(moved);
        }
        let result = CaseResult {
            name: case.name.clone(),
            transfers: case.transfers(),
            bytes: case.payload_bytes(),
            rail_bytes,
            elapsed,
            busy,
        };
        log(&result);
        results.push(result);
    }
    Ok(results)
}

fn side_direction<S: Side>(_: &S) -> Direction {
    S::DIRECTION
}

/// Runs `cases` with the receiver and the sender on two threads of this process (the loopback
/// fabric is in-process), with the handle passed through a channel. The agent, if any, is driven
/// by the sender. Returns the sender's and the receiver's results.
pub fn run_in_process(
    plugin: &Plugin,
    version: Version,
    cases: &[Case],
    recv: &SideOptions,
    send: &SideOptions,
    agent: Option<&Agent>,
    checks: Checks,
) -> Result<(Vec<CaseResult>, Vec<CaseResult>)> {
    let (tx, rx) = mpsc::channel::<[u8; HANDLE_SIZE]>();
    std::thread::scope(|scope| {
        let receiver = scope.spawn(move || -> Result<Vec<CaseResult>> {
            let net = plugin.net(version)?;
            let listener = Listener::new(&net, recv)?;
            let _ = tx.send(listener.handle());
            let mut receiver = listener.accept()?;
            let results = walk(&mut receiver, cases, None, checks, |_| {})?;
            receiver.close()?;
            Ok(results)
        });
        let sender = scope.spawn(move || -> Result<Vec<CaseResult>> {
            let net = plugin.net(version)?;
            let handle = rx
                .recv_timeout(send.connect_deadline)
                .map_err(|_| Error::Timeout("the receiver published no handle".into()))?;
            let mut sender = Sender::connect(&net, send, &handle)?;
            if let Some(agent) = agent {
                agent.wait_for_registrations(1, Duration::from_secs(10))?;
            }
            let results = walk(&mut sender, cases, agent, checks, |_| {})?;
            sender.close()?;
            Ok(results)
        });
        let joined = |h: std::thread::ScopedJoinHandle<'_, Result<Vec<CaseResult>>>, who: &str| {
            h.join()
                .unwrap_or_else(|_| Err(Error::Contract(format!("the {who} thread panicked"))))
                .map_err(|e| e.context(who))
        };
        let received = joined(receiver, "receiver");
        let sent = joined(sender, "sender");
        Ok((sent?, received?))
    })
}
