//! `connect`'s steps on the control link (src/net/observe/link.rs): the link proposed in the
//! ready marker, and the share of the one the acceptor answered with.

use std::time::Duration;

use super::Connector;
use crate::error::{Error, Result};
use crate::net::data::request::now_ns;
use crate::net::observe::link::{self, Attachment, Names, PathKey};
use crate::net::setup::resources::qp_settings;
use crate::proto::wire::Ready;

impl Connector {
    /// The path this connection's control link rides (to the acceptor's process over the
    /// handshake's address pair, with the QPs' retry budget as its user timeout) and its names
    /// on it; `stage` names the step for the error when the reply is not in yet.
    pub(super) fn link_context(&self, stage: &str) -> Result<(PathKey, Names)> {
        let Some(prepared) = &self.prepared else {
            return Err(Error::internal(format!("{stage} before prepare")));
        };
        let settings = qp_settings(&self.ctx.settings, self.traffic_class);
        let path = PathKey {
            peer_process: prepared.peer_process,
            local: *self.local()?.ip(),
            remote: *self.remote.ip(),
            budget_ms: settings.retry_budget_ms(),
        };
        let names = Names {
            local: prepared.request.conn_id,
            peer: prepared.peer_name,
        };
        Ok((path, names))
    }

    /// Proposes the control link: the one held to the acceptor's process, or this handshake's.
    pub(super) fn propose_link(&mut self) -> Result<Ready> {
        let (path, names) = self.link_context("link proposal")?;
        let proposal = link::propose(path, names, self.channel.ride(), now_ns());
        let ready = Ready {
            existing_link: proposal.existing.as_ref().map_or(0, Attachment::link_id),
            fresh_link: proposal.fresh_link,
        };
        if let Some(prepared) = self.prepared.as_mut() {
            prepared.proposal = Some(proposal);
        }
        Ok(ready)
    }

    /// Keeps the share of the link the acceptor answered with (`link`).
    pub(super) fn settle_link(&mut self, link: u64) -> Result<()> {
        let (path, names) = self.link_context("link answer")?;
        let proposal = self
            .prepared
            .as_mut()
            .and_then(|prepared| prepared.proposal.take())
            .ok_or_else(|| Error::internal("link answer without a proposal"))?;
        let fresh_link = proposal.fresh_link;
        let share =
            link::settle(proposal, link, path, self.channel.stream(), names).map_err(|e| {
                let what = format!("keeping the control connection to {}", self.remote);
                crate::net::setup::descriptors::socket_error(&what, &e)
            })?;
        if let (Some(stream), true) = (self.channel.stream(), share.link_id() != fresh_link) {
            // Not kept: the handshake's connection closes with this connector. Closed
            // normally, thousands of handshakes would each leave a TIME_WAIT socket for a
            // minute (16,384 pairs: connect p99 4.9 ms and 21.8 s in all, against 1.6 ms and
            // 14 s with the reset; docs/PERFORMANCE.md); the exchange is over (the answer was
            // the last message), so a reset loses nothing.
            let _ = socket2::SockRef::from(stream).set_linger(Some(Duration::ZERO));
        }
        if let Some(prepared) = self.prepared.as_mut() {
            prepared.link = Some(share);
        }
        // The link to the acceptor's process is there for the next handshakes to ride.
        self.admission = None;
        Ok(())
    }
}
