//! `listen` and `accept`: the receiver's non-blocking handshake.
//!
//! ReceivingRequest -> (check agreement, create SRQs filled to the high-water mark) -> Resolving
//! (the connector's rail addresses, polled once per call; then QPs to RTS) -> SendingReply ->
//! ReceivingReady -> SendingAnswer -> [Registering] -> connected. The handshake comes on a
//! connection of its own claimed for this listen comm, or on a link a peer process already
//! shares with this one (src/net/setup/channel.rs); the stages are the same. A call does at most one step that creates or modifies verbs
//! resources and returns "not yet" after it (see connect.rs). A first `accept` never waits: with nothing
//! pending on the listener it returns "not yet" at once.

use std::net::{IpAddr, Ipv4Addr, SocketAddrV4};
use std::sync::Arc;

use socket2::Socket;

use crate::error::{Error, Result};
use crate::fabric::{Access, Rail};
use crate::log;
use crate::params::{Mode, Settings};
use crate::proto::cts::{CompletionRecord, CtsEntry};
use crate::proto::failback::{FIFO_LEN, RECORDS_LEN};
use crate::proto::island::classify;
use crate::proto::qp_layout::QpLayout;
use crate::proto::signal::CtsSignalPolicy;
use crate::proto::srq::{SrqCredits, SRQ_HIGH_WATER};
use crate::proto::wire::{
    check_agreement, ConnectReply, ConnectRequest, LinkAnswer, Ready, Refusal, CONNECT_REPLY_LEN,
    CONNECT_REQUEST_LEN, LINK_ANSWER_LEN, MAX_QPS, READY_LEN,
};

use crate::net::agent::registration::{
    address_of_wire, ipv4_of, sout_pair, AgentRegistration, PendingRegistration,
};
use crate::net::data::flush::Flusher;
use crate::net::data::recv::{RecvComm, RecvData};
use crate::net::data::request::now_ns;
use crate::net::observe::link::{self, Attachment, ListenOpens, Names};
use crate::net::observe::peer::PeerWatch;
use crate::net::observe::telemetry::ConnectionTelemetry;
use crate::net::setup::channel::Channel;
use crate::net::setup::comm::{ConnectionInfo, Renewal};
use crate::net::setup::devices::FusedDevice;
use crate::net::setup::listener::{fresh_listen_id, Incoming, SharedListener};
use crate::net::setup::oob::{local_address, ListenHandle, Transfer};
use crate::net::setup::resolve::Resolutions;
use crate::net::setup::resources::{
    connect_queue_pairs, endpoint, qp_nums_by_rail, qp_settings, QueueBuilder, QueuePairs,
    QueueSizing, RailQueues, RegisteredRegion,
};
use crate::net::{Context, HANDLE_SIZE};

/// Receiver queue sizes. Send queues: CTS writes only, on the CTS QP (`cts_qp`) and, with
/// failover, the first QP of the other rail, where the CTS moves if its rail fails
/// (docs/PROTOCOL.md §10); the other QPs only receive, so their send queues hold one entry (four
/// of the six QPs of a default connection would otherwise each keep 512 send entries of NIC
/// memory that nothing ever posts to). CQs: the completions of the receives it holds of the
/// rail's shared queue (at most
/// `MPIB_SRQ_HIGH_WATER`) plus periodic CTS completions on each rail's CQ, never shallower than
/// at the default marks, since the CTS completions share it. Depths are a power of two less
/// one, as the sender's (`SENDER_SIZING`: providers' rings keep a slot spare).
fn receiver_sizing(
    settings: &Settings,
    layout: QpLayout,
    class: crate::proto::island::PathClass,
    failover: bool,
) -> QueueSizing {
    let cts_qp = layout.cts_qp(settings.mode, class);
    let cts_rail = layout.rail_of(cts_qp).unwrap_or(Rail::ScaleOut);
    let standby = match failover && layout.count(cts_rail.other()) > 0 {
        true => layout.first(cts_rail.other()),
        false => cts_qp,
    };
    QueueSizing {
        send_queue: 511,
        only_senders: Some([cts_qp, standby]),
        cq_depth: 2 * settings.srq_high_water.max(SRQ_HIGH_WATER) - 1,
        receiving: true,
    }
}

const LISTEN_MAGIC: u32 = 0x4D50_4C53; // "MPLS"

/// A listening comm; can accept any number of connections, one at a time.
pub struct ListenComm {
    magic: u32,
    ctx: Arc<Context>,
    /// The fused device listened on: every connection accepted here uses its NICs.
    device: Arc<FusedDevice>,
    /// The device's listening socket, shared with its other listen comms, and this one's name
    /// on it (src/net/setup/listener.rs).
    listener: Arc<SharedListener>,
    listen_id: u64,
    /// Where links file the handshakes they carry for this listen comm
    /// (src/net/observe/link_ride.rs).
    _opens: ListenOpens,
    pending: Option<Box<Acceptance>>,
}

impl Drop for ListenComm {
    fn drop(&mut self) {
        self.listener.leave(self.listen_id);
    }
}

enum Stage {
    ReceivingRequest(Transfer<CONNECT_REQUEST_LEN>),
    /// The CQs, SRQs and QPs, a rail's worth per call; then the regions and the receives.
    Building(QueueBuilder, Box<ConnectRequest>, ConnectReply),
    /// The connector's rail addresses, polled once per call; then the QPs go to RTS and the
    /// reply (which lets the connector send) goes out.
    Resolving(Resolutions, Box<ConnectRequest>, ConnectReply),
    SendingReply(Transfer<CONNECT_REPLY_LEN>),
    ReceivingReady(Transfer<READY_LEN>),
    /// The control link this side keeps, of the two the connector proposed
    /// (src/net/observe/link.rs).
    SendingAnswer(Transfer<LINK_ANSWER_LEN>),
    /// Advanced mode: the agent registration, polled once per call (never waited for).
    Registering(Option<PendingRegistration>),
}

struct Acceptance {
    device: Arc<FusedDevice>,
    channel: Channel,
    peer: SocketAddrV4,
    local: SocketAddrV4,
    stage: Stage,
    /// Set when we refuse: sent to the peer first, then returned.
    refusal: Option<Error>,
    built: Option<(ConnectionInfo, RecvData)>,
    /// The connector's rail addresses, SOUT and SUP (the agent registration names both pairs).
    peer_rail_addresses: [IpAddr; 2],
    /// Names on the control link (ours, the connector's) and the connector's process.
    link_names: Names,
    connector_process: u64,
    /// This connection's share of its control link, once answered.
    link: Option<Attachment>,
}

/// `listen` for fused device `device` on the context's OOB address.
pub(crate) fn listen(
    ctx: &Arc<Context>,
    device: Arc<FusedDevice>,
    handle: &mut [u8; HANDLE_SIZE],
) -> Result<Box<ListenComm>> {
    let address = local_address(&ctx.settings, device.control_address)?;
    let listen_id = fresh_listen_id()?;
    let listener = SharedListener::join(device.index, address, listen_id)?;
    ListenHandle {
        address: listener.address(),
        listen_id,
        process: link::process_id(),
    }
    .write(handle);
    Ok(Box::new(ListenComm {
        magic: LISTEN_MAGIC,
        ctx: Arc::clone(ctx),
        device,
        listener,
        listen_id,
        _opens: ListenOpens::register(listen_id),
        pending: None,
    }))
}

impl ListenComm {
    /// Whether a pointer from NCCL names a live listen comm.
    pub(crate) fn is_valid(&self) -> bool {
        self.magic == LISTEN_MAGIC
    }

    /// Clears the magic, so a pointer to a closed listen comm that is still readable is refused.
    pub(crate) fn poison(&mut self) {
        self.magic = 0;
    }

    /// One `accept` call.
    pub(crate) fn accept(&mut self) -> Result<Option<Box<RecvComm>>> {
        if self.pending.is_none() {
            let channel = match self.listener.next_for(self.listen_id)? {
                Some(Incoming::Socket(socket)) => Channel::Own(prepare_socket(socket)?),
                Some(Incoming::Link(ride, request)) => Channel::accepted(ride, request),
                None => return Ok(None),
            };
            self.pending = Some(Box::new(self.start(channel)?));
        }
        let result = match self.pending.as_mut() {
            Some(acceptance) => acceptance.progress(&self.ctx),
            None => Ok(None),
        };
        match result {
            Ok(None) => Ok(None),
            Ok(Some(comm)) => {
                self.pending = None;
                Ok(Some(comm))
            }
            Err(e) => {
                let Some(mut acceptance) = self.pending.take() else {
                    return Err(e.context("accept"));
                };
                let error = e.context(format!("accept from {}", acceptance.peer));
                // A handshake on a link tells the connector why it stops.
                acceptance.channel.set_reason(&error.to_string());
                Err(error)
            }
        }
    }

    fn start(&self, channel: Channel) -> Result<Acceptance> {
        let (local, peer) = channel.addresses()?;
        Ok(Acceptance {
            device: Arc::clone(&self.device),
            channel,
            peer,
            local,
            stage: Stage::ReceivingRequest(Transfer::incoming()),
            refusal: None,
            built: None,
            peer_rail_addresses: [IpAddr::V4(Ipv4Addr::UNSPECIFIED); 2],
            link_names: Names {
                local: link::fresh_name(),
                peer: 0,
            },
            connector_process: 0,
            link: None,
        })
    }
}

/// A claimed handshake connection, made ready for the exchange.
fn prepare_socket(socket: Socket) -> Result<std::net::TcpStream> {
    socket
        .set_nonblocking(true)
        .map_err(|e| Error::system(format!("accepted socket: {e}")))?;
    socket.set_nodelay(true).ok();
    Ok(socket.into())
}

impl Acceptance {
    fn progress(&mut self, ctx: &Arc<Context>) -> Result<Option<Box<RecvComm>>> {
        let peer = self.peer.to_string();
        loop {
            match &mut self.stage {
                Stage::ReceivingRequest(transfer) => {
                    if !self.channel.receive(transfer, &peer)? {
                        return Ok(None);
                    }
                    let request = ConnectRequest::decode(transfer.bytes())
                        .map_err(|e| Error::remote(format!("malformed handshake request: {e}")))?;
                    let (reply, layout) = self.on_request(ctx, &request);
                    self.stage = match reply.refusal {
                        Some(_) => Stage::SendingReply(Transfer::outgoing(reply.encode())),
                        None => self.start_building(ctx, layout, request, reply),
                    };
                }
                Stage::Building(builder, request, reply) => {
                    match builder.step(&self.device.devices, &self.device.receives) {
                        Ok(true) => {}
                        Ok(false) => return Ok(None),
                        Err(error) => {
                            // A NIC past `max_srq` for a new shared receive queue, or a verb
                            // that failed: the connector hears a refusal, not a closed socket.
                            let reply = *reply;
                            self.stage = self.refuse(reply, error);
                            continue;
                        }
                    }
                    let (request, reply) = (**request, *reply);
                    self.finish_building(ctx, request, reply)?;
                    return Ok(None);
                }
                Stage::Resolving(resolutions, request, reply) => {
                    if !resolutions.poll()? {
                        return Ok(None);
                    }
                    let (request, reply) = (**request, *reply);
                    self.connect_queue_pairs(ctx, &request)?;
                    self.stage = Stage::SendingReply(Transfer::outgoing(reply.encode()));
                    return Ok(None);
                }
                Stage::SendingReply(transfer) => {
                    if !self.channel.send(transfer, &peer)? {
                        return Ok(None);
                    }
                    if let Some(refusal) = self.refusal.take() {
                        // The refusal was the handshake's last word: a ride gives its share
                        // back without an abandon after it.
                        self.channel.finish();
                        return Err(refusal);
                    }
                    self.stage = Stage::ReceivingReady(Transfer::incoming());
                }
                Stage::ReceivingReady(transfer) => {
                    if !self.channel.receive(transfer, &peer)? {
                        return Ok(None);
                    }
                    let ready = Ready::decode(transfer.bytes())
                        .map_err(|e| Error::remote(format!("bad ready message: {e}")))?;
                    let answer = self.answer_link(ctx, &ready)?;
                    self.stage = Stage::SendingAnswer(Transfer::outgoing(answer.encode()));
                }
                Stage::SendingAnswer(transfer) => {
                    if !self.channel.send(transfer, &peer)? {
                        return Ok(None);
                    }
                    if ctx.settings.mode == Mode::Vanilla {
                        return self.finish(ctx, None).map(Some);
                    }
                    self.stage = Stage::Registering(self.start_registration(ctx));
                }
                Stage::Registering(pending) => {
                    let telemetry = &ctx.plugin.telemetry;
                    return match PendingRegistration::poll_stage(pending, telemetry) {
                        None => Ok(None),
                        Some(agent) => self.finish(ctx, agent).map(Some),
                    };
                }
            }
        }
    }

    /// The queues are built: the regions and receives around them, then the connector's rail
    /// addresses to resolve.
    fn finish_building(
        &mut self,
        ctx: &Arc<Context>,
        request: ConnectRequest,
        mut reply: ConnectReply,
    ) -> Result<()> {
        let next = Stage::ReceivingReady(Transfer::incoming());
        let built = match std::mem::replace(&mut self.stage, next) {
            Stage::Building(builder, _, _) => builder.finish()?,
            _ => return Err(Error::internal("accept stage changed while building")),
        };
        let layout = built.0;
        self.build(ctx, &request, &mut reply, built)?;
        let resolutions = Resolutions::start(
            &self.device.devices,
            layout,
            &request.rails,
            ctx.settings.addr_resolve_timeout_ms,
        )?;
        self.stage = Stage::Resolving(resolutions, Box::new(request), reply);
        Ok(())
    }

    /// Advanced mode: starts the agent registration of this connection's SOUT and SUP address
    /// pairs.
    fn start_registration(&self, ctx: &Arc<Context>) -> Option<PendingRegistration> {
        let nic = |rail: Rail| self.device.devices[rail.index()].info().address;
        let peer = self.peer_rail_addresses;
        let sup = (
            ipv4_of(nic(Rail::ScaleUp)),
            ipv4_of(peer[Rail::ScaleUp.index()]),
        );
        let control = (*self.local.ip(), *self.peer.ip());
        let sout = sout_pair(nic(Rail::ScaleOut), peer[Rail::ScaleOut.index()], control);
        PendingRegistration::start(&ctx.settings, sout.0, sout.1, sup)
    }

    /// Takes the connection's share of the NICs' limits and starts creating its queues; past a
    /// NIC's limits the connector hears a refusal, not a closed socket, and this accept fails
    /// with the limit named (src/net/setup/budget.rs).
    fn start_building(
        &mut self,
        ctx: &Arc<Context>,
        layout: QpLayout,
        request: ConnectRequest,
        reply: ConnectReply,
    ) -> Stage {
        let settings = &ctx.settings;
        let sizing = receiver_sizing(settings, layout, reply.class, reply.failover);
        let (budgets, flush) = (&self.device.budgets, settings.force_flush);
        match QueueBuilder::new(layout, sizing, budgets, flush, request.secret) {
            Ok(builder) => Stage::Building(builder, Box::new(request), reply),
            Err(error) => self.refuse(reply, error),
        }
    }

    /// Answers with a refusal (the connector names it) and keeps `error` for this accept to
    /// fail with once the refusal is sent.
    fn refuse(&mut self, mut reply: ConnectReply, error: Error) -> Stage {
        reply.refusal = Some(Refusal::Internal);
        self.refusal = Some(error);
        Stage::SendingReply(Transfer::outgoing(reply.encode()))
    }

    /// Checks that both sides agree: the reply (a refusal, or the start of one to complete once
    /// the resources exist) and the layout.
    fn on_request(
        &mut self,
        ctx: &Arc<Context>,
        request: &ConnectRequest,
    ) -> (ConnectReply, QpLayout) {
        let settings = &ctx.settings;
        let class = classify(
            *self.local.ip(),
            *self.peer.ip(),
            settings.island_prefix_len,
        );
        let layout = QpLayout::new(settings.sout_qps, settings.sup_qps, settings.mode, class);
        let (sout, sup) = (
            layout.count(Rail::ScaleOut) as u8,
            layout.count(Rail::ScaleUp) as u8,
        );
        let mut reply = ConnectReply {
            refusal: None,
            mode: settings.mode,
            class,
            sout_qps: sout,
            sup_qps: sup,
            rails: Default::default(),
            qp_nums: [0; MAX_QPS],
            records_addr: 0,
            records_rkeys: [0; 2],
            conn_id: self.link_names.local,
            process: link::process_id(),
            failover: request.failover && settings.failover,
        };
        self.link_names.peer = request.conn_id;
        self.connector_process = request.process;
        if let Err(refusal) = check_agreement(request, settings.mode, class, sout, sup) {
            reply.refusal = Some(refusal);
            self.refusal =
                Some(self.refusal_error(refusal, request, &reply, settings.island_prefix_len));
        }
        (reply, layout)
    }

    /// Creates the receiver's regions and connection state around the built queues, posts the
    /// receives, and completes the reply.
    fn build(
        &mut self,
        ctx: &Arc<Context>,
        request: &ConnectRequest,
        reply: &mut ConnectReply,
        (layout, queues, qps): (QpLayout, [Option<RailQueues>; 2], QueuePairs),
    ) -> Result<()> {
        let settings = &ctx.settings;
        let class = reply.class;
        let devices = &self.device.devices;
        let cts_shadow = RegisteredRegion::<CtsEntry>::new(devices, FIFO_LEN, Access::LOCAL)?;
        let records =
            RegisteredRegion::<CompletionRecord>::new(devices, RECORDS_LEN, Access::CONTROL)?;
        for (index, qp) in qps.qps.iter().enumerate() {
            reply.qp_nums[index] = qp.qp_num();
        }
        reply.rails = [endpoint(devices[0].as_ref()), endpoint(devices[1].as_ref())];
        reply.records_addr = records.region().addr();
        reply.records_rkeys = records.rkeys();
        let cts_qp = layout.cts_qp(settings.mode, class);
        let cts_rail = layout.rail_of(cts_qp).unwrap_or(Rail::ScaleOut);
        let srq = [SrqCredits::new(settings.srq_low_water, settings.srq_high_water); 2];
        let mut data = RecvData::new(
            qps,
            queues,
            cts_shadow,
            records,
            (request.fifo_addr, request.fifo_rkeys),
            srq,
            (cts_qp, cts_rail),
            CtsSignalPolicy::new(settings.cts_signal_interval),
            ConnectionTelemetry::unclaimed(&ctx.plugin.telemetry, self.device.nic_slots),
            &self.device.health,
        );
        if settings.force_flush {
            data.flusher = Some(Flusher::create(devices, layout, &data.queues, settings)?);
        }
        // No receive is held yet: each `irecv` takes what its CTS needs from the shared queues,
        // which post them before the CTS goes out, so an IMM never finds a queue empty
        // (torchcomms #3345 saw RNR from posting late).
        data.announce_marks();
        let info = ConnectionInfo {
            devices: devices.clone(),
            registrations: self.device.registrations.clone(),
            device_index: self.device.index,
            nic_slots: self.device.nic_slots,
            peer: self.peer,
            class,
            mode: settings.mode,
            layout,
            bdp_bytes: settings.bdp_bytes,
            agent: None,
            profiler: ctx.profiler,
            health: self.device.health.clone(),
            qp_nums: qp_nums_by_rail(&data.qps, layout),
            attributes: Arc::clone(&ctx.attributes),
            failover: reply.failover,
            renewal: Renewal {
                peer_rails: request.rails,
                qp_settings: qp_settings(settings, ctx.traffic_class),
                sizing: receiver_sizing(settings, layout, class, reply.failover),
                secret: request.secret,
                failback: settings.failback.filter(|_| reply.failover),
            },
            watchdog_ns: 0, // the sender's: its parts are what complete or stall
        };
        self.built = Some((info, data));
        self.peer_rail_addresses = request.rails.map(|rail| address_of_wire(rail.address));
        Ok(())
    }

    /// Brings the QPs up against the connector's (no verb waits: its addresses are resolved).
    fn connect_queue_pairs(&mut self, ctx: &Arc<Context>, request: &ConnectRequest) -> Result<()> {
        let (info, data) = self
            .built
            .as_mut()
            .ok_or_else(|| Error::internal("connecting before the request"))?;
        connect_queue_pairs(
            &mut data.qps,
            info.layout,
            &request.rails,
            &request.qp_nums,
            &qp_settings(&ctx.settings, ctx.traffic_class),
        )
    }

    fn refusal_error(
        &self,
        refusal: Refusal,
        request: &ConnectRequest,
        reply: &ConnectReply,
        prefix: u8,
    ) -> Error {
        Error::invalid_usage(format!(
            "refusing connection from {}: {}: the peer sent mode {:?}, {} (classified from {}<->{} with prefix {}), \
             QPs sout={} sup={}; we have mode {:?}, {} (classified from {}<->{} with MPIB_ISLAND_PREFIX_LEN={prefix}), \
             QPs sout={} sup={}",
            self.peer,
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
            self.local.ip(),
            self.peer.ip(),
            reply.sout_qps,
            reply.sup_qps,
        ))
    }

    fn finish(
        &mut self,
        ctx: &Arc<Context>,
        agent: Option<AgentRegistration>,
    ) -> Result<Box<RecvComm>> {
        let (mut info, data) = self
            .built
            .take()
            .ok_or_else(|| Error::internal("ready before the request"))?;
        info.agent = agent;
        info!(
            log::NET | log::INIT,
            "recv comm from {}: QPs sout={} sup={}, CTS on {}",
            info.describe_peer(),
            info.layout.count(Rail::ScaleOut),
            info.layout.count(Rail::ScaleUp),
            info.layout
                .rail_of(info.layout.cts_qp(info.mode, info.class))
                .unwrap_or(Rail::ScaleOut)
        );
        let mut data = data;
        data.telemetry = ConnectionTelemetry::claim(&ctx.plugin.telemetry, &info, false);
        let share = self
            .link
            .take()
            .ok_or_else(|| Error::internal("finish before the control link"))?;
        data.peer =
            PeerWatch::of_control(share, *self.local.ip(), &self.device.devices, info.failover);
        self.channel.finish();
        Ok(RecvComm::new(info, data))
    }

    /// Keeps a share of the link the connector proposed if this side holds it, else this
    /// handshake's connection as the new link; the answer names the one kept.
    fn answer_link(&mut self, ctx: &Arc<Context>, ready: &Ready) -> Result<LinkAnswer> {
        let settings = crate::net::setup::resources::qp_settings(&ctx.settings, ctx.traffic_class);
        let (connector, names) = (self.connector_process, self.link_names);
        let budget_ms = settings.retry_budget_ms();
        let stream = self.channel.stream();
        let share =
            link::answer(connector, ready, stream, budget_ms, names, now_ns()).map_err(|e| {
                let what = format!("keeping the control connection to {}", self.peer);
                crate::net::setup::descriptors::socket_error(&what, &e)
            })?;
        let answer = LinkAnswer {
            link: share.link_id(),
        };
        self.link = Some(share);
        Ok(answer)
    }
}
