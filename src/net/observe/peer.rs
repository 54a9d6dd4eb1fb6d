//! Noticing that the peer process is gone while requests wait on it.
//!
//! An RC queue pair only learns that its peer died when it has something on the wire: a
//! receiver waiting for data, or a sender waiting for a CTS, would wait forever on a killed
//! peer. Each comm therefore keeps its handshake's TCP connection (as net_ib keeps its socket)
//! and, while a request is pending and nothing has completed for [`CHECK_INTERVAL_NS`], peeks at
//! it at most that often (a flowing connection makes no syscall for it). The kernel
//! closes a dead process's sockets, so the peek sees end-of-file or a reset. A peer that closes
//! its comm normally does the same, possibly a moment before our last completion is polled
//! (its TCP FIN can overtake the RDMA ACK), so pending requests fail only once the connection
//! has been closed for [`GRACE_NS`] and they are still pending.

use std::io::ErrorKind;
use std::net::TcpStream;

use crate::error::{Error, Result};

/// How often a comm with pending requests peeks at its control connection.
pub(crate) const CHECK_INTERVAL_NS: u64 = 100_000_000;
/// How long pending requests may outlive the peer's end of the control connection.
pub(crate) const GRACE_NS: u64 = 2_000_000_000;

/// A comm's view of its peer's end of the control connection.
pub(crate) struct PeerWatch {
    stream: Option<TcpStream>,
    next_check_ns: u64,
    closed: Option<(u64, String)>,
}

impl PeerWatch {
    /// Watches `stream` (non-blocking, from the handshake).
    pub(crate) fn new(stream: TcpStream) -> PeerWatch {
        PeerWatch {
            stream: Some(stream),
            next_check_ns: 0,
            closed: None,
        }
    }

    /// Watches nothing (comms built without a control connection, in unit tests).
    pub(crate) fn none() -> PeerWatch {
        PeerWatch {
            stream: None,
            next_check_ns: u64::MAX,
            closed: None,
        }
    }

    /// A request completed at `now_ns`: the peer is there, no peek before the next interval.
    #[inline]
    pub(crate) fn progressed(&mut self, now_ns: u64) {
        if self.stream.is_some() {
            self.next_check_ns = now_ns.saturating_add(CHECK_INTERVAL_NS);
        }
    }

    /// Called while a request is pending: peeks when due; once the peer's end has been closed
    /// for [`GRACE_NS`], the error (its text starts with `peer`, called only then).
    #[inline]
    pub(crate) fn check(&mut self, now_ns: u64, peer: impl FnOnce() -> String) -> Result<()> {
        if now_ns < self.next_check_ns {
            return Ok(());
        }
        self.check_now(now_ns, peer)
    }

    fn check_now(&mut self, now_ns: u64, peer: impl FnOnce() -> String) -> Result<()> {
        self.next_check_ns = now_ns.saturating_add(CHECK_INTERVAL_NS);
        if self.closed.is_none() {
            self.closed = self.peek().map(|why| (now_ns, why));
        }
        match &self.closed {
            Some((since, why)) if now_ns.saturating_sub(*since) >= GRACE_NS => {
                Err(Error::remote(format!(
                    "{}: the peer's control connection {why} {:.1} s ago and this request is \
                     still pending: the peer process exited or aborted its comm, or its host went away",
                    peer(),
                    now_ns.saturating_sub(*since) as f64 / 1e9
                )))
            }
            _ => Ok(()),
        }
    }

    /// How the peer's end was closed, if it was.
    fn peek(&self) -> Option<String> {
        let stream = self.stream.as_ref()?;
        let mut byte = [0u8; 1];
        match stream.peek(&mut byte) {
            Ok(0) => Some("was closed".to_string()),
            // Nothing is sent after the handshake; a byte means the peer is alive.
            Ok(_) => None,
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {
                None
            }
            Err(e) => Some(format!("failed ({e})")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn peer() -> String {
        "peer 10.0.0.2:5000".to_string()
    }

    fn connected() -> (PeerWatch, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let ours = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        ours.set_nonblocking(true).unwrap();
        let (theirs, _) = listener.accept().unwrap();
        (PeerWatch::new(ours), theirs)
    }

    #[test]
    fn a_live_peer_is_never_an_error() {
        let (mut watch, _theirs) = connected();
        for step in 0..50u64 {
            watch.check(step * CHECK_INTERVAL_NS, peer).unwrap();
        }
    }

    #[test]
    fn a_closed_peer_fails_pending_requests_after_the_grace() {
        let (mut watch, theirs) = connected();
        drop(theirs);
        // The FIN needs a moment to arrive even on loopback.
        std::thread::sleep(std::time::Duration::from_millis(50));
        let start = 1_000;
        watch.check(start, peer).unwrap();
        watch
            .check(start + GRACE_NS - CHECK_INTERVAL_NS, peer)
            .unwrap();
        let error = watch.check(start + GRACE_NS, peer).unwrap_err();
        assert_eq!(error.kind, crate::error::ErrorKind::Remote, "{error}");
        assert!(
            error.message.contains("peer 10.0.0.2:5000")
                && error
                    .message
                    .contains("control connection was closed 2.0 s ago"),
            "{error}"
        );
    }

    #[test]
    fn checks_are_spaced_by_the_interval() {
        let (mut watch, theirs) = connected();
        watch.check(0, peer).unwrap();
        drop(theirs);
        std::thread::sleep(std::time::Duration::from_millis(50));
        // Not due yet: the close is not seen, so the grace has not started.
        watch.check(CHECK_INTERVAL_NS - 1, peer).unwrap();
        assert!(watch.closed.is_none());
        watch.check(CHECK_INTERVAL_NS, peer).unwrap();
        assert!(watch.closed.is_some());
    }

    #[test]
    fn a_completion_puts_the_next_peek_an_interval_away() {
        let (mut watch, theirs) = connected();
        drop(theirs);
        std::thread::sleep(std::time::Duration::from_millis(50));
        watch.progressed(5);
        watch.check(5 + CHECK_INTERVAL_NS - 1, peer).unwrap();
        assert!(watch.closed.is_none(), "no peek while requests complete");
        watch.check(5 + CHECK_INTERVAL_NS, peer).unwrap();
        assert!(watch.closed.is_some());
    }

    #[test]
    fn no_connection_watches_nothing() {
        let mut watch = PeerWatch::none();
        watch.check(u64::MAX - 1, peer).unwrap();
    }
}
