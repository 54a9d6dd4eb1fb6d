//! One rank: its ring connections (a send comm to the next rank and a receive comm from the
//! previous one per channel), set up in NCCL's order and moved by one proxy loop.
//!
//! As NCCL's proxy (`src/transport/net.cc`, `sendProxyProgress` / `recvProxyProgress`): every
//! connection has one registered buffer of NCCL_STEPS steps (`regMr` once, after connect and
//! accept); a slice goes out with one `isend` tagged with the sender's rank from its slot of that
//! buffer, at most NCCL_STEPS / slice-steps of them in flight; the receive side keeps as many
//! `irecv`s posted ahead, tagged with the peer's rank; `test` is called on the oldest request of
//! each connection each pass; a NULL request is "again later". Where NCCL's kernel copies between
//! the user buffer and the connection buffer, the loop copies (and adds) itself.

use std::collections::VecDeque;
use std::path::Path;
use std::time::{Duration, Instant};

use super::schedule::{Receive, Schedule, Steps, ELEMENT};
use crate::abi::{CommAttr, NetAttr, HANDLE_SIZE, NCCL_PTR_HOST};
use crate::error::{Error, Result};
use crate::net::{ListenComm, MemHandle, Net, NetCtx, RecvBuf, RecvComm, Request, SendComm};
use crate::xfer::{wait_for_handle, write_handle};

/// `ncclFunc_t` bits and the ring/Simple bits, as NCCL's `setXferNetAttrs` sets them
/// (`src/include/nccl_common.h`, `src/include/plugin/nccl_tuner.h`).
const FUNCTION_ALL_REDUCE: u32 = 1 << 4;
const ALGORITHM_RING: u32 = 1 << 1;
const PROTOCOL_SIMPLE: u32 = 1 << 2;

/// A connection's registered buffer, cut into slots of one slice.
struct Buffer {
    bytes: Vec<u8>,
    slot: usize,
    handle: Option<MemHandle>,
}

impl Buffer {
    fn new(steps: Steps) -> Buffer {
        Buffer {
            bytes: vec![0u8; steps.step * 8],
            slot: steps.slice(),
            handle: None,
        }
    }

    fn slots(&self) -> usize {
        self.bytes.len() / self.slot
    }

    fn slot_ptr(&mut self, index: usize) -> *mut u8 {
        let at = (index % self.slots()) * self.slot;
        self.bytes[at..].as_mut_ptr()
    }
}

/// One channel's two connections and where its current collective stands.
struct Channel {
    send: SendComm,
    receive: RecvComm,
    send_buffer: Buffer,
    receive_buffer: Buffer,
    schedule: Schedule,
    posted_sends: usize,
    sends: VecDeque<Request>,
    posted_receives: usize,
    receives: VecDeque<Request>,
    received: usize,
}

/// What a rank is while its connections come up.
struct Setup {
    listens: Vec<Option<ListenComm>>,
    peer_handles: Vec<[u8; HANDLE_SIZE]>,
    sends: Vec<Option<SendComm>>,
    receives: Vec<Option<RecvComm>>,
}

/// One rank of the ring.
pub struct Rank<'n, 'p> {
    net: &'n Net<'p>,
    ctx: Option<NetCtx>,
    pub ranks: usize,
    pub rank: usize,
    dev: i32,
    steps: Steps,
    setup: Option<Setup>,
    channels: Vec<Channel>,
}

impl<'n, 'p> Rank<'n, 'p> {
    /// `init`s the rank's context and `listen`s once per channel, publishing each handle in
    /// `rendezvous` (NCCL's first phase: every listen of the batch before any connect).
    pub fn listen(
        net: &'n Net<'p>,
        (ranks, rank): (usize, usize),
        channels: usize,
        dev: i32,
        steps: Steps,
        rendezvous: &Path,
    ) -> Result<Rank<'n, 'p>> {
        let comm_id = 0x5241_4E4B_0000_0000 | ((std::process::id() as u64) << 16) | rank as u64;
        let ctx = net.init(comm_id)?;
        let mut listens = Vec::with_capacity(channels);
        for channel in 0..channels {
            let mut handle = [0u8; HANDLE_SIZE];
            listens.push(Some(net.listen(&ctx, dev, &mut handle)?));
            write_handle(&handle_path(rendezvous, rank, channel), &handle)?;
        }
        let setup = Setup {
            listens,
            peer_handles: Vec::new(),
            sends: (0..channels).map(|_| None).collect(),
            receives: (0..channels).map(|_| None).collect(),
        };
        Ok(Rank {
            net,
            ctx: Some(ctx),
            ranks,
            rank,
            dev,
            steps,
            setup: Some(setup),
            channels: Vec::new(),
        })
    }

    /// Reads the next rank's handles (the out-of-band exchange), waiting up to `limit`.
    pub fn learn_peers(&mut self, rendezvous: &Path, limit: Duration) -> Result<()> {
        let next = (self.rank + 1) % self.ranks;
        let setup = self
            .setup
            .as_mut()
            .ok_or_else(|| Error::Contract("set up twice".into()))?;
        for channel in 0..setup.listens.len() {
            setup.peer_handles.push(wait_for_handle(
                &handle_path(rendezvous, next, channel),
                limit,
            )?);
        }
        Ok(())
    }

    /// One round of `connect` and `accept` over every channel (NCCL's second phase, polled
    /// round-robin with the other ranks' in one loop); each listen comm is closed as soon as its
    /// `accept` returned a comm. `true` once every connection is up and its buffer registered.
    pub fn connect_round(&mut self) -> Result<bool> {
        let ctx = self
            .ctx
            .as_ref()
            .ok_or_else(|| Error::Contract("no context".into()))?;
        let Some(setup) = self.setup.as_mut() else {
            return Ok(true);
        };
        for (channel, send) in setup.sends.iter_mut().enumerate() {
            if send.is_none() {
                *send = self
                    .net
                    .connect(ctx, self.dev, &mut setup.peer_handles[channel])?;
            }
        }
        for (listen, receive) in setup.listens.iter_mut().zip(setup.receives.iter_mut()) {
            if let (Some(comm), None) = (listen.as_ref(), receive.as_ref()) {
                if let Some(accepted) = self.net.accept(comm)? {
                    *receive = Some(accepted);
                    if let Some(comm) = listen.take() {
                        self.net.close_listen(comm)?;
                    }
                }
            }
        }
        let up =
            setup.sends.iter().all(Option::is_some) && setup.receives.iter().all(Option::is_some);
        if up {
            self.register()?;
        }
        Ok(up)
    }

    /// Every connection up: one buffer registered per connection, as NCCL registers its.
    fn register(&mut self) -> Result<()> {
        let Some(setup) = self.setup.take() else {
            return Ok(());
        };
        for (send, receive) in setup.sends.into_iter().zip(setup.receives) {
            let (Some(send), Some(receive)) = (send, receive) else {
                return Err(Error::Contract("a connection missing after setup".into()));
            };
            let mut channel = Channel {
                send,
                receive,
                send_buffer: Buffer::new(self.steps),
                receive_buffer: Buffer::new(self.steps),
                schedule: Schedule::default(),
                posted_sends: 0,
                sends: VecDeque::new(),
                posted_receives: 0,
                receives: VecDeque::new(),
                received: 0,
            };
            let (data, size) = (
                channel.send_buffer.bytes.as_mut_ptr(),
                channel.send_buffer.bytes.len(),
            );
            // SAFETY: the buffer lives in the channel until `close` deregisters it first.
            let handle = unsafe {
                self.net
                    .reg_mr(&channel.send, data.cast(), size, NCCL_PTR_HOST)
            }?;
            channel.send_buffer.handle = Some(handle);
            let (data, size) = (
                channel.receive_buffer.bytes.as_mut_ptr(),
                channel.receive_buffer.bytes.len(),
            );
            // SAFETY: as above.
            let handle = unsafe {
                self.net
                    .reg_mr(&channel.receive, data.cast(), size, NCCL_PTR_HOST)
            }?;
            channel.receive_buffer.handle = Some(handle);
            self.channels.push(channel);
        }
        Ok(())
    }

    /// Starts an all-reduce of `bytes` of `data` (whole `u32` words): each channel takes an equal
    /// share of whole words, and on v11+ the context hears the operation's attributes first.
    pub fn start_all_reduce(&mut self, bytes: usize) -> Result<()> {
        if self.net.version().has_context() {
            let flows = self.channels.len() as i32;
            let attr = CommAttr {
                max_concurrent_peers: 1,
                min_concurrent_peers: 1,
                max_flows_per_peer: flows,
                min_flows_per_peer: flows,
            };
            let attr = NetAttr {
                send_comm_attr: attr,
                recv_comm_attr: attr,
                op: FUNCTION_ALL_REDUCE,
                algo: ALGORITHM_RING,
                proto: PROTOCOL_SIMPLE,
            };
            let ctx = self
                .ctx
                .as_ref()
                .ok_or_else(|| Error::Contract("no context".into()))?;
            self.net.set_net_attr(ctx, &attr)?;
        }
        let words = bytes / ELEMENT;
        let count = self.channels.len();
        for (index, channel) in self.channels.iter_mut().enumerate() {
            let first = words * index / count;
            let last = words * (index + 1) / count;
            let (base, length) = (first * ELEMENT, (last - first) * ELEMENT);
            channel.schedule =
                super::schedule::ring_all_reduce(self.ranks, self.rank, base, length, self.steps);
            channel.posted_sends = 0;
            channel.posted_receives = 0;
            channel.received = 0;
        }
        Ok(())
    }

    /// One pass of the proxy loop over every channel: posts what may go, tests the oldest
    /// request of each connection, lands what arrived in `data`. `true` once the collective is
    /// done on every channel.
    pub fn progress(&mut self, data: &mut [u32]) -> Result<bool> {
        let (net, rank, ranks) = (self.net, self.rank, self.ranks);
        let mut done = true;
        for (index, channel) in self.channels.iter_mut().enumerate() {
            let at = |what: &str| format!("rank {rank} of {ranks}, channel {index}: {what}");
            channel
                .post_sends(net, rank, data)
                .map_err(|e| e.context(at("isend")))?;
            channel
                .post_receives(net, (rank + ranks - 1) % ranks)
                .map_err(|e| e.context(at("irecv")))?;
            channel.test(net, data).map_err(|e| e.context(at("test")))?;
            done &= channel.finished();
        }
        Ok(done)
    }

    /// Closes every comm (deregistering its buffer first) and finalizes the context; every step
    /// is tried, the first failure returned.
    pub fn close(mut self) -> Result<()> {
        let mut outcome = Ok(());
        let mut keep = |result: Result<()>| {
            if outcome.is_ok() {
                outcome = result;
            }
        };
        if let Some(setup) = self.setup.take() {
            setup
                .listens
                .into_iter()
                .flatten()
                .for_each(|l| keep(self.net.close_listen(l)));
            setup
                .sends
                .into_iter()
                .flatten()
                .for_each(|s| keep(self.net.close_send(s)));
            setup
                .receives
                .into_iter()
                .flatten()
                .for_each(|r| keep(self.net.close_recv(r)));
        }
        for mut channel in self.channels.drain(..) {
            if !channel.sends.is_empty() || !channel.receives.is_empty() {
                // Requests may still point into the buffers: leak them rather than free them.
                std::mem::forget(std::mem::take(&mut channel.send_buffer.bytes));
                std::mem::forget(std::mem::take(&mut channel.receive_buffer.bytes));
            }
            if let Some(handle) = channel.send_buffer.handle.take() {
                keep(self.net.dereg_mr(&channel.send, handle));
            }
            if let Some(handle) = channel.receive_buffer.handle.take() {
                keep(self.net.dereg_mr(&channel.receive, handle));
            }
            keep(self.net.close_send(channel.send));
            keep(self.net.close_recv(channel.receive));
        }
        if let Some(ctx) = self.ctx.take() {
            keep(self.net.finalize(ctx));
        }
        outcome
    }
}

impl Channel {
    fn window(&self) -> usize {
        self.send_buffer.slots()
    }

    fn finished(&self) -> bool {
        self.sends.is_empty()
            && self.posted_sends == self.schedule.sends.len()
            && self.received == self.schedule.receives.len()
    }

    /// Posts the sends whose data is ready, while a slot is free.
    fn post_sends(&mut self, net: &Net<'_>, rank: usize, data: &[u32]) -> Result<()> {
        while let Some(send) = self.schedule.sends.get(self.posted_sends).copied() {
            if self.sends.len() >= self.window() || send.after.is_some_and(|r| r >= self.received) {
                return Ok(());
            }
            let slot = self.send_buffer.slot_ptr(self.posted_sends);
            let words = &data[send.offset / ELEMENT..(send.offset + send.length) / ELEMENT];
            // SAFETY: the slot holds a slice; the words are that long at most (a slice).
            unsafe {
                std::ptr::copy_nonoverlapping(words.as_ptr().cast::<u8>(), slot, send.length)
            };
            let Some(handle) = self.send_buffer.handle.as_ref() else {
                return Err(Error::Contract("send buffer not registered".into()));
            };
            // SAFETY: the slot stays allocated and untouched until the request completes.
            let posted =
                unsafe { net.isend(&self.send, slot.cast(), send.length, rank as i32, handle) }?;
            let Some(request) = posted else {
                return Ok(()); // again later, as NCCL retries a NULL request
            };
            self.sends.push_back(request);
            self.posted_sends += 1;
        }
        Ok(())
    }

    /// Keeps the receives posted ahead, one slot each.
    fn post_receives(&mut self, net: &Net<'_>, previous: usize) -> Result<()> {
        while self.posted_receives < self.schedule.receives.len()
            && self.receives.len() < self.window()
        {
            let data = self.receive_buffer.slot_ptr(self.posted_receives).cast();
            let Some(handle) = self.receive_buffer.handle.as_ref() else {
                return Err(Error::Contract("receive buffer not registered".into()));
            };
            let buffer = RecvBuf {
                data,
                size: self.receive_buffer.slot,
                tag: previous as i32,
                mhandle: handle.as_ptr(),
            };
            // SAFETY: the slot stays allocated and unread until the request completes.
            let Some(request) = (unsafe { net.irecv(&self.receive, &[buffer]) })? else {
                return Ok(());
            };
            self.receives.push_back(request);
            self.posted_receives += 1;
        }
        Ok(())
    }

    /// Tests the oldest send and the oldest receive; a completed receive lands in `data`.
    fn test(&mut self, net: &Net<'_>, data: &mut [u32]) -> Result<()> {
        if let Some(request) = self.sends.front() {
            if net.test(request, None)? {
                self.sends.pop_front();
            }
        }
        let Some(request) = self.receives.front() else {
            return Ok(());
        };
        let mut sizes = [0i32; 64];
        if !net.test(request, Some(&mut sizes))? {
            return Ok(());
        }
        self.receives.pop_front();
        let receive = self.schedule.receives[self.received];
        if usize::try_from(sizes[0]).ok() != Some(receive.length) {
            return Err(Error::Mismatch(format!(
                "receive {} reported {} bytes, the ring sends {}",
                self.received, sizes[0], receive.length
            )));
        }
        let slot = self.receive_buffer.slot_ptr(self.received);
        land(data, slot, receive);
        self.received += 1;
        Ok(())
    }
}

/// Adds (or copies) a received slice into the rank's words.
fn land(data: &mut [u32], slot: *const u8, receive: Receive) {
    let words = &mut data[receive.offset / ELEMENT..(receive.offset + receive.length) / ELEMENT];
    for (index, word) in words.iter_mut().enumerate() {
        // SAFETY: the slot holds `receive.length` bytes the peer wrote; read unaligned.
        let got = unsafe { slot.add(index * ELEMENT).cast::<u32>().read_unaligned() };
        *word = if receive.reduce {
            word.wrapping_add(got)
        } else {
            got
        };
    }
}

/// Where rank `rank` publishes the handle of its listen on `channel`.
fn handle_path(rendezvous: &Path, rank: usize, channel: usize) -> std::path::PathBuf {
    rendezvous.join(format!("rank-{rank}-channel-{channel}.handle"))
}

/// Polls `round` until it says done, at most `limit`.
pub fn until(limit: Duration, what: &str, mut round: impl FnMut() -> Result<bool>) -> Result<()> {
    let deadline = Instant::now() + limit;
    while !round()? {
        if Instant::now() > deadline {
            return Err(Error::Timeout(format!("{what} not done within {limit:?}")));
        }
        std::thread::yield_now();
    }
    Ok(())
}
