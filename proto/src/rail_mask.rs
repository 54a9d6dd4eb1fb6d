//! The active-rail mask: which of the two rails take part in a transfer.
//!
//! Why a mask at all (docs/PROTOCOL.md §4 and §8): with a shared
//! receive queue the receiver cannot know how many IMMs a slot will produce, because the sender
//! decides the split at the last moment and skips inactive rails entirely. The sender therefore
//! names the rails it used in every IMM, and the receiver waits for exactly those. Two rails need
//! two bits: bit 0 is SOUT, bit 1 is SUP, which is also `Rail::index()`.

use std::fmt;

use crate::rail::Rail;

/// A set of rails, as carried in bits [9:8] of `imm_data` (bit 0 = SOUT, bit 1 = SUP).
///
/// The field is public so that a decoded value can hold stray bits; [`RailMask::is_subset_of`]
/// against [`RailMask::BOTH`] (or the connection's rails) is how such values are rejected.
/// Queries that enumerate rails (`rails`, `count`, `leader`) only look at the two rail bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Hash)]
pub struct RailMask(pub u8);

impl RailMask {
    /// No rail.
    pub const NONE: RailMask = RailMask(0);
    /// Only the scale-out rail.
    pub const SCALE_OUT: RailMask = RailMask(1);
    /// Only the scale-up rail.
    pub const SCALE_UP: RailMask = RailMask(2);
    /// Both rails.
    pub const BOTH: RailMask = RailMask(3);

    /// The mask naming exactly `rail`.
    #[inline]
    pub const fn of(rail: Rail) -> RailMask {
        RailMask(1 << rail.index())
    }

    /// Whether `rail` is in the set.
    #[inline]
    pub const fn contains(self, rail: Rail) -> bool {
        self.0 & RailMask::of(rail).0 != 0
    }

    /// The set with `rail` added.
    #[inline]
    pub const fn with(self, rail: Rail) -> RailMask {
        RailMask(self.0 | RailMask::of(rail).0)
    }

    /// This set less `rail`.
    #[inline]
    pub const fn without(self, rail: Rail) -> RailMask {
        RailMask(self.0 & !RailMask::of(rail).0)
    }

    /// The set of rails in either mask.
    #[inline]
    pub const fn union(self, other: RailMask) -> RailMask {
        RailMask(self.0 | other.0)
    }

    /// Whether no bit is set.
    #[inline]
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Whether every bit of `self` is also set in `other` (stray bits make this false).
    #[inline]
    pub const fn is_subset_of(self, other: RailMask) -> bool {
        self.0 & !other.0 == 0
    }

    /// The rails in the set, in index order (SOUT before SUP). Allocation free.
    #[inline]
    pub fn rails(self) -> impl Iterator<Item = Rail> {
        Rail::ALL
            .into_iter()
            .filter(move |rail| self.contains(*rail))
    }

    /// The raw bits.
    #[inline]
    pub const fn bits(self) -> u8 {
        self.0
    }

    /// Number of rails in the set (stray bits beyond the two rails are not counted).
    #[inline]
    pub const fn count(self) -> u32 {
        (self.0 & RailMask::BOTH.0).count_ones()
    }

    /// The leader rail (docs/PROTOCOL.md §6): SOUT if active, else SUP; `None` if empty.
    ///
    /// The leader is the one rail that writes the completion record, so a slot's sizes are
    /// written once. It is a pure function of the mask so that sender and receiver never need to
    /// agree on it explicitly.
    #[inline]
    pub const fn leader(self) -> Option<Rail> {
        if self.contains(Rail::ScaleOut) {
            Some(Rail::ScaleOut)
        } else if self.contains(Rail::ScaleUp) {
            Some(Rail::ScaleUp)
        } else {
            None
        }
    }
}

impl fmt::Display for RailMask {
    /// `none`, `sout`, `sup`, `sout+sup`; stray bits are shown in hex so bad masks stay visible.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.is_subset_of(RailMask::BOTH) {
            return write!(f, "invalid({:#04x})", self.0);
        }
        match *self {
            RailMask::NONE => f.write_str("none"),
            RailMask::SCALE_OUT => f.write_str("sout"),
            RailMask::SCALE_UP => f.write_str("sup"),
            _ => f.write_str("sout+sup"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constants_match_rail_bits() {
        assert_eq!(RailMask::of(Rail::ScaleOut), RailMask::SCALE_OUT);
        assert_eq!(RailMask::of(Rail::ScaleUp), RailMask::SCALE_UP);
        assert_eq!(
            RailMask::SCALE_OUT.union(RailMask::SCALE_UP),
            RailMask::BOTH
        );
        assert_eq!(RailMask::NONE.with(Rail::ScaleUp), RailMask::SCALE_UP);
        assert_eq!(RailMask::default(), RailMask::NONE);
    }

    #[test]
    fn contains_and_subset() {
        assert!(RailMask::BOTH.contains(Rail::ScaleOut));
        assert!(RailMask::BOTH.contains(Rail::ScaleUp));
        assert!(!RailMask::SCALE_OUT.contains(Rail::ScaleUp));
        assert!(RailMask::SCALE_UP.is_subset_of(RailMask::BOTH));
        assert!(RailMask::NONE.is_subset_of(RailMask::NONE));
        assert!(!RailMask::BOTH.is_subset_of(RailMask::SCALE_OUT));
        assert!(!RailMask(4).is_subset_of(RailMask::BOTH));
    }

    #[test]
    fn rails_in_index_order() {
        let both: Vec<Rail> = RailMask::BOTH.rails().collect();
        assert_eq!(both, vec![Rail::ScaleOut, Rail::ScaleUp]);
        assert_eq!(RailMask::NONE.rails().count(), 0);
        assert_eq!(
            RailMask::SCALE_UP.rails().collect::<Vec<_>>(),
            vec![Rail::ScaleUp]
        );
    }

    #[test]
    fn count_ignores_stray_bits() {
        assert_eq!(RailMask::NONE.count(), 0);
        assert_eq!(RailMask::SCALE_UP.count(), 1);
        assert_eq!(RailMask::BOTH.count(), 2);
        assert_eq!(RailMask(0xFD).count(), 1);
    }

    #[test]
    fn leader_prefers_scale_out() {
        assert_eq!(RailMask::BOTH.leader(), Some(Rail::ScaleOut));
        assert_eq!(RailMask::SCALE_OUT.leader(), Some(Rail::ScaleOut));
        assert_eq!(RailMask::SCALE_UP.leader(), Some(Rail::ScaleUp));
        assert_eq!(RailMask::NONE.leader(), None);
    }

    #[test]
    fn display() {
        assert_eq!(RailMask::NONE.to_string(), "none");
        assert_eq!(RailMask::SCALE_OUT.to_string(), "sout");
        assert_eq!(RailMask::SCALE_UP.to_string(), "sup");
        assert_eq!(RailMask::BOTH.to_string(), "sout+sup");
        assert_eq!(RailMask(8).to_string(), "invalid(0x08)");
    }
}
