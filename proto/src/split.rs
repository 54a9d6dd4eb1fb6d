//! The sender-side split of one buffer between the two rails (docs/PROTOCOL.md §4).
//!
//! Why this shape:
//! * The policy speaks "parts per 1024" (`sup_bw`), so the conversion is a multiply and a shift:
//!   integer only, no floats on the hot path (docs/ARCHITECTURE.md, 'Threads and state').
//! * SUP carries the HEAD of the buffer `[0, sup)` and SOUT the tail `[sup, size)`. The SUP
//!   share is rounded down to 128 B, so the boundary falls on a 128-B line and NCCL's LL128
//!   lines are never torn between two NICs that deliver in no mutual order.
//! * `0` means all SOUT and anything `>= 1024` all SUP, with no clamping beyond that, as agents
//!   are told (docs/AGENT.md, 'What it does'; vanilla intra-island passes `u32::MAX`).
//! * Only rails with bytes are activated (docs/PROTOCOL.md §4); a 0-byte transfer still needs one
//!   IMM to complete the receive, and it goes on SOUT.

use crate::rail::Rail;

use super::rail_mask::RailMask;

/// Alignment of the SUP/SOUT boundary (one LL128 line).
pub const SPLIT_ALIGNMENT: u64 = 128;

/// `sup_bw` value meaning "everything on SUP" (the unit of the parts-per-1024 scale).
pub const SUP_BANDWIDTH_FULL: u32 = 1024;

/// Bytes of `size` that go on SUP for a parts-per-1024 share `sup_bw`.
///
/// `0 => 0`; `>= 1024 => size`; otherwise `(size * sup_bw) >> 10` rounded down to 128 B.
/// The product is formed in 128 bits so that sizes near `u64::MAX` cannot overflow.
#[inline]
pub const fn sup_bytes(sup_bw: u32, size: u64) -> u64 {
    if sup_bw == 0 {
        return 0;
    }
    if sup_bw >= SUP_BANDWIDTH_FULL {
        return size;
    }
    let proportional = ((size as u128 * sup_bw as u128) >> 10) as u64;
    proportional - proportional % SPLIT_ALIGNMENT
}

/// How one buffer of `size` bytes is divided: SUP gets `[0, sup)`, SOUT gets `[sup, size)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct RailSplit {
    /// Total bytes of the buffer.
    pub size: u64,
    /// Bytes on SUP, taken from the head of the buffer. Never more than `size`.
    pub sup: u64,
}

impl RailSplit {
    /// Split `size` bytes with the parts-per-1024 share `sup_bw`.
    #[inline]
    pub const fn new(sup_bw: u32, size: u64) -> RailSplit {
        RailSplit {
            size,
            sup: sup_bytes(sup_bw, size),
        }
    }

    /// Bytes carried by `rail`.
    #[inline]
    pub const fn length(self, rail: Rail) -> u64 {
        match rail {
            Rail::ScaleUp => self.sup,
            Rail::ScaleOut => self.size - self.sup,
        }
    }

    /// Offset within the buffer (local and remote alike) where `rail`'s bytes start.
    #[inline]
    pub const fn offset(self, rail: Rail) -> u64 {
        match rail {
            Rail::ScaleUp => 0,
            Rail::ScaleOut => self.sup,
        }
    }

    /// Rails that carry at least one byte (possibly empty for a 0-byte buffer).
    #[inline]
    pub const fn rails_with_bytes(self) -> RailMask {
        let mut mask = RailMask::NONE;
        if self.length(Rail::ScaleOut) != 0 {
            mask = mask.with(Rail::ScaleOut);
        }
        if self.length(Rail::ScaleUp) != 0 {
            mask = mask.with(Rail::ScaleUp);
        }
        mask
    }

    /// Rails to activate for this buffer alone: those with bytes; a 0-byte transfer forces
    /// SCALE_OUT because the receive still needs one IMM to complete.
    #[inline]
    pub const fn mask(self) -> RailMask {
        let mask = self.rails_with_bytes();
        if mask.is_empty() {
            RailMask::SCALE_OUT
        } else {
            mask
        }
    }
}

/// The per-slot mask for a grouped send (docs/PROTOCOL.md §4, `nreqs > 1`): the OR of the
/// non-empty rails of every split, so each active rail posts one signalling IMM; all-empty =>
/// SCALE_OUT.
///
/// A 0-byte member does not force SOUT when another member has bytes: the slot completes on
/// the rails that did carry data, and its record still reports the 0 size.
#[inline]
pub fn slot_mask(splits: &[RailSplit]) -> RailMask {
    let mask = splits.iter().fold(RailMask::NONE, |mask, split| {
        mask.union(split.rails_with_bytes())
    });
    if mask.is_empty() {
        RailMask::SCALE_OUT
    } else {
        mask
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn one_mib_table() {
        // docs/PROTOCOL.md §4 worked by hand for a 1 MiB buffer.
        let table = [
            (0u32, 0u64, MIB, RailMask::SCALE_OUT),
            (256, 262_144, 786_432, RailMask::BOTH),
            (512, 524_288, 524_288, RailMask::BOTH),
            (768, 786_432, 262_144, RailMask::BOTH),
            (1024, MIB, 0, RailMask::SCALE_UP),
        ];
        for (sup_bw, sup, sout, mask) in table {
            let split = RailSplit::new(sup_bw, MIB);
            assert_eq!(split.length(Rail::ScaleUp), sup, "sup_bw {sup_bw}");
            assert_eq!(split.length(Rail::ScaleOut), sout, "sup_bw {sup_bw}");
            assert_eq!(split.mask(), mask, "sup_bw {sup_bw}");
        }
    }

    #[test]
    fn rounding_down_to_alignment() {
        // 1000 * 512 / 1024 = 500 -> 384.
        assert_eq!(sup_bytes(512, 1000), 384);
        // Too small for one line: all SOUT.
        let split = RailSplit::new(512, 200);
        assert_eq!((split.sup, split.mask()), (0, RailMask::SCALE_OUT));
        assert_eq!(sup_bytes(1023, u64::MAX) % SPLIT_ALIGNMENT, 0);
    }

    #[test]
    fn zero_bytes_forces_scale_out() {
        for sup_bw in [0, 1, 512, 1024, u32::MAX] {
            let split = RailSplit::new(sup_bw, 0);
            assert_eq!(split.mask(), RailMask::SCALE_OUT);
            assert_eq!(split.rails_with_bytes(), RailMask::NONE);
        }
    }

    #[test]
    fn slot_mask_ors_non_empty_rails() {
        assert_eq!(slot_mask(&[]), RailMask::SCALE_OUT);
        let empty = RailSplit::new(1024, 0);
        let all_sup = RailSplit::new(1024, MIB);
        let all_sout = RailSplit::new(0, MIB);
        assert_eq!(slot_mask(&[empty, empty]), RailMask::SCALE_OUT);
        assert_eq!(slot_mask(&[empty, all_sup]), RailMask::SCALE_UP);
        assert_eq!(slot_mask(&[all_sout, all_sup]), RailMask::BOTH);
        assert_eq!(slot_mask(&[all_sout, empty]), RailMask::SCALE_OUT);
    }

    fn any_split() -> impl Strategy<Value = RailSplit> {
        (any::<u32>(), any::<u64>()).prop_map(|(sup_bw, size)| RailSplit::new(sup_bw, size))
    }

    proptest! {
        #[test]
        fn lengths_and_offsets_cover_exactly(sup_bw in any::<u32>(), size in any::<u64>()) {
            let split = RailSplit::new(sup_bw, size);
            prop_assert!(split.sup <= size);
            prop_assert_eq!(split.length(Rail::ScaleOut) + split.length(Rail::ScaleUp), size);
            // SUP is [0, sup), SOUT is [sup, size): contiguous, no gap, no overlap.
            prop_assert_eq!(split.offset(Rail::ScaleUp), 0);
            prop_assert_eq!(split.offset(Rail::ScaleUp) + split.length(Rail::ScaleUp),
                            split.offset(Rail::ScaleOut));
            prop_assert_eq!(split.offset(Rail::ScaleOut) + split.length(Rail::ScaleOut), size);
        }

        #[test]
        fn boundary_aligned(sup_bw in any::<u32>(), size in any::<u64>()) {
            let split = RailSplit::new(sup_bw, size);
            prop_assert!(split.sup % SPLIT_ALIGNMENT == 0 || split.sup == size);
        }

        #[test]
        fn mask_matches_lengths(sup_bw in any::<u32>(), size in any::<u64>()) {
            let split = RailSplit::new(sup_bw, size);
            for rail in Rail::ALL {
                prop_assert_eq!(split.rails_with_bytes().contains(rail), split.length(rail) != 0);
            }
            if size == 0 {
                prop_assert_eq!(split.mask(), RailMask::SCALE_OUT);
            } else {
                prop_assert_eq!(split.mask(), split.rails_with_bytes());
            }
        }

        #[test]
        fn zero_share_is_all_scale_out(size in any::<u64>()) {
            let split = RailSplit::new(0, size);
            prop_assert_eq!(split.length(Rail::ScaleOut), size);
            prop_assert_eq!(split.mask(), RailMask::SCALE_OUT);
        }

        #[test]
        fn full_share_is_all_scale_up(
            sup_bw in prop_oneof![Just(1024u32), Just(5000), Just(u32::MAX), 1024u32..],
            size in 1u64..,
        ) {
            let split = RailSplit::new(sup_bw, size);
            prop_assert_eq!(split.length(Rail::ScaleUp), size);
            prop_assert_eq!(split.mask(), RailMask::SCALE_UP);
        }

        #[test]
        fn proportional_share_matches_reference(sup_bw in 1u32..1024, size in 0u64..(1 << 53)) {
            // Below 2^53 the 64-bit product cannot overflow: compare with docs/PROTOCOL.md §4.
            let reference = ((size * sup_bw as u64) >> 10) / 128 * 128;
            prop_assert_eq!(sup_bytes(sup_bw, size), reference);
        }

        #[test]
        fn slot_mask_is_union(splits in proptest::collection::vec(any_split(), 0..8)) {
            let mask = slot_mask(&splits);
            prop_assert!(!mask.is_empty());
            for split in &splits {
                prop_assert!(split.rails_with_bytes().is_subset_of(mask));
            }
            let any_bytes = splits.iter().any(|split| split.size != 0);
            if !any_bytes {
                prop_assert_eq!(mask, RailMask::SCALE_OUT);
            }
        }
    }
}
