//! A per-rail progress watchdog (docs/PROTOCOL.md §10, "What starts a failover"): a rail whose
//! parts stopped completing while the other rail's still complete has failed silently, and is
//! failed over before its queue pairs' retries run out (4.3 s × 7 with NCCL's defaults).
//!
//! Why both rails: a rail with nothing completing for a while may only be slow (a long part, a
//! congested link, a stalled peer); the other rail completing meanwhile says the peer and its
//! process are there and moving, so the stall is this rail's. A rail with nothing in flight, or
//! an other rail with nothing completing, proves nothing: the watchdog stays quiet and the QPs'
//! retries decide.

/// What a rail of one connection is doing, as the sender's busy clock tracks it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RailProgress {
    /// Parts posted and not completed.
    pub in_flight: u32,
    /// When the rail last made progress: its last completion, or its first post since it was
    /// idle (monotonic ns).
    pub last_progress_ns: u64,
}

/// Whether `rail` has stalled at `now`: parts in flight and no progress for `limit_ns`, while
/// `other` made progress within the last `limit_ns` (a completion, or parts posted on it
/// since it was idle that are moving). Never with `limit_ns` 0 (the watchdog off).
#[inline]
pub fn stalled(rail: RailProgress, other: RailProgress, now: u64, limit_ns: u64) -> bool {
    limit_ns != 0
        && rail.in_flight > 0
        && now.saturating_sub(rail.last_progress_ns) >= limit_ns
        && other.last_progress_ns > rail.last_progress_ns
        && now.saturating_sub(other.last_progress_ns) < limit_ns
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn progress(in_flight: u32, last_ms: u64) -> RailProgress {
        RailProgress {
            in_flight,
            last_progress_ns: last_ms * MS,
        }
    }

    #[test]
    fn a_rail_stalls_only_while_the_other_moves_on() {
        let limit = 100 * MS;
        // SUP stuck since 0 with parts in flight, SOUT completed at 150: stalled at 150.
        assert!(stalled(progress(3, 0), progress(2, 150), 150 * MS, limit));
        assert!(
            !stalled(progress(3, 0), progress(2, 150), 99 * MS, limit),
            "not long enough"
        );
        assert!(
            !stalled(progress(0, 0), progress(2, 150), 150 * MS, limit),
            "nothing in flight"
        );
        // The other rail quiet too: the peer may be slow or gone; the QPs' retries decide.
        assert!(!stalled(progress(3, 0), progress(2, 20), 150 * MS, limit));
        assert!(!stalled(progress(3, 0), progress(0, 0), 150 * MS, limit));
        assert!(
            !stalled(progress(3, 0), progress(2, 150), 150 * MS, 0),
            "off"
        );
    }

    proptest::proptest! {
        /// Never both rails at once: a stall is one rail's, judged against the other.
        #[test]
        fn never_both_rails_at_once(
            a in 0u32..4, b in 0u32..4, at in 0u64..1_000, bt in 0u64..1_000,
            now in 0u64..2_000, limit in 0u64..500,
        ) {
            let (x, y) = (progress(a, at), progress(b, bt));
            let now = now * MS;
            proptest::prop_assert!(!(stalled(x, y, now, limit * MS) && stalled(y, x, now, limit * MS)));
        }
    }
}
