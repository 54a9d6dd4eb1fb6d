//! Noticing that the peer is gone, or failed, while requests wait on it.
//!
//! An RC queue pair only learns that its peer died when it has something on the wire: a
//! receiver waiting for data, or a sender waiting for a CTS, would wait forever on a killed
//! peer. Each comm therefore keeps its handshake's TCP connection (as net_ib keeps its socket)
//! and, while a request is pending and nothing has completed for [`CHECK_INTERVAL_NS`], peeks at
//! it at most that often (a flowing connection makes no syscall for it). Three things end a wait:
//!
//! * **The peer said why.** A comm that fails writes a [`NOTICE_MAGIC`] frame with its error
//!   onto the control connection ([`PeerWatch::notify_failure`], best effort, never blocking):
//!   the peer's requests still pending [`GRACE_NS`] later fail with that text, so a cut rail that
//!   only the other side could see (its CTS write, say) is still named on both sides. The grace
//!   lets this side's own QPs report first when they have work on the wire (their error names
//!   our device and counts in our probes).
//! * **The peer's end closed.** The kernel closes a dead process's sockets, so the peek sees
//!   end-of-file or a reset. A peer that closes its comm normally does the same, possibly a
//!   moment before our last completion is polled (its TCP FIN can overtake the RDMA ACK), so
//!   pending requests fail only once the connection has been closed for [`GRACE_NS`].
//! * **The path died.** Keepalive probes every second and a TCP user timeout at the QPs' own
//!   retry budget ([`crate::fabric::QpSettings::retry_budget_ms`]) fail the connection when the
//!   link under it is gone (nothing else would: no FIN crosses a pulled cable); the error names
//!   the rail the connection rides when it rides one.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::error::{Error, Result};

/// How often a comm with pending requests peeks at its control connection.
pub(crate) const CHECK_INTERVAL_NS: u64 = 100_000_000;
/// How long pending requests may outlive the peer's end of the control connection.
pub(crate) const GRACE_NS: u64 = 2_000_000_000;
/// First bytes of a failure notice; then a little-endian `u16` length and that much UTF-8.
pub(crate) const NOTICE_MAGIC: &[u8; 8] = b"MPIBFAIL";
/// Longest notice text (a longer error is cut at a character boundary).
const NOTICE_TEXT_MAX: usize = 512;
const NOTICE_HEADER: usize = NOTICE_MAGIC.len() + 2;

/// A comm's view of its peer's end of the control connection.
pub(crate) struct PeerWatch {
    stream: Option<TcpStream>,
    next_check_ns: u64,
    closed: Option<(u64, String)>,
    /// What the peer reported about its own failure, and when it was read.
    reported: Option<(u64, String)>,
    /// " (it rides the sout rail (mlx5_0))" when the connection rides a rail's address, else "".
    path: String,
    notified: bool,
}

impl PeerWatch {
    /// Watches `stream` (non-blocking, from the handshake): keepalive every second and a user
    /// timeout of `budget_ms` (the QPs' retry budget, at least a second); `path` says which
    /// rail it rides, for messages ("" when none).
    pub(crate) fn new(stream: TcpStream, budget_ms: u32, path: String) -> PeerWatch {
        let socket = socket2::SockRef::from(&stream);
        let keepalive = socket2::TcpKeepalive::new()
            .with_time(Duration::from_secs(1))
            .with_interval(Duration::from_secs(1));
        // Best effort: without them only a dead path goes unnoticed, as before.
        let _ = socket.set_tcp_keepalive(&keepalive);
        let timeout = Duration::from_millis(u64::from(budget_ms.max(1000)));
        let _ = socket.set_tcp_user_timeout(Some(timeout));
        PeerWatch {
            stream: Some(stream),
            next_check_ns: 0,
            path,
            ..PeerWatch::none()
        }
    }

    /// Watches a comm's handshake connection `stream` to `peer` (a second handle on it), with
    /// the user timeout of the comm's QPs (`ctx`'s settings, `traffic_class`) and the rail it
    /// rides (one of the comm's `devices`) named for messages.
    pub(crate) fn of_control(
        stream: &TcpStream,
        peer: impl std::fmt::Display,
        ctx: &crate::net::Context,
        devices: &crate::net::setup::resources::Devices,
        traffic_class: i32,
    ) -> Result<PeerWatch> {
        let control = stream.try_clone().map_err(|e| {
            let what = format!("keeping the control connection to {peer}");
            crate::net::setup::descriptors::socket_error(&what, &e)
        })?;
        let settings = crate::net::setup::resources::qp_settings(&ctx.settings, traffic_class);
        let path = control_path(stream, devices);
        Ok(PeerWatch::new(control, settings.retry_budget_ms(), path))
    }

    /// Watches nothing (comms built without a control connection, in unit tests).
    pub(crate) fn none() -> PeerWatch {
        PeerWatch {
            stream: None,
            next_check_ns: u64::MAX,
            closed: None,
            reported: None,
            path: String::new(),
            notified: false,
        }
    }

    /// A request completed at `now_ns`: the peer is there, no peek before the next interval.
    #[inline]
    pub(crate) fn progressed(&mut self, now_ns: u64) {
        if self.stream.is_some() {
            self.next_check_ns = now_ns.saturating_add(CHECK_INTERVAL_NS);
        }
    }

    /// This comm failed with `error`: tell the peer why, once (a non-blocking write; if the
    /// socket cannot take it now, the peer learns from the close instead).
    #[cold]
    pub(crate) fn notify_failure(&mut self, error: &Error) {
        let Some(stream) = self.stream.as_mut() else {
            return;
        };
        if std::mem::replace(&mut self.notified, true) {
            return;
        }
        let text = error.to_string();
        let mut end = text.len().min(NOTICE_TEXT_MAX);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        let mut frame = Vec::with_capacity(NOTICE_HEADER + end);
        frame.extend_from_slice(NOTICE_MAGIC);
        frame.extend_from_slice(&(end as u16).to_le_bytes());
        frame.extend_from_slice(&text.as_bytes()[..end]);
        let _ = stream.write(&frame);
    }

    /// Called while a request is pending: peeks when due; the error (its text starts with
    /// `peer`, called only then) once the peer's failure report, or the close of its end, is
    /// [`GRACE_NS`] old.
    #[inline]
    pub(crate) fn check(&mut self, now_ns: u64, peer: impl FnOnce() -> String) -> Result<()> {
        if now_ns < self.next_check_ns {
            return Ok(());
        }
        self.check_now(now_ns, peer)
    }

    fn check_now(&mut self, now_ns: u64, peer: impl FnOnce() -> String) -> Result<()> {
        self.next_check_ns = now_ns.saturating_add(CHECK_INTERVAL_NS);
        if self.closed.is_none() && self.reported.is_none() {
            self.closed = self.peek(now_ns).map(|why| (now_ns, why));
        }
        if let Some((since, text)) = &self.reported {
            if now_ns.saturating_sub(*since) < GRACE_NS {
                return Ok(());
            }
            return Err(Error::remote(format!(
                "{}: the peer's comm failed and said why: {text}",
                peer()
            )));
        }
        match &self.closed {
            Some((since, why)) if now_ns.saturating_sub(*since) >= GRACE_NS => {
                Err(Error::remote(format!(
                    "{}: the peer's control connection {why} {:.1} s ago{} and this request is \
                     still pending: the peer process exited or aborted its comm, or the path to \
                     its host went away",
                    peer(),
                    now_ns.saturating_sub(*since) as f64 / 1e9,
                    self.path,
                )))
            }
            _ => Ok(()),
        }
    }

    /// How the peer's end was closed, if it was; a complete failure notice is taken into
    /// `reported` (then `None`: the close, if any, is seen at the next look).
    fn peek(&mut self, now_ns: u64) -> Option<String> {
        let stream = self.stream.as_mut()?;
        let mut buffer = [0u8; NOTICE_HEADER + NOTICE_TEXT_MAX];
        match stream.peek(&mut buffer) {
            Ok(0) => Some("was closed".to_string()),
            Ok(n) => {
                self.reported = take_notice(stream, &buffer[..n]).map(|text| (now_ns, text));
                None
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {
                None
            }
            Err(e) => Some(format!("failed ({e})")),
        }
    }
}

/// " (it rides the sout rail (mlx5_0))" when `stream`'s local address is a rail device's address,
/// else "": which link a dead control connection points at.
fn control_path(stream: &TcpStream, devices: &crate::net::setup::resources::Devices) -> String {
    let Ok(local) = stream.local_addr() else {
        return String::new();
    };
    crate::fabric::Rail::ALL
        .into_iter()
        .find(|rail| devices[rail.index()].info().address == local.ip())
        .map(|rail| {
            format!(
                " (over the {rail} rail ({}))",
                devices[rail.index()].info().name
            )
        })
        .unwrap_or_default()
}

/// The text of a complete notice at the head of `peeked`, consumed from `stream`; `None` while
/// incomplete, or for bytes that are not a notice (left alone: the peer is alive).
fn take_notice(stream: &mut TcpStream, peeked: &[u8]) -> Option<String> {
    if peeked.len() < NOTICE_HEADER || &peeked[..NOTICE_MAGIC.len()] != NOTICE_MAGIC {
        return None;
    }
    let length = usize::from(u16::from_le_bytes([peeked[8], peeked[9]])).min(NOTICE_TEXT_MAX);
    let frame = peeked.get(..NOTICE_HEADER + length)?;
    let mut consumed = vec![0u8; frame.len()];
    // The bytes are there (peeked), so this read does not block.
    stream.read_exact(&mut consumed).ok()?;
    Some(String::from_utf8_lossy(&frame[NOTICE_HEADER..]).into_owned())
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
        (PeerWatch::new(ours, 1000, String::new()), theirs)
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

    #[test]
    fn a_failure_the_peer_reports_fails_pending_requests_after_the_grace_with_its_text() {
        let (mut watch, theirs) = connected();
        let mut reporter = PeerWatch::new(theirs, 1000, String::new());
        reporter.notify_failure(&Error::remote(
            "the sup rail (mlx5_1) QP 0x12: retry exceeded",
        ));
        reporter.notify_failure(&Error::remote("a second failure is not sent"));
        std::thread::sleep(std::time::Duration::from_millis(50));
        watch.check(1, peer).unwrap();
        watch.check(1 + GRACE_NS - CHECK_INTERVAL_NS, peer).unwrap();
        let error = watch.check(1 + GRACE_NS, peer).unwrap_err();
        assert!(
            error.message.contains("failed and said why")
                && error
                    .message
                    .contains("the sup rail (mlx5_1) QP 0x12: retry exceeded"),
            "{error}"
        );
        assert!(watch.check(2 * GRACE_NS, peer).is_err(), "it stays failed");
    }
}
