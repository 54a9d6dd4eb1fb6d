//! An NCCL-proxy-like driver for one rank pair in one process: the receiver listens, the handle
//! is copied to the sender, `connect` and `accept` are polled alternately (both non-blocking)
//! until both return a comm, the listen comm is closed, one region per side is registered, then
//! the data loop posts `irecv`/`isend` (retrying while they return a NULL request) and polls
//! `test`. Every loop is bounded by a deadline; a stuck request fails naming the version, the
//! plan and the request.

use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::abi::{HANDLE_SIZE, NCCL_PTR_HOST, PROXY_MAX_SUBS};
use crate::error::{Error, Result};
use crate::net::{DataComm, MemHandle, Net, NetCtx, RecvBuf, RecvComm, Request, SendComm};
use crate::pattern;
use crate::plan::{Plan, GUARD};
use crate::Version;

/// How long each phase may take before the driver gives up.
#[derive(Clone, Copy, Debug)]
pub struct Deadlines {
    /// The connect/accept loop.
    pub connect: Duration,
    /// One [`Pair::run`].
    pub data: Duration,
}

impl Default for Deadlines {
    fn default() -> Deadlines {
        Deadlines {
            connect: Duration::from_secs(10),
            data: Duration::from_secs(60),
        }
    }
}

/// Environment for each side's `init` (v11/v12 snapshot it per communicator).
#[derive(Clone, Debug, Default)]
pub struct PairOptions {
    /// Device the receiver listens on.
    pub dev: i32,
    /// Device the sender connects from (`None`: the same as `dev`); NCCL connects whatever
    /// devices its topology search picked on each side.
    pub connect_dev: Option<i32>,
    /// Variables set around the receiver's `init`.
    pub recv_env: Vec<(String, Option<String>)>,
    /// Variables set around the sender's `init`.
    pub send_env: Vec<(String, Option<String>)>,
    /// Deadlines.
    pub deadlines: Deadlines,
}

/// What [`Pair::run`] observed.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Wall time from the first post to the last completion.
    pub elapsed: Duration,
    /// Most `isend` requests outstanding at once.
    pub max_sends_in_flight: usize,
    /// Most `irecv` requests outstanding at once.
    pub max_recvs_in_flight: usize,
    /// `isend` calls answered with a NULL request ("try again").
    pub null_isends: u64,
    /// `irecv` calls answered with a NULL request.
    pub null_irecvs: u64,
    /// Sizes `test` reported, per receive and buffer.
    pub recv_sizes: Vec<Vec<i32>>,
    /// Sizes `test` reported per send (`None` when tested with `sizes = NULL`).
    pub send_sizes: Vec<Option<i32>>,
}

struct Region {
    buf: Vec<u8>,
    mhandle: Option<MemHandle>,
}

impl Region {
    fn empty() -> Region {
        Region {
            buf: Vec::new(),
            mhandle: None,
        }
    }
}

static NEXT_COMM_ID: AtomicU64 = AtomicU64::new(0x4D50_0000);

/// A connected sender/receiver pair on one `Net`.
pub struct Pair<'n, 'p> {
    net: &'n Net<'p>,
    recv_ctx: Option<NetCtx>,
    send_ctx: Option<NetCtx>,
    send: Option<SendComm>,
    recv: Option<RecvComm>,
    send_region: Region,
    recv_region: Region,
    /// Set after a failed run: requests may still reference the regions, so they are leaked.
    tainted: bool,
    /// Deadlines in force.
    pub deadlines: Deadlines,
}

fn env_refs(vars: &[(String, Option<String>)]) -> Vec<(&str, Option<&str>)> {
    vars.iter()
        .map(|(k, v)| (k.as_str(), v.as_deref()))
        .collect()
}

/// Outstanding requests of one kind: (index in the plan, request).
type Outstanding = Vec<(usize, Request)>;

impl<'n, 'p> Pair<'n, 'p> {
    /// Connects with default options.
    pub fn connect(net: &'n Net<'p>) -> Result<Pair<'n, 'p>> {
        Pair::connect_with(net, &PairOptions::default())
    }

    /// `init` ×2 (receiver, then sender), `listen`, then `connect`/`accept` alternately until
    /// both are done (bounded by `deadlines.connect`), then `closeListen`.
    pub fn connect_with(net: &'n Net<'p>, options: &PairOptions) -> Result<Pair<'n, 'p>> {
        let version = net.version();
        let recv_id = NEXT_COMM_ID.fetch_add(2, Ordering::Relaxed);
        let mut pair = Pair {
            net,
            recv_ctx: Some(net.init_with_env(recv_id, &env_refs(&options.recv_env))?),
            send_ctx: None,
            send: None,
            recv: None,
            send_region: Region::empty(),
            recv_region: Region::empty(),
            tainted: false,
            deadlines: options.deadlines,
        };
        pair.send_ctx = Some(net.init_with_env(recv_id + 1, &env_refs(&options.send_env))?);
        let recv_ctx = pair.recv_ctx.as_ref().expect("set above");
        let send_ctx = pair.send_ctx.as_ref().expect("set above");
        let mut handle = [0u8; HANDLE_SIZE];
        let listen = net.listen(recv_ctx, options.dev, &mut handle)?;
        let mut shipped = handle; // what NCCL's bootstrap delivers to the peer
        let start = Instant::now();
        let (mut send, mut recv) = (None, None);
        let outcome = loop {
            if send.is_none() {
                let dev = options.connect_dev.unwrap_or(options.dev);
                match net.connect(send_ctx, dev, &mut shipped) {
                    Ok(comm) => send = comm,
                    Err(e) => break Err(e),
                }
            }
            if recv.is_none() {
                match net.accept(&listen) {
                    Ok(comm) => recv = comm,
                    Err(e) => break Err(e),
                }
            }
            if send.is_some() && recv.is_some() {
                break Ok(());
            }
            if start.elapsed() > options.deadlines.connect {
                break Err(Error::Timeout(format!(
                    "{version} connect/accept not done after {:?} (connect {}, accept {})",
                    options.deadlines.connect,
                    if send.is_some() { "done" } else { "pending" },
                    if recv.is_some() { "done" } else { "pending" },
                )));
            }
            std::thread::yield_now();
        };
        pair.send = send;
        pair.recv = recv;
        let closed = net.close_listen(listen);
        outcome?;
        closed?;
        Ok(pair)
    }

    /// The `Net` driven.
    pub fn net(&self) -> &'n Net<'p> {
        self.net
    }

    /// The send comm.
    pub fn send_comm(&self) -> &SendComm {
        self.send.as_ref().expect("connected")
    }

    /// The receive comm.
    pub fn recv_comm(&self) -> &RecvComm {
        self.recv.as_ref().expect("connected")
    }

    /// Makes sure the registered regions hold at least the given bytes (re-registering larger
    /// ones with `regMr(NCCL_PTR_HOST)` when needed).
    pub fn reserve(&mut self, send_len: usize, recv_len: usize) -> Result<()> {
        if self.tainted {
            return Err(Error::Contract(
                "an earlier run failed; the pair is unusable".into(),
            ));
        }
        let net = self.net;
        grow(
            net,
            self.send.as_ref().expect("connected"),
            &mut self.send_region,
            send_len,
        )?;
        grow(
            net,
            self.recv.as_ref().expect("connected"),
            &mut self.recv_region,
            recv_len,
        )
    }

    /// A pointer `offset` bytes into the registered send region and its registration (for
    /// hand-made calls; [`Pair::reserve`] first).
    pub fn send_buffer(&mut self, offset: usize) -> (*mut c_void, &MemHandle) {
        let ptr = self.send_region.buf[offset..].as_mut_ptr().cast();
        (ptr, self.send_region.mhandle.as_ref().expect("reserved"))
    }

    /// A pointer `offset` bytes into the registered receive region and its registration.
    pub fn recv_buffer(&mut self, offset: usize) -> (*mut c_void, &MemHandle) {
        let ptr = self.recv_region.buf[offset..].as_mut_ptr().cast();
        (ptr, self.recv_region.mhandle.as_ref().expect("reserved"))
    }

    /// The receive region's bytes.
    pub fn received(&self) -> &[u8] {
        &self.recv_region.buf
    }

    /// Reserves, fills every send with its own pattern (seeds from `case`/`iteration`) and
    /// poisons the receive buffers and their guards.
    pub fn prepare(&mut self, plan: &Plan, case: u64, iteration: u64) -> Result<()> {
        self.reserve(plan.send_len(), plan.recv_len())?;
        for (i, s) in plan.sends.iter().enumerate() {
            let seed = pattern::seed(case, iteration, i as u64);
            pattern::fill(&mut self.send_region.buf[s.offset..s.offset + s.size], seed);
        }
        for r in plan.recvs.iter().flatten() {
            self.recv_region.buf[r.offset..r.offset + r.capacity + GUARD].fill(pattern::POISON);
        }
        Ok(())
    }

    /// Checks sizes and bytes after [`Pair::run`].
    pub fn verify(&self, plan: &Plan, case: u64, iteration: u64, report: &Report) -> Result<()> {
        let version = self.net.version();
        for (g, group) in plan.recvs.iter().enumerate() {
            for (b, r) in group.iter().enumerate() {
                let send = plan.sends[r.source];
                let got = report.recv_sizes[g][b];
                let at = || {
                    format!(
                        "{version} {}: irecv #{g} buffer {b} (tag {})",
                        plan.label, r.tag
                    )
                };
                if !plan.null_recv_sizes && usize::try_from(got).ok() != Some(send.size) {
                    let sent = send.size;
                    return Err(Error::Mismatch(format!(
                        "{}: test reported size {got}, sent {sent}",
                        at()
                    )));
                }
                let data = &self.recv_region.buf[r.offset..r.offset + send.size];
                let seed = pattern::seed(case, iteration, r.source as u64);
                if let Some((i, expected, found)) = pattern::first_mismatch(data, seed) {
                    return Err(Error::Mismatch(format!(
                        "{}: byte {i} of {} is {found:#04x}, expected {expected:#04x}",
                        at(),
                        send.size
                    )));
                }
                let tail =
                    &self.recv_region.buf[r.offset + send.size..r.offset + r.capacity + GUARD];
                if let Some(i) = pattern::first_unpoisoned(tail) {
                    return Err(Error::Mismatch(format!(
                        "{}: byte {} written past the {}-byte message",
                        at(),
                        send.size + i,
                        send.size
                    )));
                }
            }
        }
        for (i, (s, got)) in plan.sends.iter().zip(&report.send_sizes).enumerate() {
            if let Some(got) = got {
                if usize::try_from(*got).ok() != Some(s.size) {
                    return Err(Error::Mismatch(format!(
                        "{version} {}: isend #{i} (tag {}) test reported size {got}, sent {}",
                        plan.label, s.tag, s.size
                    )));
                }
            }
        }
        Ok(())
    }

    /// [`Pair::prepare`], [`Pair::run`], [`Pair::verify`].
    pub fn exchange(&mut self, plan: &Plan, case: u64, iteration: u64) -> Result<Report> {
        self.prepare(plan, case, iteration)?;
        let report = self.run(plan)?;
        self.verify(plan, case, iteration, &report)?;
        Ok(report)
    }

    /// Posts everything in `plan` and polls until all requests are done, like NCCL's progress
    /// thread: each pass posts as many receives and sends as the limits and the plugin allow
    /// (alternating), then tests every outstanding request once. Bounded by `deadlines.data`.
    /// Requires [`Pair::reserve`] (or [`Pair::prepare`]) first.
    pub fn run(&mut self, plan: &Plan) -> Result<Report> {
        if self.send_region.buf.len() < plan.send_len()
            || self.recv_region.buf.len() < plan.recv_len()
        {
            return Err(Error::Contract(
                "Pair::run without reserve/prepare for this plan".into(),
            ));
        }
        let result = self.run_inner(plan);
        if result.is_err() {
            self.tainted = true;
        }
        result
    }

    fn run_inner(&mut self, plan: &Plan) -> Result<Report> {
        let mut report = Report {
            recv_sizes: plan.recvs.iter().map(|g| vec![-1; g.len()]).collect(),
            send_sizes: vec![None; plan.sends.len()],
            ..Report::default()
        };
        let (mut next_recv, mut next_send) = (0usize, 0usize);
        let (mut recvs_out, mut sends_out) = (Outstanding::new(), Outstanding::new());
        let (mut recvs_done, mut sends_done) = (0usize, 0usize);
        let start = Instant::now();
        let deadline = start + self.deadlines.data;
        while recvs_done < plan.recvs.len() || sends_done < plan.sends.len() {
            let mut progressed = false;
            loop {
                let mut posted = false;
                if next_recv < plan.recvs.len() && recvs_out.len() < plan.max_recvs_in_flight {
                    match self.post_recv(plan, next_recv)? {
                        Some(req) => {
                            recvs_out.push((next_recv, req));
                            next_recv += 1;
                            posted = true;
                        }
                        None => report.null_irecvs += 1,
                    }
                }
                if next_send < plan.sends.len() && sends_out.len() < plan.max_sends_in_flight {
                    match self.post_send(plan, next_send)? {
                        Some(req) => {
                            sends_out.push((next_send, req));
                            next_send += 1;
                            posted = true;
                        }
                        None => report.null_isends += 1,
                    }
                }
                report.max_recvs_in_flight = report.max_recvs_in_flight.max(recvs_out.len());
                report.max_sends_in_flight = report.max_sends_in_flight.max(sends_out.len());
                if !posted {
                    break;
                }
                progressed = true;
            }
            let finished = self.test_recvs(plan, &mut recvs_out, &mut report)?;
            let finished = finished + self.test_sends(plan, &mut sends_out, &mut report)?;
            recvs_done = next_recv - recvs_out.len();
            sends_done = next_send - sends_out.len();
            if Instant::now() > deadline {
                let state = Progress {
                    next_recv,
                    next_send,
                    recvs_out: &recvs_out,
                    sends_out: &sends_out,
                };
                return Err(Error::Timeout(stuck(
                    plan,
                    self.net.version(),
                    self.deadlines.data,
                    &state,
                )));
            }
            if !progressed && finished == 0 {
                std::thread::yield_now();
            }
        }
        report.elapsed = start.elapsed();
        Ok(report)
    }

    fn post_recv(&mut self, plan: &Plan, index: usize) -> Result<Option<Request>> {
        let base = self.recv_region.buf.as_mut_ptr();
        let mhandle = self
            .recv_region
            .mhandle
            .as_ref()
            .expect("reserved")
            .as_ptr();
        let bufs: Vec<RecvBuf> = plan.recvs[index]
            .iter()
            .map(|r| RecvBuf {
                // SAFETY: offsets lie within the region (`Plan::recv_len` was reserved).
                data: unsafe { base.add(r.offset) }.cast(),
                size: r.capacity,
                tag: r.tag,
                mhandle,
            })
            .collect();
        // NCCL's LL/LL128 path pre-sets `*request = (void*)0x1` (an address, never dereferenced).
        let preset = if plan.preset_recv_request && bufs.len() == 1 {
            1usize as *mut c_void
        } else {
            std::ptr::null_mut()
        };
        let recv = self.recv.as_ref().expect("connected");
        // SAFETY: the buffers lie in the registered receive region, which outlives the request (a
        // failed run leaks the region instead of freeing it).
        unsafe { self.net.irecv_preset(recv, &bufs, preset) }
            .map_err(|e| e.context(format!("{} irecv #{index} (n={})", plan.label, bufs.len())))
    }

    fn post_send(&mut self, plan: &Plan, index: usize) -> Result<Option<Request>> {
        let s = plan.sends[index];
        let data = self.send_region.buf[s.offset..].as_mut_ptr().cast();
        let mhandle = self.send_region.mhandle.as_ref().expect("reserved");
        let send = self.send.as_ref().expect("connected");
        // SAFETY: as for receives; the bytes stay untouched until the send is done.
        unsafe { self.net.isend(send, data, s.size, s.tag, mhandle) }.map_err(|e| {
            e.context(format!(
                "{} isend #{index} (size {}, tag {})",
                plan.label, s.size, s.tag
            ))
        })
    }

    fn test_recvs(&self, plan: &Plan, out: &mut Outstanding, report: &mut Report) -> Result<usize> {
        let (mut i, mut finished) = (0, 0);
        while i < out.len() {
            let (g, req) = out[i];
            let mut sizes = [0i32; PROXY_MAX_SUBS];
            let sizes_arg = (!plan.null_recv_sizes).then_some(&mut sizes[..]);
            let done = self
                .net
                .test(&req, sizes_arg)
                .map_err(|e| e.context(format!("{} test of irecv #{g}", plan.label)))?;
            if done {
                report.recv_sizes[g].copy_from_slice(&sizes[..plan.recvs[g].len()]);
                out.swap_remove(i);
                finished += 1;
            } else {
                i += 1;
            }
        }
        Ok(finished)
    }

    fn test_sends(&self, plan: &Plan, out: &mut Outstanding, report: &mut Report) -> Result<usize> {
        let (mut i, mut finished) = (0, 0);
        while i < out.len() {
            let (s, req) = out[i];
            let mut size = [-1i32; 1];
            let sizes = (!plan.null_send_sizes).then_some(&mut size[..]);
            let done = self
                .net
                .test(&req, sizes)
                .map_err(|e| e.context(format!("{} test of isend #{s}", plan.label)))?;
            if done {
                report.send_sizes[s] = (!plan.null_send_sizes).then_some(size[0]);
                out.swap_remove(i);
                finished += 1;
            } else {
                i += 1;
            }
        }
        Ok(finished)
    }

    /// `deregMr` both regions, `closeSend`, `closeRecv`, `finalize` both contexts. Everything
    /// is attempted; the first error is returned.
    pub fn close(mut self) -> Result<()> {
        self.teardown()
    }

    fn teardown(&mut self) -> Result<()> {
        let net = self.net;
        let mut first: Result<()> = Ok(());
        let mut keep = |r: Result<()>| {
            if first.is_ok() {
                first = r;
            }
        };
        if self.tainted {
            // Requests may still point into the regions: never free them.
            std::mem::forget(std::mem::take(&mut self.send_region.buf));
            std::mem::forget(std::mem::take(&mut self.recv_region.buf));
        }
        if let (Some(comm), Some(mh)) = (self.send.as_ref(), self.send_region.mhandle.take()) {
            keep(net.dereg_mr(comm, mh));
        }
        if let (Some(comm), Some(mh)) = (self.recv.as_ref(), self.recv_region.mhandle.take()) {
            keep(net.dereg_mr(comm, mh));
        }
        if let Some(comm) = self.send.take() {
            keep(net.close_send(comm));
        }
        if let Some(comm) = self.recv.take() {
            keep(net.close_recv(comm));
        }
        for ctx in [self.send_ctx.take(), self.recv_ctx.take()]
            .into_iter()
            .flatten()
        {
            keep(net.finalize(ctx));
        }
        first
    }
}

impl Drop for Pair<'_, '_> {
    fn drop(&mut self) {
        let _ = self.teardown();
    }
}

fn grow(net: &Net<'_>, comm: &impl DataComm, region: &mut Region, len: usize) -> Result<()> {
    if region.buf.len() >= len && region.mhandle.is_some() {
        return Ok(());
    }
    if let Some(mh) = region.mhandle.take() {
        net.dereg_mr(comm, mh)?;
    }
    region.buf = vec![0u8; len.max(4096)];
    let (ptr, size) = (region.buf.as_mut_ptr().cast(), region.buf.len());
    // SAFETY: host memory owned by `region`, deregistered before it is freed or replaced.
    region.mhandle = Some(unsafe { net.reg_mr(comm, ptr, size, NCCL_PTR_HOST) }?);
    Ok(())
}

struct Progress<'a> {
    next_recv: usize,
    next_send: usize,
    recvs_out: &'a [(usize, Request)],
    sends_out: &'a [(usize, Request)],
}

fn stuck(plan: &Plan, version: Version, limit: Duration, p: &Progress<'_>) -> String {
    let mut text = format!("{version} {}: not done after {limit:?};", plan.label);
    for (g, _) in p.recvs_out.iter().take(4) {
        let caps: Vec<usize> = plan.recvs[*g].iter().map(|r| r.capacity).collect();
        text += &format!(" irecv #{g} (capacities {caps:?}) posted but never done;");
    }
    for (s, _) in p.sends_out.iter().take(4) {
        let spec = plan.sends[*s];
        text += &format!(
            " isend #{s} (size {}, tag {}) posted but never done;",
            spec.size, spec.tag
        );
    }
    if p.next_recv < plan.recvs.len() {
        let total = plan.recvs.len();
        text += &format!(
            " irecv #{} of {total} never accepted (NULL request);",
            p.next_recv
        );
    }
    if p.next_send < plan.sends.len() {
        let spec = plan.sends[p.next_send];
        text += &format!(
            " isend #{} of {} (size {}, tag {}) never accepted (NULL request);",
            p.next_send,
            plan.sends.len(),
            spec.size,
            spec.tag
        );
    }
    text
}
