//! The peer's rail addresses, resolved across calls before any QP is brought up.
//!
//! On RoCE, `ibv_modify_qp(RTR)` waits inside the call for ARP when the kernel has no valid
//! neighbour entry for the peer (about a second on the rig's first connection of a boot; see
//! docs/RELIABILITY.md). NCCL's proxy thread drives every connection and transfer from one
//! thread, so `connect` and `accept` go through a resolving stage instead: each call polls every
//! rail that carries QPs once ([`crate::fabric::PeerResolution`]) and returns "not yet" until
//! all are ready, then connects the QPs, which no longer waits. A rail that stays unresolved
//! for `MPIB_ADDR_RESOLVE_TIMEOUT_MS` fails the connection with what was being resolved.

use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::fabric::{PeerResolution, Rail};
use crate::log;
use crate::proto::qp_layout::QpLayout;
use crate::proto::wire::RailEndpoint;

use super::resources::Devices;

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
            pending.push((rail, device.resolve_peer(&peer[rail.index()].gid)?));
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
            return Err(Error::system(format!(
                "address resolution of the peer timed out after {} ms \
                 (MPIB_ADDR_RESOLVE_TIMEOUT_MS={}): {}",
                self.started.elapsed().as_millis(),
                self.timeout.as_millis(),
                waiting.join("; ")
            )));
        }
        Ok(false)
    }
}
