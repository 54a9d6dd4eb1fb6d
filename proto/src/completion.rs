//! Receiver-side mask learning: when is a receive complete (docs/PROTOCOL.md §8)?
//!
//! Why learning: the sender picks the active rails at the last moment and skips inactive rails
//! entirely, so the receiver cannot know in advance how many IMMs a slot will bring. Every IMM
//! carries the slot's full active mask, so the first one to arrive (on either rail, in either
//! order: rails are not ordered against each other) teaches the receiver what to expect; the
//! receive completes when every rail named has delivered its IMM.
//!
//! Every IMM is checked against what was learned. A violation means a late or duplicate IMM for
//! a reused slot, a corrupt immediate, or a rail the connection does not have; all are protocol
//! errors to report loudly (docs/PROTOCOL.md §8 lists them). A failed check leaves the state
//! untouched, so the error describes exactly what arrived against what was known.

use std::fmt;

use crate::rail::Rail;

use super::rail_mask::RailMask;

/// Completion tracking for one posted receive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct MaskLearning {
    /// Mask learned from the first IMM; empty until then.
    expected: RailMask,
    /// Rails whose IMM has arrived.
    seen: RailMask,
}

/// An IMM that violates the mask-learning protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MaskError {
    /// The mask is empty or names a rail the connection does not have.
    InvalidMask {
        /// Mask carried by the IMM.
        mask: RailMask,
        /// Rails that exist on this connection.
        allowed: RailMask,
    },
    /// The IMM arrived on a rail that its own mask does not name.
    RailNotInMask {
        /// Rail the IMM arrived on.
        rail: Rail,
        /// Mask carried by the IMM.
        mask: RailMask,
    },
    /// The mask disagrees with the one learned from the first IMM of the slot.
    Mismatch {
        /// Mask learned from the first IMM.
        learned: RailMask,
        /// Mask carried by this IMM.
        got: RailMask,
    },
    /// A second IMM on the same rail for the same slot.
    Duplicate {
        /// Rail that delivered twice.
        rail: Rail,
    },
}

impl fmt::Display for MaskError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MaskError::InvalidMask { mask, allowed } => write!(
                f,
                "IMM carries active mask {mask} but this connection only has rails {allowed}"
            ),
            MaskError::RailNotInMask { rail, mask } => write!(
                f,
                "IMM arrived on rail {rail} but its active mask {mask} does not name that rail"
            ),
            MaskError::Mismatch { learned, got } => write!(
                f,
                "IMM active mask {got} disagrees with mask {learned} learned from the slot's \
                 first IMM (late IMM from a reused slot?)"
            ),
            MaskError::Duplicate { rail } => write!(
                f,
                "second IMM on rail {rail} for the same slot (duplicate or late IMM)"
            ),
        }
    }
}

impl std::error::Error for MaskError {}

impl MaskLearning {
    /// Nothing learned, nothing seen.
    #[inline]
    pub const fn new() -> Self {
        MaskLearning {
            expected: RailMask::NONE,
            seen: RailMask::NONE,
        }
    }

    /// One IMM arrived on `rail` carrying `mask`; `allowed` is the set of rails that exist on
    /// this connection. `Ok(true)` when the receive is now complete. On error nothing changes.
    #[inline]
    pub fn arrive(
        &mut self,
        rail: Rail,
        mask: RailMask,
        allowed: RailMask,
    ) -> Result<bool, MaskError> {
        if mask.is_empty() || !mask.is_subset_of(allowed) {
            return Err(MaskError::InvalidMask { mask, allowed });
        }
        if !mask.contains(rail) {
            return Err(MaskError::RailNotInMask { rail, mask });
        }
        if !self.expected.is_empty() && self.expected != mask {
            return Err(MaskError::Mismatch {
                learned: self.expected,
                got: mask,
            });
        }
        if self.seen.contains(rail) {
            return Err(MaskError::Duplicate { rail });
        }
        self.expected = mask;
        self.seen = self.seen.with(rail);
        Ok(self.seen == self.expected)
    }

    /// Mask learned from the first IMM (empty before it).
    #[inline]
    pub const fn expected(&self) -> RailMask {
        self.expected
    }

    /// Rails whose IMM has arrived.
    #[inline]
    pub const fn seen(&self) -> RailMask {
        self.seen
    }

    /// Whether a mask was learned and every rail in it has delivered.
    #[inline]
    pub const fn is_complete(&self) -> bool {
        !self.expected.is_empty() && self.seen.0 == self.expected.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const OUT: Rail = Rail::ScaleOut;
    const UP: Rail = Rail::ScaleUp;

    #[test]
    fn both_rails_any_order() {
        for (first, second) in [(OUT, UP), (UP, OUT)] {
            let mut learning = MaskLearning::new();
            assert!(!learning.is_complete());
            assert_eq!(
                learning.arrive(first, RailMask::BOTH, RailMask::BOTH),
                Ok(false)
            );
            assert_eq!(learning.expected(), RailMask::BOTH);
            assert_eq!(learning.seen(), RailMask::of(first));
            assert_eq!(
                learning.arrive(second, RailMask::BOTH, RailMask::BOTH),
                Ok(true)
            );
            assert!(learning.is_complete());
        }
    }

    #[test]
    fn single_rail_completes_at_once() {
        let mut learning = MaskLearning::new();
        assert_eq!(
            learning.arrive(UP, RailMask::SCALE_UP, RailMask::BOTH),
            Ok(true)
        );
        assert_eq!(
            learning.arrive(UP, RailMask::SCALE_UP, RailMask::BOTH),
            Err(MaskError::Duplicate { rail: UP })
        );
    }

    #[test]
    fn each_error() {
        let mut learning = MaskLearning::new();
        let out_only = RailMask::SCALE_OUT;
        assert_eq!(
            learning.arrive(OUT, RailMask::NONE, out_only),
            Err(MaskError::InvalidMask {
                mask: RailMask::NONE,
                allowed: out_only
            })
        );
        assert_eq!(
            learning.arrive(OUT, RailMask::BOTH, out_only),
            Err(MaskError::InvalidMask {
                mask: RailMask::BOTH,
                allowed: out_only
            })
        );
        assert_eq!(
            learning.arrive(OUT, RailMask::SCALE_UP, RailMask::BOTH),
            Err(MaskError::RailNotInMask {
                rail: OUT,
                mask: RailMask::SCALE_UP
            })
        );
        assert_eq!(learning, MaskLearning::new());
        assert_eq!(
            learning.arrive(OUT, RailMask::BOTH, RailMask::BOTH),
            Ok(false)
        );
        assert_eq!(
            learning.arrive(UP, RailMask::SCALE_UP, RailMask::BOTH),
            Err(MaskError::Mismatch {
                learned: RailMask::BOTH,
                got: RailMask::SCALE_UP
            })
        );
        assert_eq!(
            learning.arrive(OUT, RailMask::BOTH, RailMask::BOTH),
            Err(MaskError::Duplicate { rail: OUT })
        );
        assert_eq!(learning.seen(), RailMask::SCALE_OUT);
    }

    #[test]
    fn messages_carry_context() {
        let text = MaskError::Mismatch {
            learned: RailMask::BOTH,
            got: RailMask::SCALE_UP,
        }
        .to_string();
        assert!(text.contains("sup") && text.contains("sout+sup"));
        let text = MaskError::RailNotInMask {
            rail: OUT,
            mask: RailMask::SCALE_UP,
        }
        .to_string();
        assert!(text.contains("rail sout"));
        assert!(MaskError::Duplicate { rail: UP }
            .to_string()
            .contains("rail sup"));
        let text = MaskError::InvalidMask {
            mask: RailMask(4),
            allowed: RailMask::BOTH,
        }
        .to_string();
        assert!(text.contains("invalid(0x04)"));
    }

    fn any_rail() -> impl Strategy<Value = Rail> {
        prop_oneof![Just(OUT), Just(UP)]
    }

    proptest! {
        #[test]
        fn completes_exactly_on_last_rail(mask in 1u8..=3, reverse in any::<bool>()) {
            let mask = RailMask(mask);
            let mut order: Vec<Rail> = mask.rails().collect();
            if reverse {
                order.reverse();
            }
            let mut learning = MaskLearning::new();
            for (position, rail) in order.iter().enumerate() {
                let last = position + 1 == order.len();
                prop_assert_eq!(learning.arrive(*rail, mask, RailMask::BOTH), Ok(last));
                prop_assert_eq!(learning.is_complete(), last);
            }
        }

        #[test]
        fn errors_never_change_state(
            arrivals in proptest::collection::vec((any_rail(), 0u8..=7, 1u8..=3), 0..10),
        ) {
            let mut learning = MaskLearning::new();
            for (rail, mask, allowed) in arrivals {
                let before = learning;
                match learning.arrive(rail, RailMask(mask), RailMask(allowed)) {
                    Ok(complete) => {
                        prop_assert_eq!(complete, learning.is_complete());
                        prop_assert!(learning.seen().is_subset_of(learning.expected()));
                    }
                    Err(_) => prop_assert_eq!(learning, before),
                }
            }
        }
    }
}
