//! What one matched slot posts (docs/PROTOCOL.md §4–§6): the split of each buffer, the slot's
//! rail mask, how it signals (exact size in the IMM, or the completion record), the record's
//! contents, and the work-request chain of every active rail.
//!
//! Pure and allocation-free: the engine chooses each buffer's SUP share (policy and BDP
//! threshold, `crate::policy`), checks send-queue credits against [`PostPlan::lengths`], writes
//! [`PostPlan::record`] to its record shadow and posts the chains, setting the last WR's wr_id.

use crate::chain::{self, MatchedBuffer, RecordTarget, Signal, EMPTY_WR, MAX_CHAIN};
use crate::cts::{CompletionRecord, MAX_RECVS};
use crate::imm::Imm;
use crate::rail::Rail;
use crate::rail_mask::RailMask;
use crate::send_slots::SendSlot;
use crate::split::{slot_mask, RailSplit};
use crate::work::WorkRequest;

/// The posting of one slot.
#[derive(Clone, Copy, Debug)]
pub struct PostPlan {
    /// The rails that carry the slot (each posts one signalling IMM).
    pub mask: RailMask,
    /// How the receiver learns the sizes.
    pub signal: Signal,
    /// The record the leader writes (general path), to be stored at the record target first.
    pub record: Option<CompletionRecord>,
    /// Bytes per rail, by rail index.
    pub rail_bytes: [u64; 2],
    /// The chain per rail, by rail index; `lengths` says how much of each is used.
    pub chains: [[WorkRequest; MAX_CHAIN]; 2],
    /// Work requests per rail (0 for an inactive rail).
    pub lengths: [usize; 2],
}

impl PostPlan {
    /// The chain `rail` posts (empty for an inactive rail).
    #[inline]
    pub fn chain(&self, rail: Rail) -> &[WorkRequest] {
        &self.chains[rail.index()][..self.lengths[rail.index()]]
    }

    /// The chain `rail` posts, to set its last wr_id.
    #[inline]
    pub fn chain_mut(&mut self, rail: Rail) -> &mut [WorkRequest] {
        &mut self.chains[rail.index()][..self.lengths[rail.index()]]
    }
}

/// Plans the posting of `slot` (index `slot_index`, fully matched): `shares[r]` is buffer `r`'s
/// SUP share in parts per 1024, `record` where the leader writes the record on the general path.
#[inline]
pub fn plan(slot_index: u8, slot: &SendSlot, shares: &[u32], record: RecordTarget) -> PostPlan {
    plan_with(slot_index, slot, shares, record, None)
}

/// [`plan`], with the slot's mask `only` that rail when given (a transfer with no bytes at all
/// is otherwise signalled on SOUT).
#[inline]
fn plan_with(
    slot_index: u8,
    slot: &SendSlot,
    shares: &[u32],
    record: RecordTarget,
    only: Option<Rail>,
) -> PostPlan {
    let nreqs = slot.buffers().len().min(MAX_RECVS);
    let mut buffers = [EMPTY_BUFFER; MAX_RECVS];
    let mut splits = [RailSplit::default(); MAX_RECVS];
    for r in 0..nreqs {
        let local = slot.buffers()[r];
        let share = shares.get(r).copied().unwrap_or(0);
        splits[r] = RailSplit::new(share, local.size);
        buffers[r] = MatchedBuffer {
            entry: slot.entries()[r],
            addr: local.addr,
            lkeys: local.lkeys,
            split: splits[r],
        };
    }
    let (buffers, splits) = (&buffers[..nreqs], &splits[..nreqs]);
    let mask = only.map_or_else(|| slot_mask(splits), RailMask::of);
    let signal = match (nreqs, Imm::exact_size_q(splits[0].size)) {
        (1, Some(size_q)) => Signal::ExactSize(size_q),
        _ => Signal::Record(record),
    };
    let mut rail_bytes = [0u64; 2];
    for rail in Rail::ALL {
        rail_bytes[rail.index()] = splits.iter().map(|s| s.length(rail)).sum();
    }
    // Built in the value returned, so that the chains are written once, in the caller's frame.
    let mut posting = PostPlan {
        mask,
        signal,
        record: None,
        rail_bytes,
        chains: [[EMPTY_WR; MAX_CHAIN]; 2],
        lengths: [0; 2],
    };
    if matches!(signal, Signal::Record(_)) {
        let mut record = CompletionRecord {
            rail_bytes,
            ..CompletionRecord::default()
        };
        for (size, split) in record.sizes.iter_mut().zip(splits) {
            // A transfer is at most 1 GiB (`maxP2pBytes`), so a size fits the record's u32.
            *size = u32::try_from(split.size).unwrap_or(u32::MAX);
        }
        posting.record = Some(record);
    }
    for rail in mask.rails() {
        let chain = &mut posting.chains[rail.index()];
        posting.lengths[rail.index()] =
            chain::build(slot_index, mask, buffers, signal, rail, chain);
    }
    posting
}

/// Plans the posting of `slot` wholly on `rail`, as after the other rail failed
/// (docs/PROTOCOL.md §10): every byte on `rail`, which leads. With `replay`, its immediate is a
/// replay's (`Imm::replay`): the whole transfer again, for a receive that awaits it.
#[inline]
pub fn plan_on(
    slot_index: u8,
    slot: &SendSlot,
    rail: Rail,
    record: RecordTarget,
    replay: bool,
) -> PostPlan {
    let share = match rail {
        Rail::ScaleOut => 0,
        Rail::ScaleUp => 1024,
    };
    let shares = [share; MAX_RECVS];
    let nreqs = slot.buffers().len().min(MAX_RECVS);
    let mut posting = plan_with(slot_index, slot, &shares[..nreqs], record, Some(rail));
    if replay {
        let length = posting.lengths[rail.index()];
        let last = &mut posting.chains[rail.index()][length - 1];
        let size_q = match posting.signal {
            Signal::ExactSize(size_q) => size_q,
            Signal::Record(_) => crate::imm::SIZE_Q_SENTINEL,
        };
        last.opcode = crate::work::SendOpcode::WriteWithImm {
            imm: Imm::replay(slot_index, size_q).to_wire(),
        };
    }
    posting
}

/// An unused buffer entry, for stack arrays.
const EMPTY_BUFFER: MatchedBuffer = MatchedBuffer {
    entry: crate::cts::Advertised::EMPTY,
    addr: 0,
    lkeys: [0; 2],
    split: RailSplit { size: 0, sup: 0 },
};
