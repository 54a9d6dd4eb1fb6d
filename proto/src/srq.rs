//! What one receive connection holds of its rail's shared receive queue (docs/PROTOCOL.md §8).
//!
//! Why: every RDMA_WRITE_WITH_IMM on any QP of the rail consumes one generic receive of the
//! shared queue ([`crate::srq_shared`]), and an IMM that finds it empty stalls its sender (RNR).
//! A connection therefore posts a receive (its CTS) only when it *holds* a receive of the queue
//! for each of its outstanding receives, counting every IMM of its own against its holding.
//! When its holding falls short of what it has outstanding, it takes the shortfall and a batch
//! (`low`, `MPIB_SRQ_LOW_WATER`) more from the queue's ledger; it never holds more than `high`
//! (`MPIB_SRQ_HIGH_WATER`, which so also bounds its outstanding receives), and gives back what it
//! holds beyond two batches over its outstanding receives, and an idle connection beyond one, so
//! that an idle connection keeps no more than a batch.
//!
//! An IMM when the holding is zero means a receive was consumed that was never granted: the
//! accounting is broken, which is a protocol error, not something to clamp away.

use std::fmt;

/// Default batch a connection takes beyond its shortfall (`MPIB_SRQ_LOW_WATER`).
pub const SRQ_LOW_WATER: u32 = 8;
/// Default most receives a connection holds (`MPIB_SRQ_HIGH_WATER`).
pub const SRQ_HIGH_WATER: u32 = 512;

/// One connection's holding of one rail's shared receive queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SrqCredits {
    held: u32,
    low: u32,
    high: u32,
}

/// A completion consumed a receive that was never granted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SrqUnderflow;

impl fmt::Display for SrqUnderflow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            "SRQ receive completion with no granted receive left (receive accounting broken)",
        )
    }
}

impl std::error::Error for SrqUnderflow {}

impl SrqCredits {
    /// Nothing held; takes `low` beyond a shortfall and holds at most `high` (`low <= high`; a
    /// larger `low` is treated as `high`).
    #[inline]
    pub const fn new(low: u32, high: u32) -> Self {
        debug_assert!(low <= high);
        SrqCredits {
            held: 0,
            low: if low > high { high } else { low },
            high,
        }
    }

    /// Receives held and not consumed.
    #[inline]
    pub const fn held(&self) -> u32 {
        self.held
    }

    /// The batch taken beyond a shortfall.
    #[inline]
    pub const fn low_water(&self) -> u32 {
        self.low
    }

    /// Most receives held.
    #[inline]
    pub const fn high_water(&self) -> u32 {
        self.high
    }

    /// Receives to ask the shared queue for while `in_flight` IMMs may still come (one per
    /// receive outstanding, the one about to be posted included, and one more per receive
    /// awaiting a replay): 0 when the holding covers them, else the shortfall and a batch,
    /// within the most held.
    #[inline]
    pub fn wanted(&self, in_flight: u32) -> u32 {
        // After a failover each slot awaiting the sender may bring one IMM more
        // (crate::recv_slots): up to twice the most held, for a while, and no batch beyond.
        let ceiling = in_flight.clamp(self.high, self.high.saturating_mul(2));
        let needed = in_flight.min(ceiling);
        if self.held >= needed {
            0
        } else {
            needed.saturating_add(self.low).min(ceiling) - self.held
        }
    }

    /// Whether the holding covers `in_flight` receives.
    #[inline]
    pub const fn covers(&self, in_flight: u32) -> bool {
        self.held >= in_flight
    }

    /// Receives to give back with `in_flight` outstanding: down to one batch over them once the
    /// holding exceeds two; idle (nothing in flight), down to one batch as soon as it holds more,
    /// so that an idle connection borrows nothing beyond its floor (with the default batch).
    #[inline]
    pub fn excess(&self, in_flight: u32) -> u32 {
        let keep = in_flight.saturating_add(self.low);
        let limit = match in_flight {
            0 => keep,
            _ => keep.saturating_add(self.low),
        };
        if self.held > limit {
            self.held - keep
        } else {
            0
        }
    }

    /// A take granted `n` receives. Holding more than twice `high` (the most, while slots await
    /// replays after a failover: [`SrqCredits::wanted`]) is a caller bug.
    #[inline]
    pub fn on_granted(&mut self, n: u32) {
        debug_assert!(
            self.held.saturating_add(n) <= self.high.saturating_mul(2),
            "holding {} + {n} receives exceeds twice the most held {}",
            self.held,
            self.high
        );
        self.held = self.held.saturating_add(n);
    }

    /// `n` receives went back to the shared queue.
    #[inline]
    pub fn on_given_back(&mut self, n: u32) {
        self.held = self.held.saturating_sub(n);
    }

    /// One receive completion consumed one held receive.
    #[inline]
    pub fn on_consumed(&mut self) -> Result<(), SrqUnderflow> {
        self.held = self.held.checked_sub(1).ok_or(SrqUnderflow)?;
        Ok(())
    }
}

impl Default for SrqCredits {
    fn default() -> Self {
        SrqCredits::new(SRQ_LOW_WATER, SRQ_HIGH_WATER)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_shortfall_takes_a_batch_more_and_an_idle_holding_gives_back() {
        let mut srq = SrqCredits::default();
        assert_eq!((srq.low_water(), srq.high_water()), (8, 512));
        assert_eq!(srq.wanted(1), 9);
        srq.on_granted(9);
        assert!(srq.covers(9) && !srq.covers(10));
        assert_eq!(srq.wanted(9), 0, "covered: nothing to take");
        assert_eq!(srq.wanted(10), 9);
        srq.on_granted(5);
        assert_eq!(srq.held(), 14);
        assert_eq!(
            srq.excess(1),
            0,
            "within two batches over what is in flight"
        );
        assert_eq!(srq.excess(0), 6, "idle: down to one batch");
        assert_eq!(
            srq.wanted(510),
            512 - 14,
            "a batch more, within the most held"
        );
        assert_eq!(
            srq.wanted(600),
            600 - 14,
            "past the most held (replays awaited after a failover): what is in flight, no batch"
        );
        assert_eq!(
            srq.wanted(5000),
            1024 - 14,
            "never beyond twice the most held"
        );
        srq.on_granted(512 - 14);
        assert_eq!(srq.excess(4), 512 - 12);
        srq.on_given_back(srq.excess(4));
        assert_eq!(srq.held(), 12);
    }

    #[test]
    fn underflow_detected() {
        let mut srq = SrqCredits::new(1, 2);
        assert_eq!(srq.on_consumed(), Err(SrqUnderflow));
        assert_eq!(srq.held(), 0);
        srq.on_granted(1);
        assert_eq!(srq.on_consumed(), Ok(()));
        assert_eq!(srq.on_consumed(), Err(SrqUnderflow));
        assert!(SrqUnderflow.to_string().contains("no granted receive"));
    }

    proptest! {
        /// Whatever the sequence, a full grant covers what is in flight (up to twice the most
        /// held), the holding stays within that, and giving back keeps what is in flight.
        #[test]
        fn a_grant_covers_what_is_in_flight(
            low in 0u32..64,
            extra in 1u32..600,
            ops in proptest::collection::vec((0u8..3, 0u32..700), 0..200),
        ) {
            let high = low + extra;
            let mut srq = SrqCredits::new(low, high);
            for (op, in_flight) in ops {
                match op {
                    0 => {
                        let wanted = srq.wanted(in_flight);
                        srq.on_granted(wanted);
                        prop_assert!(srq.covers(in_flight.min(2 * high)));
                    }
                    1 => {
                        let before = srq.held();
                        let n = srq.excess(in_flight);
                        srq.on_given_back(n);
                        prop_assert!(n == 0 || srq.held() >= in_flight.min(before));
                    }
                    _ => {
                        let before = srq.held();
                        match srq.on_consumed() {
                            Ok(()) => prop_assert_eq!(srq.held(), before - 1),
                            Err(SrqUnderflow) => prop_assert_eq!(before, 0),
                        }
                    }
                }
                prop_assert!(srq.held() <= 2 * high);
            }
        }
    }
}
