//! A TCP rail's port state: the interface's link, as a NIC's port (docs/PROTOCOL.md §10).
//!
//! A verbs NIC raises `IBV_EVENT_PORT_ERR` when its link goes down, and a failover acts on it
//! at once instead of waiting for the QPs' retries to run out. A TCP rail's port is its
//! interface: the rail thread keeps a netlink socket subscribed to link changes in its epoll set
//! (so an idle rail costs nothing) and, at each change, reads the interface's flags again
//! (`SIOCGIFFLAGS`): up and running (carrier) is a port that is active, anything else a port
//! that is down. On a veth pair both ends lose their carrier when either goes down, as both
//! ends of a cable do.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::fabric::AsyncEvent;

/// The interface of one rail and what was last read of it.
pub(super) struct LinkState {
    netlink: OwnedFd,
    query: OwnedFd,
    name: [libc::c_char; libc::IFNAMSIZ],
    running: bool,
}

impl LinkState {
    /// Watches interface `name`; fails when the kernel has no netlink or no such interface.
    pub(super) fn open(name: &str) -> io::Result<LinkState> {
        let bytes = name.as_bytes();
        if bytes.is_empty() || bytes.len() >= libc::IFNAMSIZ || bytes.contains(&0) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("`{name}` is not an interface name"),
            ));
        }
        let mut ifname = [0 as libc::c_char; libc::IFNAMSIZ];
        for (to, from) in ifname.iter_mut().zip(bytes) {
            *to = *from as libc::c_char;
        }
        let flags = libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC;
        let netlink = socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | flags,
            libc::NETLINK_ROUTE,
        )?;
        // SAFETY: all-zero is a valid `sockaddr_nl`; the fields the kernel reads are set below.
        let mut address: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        address.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        address.nl_groups = libc::RTMGRP_LINK as u32;
        // SAFETY: `address` is a live `sockaddr_nl` of the length given.
        let rc = unsafe {
            libc::bind(
                netlink.as_raw_fd(),
                (&address as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        let query = socket(libc::AF_INET, libc::SOCK_DGRAM | flags, 0)?;
        let mut state = LinkState {
            netlink,
            query,
            name: ifname,
            running: true,
        };
        state.running = state.read()?;
        Ok(state)
    }

    /// The netlink socket, for the epoll set.
    pub(super) fn fd(&self) -> i32 {
        self.netlink.as_raw_fd()
    }

    /// The netlink socket is readable: drains it, reads the interface again and returns the
    /// event its change is (`PortDown`, `PortActive`), if it changed.
    pub(super) fn changed(&mut self) -> Option<AsyncEvent> {
        let mut buffer = [0u8; 4096];
        loop {
            // SAFETY: `buffer` is writable for its length.
            let n = unsafe {
                libc::recv(
                    self.netlink.as_raw_fd(),
                    buffer.as_mut_ptr().cast(),
                    buffer.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n <= 0 {
                break;
            }
        }
        // An interface that cannot be read any more (removed) is a port that is down.
        let running = self.read().unwrap_or(false);
        if running == self.running {
            return None;
        }
        self.running = running;
        Some(if running {
            AsyncEvent::PortActive
        } else {
            AsyncEvent::PortDown
        })
    }

    /// Whether the interface is up with a carrier now.
    fn read(&self) -> io::Result<bool> {
        // SAFETY: all-zero is a valid `ifreq`.
        let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
        request.ifr_name = self.name;
        // SAFETY: the fd is a live socket; `request` is a valid, writable `ifreq` for
        // SIOCGIFFLAGS, which reads its name and writes its flags.
        let rc = unsafe { libc::ioctl(self.query.as_raw_fd(), libc::SIOCGIFFLAGS, &mut request) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: SIOCGIFFLAGS filled the flags member of the union.
        let flags = i32::from(unsafe { request.ifr_ifru.ifru_flags });
        Ok(flags & libc::IFF_UP != 0 && flags & libc::IFF_RUNNING != 0)
    }
}

/// `socket(2)`, owned.
fn socket(domain: i32, kind: i32, protocol: i32) -> io::Result<OwnedFd> {
    // SAFETY: socket has no memory preconditions.
    let fd = unsafe { libc::socket(domain, kind, protocol) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loopback_interface_is_running_and_a_bad_name_is_refused() {
        let state = LinkState::open("lo").unwrap();
        assert!(state.running);
        assert!(state.fd() >= 0);
        assert!(LinkState::open("").is_err());
        assert!(LinkState::open("a-name-longer-than-ifnamsiz").is_err());
        assert!(LinkState::open("no-such-if0").is_err());
    }
}
