//! The host's IPv4 interfaces (getifaddrs), shared by the control connection's address choice
//! (`net::oob`) and the TCP fabric's rails (`fabric::tcp`), which both name interfaces the way
//! operators do (`eth0`) and need the address and subnet behind the name.

use std::io;
use std::net::Ipv4Addr;

/// One IPv4 address of an interface that is up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Interface {
    /// Interface name (`eth0`, `lo`).
    pub name: String,
    /// The address.
    pub address: Ipv4Addr,
    /// Its netmask.
    pub netmask: Ipv4Addr,
    /// Whether the interface is a loopback interface.
    pub is_loopback: bool,
}

impl Interface {
    /// Whether `address` lies in this interface's subnet.
    pub(crate) fn contains(&self, address: Ipv4Addr) -> bool {
        let mask = u32::from(self.netmask);
        u32::from(self.address) & mask == u32::from(address) & mask
    }
}

/// Every IPv4 address of every interface that is up, in the kernel's order.
pub(crate) fn ipv4_interfaces() -> io::Result<Vec<Interface>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut found = Vec::new();
    let mut cursor = head;
    while !cursor.is_null() {
        // SAFETY: `cursor` is a node of the list getifaddrs returned, not yet freed.
        let entry = unsafe { &*cursor };
        cursor = entry.ifa_next;
        let up = entry.ifa_flags & libc::IFF_UP as u32 != 0;
        if !up || entry.ifa_addr.is_null() {
            continue;
        }
        // SAFETY: ifa_addr is non-null and points to a sockaddr whose family we check first.
        let family = i32::from(unsafe { (*entry.ifa_addr).sa_family });
        if family != libc::AF_INET {
            continue;
        }
        // SAFETY: family is AF_INET, so the address (and a non-null netmask) is a sockaddr_in;
        // ifa_name is a C string.
        let (address, netmask, name) = unsafe {
            let ipv4 = |sa: *const libc::sockaddr| {
                let sin = &*(sa as *const libc::sockaddr_in);
                Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr))
            };
            let netmask = if entry.ifa_netmask.is_null() {
                Ipv4Addr::BROADCAST
            } else {
                ipv4(entry.ifa_netmask)
            };
            (
                ipv4(entry.ifa_addr),
                netmask,
                std::ffi::CStr::from_ptr(entry.ifa_name)
                    .to_string_lossy()
                    .into_owned(),
            )
        };
        let is_loopback = entry.ifa_flags & libc::IFF_LOOPBACK as u32 != 0;
        found.push(Interface {
            name,
            address,
            netmask,
            is_loopback,
        });
    }
    // SAFETY: `head` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    Ok(found)
}

/// Asks the kernel to bind only the address now and pick the port at `connect`
/// (`IP_BIND_ADDRESS_NO_PORT`, Linux 4.2). Binding port 0 picks a port no other socket of the host
/// uses, searching the bound ports each time: with thousands of control sockets that search was
/// most of `connect`'s time (issue 22; docs/PERFORMANCE.md "Thousands of connections: what each costs"), while a
/// port picked at `connect` only has to be free for that destination. Where the option is
/// unknown the bind works as before, only slower. Used by the control connection and the tcp
/// fabric's rail sockets.
pub(crate) fn bind_address_only(socket: std::os::fd::RawFd) {
    let on: libc::c_int = 1;
    // SAFETY: a valid socket descriptor and a c_int option value of the stated size.
    let _ = unsafe {
        libc::setsockopt(
            socket,
            libc::IPPROTO_IP,
            libc::IP_BIND_ADDRESS_NO_PORT,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loopback_interface_is_listed_with_its_subnet() {
        let interfaces = ipv4_interfaces().unwrap();
        let lo = interfaces
            .iter()
            .find(|i| i.address == Ipv4Addr::LOCALHOST)
            .expect("127.0.0.1 is up");
        assert!(lo.is_loopback);
        assert!(lo.contains(Ipv4Addr::new(127, 0, 0, 2)));
        assert!(!lo.contains(Ipv4Addr::new(10, 0, 0, 1)));
    }
}
