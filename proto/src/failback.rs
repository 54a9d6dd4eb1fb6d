//! Failback: a rail that failed over comes back (docs/PROTOCOL.md §11). What the two sides tell
//! each other to bring it back, and when the sender tries.
//!
//! The sender drives it. While a rail is down and its failover is settled (the report taken,
//! every transfer that rode the rail done or replayed: `crate::send_slots::SendSlots::settled`),
//! it creates new queue pairs on the rail and writes a [`RestoreOffer`] with their numbers into
//! the receiver's offer mailbox over the survivor. The receiver, once nothing of the failover
//! is left on its side (`crate::recv_slots::RecvSlots::can_restore`), creates its own new queue
//! pairs, connects them, takes the rail back for IMMs, and answers with a [`RestoreAnswer`]
//! naming them (an answer naming none refuses). The sender connects its queue pairs and sends a
//! zero-byte write on each: when every one is acknowledged the path works both ways and new
//! transfers are split over both rails again. An attempt that is refused, fails or takes longer
//! than its deadline is given up (its queue pairs destroyed) and tried again later; the
//! [`FailbackTimer`] says when.
//!
//! Why the sender drives and the receiver takes the rail back first: the receiver must hold
//! receives for IMMs on the rail before the first one comes, and only the sender knows when it
//! will send one — after the answer and the probes.

use crate::rail::Rail;

/// Bytes of an offer or an answer as written (they span two mailbox entries).
pub const RESTORE_MESSAGE_LEN: usize = 80;
/// Queue pairs one message names at most (the most a rail may have: `MPIB_SOUT_QP`'s bound).
pub const RESTORE_MAX_QPS: usize = 16;

/// Where the sender writes its offer: the completion records just past the failover notice's
/// mailbox (`crate::failover::NOTICE_MAILBOX`); two records long.
pub const OFFER_MAILBOX: usize = crate::failover::NOTICE_MAILBOX + 1;
/// Where the receiver writes its answer: the CTS FIFO entries just past the failover report's
/// mailbox (`crate::failover::REPORT_MAILBOX`); two entries long.
pub const ANSWER_MAILBOX: usize = crate::failover::REPORT_MAILBOX + 1;
/// Completion records a sender's records region holds: the FIFO slots' and the mailboxes.
pub const RECORDS_LEN: usize = OFFER_MAILBOX + 2;
/// CTS entries a FIFO holds: the FIFO's and the mailboxes.
pub const FIFO_LEN: usize = ANSWER_MAILBOX + 2;

const _: () = assert!(RESTORE_MESSAGE_LEN <= 2 * crate::cts::COMPLETION_RECORD_SIZE);
const _: () = assert!(RESTORE_MESSAGE_LEN <= 2 * crate::cts::CTS_ENTRY_SIZE);
const _: () = assert!(8 + 4 * RESTORE_MAX_QPS + 8 == RESTORE_MESSAGE_LEN);

/// The `slot` byte of a restore probe's `wr_id` (`crate::wr_id::WrKind::Failover`): a
/// zero-byte write on a new queue pair (its `post_index` is the QP's send credit, as for any
/// write; the attempt it belongs to is the one whose QPs are in place).
pub const WRITE_RESTORE_PROBE: u8 = 2;

const OFFER_MAGIC: u32 = 0x4D50_524F; // "MPRO"
const ANSWER_MAGIC: u32 = 0x4D50_5241; // "MPRA"

/// A restore message that does not decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RestoreError {
    /// Not (yet all) written: the magic or the seal does not match (the reader looks again).
    Unsealed,
    /// A rail index that does not exist.
    BadRail(u8),
    /// More queue pairs than a rail may have.
    TooManyQueuePairs(u8),
}

impl std::fmt::Display for RestoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RestoreError::Unsealed => write!(f, "restore message not (fully) written"),
            RestoreError::BadRail(rail) => write!(f, "restore message names rail {rail}"),
            RestoreError::TooManyQueuePairs(count) => write!(
                f,
                "restore message names {count} queue pairs (at most {RESTORE_MAX_QPS})"
            ),
        }
    }
}

impl std::error::Error for RestoreError {}

/// The queue pairs one side created for a rail's return, in layout order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RestoreMessage {
    /// The sender's attempt (counted from 1 per connection); an answer repeats its offer's.
    pub attempt: u32,
    /// The rail to bring back.
    pub rail: Rail,
    count: u8,
    qp_nums: [u32; RESTORE_MAX_QPS],
}

/// Sender → receiver: "here are my new queue pairs on `rail`".
pub type RestoreOffer = RestoreMessage;
/// Receiver → sender: "here are mine", or none: "not now".
pub type RestoreAnswer = RestoreMessage;

impl RestoreMessage {
    /// A message naming `qp_nums` (at most [`RESTORE_MAX_QPS`]; none in a refusal).
    pub fn new(attempt: u32, rail: Rail, qp_nums: &[u32]) -> Result<RestoreMessage, RestoreError> {
        if qp_nums.len() > RESTORE_MAX_QPS {
            return Err(RestoreError::TooManyQueuePairs(qp_nums.len().min(255) as u8));
        }
        let mut numbers = [0; RESTORE_MAX_QPS];
        numbers[..qp_nums.len()].copy_from_slice(qp_nums);
        Ok(RestoreMessage {
            attempt,
            rail,
            count: qp_nums.len() as u8,
            qp_nums: numbers,
        })
    }

    /// The queue pairs it names, in layout order (none: a refusal).
    pub fn qp_nums(&self) -> &[u32] {
        &self.qp_nums[..usize::from(self.count)]
    }

    /// Whether it answers attempt `attempt` on `rail` (a message carries the attempt's low 16
    /// bits: an answer to attempt 65,537 names 1, and the sender compares the same way).
    pub fn answers(&self, attempt: u32, rail: Rail) -> bool {
        self.attempt & 0xFFFF == attempt & 0xFFFF && self.rail == rail
    }

    /// The offer as written: magic, attempt, rail, count, the numbers, then the seal.
    pub fn encode_offer(&self) -> [u8; RESTORE_MESSAGE_LEN] {
        self.encode(OFFER_MAGIC)
    }

    /// The answer as written (as an offer, under the answer's magic).
    pub fn encode_answer(&self) -> [u8; RESTORE_MESSAGE_LEN] {
        self.encode(ANSWER_MAGIC)
    }

    /// The offer in `bytes`, once sealed.
    pub fn decode_offer(bytes: &[u8; RESTORE_MESSAGE_LEN]) -> Result<RestoreOffer, RestoreError> {
        Self::decode(bytes, OFFER_MAGIC)
    }

    /// The answer in `bytes`, once sealed.
    pub fn decode_answer(bytes: &[u8; RESTORE_MESSAGE_LEN]) -> Result<RestoreAnswer, RestoreError> {
        Self::decode(bytes, ANSWER_MAGIC)
    }

    fn encode(&self, magic: u32) -> [u8; RESTORE_MESSAGE_LEN] {
        let mut bytes = [0u8; RESTORE_MESSAGE_LEN];
        bytes[0..4].copy_from_slice(&magic.to_le_bytes());
        bytes[4..6].copy_from_slice(&(self.attempt as u16).to_le_bytes());
        bytes[6] = self.rail.index() as u8;
        bytes[7] = self.count;
        for (index, qp_num) in self.qp_nums.iter().enumerate() {
            bytes[8 + 4 * index..12 + 4 * index].copy_from_slice(&qp_num.to_le_bytes());
        }
        let seal = seal(magic, self.attempt & 0xFFFF);
        bytes[RESTORE_MESSAGE_LEN - 8..].copy_from_slice(&seal.to_le_bytes());
        bytes
    }

    fn decode(bytes: &[u8; RESTORE_MESSAGE_LEN], magic: u32) -> Result<Self, RestoreError> {
        let attempt = u32::from(u16::from_le_bytes([bytes[4], bytes[5]]));
        let mut sealed = [0u8; 8];
        sealed.copy_from_slice(&bytes[RESTORE_MESSAGE_LEN - 8..]);
        if bytes[0..4] != magic.to_le_bytes() || u64::from_le_bytes(sealed) != seal(magic, attempt)
        {
            return Err(RestoreError::Unsealed);
        }
        let rail =
            Rail::from_index(usize::from(bytes[6])).ok_or(RestoreError::BadRail(bytes[6]))?;
        let count = bytes[7];
        if usize::from(count) > RESTORE_MAX_QPS {
            return Err(RestoreError::TooManyQueuePairs(count));
        }
        let mut qp_nums = [0; RESTORE_MAX_QPS];
        for (index, qp_num) in qp_nums.iter_mut().enumerate() {
            let mut word = [0u8; 4];
            word.copy_from_slice(&bytes[8 + 4 * index..12 + 4 * index]);
            *qp_num = u32::from_le_bytes(word);
        }
        Ok(RestoreMessage {
            attempt,
            rail,
            count,
            qp_nums,
        })
    }
}

/// The last word, written last (as the failover messages' seal, `crate::failover`).
fn seal(magic: u32, attempt: u32) -> u64 {
    (u64::from(magic) << 32 | u64::from(attempt)) ^ 0x5EA1_BAC4_5EA1_BAC4
}

/// When the sender tries to bring a rail back (`MPIB_FAILBACK_*`), in nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FailbackSettings {
    /// Hold-down: a rail is tried no sooner than this after it failed, or after its port came
    /// back (a port that goes down again within it starts it again).
    pub hold_ns: u64,
    /// The longest wait between two attempts (a failed attempt doubles the wait up to it; a
    /// rail that fails again soon after it came back doubles its hold-down up to it).
    pub backoff_max_ns: u64,
    /// An attempt not done by then is given up.
    pub attempt_ns: u64,
}

/// Where a rail's return stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// The rail is up (never failed, or back).
    Up,
    /// Down; the next attempt is due at `at` (u64::MAX: not before the port comes back).
    Waiting { at: u64 },
    /// Attempt `attempt` under way, given up at `deadline`.
    Trying { attempt: u32, deadline: u64 },
}

/// One rail's return, as a pure clock: what happened goes in, whether to try comes out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FailbackTimer {
    settings: FailbackSettings,
    stage: Stage,
    /// The hold-down now in force (the setting, doubled by each quick relapse).
    hold_ns: u64,
    /// The wait after the next failed attempt.
    backoff_ns: u64,
    attempts: u32,
    /// When the rail last came back (0: never).
    restored_at: u64,
}

impl FailbackTimer {
    /// A rail that is up.
    pub fn new(settings: FailbackSettings) -> FailbackTimer {
        FailbackTimer {
            settings,
            stage: Stage::Up,
            hold_ns: settings.hold_ns,
            backoff_ns: settings.hold_ns,
            attempts: 0,
            restored_at: 0,
        }
    }

    /// The rail failed over at `now`: the first attempt is a hold-down away, a longer one when
    /// the rail had come back less than ten hold-downs before (a flapping rail does not thrash).
    pub fn failed(&mut self, now: u64) {
        if self.stage != Stage::Up {
            return;
        }
        let relapse = self.restored_at != 0
            && now.saturating_sub(self.restored_at) < self.settings.hold_ns.saturating_mul(10);
        self.hold_ns = match relapse {
            true => self
                .hold_ns
                .saturating_mul(2)
                .min(self.settings.backoff_max_ns),
            false => self.settings.hold_ns,
        };
        self.backoff_ns = self.hold_ns;
        self.stage = Stage::Waiting {
            at: now.saturating_add(self.hold_ns),
        };
    }

    /// The local port of the rail went down (`false`) or came back (`true`) at `now`: no
    /// attempt while it is down; one a hold-down after it is back.
    pub fn port(&mut self, up: bool, now: u64) {
        if let Stage::Waiting { at } = &mut self.stage {
            *at = match up {
                true => now.saturating_add(self.hold_ns),
                false => u64::MAX,
            };
            self.backoff_ns = self.hold_ns;
        }
    }

    /// Whether an attempt should start now.
    #[inline]
    pub fn due(&self, now: u64) -> bool {
        matches!(self.stage, Stage::Waiting { at } if now >= at)
    }

    /// An attempt starts at `now`: its number (from 1).
    pub fn start(&mut self, now: u64) -> u32 {
        self.attempts = self.attempts.wrapping_add(1).max(1);
        self.stage = Stage::Trying {
            attempt: self.attempts,
            deadline: now.saturating_add(self.settings.attempt_ns),
        };
        self.attempts
    }

    /// The attempt under way, if one is.
    #[inline]
    pub fn trying(&self) -> Option<u32> {
        match self.stage {
            Stage::Trying { attempt, .. } => Some(attempt),
            _ => None,
        }
    }

    /// Whether the attempt under way is past its deadline.
    #[inline]
    pub fn expired(&self, now: u64) -> bool {
        matches!(self.stage, Stage::Trying { deadline, .. } if now >= deadline)
    }

    /// The attempt under way was refused, failed or expired at `now`: the next one waits twice
    /// as long as the last wait, up to the cap.
    pub fn attempt_failed(&mut self, now: u64) {
        if self.trying().is_none() {
            return;
        }
        self.stage = Stage::Waiting {
            at: now.saturating_add(self.backoff_ns),
        };
        self.backoff_ns = self
            .backoff_ns
            .saturating_mul(2)
            .min(self.settings.backoff_max_ns);
    }

    /// The rail came back at `now`.
    pub fn restored(&mut self, now: u64) {
        self.stage = Stage::Up;
        self.restored_at = now.max(1);
    }

    /// Whether the rail is up (never failed, or came back).
    #[inline]
    pub fn is_up(&self) -> bool {
        self.stage == Stage::Up
    }
}

#[cfg(test)]
#[path = "failback_tests.rs"]
mod tests;
