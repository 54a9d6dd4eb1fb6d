//! The sender's part of a failover (docs/PROTOCOL.md §10): a rail that fails takes nothing more,
//! the receiver is asked for its report (a notice written into its mailbox over the survivor),
//! and on the report each transfer the receiver awaits is replayed whole on the survivor. The
//! rules are the core's (`proto::send_slots`); this moves them against the QPs.

use mpib_probes::declared::{
    RAIL_ERROR_COMPLETIONS, RAIL_REPLAYED_BYTES, RAIL_TX_BYTES, RAIL_WORK_REQUESTS,
};

use super::busy::BusyClock;
use super::{SendComm, SendData};
use crate::error::{Error, Result};
use crate::fabric::{Completion, Rail, Sge};
use crate::log;
use crate::net::data::request::now_ns;
use crate::net::observe::peer::Watch;
use crate::net::setup::comm::ConnectionInfo;
use crate::proto::cts::COMPLETION_RECORD_SIZE;
use crate::proto::failover::{
    FailoverError, FailoverNotice, FailoverReport, MailboxWrite, FAILOVER_NOTICE_LEN,
    FAILOVER_REPORT_LEN, NOTICE_MAILBOX, REPORT_MAILBOX, WRITE_MESSAGE, WRITE_PROBE,
};
use crate::proto::post_plan;
use crate::proto::wr_id::WrId;

/// The report's last word, its seal: read first, so a reader that sees it reads the whole.
const REPORT_SEAL_WORD: usize = FAILOVER_REPORT_LEN / 8 - 1;

/// A failover under way on this end, for its event record (`mpib_probes::FailoverEvent`).
#[derive(Clone, Copy, Default)]
pub(super) struct Episode {
    rail: Option<Rail>,
    detected_ns: u64,
    reported_ns: u64,
    replayed_transfers: u64,
    replayed_bytes: u64,
}

/// What the sender keeps of failovers between calls.
#[derive(Default)]
pub(super) struct SendFailover {
    /// A probe of the peer is in flight.
    probing: bool,
    /// The failover under way, until it settles; and how many this end had.
    episode: Episode,
    episodes: u32,
    /// A notice not yet written (the survivor's QP had no send credit).
    pub(super) notice: Option<FailoverNotice>,
    /// The seal of the last report taken (0: none), so an unchanged mailbox costs one load.
    report_seal: u64,
}

impl SendComm {
    /// A failed completion on `rail`: the rail failed, or the connection did.
    pub(super) fn failed_completion(
        &self,
        data: &mut SendData,
        rail: Rail,
        completion: &Completion,
    ) -> Result<()> {
        if self.failed_restore_probe(data, completion)? {
            return Ok(());
        }
        if data.slots.down().contains(rail) {
            // Flushed, or late: the report settles what rode the rail.
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

    /// `rail` failed (`why`): with failover, nothing more goes on it and the receiver is asked
    /// for its report; without, or with no rail left, the connection fails with `why`.
    pub(super) fn rail_failed(&self, data: &mut SendData, rail: Rail, why: Error) -> Result<()> {
        if !self.info.failover {
            data.fail(&why);
            return Err(why);
        }
        match data.slots.rail_failed(rail) {
            Ok(None) => Ok(()),
            Ok(Some(notice)) => {
                warn!(
                    log::NET,
                    "{why}; going on over the {} rail alone (failover)",
                    rail.other()
                );
                data.peer.rail_failed(rail);
                self.stop_rail(data, rail);
                data.failover.begin_episode(rail);
                data.failover.notice = Some(notice);
                self.post_notice(data)
            }
            Err(no_survivor) => {
                let error = why.context(format!("failover: {no_survivor}"));
                data.fail(&error);
                Err(error)
            }
        }
    }

    /// The progress watchdog (`MPIB_FAILOVER_WATCHDOG_MS`, `proto::watchdog`): a rail whose
    /// parts stopped completing while the other rail's complete fails over now, rather than
    /// when its QPs' retries run out.
    pub(super) fn check_progress(&self, data: &mut SendData, now: u64) -> Result<()> {
        for rail in self.info.layout.rails().rails() {
            let other = rail.other();
            if data.slots.down().contains(rail) || data.slots.down().contains(other) {
                continue;
            }
            let (mine, theirs) = (
                data.busy[rail.index()].progress(),
                data.busy[other.index()].progress(),
            );
            if !crate::proto::watchdog::stalled(mine, theirs, now, self.info.watchdog_ns) {
                continue;
            }
            let why = Error::remote(format!(
                "{}: the {rail} rail ({}) completed none of its {} parts in flight for {} ms while the {other} rail's completed (MPIB_FAILOVER_WATCHDOG_MS)",
                self.info.describe_peer(),
                self.info.devices[rail.index()].info().name,
                mine.in_flight,
                now.saturating_sub(mine.last_progress_ns) / 1_000_000
            ));
            self.rail_failed(data, rail, why)?;
            return self.post_ready(data);
        }
        Ok(())
    }

    /// Moves this connection's QPs on `rail` to the error state (nothing more leaves on them)
    /// and stops the rail's busy clock: its parts in flight will not complete.
    fn stop_rail(&self, data: &mut SendData, rail: Rail) {
        data.telemetry.rail_failed(rail);
        data.busy[rail.index()] = BusyClock::default();
        data.telemetry.set_rail_in_flight(rail, 0);
        let layout = self.info.layout;
        let first = layout.first(rail);
        for qp in &mut data.qps.qps[first..first + layout.count(rail)] {
            if let Err(e) = qp.fail() {
                warn!(log::NET, "{}: {e}", self.info.describe_peer());
            }
        }
    }

    /// The survivor of a failover (the connection's rail that has not failed).
    pub(super) fn survivor(&self, data: &SendData) -> Option<Rail> {
        let live = self.info.layout.rails().bits() & !data.slots.down().bits();
        Rail::ALL
            .into_iter()
            .find(|rail| live & crate::proto::rail_mask::RailMask::of(*rail).bits() != 0)
    }

    /// Writes the pending notice into the receiver's mailbox over the survivor's first QP,
    /// when it has a send credit (else on a later call).
    fn post_notice(&self, data: &mut SendData) -> Result<()> {
        let Some(notice) = data.failover.notice else {
            return Ok(());
        };
        let records = data.records.region();
        records.write_bytes(NOTICE_MAILBOX, &notice.encode());
        let survivor = notice.failed.other();
        let sge = Sge {
            addr: records.addr_of(NOTICE_MAILBOX),
            length: FAILOVER_NOTICE_LEN as u32,
            lkey: data.records.keys(survivor).lkey,
        };
        if self.post_control_write(data, survivor, NOTICE_MAILBOX, Some(sge), WRITE_MESSAGE)? {
            data.failover.notice = None;
        }
        Ok(())
    }

    /// One signalled RDMA write on `survivor`'s first QP into the receiver's records at
    /// `mailbox` (a record index: the notice's, or failback's offer): `sge`'s bytes, or none (a
    /// probe). `Ok(false)` without a send credit.
    pub(super) fn post_control_write(
        &self,
        data: &mut SendData,
        survivor: Rail,
        mailbox: usize,
        sge: Option<Sge>,
        what: u8,
    ) -> Result<bool> {
        let qp = self.info.layout.first(survivor);
        let Some(post_index) = data.qps.credits[qp].reserve(1) else {
            return Ok(false);
        };
        let wr = MailboxWrite {
            rail: survivor,
            qp_index: qp as u8,
            post_index,
            remote_addr: data.remote_records + (mailbox * COMPLETION_RECORD_SIZE) as u64,
            rkey: data.remote_records_rkeys[survivor.index()],
        }
        .request(sge, what);
        // SAFETY: the SGE lies in `records`, owned and registered by this comm, and its mailbox
        // is written again only for a later failover; the remote range is the receiver's
        // mailbox, inside the records it registered (handshake).
        let posted = unsafe { data.qps.qps[qp].post_send(std::slice::from_ref(&wr)) };
        posted.map_err(|e| {
            let error = Error::from(e).context(self.info.describe_peer());
            data.fail(&error);
            error
        })?;
        Ok(true)
    }

    /// What the peer watch asks (`watch`): nothing, or, after the control connection's path
    /// died, fail its rail over, or probe the receiver's QP on the survivor (one probe in
    /// flight at a time; an error completion of it finds no rail left and fails the comm).
    pub(super) fn act_on_watch(&self, data: &mut SendData, watch: Watch) -> Result<()> {
        match watch {
            Watch::Fine => Ok(()),
            Watch::PathFailed(rail) => {
                let why = Error::remote(format!(
                    "{}: the control connection over the {rail} rail timed out",
                    self.info.describe_peer()
                ));
                self.rail_failed(data, rail, why)?;
                self.post_ready(data)
            }
            Watch::Probe => {
                let Some(survivor) = self.survivor(data) else {
                    return Ok(());
                };
                if !data.failover.probing {
                    data.failover.probing =
                        self.post_control_write(data, survivor, NOTICE_MAILBOX, None, WRITE_PROBE)?;
                }
                Ok(())
            }
        }
    }

    /// A failover write completed (a notice, or a probe: the peer is there).
    pub(super) fn control_write_done(&self, data: &mut SendData, wr: WrId) {
        if let Some(credits) = data.qps.credits.get_mut(wr.qp_index as usize) {
            credits.retire(wr.post_index);
        }
        if wr.slot == WRITE_PROBE {
            data.failover.probing = false;
        }
    }

    /// Takes the receiver's report once it is in the mailbox: the transfers it settles are
    /// done, those it awaits are replayed (`post_failover`).
    pub(super) fn check_report(&self, data: &mut SendData) -> Result<()> {
        let fifo = data.fifo.region();
        let seal = fifo.read_word(REPORT_MAILBOX, REPORT_SEAL_WORD);
        if seal == 0 || seal == data.failover.report_seal {
            return Ok(());
        }
        let bytes = fifo.read_bytes::<FAILOVER_REPORT_LEN>(REPORT_MAILBOX);
        let report = match FailoverReport::decode(&bytes) {
            Ok(report) if self.info.failover => report,
            Ok(_) => {
                return Err(self.protocol_error(
                    data,
                    "a failover report on a connection that does not fail over",
                ))
            }
            Err(FailoverError::Unsealed) => return Ok(()),
            Err(e) => return Err(self.protocol_error(data, &format!("failover report: {e}"))),
        };
        data.failover.report_seal = seal;
        if !data.slots.down().contains(report.failed) {
            // The receiver found the failure first: nothing more leaves on the rail here either.
            warn!(
                log::NET,
                "{}: the receiver reports the {} rail failed; going on over the {} rail alone (failover)",
                self.info.describe_peer(),
                report.failed,
                report.failed.other()
            );
            data.peer.rail_failed(report.failed);
            self.stop_rail(data, report.failed);
            data.failover.begin_episode(report.failed);
        }
        let done = data.slots.on_report(&report).map_err(|e| {
            // The report names a failure that leaves no rail here (the two ends lost different
            // rails): the connection is over.
            let error = self.slot_error(e);
            data.fail(&error);
            error
        })?;
        if data.failover.episode.rail == Some(report.failed) {
            data.failover.episode.reported_ns = now_ns();
        }
        for slot in done.iter() {
            self.slot_done(data, slot);
        }
        Ok(())
    }

    /// Records the failover under way once it settled (every replay the report asked for done)
    /// as an event (`mpib_probes::FailoverEvent`), which the collector exports as a span.
    pub(super) fn finish_episode(&self, data: &mut SendData, now: u64) {
        let episode = data.failover.episode;
        let Some(rail) = episode.rail else {
            return;
        };
        if episode.reported_ns == 0 || !data.slots.settled() {
            return;
        }
        data.failover.episode = Episode::default();
        let telemetry = data.telemetry.telemetry();
        let event = mpib_probes::FailoverEvent {
            direction: mpib_probes::Direction::Send,
            rail: rail.index(),
            conn_index: data.telemetry.index(),
            detected_ns: telemetry.epoch_ns(episode.detected_ns),
            reported_ns: telemetry.epoch_ns(episode.reported_ns),
            resumed_ns: telemetry.epoch_ns(now),
            replayed_transfers: episode.replayed_transfers,
            replayed_bytes: episode.replayed_bytes,
            epoch: data.failover.episodes,
            peer: self.info.peer,
            device: u8::try_from(self.info.device_index).unwrap_or(u8::MAX),
        };
        telemetry.record(&event.record());
    }

    /// Fails the connection for a failover message the receiver should not have written.
    fn protocol_error(&self, data: &mut SendData, what: &str) -> Error {
        let error = Error::remote(format!("{}: {what}", self.info.describe_peer()));
        data.fail(&error);
        error
    }

    /// Posts the notice if it waits, and the replays the last report asked for, while the
    /// survivor's QPs have credits.
    pub(super) fn post_failover(&self, data: &mut SendData) -> Result<()> {
        if data.slots.down().is_empty() {
            return Ok(());
        }
        self.post_notice(data)?;
        let Some(survivor) = self.survivor(data) else {
            return Ok(());
        };
        while let Some(slot) = data.slots.next_replay() {
            if !self.post_replay(data, slot, survivor)? {
                break;
            }
        }
        Ok(())
    }

    /// Posts `slot` again, whole, on `survivor`'s QP its first post used there, under a
    /// replay's immediate; `Ok(false)` when credits are short.
    fn post_replay(&self, data: &mut SendData, slot: usize, survivor: Rail) -> Result<bool> {
        let record = self.record_target(data, slot);
        let state = data.slots.slot(slot);
        let qp = self
            .info
            .layout
            .qp_for_request(state.seq(), survivor)
            .ok_or_else(|| Error::internal(format!("no {survivor} QP to replay on")))?;
        let mut plan = post_plan::plan_on(slot as u8, state, survivor, record, true);
        let needed = plan.lengths[survivor.index()] as u32;
        if data.qps.credits[qp].available() < needed {
            return Ok(false);
        }
        if let Some(record) = plan.record {
            data.records.region().write(slot, record);
        }
        self.post_chain(data, survivor, qp, slot, plan.chain_mut(survivor))?;
        data.slots.replayed(slot).map_err(|e| self.slot_error(e))?;
        let clock = &mut data.busy[survivor.index()];
        clock.posted(now_ns());
        data.telemetry
            .set_rail_in_flight(survivor, clock.in_flight());
        let probe = data.telemetry.rail(survivor);
        probe.add(RAIL_TX_BYTES, plan.rail_bytes[survivor.index()]);
        probe.add(RAIL_REPLAYED_BYTES, plan.rail_bytes[survivor.index()]);
        data.failover.episode.replayed_transfers += 1;
        data.failover.episode.replayed_bytes += plan.rail_bytes[survivor.index()];
        probe.add(RAIL_WORK_REQUESTS, u64::from(needed));
        Ok(true)
    }
}

impl SendFailover {
    /// This end found `rail` failed now: a failover begins.
    fn begin_episode(&mut self, rail: Rail) {
        self.episodes += 1;
        self.episode = Episode {
            rail: Some(rail),
            detected_ns: now_ns(),
            ..Episode::default()
        };
    }
}
