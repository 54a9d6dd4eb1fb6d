//! The socket calls of the TCP fabric, each non-blocking: "would block" is a value here, never
//! an error, and nothing waits.

use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd};

use socket2::{Domain, Socket, Type};

/// A listening socket on `address` (port chosen by the kernel) and its port.
pub(super) fn listener(address: Ipv4Addr) -> io::Result<(OwnedFd, u16)> {
    let socket = Socket::new(Domain::IPV4, Type::STREAM.nonblocking().cloexec(), None)?;
    socket.set_reuse_address(true)?;
    socket.bind(&SocketAddr::V4(SocketAddrV4::new(address, 0)).into())?;
    socket.listen(1024)?;
    let port = socket
        .local_addr()?
        .as_socket_ipv4()
        .map(|a| a.port())
        .ok_or_else(|| io::Error::other("the listener has no IPv4 address"))?;
    // SAFETY: into_raw_fd hands over sole ownership of a valid descriptor.
    Ok((unsafe { OwnedFd::from_raw_fd(socket.into_raw_fd()) }, port))
}

/// Accepts one pending connection, if any.
/// What one `accept` came to.
pub(super) enum Accepted {
    /// A connection, and the address the kernel says it comes from.
    Connection(OwnedFd, Ipv4Addr),
    /// Nothing waiting.
    Empty,
    /// A connection that went before it was taken, or a signal: try again.
    Again,
}

pub(super) fn accept(listener: i32) -> io::Result<Accepted> {
    // SAFETY: an all-zero sockaddr_in is a valid value to be overwritten.
    let mut address: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    let mut length = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: `address` and `length` are live and sized for an IPv4 address (the listener's
    // family).
    let fd = unsafe {
        libc::accept4(
            listener,
            (&mut address as *mut libc::sockaddr_in).cast(),
            &mut length,
            libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
        )
    };
    if fd < 0 {
        let error = io::Error::last_os_error();
        return match error.raw_os_error() {
            Some(libc::EAGAIN) => Ok(Accepted::Empty),
            Some(libc::ECONNABORTED) | Some(libc::EINTR) => Ok(Accepted::Again),
            _ => Err(error),
        };
    }
    // SAFETY: a fresh descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    set_nodelay(fd.as_raw_fd());
    let sender = Ipv4Addr::from(u32::from_be(address.sin_addr.s_addr));
    Ok(Accepted::Connection(fd, sender))
}

/// Starts connecting from `local` (bound first, so the bytes leave through that rail) to
/// `remote`; the connect finishes in the background ([`connect_finished`]).
pub(super) fn start_connect(
    local: Ipv4Addr,
    remote: SocketAddrV4,
    user_timeout_ms: u32,
) -> io::Result<OwnedFd> {
    let socket = Socket::new(Domain::IPV4, Type::STREAM.nonblocking().cloexec(), None)?;
    crate::netif::bind_address_only(socket.as_raw_fd());
    socket.bind(&SocketAddr::V4(SocketAddrV4::new(local, 0)).into())?;
    // SAFETY: into_raw_fd hands over sole ownership of a valid descriptor.
    let fd = unsafe { OwnedFd::from_raw_fd(socket.into_raw_fd()) };
    set_nodelay(fd.as_raw_fd());
    set_user_timeout(fd.as_raw_fd(), user_timeout_ms);
    let socket = socket2::SockRef::from(&fd);
    match socket.connect(&SocketAddr::V4(remote).into()) {
        Ok(()) => Ok(fd),
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => Ok(fd),
        Err(e) => Err(e),
    }
}

/// Whether a background connect finished: `Ok(false)` while it runs, the error if it failed.
pub(super) fn connect_finished(fd: i32) -> io::Result<bool> {
    let borrowed = BorrowedRaw(fd);
    let socket = socket2::SockRef::from(&borrowed);
    if let Some(error) = socket.take_error()? {
        return Err(error);
    }
    match socket.peer_addr() {
        Ok(_) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => Ok(false),
        Err(e) => Err(e),
    }
}

/// TCP_USER_TIMEOUT: unacknowledged bytes older than this fail the connection (ETIMEDOUT).
pub(super) fn set_user_timeout(fd: i32, milliseconds: u32) {
    set_tcp_option(fd, libc::TCP_USER_TIMEOUT, milliseconds as libc::c_int);
}

fn set_nodelay(fd: i32) {
    set_tcp_option(fd, libc::TCP_NODELAY, 1);
}

/// Sets an int option at IPPROTO_TCP. Best effort: a socket that refuses one still works
/// (without Nagle's removal or the user timeout), which no caller could do better about.
fn set_tcp_option(fd: i32, option: libc::c_int, value: libc::c_int) {
    // SAFETY: passes a live int of the size given.
    unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            option,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
}

/// Sends what it can of `header` then `[payload_addr, payload_addr + payload_len)`; `Ok(0)`
/// when the socket is full. EFAULT (an unreadable payload) comes back as the error it is.
pub(super) fn send(
    fd: i32,
    header: &[u8],
    payload_addr: u64,
    payload_len: usize,
) -> io::Result<usize> {
    let iov = [
        libc::iovec {
            iov_base: header.as_ptr() as *mut libc::c_void,
            iov_len: header.len(),
        },
        libc::iovec {
            iov_base: payload_addr as *mut libc::c_void,
            iov_len: payload_len,
        },
    ];
    let count = if payload_len == 0 { 1 } else { 2 };
    let first = if header.is_empty() { 1 } else { 0 };
    // SAFETY: an all-zero msghdr is valid; the iovecs point at the header slice and at a range
    // the caller vouches for (the kernel reports EFAULT, not a fault, on a bad one).
    let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
    message.msg_iov = iov[first..].as_ptr() as *mut libc::iovec;
    message.msg_iovlen = count - first;
    if message.msg_iovlen == 0 {
        return Ok(0);
    }
    // SAFETY: `message` points at live iovecs for the duration of the call.
    let sent = unsafe { libc::sendmsg(fd, &message, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) };
    if sent < 0 {
        let error = io::Error::last_os_error();
        return match error.raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(0),
            _ => Err(error),
        };
    }
    Ok(sent as usize)
}

/// Receives up to `len` bytes into `[addr, addr + len)`: `None` when nothing is there now,
/// `Some(0)` when the peer closed.
pub(super) fn receive(fd: i32, addr: u64, len: usize) -> io::Result<Option<usize>> {
    // SAFETY: the caller vouches for the range; the kernel reports EFAULT on a bad one.
    let got = unsafe { libc::recv(fd, addr as *mut libc::c_void, len, libc::MSG_DONTWAIT) };
    if got < 0 {
        let error = io::Error::last_os_error();
        return match error.raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(None),
            _ => Err(error),
        };
    }
    Ok(Some(got as usize))
}

/// A raw descriptor lent to socket2 for one call.
struct BorrowedRaw(i32);

impl AsRawFd for BorrowedRaw {
    fn as_raw_fd(&self) -> i32 {
        self.0
    }
}

impl std::os::fd::AsFd for BorrowedRaw {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        // SAFETY: the descriptor outlives this borrow (the worker owns it for the whole call).
        unsafe { std::os::fd::BorrowedFd::borrow_raw(self.0) }
    }
}
