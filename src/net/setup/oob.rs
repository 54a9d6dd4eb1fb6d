//! The out-of-band control connection: choosing its address, the 128-byte listen handle, and
//! non-blocking message exchange.
//!
//! Both sides classify the path from the same address pair (trap seen on the Soft-RoCE rig: an
//! unbound client socket picks another source address and the two sides disagree on the island),
//! so the connector binds its socket to its OOB address before connecting.

use std::io::{ErrorKind as IoKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream};

use socket2::{Domain, Socket, Type};

use crate::error::{Error, Result};
use crate::net::setup::descriptors::socket_error;
use crate::params::Settings;

use crate::net::HANDLE_SIZE;

/// Marks a handle written by `listen` ("MPIBLSN2": the socket's address and a listen id).
const HANDLE_MAGIC: u64 = 0x4D50_4942_4C53_4E32;
/// The magic of the handles of MPIB before listen comms shared a socket ("MPIBLSN1").
const HANDLE_MAGIC_WITHOUT_ID: u64 = 0x4D50_4942_4C53_4E31;

/// The listen handle NCCL ships to the peer. Bytes 16..24 hold the connector's in-progress state
/// (NCCL keeps the handle buffer alive across `connect` retries, as net_ib relies on too).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ListenHandle {
    /// Where the device's shared listening socket accepts (src/net/setup/listener.rs).
    pub address: SocketAddrV4,
    /// Which listen comm on that socket: the connector claims it first.
    pub listen_id: u64,
    /// The listening process's number (src/net/observe/link.rs): a connector that holds a link
    /// to that process carries the handshake on it. 0 in a handle that does not say (the
    /// handshake then opens a connection of its own).
    pub process: u64,
}

impl ListenHandle {
    /// Writes the handle (and a cleared state word) into NCCL's buffer.
    pub(crate) fn write(&self, out: &mut [u8; HANDLE_SIZE]) {
        out.fill(0);
        out[0..8].copy_from_slice(&HANDLE_MAGIC.to_le_bytes());
        out[8..12].copy_from_slice(&self.address.ip().octets());
        out[12..14].copy_from_slice(&self.address.port().to_be_bytes());
        out[24..32].copy_from_slice(&self.listen_id.to_le_bytes());
        out[32..40].copy_from_slice(&self.process.to_le_bytes());
    }

    /// Parses a handle; anything not written by `write` is refused.
    pub(crate) fn read(bytes: &[u8; HANDLE_SIZE]) -> Result<ListenHandle> {
        let word = |range: std::ops::Range<usize>| {
            u64::from_le_bytes(bytes[range].try_into().unwrap_or_default())
        };
        let magic = word(0..8);
        if magic == HANDLE_MAGIC_WITHOUT_ID {
            return Err(Error::invalid_usage(
                "connect: the handle comes from an older MPIB, whose listen comms had a socket \
                 each; both sides must load the same plugin version",
            ));
        }
        if magic != HANDLE_MAGIC {
            return Err(Error::invalid_argument(format!(
                "connect: the handle is not an MPIB listen handle (magic {magic:#x}); was it \
                 produced by another plugin's listen?"
            )));
        }
        let ip = Ipv4Addr::new(bytes[8], bytes[9], bytes[10], bytes[11]);
        let port = u16::from_be_bytes([bytes[12], bytes[13]]);
        let listen_id = word(24..32);
        if listen_id == 0 {
            // `listen` never draws 0 (src/net/setup/listener.rs): a damaged handle.
            return Err(Error::invalid_argument(
                "connect: the listen handle names no listen comm (listen id 0); was it damaged \
                 on its way from the peer?",
            ));
        }
        Ok(ListenHandle {
            address: SocketAddrV4::new(ip, port),
            listen_id,
            process: word(32..40),
        })
    }

    /// The connector's saved state word.
    pub(crate) fn state_word(bytes: &[u8; HANDLE_SIZE]) -> u64 {
        u64::from_le_bytes(bytes[16..24].try_into().unwrap_or_default())
    }

    /// Saves the connector's state word.
    pub(crate) fn set_state_word(bytes: &mut [u8; HANDLE_SIZE], word: u64) {
        bytes[16..24].copy_from_slice(&word.to_le_bytes());
    }
}

/// The IPv4 address the control connection uses on this node.
///
/// Order: `MPIB_OOB_ADDR`; the IPv4 address of `MPIB_OOB_IF`; the fabric's own default
/// (`Fabric::control_address`: loopback 127.0.0.1, tcp the SOUT rail's address); otherwise the
/// first IPv4 address of an interface that is up and not loopback.
pub(crate) fn local_address(
    settings: &Settings,
    fabric_default: Option<Ipv4Addr>,
) -> Result<Ipv4Addr> {
    if let Some(address) = settings.oob_address {
        return Ok(address);
    }
    if settings.oob_interface.is_none() {
        if let Some(address) = fabric_default {
            // No interface list needed: reading it opens a netlink socket, a descriptor and a
            // dump of every address, on every `listen` and `connect`.
            return Ok(address);
        }
    }
    let interfaces =
        crate::netif::ipv4_interfaces().map_err(|e| Error::system(format!("getifaddrs: {e}")))?;
    if let Some(name) = &settings.oob_interface {
        return interfaces
            .iter()
            .find(|i| &i.name == name)
            .map(|i| i.address)
            .ok_or_else(|| {
                let names: Vec<&str> = interfaces.iter().map(|i| i.name.as_str()).collect();
                Error::invalid_usage(format!(
                    "MPIB_OOB_IF={name:?} has no IPv4 address; interfaces with one: {names:?}"
                ))
            });
    }
    interfaces.iter().find(|i| !i.is_loopback && !i.address.is_unspecified()).map(|i| i.address).ok_or_else(
        || Error::invalid_usage("no IPv4 interface is up for the control connection: set MPIB_OOB_IF or MPIB_OOB_ADDR"),
    )
}

/// Creates a non-blocking listener on `address` (port chosen by the kernel).
pub(crate) fn listen_on(address: Ipv4Addr) -> Result<(Socket, SocketAddrV4)> {
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None)
        .map_err(|e| socket_error("listen: socket", &e))?;
    let bind = SocketAddr::V4(SocketAddrV4::new(address, 0));
    socket
        .bind(&bind.into())
        // Deep enough for a batch's handshakes towards one device's shared socket while its
        // claims are read (src/net/setup/listener.rs); the kernel caps it at somaxconn.
        .and_then(|()| socket.listen(4096))
        .and_then(|()| socket.set_nonblocking(true))
        .map_err(|e| Error::system(format!("listen on {address}: {e}")))?;
    let local = socket
        .local_addr()
        .ok()
        .and_then(|a| a.as_socket_ipv4())
        .ok_or_else(|| Error::system("listener has no IPv4 address"))?;
    Ok((socket, local))
}

/// Starts a non-blocking connect from `local` (bound first) to `remote`.
pub(crate) fn start_connect(local: Ipv4Addr, remote: SocketAddrV4) -> Result<TcpStream> {
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None)
        .map_err(|e| socket_error("connect: socket", &e))?;
    crate::netif::bind_address_only(std::os::fd::AsRawFd::as_raw_fd(&socket));
    socket
        .set_nonblocking(true)
        .and_then(|()| socket.bind(&SocketAddr::V4(SocketAddrV4::new(local, 0)).into()))
        .map_err(|e| Error::system(format!("bind control socket to {local}: {e}")))?;
    match socket.connect(&SocketAddr::V4(remote).into()) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
        Err(e) => return Err(Error::system(format!("connect to {remote}: {e}"))),
    }
    socket.set_nodelay(true).ok();
    Ok(socket.into())
}

/// Whether a non-blocking connect finished: `Ok(true)` connected, `Ok(false)` still pending.
pub(crate) fn connect_finished(stream: &TcpStream, remote: SocketAddrV4) -> Result<bool> {
    let mut poll = libc::pollfd {
        fd: std::os::fd::AsRawFd::as_raw_fd(stream),
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: one valid pollfd, zero timeout (never blocks).
    let ready = unsafe { libc::poll(&mut poll, 1, 0) };
    if ready < 0 {
        return Err(Error::system(format!(
            "poll: {}",
            std::io::Error::last_os_error()
        )));
    }
    if ready == 0 {
        return Ok(false);
    }
    match stream.take_error() {
        Ok(None) => Ok(true),
        Ok(Some(e)) | Err(e) => Err(Error::system(format!("connect to {remote}: {e}"))),
    }
}

/// A fixed-size message moving through a non-blocking stream, resumable across calls.
pub(crate) struct Transfer<const N: usize> {
    buffer: [u8; N],
    done: usize,
}

impl<const N: usize> Transfer<N> {
    /// A message to send.
    pub(crate) fn outgoing(buffer: [u8; N]) -> Self {
        Transfer { buffer, done: 0 }
    }

    /// An empty buffer to receive into.
    pub(crate) fn incoming() -> Self {
        Transfer {
            buffer: [0; N],
            done: 0,
        }
    }

    /// The bytes (complete once `send`/`receive` returned true).
    pub(crate) fn bytes(&self) -> &[u8; N] {
        &self.buffer
    }

    /// Whether all `N` bytes were sent or received.
    pub(crate) fn is_done(&self) -> bool {
        self.done == N
    }

    /// The message went out whole by another way (a handshake frame on a link).
    pub(crate) fn mark_sent(&mut self) {
        self.done = N;
    }

    /// The message came whole by another way; `false` (and nothing kept) if it is not `N`
    /// bytes long.
    pub(crate) fn fill(&mut self, message: &[u8]) -> bool {
        if message.len() != N {
            return false;
        }
        self.buffer.copy_from_slice(message);
        self.done = N;
        true
    }

    /// Writes what it can; `Ok(true)` once all is sent.
    pub(crate) fn send(&mut self, stream: &mut TcpStream, peer: &str) -> Result<bool> {
        while self.done < N {
            match stream.write(&self.buffer[self.done..]) {
                Ok(0) => {
                    return Err(Error::remote(format!(
                        "peer {peer} closed the control connection"
                    )))
                }
                Ok(n) => self.done += n,
                Err(e) if e.kind() == IoKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == IoKind::Interrupted => {}
                Err(e) => return Err(Error::remote(format!("send to peer {peer}: {e}"))),
            }
        }
        Ok(true)
    }

    /// Reads what is there; `Ok(true)` once all `N` bytes arrived.
    pub(crate) fn receive(&mut self, stream: &mut TcpStream, peer: &str) -> Result<bool> {
        while self.done < N {
            match stream.read(&mut self.buffer[self.done..]) {
                Ok(0) => {
                    return Err(Error::remote(format!(
                        "peer {peer} closed the control connection during the handshake"
                    )))
                }
                Ok(n) => self.done += n,
                Err(e) if e.kind() == IoKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == IoKind::Interrupted => {}
                Err(e) => return Err(Error::remote(format!("receive from peer {peer}: {e}"))),
            }
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handle_round_trips_and_rejects_foreign_bytes() {
        let handle = ListenHandle {
            address: SocketAddrV4::new(Ipv4Addr::new(10, 1, 2, 3), 4567),
            listen_id: 0x1234_5678_9abc_def0,
            process: 0x0fed_cba9_8765_4321,
        };
        let mut bytes = [0xAA; HANDLE_SIZE];
        handle.write(&mut bytes);
        assert_eq!(ListenHandle::read(&bytes).unwrap(), handle);
        assert_eq!(ListenHandle::state_word(&bytes), 0);
        ListenHandle::set_state_word(&mut bytes, 77);
        assert_eq!(ListenHandle::state_word(&bytes), 77);
        let error = ListenHandle::read(&[0; HANDLE_SIZE]).unwrap_err();
        assert!(
            error.message.contains("not an MPIB listen handle"),
            "{error}"
        );
        let mut no_listen = bytes;
        no_listen[24..32].fill(0);
        let error = ListenHandle::read(&no_listen).unwrap_err();
        assert!(error.message.contains("listen id 0"), "{error}");
        let mut older = bytes;
        older[0..8].copy_from_slice(&HANDLE_MAGIC_WITHOUT_ID.to_le_bytes());
        let error = ListenHandle::read(&older).unwrap_err();
        assert!(error.message.contains("older MPIB"), "{error}");
    }

    #[test]
    fn explicit_address_wins() {
        let mut settings = Settings::from_lookup(|_| None).unwrap();
        settings.oob_address = Some(Ipv4Addr::new(127, 0, 1, 1));
        assert_eq!(
            local_address(&settings, None).unwrap(),
            Ipv4Addr::new(127, 0, 1, 1)
        );
        settings.oob_address = None;
        settings.oob_interface = Some("no-such-interface0".into());
        let error = local_address(&settings, None).unwrap_err();
        assert!(
            error.message.contains("MPIB_OOB_IF=\"no-such-interface0\""),
            "{error}"
        );
    }
}
