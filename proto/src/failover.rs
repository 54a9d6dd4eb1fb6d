//! Failover: a connection goes on over the surviving rail when the other fails
//! (docs/PROTOCOL.md §10). What the two sides tell each other, as fixed-size messages each side
//! writes into the other's memory over the survivor; the slot state machines act on them
//! (`crate::send_slots`, `crate::recv_slots`).
//!
//! Why the receiver decides: a sender's error completion on the failed rail says nothing about
//! whether the data arrived (the acknowledgement may be what was lost), and replaying data the
//! receiver already completed could overwrite a buffer NCCL has reused. So the receiver, once
//! nothing more can land on the failed rail (its queue pairs there are in error and their
//! completions drained), reports which of its outstanding receives may lack a part of the
//! failed rail ([`FailoverReport::awaiting`]): those that learned nothing yet, and those whose
//! IMM on the failed rail has not come; every other receive it had got its part there, or did
//! not use it. The sender replays,
//! whole and on the survivor, each awaiting transfer that used the failed rail, under an
//! immediate that marks it a replay (`crate::imm::Imm::replay`); the receiver completes an
//! awaiting receive on its replay, or on a first post that used the survivor alone, and ignores
//! what else arrives for it. A sender that sees the failure first asks for the report with a
//! [`FailoverNotice`].

use crate::cts::{COMPLETION_RECORD_SIZE, CTS_ENTRY_SIZE, FIFO_SLOTS, MAX_RECVS};
use crate::rail::Rail;
use crate::work::{SendOpcode, Sge, WorkRequest};
use crate::wr_id::{WrId, WrKind};

/// Bytes of a [`FailoverNotice`] as written.
pub const FAILOVER_NOTICE_LEN: usize = 16;
/// Bytes of a [`FailoverReport`] as written.
pub const FAILOVER_REPORT_LEN: usize = 56;

/// Where the receiver writes its report: the entry of the sender's CTS FIFO just past its
/// `FIFO_SLOTS × MAX_RECVS` entries (the FIFO is one entry longer; the receiver writes it from the
/// same entry of its CTS shadow).
pub const REPORT_MAILBOX: usize = FIFO_SLOTS * MAX_RECVS;
/// Where the sender writes its notice: the completion record just past the receiver's
/// `FIFO_SLOTS` records (written from the same record of the sender's shadow).
pub const NOTICE_MAILBOX: usize = FIFO_SLOTS;

/// The `slot` byte of a failover write's `wr_id` (`crate::wr_id::WrKind::Failover`): a mailbox
/// message (a notice or a report)...
pub const WRITE_MESSAGE: u8 = 0;
/// ...or a probe: a zero-byte write that only a live peer's QP acknowledges, sent while the
/// control connection is gone, and to get send-queue credits back.
pub const WRITE_PROBE: u8 = 1;

/// Where a failover write goes: the peer's mailbox at `remote_addr` under `rkey`, posted as
/// `post_index` on the QP at `qp_index` of `rail`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MailboxWrite {
    /// The rail it goes on (the survivor).
    pub rail: Rail,
    /// The QP's place in the connection's QP array.
    pub qp_index: u8,
    /// The QP's running WR count after it (send-queue credits).
    pub post_index: u32,
    /// The mailbox's address in the peer's memory.
    pub remote_addr: u64,
    /// The peer's key for it on `rail`.
    pub rkey: u32,
}

impl MailboxWrite {
    /// The signalled RDMA write of `sge`'s bytes (a message: [`WRITE_MESSAGE`]) or of none (a
    /// probe: [`WRITE_PROBE`], `what`).
    #[inline]
    pub fn request(&self, sge: Option<Sge>, what: u8) -> WorkRequest {
        WorkRequest {
            wr_id: WrId {
                kind: WrKind::Failover,
                rail: self.rail,
                qp_index: self.qp_index,
                slot: what,
                post_index: self.post_index,
            }
            .pack(),
            opcode: SendOpcode::Write,
            sge,
            remote_addr: self.remote_addr,
            rkey: self.rkey,
            signaled: true,
            inline: false,
        }
    }
}

const _: () = assert!(FAILOVER_REPORT_LEN <= CTS_ENTRY_SIZE);
const _: () = assert!(FAILOVER_NOTICE_LEN <= COMPLETION_RECORD_SIZE);

const NOTICE_MAGIC: u32 = 0x4D50_464E; // "MPFN"
const REPORT_MAGIC: u32 = 0x4D50_4652; // "MPFR"

/// A set of FIFO slots (`0..256`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlotSet([u64; FIFO_SLOTS / 64]);

impl SlotSet {
    /// No slot.
    pub const EMPTY: SlotSet = SlotSet([0; FIFO_SLOTS / 64]);

    /// Adds `slot`.
    #[inline]
    pub fn insert(&mut self, slot: usize) {
        let slot = slot % FIFO_SLOTS;
        self.0[slot / 64] |= 1 << (slot % 64);
    }

    /// Removes `slot`.
    #[inline]
    pub fn remove(&mut self, slot: usize) {
        let slot = slot % FIFO_SLOTS;
        self.0[slot / 64] &= !(1 << (slot % 64));
    }

    /// Whether `slot` is in the set.
    #[inline]
    pub fn contains(&self, slot: usize) -> bool {
        let slot = slot % FIFO_SLOTS;
        self.0[slot / 64] & (1 << (slot % 64)) != 0
    }

    /// Whether the set is empty.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|word| *word == 0)
    }

    /// The lowest slot in the set.
    #[inline]
    pub fn first(&self) -> Option<usize> {
        let (index, word) = self.0.iter().enumerate().find(|(_, word)| **word != 0)?;
        Some(index * 64 + word.trailing_zeros() as usize)
    }

    /// The slots, lowest first.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        (0..FIFO_SLOTS).filter(|slot| self.contains(*slot))
    }
}

/// A failover message that does not decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailoverError {
    /// Not (yet all) written: the magic or the seal does not match (the reader looks again).
    Unsealed,
    /// A rail index that does not exist.
    BadRail(u8),
}

impl std::fmt::Display for FailoverError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FailoverError::Unsealed => write!(f, "failover message not (fully) written"),
            FailoverError::BadRail(rail) => write!(f, "failover message names rail {rail}"),
        }
    }
}

impl std::error::Error for FailoverError {}

fn rail_of(byte: u8) -> Result<Rail, FailoverError> {
    Rail::from_index(usize::from(byte)).ok_or(FailoverError::BadRail(byte))
}

fn word32(bytes: &[u8], at: usize) -> u32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(word)
}

fn word64(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(word)
}

/// The last word of a message, written last: a reader that sees it sees the whole message
/// (an RDMA write may become visible piecemeal, in ascending order, as the CTS relies on).
fn seal(magic: u32, epoch: u32) -> u64 {
    (u64::from(magic) << 32 | u64::from(epoch)) ^ 0x5EA1_5EA1_5EA1_5EA1
}

/// Sender → receiver: the sender's `failed` rail is down (its `epoch`-th failover); the
/// receiver answers with a [`FailoverReport`] (unless it sent one for that rail already).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FailoverNotice {
    /// Failovers on this connection so far, this one included (0: none, never written).
    pub epoch: u32,
    /// The rail that failed.
    pub failed: Rail,
}

impl FailoverNotice {
    /// The message as written: magic, epoch, rail, then the seal.
    pub fn encode(&self) -> [u8; FAILOVER_NOTICE_LEN] {
        let mut bytes = [0u8; FAILOVER_NOTICE_LEN];
        bytes[0..4].copy_from_slice(&NOTICE_MAGIC.to_le_bytes());
        bytes[4..6].copy_from_slice(&(self.epoch as u16).to_le_bytes());
        bytes[6] = self.failed.index() as u8;
        bytes[8..16].copy_from_slice(&seal(NOTICE_MAGIC, self.epoch & 0xFFFF).to_le_bytes());
        bytes
    }

    /// The message in `bytes`, once sealed.
    pub fn decode(bytes: &[u8; FAILOVER_NOTICE_LEN]) -> Result<FailoverNotice, FailoverError> {
        let epoch = u32::from(u16::from_le_bytes([bytes[4], bytes[5]]));
        if word32(bytes, 0) != NOTICE_MAGIC || word64(bytes, 8) != seal(NOTICE_MAGIC, epoch) {
            return Err(FailoverError::Unsealed);
        }
        Ok(FailoverNotice {
            epoch,
            failed: rail_of(bytes[6])?,
        })
    }
}

/// Receiver → sender: the `failed` rail is down from the receiver's `epoch`-th failover on;
/// `awaiting` are its outstanding receives that may lack their part on it, named by slot within
/// the 256 sequences before `head` (the receiver's next sequence when it reported). Every other
/// receive it had posted got that part, or did not use the rail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FailoverReport {
    /// Failovers on this connection so far, this one included.
    pub epoch: u32,
    /// The rail that failed.
    pub failed: Rail,
    /// The slots whose receives wait for the sender.
    pub awaiting: SlotSet,
    /// The receiver's next fifo sequence: slot `s` of `awaiting` is the sequence in
    /// `[head - 256, head)` that maps to it (a sender's slot in flight for an earlier use of `s`
    /// is not awaited).
    pub head: u64,
}

impl FailoverReport {
    /// The sequence slot `slot` of the report stands for, if any (none before sequence 0).
    #[inline]
    pub fn sequence_of(&self, slot: usize) -> Option<u64> {
        let back = (self.head as usize % FIFO_SLOTS + FIFO_SLOTS - slot % FIFO_SLOTS) % FIFO_SLOTS;
        let back = if back == 0 { FIFO_SLOTS } else { back };
        self.head.checked_sub(back as u64)
    }

    /// Whether the report awaits sequence `seq`.
    #[inline]
    pub fn awaits(&self, seq: u64) -> bool {
        let slot = (seq % FIFO_SLOTS as u64) as usize;
        self.awaiting.contains(slot) && self.sequence_of(slot) == Some(seq)
    }
}

impl FailoverReport {
    /// The message as written: magic, epoch, rail, the slot set, the head, then the seal.
    pub fn encode(&self) -> [u8; FAILOVER_REPORT_LEN] {
        let mut bytes = [0u8; FAILOVER_REPORT_LEN];
        bytes[0..4].copy_from_slice(&REPORT_MAGIC.to_le_bytes());
        bytes[4..6].copy_from_slice(&(self.epoch as u16).to_le_bytes());
        bytes[6] = self.failed.index() as u8;
        for (index, word) in self.awaiting.0.iter().enumerate() {
            bytes[8 + 8 * index..16 + 8 * index].copy_from_slice(&word.to_le_bytes());
        }
        bytes[40..48].copy_from_slice(&self.head.to_le_bytes());
        bytes[48..56].copy_from_slice(&seal(REPORT_MAGIC, self.epoch & 0xFFFF).to_le_bytes());
        bytes
    }

    /// The message in `bytes`, once sealed.
    pub fn decode(bytes: &[u8; FAILOVER_REPORT_LEN]) -> Result<FailoverReport, FailoverError> {
        let epoch = u32::from(u16::from_le_bytes([bytes[4], bytes[5]]));
        if word32(bytes, 0) != REPORT_MAGIC || word64(bytes, 48) != seal(REPORT_MAGIC, epoch) {
            return Err(FailoverError::Unsealed);
        }
        let mut awaiting = SlotSet::EMPTY;
        for (index, word) in awaiting.0.iter_mut().enumerate() {
            *word = word64(bytes, 8 + 8 * index);
        }
        Ok(FailoverReport {
            epoch,
            failed: rail_of(bytes[6])?,
            awaiting,
            head: word64(bytes, 40),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_slot_set_holds_its_slots() {
        let mut set = SlotSet::EMPTY;
        assert!(set.is_empty() && set.first().is_none());
        for slot in [255, 0, 64, 63] {
            set.insert(slot);
        }
        assert_eq!(set.iter().count(), 4);
        assert_eq!(set.iter().collect::<Vec<_>>(), vec![0, 63, 64, 255]);
        assert_eq!(set.first(), Some(0));
        set.remove(0);
        assert_eq!(set.first(), Some(63));
        assert!(set.contains(255) && !set.contains(1));
    }

    #[test]
    fn unsealed_and_foreign_bytes_do_not_decode() {
        let report = FailoverReport {
            epoch: 1,
            failed: Rail::ScaleUp,
            awaiting: SlotSet::EMPTY,
            head: 3,
        };
        let mut bytes = report.encode();
        bytes[55] ^= 1;
        assert_eq!(FailoverReport::decode(&bytes), Err(FailoverError::Unsealed));
        assert_eq!(
            FailoverNotice::decode(&[0; FAILOVER_NOTICE_LEN]),
            Err(FailoverError::Unsealed)
        );
        let mut notice = FailoverNotice {
            epoch: 2,
            failed: Rail::ScaleOut,
        }
        .encode();
        notice[6] = 7;
        assert_eq!(
            FailoverNotice::decode(&notice),
            Err(FailoverError::BadRail(7))
        );
    }

    proptest! {
        #[test]
        fn messages_round_trip(
            epoch in 1u32..0xFFFF,
            up in any::<bool>(),
            words in any::<[u64; 4]>(),
            head in any::<u64>(),
        ) {
            let failed = if up { Rail::ScaleUp } else { Rail::ScaleOut };
            let notice = FailoverNotice { epoch, failed };
            prop_assert_eq!(FailoverNotice::decode(&notice.encode()), Ok(notice));
            let report = FailoverReport { epoch, failed, awaiting: SlotSet(words), head };
            prop_assert_eq!(FailoverReport::decode(&report.encode()), Ok(report));
        }

        #[test]
        /// A slot of the report names the one sequence of the 256 before the head that maps
        /// to it.
        #[test]
        fn a_slot_names_one_sequence_before_the_head(head in 0u64..10_000, seq in 0u64..10_000) {
            let mut awaiting = SlotSet::EMPTY;
            awaiting.insert((seq % 256) as usize);
            let report = FailoverReport { epoch: 1, failed: Rail::ScaleOut, awaiting, head };
            prop_assert_eq!(report.awaits(seq), seq < head && head - seq <= 256);
        }

        #[test]
        fn any_bytes_decode_without_panic(bytes in proptest::collection::vec(any::<u8>(), FAILOVER_REPORT_LEN)) {
            let mut report = [0u8; FAILOVER_REPORT_LEN];
            report.copy_from_slice(&bytes);
            let _ = FailoverReport::decode(&report);
            let mut notice = [0u8; FAILOVER_NOTICE_LEN];
            notice.copy_from_slice(&bytes[..FAILOVER_NOTICE_LEN]);
            let _ = FailoverNotice::decode(&notice);
        }
    }
}
