//! Writer lanes: which copy of the hot counters the calling thread writes.
//!
//! A thread's first update to a probes file claims a free lane of that file with one
//! compare-and-swap on the lane's `owner` word and remembers it in a thread-local lease; every
//! later update finds the lease in a one-entry cache (a thread-local load and a compare). When
//! the thread exits, the lease's destructor releases the lane with a Release store, so the next
//! thread's Acquire claim sees every count the last one wrote and goes on from there: counts are
//! never reset, only handed on. A thread that finds every owned lane taken writes the shared
//! lane with locked adds (counted in the process block's `lane_overflows`).
//!
//! The lease holds the file only weakly: a file dropped before the thread exits is not kept
//! mapped, and its lease then releases nothing.

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use crate::declared::WRITER_LANE_OVERFLOWS;
use crate::layout::{FileImage, SHARED_LANE};
use crate::writer::Owner;

/// A thread's lane in one file.
struct Lease {
    serial: u64,
    lane: usize,
    file: Weak<Owner>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.lane == SHARED_LANE {
            return;
        }
        if let Some(owner) = self.file.upgrade() {
            // SYNC: pairs with the Acquire compare-and-swap in `claim`: the next owner sees
            // every store this thread made to the lane.
            owner.image().lanes[self.lane]
                .owner
                .store(0, Ordering::Release);
        }
    }
}

thread_local! {
    /// The last (file serial, lane) this thread used: the hot path's whole lookup.
    static LAST: Cell<(u64, usize)> = const { Cell::new((0, 0)) };
    /// Every lane this thread holds, one per file it has written.
    static LEASES: RefCell<Vec<Lease>> = const { RefCell::new(Vec::new()) };
    /// This thread's owner token (non-zero once taken).
    static TOKEN: Cell<u64> = const { Cell::new(0) };
}

/// The lane the calling thread writes in the file `owner` (claiming one on first use).
#[inline]
pub(crate) fn lane_of(owner: &Arc<Owner>) -> usize {
    let serial = owner.serial();
    match LAST.try_with(Cell::get) {
        Ok((last, lane)) if last == serial => lane,
        // A thread being torn down (its thread-locals gone) writes the shared lane.
        Err(_) => SHARED_LANE,
        Ok(_) => lease_lane(owner, serial),
    }
}

#[cold]
fn lease_lane(owner: &Arc<Owner>, serial: u64) -> usize {
    let lane = LEASES
        .try_with(|leases| {
            let mut leases = leases.borrow_mut();
            if let Some(lease) = leases.iter().find(|l| l.serial == serial) {
                return lease.lane;
            }
            // Leases of dropped files hold nothing any more.
            leases.retain(|l| l.file.strong_count() > 0);
            let lane = claim(owner.image(), token());
            leases.push(Lease {
                serial,
                lane,
                file: Arc::downgrade(owner),
            });
            lane
        })
        .unwrap_or(SHARED_LANE);
    let _ = LAST.try_with(|last| last.set((serial, lane)));
    lane
}

fn token() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    TOKEN
        .try_with(|token| {
            if token.get() == 0 {
                token.set(NEXT.fetch_add(1, Ordering::Relaxed));
            }
            token.get()
        })
        .unwrap_or(u64::MAX)
}

/// Take the first free owned lane for `token`, or the shared lane when none is free.
fn claim(image: &FileImage, token: u64) -> usize {
    for (lane, block) in image.lanes[..SHARED_LANE].iter().enumerate() {
        // SYNC: Acquire pairs with the Release store of the lease that freed this lane.
        let free = block.owner.load(Ordering::Relaxed) == 0
            && block
                .owner
                .compare_exchange(0, token, Ordering::Acquire, Ordering::Relaxed)
                .is_ok();
        if free {
            block.claims.fetch_add(1, Ordering::Relaxed);
            return lane;
        }
    }
    image.process.values[WRITER_LANE_OVERFLOWS.slot()].fetch_add(1, Ordering::Relaxed);
    SHARED_LANE
}
