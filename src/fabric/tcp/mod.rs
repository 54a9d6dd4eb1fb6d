//! The TCP fabric (`MPIB_FABRIC=tcp`): RC semantics over TCP connections, between processes and
//! hosts on any IP network, so that NCCL itself can drive the plugin where no RDMA NIC exists
//! (a GPU machine, CI, a laptop) and two-process tests run without an emulated RDMA rig.
//!
//! * A rail is an IPv4 interface: `MPIB_HCA_SOUT=eth0`, `eth0=10.0.0.1` (one of several
//!   addresses), or a bare address (`127.0.0.2`). Its address plays the GID's part, IPv4-mapped
//!   as RoCE v2 writes it (islands, the agent's registration, the collector's labels); its port
//!   is the rail's listening socket, which peers' QPs connect to.
//! * Each QP is one TCP connection bound to its rail's address, so a rail's bytes leave through
//!   that rail's route. WRITE and WRITE_WITH_IMM carry key, address and length; the receiver
//!   lands the bytes directly in the registered region after checking the key against its live
//!   registrations with remote-write access and the range against the region, and answers
//!   anything else with a NAK that fails the sender's WR with `RemoteAccess` — never a write
//!   elsewhere. READ serves the flush. Details: [`worker`], the wire: `proto::tcp_wire`.
//! * `MPIB_IB_TIMEOUT` and `MPIB_IB_RETRY_CNT` keep their meaning: unacknowledged bytes older
//!   than RC's retry budget (4.096 us x 2^timeout x (retries + 1)) fail the QP with
//!   `RetryExceeded` (TCP_USER_TIMEOUT), as do a reset or a closed connection, so a cut rail
//!   or a killed peer surfaces as the same NCCL error as on verbs.
//! * Progress: one thread per rail ([`thread`]), joined at the last `finalize`, at unload, or
//!   when the rail's last handle goes, whichever comes first.
//! * Host memory only: no GPUDirect, no DMA-BUF (`getProperties` says `NCCL_PTR_HOST`).

mod device;
mod link_state;
mod memory;
mod shared;
mod socket;
#[cfg(test)]
mod tests;
mod thread;
mod unclaimed;
mod worker;

use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::Arc;

use self::device::{Core, TcpDevice};
use self::shared::Shared;
use super::{
    DeviceInfo, Endpoint, Fabric, FabricError, FabricKind, FabricResult, LinkLayer, Rail,
    RailDevice,
};
use crate::netif::{ipv4_interfaces, Interface};

/// Speed reported for an interface whose sysfs speed is unknown (loopback, some virtual ones).
const DEFAULT_SPEED_MBPS: u32 = 10_000;

/// The TCP backend of the fabric seam.
#[derive(Debug, Default)]
pub struct TcpFabric;

impl TcpFabric {
    /// The fabric (it holds nothing: each rail opened is its own listener and thread).
    pub fn new() -> TcpFabric {
        TcpFabric
    }
}

impl Fabric for TcpFabric {
    fn name(&self) -> &'static str {
        "tcp"
    }

    fn device_names(&self) -> Vec<String> {
        let mut names: Vec<String> = ipv4_interfaces()
            .map(|list| {
                list.into_iter()
                    .map(|i| format!("{}={}", i.name, i.address))
                    .collect()
            })
            .unwrap_or_default();
        names.dedup();
        names
    }

    /// The control connection runs over the scale-out rail, as it does beside a verbs SOUT NIC:
    /// islands are classified from that address pair.
    fn control_address(&self, sout: &dyn RailDevice) -> Option<Ipv4Addr> {
        match sout.info().address {
            std::net::IpAddr::V4(address) => Some(address),
            std::net::IpAddr::V6(_) => None,
        }
    }

    fn open(&self, spec: &str, rail: Rail) -> FabricResult<Arc<dyn RailDevice>> {
        let (name, address) = rail_address(spec)?;
        let error = |verb: &'static str, e: std::io::Error| FabricError {
            verb,
            device: name.clone(),
            qp_num: None,
            errno: e.raw_os_error().unwrap_or(0),
            detail: format!("{rail} rail at {address}: {e}"),
        };
        let (listener, port) = socket::listener(address).map_err(|e| error("listen", e))?;
        let shared =
            Arc::new(Shared::new(name.clone(), address, port).map_err(|e| error("eventfd", e))?);
        let thread_shared = Arc::clone(&shared);
        let thread = crate::native_thread::NativeThread::spawn(
            &format!("mpib-tcp-{}", rail.label()),
            move || {
                thread::run(thread_shared, listener);
            },
        )
        .map_err(|e| error("pthread_create", e))?;
        let info = device_info(&name, address, port);
        Ok(Arc::new(TcpDevice {
            core: Arc::new(Core::new(shared, thread)),
            info,
        }))
    }
}

/// The interface name and address a rail spec names: `IFNAME`, `IFNAME=ADDR` or `ADDR`.
pub(crate) fn rail_address(spec: &str) -> FabricResult<(String, Ipv4Addr)> {
    let interfaces = ipv4_interfaces().map_err(|e| FabricError {
        verb: "getifaddrs",
        device: spec.to_string(),
        qp_num: None,
        errno: e.raw_os_error().unwrap_or(0),
        detail: e.to_string(),
    })?;
    resolve_spec(spec.trim(), &interfaces)
}

/// [`rail_address`] against a given interface list (pure, for tests).
fn resolve_spec(spec: &str, interfaces: &[Interface]) -> FabricResult<(String, Ipv4Addr)> {
    let unknown = |why: String| FabricError {
        verb: "open",
        device: spec.to_string(),
        qp_num: None,
        errno: libc::ENODEV,
        detail: why,
    };
    let (name, address) = match spec.split_once('=') {
        Some((name, address)) => {
            let address = address.trim().parse::<Ipv4Addr>().map_err(|_| {
                unknown(format!(
                    "`{address}` is not an IPv4 address (expected IFNAME=ADDR)"
                ))
            })?;
            (Some(name.trim()), Some(address))
        }
        None => match spec.parse::<Ipv4Addr>() {
            Ok(address) => (None, Some(address)),
            Err(_) => (Some(spec), None),
        },
    };
    match (name, address) {
        (Some(name), None) => interfaces
            .iter()
            .find(|i| i.name == name)
            .map(|i| (name.to_string(), i.address))
            .ok_or_else(|| unknown(format!("no interface `{name}` with an IPv4 address is up"))),
        (Some(name), Some(address)) => interfaces
            .iter()
            .find(|i| {
                i.name == name && (i.address == address || (i.is_loopback && i.contains(address)))
            })
            .map(|_| (name.to_string(), address))
            .ok_or_else(|| {
                unknown(format!(
                    "interface `{name}` is not up with address {address}"
                ))
            }),
        (None, Some(address)) => interfaces
            .iter()
            .find(|i| i.address == address)
            .or_else(|| {
                interfaces
                    .iter()
                    .find(|i| i.is_loopback && i.contains(address))
            })
            .map(|i| (i.name.clone(), address))
            .ok_or_else(|| unknown(format!("no interface that is up has address {address}"))),
        (None, None) => Err(unknown("empty rail".to_string())),
    }
}

/// What a TCP rail reports: the interface as the device, its address, its endpoint (address and
/// listening port), its sysfs speed and PCI path when it has them, and a GUID per address.
fn device_info(name: &str, address: Ipv4Addr, port: u16) -> DeviceInfo {
    let sysfs = format!("/sys/class/net/{name}");
    let speed_mbps = std::fs::read_to_string(format!("{sysfs}/speed"))
        .ok()
        .and_then(|s| s.trim().parse::<i64>().ok())
        .filter(|s| *s > 0)
        .and_then(|s| u32::try_from(s).ok())
        .unwrap_or(DEFAULT_SPEED_MBPS);
    let pci_path = std::fs::canonicalize(format!("{sysfs}/device"))
        .ok()
        .map(|p| p.to_string_lossy().into_owned())
        .filter(|p| p.contains("/pci"));
    // SAFETY: getrlimit writes the struct it is given.
    let descriptors = unsafe {
        let mut limit = std::mem::zeroed::<libc::rlimit>();
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
        limit.rlim_cur
    };
    DeviceInfo {
        name: if name.is_empty() {
            address.to_string()
        } else {
            name.to_string()
        },
        port: 1,
        speed_mbps,
        active_mtu: 5,
        link_layer: LinkLayer::Ethernet,
        address: address.into(),
        endpoint: endpoint_of(SocketAddrV4::new(address, port)),
        // "MPIB" then the address: distinct per rail address, the same in every process on it.
        guid: 0x4D50_4942_0000_0000 | u64::from(u32::from(address)),
        pci_path,
        // Each QP holds one descriptor.
        max_qp: u32::try_from(descriptors).unwrap_or(u32::MAX).max(1),
        // Completion and receive queues are memory only, bounded by nothing but the host.
        max_cq: u32::MAX,
        max_srq: u32::MAX,
        max_srq_wr: device::MAX_SRQ_WR,
        max_mr: u32::MAX,
    }
}

/// A tcp rail's endpoint: the rail's IPv4 address and listening port (big-endian), the rest
/// zero.
pub(crate) fn endpoint_of(address: SocketAddrV4) -> Endpoint {
    let mut body = [0u8; 6];
    body[..4].copy_from_slice(&address.ip().octets());
    body[4..].copy_from_slice(&address.port().to_be_bytes());
    Endpoint::new(FabricKind::Tcp, &body)
}

/// Where a peer rail's queue pairs listen, from its endpoint, or why that is not a tcp rail's.
pub(crate) fn socket_address(endpoint: &Endpoint) -> Result<SocketAddrV4, String> {
    let body = endpoint.body(FabricKind::Tcp)?;
    let ip = Ipv4Addr::new(body[0], body[1], body[2], body[3]);
    let port = u16::from_be_bytes([body[4], body[5]]);
    if port == 0 || ip.is_unspecified() {
        return Err(format!(
            "the peer's tcp endpoint {ip}:{port} has no address or port"
        ));
    }
    Ok(SocketAddrV4::new(ip, port))
}
