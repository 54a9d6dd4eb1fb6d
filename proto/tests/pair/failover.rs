//! The pair's failover steps (docs/PROTOCOL.md §10), as the engine takes them: a side that
//! detects a failed rail first takes every completion already in its queue, then puts its end
//! in error (nothing more crosses the rail either way), then fails over; the sender asks for the
//! receiver's report with a notice written into the receiver's mailbox over the survivor; the
//! receiver reports into the sender's, then writes again the CTS entries of every receive that
//! awaits the sender (a CTS write on the failed rail may have been lost); the sender settles its
//! slots on the report and replays, on the survivor, what the receiver still awaits.

use mpib_proto::cts::MAX_RECVS;
use mpib_proto::failover::{FailoverNotice, FailoverReport, FAILOVER_NOTICE_LEN};
use mpib_proto::post_plan;
use mpib_proto::rail::Rail;
use mpib_proto::work::{SendOpcode, Sge, WorkRequest};

use super::{
    record_target, Pair, Side, ToSender, LKEYS, NOTICE_MAILBOX_BASE, NOTICE_SHADOW_BASE, RKEYS,
};

impl Pair {
    /// A write of the receiver's into the sender's memory, on the rail its CTS rides.
    pub(super) fn write_to_sender(&mut self, message: ToSender) {
        let rail = if self.receiver.down().contains(self.cts_rail) {
            self.cts_rail.other()
        } else {
            self.cts_rail
        };
        if !self.cts_cut[rail.index()] {
            self.cts.push_back((rail, message));
        }
    }

    /// The next write of the receiver's lands.
    pub(super) fn land_cts(&mut self) {
        match self.cts.pop_front() {
            Some((_, ToSender::Cts(index, entry))) => self.fifo[index] = entry,
            Some((_, ToSender::Report(report))) => {
                let bytes = report.encode();
                self.report_mailbox = FailoverReport::decode(&bytes).ok();
            }
            None => {}
        }
    }

    /// The sender's surviving rail, once one failed.
    pub(super) fn survivor(&self) -> Option<Rail> {
        Rail::ALL
            .into_iter()
            .find(|rail| self.sender.down().contains(*rail))
            .map(Rail::other)
    }

    /// `side` finds `rail` failed.
    pub(super) fn detect(&mut self, side: Side, rail: Rail) -> Result<(), String> {
        match side {
            Side::Sender => {
                self.poll_sender_cq()?;
                self.cut_data(rail);
                self.cut_cts(rail);
                self.fail_over_sender(rail)
            }
            Side::Receiver => {
                self.poll_receiver_cq()?;
                self.cut_data(rail);
                self.cut_cts(rail);
                self.fail_over_receiver(rail)
            }
        }
    }

    /// The sender stops using `rail` and asks the receiver for its report.
    fn fail_over_sender(&mut self, rail: Rail) -> Result<(), String> {
        let notice = match self.sender.rail_failed(rail) {
            Ok(Some(notice)) => notice,
            Ok(None) => return Ok(()),
            Err(_) => {
                self.no_survivor = true;
                return Ok(());
            }
        };
        self.notice_shadow = notice.encode();
        let survivor = rail.other();
        let write = WorkRequest {
            wr_id: 0,
            opcode: SendOpcode::Write,
            sge: Some(Sge {
                addr: NOTICE_SHADOW_BASE,
                length: FAILOVER_NOTICE_LEN as u32,
                lkey: LKEYS[survivor.index()],
            }),
            remote_addr: NOTICE_MAILBOX_BASE,
            rkey: RKEYS[survivor.index()],
            signaled: false,
            inline: false,
        };
        if !self.data_cut[survivor.index()] {
            self.rails[survivor.index()].push_back(write);
        }
        Ok(())
    }

    /// The receiver stops using `rail`; it reports once it holds receives for the replays.
    fn fail_over_receiver(&mut self, rail: Rail) -> Result<(), String> {
        match self.receiver.fail_rail(rail) {
            Ok(true) => {
                self.refill(self.receiver.imms_in_flight());
                self.send_report();
            }
            Ok(false) => {}
            Err(_) => self.no_survivor = true,
        }
        Ok(())
    }

    /// The report goes out once the receiver's core lets it (every IMM that may still come
    /// has a receive held for it), then the CTS entries of the receives it awaits, written
    /// again.
    pub(super) fn send_report(&mut self) {
        let Some(report) = self.receiver.take_report() else {
            return;
        };
        self.write_to_sender(ToSender::Report(report));
        for slot in report.awaiting.iter() {
            let base = slot * MAX_RECVS;
            let count = (self.cts_shadow[base].nreqs as usize).clamp(1, MAX_RECVS);
            for index in base..base + count {
                let entry = self.cts_shadow[index];
                self.write_to_sender(ToSender::Cts(index, entry));
            }
        }
    }

    /// The receiver reads its mailbox: a sender's notice makes it fail over.
    pub(super) fn read_notice(&mut self) -> Result<(), String> {
        let Ok(notice) = FailoverNotice::decode(&self.notice_mailbox) else {
            return Ok(());
        };
        if notice.epoch <= self.notice_taken {
            return Ok(());
        }
        self.notice_taken = notice.epoch;
        if self.receiver.down().contains(notice.failed) {
            return Ok(());
        }
        self.cut_data(notice.failed);
        self.cut_cts(notice.failed);
        self.fail_over_receiver(notice.failed)
    }

    /// The sender reads its mailbox: the receiver's report settles its slots.
    pub(super) fn read_report(&mut self) -> Result<(), String> {
        let Some(report) = self.report_mailbox.take() else {
            return Ok(());
        };
        self.poll_sender_cq()?;
        if !self.sender.down().contains(report.failed) {
            self.cut_data(report.failed);
            self.cut_cts(report.failed);
        }
        self.reports += 1;
        let done = match self.sender.on_report(&report) {
            Ok(done) => done,
            Err(_) => {
                self.no_survivor = true;
                return Ok(());
            }
        };
        for slot in done.iter() {
            self.send_done(slot)?;
        }
        self.post_replays()
    }

    /// Posts every replay the report asked for, whole, on the survivor.
    pub(super) fn post_replays(&mut self) -> Result<(), String> {
        while let Some(slot) = self.sender.next_replay() {
            let survivor = self.survivor().ok_or("a replay without a failed rail")?;
            let state = *self.sender.slot(slot);
            let plan = post_plan::plan_on(slot as u8, &state, survivor, record_target(slot), true);
            self.post_plan(slot, plan);
            self.sender.replayed(slot).map_err(|e| e.to_string())?;
            self.replays += 1;
        }
        Ok(())
    }

    /// With failover on, when the pair stalls: a cut no side has detected is found by the side
    /// whose writes it drops, or whose acknowledgements (their error completions would say so).
    /// Whether one was.
    pub fn find_a_cut(&mut self) -> bool {
        if !self.failover || self.no_survivor || self.error.is_some() {
            return false;
        }
        for rail in Rail::ALL {
            let known = self.sender.down().contains(rail) || self.receiver.down().contains(rail);
            if known {
                continue;
            }
            // A write whose acknowledgement is lost fails at the sender (retries exhausted).
            let i = rail.index();
            let side = if self.data_cut[i] || self.ack_cut[i] {
                Side::Sender
            } else if self.cts_cut[i] {
                Side::Receiver
            } else {
                continue;
            };
            if let Err(error) = self.detect(side, rail) {
                self.error = Some(error);
            }
            return true;
        }
        false
    }
}
