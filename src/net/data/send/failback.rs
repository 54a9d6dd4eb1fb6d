//! The sender's part of a failback (docs/PROTOCOL.md §11): while a rail is down and its
//! failover settled, it is tried again when the clock (`proto::failback::FailbackTimer`) says
//! so: the peer's address on it resolved, new QPs made in place of the failed ones, an offer
//! written into the receiver's mailbox over the survivor, its answer's QPs connected, and a
//! zero-byte write acknowledged on each new QP. Then the rail is back and new transfers split
//! over both rails. Every wait is a state polled across calls; an attempt that is refused,
//! fails or outlives `MPIB_FAILBACK_ATTEMPT_MS` is given up and tried again later.

use super::{SendComm, SendData};
use crate::error::{Error, Result};
use crate::fabric::{Completion, Endpoint, PeerResolution, Rail, Sge};
use crate::log;
use crate::net::data::request::now_ns;
use crate::net::setup::resources::{create_rail_queue_pairs, remember_stale};
use crate::proto::cts::COMPLETION_RECORD_SIZE;
use crate::proto::failback::{
    FailbackTimer, RestoreError, RestoreMessage, ANSWER_MAILBOX, OFFER_MAILBOX,
    RESTORE_MESSAGE_LEN, WRITE_RESTORE_PROBE,
};
use crate::proto::failover::{MailboxWrite, WRITE_MESSAGE};
use crate::proto::wr_id::{WrId, WrKind};

/// The answer's last word, its seal (read first, so a reader that sees it reads the whole).
const ANSWER_SEAL_WORD: usize = RESTORE_MESSAGE_LEN / 8 - 1;

/// Where an attempt stands.
enum Phase {
    /// The peer's address on the rail is being resolved (a connect must not wait for it).
    Resolving(Box<dyn PeerResolution>),
    /// The offer is out (or waits for a send credit); the answer is awaited.
    Offered { posted: bool },
    /// The new QPs are connected; `left` of their probe writes are not acknowledged yet.
    Probing { left: usize },
}

/// What the sender keeps of failbacks between calls.
pub(super) struct SendFailback {
    /// Each rail's clock (one rail's relapses are not the other's); `None`: this side does not
    /// bring rails back (`MPIB_FAILBACK=0`, or no failover).
    timers: Option<[FailbackTimer; 2]>,
    attempt: Option<(u32, Rail, Phase)>,
    /// Port changes of each rail's NIC seen so far (`DeviceHealth::port`).
    port_seen: [u64; 2],
    /// The seal of the last answer taken.
    answer_seal: u64,
    /// Rails and numbers of QPs replaced by a failback's: their completions are ignored (QP
    /// numbers are per NIC: the survivor's may be the same).
    stale: Vec<(Rail, u32)>,
}

impl SendFailback {
    /// Failback with `timer`'s settings (one clock per rail), or none.
    pub(super) fn new(timer: Option<FailbackTimer>) -> SendFailback {
        SendFailback {
            timers: timer.map(|timer| [timer; 2]),
            attempt: None,
            port_seen: [0; 2],
            answer_seal: 0,
            stale: Vec::new(),
        }
    }

    /// Whether `completion`, on `rail`, comes from a QP a failback replaced (nothing it says
    /// matters).
    #[inline]
    pub(super) fn is_stale(&self, rail: Rail, completion: &Completion) -> bool {
        !self.stale.is_empty() && self.stale.contains(&(rail, completion.qp_num))
    }
}

impl SendComm {
    /// Moves a failback on: starts an attempt when one is due and the failover settled, and
    /// steps the attempt under way (resolution, offer, answer; its deadline).
    pub(super) fn advance_failback(&self, data: &mut SendData, now: u64) -> Result<()> {
        let Some(rail) = data.slots.down().leader() else {
            return Ok(());
        };
        let Some(timers) = data.failback.timers.as_mut() else {
            return Ok(());
        };
        let timer = &mut timers[rail.index()];
        if timer.is_up() {
            timer.failed(now);
        }
        let (changes, up) = self.info.health[rail.index()].port();
        if changes != data.failback.port_seen[rail.index()] {
            data.failback.port_seen[rail.index()] = changes;
            let trying = timer.trying().is_some();
            timer.port(up, now);
            if !up && trying {
                self.give_up(data, now, "its port went down again")?;
                // No try while the port is down: the next waits for it to come back.
                if let Some(timers) = data.failback.timers.as_mut() {
                    timers[rail.index()].port(false, now);
                }
                return Ok(());
            }
        }
        if timer.expired(now) {
            return self.give_up(
                data,
                now,
                "it did not finish within MPIB_FAILBACK_ATTEMPT_MS",
            );
        }
        match data.failback.attempt.take() {
            None => {
                // The clock first: `settled` walks the 256 slots, and a rail may stay down for
                // hours of `test` calls.
                let due = timer.due(now) && data.slots.down().count() == 1;
                if due && data.failover.notice.is_none() && data.slots.settled() {
                    self.start_attempt(data, rail, now)?;
                }
                Ok(())
            }
            Some((attempt, rail, Phase::Resolving(mut resolution))) => match resolution.poll() {
                // Unconfirmed: the wait for a local peer ran out, and connecting would wait
                // inside the call; the attempt's deadline ends it if it never resolves.
                Ok(true) if resolution.confirmed() => self.offer(data, attempt, rail, now),
                Ok(_) => {
                    data.failback.attempt = Some((attempt, rail, Phase::Resolving(resolution)));
                    Ok(())
                }
                Err(e) => self.give_up(data, now, &format!("{e}")),
            },
            Some((attempt, rail, Phase::Offered { posted })) => {
                data.failback.attempt = Some((attempt, rail, Phase::Offered { posted }));
                if !posted {
                    return self.post_offer(data, attempt, rail, now);
                }
                self.check_answer(data, now)
            }
            Some(probing) => {
                data.failback.attempt = Some(probing);
                Ok(())
            }
        }
    }

    /// Starts attempt number `timer.start()` on `rail`: resolves the peer's address there.
    fn start_attempt(&self, data: &mut SendData, rail: Rail, now: u64) -> Result<()> {
        let Some(timers) = data.failback.timers.as_mut() else {
            return Ok(());
        };
        let attempt = timers[rail.index()].start(now);
        let peer = Endpoint(self.info.renewal.peer_rails[rail.index()].endpoint);
        match self.info.devices[rail.index()].resolve_peer(&peer) {
            Ok(resolution) => {
                data.failback.attempt = Some((attempt, rail, Phase::Resolving(resolution)));
                Ok(())
            }
            Err(e) => self.give_up(data, now, &format!("{e}")),
        }
    }

    /// Makes the new QPs in place of the failed ones and offers them.
    fn offer(&self, data: &mut SendData, attempt: u32, rail: Rail, now: u64) -> Result<()> {
        let layout = self.info.layout;
        let Some(queues) = data.queues[rail.index()].as_ref() else {
            return Err(Error::internal(format!(
                "failback of {rail}, which has no CQ"
            )));
        };
        let device = self.info.devices[rail.index()].as_ref();
        let created = create_rail_queue_pairs(
            device,
            queues,
            layout,
            self.info.renewal.sizing,
            rail,
            self.info.renewal.secret,
        );
        let (qps, credits) = match created {
            Ok(made) => made,
            Err(e) => return self.give_up(data, now, &e.to_string()),
        };
        let current: Vec<u32> = qps.iter().map(|qp| qp.qp_num()).collect();
        let replaced = data.qps.replace_rail(layout, rail, qps, credits)?;
        remember_stale(&mut data.failback.stale, rail, replaced, &current);
        data.failback.attempt = Some((attempt, rail, Phase::Offered { posted: false }));
        self.post_offer(data, attempt, rail, now)
    }

    /// Writes the offer naming this side's new QPs into the receiver's mailbox over the
    /// survivor (or on a later call, without a send credit).
    fn post_offer(&self, data: &mut SendData, attempt: u32, rail: Rail, now: u64) -> Result<()> {
        let layout = self.info.layout;
        let first = layout.first(rail);
        let qp_nums: Vec<u32> = data.qps.qps[first..first + layout.count(rail)]
            .iter()
            .map(|qp| qp.qp_num())
            .collect();
        let offer = match RestoreMessage::new(attempt, rail, &qp_nums) {
            Ok(offer) => offer,
            Err(e) => return self.give_up(data, now, &e.to_string()),
        };
        let records = data.records.region();
        records.write_bytes(OFFER_MAILBOX, &offer.encode_offer());
        let survivor = rail.other();
        let sge = Sge {
            addr: records.addr_of(OFFER_MAILBOX),
            length: RESTORE_MESSAGE_LEN as u32,
            lkey: data.records.keys(survivor).lkey,
        };
        let posted =
            self.post_control_write(data, survivor, OFFER_MAILBOX, Some(sge), WRITE_MESSAGE)?;
        data.failback.attempt = Some((attempt, rail, Phase::Offered { posted }));
        Ok(())
    }

    /// Takes the receiver's answer once it is in the mailbox: connects the new QPs to the ones
    /// it names and probes each, or gives the attempt up if it names none.
    fn check_answer(&self, data: &mut SendData, now: u64) -> Result<()> {
        let fifo = data.fifo.region();
        let seal = fifo.read_word(ANSWER_MAILBOX, ANSWER_SEAL_WORD);
        if seal == 0 || seal == data.failback.answer_seal {
            return Ok(());
        }
        let bytes = fifo.read_bytes::<RESTORE_MESSAGE_LEN>(ANSWER_MAILBOX);
        let answer = match RestoreMessage::decode_answer(&bytes) {
            Ok(answer) => answer,
            Err(RestoreError::Unsealed) => return Ok(()),
            Err(e) => {
                let error = Error::remote(format!(
                    "{}: failback answer: {e}",
                    self.info.describe_peer()
                ));
                data.fail(&error);
                return Err(error);
            }
        };
        data.failback.answer_seal = seal;
        let Some((attempt, rail, _)) = data.failback.attempt else {
            return Ok(());
        };
        if !answer.answers(attempt, rail) {
            return Ok(()); // an earlier attempt's answer, late
        }
        if answer.qp_nums().is_empty() {
            return self.give_up(
                data,
                now,
                "the receiver refused it (its failover is not over)",
            );
        }
        let renewal = &self.info.renewal;
        let connected = data.qps.connect_rail(
            self.info.layout,
            rail,
            &renewal.peer_rails[rail.index()],
            answer.qp_nums(),
            &renewal.qp_settings,
        );
        if let Err(e) = connected {
            return self.give_up(data, now, &e.to_string());
        }
        self.post_probes(data, attempt, rail)
    }

    /// A zero-byte signalled write on each new QP: acknowledged, the path works both ways.
    fn post_probes(&self, data: &mut SendData, attempt: u32, rail: Rail) -> Result<()> {
        let layout = self.info.layout;
        let first = layout.first(rail);
        let count = layout.count(rail);
        for qp in first..first + count {
            let Some(post_index) = data.qps.credits[qp].reserve(1) else {
                return Err(Error::internal("a new QP without a send credit"));
            };
            let wr = MailboxWrite {
                rail,
                qp_index: qp as u8,
                post_index,
                remote_addr: data.remote_records + (OFFER_MAILBOX * COMPLETION_RECORD_SIZE) as u64,
                rkey: data.remote_records_rkeys[rail.index()],
            }
            .request(None, WRITE_RESTORE_PROBE);
            // SAFETY: no local memory (zero bytes); the remote range is the receiver's mailbox,
            // inside the records it registered on both rails (handshake).
            let posted = unsafe { data.qps.qps[qp].post_send(std::slice::from_ref(&wr)) };
            if let Err(e) = posted {
                return self.give_up(data, now_ns(), &Error::from(e).to_string());
            }
        }
        data.failback.attempt = Some((attempt, rail, Phase::Probing { left: count }));
        Ok(())
    }

    /// A restore probe completed, well (`true`) or not: the rail is back once every probe of
    /// the attempt is acknowledged; a failed one gives the attempt up.
    pub(super) fn restore_probe_done(
        &self,
        data: &mut SendData,
        wr: WrId,
        acknowledged: bool,
        now: u64,
    ) -> Result<()> {
        if let Some(credits) = data.qps.credits.get_mut(wr.qp_index as usize) {
            credits.retire(wr.post_index);
        }
        let Some((attempt, rail, Phase::Probing { left })) = data.failback.attempt.take() else {
            return Ok(()); // an attempt given up: its probes flushed
        };
        if !acknowledged {
            data.failback.attempt = Some((attempt, rail, Phase::Probing { left }));
            return self.give_up(
                data,
                now,
                "a write on a new queue pair was not acknowledged",
            );
        }
        if left > 1 {
            data.failback.attempt = Some((attempt, rail, Phase::Probing { left: left - 1 }));
            return Ok(());
        }
        data.slots
            .rail_restored(rail)
            .map_err(|e| self.slot_error(e))?;
        if let Some(timers) = data.failback.timers.as_mut() {
            timers[rail.index()].restored(now);
        }
        data.telemetry.rail_restored(rail);
        info!(
            log::NET,
            "{}: the {rail} rail is back (attempt {attempt}); new transfers split over both rails again (failback)",
            self.info.describe_peer()
        );
        Ok(())
    }

    /// Gives the attempt under way up (`why`): its new QPs go to the error state (their probes
    /// flush) and the next attempt waits longer.
    fn give_up(&self, data: &mut SendData, now: u64, why: &str) -> Result<()> {
        let Some(rail) = data.slots.down().leader() else {
            return Ok(());
        };
        if let Some(timers) = data.failback.timers.as_mut() {
            timers[rail.index()].attempt_failed(now);
        }
        let Some((attempt, rail, phase)) = data.failback.attempt.take() else {
            return Ok(());
        };
        if !matches!(phase, Phase::Resolving(_)) {
            let layout = self.info.layout;
            let first = layout.first(rail);
            for qp in &mut data.qps.qps[first..first + layout.count(rail)] {
                let _ = qp.fail();
            }
        }
        // One WARN per attempt: attempts are spaced by the backoff (`MPIB_FAILBACK_*`).
        warn!(
            log::NET,
            "{}: bringing the {rail} rail back (attempt {attempt}) failed: {why}; trying again later (failback)",
            self.info.describe_peer()
        );
        Ok(())
    }

    /// Whether a failed completion is a restore probe's (handled here, whatever its rail).
    pub(super) fn failed_restore_probe(
        &self,
        data: &mut SendData,
        completion: &Completion,
    ) -> Result<bool> {
        let Ok(wr) = WrId::unpack(completion.wr_id) else {
            return Ok(false);
        };
        if wr.kind != WrKind::Failover || wr.slot != WRITE_RESTORE_PROBE {
            return Ok(false);
        }
        self.restore_probe_done(data, wr, false, now_ns())?;
        Ok(true)
    }
}
