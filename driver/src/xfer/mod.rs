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

mod handle;
mod recv;
mod send;
mod walk;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::abi::NCCL_PTR_HOST;
use crate::cases::{Case, Step};
use crate::error::{Error, Result};
use crate::net::{DataComm, MemHandle, Net, NetCtx, Request};
use crate::plan::Plan;
use crate::plugin::Version;
use crate::rails::Direction;

pub use handle::{wait_for_handle, wait_for_handle_while, write_handle};
pub use recv::{Listener, Receiver};
pub use send::Sender;
pub use walk::{expected_rails, run_in_process, walk, CaseResult, Checks};

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

/// `deregMr`, then `close` on the comm, then `finalize`; everything is attempted, the first
/// error returned. A tainted region (requests may still point into it) is leaked, never freed.
fn teardown<C: DataComm>(
    net: &Net<'_>,
    tainted: bool,
    region: &mut Region,
    comm: &mut Option<C>,
    ctx: &mut Option<NetCtx>,
    close: impl FnOnce(&Net<'_>, C) -> Result<()>,
) -> Result<()> {
    let mut first = Ok(());
    if tainted {
        std::mem::forget(std::mem::take(&mut region.buf));
    }
    if let (Some(comm), Some(mh)) = (comm.as_ref(), region.mhandle.take()) {
        first = first.and(net.dereg_mr(comm, mh));
    }
    if let Some(comm) = comm.take() {
        first = first.and(close(net, comm));
    }
    if let Some(ctx) = ctx.take() {
        first = first.and(net.finalize(ctx));
    }
    first
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

    /// Both sides' `with_region`: grows the region to `len` bytes and lends it with `comm` to
    /// `body`; an error from `body` sets `tainted` (requests may still point into the region).
    fn lend<'p, C: DataComm, T>(
        &mut self,
        (net, comm, tainted, side): (&Net<'p>, &C, &mut bool, &str),
        len: usize,
        body: impl FnOnce(&Net<'p>, &C, &mut [u8], &MemHandle) -> Result<T>,
    ) -> Result<T> {
        if *tainted {
            return Err(Error::Contract(format!(
                "an earlier step failed; the {side} is unusable"
            )));
        }
        self.reserve(net, comm, len)?;
        let mhandle = self.mhandle.as_ref().expect("reserved");
        let outcome = body(net, comm, &mut self.buf, mhandle);
        *tainted = outcome.is_err();
        outcome
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

/// The posting and testing loop both sides share: `post(i)` posts item `i` (`None`: "try again
/// later"), `test(i, request)` tests it (`true`: done). Items are posted in order, at most
/// `window` outstanding; every pass posts what it can, then tests every outstanding request once.
/// Public so that tools with their own bookkeeping (`mpib-perf` times each request in the
/// closures) get the same bounded loop.
pub struct Loop<'a> {
    /// What the items are (`"irecv"`, `"isend"`), for the timeout message.
    pub what: &'a str,
    /// Items to post.
    pub count: usize,
    /// Most items outstanding at once.
    pub window: usize,
    /// Bound on the whole run.
    pub deadline: Duration,
}

impl Loop<'_> {
    /// Runs until every item is posted and done, or fails at the first error or the deadline.
    pub fn run(
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

/// One side of the walk over the case list.
pub trait Side {
    /// Send or receive.
    const DIRECTION: Direction;
    /// The ABI version driven.
    fn version(&self) -> Version;
    /// Runs one plan once; returns the time from the first post to the last completion.
    fn run_plan(&mut self, plan: &Plan, seed: u64, iteration: u64) -> Result<Duration>;
}
