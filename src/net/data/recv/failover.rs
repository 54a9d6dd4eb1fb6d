//! The receiver's part of a failover (docs/PROTOCOL.md §10): its QPs on the failed rail go to
//! the error state, and once nothing more can land there (`QueuePair::quiesced`) and every IMM
//! they delivered was taken, the core marks what awaits the sender (`RecvSlots::fail_rail`);
//! the CTS moves to the survivor if it rode the failed rail, and the report goes out on it,
//! followed by the CTS entries of every awaiting receive written again.

use mpib_probes::declared::RAIL_ERROR_COMPLETIONS;

use super::{RecvComm, RecvData};
use crate::error::{Error, Result};
use crate::fabric::{Completion, Rail, Sge};
use crate::log;
use crate::net::observe::peer::Watch;
use crate::net::setup::comm::ConnectionInfo;
use crate::net::setup::resources::drain_completions;
use crate::proto::cts::{CtsEntry, CTS_ENTRY_SIZE, MAX_RECVS};
use crate::proto::failover::{
    FailoverError, FailoverNotice, FailoverReport, MailboxWrite, FAILOVER_NOTICE_LEN,
    FAILOVER_REPORT_LEN, NOTICE_MAILBOX, REPORT_MAILBOX, WRITE_MESSAGE, WRITE_PROBE,
};
use crate::proto::recv_slots::RecvBlocked;
use crate::proto::wr_id::{WrId, WrKind};

/// The notice's last word, its seal: read first, so a reader that sees it reads the whole.
const NOTICE_SEAL_WORD: usize = FAILOVER_NOTICE_LEN / 8 - 1;

/// What the receiver keeps of failovers between calls.
#[derive(Default)]
pub(super) struct RecvFailover {
    /// A probe of the peer is in flight.
    probing: bool,
    /// A rail whose QPs were put in error and may not have quiesced yet.
    pub(super) quiescing: Option<Rail>,
    /// The seal of the last notice taken (0: none), so an unchanged mailbox costs one load.
    notice_seal: u64,
    /// The failover under way (its rail, when this end found it failed), for its event record
    /// (`mpib_probes::FailoverEvent`), and how many this end had.
    episode: Option<(Rail, u64)>,
    episodes: u32,
}

impl RecvFailover {
    /// A failover write completed (the report, or a probe: the peer is there).
    pub(super) fn probe_done(&mut self, wr: WrId) {
        if wr.slot == WRITE_PROBE {
            self.probing = false;
        }
    }
}

impl RecvComm {
    /// A failed completion on `rail`: the rail failed, or the connection did.
    pub(super) fn failed_completion(
        &self,
        data: &mut RecvData,
        rail: Rail,
        completion: &Completion,
    ) -> Result<()> {
        // A flush read that failed has nothing left to order on its rail: its request is done
        // there, whatever the failure means for the connection (else `iflush` never completes).
        let wr = WrId::unpack(completion.wr_id).ok();
        if let Some(wr) = wr.filter(|wr| wr.kind == WrKind::Flush) {
            self.flush_done(data, rail, wr)?;
        }
        if data.slots.down().contains(rail) || data.failover.quiescing == Some(rail) {
            // Flushed, or late: the failover settles what rode the rail.
            return Ok(());
        }
        let error = self.info.completion_error(rail, completion);
        data.telemetry.rail(rail).inc(RAIL_ERROR_COMPLETIONS);
        if !ConnectionInfo::is_rail_failure(completion.status) {
            data.fail(&error);
            return Err(error);
        }
        self.rail_failed(data, rail, error)
    }

    /// `rail` failed (`why`): with failover its QPs go to the error state and the failover
    /// goes on in later calls (`advance_failover`); without, or with no rail left, the
    /// connection fails with `why`.
    pub(super) fn rail_failed(&self, data: &mut RecvData, rail: Rail, why: Error) -> Result<()> {
        if data.slots.down().contains(rail) || data.failover.quiescing == Some(rail) {
            return Ok(());
        }
        let survivor = rail.other();
        let left = self.info.layout.count(survivor) > 0
            && data.slots.srq(survivor).is_some()
            && !data.slots.down().contains(survivor)
            && data.failover.quiescing != Some(survivor);
        if !self.info.failover || !left {
            let error = match self.info.failover {
                true => why.context(format!("failover: no {survivor} rail survives it")),
                false => why,
            };
            data.fail(&error);
            return Err(error);
        }
        warn!(
            log::NET,
            "{why}; going on over the {survivor} rail alone (failover)"
        );
        data.peer.rail_failed(rail);
        data.telemetry.rail_failed(rail);
        data.failback.watching = true;
        data.failover.episode = Some((rail, crate::net::data::request::now_ns()));
        data.failover.episodes += 1;
        data.failback.unconfirmed = data.failback.unconfirmed.without(rail);
        let layout = self.info.layout;
        let first = layout.first(rail);
        for qp in &mut data.qps.qps[first..first + layout.count(rail)] {
            if let Err(e) = qp.fail() {
                warn!(log::NET, "{}: {e}", self.info.describe_peer());
            }
        }
        data.failover.quiescing = Some(rail);
        Ok(())
    }

    /// Moves a failover on: takes the sender's notice, settles a failed rail once its QPs have
    /// quiesced, and sends the report when it is due and can be sent.
    pub(super) fn advance_failover(&self, data: &mut RecvData) -> Result<()> {
        self.check_notice(data)?;
        if let Some(rail) = data.failover.quiescing {
            let layout = self.info.layout;
            let first = layout.first(rail);
            for qp in &mut data.qps.qps[first..first + layout.count(rail)] {
                if !qp.quiesced().map_err(Error::from)? {
                    return Ok(());
                }
            }
            // Every IMM the rail delivered is in its CQ now: taken before the core decides.
            drain_completions(data, |data, rail, completion| {
                self.complete(data, rail, completion)
            })?;
            data.failover.quiescing = None;
            data.slots
                .fail_rail(rail)
                .map_err(|e| self.failover_error(data, rail, e.to_string()))?;
            if data.cts_rail == rail {
                data.cts_rail = rail.other();
                data.cts_qp = layout.first(rail.other());
            }
        }
        self.send_report(data)
    }

    /// Takes the sender's notice once it is in the mailbox: the rail it names failed.
    fn check_notice(&self, data: &mut RecvData) -> Result<()> {
        let records = data.records.region();
        let seal = records.read_word(NOTICE_MAILBOX, NOTICE_SEAL_WORD);
        if seal == 0 || seal == data.failover.notice_seal {
            return Ok(());
        }
        let bytes = records.read_bytes::<FAILOVER_NOTICE_LEN>(NOTICE_MAILBOX);
        let notice = match FailoverNotice::decode(&bytes) {
            Ok(notice) if self.info.failover => notice,
            Ok(notice) => {
                let what = "a failover notice on a connection that does not fail over";
                return Err(self.failover_error(data, notice.failed, what.to_string()));
            }
            Err(FailoverError::Unsealed) => return Ok(()),
            Err(e) => {
                let error = Error::remote(format!(
                    "{}: failover notice: {e}",
                    self.info.describe_peer()
                ));
                data.fail(&error);
                return Err(error);
            }
        };
        data.failover.notice_seal = seal;
        let why = Error::remote(format!(
            "{}: the sender reports the {} rail failed",
            self.info.describe_peer(),
            notice.failed
        ));
        self.rail_failed(data, notice.failed, why)
    }

    /// Fails the connection: the failover of `rail` cannot go on (`what`).
    fn failover_error(&self, data: &mut RecvData, rail: Rail, what: String) -> Error {
        let error = Error::remote(format!(
            "{}: failover of the {rail} rail: {what}",
            self.info.describe_peer()
        ));
        data.fail(&error);
        error
    }

    /// Sends the report once the core gives it (the connection holds a receive for every IMM
    /// that may still come) and the CTS QP has a credit for it and for each awaiting receive's
    /// CTS written again after it.
    fn send_report(&self, data: &mut RecvData) -> Result<()> {
        if data.slots.can_post() != Err(RecvBlocked::ReportDue) {
            return Ok(());
        }
        let in_flight = data.slots.imms_in_flight();
        data.refill_for(in_flight)?;
        let awaiting = in_flight - data.slots.outstanding();
        if data.qps.credits[data.cts_qp].available() <= awaiting {
            // Send-queue credits come back with a signalled completion, and the CTS that would
            // bring one waits for this report: a signalled probe brings them.
            if !data.failover.probing {
                data.failover.probing =
                    self.post_control_write(data, REPORT_MAILBOX, None, WRITE_PROBE)?;
            }
            return Ok(());
        }
        let Some(report) = data.slots.take_report() else {
            return Ok(());
        };
        self.post_report(data, &report)?;
        for slot in report.awaiting.iter() {
            let entry: CtsEntry = data.cts_shadow.region().read(slot * MAX_RECVS);
            self.post_cts(data, slot, entry.nreqs as usize)?;
        }
        info!(
            log::NET,
            "{}: failover of the {} rail reported; {awaiting} receives await a replay",
            self.info.describe_peer(),
            report.failed
        );
        self.record_episode(data);
        Ok(())
    }

    /// Records the failover that was just reported as an event (`mpib_probes::FailoverEvent`),
    /// which the collector exports as a span: this end goes on once its report is out.
    fn record_episode(&self, data: &mut RecvData) {
        let Some((rail, detected)) = data.failover.episode.take() else {
            return;
        };
        let telemetry = data.telemetry.telemetry();
        let now = telemetry.epoch_ns(crate::net::data::request::now_ns());
        let event = mpib_probes::FailoverEvent {
            direction: mpib_probes::Direction::Recv,
            rail: rail.index(),
            conn_index: data.telemetry.index(),
            detected_ns: telemetry.epoch_ns(detected),
            reported_ns: now,
            resumed_ns: now,
            replayed_transfers: 0,
            replayed_bytes: 0,
            epoch: data.failover.episodes,
            peer: self.info.peer,
            device: u8::try_from(self.info.device_index).unwrap_or(u8::MAX),
        };
        telemetry.record(&event.record());
    }

    /// One RDMA write of the report into the sender's mailbox, on the (surviving) CTS QP.
    fn post_report(&self, data: &mut RecvData, report: &FailoverReport) -> Result<()> {
        let shadow = data.cts_shadow.region();
        shadow.write_bytes(REPORT_MAILBOX, &report.encode());
        let sge = Sge {
            addr: shadow.addr_of(REPORT_MAILBOX),
            length: FAILOVER_REPORT_LEN as u32,
            lkey: data.cts_shadow.keys(data.cts_rail).lkey,
        };
        match self.post_control_write(data, REPORT_MAILBOX, Some(sge), WRITE_MESSAGE)? {
            true => Ok(()),
            false => Err(Error::internal("CTS send queue full after a credit check")),
        }
    }

    /// What the peer watch asks (`watch`): nothing, or, after the control connection's path
    /// died, fail its rail over, or probe the sender's QP on the survivor (one probe in
    /// flight at a time; an error completion of it finds no rail left and fails the comm).
    pub(super) fn act_on_watch(&self, data: &mut RecvData, watch: Watch) -> Result<()> {
        match watch {
            Watch::Fine => Ok(()),
            Watch::PathFailed(rail) => {
                let why = Error::remote(format!(
                    "{}: the control connection over the {rail} rail timed out",
                    self.info.describe_peer()
                ));
                self.rail_failed(data, rail, why)?;
                self.advance_failover(data)
            }
            Watch::Probe => {
                if !data.failover.probing && data.failover.quiescing.is_none() {
                    data.failover.probing =
                        self.post_control_write(data, REPORT_MAILBOX, None, WRITE_PROBE)?;
                }
                Ok(())
            }
        }
    }

    /// One signalled RDMA write on the CTS QP into the sender's FIFO at `mailbox` (an entry
    /// index: the report's, or failback's answer): `sge`'s bytes, or none (a probe).
    /// `Ok(false)` without a send credit.
    pub(super) fn post_control_write(
        &self,
        data: &mut RecvData,
        mailbox: usize,
        sge: Option<Sge>,
        what: u8,
    ) -> Result<bool> {
        let rail = data.cts_rail;
        let Some(post_index) = data.qps.credits[data.cts_qp].reserve(1) else {
            return Ok(false);
        };
        let wr = MailboxWrite {
            rail,
            qp_index: data.cts_qp as u8,
            post_index,
            remote_addr: data.remote_fifo + (mailbox * CTS_ENTRY_SIZE) as u64,
            rkey: data.remote_fifo_rkeys[rail.index()],
        }
        .request(sge, what);
        // SAFETY: the SGE lies in `cts_shadow`, owned and registered by this comm, whose
        // mailboxes are written again only for a later failover or offer; the remote range is
        // the sender's mailbox, inside the FIFO it registered (handshake).
        unsafe { data.qps.qps[data.cts_qp].post_send(std::slice::from_ref(&wr)) }.map_err(|e| {
            let error = Error::from(e).context(self.info.describe_peer());
            data.fail(&error);
            error
        })?;
        Ok(true)
    }
}
