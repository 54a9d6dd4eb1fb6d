//! The `imm_data` codec: slot, active mask and quantized size in 32 bits (docs/PROTOCOL.md §5).
//!
//! Why: with one shared receive queue per rail, a receive completion's `wr_id` identifies a
//! generic receive, not a request. Everything the receiver needs to route the completion must
//! travel in the immediate: the FIFO slot (which request), the active mask (how many IMMs to
//! wait for) and, when it fits, the size (so the completion record need not be read).
//!
//! Layout (explicit shifts, never a bitfield ABI):
//!
//! ```text
//!  [ 7:0]  slot    (0..=255, the CTS FIFO slot)
//!  [ 9:8]  mask    (bit 0 = SOUT, bit 1 = SUP; 1, 2 or 3; 0 = a replay, docs/PROTOCOL.md §10)
//!  [31:10] size_q  (size / 128, or the all-ones sentinel: "read the completion record")
//! ```
//!
//! Verbs carries `imm_data` in network byte order, so the value posted is `encode().to_be()`.

use super::rail_mask::RailMask;

/// Bytes per unit of `size_q`; matches the 128-B split alignment (docs/PROTOCOL.md §4).
pub const SIZE_GRANULARITY: u64 = 128;
/// Width of the `size_q` field.
pub const SIZE_Q_BITS: u32 = 22;
/// All ones: the size is not encoded, read the completion record instead.
pub const SIZE_Q_SENTINEL: u32 = (1 << SIZE_Q_BITS) - 1;

const SLOT_SHIFT: u32 = 0;
const MASK_SHIFT: u32 = 8;
const SIZE_Q_SHIFT: u32 = 10;
const SLOT_FIELD: u32 = 0xFF;
const MASK_FIELD: u32 = 0x3;

/// One decoded immediate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Imm {
    /// CTS FIFO slot the transfer belongs to.
    pub slot: u8,
    /// Rails the sender used for this slot; the receiver waits for one IMM per rail. Empty in
    /// a replay after a failover ([`Imm::is_replay`]): the one IMM of a whole transfer sent
    /// again on the surviving rail (crate::failover).
    pub mask: RailMask,
    /// Size in units of [`SIZE_GRANULARITY`], or [`SIZE_Q_SENTINEL`].
    pub size_q: u32,
}

impl Imm {
    /// Host-order value `slot | mask << 8 | size_q << 10`; excess bits of `mask` and `size_q`
    /// are dropped so that fields never bleed into each other.
    #[inline]
    pub const fn encode(self) -> u32 {
        ((self.slot as u32) << SLOT_SHIFT)
            | (((self.mask.0 as u32) & MASK_FIELD) << MASK_SHIFT)
            | ((self.size_q & SIZE_Q_SENTINEL) << SIZE_Q_SHIFT)
    }

    /// The value to put in a work request's `imm_data` (network byte order, as verbs expects).
    #[inline]
    pub const fn to_wire(self) -> u32 {
        self.encode().to_be()
    }

    /// A replay's immediate: the whole of `slot`'s transfer again on one rail (crate::failover).
    #[inline]
    pub const fn replay(slot: u8, size_q: u32) -> Imm {
        Imm {
            slot,
            mask: RailMask::NONE,
            size_q,
        }
    }

    /// Whether this is a replay's immediate (its mask is empty).
    #[inline]
    pub const fn is_replay(self) -> bool {
        self.mask.0 == 0
    }

    /// Decode a host-order value. Every value decodes since the empty mask became the replay
    /// marker; what the receiver makes of a replay it does not await, or of a mask naming a rail
    /// the connection lacks, is its protocol error (`crate::recv_slots`).
    #[inline]
    pub fn decode(raw: u32) -> Imm {
        let mask = RailMask(((raw >> MASK_SHIFT) & MASK_FIELD) as u8);
        Imm {
            slot: ((raw >> SLOT_SHIFT) & SLOT_FIELD) as u8,
            mask,
            size_q: (raw >> SIZE_Q_SHIFT) & SIZE_Q_SENTINEL,
        }
    }

    /// Decode the `imm_data` of a receive completion (network byte order).
    #[inline]
    pub fn from_wire(wire: u32) -> Imm {
        Imm::decode(u32::from_be(wire))
    }

    /// The `size_q` that carries `size` exactly, or `None` when it cannot (not a multiple of
    /// 128, or too large). Exactness matters: the receiver reports this size to NCCL, so a
    /// rounded value would be a wrong answer, not an approximation.
    #[inline]
    pub const fn exact_size_q(size: u64) -> Option<u32> {
        if size % SIZE_GRANULARITY != 0 {
            return None;
        }
        let units = size / SIZE_GRANULARITY;
        if units < SIZE_Q_SENTINEL as u64 {
            Some(units as u32)
        } else {
            None
        }
    }

    /// `exact_size_q(size)`, or the sentinel when the size must go through the record.
    #[inline]
    pub const fn size_q_or_sentinel(size: u64) -> u32 {
        match Imm::exact_size_q(size) {
            Some(size_q) => size_q,
            None => SIZE_Q_SENTINEL,
        }
    }

    /// Bytes carried; `None` for the sentinel (read the completion record).
    #[inline]
    pub const fn size_bytes(self) -> Option<u64> {
        if self.size_q == SIZE_Q_SENTINEL {
            None
        } else {
            Some(self.size_q as u64 * SIZE_GRANULARITY)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn layout_is_slot_mask_size() {
        let imm = Imm {
            slot: 0xAB,
            mask: RailMask::BOTH,
            size_q: 5,
        };
        assert_eq!(imm.encode(), 0xAB | (3 << 8) | (5 << 10));
        assert_eq!(Imm::decode(imm.encode()), imm);
    }

    #[test]
    fn encode_drops_excess_bits() {
        let imm = Imm {
            slot: 1,
            mask: RailMask(0xFF),
            size_q: u32::MAX,
        };
        assert_eq!(imm.encode(), 1 | (3 << 8) | (SIZE_Q_SENTINEL << 10));
    }

    #[test]
    fn the_empty_mask_is_a_replay() {
        let raw = 7 | (9 << 10);
        let imm = Imm::decode(raw);
        assert!(imm.is_replay());
        assert_eq!(imm, Imm::replay(7, 9));
        assert_eq!(Imm::from_wire(raw.to_be()), imm);
        assert_eq!(imm.size_bytes(), Some(9 * 128));
        assert!(!Imm::decode(7 | (1 << 8)).is_replay());
    }

    #[test]
    fn exact_size_q_edges() {
        assert_eq!(Imm::exact_size_q(0), Some(0));
        assert_eq!(Imm::exact_size_q(128), Some(1));
        assert_eq!(Imm::exact_size_q(129), None);
        assert_eq!(Imm::exact_size_q(100), None);
        let largest = (SIZE_Q_SENTINEL as u64 - 1) * SIZE_GRANULARITY;
        assert_eq!(Imm::exact_size_q(largest), Some(SIZE_Q_SENTINEL - 1));
        assert_eq!(
            Imm::exact_size_q(SIZE_Q_SENTINEL as u64 * SIZE_GRANULARITY),
            None
        );
        assert_eq!(Imm::exact_size_q(u64::MAX - 127), None);
        assert_eq!(Imm::size_q_or_sentinel(129), SIZE_Q_SENTINEL);
        assert_eq!(Imm::size_q_or_sentinel(256), 2);
    }

    #[test]
    fn sentinel_has_no_size() {
        let imm = Imm {
            slot: 0,
            mask: RailMask::SCALE_OUT,
            size_q: SIZE_Q_SENTINEL,
        };
        assert_eq!(imm.size_bytes(), None);
        assert_eq!(Imm { size_q: 3, ..imm }.size_bytes(), Some(384));
    }

    proptest! {
        #[test]
        fn roundtrip(slot in any::<u8>(), mask in 1u8..=3, size_q in 0u32..=SIZE_Q_SENTINEL) {
            let imm = Imm { slot, mask: RailMask(mask), size_q };
            prop_assert_eq!(Imm::decode(imm.encode()), imm);
            prop_assert_eq!(Imm::from_wire(imm.to_wire()), imm);
        }

        #[test]
        fn exact_size_is_exact(size in any::<u64>()) {
            if let Some(size_q) = Imm::exact_size_q(size) {
                let imm = Imm { slot: 0, mask: RailMask::SCALE_OUT, size_q };
                prop_assert_eq!(imm.size_bytes(), Some(size));
            }
        }

        #[test]
        fn exact_size_for_aligned_sizes(units in 0u64..SIZE_Q_SENTINEL as u64) {
            let size = units * SIZE_GRANULARITY;
            prop_assert_eq!(Imm::exact_size_q(size), Some(units as u32));
        }

        #[test]
        fn wire_is_big_endian(slot in any::<u8>(), mask in 1u8..=3, size_q in 0u32..=SIZE_Q_SENTINEL) {
            let imm = Imm { slot, mask: RailMask(mask), size_q };
            // The bytes in memory of the posted value are the value in network order.
            prop_assert_eq!(imm.to_wire().to_ne_bytes(), imm.encode().to_be_bytes());
            prop_assert_eq!(imm.to_wire().to_ne_bytes()[3], slot);
        }

        #[test]
        fn every_value_decodes_and_encodes_back(raw in any::<u32>()) {
            prop_assert_eq!(Imm::decode(raw).encode(), raw);
        }
    }
}
