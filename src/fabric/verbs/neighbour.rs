//! RoCE address resolution without waiting inside a call.
//!
//! `ibv_modify_qp(RTR)` on a RoCE port needs the MAC address of the next hop towards the peer's
//! GID. When the kernel's neighbour table has no valid entry, the kernel sends ARP and waits for
//! the answer inside the call: on the rig the first `accept` of every boot took 1048-1062 ms
//! that way (docs/RELIABILITY.md). NCCL's proxy thread drives every connection from one thread,
//! so the engine asks here first and connects QPs only once the entry is valid:
//!
//! * the next hop is the peer itself, or the gateway of the longest matching route on the GID's
//!   interface (`/proc/net/route`, the main table);
//! * one `SIOCGARP` per poll reads the entry; `ATF_COM` means the kernel's `NUD_VALID` (reachable,
//!   stale, delay or probe), which is what `ib_resolve_eth_dmac` accepts without waiting;
//! * while it is not valid, a one-byte UDP datagram to the peer's discard port (9), at most once
//!   a second, makes the kernel start (or restart, after a failed attempt) ARP on its own.
//!
//! The nudge leaves through the GID's interface (`IP_UNICAST_IF`), as the kernel's RDMA address
//! resolution does, so that a host with several NICs on one subnet resolves on the right one.
//! A resolution holds no socket between polls: each check and each nudge opens its own and
//! closes it, so the handshakes of a batch in flight (128 per peer: src/net/setup/admission.rs)
//! do not hold a descriptor each (they held two, one per rail, on the rig: issue 32).
//!
//! InfiniBand ports address peers by LID and need none of this. What cannot be checked is ready
//! at once, with an INFO line saying so, and the kernel resolves inside `ibv_modify_qp` as it
//! would without this module: GIDs that are not IPv4-mapped (RoCE over IPv6 uses neighbour
//! discovery, which `SIOCGARP` cannot read), an interface that is not in this network namespace
//! or does no ARP, and any error of the check itself. A peer address that is local to this host
//! is routed through `lo` and never gets an entry, unless policy routing sends it out through a
//! NIC (as the Soft-RoCE rig does): it is waited for at most [`LOCAL_PEER_WAIT`]. Whatever is
//! still unresolved at `MPIB_ADDR_RESOLVE_TIMEOUT_MS` is connected anyway (`net/resolve.rs`).

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use crate::fabric::{FabricResult, LinkLayer, PeerResolution};
use crate::log;

/// `ATF_COM` from `<linux/if_arp.h>`: the entry is complete (the kernel's `NUD_VALID`).
const ATF_COM: libc::c_int = 0x02;
/// `RTF_UP` and `RTF_GATEWAY` from `<linux/route.h>`.
const RTF_UP: u32 = 0x0001;
const RTF_GATEWAY: u32 = 0x0002;
/// How often an unresolved neighbour is nudged again (the kernel's own ARP retransmit time).
const NUDGE_INTERVAL: Duration = Duration::from_secs(1);
/// How long a peer address local to this host is waited for (see the module comment).
const LOCAL_PEER_WAIT: Duration = Duration::from_secs(1);
/// `IP_UNICAST_IF` from `<linux/in.h>`: the egress interface of an unconnected UDP socket.
const IP_UNICAST_IF: libc::c_int = 50;
/// `IFF_NOARP` from `<linux/if.h>`.
const IFF_NOARP: u32 = 0x80;
/// `RTF_REJECT` from `<linux/route.h>`: an unreachable route.
const RTF_REJECT: u32 = 0x0200;
/// The UDP discard port: a nudge that arrives is thrown away by the peer (or answered with an
/// ICMP error the unconnected socket never reports).
const DISCARD_PORT: u16 = 9;

/// The IPv4 address of an IPv4-mapped GID (`::ffff:a.b.c.d`), else `None`.
pub(crate) fn ipv4_of(gid: &[u8; 16]) -> Option<Ipv4Addr> {
    let mapped = gid[..10].iter().all(|b| *b == 0) && gid[10] == 0xff && gid[11] == 0xff;
    mapped.then(|| Ipv4Addr::new(gid[12], gid[13], gid[14], gid[15]))
}

/// Starts resolving `peer_gid` from a port with `link_layer`, GID `local_gid` on `netdev`.
pub(crate) fn start(
    device: &str,
    link_layer: LinkLayer,
    local_gid: &[u8; 16],
    netdev: Option<&str>,
    peer_gid: &[u8; 16],
) -> FabricResult<Box<dyn PeerResolution>> {
    if link_layer == LinkLayer::InfiniBand {
        return Ok(Box::new(Ready("InfiniBand: addressed by LID".to_string())));
    }
    let peer_text = super::gid::format_gid(peer_gid);
    let (Some(local), Some(peer)) = (ipv4_of(local_gid), ipv4_of(peer_gid)) else {
        let what = format!("{device}: peer GID {peer_text} is not IPv4-mapped; its neighbour entry is not checked (the kernel may wait for it inside ibv_modify_qp)");
        info!(log::NET, "{what}");
        return Ok(Box::new(Ready(what)));
    };
    let unchecked = |why: String| -> FabricResult<Box<dyn PeerResolution>> {
        let what = format!("{device}: {why}; the neighbour entry of {peer} is not checked (the kernel may wait for it inside ibv_modify_qp)");
        info!(log::NET, "{what}");
        Ok(Box::new(Ready(what)))
    };
    let Some(netdev) = netdev else {
        return unchecked(
            "the interface of the local GID is unknown (no gid_attrs/ndevs in sysfs)".into(),
        );
    };
    let Some(flags) = interface_flags(netdev) else {
        return unchecked(format!(
            "interface {netdev} is not in this network namespace"
        ));
    };
    if flags & IFF_NOARP != 0 {
        return unchecked(format!("interface {netdev} does no ARP"));
    }
    // Whether a nudge can leave at all (the socket itself is made again for each nudge).
    if let Err(e) = nudge_socket(local, netdev) {
        return unchecked(format!("no UDP socket on {local} through {netdev}: {e}"));
    }
    let routes = std::fs::read_to_string("/proc/net/route").unwrap_or_default();
    let next_hop = next_hop(&routes, netdev, peer);
    // A local address binds; a remote one does not (EADDRNOTAVAIL).
    let local_peer = UdpSocket::bind(SocketAddrV4::new(peer, 0)).is_ok();
    Ok(Box::new(ArpResolution {
        started: Instant::now(),
        local_peer,
        device: device.to_string(),
        netdev: netdev.to_string(),
        local,
        peer,
        next_hop,
        last_nudge: None,
        nudges: 0,
        last_failure: None,
        confirmed: false,
    }))
}

/// A resolution with nothing to wait for.
struct Ready(String);

impl PeerResolution for Ready {
    fn poll(&mut self) -> FabricResult<bool> {
        Ok(true)
    }

    fn describe(&self) -> String {
        self.0.clone()
    }
}

/// The interface's flags (`/sys/class/net/NAME/flags`), `None` when it is not in this namespace.
fn interface_flags(netdev: &str) -> Option<u32> {
    let text = std::fs::read_to_string(format!("/sys/class/net/{netdev}/flags")).ok()?;
    u32::from_str_radix(text.trim().trim_start_matches("0x"), 16).ok()
}

/// A non-blocking UDP socket on `local` whose datagrams leave through `netdev`.
fn nudge_socket(local: Ipv4Addr, netdev: &str) -> std::io::Result<UdpSocket> {
    let socket = UdpSocket::bind(SocketAddrV4::new(local, 0))?;
    socket.set_nonblocking(true)?;
    let name = std::ffi::CString::new(netdev)
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: `name` is a NUL-terminated string alive for the call.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if index == 0 {
        return Err(std::io::Error::last_os_error());
    }
    // The kernel reads the index in network byte order for IPv4 (ip(7), IP_UNICAST_IF).
    let value: u32 = index.to_be();
    // SAFETY: a live socket; `value` is a readable u32 of the length given.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_IP,
            IP_UNICAST_IF,
            (&value as *const u32).cast(),
            std::mem::size_of::<u32>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(socket)
}

/// An IPv4 neighbour entry being resolved on one interface.
struct ArpResolution {
    started: Instant,
    /// The peer's address is one of this host's (see [`LOCAL_PEER_WAIT`]).
    local_peer: bool,
    device: String,
    netdev: String,
    local: Ipv4Addr,
    peer: Ipv4Addr,
    next_hop: Ipv4Addr,
    last_nudge: Option<Instant>,
    nudges: u32,
    /// The last error a nudge met (`ENETUNREACH`, a firewall's `EPERM`), for the timeout error.
    last_failure: Option<String>,
    /// The last ready poll found a valid entry (or could not check): not the local peer's wait
    /// given up.
    confirmed: bool,
}

impl PeerResolution for ArpResolution {
    fn poll(&mut self) -> FabricResult<bool> {
        // The ioctl needs a socket, any: an unbound one, closed again after the check.
        let query = match socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None) {
            Ok(query) => query,
            Err(e) => {
                info!(
                    log::NET,
                    "{}: no socket to read the neighbour table with ({e}); the neighbour entry \
                     of {} on {} is not checked",
                    self.device,
                    self.next_hop,
                    self.netdev
                );
                self.confirmed = true;
                return Ok(true);
            }
        };
        match arp_flags(&query, self.next_hop, &self.netdev) {
            Ok(Some(flags)) if flags & ATF_COM != 0 => {
                self.confirmed = true;
                return Ok(true);
            }
            Ok(_) => {}
            Err(errno) => {
                // The check itself failed (the interface went away, a kernel that refuses it):
                // connect and let the kernel resolve, as without this module.
                info!(
                    log::NET,
                    "{}: SIOCGARP for {} on {} failed: {}; the neighbour entry is not checked",
                    self.device,
                    self.next_hop,
                    self.netdev,
                    std::io::Error::from_raw_os_error(errno)
                );
                self.confirmed = true;
                return Ok(true);
            }
        }
        if self.local_peer && self.started.elapsed() >= LOCAL_PEER_WAIT {
            self.confirmed = false;
            return Ok(true);
        }
        if self
            .last_nudge
            .map_or(true, |t| t.elapsed() >= NUDGE_INTERVAL)
        {
            self.last_nudge = Some(Instant::now());
            self.nudges += 1;
            let target = SocketAddrV4::new(self.peer, DISCARD_PORT);
            let sent = nudge_socket(self.local, &self.netdev)
                .and_then(|socket| socket.send_to(&[0], target));
            match sent {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => self.last_failure = Some(format!("sending to {target}: {e}")),
            }
        }
        Ok(false)
    }

    fn confirmed(&self) -> bool {
        self.confirmed
    }

    fn describe(&self) -> String {
        let via = if self.next_hop == self.peer {
            String::new()
        } else {
            format!(" via gateway {}", self.next_hop)
        };
        let failure = self
            .last_failure
            .as_ref()
            .map(|f| format!("; last nudge failed: {f}"))
            .unwrap_or_default();
        format!(
            "{}: {} -> {}{via} on {} has no valid neighbour entry after {} nudge(s){failure} \
             (check `ip neigh show {} dev {}` and `ip route get {} from {}`)",
            self.device,
            self.local,
            self.peer,
            self.netdev,
            self.nudges,
            self.next_hop,
            self.netdev,
            self.peer,
            self.local
        )
    }
}

/// The flags of `address`'s ARP entry on `netdev` (read through `socket`, any IPv4 socket);
/// `Ok(None)` when there is none.
fn arp_flags(
    socket: &socket2::Socket,
    address: Ipv4Addr,
    netdev: &str,
) -> Result<Option<libc::c_int>, i32> {
    // SAFETY: all-zero is a valid `arpreq` (integers and byte arrays).
    let mut request: libc::arpreq = unsafe { std::mem::zeroed() };
    let inet = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(address.octets()),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: `sockaddr_in` and `sockaddr` have the same size (16 bytes) and `arp_pa` is a
    // `sockaddr` the kernel reads as the family's address, as arp(7) documents.
    unsafe {
        std::ptr::copy_nonoverlapping(
            (&inet as *const libc::sockaddr_in).cast::<u8>(),
            (&mut request.arp_pa as *mut libc::sockaddr).cast::<u8>(),
            std::mem::size_of::<libc::sockaddr_in>(),
        );
    }
    // The name is NUL-terminated within IFNAMSIZ (16); longer names do not exist in Linux.
    for (slot, byte) in request.arp_dev.iter_mut().zip(netdev.bytes().take(15)) {
        *slot = byte as libc::c_char;
    }
    // SAFETY: the fd is a live socket; `request` is a valid, writable `arpreq` for SIOCGARP.
    let rc = unsafe { libc::ioctl(socket.as_raw_fd(), libc::SIOCGARP, &mut request) };
    if rc == 0 {
        return Ok(Some(request.arp_flags));
    }
    match std::io::Error::last_os_error().raw_os_error().unwrap_or(0) {
        // No entry yet (or a NOARP interface, which never gets one).
        libc::ENXIO => Ok(None),
        errno => Err(errno),
    }
}

/// The next hop towards `peer` on `netdev`: the gateway of the longest matching up route of
/// the main table (`/proc/net/route` text), or the peer itself (on-link, or no route there).
pub(crate) fn next_hop(routes: &str, netdev: &str, peer: Ipv4Addr) -> Ipv4Addr {
    let peer_bits = u32::from(peer);
    let mut best: Option<(u32, u32, Ipv4Addr)> = None; // (prefix length, metric, hop)
    for line in routes.lines().skip(1) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 8 || fields[0] != netdev {
            continue;
        }
        let hex = |i: usize| u32::from_str_radix(fields[i], 16).ok();
        let (Some(destination), Some(gateway), Some(flags), Some(mask)) =
            (hex(1), hex(2), hex(3), hex(7))
        else {
            continue;
        };
        let metric = fields[6].parse::<u32>().unwrap_or(u32::MAX);
        if flags & RTF_REJECT != 0 {
            continue;
        }
        // The kernel prints the addresses in network byte order read as a native integer.
        let as_addr = |v: u32| Ipv4Addr::from(v.to_ne_bytes());
        let (destination, mask) = (u32::from(as_addr(destination)), u32::from(as_addr(mask)));
        if flags & RTF_UP == 0 || peer_bits & mask != destination {
            continue;
        }
        let length = mask.count_ones();
        let hop = if flags & RTF_GATEWAY != 0 {
            as_addr(gateway)
        } else {
            peer
        };
        let better = match best {
            None => true,
            Some((l, m, _)) => length > l || (length == l && metric < m),
        };
        if better {
            best = Some((length, metric, hop));
        }
    }
    best.map_or(peer, |(_, _, hop)| hop)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A host with an on-link /24 on eth1, a default route via 10.0.0.1 on eth0, and a routed
    /// /16 via 10.1.0.254 on eth1 (bytes as a little-endian kernel prints them).
    const ROUTES: &str =
        "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
eth0\t00000000\t0100000A\t0003\t0\t0\t0\t00000000\t0\t0\t0
eth1\t0000010A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0
eth1\t0000020A\tFE00010A\t0003\t0\t0\t0\t0000FFFF\t0\t0\t0
eth1\t0000030A\t00000000\t0000\t0\t0\t0\t00FFFFFF\t0\t0\t0
";

    #[test]
    fn on_link_peers_are_their_own_next_hop() {
        let peer = Ipv4Addr::new(10, 1, 0, 7);
        assert_eq!(next_hop(ROUTES, "eth1", peer), peer);
    }

    #[test]
    fn routed_peers_resolve_their_gateway() {
        let peer = Ipv4Addr::new(10, 2, 5, 9);
        assert_eq!(next_hop(ROUTES, "eth1", peer), Ipv4Addr::new(10, 1, 0, 254));
        assert_eq!(
            next_hop(ROUTES, "eth0", peer),
            Ipv4Addr::new(10, 0, 0, 1),
            "the default route"
        );
    }

    #[test]
    fn routes_that_are_down_or_elsewhere_do_not_count() {
        let peer = Ipv4Addr::new(10, 3, 0, 2);
        assert_eq!(
            next_hop(ROUTES, "eth1", peer),
            peer,
            "route 10.3/24 is down"
        );
        assert_eq!(next_hop(ROUTES, "eth9", peer), peer, "no route on eth9");
        assert_eq!(next_hop("garbage\nx y z", "eth1", peer), peer);
    }

    #[test]
    fn only_ipv4_mapped_gids_have_an_ipv4_address() {
        let mut gid = [0u8; 16];
        gid[10] = 0xff;
        gid[11] = 0xff;
        gid[12..].copy_from_slice(&[192, 168, 1, 2]);
        assert_eq!(ipv4_of(&gid), Some(Ipv4Addr::new(192, 168, 1, 2)));
        gid[0] = 0xfe;
        assert_eq!(ipv4_of(&gid), None);
    }

    #[test]
    fn infiniband_and_ipv6_peers_are_ready_at_once() {
        let ipv6 = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
        let mut ib = start("mlx5_0:1 (SOUT)", LinkLayer::InfiniBand, &ipv6, None, &ipv6).unwrap();
        assert!(ib.poll().unwrap());
        let mut v6 = start(
            "mlx5_0:1 (SOUT)",
            LinkLayer::Ethernet,
            &ipv6,
            Some("eth0"),
            &ipv6,
        )
        .unwrap();
        assert!(v6.poll().unwrap());
        assert!(v6.describe().contains("not checked"), "{}", v6.describe());
    }

    #[test]
    fn a_missing_entry_is_pending_and_nudged_once_a_second() {
        // 127.0.0.1 on `lo`: a NOARP interface never has an ARP entry, so the poll stays
        // pending and only the first poll within a second sends a nudge.
        let mut gid = [0u8; 16];
        gid[10] = 0xff;
        gid[11] = 0xff;
        gid[12..].copy_from_slice(&[127, 0, 0, 1]);
        let mut resolution =
            start("loop (test)", LinkLayer::Ethernet, &gid, Some("lo"), &gid).unwrap();
        for _ in 0..3 {
            assert!(!resolution.poll().unwrap());
        }
        let text = resolution.describe();
        assert!(text.contains("after 1 nudge(s)"), "{text}");
        assert!(text.contains("127.0.0.1 -> 127.0.0.1 on lo"), "{text}");
        assert!(text.contains("ip neigh show 127.0.0.1 dev lo"), "{text}");
    }

    #[test]
    fn what_cannot_be_checked_is_ready_at_once() {
        let gid = mapped([127, 0, 0, 1]);
        let mut resolution = start(
            "loop (test)",
            LinkLayer::Ethernet,
            &gid,
            Some("nosuchif0"),
            &gid,
        )
        .unwrap();
        assert!(resolution.poll().unwrap());
        let text = resolution.describe();
        assert!(
            text.contains("nosuchif0") && text.contains("not checked"),
            "{text}"
        );
        let mut unknown = start("loop (test)", LinkLayer::Ethernet, &gid, None, &gid).unwrap();
        assert!(unknown.poll().unwrap());
    }

    #[test]
    fn a_local_peer_address_is_waited_for_one_second_at_most() {
        let gid = mapped([127, 0, 0, 1]);
        let mut resolution =
            start("loop (test)", LinkLayer::Ethernet, &gid, Some("lo"), &gid).unwrap();
        let started = Instant::now();
        while !resolution.poll().unwrap() {
            assert!(started.elapsed() < Duration::from_secs(5), "never ready");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(started.elapsed() >= LOCAL_PEER_WAIT - Duration::from_millis(50));
    }

    #[test]
    fn reject_routes_do_not_count() {
        let routes =
            "Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\tMTU\tWindow\tIRTT
eth1\t0000020A\tFE00010A\t0203\t0\t0\t0\t0000FFFF\t0\t0\t0
";
        let peer = Ipv4Addr::new(10, 2, 0, 9);
        assert_eq!(next_hop(routes, "eth1", peer), peer);
    }

    fn mapped(address: [u8; 4]) -> [u8; 16] {
        let mut gid = [0u8; 16];
        gid[10] = 0xff;
        gid[11] = 0xff;
        gid[12..].copy_from_slice(&address);
        gid
    }
}
