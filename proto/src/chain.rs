//! The work-request chain a slot posts on one rail (docs/PROTOCOL.md §6): pure
//! construction from the matched CTS entries, the split and the local buffers.
//!
//! * Fast path (`nreqs == 1` and `size_q` carries the size exactly): one
//!   RDMA_WRITE_WITH_IMM per active rail that both moves the rail's bytes and signals.
//! * General path: one RDMA_WRITE per non-empty buffer portion on the rail, then one signalling
//!   RDMA_WRITE_WITH_IMM; on the leader rail (SOUT if active, else SUP) it also writes the
//!   completion record, on the other rail it is IMM-only.
//!
//! A zero-byte portion is not posted: it moves nothing, and the rail's IMM still counts it.

use crate::rail::Rail;
use crate::work::{SendOpcode, Sge, WorkRequest};

use super::cts::{Advertised, MAX_RECVS};
use super::imm::{Imm, SIZE_Q_SENTINEL};
use super::rail_mask::RailMask;
use super::split::RailSplit;

/// Longest chain: 8 data writes and the signalling write.
pub const MAX_CHAIN: usize = MAX_RECVS + 1;

/// A chain slot before it is filled.
pub const EMPTY_WR: WorkRequest = WorkRequest {
    wr_id: 0,
    opcode: SendOpcode::Write,
    sge: None,
    remote_addr: 0,
    rkey: 0,
    signaled: false,
    inline: false,
};

/// One matched buffer of the slot: the receiver's entry and the sender's local buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatchedBuffer {
    /// The receiver's CTS entry (remote address and rkeys).
    pub entry: Advertised,
    /// Local address of the data.
    pub addr: u64,
    /// Local keys per rail.
    pub lkeys: [u32; 2],
    /// How the buffer is split across the rails.
    pub split: RailSplit,
}

/// Where the leader writes the completion record (general path only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordTarget {
    /// Local address of the record shadow for this slot.
    pub local_addr: u64,
    /// Its local keys per rail.
    pub lkeys: [u32; 2],
    /// Remote address of the receiver's record for this slot.
    pub remote_addr: u64,
    /// Its remote keys per rail.
    pub rkeys: [u32; 2],
    /// Record size in bytes.
    pub length: u32,
}

/// How the slot signals: the exact size in `size_q`, or the record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    /// Fast path: `size_q` carries the single buffer's exact size.
    ExactSize(u32),
    /// General path: the leader writes the record.
    Record(RecordTarget),
}

/// Fills `chain` with the WRs of `rail` for a slot and returns how many there are. The last WR is
/// the signalled RDMA_WRITE_WITH_IMM; its `wr_id` is left 0 for the caller to set.
#[inline]
pub fn build(
    slot: u8,
    mask: RailMask,
    buffers: &[MatchedBuffer],
    signal: Signal,
    rail: Rail,
    chain: &mut [WorkRequest; MAX_CHAIN],
) -> usize {
    match signal {
        Signal::ExactSize(size_q) => {
            let buffer = &buffers[0];
            let mut wr = data_write(buffer, rail);
            wr.opcode = SendOpcode::WriteWithImm {
                imm: Imm { slot, mask, size_q }.to_wire(),
            };
            wr.signaled = true;
            chain[0] = wr;
            1
        }
        Signal::Record(record) => {
            let mut length = 0;
            for buffer in buffers.iter().take(MAX_RECVS) {
                if buffer.split.length(rail) > 0 {
                    chain[length] = data_write(buffer, rail);
                    length += 1;
                }
            }
            let leader = mask.leader() == Some(rail);
            let imm = Imm {
                slot,
                mask,
                size_q: SIZE_Q_SENTINEL,
            };
            chain[length] = WorkRequest {
                wr_id: 0,
                opcode: SendOpcode::WriteWithImm { imm: imm.to_wire() },
                sge: leader.then_some(Sge {
                    addr: record.local_addr,
                    length: record.length,
                    lkey: record.lkeys[rail.index()],
                }),
                remote_addr: record.remote_addr,
                rkey: record.rkeys[rail.index()],
                signaled: true,
                inline: false,
            };
            length + 1
        }
    }
}

/// The unsignalled RDMA_WRITE of `buffer`'s portion on `rail` (no SGE when it is empty).
fn data_write(buffer: &MatchedBuffer, rail: Rail) -> WorkRequest {
    let (offset, bytes) = (buffer.split.offset(rail), buffer.split.length(rail));
    WorkRequest {
        wr_id: 0,
        opcode: SendOpcode::Write,
        sge: (bytes > 0).then_some(Sge {
            addr: buffer.addr + offset,
            length: bytes as u32,
            lkey: buffer.lkeys[rail.index()],
        }),
        remote_addr: buffer.entry.addr + offset,
        rkey: buffer.entry.rkeys[rail.index()],
        signaled: false,
        inline: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::split::slot_mask;
    use proptest::prelude::*;

    const LOCAL: u64 = 0x10_0000;
    const REMOTE: u64 = 0x90_0000;

    fn buffers(sizes: &[u64], sup_bw: u32) -> Vec<MatchedBuffer> {
        sizes
            .iter()
            .enumerate()
            .map(|(r, size)| MatchedBuffer {
                entry: Advertised {
                    addr: REMOTE + (r as u64) * (1 << 24),
                    size: *size,
                    rkeys: [11, 22],
                    tag: r as u32,
                },
                addr: LOCAL + (r as u64) * (1 << 24),
                lkeys: [33, 44],
                split: RailSplit::new(sup_bw, *size),
            })
            .collect()
    }

    const RECORD: RecordTarget = RecordTarget {
        local_addr: 0x5000,
        lkeys: [55, 66],
        remote_addr: 0x7000,
        rkeys: [77, 88],
        length: 48,
    };

    #[test]
    fn fast_path_is_one_signalled_write_with_imm_per_rail() {
        let b = buffers(&[4096], 512);
        let mask = slot_mask(&[b[0].split]);
        let mut chain = [EMPTY_WR; MAX_CHAIN];
        for rail in Rail::ALL {
            assert_eq!(
                build(3, mask, &b, Signal::ExactSize(32), rail, &mut chain),
                1
            );
            let wr = chain[0];
            assert!(wr.signaled);
            let imm = Imm::from_wire(match wr.opcode {
                SendOpcode::WriteWithImm { imm } => imm,
                other => panic!("{other:?}"),
            });
            assert_eq!((imm.slot, imm.mask, imm.size_q), (3, RailMask::BOTH, 32));
            assert_eq!(wr.length(), 2048);
            assert_eq!(wr.rkey, [11, 22][rail.index()]);
        }
    }

    #[test]
    fn a_zero_byte_transfer_is_one_imm_without_sge_on_sout() {
        let b = buffers(&[0], 0);
        let mut chain = [EMPTY_WR; MAX_CHAIN];
        let mask = slot_mask(&[b[0].split]);
        assert_eq!(mask, RailMask::SCALE_OUT);
        assert_eq!(
            build(
                0,
                mask,
                &b,
                Signal::ExactSize(0),
                Rail::ScaleOut,
                &mut chain
            ),
            1
        );
        assert_eq!(chain[0].sge, None);
    }

    proptest! {
        /// General path: each rail's data WRs cover exactly its split portions, at matching
        /// offsets locally and remotely; the chain ends with one signalled IMM; only the leader's
        /// carries the record.
        #[test]
        fn general_chains_cover_the_split(
            sizes in proptest::collection::vec(0u64..100_000, 1..=8),
            sup_bw in prop_oneof![Just(0u32), Just(1024), 0u32..1100],
        ) {
            let b = buffers(&sizes, sup_bw);
            let splits: Vec<RailSplit> = b.iter().map(|x| x.split).collect();
            let mask = slot_mask(&splits);
            for rail in mask.rails() {
                let mut chain = [EMPTY_WR; MAX_CHAIN];
                let n = build(9, mask, &b, Signal::Record(RECORD), rail, &mut chain);
                let (data, last) = (&chain[..n - 1], chain[n - 1]);
                prop_assert!(last.signaled && data.iter().all(|w| !w.signaled));
                let signals = matches!(last.opcode, SendOpcode::WriteWithImm { .. });
                prop_assert!(signals);
                prop_assert_eq!(last.sge.is_some(), mask.leader() == Some(rail));
                let moved: u64 = data.iter().map(|w| u64::from(w.length())).sum();
                let expected: u64 = splits.iter().map(|s| s.length(rail)).sum();
                prop_assert_eq!(moved, expected);
                for w in data {
                    prop_assert!(w.length() > 0, "empty portions are not posted");
                    let sge = w.sge.unwrap();
                    prop_assert_eq!(sge.addr - LOCAL, w.remote_addr - REMOTE);
                    prop_assert_eq!(sge.lkey, [33, 44][rail.index()]);
                }
            }
        }
    }
}
