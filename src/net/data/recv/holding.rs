//! What a receive comm holds of its NICs' shared receive queues (docs/PROTOCOL.md §8): taking
//! receives before a CTS, giving back and settling, leaving at close, and what a peer that breaks
//! the protocol costs its queues. The accounting is the core's (`proto::srq`,
//! `proto::srq_shared`); this moves it against `src/net/setup/receives.rs`.

use mpib_probes::declared::{
    SRQ_DEPTH, SRQ_HIGH_WATER, SRQ_LOW_WATER, SRQ_LOW_WATER_HITS, SRQ_REFILLS,
};

use super::RecvData;
use crate::error::Result;
use crate::fabric::Rail;
use crate::net::setup::receives::{Membership, SETTLE_EVERY};
use crate::net::setup::resources::RailQueues;

/// The connection's place in `rail`'s shared queue, if it receives on that rail.
fn member(queues: &mut [Option<RailQueues>; 2], rail: Rail) -> Option<&mut Membership> {
    queues[rail.index()].as_mut().and_then(|q| q.srq.as_mut())
}

impl RecvData {
    /// Publishes the marks every rail's holding follows.
    pub(crate) fn announce_marks(&mut self) {
        for rail in Rail::ALL {
            if let Some(credits) = self.slots.srq(rail) {
                let (low, high) = (credits.low_water(), credits.high_water());
                let probe = self.telemetry.rail(rail);
                probe.set(SRQ_LOW_WATER, u64::from(low));
                probe.set(SRQ_HIGH_WATER, u64::from(high));
            }
        }
    }

    /// Gives back what the outstanding receives do not need and settles what the IMMs consumed
    /// (the `test` path: nothing to take).
    #[inline]
    pub(crate) fn refill(&mut self) -> Result<()> {
        // After a failover an awaiting receive may bring one IMM more (docs/PROTOCOL.md §10).
        self.refill_for(self.slots.imms_in_flight())
    }

    /// Makes every rail hold a receive of its shared queue for each of `in_flight` slots (see
    /// `proto::srq`): takes the shortfall and a batch, gives back an idle excess, and settles
    /// consumption every `SETTLE_EVERY` IMMs. Touches the shared queue only when one of those is
    /// due: most calls compare a few integers.
    #[inline]
    pub(super) fn refill_for(&mut self, in_flight: u32) -> Result<()> {
        for rail in Rail::ALL {
            if self.slots.down().contains(rail) {
                // What a failed rail holds stays held: receives its QPs took are not seen.
                continue;
            }
            let (Some(member), Some(credits)) = (
                member(&mut self.queues, rail),
                self.slots.srq(rail).copied(),
            ) else {
                continue;
            };
            let held = credits.held();
            let want = credits.wanted(in_flight);
            if want > 0 {
                let taken = member.take(held, want)?;
                self.slots.on_granted(rail, taken.receives);
                let probe = self.telemetry.rail(rail);
                if taken.posted {
                    probe.inc(SRQ_REFILLS);
                }
                probe.set(SRQ_DEPTH, u64::from(taken.room));
                continue;
            }
            let excess = credits.excess(in_flight);
            let unsettled = member.unsettled(held);
            let room = if excess > 0 {
                self.slots.on_given_back(rail, excess);
                member.give_back(held, excess)
            } else if unsettled >= SETTLE_EVERY
                || (unsettled > 0 && in_flight == 0 && member.borrowed_batch(credits.low_water()))
            {
                // Also as soon as a connection that borrowed a batch or more goes idle, so that
                // what it consumed does not stay counted as borrowed while others need it (less
                // than a batch over its floor it settles every `SETTLE_EVERY`, as a busy one).
                member.settle(held)
            } else {
                continue;
            };
            self.telemetry.rail(rail).set(SRQ_DEPTH, u64::from(room));
        }
        Ok(())
    }

    /// The peer broke the protocol (an IMM the connection cannot place): the connection fails
    /// (the caller), and since such a peer may send IMMs the connection holds no receive for,
    /// taking receives other connections of its queues hold, its QPs go now and each queue posts
    /// spare receives for what may have landed unseen and admits no one new (`unheld`: the IMM
    /// seen took a receive the connection did not hold, on that rail).
    #[cold]
    pub(super) fn stop_misbehaving_peer(&mut self, unheld: Option<Rail>) {
        for rail in Rail::ALL {
            let Some(member) = member(&mut self.queues, rail) else {
                continue;
            };
            if unheld == Some(rail) {
                member.consumed_unheld();
            }
            member.quarantine();
        }
        self.qps.qps.clear();
    }

    /// Counts, on each rail whose shared queue could not cover `in_flight` receives, an `irecv`
    /// that returned no request for it.
    #[cold]
    pub(super) fn count_uncovered(&mut self, in_flight: u32) {
        for rail in Rail::ALL {
            if self.slots.srq(rail).is_some_and(|c| !c.covers(in_flight)) {
                self.telemetry.rail(rail).inc(SRQ_LOW_WATER_HITS);
            }
        }
    }
}

impl Drop for RecvData {
    /// The QPs go first: once they are destroyed no IMM of this connection can consume a shared
    /// receive, and what it holds goes back to its queues, less what its outstanding receives
    /// may have consumed unseen (src/net/setup/receives.rs).
    fn drop(&mut self) {
        self.qps.qps.clear();
        let outstanding = self.slots.outstanding();
        for rail in Rail::ALL {
            let member = self.queues[rail.index()]
                .as_mut()
                .and_then(|q| q.srq.take());
            if let Some(member) = member {
                let held = self.slots.srq(rail).map_or(0, |credits| credits.held());
                member.leave(held, outstanding);
            }
        }
    }
}
