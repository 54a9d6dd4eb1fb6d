//! Receive credits for one rail's shared receive queue (docs/PROTOCOL.md §8).
//!
//! Why: with an SRQ every RDMA_WRITE_WITH_IMM on any QP of the rail consumes one generic
//! receive. If the SRQ runs dry the sender hits RNR and stalls, so the receiver keeps the depth
//! between a low and a high water mark: when fewer than `low` remain it tops up to `high` in one
//! batch (cheap: one post call), checked in `irecv` (primary) and in `test` (safety, for long
//! compute phases). The hit and refill counters feed telemetry: frequent low-water hits mean the
//! marks are too tight for the traffic.
//!
//! A receive completion when the count is zero means a receive was consumed that we never
//! posted: the accounting is broken, which is a protocol error, not something to clamp away.

use std::fmt;

/// Default low-water mark (`MPIB_SRQ_LOW_WATER`, docs/PROTOCOL.md §8).
pub const SRQ_LOW_WATER: u32 = 64;
/// Default high-water mark: the SRQ depth after a refill.
pub const SRQ_HIGH_WATER: u32 = 512;

/// Posted-receive accounting of one SRQ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SrqCredits {
    posted: u32,
    low: u32,
    high: u32,
    low_water_hits: u64,
    refills: u64,
}

/// A completion consumed a receive that was never posted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SrqUnderflow;

impl fmt::Display for SrqUnderflow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            "SRQ receive completion with no posted receive left (receive accounting broken)",
        )
    }
}

impl std::error::Error for SrqUnderflow {}

impl SrqCredits {
    /// Empty SRQ with the given marks; `low <= high` (a larger `low` is treated as `high`).
    #[inline]
    pub const fn new(low: u32, high: u32) -> Self {
        debug_assert!(low <= high);
        SrqCredits {
            posted: 0,
            low: if low > high { high } else { low },
            high,
            low_water_hits: 0,
            refills: 0,
        }
    }

    /// Receives currently posted and not consumed.
    #[inline]
    pub const fn posted(&self) -> u32 {
        self.posted
    }

    /// Refill threshold.
    #[inline]
    pub const fn low_water(&self) -> u32 {
        self.low
    }

    /// Depth after a refill.
    #[inline]
    pub const fn high_water(&self) -> u32 {
        self.high
    }

    /// Receives to post now: `high - posted` when `posted < low` (counting a low-water hit),
    /// else 0.
    #[inline]
    pub fn refill_needed(&mut self) -> u32 {
        if self.posted < self.low {
            self.low_water_hits += 1;
            self.high - self.posted
        } else {
            0
        }
    }

    /// Receives to post before a new CTS goes out while `in_flight` slots (this one included) may
    /// still each bring one IMM on this rail: refills to `high` whenever `posted` is under the
    /// low-water mark or under `in_flight`. The count of posted receives only drops when their
    /// completions are polled, so without the second condition a burst of receives posted with
    /// no `test` in between could bring more IMMs than the SRQ still holds (an RNR stall).
    #[inline]
    pub fn refill_needed_for(&mut self, in_flight: u32) -> u32 {
        let floor = in_flight.min(self.high);
        if self.posted < self.low {
            self.refill_needed()
        } else if self.posted < floor {
            self.high - self.posted
        } else {
            0
        }
    }

    /// `n` receives were posted successfully (possibly fewer than asked, when the post failed
    /// part way); counts a refill when `n > 0`. Posting beyond `high` is a caller bug.
    #[inline]
    pub fn on_posted(&mut self, n: u32) {
        debug_assert!(
            self.posted.saturating_add(n) <= self.high,
            "posted {} + {n} receives exceeds the high-water mark {}",
            self.posted,
            self.high
        );
        if n > 0 {
            self.posted = self.posted.saturating_add(n);
            self.refills += 1;
        }
    }

    /// One receive completion consumed one posted receive.
    #[inline]
    pub fn on_consumed(&mut self) -> Result<(), SrqUnderflow> {
        self.posted = self.posted.checked_sub(1).ok_or(SrqUnderflow)?;
        Ok(())
    }

    /// Times a check found the SRQ below the low-water mark.
    #[inline]
    pub const fn low_water_hits(&self) -> u64 {
        self.low_water_hits
    }

    /// Refill batches posted.
    #[inline]
    pub const fn refills(&self) -> u64 {
        self.refills
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
    fn initial_fill_then_threshold() {
        let mut srq = SrqCredits::default();
        assert_eq!((srq.low_water(), srq.high_water()), (64, 512));
        assert_eq!(srq.refill_needed(), 512);
        srq.on_posted(512);
        assert_eq!(
            (srq.posted(), srq.refills(), srq.low_water_hits()),
            (512, 1, 1)
        );
        for _ in 0..448 {
            srq.on_consumed().unwrap();
        }
        assert_eq!(srq.refill_needed(), 0); // exactly at low: no refill
        srq.on_consumed().unwrap();
        assert_eq!(srq.refill_needed(), 449);
        assert_eq!(srq.low_water_hits(), 2);
    }

    #[test]
    fn underflow_detected() {
        let mut srq = SrqCredits::new(1, 2);
        assert_eq!(srq.on_consumed(), Err(SrqUnderflow));
        assert_eq!(srq.posted(), 0);
        srq.on_posted(1);
        assert_eq!(srq.on_consumed(), Ok(()));
        assert_eq!(srq.on_consumed(), Err(SrqUnderflow));
        assert!(SrqUnderflow.to_string().contains("no posted receive"));
    }

    #[test]
    fn empty_post_is_not_a_refill() {
        let mut srq = SrqCredits::new(1, 4);
        srq.on_posted(0);
        assert_eq!(srq.refills(), 0);
    }

    proptest! {
        #[test]
        fn stays_within_marks(
            low in 0u32..64,
            extra in 0u32..64,
            ops in proptest::collection::vec((any::<bool>(), any::<bool>(), 0u32..100), 0..300),
        ) {
            let high = low + extra;
            let mut srq = SrqCredits::new(low, high);
            for (consume, complete_post, partial_percent) in ops {
                if consume {
                    let before = srq.posted();
                    match srq.on_consumed() {
                        Ok(()) => prop_assert_eq!(srq.posted(), before - 1),
                        Err(SrqUnderflow) => prop_assert_eq!(before, 0),
                    }
                } else {
                    let posted = srq.posted();
                    let needed = srq.refill_needed();
                    prop_assert_eq!(needed, if posted < low { high - posted } else { 0 });
                    if complete_post {
                        srq.on_posted(needed);
                        if posted < low {
                            prop_assert_eq!(srq.posted(), high);
                        }
                    } else {
                        // A post that failed part way.
                        srq.on_posted(needed * partial_percent / 100);
                    }
                }
                prop_assert!(srq.posted() <= high);
            }
        }
    }

    proptest! {
        /// After a refill for `in_flight` slots, the SRQ holds at least that many receives (up to
        /// its high-water mark) and never more than the mark.
        #[test]
        fn a_refill_covers_every_slot_in_flight(consumed in 0u32..512, in_flight in 0u32..600) {
            let mut credits = SrqCredits::new(SRQ_LOW_WATER, SRQ_HIGH_WATER);
            credits.on_posted(SRQ_HIGH_WATER);
            for _ in 0..consumed {
                credits.on_consumed().unwrap();
            }
            let needed = credits.refill_needed_for(in_flight);
            credits.on_posted(needed);
            prop_assert!(credits.posted() >= in_flight.min(SRQ_HIGH_WATER));
            prop_assert!(credits.posted() >= SRQ_LOW_WATER);
            prop_assert!(credits.posted() <= SRQ_HIGH_WATER);
        }
    }
}
