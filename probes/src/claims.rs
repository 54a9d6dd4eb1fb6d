//! Which connection slot a claim takes: the writer's own bookkeeping, in process memory (no
//! reader of the file can steer it).
//!
//! A closed slot keeps its final counters for [`crate::REUSE_LINGER_NS`] so that a collector
//! polling every second sees them. The writer keeps its closed slots in the order they closed
//! and reuses the oldest once it has lingered; until then it takes a slot never used, the next
//! above the high-water mark. So a claim costs the same whatever the table holds (a scan from
//! the bottom costs one load per slot in use, thousands in NCCL's setup), and the slots in use
//! stay below the most that were open at once plus those lingering: the high-water mark, past
//! which readers do not look, follows the job's peak rather than its history.

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};

/// A slot to claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Candidate {
    /// Never claimed: its state is `UNUSED`.
    Fresh(u32),
    /// Closed at least the linger time ago: its state is `CLOSED`.
    Lingered(u32),
}

impl Candidate {
    pub(crate) fn index(self) -> u32 {
        match self {
            Candidate::Fresh(index) | Candidate::Lingered(index) => index,
        }
    }
}

#[derive(Debug, Default)]
struct Inner {
    /// The first slot never handed out.
    fresh: u32,
    /// Closed slots and when each closed (ns), oldest first.
    closed: VecDeque<(u32, u64)>,
}

/// The writer's free slots: never used, and closed in order.
#[derive(Debug, Default)]
pub(crate) struct FreeSlots {
    inner: Mutex<Inner>,
}

impl FreeSlots {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // The inner state is consistent between statements: a panicking thread leaves it whole.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The slot to claim now, of a table of `count`: the oldest closed one that has lingered
    /// `linger_ns` by `now`, else the next never used; `None` when every slot is in use or
    /// lingering. A candidate the caller cannot claim after all (its state in the file is not
    /// what this bookkeeping says) is simply not taken again.
    pub(crate) fn take(&self, now: u64, linger_ns: u64, count: u32) -> Option<Candidate> {
        let mut inner = self.lock();
        if let Some(&(index, closed)) = inner.closed.front() {
            if now.saturating_sub(closed) >= linger_ns {
                inner.closed.pop_front();
                return Some(Candidate::Lingered(index));
            }
        }
        (inner.fresh < count).then(|| {
            inner.fresh += 1;
            Candidate::Fresh(inner.fresh - 1)
        })
    }

    /// Slot `index` closed at `at` (ns).
    pub(crate) fn closed(&self, index: u32, at: u64) {
        self.lock().closed.push_back((index, at));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lingered_slots_are_reused_oldest_first_and_fresh_ones_fill_the_gap() {
        let free = FreeSlots::default();
        let take = |now| free.take(now, 100, 4);
        assert_eq!(take(0), Some(Candidate::Fresh(0)));
        assert_eq!(take(0), Some(Candidate::Fresh(1)));
        free.closed(1, 10);
        free.closed(0, 20);
        // Neither has lingered: a fresh one.
        assert_eq!(take(50), Some(Candidate::Fresh(2)));
        // Slot 1 closed first.
        assert_eq!(take(110), Some(Candidate::Lingered(1)));
        assert_eq!(take(115), Some(Candidate::Fresh(3)));
        // The table is used up and slot 0 still lingers: nothing.
        assert_eq!(take(115), None);
        assert_eq!(take(120), Some(Candidate::Lingered(0)));
        assert_eq!(take(1000), None);
    }
}
