//! The receiving side: listening, accepting, posting grouped receives and checking every byte.

use std::ffi::c_void;
use std::path::Path;
use std::time::{Duration, Instant};

use super::{comm_id, env_refs, write_handle, Loop, Region, Side, SideOptions};
use crate::abi::{HANDLE_SIZE, PROXY_MAX_SUBS};
use crate::error::{Error, Result};
use crate::net::{ListenComm, MemHandle, Net, NetCtx, RecvBuf, RecvComm};
use crate::pattern;
use crate::plan::{Plan, GUARD};
use crate::plugin::Version;
use crate::rails::Direction;

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

/// The receiving side of a connected pair.
pub struct Receiver<'n, 'p> {
    net: &'n Net<'p>,
    ctx: Option<NetCtx>,
    comm: Option<RecvComm>,
    region: Region,
    tainted: bool,
    data_deadline: Duration,
}

impl<'p> Receiver<'_, 'p> {
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

    /// Lends the receive comm and the registered region (grown to at least `len` bytes) to a
    /// caller's own data loop, e.g. `mpib-perf`'s timed loop with its own buffer layout. An error
    /// from `body` taints the receiver: requests may still point into the region, so it is leaked
    /// at teardown rather than freed.
    pub fn with_region<T>(
        &mut self,
        len: usize,
        body: impl FnOnce(&Net<'p>, &RecvComm, &mut [u8], &MemHandle) -> Result<T>,
    ) -> Result<T> {
        let comm = self.comm.as_ref().expect("connected");
        let lender = (self.net, comm, &mut self.tainted, "receiver");
        self.region.lend(lender, len, body)
    }

    /// `deregMr`, `closeRecv`, `finalize`; everything is attempted, the first error returned.
    pub fn close(mut self) -> Result<()> {
        self.teardown()
    }

    fn teardown(&mut self) -> Result<()> {
        super::teardown(
            self.net,
            self.tainted,
            &mut self.region,
            &mut self.comm,
            &mut self.ctx,
            |net, comm| net.close_recv(comm),
        )
    }
}

impl Drop for Receiver<'_, '_> {
    fn drop(&mut self) {
        let _ = self.teardown();
    }
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
