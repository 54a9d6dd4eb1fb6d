//! One rank: its connections to the peers the op needs (a send comm to each rank it sends to
//! and a receive comm from each it receives from, per channel), set up in NCCL's order and moved
//! by one proxy loop.
//!
//! As NCCL's proxy (`nccl/src/transport/net.cc`, `sendProxyProgress` / `recvProxyProgress`): every
//! connection has one registered buffer of NCCL_STEPS steps (`regMr` once, after connect and
//! accept); a slice goes out with one `isend` tagged with the sender's rank from its slot of that
//! buffer, at most NCCL_STEPS / slice-steps of them in flight; the receive side keeps as many
//! `irecv`s posted ahead, tagged with the peer's rank; `test` is called on the oldest request of
//! each connection each pass; a NULL request is "again later". Where NCCL's kernel copies between
//! the user buffer and the connection buffer, the loop copies (and adds) itself.

use std::path::Path;
use std::time::Duration;

use super::lane::Lane;
use super::op::{Op, Shape};
use super::schedule::{Receive, Send};
use crate::abi::{CommAttr, NetAttr, HANDLE_SIZE};
use crate::error::{Error, Result};
use crate::net::{ListenComm, Net, NetCtx, RecvComm, SendComm};
use crate::xfer::{wait_for_handle, write_handle};

/// Algorithm and protocol bits of NCCL's ring and Simple (`nccl/src/include/plugin/nccl_tuner.h`).
const ALGORITHM_RING: u32 = 1 << 1;
const PROTOCOL_SIMPLE: u32 = 1 << 2;
/// NCCL_ALGO_UNDEF and NCCL_PROTO_UNDEF (-1), as NCCL leaves them for point-to-point.
const UNDEFINED: u32 = u32::MAX;

/// What a rank is while its connections come up.
struct Setup {
    /// Per (receiving peer index, channel): the listen for that peer's sends.
    listens: Vec<Option<ListenComm>>,
    /// Per (sending peer index, channel): the handle its listen published.
    peer_handles: Vec<[u8; HANDLE_SIZE]>,
    sends: Vec<Option<SendComm>>,
    receives: Vec<Option<RecvComm>>,
}

/// One rank.
pub struct Rank<'n, 'p> {
    net: &'n Net<'p>,
    ctx: Option<NetCtx>,
    /// Ranks in the job.
    pub ranks: usize,
    /// This rank's index.
    pub rank: usize,
    op: Op,
    channels: usize,
    dev: i32,
    /// Ranks this one sends to, and receives from.
    to: Vec<usize>,
    from: Vec<usize>,
    setup: Option<Setup>,
    /// Send lanes, by (peer index in `to`, channel); receive lanes by (`from`, channel).
    sends: Vec<Lane<SendComm, Send>>,
    receives: Vec<Lane<RecvComm, Receive>>,
    /// The attributes last given to `setNetAttr` (v11+).
    attributes: Option<NetAttr>,
}

impl<'n, 'p> Rank<'n, 'p> {
    /// `init`s the rank's context and `listen`s once per channel for every peer that sends to
    /// it, publishing each handle in `rendezvous` (NCCL's first phase: every listen of the batch
    /// before any connect).
    pub fn listen(
        net: &'n Net<'p>,
        (ranks, rank): (usize, usize),
        (op, channels): (Op, usize),
        dev: i32,
        rendezvous: &Path,
    ) -> Result<Rank<'n, 'p>> {
        let ctx = net.init(communicator_id(rendezvous))?;
        let (to, from) = op.peers(ranks, rank);
        let mut listens = Vec::with_capacity(from.len() * channels);
        for &peer in &from {
            for channel in 0..channels {
                let mut handle = [0u8; HANDLE_SIZE];
                listens.push(Some(net.listen(&ctx, dev, &mut handle)?));
                write_handle(&handle_path(rendezvous, (peer, rank), channel), &handle)?;
            }
        }
        let setup = Setup {
            listens,
            peer_handles: Vec::new(),
            sends: (0..to.len() * channels).map(|_| None).collect(),
            receives: (0..from.len() * channels).map(|_| None).collect(),
        };
        let mut rank = Rank {
            net,
            ctx: Some(ctx),
            ranks,
            rank,
            op,
            channels,
            dev,
            to,
            from,
            setup: Some(setup),
            sends: Vec::new(),
            receives: Vec::new(),
            attributes: None,
        };
        rank.describe_communicator()?;
        Ok(rank)
    }

    /// v11+: the communicator's range, as NCCL's `populateCommNetAttrs` sets it once at setup
    /// (its functions, algorithm and protocol undefined, 1 to the peer and channel counts).
    fn describe_communicator(&mut self) -> Result<()> {
        let (send_bits, receive_bits, _) = self.op.function_bits();
        let range = |peers: usize| CommAttr {
            max_concurrent_peers: peers as i32,
            min_concurrent_peers: 1,
            max_flows_per_peer: self.channels as i32,
            min_flows_per_peer: 1,
        };
        let attributes = NetAttr {
            send_comm_attr: range(self.to.len()),
            recv_comm_attr: range(self.from.len()),
            op: send_bits | receive_bits,
            algo: UNDEFINED,
            proto: UNDEFINED,
        };
        self.set_attributes(attributes)
    }

    /// `setNetAttr` with `attributes`, unless they are the ones last set (NCCL's
    /// `setXferNetAttrs` calls it only on a change).
    fn set_attributes(&mut self, attributes: NetAttr) -> Result<()> {
        if !self.net.version().has_context() || self.attributes == Some(attributes) {
            return Ok(());
        }
        let ctx = self
            .ctx
            .as_ref()
            .ok_or_else(|| Error::Contract("no context".into()))?;
        self.net.set_net_attr(ctx, &attributes)?;
        self.attributes = Some(attributes);
        Ok(())
    }

    /// Reads the handles of the peers this rank sends to (the out-of-band exchange), waiting up
    /// to `limit` for each.
    pub fn learn_peers(&mut self, rendezvous: &Path, limit: Duration) -> Result<()> {
        let setup = self
            .setup
            .as_mut()
            .ok_or_else(|| Error::Contract("set up twice".into()))?;
        for &peer in &self.to {
            for channel in 0..self.channels {
                let path = handle_path(rendezvous, (self.rank, peer), channel);
                setup.peer_handles.push(wait_for_handle(&path, limit)?);
            }
        }
        Ok(())
    }

    /// One round of `connect` and `accept` over every connection (NCCL's second phase, polled
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
        for (index, send) in setup.sends.iter_mut().enumerate() {
            if send.is_none() {
                *send = self
                    .net
                    .connect(ctx, self.dev, &mut setup.peer_handles[index])?;
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

    /// Every connection up: one buffer registered per connection, as NCCL registers its. A
    /// registration that fails closes its comm and leaves the rest in `setup` for `close`.
    fn register(&mut self) -> Result<()> {
        let Some(mut setup) = self.setup.take() else {
            return Ok(());
        };
        let steps = self.op.steps();
        let outcome = self.register_each(&mut setup, steps);
        if outcome.is_err() {
            self.setup = Some(setup);
        }
        outcome
    }

    fn register_each(&mut self, setup: &mut Setup, steps: super::schedule::Steps) -> Result<()> {
        for send in &mut setup.sends {
            if let Some(comm) = send.take() {
                self.sends.push(Lane::new(self.net, comm, steps)?);
            }
        }
        for receive in &mut setup.receives {
            if let Some(comm) = receive.take() {
                self.receives.push(Lane::new(self.net, comm, steps)?);
            }
        }
        Ok(())
    }

    /// Starts the op on `bytes`: each connection's schedule, and on v11+ the operation's
    /// attributes first, per direction, as NCCL's `setXferNetAttrs` sets them.
    pub fn start(&mut self, bytes: usize) -> Result<()> {
        let (send_bits, receive_bits, collective) = self.op.function_bits();
        let none = CommAttr {
            max_concurrent_peers: 0,
            min_concurrent_peers: 0,
            max_flows_per_peer: 0,
            min_flows_per_peer: 0,
        };
        let mut attributes = self.attributes.unwrap_or(NetAttr {
            send_comm_attr: none,
            recv_comm_attr: none,
            op: 0,
            algo: UNDEFINED,
            proto: UNDEFINED,
        });
        if collective {
            (attributes.algo, attributes.proto) = (ALGORITHM_RING, PROTOCOL_SIMPLE);
        }
        let exact = |peers: usize, channels: usize| CommAttr {
            max_concurrent_peers: peers as i32,
            min_concurrent_peers: peers as i32,
            max_flows_per_peer: channels as i32,
            min_flows_per_peer: channels as i32,
        };
        attributes.send_comm_attr = exact(self.to.len(), self.channels);
        attributes.op = send_bits;
        self.set_attributes(attributes)?;
        attributes.recv_comm_attr = exact(self.from.len(), self.channels);
        attributes.op = receive_bits;
        self.set_attributes(attributes)?;
        let (ranks, rank, channels, op) = (self.ranks, self.rank, self.channels, self.op);
        let shape = |channel| Shape {
            ranks,
            rank,
            channel,
            channels,
        };
        for (index, lane) in self.sends.iter_mut().enumerate() {
            let (sends, _) = op.schedule(shape(index % channels), self.to[index / channels], bytes);
            lane.start(sends);
        }
        for (index, lane) in self.receives.iter_mut().enumerate() {
            let (_, receives) =
                op.schedule(shape(index % channels), self.from[index / channels], bytes);
            lane.start(receives);
        }
        Ok(())
    }

    /// One pass of the proxy loop over every connection: posts what may go, tests the oldest
    /// request of each, lands what arrived in `data`. `true` once the op is done everywhere.
    pub fn progress(&mut self, data: &mut [u32]) -> Result<bool> {
        let (net, rank, ranks, channels) = (self.net, self.rank, self.ranks, self.channels);
        let at = |what: &str, peer: usize, index: usize| {
            format!(
                "rank {rank} of {ranks}, {what} rank {peer}, channel {}",
                index % channels
            )
        };
        let mut done = true;
        for (index, lane) in self.receives.iter_mut().enumerate() {
            let peer = self.from[index / channels];
            lane.progress_receives(net, peer as i32, data)
                .map_err(|e| e.context(at("receiving from", peer, index)))?;
            done &= lane.finished();
        }
        for (index, lane) in self.sends.iter_mut().enumerate() {
            // A ring's send waits for the receive of the same channel (the ring's only one).
            let landed = (self.receives.get(index % channels)).map_or(0, |lane| lane.completed());
            let peer = self.to[index / channels];
            lane.progress_sends(net, rank as i32, data, landed)
                .map_err(|e| e.context(at("sending to", peer, index)))?;
            done &= lane.finished();
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
        for lane in self.sends.drain(..) {
            keep(lane.close(self.net));
        }
        for lane in self.receives.drain(..) {
            keep(lane.close(self.net));
        }
        if let Some(ctx) = self.ctx.take() {
            keep(self.net.finalize(ctx));
        }
        outcome
    }
}

/// The communicator's id, the same on every rank (NCCL passes its `commHash` to each rank's
/// `init`): FNV-1a of the rendezvous directory's path, which every rank of a run names alike.
fn communicator_id(rendezvous: &Path) -> u64 {
    let bytes = rendezvous.as_os_str().as_encoded_bytes();
    bytes.iter().fold(0xCBF2_9CE4_8422_2325u64, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0000_0100_0000_01B3)
    })
}

/// Where the rank that receives publishes the handle of its listen for `sender`'s connection
/// on `channel`.
fn handle_path(
    rendezvous: &Path,
    (sender, receiver): (usize, usize),
    channel: usize,
) -> std::path::PathBuf {
    rendezvous.join(format!(
        "from-{sender}-to-{receiver}-channel-{channel}.handle"
    ))
}
