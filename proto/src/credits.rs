//! Send-queue credits for one QP: how many more work requests may be posted.
//!
//! Why counters and not a per-WR table: on an RC QP work requests execute and complete in post
//! order, and a signaled completion retires every earlier unsignaled WR on that QP
//! (docs/PROTOCOL.md §2 and §7). So the QP's state is two wrapping counters: `posted`
//! (advanced when WRs are posted) and `retired` (advanced to the post index carried in a
//! signaled completion's `wr_id`, see `wr_id`). Their difference is what occupies the send queue.
//! Posting more than the queue holds makes `ibv_post_send` fail; this makes that impossible by
//! construction instead of by luck.
//!
//! Wrapping: both counters are `u32` and wrap. Stale completions (an index at or before
//! `retired`) are told apart from new ones by the wrapping distance, which is unambiguous as long
//! as the capacity is at most 2^31, far above any real send queue.

/// Largest capacity for which wrapping distances stay unambiguous.
pub const MAX_SEND_QUEUE_CAPACITY: u32 = 1 << 31;

/// Credit state of one QP's send queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendQueueCredits {
    capacity: u32,
    posted: u32,
    retired: u32,
}

impl SendQueueCredits {
    /// Empty queue of `capacity` WRs (the QP's `max_send_wr`), at most 2^31.
    #[inline]
    pub const fn new(capacity: u32) -> Self {
        debug_assert!(capacity <= MAX_SEND_QUEUE_CAPACITY);
        let capacity = if capacity > MAX_SEND_QUEUE_CAPACITY {
            MAX_SEND_QUEUE_CAPACITY
        } else {
            capacity
        };
        SendQueueCredits {
            capacity,
            posted: 0,
            retired: 0,
        }
    }

    /// Queue capacity in WRs.
    #[inline]
    pub const fn capacity(&self) -> u32 {
        self.capacity
    }

    /// WRs that may still be posted.
    #[inline]
    pub const fn available(&self) -> u32 {
        self.capacity - self.outstanding()
    }

    /// WRs posted and not yet retired.
    #[inline]
    pub const fn outstanding(&self) -> u32 {
        self.posted.wrapping_sub(self.retired)
    }

    /// The post counter: post index of the most recently reserved WR.
    #[inline]
    pub const fn posted_index(&self) -> u32 {
        self.posted
    }

    /// Reserve `n` WRs. Returns the post index of the LAST of them (the counter after
    /// reserving), to be carried in the `wr_id` of the chain's signaled WR; `None`, with
    /// nothing changed, if fewer than `n` are available.
    #[inline]
    pub fn reserve(&mut self, n: u32) -> Option<u32> {
        if n > self.available() {
            return None;
        }
        self.posted = self.posted.wrapping_add(n);
        Some(self.posted)
    }

    /// A signaled WR whose post index is `post_index` completed: it and every earlier WR are
    /// retired. Stale indices (at or before the last retired one) and indices never reserved
    /// are ignored, using wrapping distances.
    #[inline]
    pub fn retire(&mut self, post_index: u32) {
        let distance = post_index.wrapping_sub(self.retired);
        if distance != 0 && distance <= self.outstanding() {
            self.retired = post_index;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn reserve_and_retire() {
        let mut credits = SendQueueCredits::new(4);
        assert_eq!(credits.reserve(3), Some(3));
        assert_eq!((credits.outstanding(), credits.available()), (3, 1));
        assert_eq!(credits.reserve(2), None);
        assert_eq!(credits.outstanding(), 3);
        assert_eq!(credits.reserve(1), Some(4));
        credits.retire(3);
        assert_eq!(credits.outstanding(), 1);
        credits.retire(2); // stale: ignored
        assert_eq!(credits.outstanding(), 1);
        credits.retire(9); // never reserved: ignored
        assert_eq!(credits.outstanding(), 1);
        credits.retire(4);
        assert_eq!((credits.outstanding(), credits.available()), (0, 4));
        assert_eq!(credits.capacity(), 4);
    }

    #[test]
    fn zero_reserve_is_noop() {
        let mut credits = SendQueueCredits::new(0);
        assert_eq!(credits.reserve(0), Some(0));
        assert_eq!(credits.reserve(1), None);
    }

    #[test]
    fn wraps_across_u32_max() {
        // Start the counters just below the wrap (a long-lived QP gets there eventually).
        let near_wrap = u32::MAX - 7;
        let mut credits = SendQueueCredits {
            capacity: 8,
            posted: near_wrap,
            retired: near_wrap,
        };
        let before = credits.reserve(5).unwrap();
        let after = credits.reserve(3).unwrap();
        assert_eq!((before, after), (u32::MAX - 2, 0));
        assert_eq!((credits.outstanding(), credits.available()), (8, 0));
        assert_eq!(credits.reserve(1), None);
        credits.retire(before);
        assert_eq!(credits.outstanding(), 3);
        credits.retire(u32::MAX - 5); // stale across the wrap
        assert_eq!(credits.outstanding(), 3);
        credits.retire(after);
        assert_eq!(credits.outstanding(), 0);
        credits.retire(before); // stale after the wrap
        assert_eq!(credits.outstanding(), 0);
    }

    proptest! {
        #[test]
        fn never_exceeds_capacity(
            capacity in 1u32..64,
            start in any::<u32>(),
            ops in proptest::collection::vec((any::<bool>(), 0u32..16, 0u32..80), 0..200),
        ) {
            // Start anywhere on the counter circle (including just before the wrap).
            let mut credits = SendQueueCredits { capacity, posted: start, retired: start };
            let mut signaled = Vec::new();
            for (post, n, back) in ops {
                if post {
                    if let Some(index) = credits.reserve(n) {
                        signaled.push(index);
                    }
                } else if let Some(index) = signaled.get(back as usize % signaled.len().max(1)) {
                    // Completions may be replayed or arrive stale; none may break the bound.
                    credits.retire(*index);
                }
                prop_assert!(credits.outstanding() <= capacity);
                prop_assert_eq!(credits.available() + credits.outstanding(), capacity);
            }
            credits.retire(credits.posted_index());
            prop_assert_eq!(credits.outstanding(), 0);
        }
    }
}
