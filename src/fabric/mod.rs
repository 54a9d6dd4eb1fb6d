//! The fabric seam: a narrow, verbs-shaped interface between the engine and the NICs.
//!
//! Everything the protocol needs from RDMA hardware fits in five operations: post a chain of
//! RDMA_WRITE / RDMA_WRITE_WITH_IMM work requests on an RC queue pair, post generic receives on a
//! shared receive queue, poll a completion queue into a caller-owned array, register memory, and
//! bring a queue pair up against a remote one. Two implementations serve it:
//!
//! * [`loopback`]: an in-process model of RC semantics (order within a QP, none across QPs or
//!   rails, one SRQ receive consumed per IMM, bounded CQs, error completions) with deterministic
//!   fault knobs. Chosen only explicitly with `MPIB_FABRIC=loopback`.
//! * `verbs` (real libibverbs through rdma-sys), the production default.
//! * [`tcp`]: RC semantics over TCP connections between processes and hosts
//!   (`MPIB_FABRIC=tcp`), for running under NCCL where no RDMA NIC exists.
//!
//! The data-path methods (`post_send`, `post_receives`, `poll`) take plain `Copy` values and
//! caller-provided slices so that no implementation needs to allocate per call.

mod endpoint;
pub(crate) mod landing;
pub mod loopback;
pub(crate) mod pages;
pub mod tcp;
pub mod verbs;

pub use endpoint::{Endpoint, FabricKind, ENDPOINT_BYTES};
// The protocol core owns the shapes it builds (rails, work requests); the seam speaks them.
pub use mpib_proto::rail::Rail;
pub use mpib_proto::work::{SendOpcode, Sge, WorkRequest};

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

/// Link layer of a port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkLayer {
    /// Native InfiniBand (addressed by LID, GID optional).
    InfiniBand,
    /// RoCE (addressed by GID).
    Ethernet,
}

/// What a device reports about itself; used for `getProperties` and the handshake.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    /// Device name as the user wrote it in `MPIB_HCA_*` (without the port suffix).
    pub name: String,
    /// Physical port number used (1-based, as in verbs).
    pub port: u8,
    /// Link speed in Mbps (width x rate).
    pub speed_mbps: u32,
    /// Active MTU as the verbs enum value (1 = 256 ... 5 = 4096).
    pub active_mtu: u8,
    /// Link layer of the port.
    pub link_layer: LinkLayer,
    /// The device's IP address: what islands, the agent's flows and the collector's labels are
    /// keyed by (verbs: the address of the RoCE v2 GID; tcp: the rail's address; `::` when the
    /// device has none, as on native InfiniBand).
    pub address: IpAddr,
    /// How peers reach this rail's queue pairs, in the fabric's own encoding ([`Endpoint`]).
    pub endpoint: Endpoint,
    /// Node GUID (NETs with the same guid are one ASIC for NCCL's topology search).
    pub guid: u64,
    /// Canonical sysfs PCI path, when the device has one (Soft-RoCE and VFs may not).
    pub pci_path: Option<String>,
    /// Largest number of QPs the device supports.
    pub max_qp: u32,
    /// Largest number of completion queues (`max_cq`).
    pub max_cq: u32,
    /// Largest number of shared receive queues (`max_srq`).
    pub max_srq: u32,
    /// Largest number of receives one shared receive queue holds (`max_srq_wr`).
    pub max_srq_wr: u32,
    /// Largest number of memory registrations (`max_mr`).
    pub max_mr: u32,
}

/// Completion status, a subset of `ibv_wc_status` with the values that matter to MPIB.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompletionStatus {
    /// IBV_WC_SUCCESS.
    Success,
    /// IBV_WC_LOC_PROT_ERR: a local SGE outside its memory region.
    LocalProtection,
    /// IBV_WC_WR_FLUSH_ERR: the QP went to the error state before this WR ran.
    Flushed,
    /// IBV_WC_REM_ACCESS_ERR: bad rkey or range on the remote side.
    RemoteAccess,
    /// IBV_WC_RETRY_EXC_ERR: transport retries exhausted (peer unreachable).
    RetryExceeded,
    /// IBV_WC_RNR_RETRY_EXC_ERR: the receiver had no receive posted.
    ReceiverNotReady,
    /// Any other status, with the raw `ibv_wc_status` value.
    Other(u32),
}

impl CompletionStatus {
    /// The `ibv_wc_status` numeric value.
    pub fn code(self) -> u32 {
        match self {
            CompletionStatus::Success => 0,
            CompletionStatus::LocalProtection => 4,
            CompletionStatus::Flushed => 5,
            CompletionStatus::RemoteAccess => 10,
            CompletionStatus::RetryExceeded => 12,
            CompletionStatus::ReceiverNotReady => 13,
            CompletionStatus::Other(code) => code,
        }
    }

    /// The same text `ibv_wc_status_str` gives.
    pub fn text(self) -> &'static str {
        match self {
            CompletionStatus::Success => "success",
            CompletionStatus::LocalProtection => "local protection error",
            CompletionStatus::Flushed => "Work Request Flushed Error",
            CompletionStatus::RemoteAccess => "remote access error",
            CompletionStatus::RetryExceeded => "transport retry counter exceeded",
            CompletionStatus::ReceiverNotReady => "RNR retry counter exceeded",
            CompletionStatus::Other(_) => "unknown completion status",
        }
    }
}

/// What kind of work a completion reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompletionOpcode {
    /// Sender side: an RDMA_WRITE or RDMA_WRITE_WITH_IMM finished.
    RdmaWrite,
    /// Receiver side: an RDMA_WRITE_WITH_IMM consumed an SRQ receive.
    RecvRdmaWithImm,
    /// Sender side: an RDMA_READ finished (flush).
    RdmaRead,
}

/// One polled completion, copied out of the CQ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The `wr_id` of the send WR, or of the SRQ receive consumed.
    pub wr_id: u64,
    /// Result of the work request.
    pub status: CompletionStatus,
    /// What completed (only meaningful on success, as in verbs).
    pub opcode: CompletionOpcode,
    /// Bytes placed by the RDMA_WRITE_WITH_IMM (receiver side).
    pub byte_len: u32,
    /// Immediate data in network byte order (receiver side, `RecvRdmaWithImm`).
    pub imm: u32,
    /// Local QP number the completion belongs to.
    pub qp_num: u32,
    /// Vendor error code, for error reports.
    pub vendor_err: u32,
}

impl Completion {
    /// The completion of `wr` flushed from QP `qp_num` in the error state (`WR_FLUSH_ERR`),
    /// with the vendor error code `vendor_err`.
    pub fn flushed(wr: &WorkRequest, qp_num: u32, vendor_err: u32) -> Completion {
        Completion {
            wr_id: wr.wr_id,
            status: CompletionStatus::Flushed,
            opcode: match wr.opcode {
                SendOpcode::Read => CompletionOpcode::RdmaRead,
                _ => CompletionOpcode::RdmaWrite,
            },
            byte_len: 0,
            imm: 0,
            qp_num,
            vendor_err,
        }
    }

    /// A zeroed completion, for initialising caller-owned poll arrays.
    pub const EMPTY: Completion = Completion {
        wr_id: 0,
        status: CompletionStatus::Success,
        opcode: CompletionOpcode::RdmaWrite,
        byte_len: 0,
        imm: 0,
        qp_num: 0,
        vendor_err: 0,
    };
}

/// Access rights of a memory registration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access {
    /// The NIC may write into the region from a remote peer.
    pub remote_write: bool,
    /// The NIC may read the region for a remote peer (flush uses this).
    pub remote_read: bool,
    /// Register with relaxed PCIe ordering where the device supports it.
    pub relaxed_ordering: bool,
}

impl Access {
    /// Data buffers: remote write and read.
    pub const DATA: Access = Access {
        remote_write: true,
        remote_read: true,
        relaxed_ordering: false,
    };
    /// Control memory (CTS FIFO, completion records): remote write, strict ordering.
    pub const CONTROL: Access = Access {
        remote_write: true,
        remote_read: true,
        relaxed_ordering: false,
    };
    /// Local-only memory (shadows written by the local NIC from local SGEs).
    pub const LOCAL: Access = Access {
        remote_write: false,
        remote_read: false,
        relaxed_ordering: false,
    };
}

/// How to reach the remote end of a queue pair (exchanged in the handshake).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteQp {
    /// Remote QP number.
    pub qp_num: u32,
    /// The remote rail's endpoint ([`DeviceInfo::endpoint`]).
    pub endpoint: Endpoint,
}

/// Transport settings applied when a QP is brought to RTR/RTS (NCCL's defaults).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpSettings {
    /// Local ACK timeout exponent (4.096 us * 2^timeout).
    pub timeout: u8,
    /// Transport retry count.
    pub retry_count: u8,
    /// RNR retry count (7 = infinite).
    pub rnr_retry: u8,
    /// Minimum RNR NAK timer.
    pub min_rnr_timer: u8,
    /// Traffic class (RoCE).
    pub traffic_class: u8,
    /// Service level (InfiniBand).
    pub service_level: u8,
}

impl QpSettings {
    /// How long RC keeps retrying an unacknowledged packet before the QP fails: 4.096 us x
    /// 2^timeout per try, `retry_count + 1` tries (ms, at least 1). Anything that must notice a
    /// dead path no later than the QPs do (the tcp fabric's sockets, the control connection)
    /// uses it.
    pub fn retry_budget_ms(&self) -> u32 {
        let per_try_us = 4.096 * f64::from(1u32 << self.timeout.min(31));
        let tries = f64::from(self.retry_count.min(7)) + 1.0;
        (per_try_us * tries / 1000.0).clamp(1.0, f64::from(u32::MAX)) as u32
    }
}

impl Default for QpSettings {
    fn default() -> Self {
        QpSettings {
            timeout: 20,
            retry_count: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            traffic_class: 0,
            service_level: 0,
        }
    }
}

/// Sizes of a queue pair's send queue, and the secret of the connection it belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpCapabilities {
    /// Maximum outstanding send WRs.
    pub max_send_wr: u32,
    /// Maximum inline payload in bytes.
    pub max_inline: u32,
    /// The connection's secret, drawn by the connector and carried in its handshake
    /// (docs/PROTOCOL.md §1): a fabric whose QP connections anyone who reaches a port could open
    /// (tcp) takes only those that prove it. Verbs ignores it: RoCE has no such step.
    pub secret: u64,
}

/// A registered memory region (one per rail; the engine keeps one per rail per buffer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryKeys {
    /// Local key, for SGEs.
    pub lkey: u32,
    /// Remote key, for peers' RDMA writes.
    pub rkey: u32,
}

/// Error from a fabric operation: which verb, on which rail/device/QP, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FabricError {
    /// The operation, named like the verb (`ibv_post_send`, `ibv_reg_mr`, ...).
    pub verb: &'static str,
    /// Device name.
    pub device: String,
    /// QP number, when the operation concerns one.
    pub qp_num: Option<u32>,
    /// errno (0 when not applicable).
    pub errno: i32,
    /// Human-readable detail.
    pub detail: String,
}

impl fmt::Display for FabricError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed on device {}", self.verb, self.device)?;
        if let Some(qp) = self.qp_num {
            write!(f, " QP {qp}")?;
        }
        if self.errno != 0 {
            write!(
                f,
                ": errno {} ({})",
                self.errno,
                std::io::Error::from_raw_os_error(self.errno)
            )?;
        }
        if !self.detail.is_empty() {
            write!(f, ": {}", self.detail)?;
        }
        Ok(())
    }
}

impl std::error::Error for FabricError {}

/// Result of a fabric operation.
pub type FabricResult<T> = Result<T, FabricError>;

/// An asynchronous event read from a device (port state, fatal errors).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AsyncEvent {
    /// The port went down (IBV_EVENT_PORT_ERR).
    PortDown,
    /// The port came back (IBV_EVENT_PORT_ACTIVE).
    PortActive,
    /// The device is unusable (IBV_EVENT_DEVICE_FATAL).
    DeviceFatal,
    /// A QP hit a fatal error (IBV_EVENT_QP_FATAL and friends).
    QpFatal {
        /// The QP number.
        qp_num: u32,
    },
    /// A CQ overflowed or failed (IBV_EVENT_CQ_ERR).
    CqError,
    /// An SRQ reached its limit (IBV_EVENT_SRQ_LIMIT_REACHED).
    SrqLimit,
}

impl AsyncEvent {
    /// Whether the event makes the comms using the device unusable.
    pub fn is_fatal(self) -> bool {
        matches!(
            self,
            AsyncEvent::DeviceFatal | AsyncEvent::QpFatal { .. } | AsyncEvent::CqError
        )
    }
}

/// A completion queue. One per comm per rail; polled only by the comm's progress thread.
pub trait CompletionQueue: Send {
    /// Copies up to `out.len()` completions into `out`; returns how many.
    fn poll(&mut self, out: &mut [Completion]) -> FabricResult<usize>;
    /// The concrete queue, so the fabric that made it can attach QPs to it.
    fn as_any(&self) -> &dyn std::any::Any;
}

/// A shared receive queue of generic zero-SGE receives, shared by the receive connections of a
/// NIC (src/net/setup/receives.rs): posting takes `&self`, as `ibv_post_srq_recv` is
/// thread-safe, so creating a QP on the queue never waits for a post, nor a post for it.
pub trait SharedReceiveQueue: Send + Sync {
    /// Posts `count` generic receives, each with `wr_id`.
    fn post_receives(&self, count: u32, wr_id: u64) -> FabricResult<()>;
    /// The concrete queue, so the fabric that made it can attach QPs to it.
    fn as_any(&self) -> &dyn std::any::Any;
}

/// An RC queue pair.
pub trait QueuePair: Send {
    /// Local QP number.
    fn qp_num(&self) -> u32;
    /// Moves the QP through INIT -> RTR -> RTS against `remote`.
    fn connect(&mut self, remote: &RemoteQp, settings: &QpSettings) -> FabricResult<()>;
    /// Posts `chain` as one linked list of WRs, in order.
    ///
    /// # Safety
    /// Every local SGE range must stay registered and unmodified, and every remote range must stay
    /// registered by the peer, until the completion of the chain's signaled WR has been polled
    /// (NCCL keeps buffers alive until `test` reports the request done).
    unsafe fn post_send(&mut self, chain: &[WorkRequest]) -> FabricResult<()>;
    /// Moves the QP to the error state (`ibv_modify_qp` to `IBV_QPS_ERR`), as a failover does
    /// with the failed rail's QPs (docs/PROTOCOL.md §10): WRs not yet executed are flushed,
    /// posts fail, and once [`QueuePair::quiesced`] says so nothing more lands at it or leaves
    /// it. Idempotent; never waits.
    fn fail(&mut self) -> FabricResult<()>;
    /// Whether, since [`QueuePair::fail`], nothing more can land at or leave the QP and every
    /// completion it produced is in its CQ (verbs: the HCA raised the last-WQE-reached event of
    /// a QP on a shared receive queue; the tcp fabric's rail thread has taken the request; the
    /// loopback is there at once). Polled across calls, never waits.
    fn quiesced(&mut self) -> FabricResult<bool>;
}

/// Sizes for creating a completion queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CqSettings {
    /// Number of entries.
    pub depth: u32,
}

/// Which GPU memory a device can register (decides `NCCL_PTR_CUDA` / `NCCL_PTR_DMABUF`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuSupport {
    /// GPUDirect through a peer-memory module (nv_peermem): `ibv_reg_mr` on CUDA addresses.
    pub peer_memory: bool,
    /// DMA-BUF registration (`ibv_reg_dmabuf_mr`).
    pub dmabuf: bool,
}

/// One opened NIC (device + port + protection domain).
pub trait RailDevice: Send + Sync {
    /// Static facts about the device.
    fn info(&self) -> &DeviceInfo;
    /// GPU memory the device can register (none unless the backend says otherwise).
    fn gpu_support(&self) -> GpuSupport {
        GpuSupport::default()
    }
    /// Registers `[addr, addr + len)`.
    fn register(&self, addr: u64, len: usize, access: Access) -> FabricResult<MemoryKeys>;
    /// Registers a DMA-BUF range (`fd` is only borrowed for the duration of the call).
    fn register_dmabuf(
        &self,
        offset: u64,
        len: usize,
        iova: u64,
        fd: i32,
        access: Access,
    ) -> FabricResult<MemoryKeys>;
    /// Releases a registration.
    fn deregister(&self, keys: MemoryKeys) -> FabricResult<()>;
    /// Creates a completion queue.
    fn create_cq(&self, settings: CqSettings) -> FabricResult<Box<dyn CompletionQueue>>;
    /// Creates a shared receive queue holding up to `depth` receives.
    fn create_srq(&self, depth: u32) -> FabricResult<Box<dyn SharedReceiveQueue>>;
    /// Creates an RC QP whose completions go to `cq` and whose receives come from `srq`.
    fn create_qp(
        &self,
        cq: &dyn CompletionQueue,
        srq: Option<&dyn SharedReceiveQueue>,
        caps: QpCapabilities,
    ) -> FabricResult<Box<dyn QueuePair>>;
    /// Reads one pending asynchronous event without blocking.
    fn next_async_event(&self) -> Option<AsyncEvent>;
    /// Starts resolving the address of the peer rail at `peer` (its [`DeviceInfo::endpoint`]).
    fn resolve_peer(&self, peer: &Endpoint) -> FabricResult<Box<dyn PeerResolution>>;
    /// Stops and joins every thread the device runs (the tcp fabric's rail thread; verbs and
    /// loopback run none). Called at the last `finalize` and from the image's fini entry, so that
    /// no thread runs in code `dlclose` is about to unmap (ABI v7 ... v10 have no `finalize`).
    /// Idempotent. Afterwards whatever needs the thread fails with an error that says it was
    /// stopped, never waits for it.
    fn stop_threads(&self) {}
}

/// A peer's address being resolved on one rail, checked without blocking.
///
/// On RoCE a QP cannot reach RTR before the kernel knows the MAC of the next hop towards the
/// peer's GID; when the neighbour table has no valid entry, `ibv_modify_qp(RTR)` waits for ARP
/// inside the call (up to a second, measured on the rig; docs/RELIABILITY.md). The engine
/// therefore polls this once per `connect`/`accept` call and brings QPs up only when it is
/// ready, so no call waits.
pub trait PeerResolution: Send {
    /// One non-blocking check, nudging the kernel to resolve when due; `true` once a QP can be
    /// connected towards the peer without waiting.
    fn poll(&mut self) -> FabricResult<bool>;
    /// What is being resolved (device, addresses, interface, last failure), for logs and the
    /// timeout error.
    fn describe(&self) -> String;
    /// Whether the last `poll` that said ready found the address resolved (or could not check
    /// it), rather than gave up waiting for it: a rail brought back after a failover connects
    /// only then, since a connect towards an unresolved address waits inside the call
    /// (docs/PROTOCOL.md §11).
    fn confirmed(&self) -> bool {
        true
    }
}

/// A backend that opens devices by name.
pub trait Fabric: Send + Sync {
    /// `loopback`, `verbs` or `tcp`.
    fn name(&self) -> &'static str;
    /// Names of the devices this fabric can open, for error messages.
    fn device_names(&self) -> Vec<String>;
    /// Opens `spec` (`name` or `name:port`) as `rail`.
    fn open(&self, spec: &str, rail: Rail) -> FabricResult<Arc<dyn RailDevice>>;
    /// The control connection's address when neither `MPIB_OOB_ADDR` nor `MPIB_OOB_IF` names
    /// one, given the opened SOUT rail; `None`: the first IPv4 interface that is up.
    fn control_address(&self, sout: &dyn RailDevice) -> Option<std::net::Ipv4Addr> {
        let _ = sout;
        None
    }
    /// Whether NCCL should find its devices on the PCI bus (hardware NICs): a device without a
    /// PCI path then earns a warning, since NCCL places it without PCI topology.
    fn places_by_pci(&self) -> bool {
        false
    }
}

/// Canonical path of RDMA device `name`'s PCI function under the sysfs tree `sysfs`
/// (`MPIB_SYSFS`): where `class/infiniband/NAME/device` leads. `None` for a device without one
/// (Soft-RoCE and some virtual functions live under `devices/virtual`, which is no PCI path).
pub(crate) fn rdma_pci_path(sysfs: &str, name: &str) -> Option<String> {
    let link = std::path::Path::new(sysfs)
        .join("class/infiniband")
        .join(name)
        .join("device");
    std::fs::canonicalize(link)
        .ok()
        .map(|p| p.to_string_lossy().into_owned())
}

/// The fabric `settings.fabric` names, created with its settings: the one place that knows
/// every fabric, so a new one is a new module and a line here.
pub fn select(settings: &crate::params::Settings) -> FabricResult<Arc<dyn Fabric>> {
    Ok(match settings.fabric {
        FabricKind::Loopback => Arc::new(
            loopback::LoopbackFabric::new(&settings.loopback_faults, &settings.loopback_rails)?
                .with_sysfs(&settings.sysfs),
        ),
        FabricKind::Verbs => Arc::new(verbs::VerbsFabric::new(settings)?),
        FabricKind::Tcp => Arc::new(tcp::TcpFabric::new()),
    })
}
