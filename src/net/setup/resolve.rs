//! The peer's rail addresses, resolved across calls before any QP is brought up.
//!
//! On RoCE, `ibv_modify_qp(RTR)` waits inside the call for ARP when the kernel has no valid
//! neighbour entry for the peer (about a second on the rig's first connection of a boot; see
//! docs/RELIABILITY.md). NCCL's proxy thread drives every connection and transfer from one
//! thread, so `connect` and `accept` go through a resolving stage instead: each call polls every
//! rail that carries QPs once ([`crate::fabric::PeerResolution`]) and returns "not yet" until
//! all are ready, then connects the QPs, which no longer waits. A rail still unresolved after
//! `MPIB_ADDR_RESOLVE_TIMEOUT_MS` is connected anyway, with a WARN saying what was being
//! resolved: the check can misjudge a setup (policy routing, a gateway in another table), and
//! then the kernel resolves inside `ibv_modify_qp` as it would without it (waiting up to about
//! a second), or fails there with the verb's error if the peer cannot be reached.

use std::time::{Duration, Instant};

use crate::error::Result;
use crate::fabric::{Endpoint, PeerResolution, Rail};
use crate::log;
use crate::proto::qp_layout::QpLayout;
use crate::proto::wire::RailEndpoint;

use crate::net::setup::resources::Devices;

/// The rails of one connection still being resolved.
pub(crate) struct Resolutions {
    pending: Vec<(Rail, Box<dyn PeerResolution>)>,
    started: Instant,
    timeout: Duration,
    polls: u32,
}

impl Resolutions {
    /// Starts resolving the peer's GID on every rail `layout` gives QPs.
    pub(crate) fn start(
        devices: &Devices,
        layout: QpLayout,
        peer: &[RailEndpoint; 2],
        timeout_ms: u32,
    ) -> Result<Resolutions> {
        let mut pending = Vec::with_capacity(2);
        for rail in [Rail::ScaleOut, Rail::ScaleUp] {
            if layout.count(rail) == 0 {
                continue;
            }
            let device = &devices[rail.index()];
            pending.push((
                rail,
                device.resolve_peer(&Endpoint(peer[rail.index()].endpoint))?,
            ));
        }
        Ok(Resolutions {
            pending,
            started: Instant::now(),
            timeout: Duration::from_millis(u64::from(timeout_ms)),
            polls: 0,
        })
    }

    /// One check of every rail not yet resolved; `Ok(true)` once all are.
    pub(crate) fn poll(&mut self) -> Result<bool> {
        self.polls += 1;
        let mut index = 0;
        while index < self.pending.len() {
            let (rail, resolution) = &mut self.pending[index];
            if resolution.poll()? {
                if self.polls > 1 {
                    info!(
                        log::NET | log::INIT,
                        "{rail}: peer address resolved after {} ms ({} polls): {}",
                        self.started.elapsed().as_millis(),
                        self.polls,
                        resolution.describe()
                    );
                }
                self.pending.swap_remove(index);
            } else {
                index += 1;
            }
        }
        if self.pending.is_empty() {
            return Ok(true);
        }
        if self.started.elapsed() >= self.timeout {
            let waiting: Vec<String> = self
                .pending
                .iter()
                .map(|(_, resolution)| resolution.describe())
                .collect();
            warn!(
                log::NET | log::INIT,
                "peer address not resolved after {} ms (MPIB_ADDR_RESOLVE_TIMEOUT_MS={}): {}; \
                 connecting anyway: the kernel resolves it inside ibv_modify_qp, which may wait \
                 up to about a second or fail",
                self.started.elapsed().as_millis(),
                self.timeout.as_millis(),
                waiting.join("; ")
            );
            self.pending.clear();
            return Ok(true);
        }
        Ok(false)
    }
}
