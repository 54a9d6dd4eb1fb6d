//! The receiver's part of a failback (docs/PROTOCOL.md §11): the sender's offer of new QPs on
//! a failed rail is answered, once the peer's address there is resolved, by new QPs of this
//! side in place of the failed ones, connected to the offered ones, and the rail taken back for
//! IMMs before the answer goes (the sender posts nothing there before it has the answer). An
//! offer that comes while the rail's failover is not over here is refused with an answer naming
//! no QP; the sender tries again later.

use super::{RecvComm, RecvData};
use crate::error::{Error, Result};
use crate::fabric::{Endpoint, PeerResolution, Rail, Sge};
use crate::log;
use crate::net::setup::resources::{create_rail_queue_pairs, drain_completions, remember_stale};
use crate::proto::failback::{
    RestoreAnswer, RestoreError, RestoreMessage, RestoreOffer, ANSWER_MAILBOX, OFFER_MAILBOX,
    RESTORE_MESSAGE_LEN,
};
use crate::proto::failover::WRITE_MESSAGE;
use crate::proto::rail_mask::RailMask;

/// The offer's last word, its seal (read first, so a reader that sees it reads the whole).
const OFFER_SEAL_WORD: usize = RESTORE_MESSAGE_LEN / 8 - 1;

/// What the receiver keeps of failbacks between calls.
#[derive(Default)]
pub(super) struct RecvFailback {
    /// The connection had a failover: offers may come (one load per poll from then on).
    pub(super) watching: bool,
    /// The seal of the last offer taken.
    offer_seal: u64,
    /// An offer whose peer address is being resolved.
    resolving: Option<(RestoreOffer, Box<dyn PeerResolution>)>,
    /// An answer not yet written (the CTS QP had no send credit).
    answer: Option<RestoreAnswer>,
    /// Rails and numbers of QPs replaced by a failback's: their completions are ignored (QP
    /// numbers are per NIC).
    pub(super) stale: Vec<(Rail, u32)>,
    /// Rails taken back that no IMM has come on yet: the sender may still fail its probes
    /// there, so the connection still counts as degraded on them.
    pub(super) unconfirmed: RailMask,
}

impl RecvComm {
    /// Takes a new offer, moves its resolution on, and writes a pending answer.
    pub(super) fn advance_failback(&self, data: &mut RecvData) -> Result<()> {
        if !data.failback.watching {
            return Ok(());
        }
        self.check_offer(data)?;
        if let Some((offer, mut resolution)) = data.failback.resolving.take() {
            match resolution.poll() {
                // Unconfirmed (see the sender's): polled again; a later offer replaces it.
                Ok(true) if resolution.confirmed() => self.take_rail_back(data, &offer)?,
                Ok(_) => data.failback.resolving = Some((offer, resolution)),
                Err(e) => {
                    self.refuse(data, &offer, &e.to_string());
                }
            }
        }
        self.post_answer(data)
    }

    /// Reads the offer mailbox; a new offer starts resolving the sender's address on its rail
    /// (or is refused at once when this side does not bring rails back).
    fn check_offer(&self, data: &mut RecvData) -> Result<()> {
        let records = data.records.region();
        let seal = records.read_word(OFFER_MAILBOX, OFFER_SEAL_WORD);
        if seal == 0 || seal == data.failback.offer_seal {
            return Ok(());
        }
        let bytes = records.read_bytes::<RESTORE_MESSAGE_LEN>(OFFER_MAILBOX);
        let offer = match RestoreMessage::decode_offer(&bytes) {
            Ok(offer) => offer,
            Err(RestoreError::Unsealed) => return Ok(()),
            Err(e) => {
                let error = Error::remote(format!(
                    "{}: failback offer: {e}",
                    self.info.describe_peer()
                ));
                data.fail(&error);
                return Err(error);
            }
        };
        data.failback.offer_seal = seal;
        if self.info.renewal.failback.is_none() {
            self.refuse(data, &offer, "MPIB_FAILBACK=0 on this side");
            return Ok(());
        }
        let peer = Endpoint(self.info.renewal.peer_rails[offer.rail.index()].endpoint);
        match self.info.devices[offer.rail.index()].resolve_peer(&peer) {
            Ok(resolution) => data.failback.resolving = Some((offer, resolution)),
            Err(e) => self.refuse(data, &offer, &e.to_string()),
        }
        Ok(())
    }

    /// Answers `offer` with new QPs connected to its own, the rail taken back for IMMs; or
    /// refuses it while the rail's failover is not over here.
    fn take_rail_back(&self, data: &mut RecvData, offer: &RestoreOffer) -> Result<()> {
        let rail = offer.rail;
        // Every IMM the survivor brought is taken before the core decides.
        drain_completions(data, |data, rail, completion| {
            self.complete(data, rail, completion)
        })?;
        let down = data.slots.down().contains(rail);
        if !down && !data.failback.unconfirmed.contains(rail) {
            // A rail in use here: the sender offers only rails it has down, so this offer is
            // wrong, and replacing the QPs (the CTS's among them) would break the connection.
            self.refuse(data, offer, "it is up and in use here");
            return Ok(());
        }
        if data.failover.quiescing.is_some() || (down && !data.slots.can_restore(rail)) {
            self.refuse(data, offer, "its failover is not over here");
            return Ok(());
        }
        if data
            .flusher
            .as_ref()
            .is_some_and(|flusher| flusher.busy(rail))
        {
            // Its flush QP still has reads out (a port that went down): destroyed now, they
            // would never complete, nor the `iflush` waiting for them.
            self.refuse(data, offer, "flush reads are still out on it");
            return Ok(());
        }
        if let Err(e) = self.renew_queue_pairs(data, offer) {
            self.refuse(data, offer, &e.to_string());
            return Ok(());
        }
        if down {
            // Else up already: the sender's previous attempt failed after this side took it
            // back. Receives are held for the rail from now on (`refill`, and before the
            // answer goes: `post_answer`), so an IMM on it never finds its queue short.
            data.slots
                .restore_rail(rail)
                .map_err(|e| Error::internal(e.to_string()))?;
            data.failback.unconfirmed = data.failback.unconfirmed.with(rail);
        }
        let layout = self.info.layout;
        let first = layout.first(rail);
        let qp_nums: Vec<u32> = data.qps.qps[first..first + layout.count(rail)]
            .iter()
            .map(|qp| qp.qp_num())
            .collect();
        data.failback.answer = Some(
            RestoreMessage::new(offer.attempt, rail, &qp_nums)
                .map_err(|e| Error::internal(e.to_string()))?,
        );
        info!(
            log::NET,
            "{}: the {rail} rail is taken back for the sender's attempt {} (failback)",
            self.info.describe_peer(),
            offer.attempt
        );
        Ok(())
    }

    /// New QPs on the offer's rail in place of the failed ones, connected to the offered ones
    /// (and a new flush QP there, whose old one may have failed with the port).
    fn renew_queue_pairs(&self, data: &mut RecvData, offer: &RestoreOffer) -> Result<()> {
        let rail = offer.rail;
        let layout = self.info.layout;
        let renewal = &self.info.renewal;
        let queues = data.queues[rail.index()]
            .as_ref()
            .ok_or_else(|| Error::internal(format!("failback of {rail}, which has no CQ")))?;
        let device = &self.info.devices[rail.index()];
        let (qps, credits) = create_rail_queue_pairs(
            device.as_ref(),
            queues,
            layout,
            renewal.sizing,
            rail,
            renewal.secret,
        )?;
        let mut current: Vec<u32> = qps.iter().map(|qp| qp.qp_num()).collect();
        let mut replaced = Vec::new();
        if let Some(flusher) = data.flusher.as_mut() {
            let (old, new) = flusher.renew(device, rail, queues, &renewal.qp_settings)?;
            replaced.extend(old);
            current.extend(new);
        }
        replaced.extend(data.qps.replace_rail(layout, rail, qps, credits)?);
        remember_stale(&mut data.failback.stale, rail, replaced, &current);
        data.qps.connect_rail(
            layout,
            rail,
            &renewal.peer_rails[rail.index()],
            offer.qp_nums(),
            &renewal.qp_settings,
        )
    }

    /// The first IMM on `rail` since it was taken back: the sender's probes passed and it
    /// splits over the rail again; the connection is no longer degraded there.
    pub(super) fn rail_confirmed(&self, data: &mut RecvData, rail: Rail) {
        data.failback.unconfirmed = data.failback.unconfirmed.without(rail);
        data.telemetry.rail_restored(rail);
        info!(
            log::NET,
            "{}: the {rail} rail is back; transfers split over both rails again (failback)",
            self.info.describe_peer()
        );
    }

    /// Answers `offer` with no QP: not now (`why`, logged).
    fn refuse(&self, data: &mut RecvData, offer: &RestoreOffer, why: &str) {
        info!(
            log::NET,
            "{}: not taking the {} rail back for the sender's attempt {}: {why} (failback)",
            self.info.describe_peer(),
            offer.rail,
            offer.attempt
        );
        data.failback.answer = RestoreMessage::new(offer.attempt, offer.rail, &[]).ok();
    }

    /// Writes the pending answer into the sender's mailbox on the CTS QP (on the survivor), or
    /// on a later call without a send credit.
    fn post_answer(&self, data: &mut RecvData) -> Result<()> {
        let Some(answer) = data.failback.answer else {
            return Ok(());
        };
        if !answer.qp_nums().is_empty() {
            data.refill()?;
            if !data.slots.covers(data.slots.imms_in_flight()) {
                return Ok(()); // the shared queues are short: on a later call
            }
        }
        let shadow = data.cts_shadow.region();
        shadow.write_bytes(ANSWER_MAILBOX, &answer.encode_answer());
        let sge = Sge {
            addr: shadow.addr_of(ANSWER_MAILBOX),
            length: RESTORE_MESSAGE_LEN as u32,
            lkey: data.cts_shadow.keys(data.cts_rail).lkey,
        };
        if self.post_control_write(data, ANSWER_MAILBOX, Some(sge), WRITE_MESSAGE)? {
            data.failback.answer = None;
        }
        Ok(())
    }
}
