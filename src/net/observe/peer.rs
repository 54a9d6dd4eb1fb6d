//! Noticing that the peer is gone, or failed, while requests wait on it.
//!
//! An RC queue pair only learns that its peer died when it has something on the wire: a
//! receiver waiting for data, or a sender waiting for a CTS, would wait forever on a killed
//! peer. Each comm therefore keeps a TCP connection to its peer's process (as net_ib keeps its
//! socket), shared with every other comm between the two processes over the same path
//! (`link.rs`), and, while a request is pending and nothing has completed for
//! [`CHECK_INTERVAL_NS`], reads it at most that often (a flowing connection makes no syscall for
//! it). Four things end a wait:
//!
//! * **The peer said why.** A comm that fails sends a notice naming the peer's comm with its
//!   error onto the control connection ([`PeerWatch::notify_failure`], best effort, never blocking):
//!   the peer's requests still pending [`GRACE_NS`] later fail with that text, so a cut rail that
//!   only the other side could see (its CTS write, say) is still named on both sides. The grace
//!   lets this side's own QPs report first when they have work on the wire (their error names
//!   our device and counts in our probes).
//! * **The peer closed its comm.** Closing a comm sends a notice naming its peer, possibly a
//!   moment before our last completion is polled (it can overtake the RDMA ACK), so pending
//!   requests fail only once it is [`GRACE_NS`] old.
//! * **The peer's end closed.** The kernel closes a dead process's sockets, so the read sees
//!   end-of-file or a reset; pending requests fail once that is [`GRACE_NS`] old too.
//! * **The path died.** Keepalive probes every second and a TCP user timeout at the QPs' own
//!   retry budget ([`crate::fabric::QpSettings::retry_budget_ms`]) fail the connection when the
//!   link under it is gone (nothing else would: no FIN crosses a pulled cable); the error names
//!   the rail the connection rides when it rides one.
//!
//! With failover (docs/PROTOCOL.md §10) the connection may ride the rail that failed. A path
//! that died there (its socket timed out or found no route: [`Heard::LinkEnded`]'s `path_died`)
//! then fails that rail over ([`Watch::PathFailed`]) instead of the comm, and once the rail it
//! rides has failed over, a dead path is no news: while requests wait, the comm asks the peer's
//! QPs on the survivor instead ([`Watch::Probe`]: a zero-byte write that only a live peer
//! acknowledges, failing after the QPs' retry budget otherwise), however the connection ended.
//! A comm that fails while its peer watches it so moves its QPs to error, so that the peer's
//! probes fail too.

use crate::error::{Error, Result};
use crate::fabric::Rail;
use crate::net::observe::link::{Attachment, Heard};

/// How often a comm with pending requests reads its control connection.
pub(crate) const CHECK_INTERVAL_NS: u64 = 100_000_000;
/// How long pending requests may outlive what the peer said or the end of the connection.
pub(crate) const GRACE_NS: u64 = 2_000_000_000;

/// What a look at the peer asks of the comm, besides failing it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Watch {
    /// Nothing: the peer is there as far as the link knows, or the wait is not over.
    Fine,
    /// The control connection's path over this rail died: fail the rail over.
    PathFailed(Rail),
    /// The control connection rode a rail that failed over: ask the peer's QPs on the survivor
    /// whether it is there.
    Probe,
}

/// A comm's view of its peer.
pub(crate) struct PeerWatch {
    link: Option<Attachment>,
    next_check_ns: u64,
    /// What was last heard about the peer (kept once it is not `Nothing`).
    heard: Heard,
    /// " (over the sout rail (mlx5_0))" when the connection rides a rail's address, else "".
    path: String,
    /// The rail the connection rides, when it rides one's address.
    rides: Option<Rail>,
    /// Whether the comm fails over (then a path that died on `rides` fails that rail over).
    failover: bool,
    /// `rides` failed over: a dead path is no news, probes on the survivor watch the peer.
    probing: bool,
    notified: bool,
}

impl PeerWatch {
    /// Watches the peer through `link`; `path` says which rail it rides, for messages ("" when
    /// none).
    pub(crate) fn new(link: Attachment, path: String) -> PeerWatch {
        PeerWatch {
            link: Some(link),
            next_check_ns: 0,
            path,
            ..PeerWatch::none()
        }
    }

    /// Watches a comm's peer through its share of a link, naming the rail the handshake's
    /// control address `local` is on (one of the comm's `devices`), if any; `failover`: the
    /// comm fails over.
    pub(crate) fn of_control(
        link: Attachment,
        local: std::net::Ipv4Addr,
        devices: &crate::net::setup::resources::Devices,
        failover: bool,
    ) -> PeerWatch {
        let rides = Rail::ALL
            .into_iter()
            .find(|rail| devices[rail.index()].info().address == std::net::IpAddr::V4(local));
        PeerWatch {
            rides,
            failover,
            ..PeerWatch::new(link, control_path(local, devices))
        }
    }

    /// Whether probes watch the peer (the control connection rode a rail that failed over).
    pub(crate) fn probing(&self) -> bool {
        self.probing
    }

    /// The comm failed `rail` over: if the connection rides it, probes watch the peer from now.
    pub(crate) fn rail_failed(&mut self, rail: Rail) {
        if self.rides == Some(rail) {
            self.probing = true;
        }
    }

    /// The identifier of the link watched (tests).
    #[cfg(test)]
    pub(crate) fn link_id(&self) -> Option<u64> {
        self.link.as_ref().map(Attachment::link_id)
    }

    /// Watches nothing (comms built without a control connection, in unit tests).
    pub(crate) fn none() -> PeerWatch {
        PeerWatch {
            link: None,
            next_check_ns: u64::MAX,
            heard: Heard::Nothing,
            path: String::new(),
            rides: None,
            failover: false,
            probing: false,
            notified: false,
        }
    }

    /// A request completed at `now_ns`: the peer is there, no read before the next interval.
    #[inline]
    pub(crate) fn progressed(&mut self, now_ns: u64) {
        if self.link.is_some() {
            self.next_check_ns = now_ns.saturating_add(CHECK_INTERVAL_NS);
        }
    }

    /// This comm failed with `error`: tell the peer why, once (never blocking; a link whose
    /// peer reads nothing is shut down, so the peer hears its end instead).
    #[cold]
    pub(crate) fn notify_failure(&mut self, error: &Error) {
        let Some(link) = self.link.as_ref() else {
            return;
        };
        if std::mem::replace(&mut self.notified, true) {
            return;
        }
        link.tell_failed(&error.to_string());
    }

    /// Called while a request is pending: reads when due; the error (its text starts with
    /// `peer`, called only then) once what the peer said, or the end of the connection, is
    /// [`GRACE_NS`] old; with failover, what the comm should do about a dead path ([`Watch`]).
    #[inline]
    pub(crate) fn check(&mut self, now_ns: u64, peer: impl FnOnce() -> String) -> Result<Watch> {
        if now_ns < self.next_check_ns {
            return Ok(Watch::Fine);
        }
        self.check_now(now_ns, peer)
    }

    fn check_now(&mut self, now_ns: u64, peer: impl FnOnce() -> String) -> Result<Watch> {
        self.next_check_ns = now_ns.saturating_add(CHECK_INTERVAL_NS);
        // The link keeps what it heard with its time (a failure report over a close, a notice
        // over the link's end), so its answer replaces ours; a failure is final.
        if !matches!(self.heard, Heard::Failed { .. }) {
            if let Some(link) = &self.link {
                self.heard = link.hear(now_ns);
            }
        }
        if let Heard::LinkEnded { path_died, .. } = self.heard {
            if self.probing {
                // However it ended (a path that died, or one whose peer gave up on it first and
                // reset it once the path came back), a dead process is what the probe finds.
                return Ok(Watch::Probe);
            }
            if let (true, true, Some(rail)) = (path_died, self.failover, self.rides) {
                self.probing = true;
                return Ok(Watch::PathFailed(rail));
            }
        }
        let since = match &self.heard {
            Heard::Nothing => return Ok(Watch::Fine),
            Heard::Failed { since, .. }
            | Heard::Closed { since }
            | Heard::LinkEnded { since, .. } => *since,
        };
        let age = now_ns.saturating_sub(since);
        if age < GRACE_NS {
            return Ok(Watch::Fine);
        }
        let seconds = age as f64 / 1e9;
        Err(Error::remote(match &self.heard {
            Heard::Failed { text, .. } => {
                format!("{}: the peer's comm failed and said why: {text}", peer())
            }
            Heard::Closed { .. } => format!(
                "{}: the peer closed its comm {seconds:.1} s ago (it said so on the control \
                 connection{}) and this request is still pending: the peer aborted or closed \
                 its side before this transfer was matched",
                peer(),
                self.path,
            ),
            Heard::LinkEnded { why, .. } => format!(
                "{}: the peer's control connection {why} {seconds:.1} s ago{} and this request \
                 is still pending: the peer process exited or aborted its comm, or the path to \
                 its host went away",
                peer(),
                self.path,
            ),
            Heard::Nothing => return Ok(Watch::Fine),
        }))
    }
}

/// " (over the sout rail (mlx5_0))" when `stream`'s local address is a rail device's address,
/// else "": which link a dead control connection points at.
fn control_path(
    local: std::net::Ipv4Addr,
    devices: &crate::net::setup::resources::Devices,
) -> String {
    crate::fabric::Rail::ALL
        .into_iter()
        .find(|rail| devices[rail.index()].info().address == std::net::IpAddr::V4(local))
        .map(|rail| {
            format!(
                " (over the {rail} rail ({}))",
                devices[rail.index()].info().name
            )
        })
        .unwrap_or_default()
}

#[cfg(test)]
#[path = "peer_tests.rs"]
mod tests;
