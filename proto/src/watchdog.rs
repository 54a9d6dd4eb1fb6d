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
    /// When its last completion came (0: none).
    pub last_completion_ns: u64,
    /// When the part that completed last was posted (0: none).
    pub last_completed_post_ns: u64,
}

/// Whether `rail` has stalled at `now`: parts in flight and no progress for `limit_ns`, while
/// `other` completed, within the last `limit_ns`, a part posted after `rail` last made
/// progress: the peer is taking newer work on the other rail while this one's older parts
/// wait. A part that is merely long (a big transfer, split so that both rails' parts take
/// about as long) leaves the other rail's parts of the same transfers no newer than it, and
/// posting alone proves nothing. Never with `limit_ns` 0 (the watchdog off).
#[inline]
pub fn stalled(rail: RailProgress, other: RailProgress, now: u64, limit_ns: u64) -> bool {
    limit_ns != 0
        && rail.in_flight > 0
        && now.saturating_sub(rail.last_progress_ns) >= limit_ns
        && other.last_completed_post_ns > rail.last_progress_ns
        && now.saturating_sub(other.last_completion_ns) < limit_ns
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// A rail in flight since `last_ms` that last completed, at `done_ms`, a part posted at
    /// `posted_ms`.
    fn progress(in_flight: u32, last_ms: u64, done_ms: u64, posted_ms: u64) -> RailProgress {
        RailProgress {
            in_flight,
            last_progress_ns: last_ms * MS,
            last_completion_ns: done_ms * MS,
            last_completed_post_ns: posted_ms * MS,
        }
    }

    #[test]
    fn a_rail_stalls_only_while_the_other_completes_newer_parts() {
        let limit = 100 * MS;
        // SUP stuck since 10 with parts in flight; SOUT completed at 150 a part posted at 40.
        let sup = progress(3, 10, 10, 5);
        let sout = progress(2, 150, 150, 40);
        assert!(stalled(sup, sout, 150 * MS, limit));
        assert!(!stalled(sup, sout, 109 * MS, limit), "not long enough");
        assert!(
            !stalled(progress(0, 10, 10, 5), sout, 150 * MS, limit),
            "nothing in flight"
        );
        assert!(!stalled(sup, sout, 150 * MS, 0), "off");
        // A long part: SOUT's part of the same transfer (posted with SUP's, at 10) done first.
        assert!(!stalled(sup, progress(2, 150, 150, 10), 150 * MS, limit));
        // The other rail quiet too (its last completion long ago, or none): the QPs decide.
        assert!(!stalled(sup, progress(2, 40, 40, 30), 150 * MS, limit));
        assert!(
            !stalled(sup, progress(2, 150, 0, 0), 150 * MS, limit),
            "posted, never done"
        );
    }

    proptest::proptest! {
        /// Never both rails at once: a stall is one rail's, judged against the other.
        #[test]
        fn never_both_rails_at_once(
            a in 0u32..4, b in 0u32..4, at in 0u64..1_000, bt in 0u64..1_000,
            ad in 0u64..1_000, bd in 0u64..1_000, now in 0u64..2_000, limit in 0u64..500,
        ) {
            // A completion is progress, after its part's post: progress is at least as late.
            let x = progress(a, at.max(ad), ad, ad.min(at));
            let y = progress(b, bt.max(bd), bd, bd.min(bt));
            let now = now * MS;
            proptest::prop_assert!(!(stalled(x, y, now, limit * MS) && stalled(y, x, now, limit * MS)));
        }
    }
}
