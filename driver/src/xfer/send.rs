//! The sending side: connecting, filling and posting the sends, checking the reported sizes.

use std::time::{Duration, Instant};

use super::{comm_id, env_refs, Loop, Region, Side, SideOptions};
use crate::abi::HANDLE_SIZE;
use crate::error::{Error, Result};
use crate::net::{MemHandle, Net, NetCtx, SendComm};
use crate::pattern;
use crate::plan::Plan;
use crate::plugin::Version;
use crate::rails::Direction;

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

    /// Lends the send comm and the registered region (grown to at least `len` bytes) to a
    /// caller's own data loop, e.g. `mpib-perf`'s timed loop. An error from `body` taints the
    /// sender: requests may still point into the region, so it is leaked at teardown.
    pub fn with_region<T>(
        &mut self,
        len: usize,
        body: impl FnOnce(&Net<'p>, &SendComm, &mut [u8], &MemHandle) -> Result<T>,
    ) -> Result<T> {
        let comm = self.comm.as_ref().expect("connected");
        let lender = (self.net, comm, &mut self.tainted, "sender");
        self.region.lend(lender, len, body)
    }

    /// `deregMr`, `closeSend`, `finalize`; everything is attempted, the first error returned.
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
            |net, comm| net.close_send(comm),
        )
    }
}

impl Drop for Sender<'_, '_> {
    fn drop(&mut self) {
        let _ = self.teardown();
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
