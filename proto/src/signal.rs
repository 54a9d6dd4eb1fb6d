//! When a CTS write is signalled (docs/PROTOCOL.md §2, docs/NCCL_NET_ABI.md §3.2).
//!
//! Why signal at all: CTS writes are unsignaled to keep them cheap, but an unsignaled WR is only
//! retired from the send queue when a later WR on the same QP completes signaled. On RC, a
//! signaled completion retires every earlier unsignaled WR on that QP, because the QP executes
//! and completes in order. Without a periodic signaled WR the CTS QP's send queue fills and
//! `post_send` fails (the overflow early MPIB hit when CTS was spread over several QPs).
//!
//! Why this rule works: CTS is pinned to one QP (`QpLayout::cts_qp`), so "every `interval`
//! slots" is a statement about that single queue: at most `interval` CTS writes are posted
//! between two signaled ones, and the send queue needs room for that many plus those still in
//! flight when the signaled completion is polled. The interval is a power of two dividing the
//! 256 FIFO slots, so the signaled slots recur at the same positions on every FIFO lap.

/// Largest interval: one signaled CTS per FIFO lap of 256 slots.
pub const MAX_CTS_SIGNAL_INTERVAL: u16 = 256;

/// Which CTS writes are posted signaled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CtsSignalPolicy {
    interval: u16,
}

impl CtsSignalPolicy {
    /// Policy signalling every `interval` slots. `interval` must be a power of two in
    /// `1..=256` (checked by `params`; debug builds assert). Release builds sanitize a bad value
    /// to the largest power of two not above it, within `1..=256`, rather than divide by zero.
    #[inline]
    pub fn new(interval: u16) -> CtsSignalPolicy {
        debug_assert!(
            CtsSignalPolicy::is_valid_interval(interval),
            "CTS signal interval {interval} is not a power of two in 1..=256"
        );
        let clamped = interval.clamp(1, MAX_CTS_SIGNAL_INTERVAL);
        let power_of_two = 1u16 << (15 - clamped.leading_zeros());
        CtsSignalPolicy {
            interval: power_of_two,
        }
    }

    /// Whether `interval` is acceptable to [`CtsSignalPolicy::new`].
    #[inline]
    pub const fn is_valid_interval(interval: u16) -> bool {
        interval.is_power_of_two() && interval <= MAX_CTS_SIGNAL_INTERVAL
    }

    /// Whether the CTS for `slot` is posted signaled: `slot % interval == 0`.
    #[inline]
    pub const fn is_signaled(self, slot: u8) -> bool {
        slot as u16 % self.interval == 0
    }

    /// The interval in slots.
    #[inline]
    pub const fn interval(self) -> u16 {
        self.interval
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn default_interval_signals_twice_per_lap() {
        let policy = CtsSignalPolicy::new(128);
        let signaled: Vec<u8> = (0..=255u8).filter(|s| policy.is_signaled(*s)).collect();
        assert_eq!(signaled, vec![0, 128]);
        assert_eq!(policy.interval(), 128);
    }

    #[test]
    fn extremes() {
        assert!((0..=255u8).all(|s| CtsSignalPolicy::new(1).is_signaled(s)));
        let lap = CtsSignalPolicy::new(256);
        assert_eq!((0..=255u8).filter(|s| lap.is_signaled(*s)).count(), 1);
        assert!(lap.is_signaled(0));
    }

    #[test]
    fn validity() {
        assert!(CtsSignalPolicy::is_valid_interval(1));
        assert!(CtsSignalPolicy::is_valid_interval(256));
        assert!(!CtsSignalPolicy::is_valid_interval(0));
        assert!(!CtsSignalPolicy::is_valid_interval(3));
        assert!(!CtsSignalPolicy::is_valid_interval(512));
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "not a power of two")]
    fn bad_interval_asserts_in_debug() {
        let _ = CtsSignalPolicy::new(96);
    }

    proptest! {
        #[test]
        fn unsignaled_run_bounded(shift in 0u32..=8, start in any::<u8>()) {
            let interval = 1u16 << shift;
            let policy = CtsSignalPolicy::new(interval);
            // Any `interval` consecutive slots contain exactly one signaled slot.
            let hits = (0..interval)
                .filter(|step| policy.is_signaled(start.wrapping_add(*step as u8)))
                .count();
            prop_assert_eq!(hits, 1);
        }
    }
}
