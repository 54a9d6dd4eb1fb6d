//! What send and receive comms share: identity for `void*` dispatch, connection facts, and
//! completion-error reporting.

use std::net::SocketAddrV4;
use std::sync::Arc;

use crate::error::Error;
use crate::fabric::{Completion, CompletionOpcode, CompletionStatus, Rail};
use crate::params::Mode;
use crate::proto::island::PathClass;
use crate::proto::qp_layout::QpLayout;

use crate::fabric::QpSettings;
use crate::net::agent::registration::AgentRegistration;
use crate::net::data::registrations::RegistrationCache;
use crate::net::observe::attributes::NetAttributes;
use crate::net::observe::health::{DeviceHealth, HealthWatch};
use crate::net::setup::resources::{Devices, QueueSizing};
use crate::proto::failback::FailbackSettings;
use crate::proto::wire::RailEndpoint;

/// First word of a `SendComm`.
pub(crate) const SEND_MAGIC: u32 = 0x4D50_5353; // "MPSS"
/// First word of a `RecvComm`.
pub(crate) const RECV_MAGIC: u32 = 0x4D50_5352; // "MPSR"

/// Facts about a connection, fixed once it is up; readable from any thread.
pub(crate) struct ConnectionInfo {
    /// The two rails: the fused device's SOUT and SUP NICs.
    pub devices: Devices,
    /// The two NICs' `regMr` registrations, shared with every comm on them.
    pub registrations: [Arc<RegistrationCache>; 2],
    /// The fused device's index (NCCL's `dev`).
    pub device_index: usize,
    /// The probes file's slots of the two NICs.
    pub nic_slots: [usize; 2],
    /// The peer's control address.
    pub peer: SocketAddrV4,
    /// Island classification both sides agreed on.
    pub class: PathClass,
    /// Vanilla or advanced.
    pub mode: Mode,
    /// QP pools.
    pub layout: QpLayout,
    /// `MPIB_BDP_BYTES`: advanced inter-island transfers up to this size stay on SOUT (0: off).
    pub bdp_bytes: u64,
    /// Agent registration (advanced mode), deregistered on drop.
    pub agent: Option<AgentRegistration>,
    /// NCCL's profiler callback (v10+), if the communicator gave one.
    pub profiler: Option<crate::net::ProfilerCallback>,
    /// Published async events of the two rail devices.
    pub health: [Arc<DeviceHealth>; 2],
    /// This connection's QP numbers per rail (to match QP-level async events).
    pub qp_nums: [Vec<u32>; 2],
    /// Its context's `setNetAttr` attributes, read at each post.
    pub attributes: Arc<NetAttributes>,
    /// Whether a failed rail fails over to the other: both ends allow it (docs/PROTOCOL.md §10;
    /// a layout with one rail has none to go on over, and fails as without).
    pub failover: bool,
    /// What a failed rail's return needs (docs/PROTOCOL.md §11).
    pub renewal: Renewal,
    /// `MPIB_FAILOVER_WATCHDOG_MS` in ns: a rail with parts in flight and no completion for this
    /// long while the other completes fails over (`proto::watchdog`); 0: off, or no failover.
    pub watchdog_ns: u64,
}

/// What a rail's return needs to make and connect its queue pairs again, as the handshake did
/// (docs/PROTOCOL.md §11).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Renewal {
    /// The peer's rails, as its handshake named them.
    pub peer_rails: [RailEndpoint; 2],
    /// The QPs' transport settings.
    pub qp_settings: QpSettings,
    /// This side's queue sizes.
    pub sizing: QueueSizing,
    /// The connection's secret, which new QPs carry as the first ones did.
    pub secret: u64,
    /// When this side tries to bring a rail back (`MPIB_FAILBACK*`); `None`: it does not, and
    /// refuses the peer's offers.
    pub failback: Option<FailbackSettings>,
}

impl ConnectionInfo {
    /// "peer 10.0.0.2:4242 (intra-island, vanilla)" for messages.
    pub(crate) fn describe_peer(&self) -> String {
        let mode = match self.mode {
            Mode::Vanilla => "vanilla",
            Mode::Advanced => "advanced",
        };
        format!("peer {} ({}, {mode})", self.peer, self.class.label())
    }

    /// A fatal async event of a rail this comm uses (read by the housekeeping thread every
    /// 10 ms, published per device), as the error it is: the rail failed.
    pub(crate) fn check_health(
        &self,
        watch: &mut HealthWatch,
        now_ns: u64,
    ) -> Option<(Rail, Error)> {
        let (rail, event) = watch.check(now_ns, &self.health, &self.qp_nums)?;
        let error = Error::system(format!(
            "{}: the {rail} rail ({}) reported {event:?}",
            self.describe_peer(),
            self.devices[rail.index()].info().name
        ));
        Some((rail, error))
    }

    /// Whether a failed completion says the rail failed: its peer stopped answering
    /// (`RETRY_EXC_ERR`), or the QP is in error and flushed it (`WR_FLUSH_ERR`: behind such a
    /// failure, or posted after it), as net_ib's resiliency takes them; a failover survives
    /// both. Any other status is a fault of this connection (a key, a range, a receive
    /// missing) and fails it.
    pub(crate) fn is_rail_failure(status: CompletionStatus) -> bool {
        matches!(
            status,
            CompletionStatus::RetryExceeded | CompletionStatus::Flushed
        )
    }

    /// The error a failed completion becomes: `ncclRemoteError` with everything an operator needs
    /// (NCCL's net_ib reports the same fields, `docs/NCCL_NET_ABI.md` §3.8).
    pub(crate) fn completion_error(&self, rail: Rail, completion: &Completion) -> Error {
        let device = &self.devices[rail.index()].info().name;
        let opcode = match completion.opcode {
            CompletionOpcode::RdmaWrite => "RDMA_WRITE",
            CompletionOpcode::RecvRdmaWithImm => "RECV_RDMA_WITH_IMM",
            CompletionOpcode::RdmaRead => "RDMA_READ",
        };
        let hint = match completion.status {
            CompletionStatus::RetryExceeded => {
                "; the peer's NIC stopped answering (cable, switch or peer down): raise MPIB_IB_TIMEOUT if the fabric is merely slow"
            }
            CompletionStatus::Flushed => "; an earlier work request on this QP failed",
            CompletionStatus::ReceiverNotReady => "; the receiver's shared receive queue was empty",
            CompletionStatus::RemoteAccess => "; the peer rejected the rkey or address range",
            CompletionStatus::LocalProtection => "; a local buffer is outside its registration",
            _ => "",
        };
        Error::remote(format!(
            "{}: {rail} rail ({device}) QP {:#x}: {opcode} completed with status \"{}\" ({}), vendor error {:#x}{hint}",
            self.describe_peer(),
            completion.qp_num,
            completion.status.text(),
            completion.status.code(),
            completion.vendor_err,
        ))
    }
}
