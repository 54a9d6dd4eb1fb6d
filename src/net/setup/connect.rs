//! `connect`: the sender's non-blocking handshake, resumed on every call through a state word
//! kept in NCCL's handle buffer (NCCL keeps that buffer alive across retries; net_ib does the same).
//!
//! [admitted: src/net/setup/admission.rs] -> Connecting -> Claiming (the listen comm, on the
//! acceptor's shared socket: src/net/setup/listener.rs) -> Building -> SendingRequest ->
//! ReceivingReply -> Resolving -> SendingReady -> ReceivingAnswer (the control link kept,
//! src/net/observe/link.rs) -> [Registering] -> connected. A `connect` not admitted yet returns
//! "not yet" holding nothing. When this process already holds a link to the acceptor's process
//! (the handle names it), the handshake rides that link (src/net/setup/channel.rs) and starts at
//! Building: its request opens it there, naming the listen comm. Should that link end before the
//! reply (the acceptor may have closed its end before reading the request), the handshake starts
//! again from Connecting on a connection of its own, with the same request.
//! Resolving polls the acceptor's rail addresses once per call and brings the QPs up only when
//! no verb would wait for them (see `resolve.rs`). A call does at most one step that creates or
//! modifies verbs resources (tens of milliseconds on emulated rails; docs/RELIABILITY.md), and
//! returns "not yet" after it, so no call adds two of them up.
//! The island class is computed once from the bound control socket's address pair and carried in
//! the request; the acceptor recomputes it from the same pair and refuses a disagreement.

use std::net::{IpAddr, Ipv4Addr, SocketAddrV4};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::fabric::{Access, Rail};
use crate::log;
use crate::params::Mode;
use crate::proto::cts::{CompletionRecord, CtsEntry};
use crate::proto::failback::{FIFO_LEN, RECORDS_LEN};
use crate::proto::island::{classify, PathClass};
use crate::proto::qp_layout::QpLayout;
use crate::proto::wire::{
    ConnectReply, ConnectRequest, LinkAnswer, RailEndpoint, Ready, CONNECT_REPLY_LEN,
    CONNECT_REQUEST_LEN, LINK_ANSWER_LEN, MAX_QPS, READY_LEN,
};

use crate::net::agent::hints::HintReader;
use crate::net::agent::registration::{
    address_of_wire, ipv4_of, sout_pair, AgentRegistration, PendingRegistration,
};
use crate::net::data::request::now_ns;
use crate::net::data::send::{SendComm, SendData};
use crate::net::observe::link::{self, Attachment, PathKey, Proposal, Ride};
use crate::net::observe::peer::PeerWatch;
use crate::net::observe::telemetry::ConnectionTelemetry;
use crate::net::setup::admission::Admission;
use crate::net::setup::channel::Channel;
use crate::net::setup::comm::{ConnectionInfo, Renewal};
use crate::net::setup::devices::FusedDevice;
use crate::net::setup::listener::{claim, CLAIM_LEN};
use crate::net::setup::oob::{
    connect_finished, local_address, start_connect, ListenHandle, Transfer,
};
use crate::net::setup::resolve::Resolutions;
use crate::net::setup::resources::{
    connect_queue_pairs, endpoint, qp_nums_by_rail, qp_settings, QueueBuilder, QueuePairs,
    QueueSizing, RailQueues, RegisteredRegion,
};
use crate::net::{Context, HANDLE_SIZE};

#[path = "connect_link.rs"]
mod link_steps;

/// Sender queue sizes: chains of up to 9 WRs per slot; one signalled completion per slot and rail.
/// A power of two less one: providers keep queues in power-of-two rings with one slot spare
/// (rxe: `roundup_pow_of_two(entries + 1)`; mlx5's CQs alike), so asking for 1024 got a ring of
/// 2048 and doubled the NIC memory of every QP and CQ a connection holds
/// (docs/PERFORMANCE.md "Thousands of connections: what each costs").
const SENDER_SIZING: QueueSizing = QueueSizing {
    send_queue: 1023,
    only_senders: None,
    cq_depth: 1023,
    receiving: false,
};

enum Stage {
    Connecting,
    /// The claim naming the listen comm on the acceptor's shared socket
    /// (src/net/setup/listener.rs), sent first.
    Claiming(Transfer<CLAIM_LEN>),
    /// The CQs and QPs, a rail's worth per call; then the FIFO and the request.
    Building(PathClass, QueueBuilder),
    SendingRequest(Transfer<CONNECT_REQUEST_LEN>),
    ReceivingReply(Transfer<CONNECT_REPLY_LEN>),
    /// The acceptor's rail addresses, polled once per call; then the QPs go to RTS.
    Resolving(Resolutions, ConnectReply),
    /// The ready marker with the control link proposal, then the acceptor's answer
    /// (src/net/observe/link.rs).
    SendingReady(Transfer<READY_LEN>, Ready),
    ReceivingAnswer(Transfer<LINK_ANSWER_LEN>, Ready),
    /// Advanced mode: the agent registration, polled once per call (never waited for).
    Registering(Option<PendingRegistration>),
}

/// Resources created once the control socket is up.
struct Prepared {
    class: PathClass,
    layout: QpLayout,
    qps: QueuePairs,
    queues: [Option<RailQueues>; 2],
    fifo: RegisteredRegion<CtsEntry>,
    records: RegisteredRegion<CompletionRecord>,
    request: ConnectRequest,
    remote_records: (u64, [u32; 2]),
    /// The acceptor's rail addresses, SOUT and SUP (the agent registration names both pairs).
    peer_rail_addresses: [IpAddr; 2],
    /// The acceptor's rails as its reply named them (a failed rail's return connects to them).
    peer_rails: [RailEndpoint; 2],
    /// The acceptor's process and its name for the connection (from the reply).
    peer_process: u64,
    peer_name: u64,
    /// Whether the connection fails over: both ends allow it (from the reply).
    failover: bool,
    /// The proposed control link's share, until the answer; then the share kept.
    proposal: Option<Proposal>,
    link: Option<Attachment>,
}

/// An in-progress `connect`.
pub(crate) struct Connector {
    ctx: Arc<Context>,
    /// The fused device connecting: the connection uses its NICs.
    device: Arc<FusedDevice>,
    traffic_class: i32,
    remote: SocketAddrV4,
    listen_id: u64,
    /// This side's control address (the handshake's connection is bound to it).
    local_address: Ipv4Addr,
    channel: Channel,
    stage: Stage,
    prepared: Option<Prepared>,
    /// This handshake's place among those in flight to the acceptor's socket
    /// (src/net/setup/admission.rs), until it is done.
    admission: Option<Admission>,
}

/// One `connect` call: start or resume, `Ok(None)` while in progress.
pub(crate) fn connect(
    ctx: &Arc<Context>,
    dev: i32,
    handle: &mut [u8; HANDLE_SIZE],
    traffic_class: i32,
) -> Result<Option<Box<SendComm>>> {
    let word = ListenHandle::state_word(handle);
    let mut connector = if word == 0 {
        let ListenHandle {
            address: remote,
            listen_id,
            process,
        } = ListenHandle::read(handle)?;
        // Past this destination's share of handshakes in flight: "not yet", holding nothing,
        // and the next call asks again (first, so that waiting costs no system call).
        let Some(admission) = Admission::try_admit(remote, link::connected_to(process)) else {
            return Ok(None);
        };
        let device = ctx.plugin.device(dev)?.clone();
        let local = local_address(&ctx.settings, device.control_address)?;
        let path = PathKey {
            peer_process: process,
            local,
            remote: *remote.ip(),
            budget_ms: qp_settings(&ctx.settings, traffic_class).retry_budget_ms(),
        };
        let ride = (process != 0)
            .then(|| Ride::start(path, listen_id, now_ns()))
            .flatten();
        let (channel, stage) = match ride {
            Some(ride) => {
                let stage = Connector::start_building(ctx, &device, local, remote)?;
                (Channel::riding(ride), stage)
            }
            None => (
                Channel::Own(start_connect(local, remote)?),
                Stage::Connecting,
            ),
        };
        // The first call goes on as far as the others do: with a local peer the connection is
        // up at once and the claim goes out now.
        Box::new(Connector {
            ctx: Arc::clone(ctx),
            device,
            traffic_class,
            remote,
            listen_id,
            local_address: local,
            channel,
            stage,
            prepared: None,
            admission: Some(admission),
        })
    } else {
        // SAFETY: a non-zero word is a `Box<Connector>` leaked by a previous call on this very
        // handle buffer (below); NCCL hands the same buffer back until connect completes.
        let connector = unsafe { Box::from_raw(word as usize as *mut Connector) };
        ListenHandle::set_state_word(handle, 0);
        connector
    };
    match connector.progress() {
        Ok(Some(comm)) => return Ok(Some(comm)),
        Ok(None) => {}
        Err(e) => {
            let error = e.context(format!("connect to {}", connector.remote));
            // A handshake on a link tells the acceptor why it stops (one on its own connection
            // says it by closing that).
            connector.channel.set_reason(&error.to_string());
            return Err(error);
        }
    }
    ListenHandle::set_state_word(handle, Box::into_raw(connector) as usize as u64);
    Ok(None)
}

impl Connector {
    fn progress(&mut self) -> Result<Option<Box<SendComm>>> {
        loop {
            let peer = self.remote.to_string();
            match &mut self.stage {
                Stage::Connecting => {
                    let Channel::Own(stream) = &self.channel else {
                        return Err(Error::internal("connecting a handshake that rides a link"));
                    };
                    if !connect_finished(stream, self.remote)? {
                        return Ok(None);
                    }
                    self.stage = Stage::Claiming(Transfer::outgoing(claim(self.listen_id)));
                }
                Stage::Claiming(transfer) => {
                    if !self.channel.send(transfer, &peer)? {
                        return Ok(None);
                    }
                    self.stage = self.after_claim()?;
                }
                Stage::Building(class, builder) => {
                    if !builder.step(&self.device.devices, &self.device.receives)? {
                        return Ok(None);
                    }
                    let class = *class;
                    self.finish_building(class)?;
                    return Ok(None);
                }
                Stage::SendingRequest(transfer) => {
                    let sent = self.channel.send(transfer, &peer);
                    if !self.carried(sent)? {
                        return Ok(None);
                    }
                    self.stage = Stage::ReceivingReply(Transfer::incoming());
                }
                Stage::ReceivingReply(transfer) => {
                    let received = self.channel.receive(transfer, &peer);
                    if !self.carried(received)? {
                        return Ok(None);
                    }
                    let Stage::ReceivingReply(transfer) = &self.stage else {
                        return Err(Error::internal("connect stage changed while receiving"));
                    };
                    let reply = ConnectReply::decode(transfer.bytes())
                        .map_err(|e| Error::remote(format!("malformed handshake reply: {e}")))?;
                    let resolutions = self.on_reply(&reply)?;
                    self.stage = Stage::Resolving(resolutions, reply);
                }
                Stage::Resolving(resolutions, reply) => {
                    if !resolutions.poll()? {
                        return Ok(None);
                    }
                    let reply = *reply;
                    self.connect_queue_pairs(&reply)?;
                    let ready = self.propose_link()?;
                    self.stage = Stage::SendingReady(Transfer::outgoing(ready.encode()), ready);
                    return Ok(None);
                }
                Stage::SendingReady(transfer, ready) => {
                    if !self.channel.send(transfer, &peer)? {
                        return Ok(None);
                    }
                    self.stage = Stage::ReceivingAnswer(Transfer::incoming(), *ready);
                }
                Stage::ReceivingAnswer(transfer, ready) => {
                    if !self.channel.receive(transfer, &peer)? {
                        return Ok(None);
                    }
                    let answer = LinkAnswer::decode(transfer.bytes(), ready).map_err(|e| {
                        Error::remote(format!("malformed control link answer: {e}"))
                    })?;
                    self.settle_link(answer.link)?;
                    if self.ctx.settings.mode == Mode::Vanilla {
                        return self.finish(None).map(Some);
                    }
                    self.stage = Stage::Registering(self.start_registration()?);
                }
                Stage::Registering(pending) => {
                    let telemetry = &self.ctx.plugin.telemetry;
                    return match PendingRegistration::poll_stage(pending, telemetry) {
                        None => Ok(None),
                        Some(agent) => self.finish(agent).map(Some),
                    };
                }
            }
        }
    }

    fn local(&self) -> Result<SocketAddrV4> {
        Ok(self.channel.addresses()?.0)
    }

    /// The first stage of building: the island class from the control address pair (this
    /// side's address is the one the handshake's connection binds, and the link's), then the
    /// queues.
    fn start_building(
        ctx: &Context,
        device: &FusedDevice,
        local: Ipv4Addr,
        remote: SocketAddrV4,
    ) -> Result<Stage> {
        let settings = &ctx.settings;
        let class = classify(local, *remote.ip(), settings.island_prefix_len);
        let layout = QpLayout::new(settings.sout_qps, settings.sup_qps, settings.mode, class);
        // The connector draws the connection's secret: its QPs are made with it, and the
        // request tells the acceptor (docs/SECURITY.md, "Strangers on the tcp fabric's rail
        // ports").
        let secret = crate::random::unguessable("the connection's secret")?;
        let builder = QueueBuilder::new(layout, SENDER_SIZING, &device.budgets, false, secret)?;
        Ok(Stage::Building(class, builder))
    }

    /// After the claim on a connection of its own: the queues, or, for a handshake started
    /// again after the link it rode ended, the same request.
    fn after_claim(&self) -> Result<Stage> {
        Ok(match &self.prepared {
            Some(prepared) => Stage::SendingRequest(Transfer::outgoing(prepared.request.encode())),
            None => {
                Connector::start_building(&self.ctx, &self.device, self.local_address, self.remote)?
            }
        })
    }

    /// The queues are built: the FIFO and records around them, and the request to send.
    fn finish_building(&mut self, class: PathClass) -> Result<()> {
        let built = match std::mem::replace(&mut self.stage, Stage::Connecting) {
            Stage::Building(_, builder) => (builder.secret(), builder.finish()?),
            _ => return Err(Error::internal("connect stage changed while building")),
        };
        let request = self.prepare(class, built)?;
        self.stage = Stage::SendingRequest(Transfer::outgoing(request.encode()));
        Ok(())
    }

    /// What sending the request or receiving the reply came to: done or not yet, or, when the
    /// link the handshake rode ended under it (not when the acceptor gave it up), not yet with
    /// the handshake started again on a connection of its own, with the request already built
    /// (nothing of it reached a live acceptor: one that took it holds the link open).
    fn carried(&mut self, outcome: Result<bool>) -> Result<bool> {
        match outcome {
            Err(_) if self.channel.link_lost() => {
                info!(
                    log::NET | log::INIT,
                    "connect to {}: the control link ended before the handshake's reply; \
                     starting it again on a connection of its own",
                    self.remote
                );
                self.channel = Channel::Own(start_connect(self.local_address, self.remote)?);
                self.stage = Stage::Connecting;
                Ok(false)
            }
            outcome => outcome,
        }
    }

    /// Creates the FIFO and record shadow around the built queues; the request describes them.
    fn prepare(
        &mut self,
        class: PathClass,
        (secret, (layout, queues, qps)): (u64, (QpLayout, [Option<RailQueues>; 2], QueuePairs)),
    ) -> Result<ConnectRequest> {
        let settings = &self.ctx.settings;
        let devices = &self.device.devices;
        let local = self.local()?;
        let fifo = RegisteredRegion::<CtsEntry>::new(devices, FIFO_LEN, Access::CONTROL)?;
        let records =
            RegisteredRegion::<CompletionRecord>::new(devices, RECORDS_LEN, Access::LOCAL)?;
        let mut qp_nums = [0u32; MAX_QPS];
        for (index, qp) in qps.qps.iter().enumerate() {
            qp_nums[index] = qp.qp_num();
        }
        let request = ConnectRequest {
            mode: settings.mode,
            class,
            prefix_len: settings.island_prefix_len,
            sout_qps: layout.count(crate::fabric::Rail::ScaleOut) as u8,
            sup_qps: layout.count(crate::fabric::Rail::ScaleUp) as u8,
            connector_addr: local.ip().octets(),
            acceptor_addr: self.remote.ip().octets(),
            rails: [endpoint(devices[0].as_ref()), endpoint(devices[1].as_ref())],
            qp_nums,
            fifo_addr: fifo.region().addr(),
            fifo_rkeys: fifo.rkeys(),
            conn_id: link::fresh_name(),
            process: link::process_id(),
            failover: settings.failover,
            secret,
        };
        self.prepared = Some(Prepared {
            class,
            layout,
            qps,
            queues,
            fifo,
            records,
            request,
            remote_records: (0, [0; 2]),
            peer_rail_addresses: [IpAddr::V4(Ipv4Addr::UNSPECIFIED); 2],
            peer_rails: [RailEndpoint::default(); 2],
            peer_process: 0,
            peer_name: 0,
            failover: false,
            proposal: None,
            link: None,
        });
        Ok(request)
    }

    /// Checks the reply and starts resolving the acceptor's rail addresses.
    fn on_reply(&mut self, reply: &ConnectReply) -> Result<Resolutions> {
        let prepared = self
            .prepared
            .as_mut()
            .ok_or_else(|| Error::internal("reply before prepare"))?;
        let request = &prepared.request;
        if let Some(refusal) = reply.refusal {
            return Err(Error::invalid_usage(format!(
                "the peer refused the connection: {}: we sent mode {:?}, {} (classified from {}<->{} with \
                 MPIB_ISLAND_PREFIX_LEN={}), QPs sout={} sup={}; the peer has mode {:?}, {}, QPs sout={} sup={}",
                refusal.describe(),
                request.mode,
                request.class.label(),
                std::net::Ipv4Addr::from(request.connector_addr),
                std::net::Ipv4Addr::from(request.acceptor_addr),
                request.prefix_len,
                request.sout_qps,
                request.sup_qps,
                reply.mode,
                reply.class.label(),
                reply.sout_qps,
                reply.sup_qps,
            )));
        }
        if (reply.sout_qps, reply.sup_qps) != (request.sout_qps, request.sup_qps) {
            return Err(Error::remote(format!(
                "QP count mismatch: we have sout={} sup={}, the peer accepted with sout={} sup={}",
                request.sout_qps, request.sup_qps, reply.sout_qps, reply.sup_qps
            )));
        }
        Resolutions::start(
            &self.device.devices,
            prepared.layout,
            &reply.rails,
            self.ctx.settings.addr_resolve_timeout_ms,
        )
    }

    /// Brings the QPs up against the acceptor's (no verb waits: its addresses are resolved).
    fn connect_queue_pairs(&mut self, reply: &ConnectReply) -> Result<()> {
        let prepared = self
            .prepared
            .as_mut()
            .ok_or_else(|| Error::internal("connect before prepare"))?;
        let settings = qp_settings(&self.ctx.settings, self.traffic_class);
        connect_queue_pairs(
            &mut prepared.qps,
            prepared.layout,
            &reply.rails,
            &reply.qp_nums,
            &settings,
        )?;
        prepared.remote_records = (reply.records_addr, reply.records_rkeys);
        prepared.peer_process = reply.process;
        prepared.peer_name = reply.conn_id;
        prepared.failover = reply.failover && prepared.request.failover;
        prepared.peer_rail_addresses = reply.rails.map(|rail| address_of_wire(rail.address));
        prepared.peer_rails = reply.rails;
        Ok(())
    }

    /// Starts the agent registration of this connection's SOUT and SUP address pairs.
    fn start_registration(&self) -> Result<Option<PendingRegistration>> {
        let prepared = self
            .prepared
            .as_ref()
            .ok_or_else(|| Error::internal("registration before prepare"))?;
        let local = self.local()?;
        let nic = |rail: Rail| self.device.devices[rail.index()].info().address;
        let peer = prepared.peer_rail_addresses;
        let sout = sout_pair(
            nic(Rail::ScaleOut),
            peer[Rail::ScaleOut.index()],
            (*local.ip(), *self.remote.ip()),
        );
        let sup = (
            ipv4_of(nic(Rail::ScaleUp)),
            ipv4_of(peer[Rail::ScaleUp.index()]),
        );
        Ok(PendingRegistration::start(
            &self.ctx.settings,
            sout.0,
            sout.1,
            sup,
        ))
    }

    fn finish(&mut self, agent: Option<AgentRegistration>) -> Result<Box<SendComm>> {
        let prepared = self
            .prepared
            .take()
            .ok_or_else(|| Error::internal("finish before prepare"))?;
        let settings = &self.ctx.settings;
        let hint = match &agent {
            Some(registration) => {
                let telemetry = Arc::clone(&self.ctx.plugin.telemetry);
                HintReader::open(settings, registration.hint_slot, telemetry)
            }
            None => HintReader::none(),
        };
        let info = ConnectionInfo {
            devices: self.device.devices.clone(),
            registrations: self.device.registrations.clone(),
            device_index: self.device.index,
            nic_slots: self.device.nic_slots,
            peer: self.remote,
            class: prepared.class,
            mode: settings.mode,
            layout: prepared.layout,
            bdp_bytes: settings.bdp_bytes,
            agent,
            profiler: self.ctx.profiler,
            health: self.device.health.clone(),
            qp_nums: qp_nums_by_rail(&prepared.qps, prepared.layout),
            attributes: Arc::clone(&self.ctx.attributes),
            failover: prepared.failover,
            renewal: Renewal {
                peer_rails: prepared.peer_rails,
                qp_settings: qp_settings(settings, self.traffic_class),
                sizing: SENDER_SIZING,
                secret: prepared.request.secret,
                failback: settings.failback.filter(|_| prepared.failover),
            },
            watchdog_ns: if prepared.failover {
                settings.watchdog_ns
            } else {
                0
            },
        };
        info!(
            log::NET | log::INIT,
            "send comm to {}: QPs sout={} sup={}, hint slot {:?}",
            info.describe_peer(),
            prepared.layout.count(crate::fabric::Rail::ScaleOut),
            prepared.layout.count(crate::fabric::Rail::ScaleUp),
            info.agent.as_ref().map(|a| a.hint_slot)
        );
        let telemetry = ConnectionTelemetry::claim(&self.ctx.plugin.telemetry, &info, true);
        let mut data = SendData::new(
            prepared.qps,
            prepared.queues,
            prepared.fifo,
            prepared.records,
            prepared.remote_records,
            hint,
            telemetry,
            self.device.health.clone(),
        );
        let share = prepared
            .link
            .ok_or_else(|| Error::internal("finish before the control link"))?;
        let local = self.local()?;
        data.peer = PeerWatch::of_control(share, *local.ip(), &self.device.devices, info.failover);
        self.channel.finish();
        Ok(SendComm::new(info, data))
    }
}
