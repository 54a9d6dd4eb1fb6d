//! The pair's failback step (docs/PROTOCOL.md §11), as the engine takes it: the rail's wire
//! works again, and if its failover is over on both sides (the sender settled, the receiver,
//! once it took every completion it had, with nothing left of it) both sides take the rail
//! back with new queue pairs. The old ones are gone with what was queued on them, and their
//! completions still in a queue are ignored (the engine knows them by QP number). The CTS stays
//! on the rail the failover moved it to. Otherwise the offer is refused: nothing changes.

use mpib_proto::rail::Rail;

use super::Pair;

impl Pair {
    /// `rail` comes back, if it can now.
    pub(super) fn restore(&mut self, rail: Rail) -> Result<(), String> {
        if !self.failover || !self.sender.down().contains(rail) || !self.sender.settled() {
            return Ok(());
        }
        self.poll_receiver_cq()?;
        if !self.receiver.can_restore(rail) {
            return Ok(());
        }
        let i = rail.index();
        self.rails[i].clear();
        self.send_cq.retain(|(on, _)| *on != rail);
        self.cts.retain(|(on, _)| *on != rail);
        (self.data_cut[i], self.cts_cut[i], self.ack_cut[i]) = (false, false, false);
        if self.cts_rail == rail {
            self.cts_rail = rail.other();
        }
        self.receiver
            .restore_rail(rail)
            .map_err(|e| format!("receiver: {e}"))?;
        self.sender
            .rail_restored(rail)
            .map_err(|e| format!("sender: {e}"))?;
        self.restores += 1;
        Ok(())
    }
}
