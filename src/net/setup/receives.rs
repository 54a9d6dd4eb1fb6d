//! Receive queues shared per NIC: every receive connection on a NIC draws its receives from one
//! of a few shared receive queues there, instead of keeping a queue of its own (issue: a NIC's
//! `max_srq` and memory at thousands of connections; docs/PROTOCOL.md §8 "Receives shared per
//! rail").
//!
//! A queue serves connections while its ledger admits them (`mpib_proto::srq_shared`: every
//! member's floor fits), 128 to a queue by default; the next connection opens another.
//! A queue lives as long as a connection uses it: each connection holds it ([`Membership`]),
//! the NIC keeps only a weak reference to find it, and the last connection to leave destroys it
//! and gives its `max_srq` share back. Each connection still has its own completion queue, so
//! the NIC routes every receive completion to its connection by QP; the lock here is taken only
//! to take or give back receives (a batch at a time) and to settle consumption every
//! [`SETTLE_EVERY`] IMMs, never per transfer.

use std::sync::{Arc, Mutex, MutexGuard, Weak};

use crate::error::{Error, Result};
use crate::fabric::{Rail, RailDevice, SharedReceiveQueue};
use crate::log;
use crate::net::setup::budget::{Hold, NicBudget};
use crate::proto::srq_shared::{SharedSrqLedger, SHARED_SRQ_CAPACITY, SHARED_SRQ_FLOOR};
use crate::proto::wr_id::receive_wr_id;

/// A member settles what its IMMs consumed once this many went unreported, so that the ledger's
/// view of the queue (what it can still grant) lags by little.
pub(crate) const SETTLE_EVERY: u32 = 32;

/// The shared receive queues of one NIC.
pub(crate) struct SharedReceives {
    device: Arc<dyn RailDevice>,
    budget: Arc<NicBudget>,
    rail: Rail,
    capacity: u32,
    queues: Mutex<Vec<Weak<SharedQueue>>>,
}

/// One shared receive queue and its ledger. Only the ledger has a lock: posting is thread-safe
/// (`SharedReceiveQueue` takes `&self`), so creating a QP on the queue (a verb of tens of
/// milliseconds on emulated rails) holds no lock a member's data path takes, and a take posts
/// under the ledger's lock so that the count and the queue move together.
pub(crate) struct SharedQueue {
    ledger: Mutex<SharedSrqLedger>,
    srq: Box<dyn SharedReceiveQueue>,
    rail: Rail,
    /// Its share of the NIC's `max_srq`, given back when the queue is destroyed.
    _hold: Hold,
}

/// What a take brought.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Taken {
    /// Receives granted to the member.
    pub receives: u32,
    /// Receives the queue could still grant, after the take.
    pub room: u32,
    /// Whether the take posted receives on the queue.
    pub posted: bool,
}

impl SharedReceives {
    /// The (not yet created) shared queues of `device`, which serves `rail`: each holds up to
    /// the smaller of [`SHARED_SRQ_CAPACITY`] and half the NIC's `max_srq_wr` receives at once.
    pub(crate) fn new(device: Arc<dyn RailDevice>, budget: Arc<NicBudget>, rail: Rail) -> Self {
        let capacity = SHARED_SRQ_CAPACITY.min(device.info().max_srq_wr / 2);
        SharedReceives {
            device,
            budget,
            rail,
            capacity,
            queues: Mutex::new(Vec::new()),
        }
    }

    /// Receive connections the NIC's `max_srq` queues can serve: queues of fewer receives (a
    /// small `max_srq_wr`) serve fewer connections each.
    pub(crate) fn connections_at_most(&self) -> u32 {
        let per_queue = SharedSrqLedger::new(self.capacity, SHARED_SRQ_FLOOR).most_members();
        self.device.info().max_srq.saturating_mul(per_queue)
    }

    /// Queues alive now (for tests).
    #[cfg(test)]
    pub(crate) fn queues_alive(&self) -> usize {
        lock(&self.queues)
            .iter()
            .filter(|queue| queue.strong_count() > 0)
            .count()
    }

    /// Joins a queue that admits one more connection, creating one when none does (taking an
    /// SRQ from the NIC's budget first, so that a NIC at `max_srq` refuses with the limit named).
    pub(crate) fn join(&self) -> Result<Membership> {
        let mut queues = lock(&self.queues);
        queues.retain(|queue| queue.strong_count() > 0);
        for queue in queues.iter().filter_map(Weak::upgrade) {
            if queue.ledger().join().is_ok() {
                return Ok(Membership::new(queue));
            }
        }
        let queue = Arc::new(self.create()?);
        queue
            .ledger()
            .join()
            .map_err(|refused| Error::internal(format!("a new shared queue refused: {refused}")))?;
        queues.push(Arc::downgrade(&queue));
        Ok(Membership::new(queue))
    }

    fn create(&self) -> Result<SharedQueue> {
        if self.capacity < 2 * SHARED_SRQ_FLOOR {
            let info = self.device.info();
            return Err(Error::system(format!(
                "the {} NIC {} holds at most {} receives per shared receive queue (max_srq_wr): \
                 too few to share between connections (MPIB needs {})",
                self.rail,
                info.name,
                info.max_srq_wr,
                4 * SHARED_SRQ_FLOOR
            )));
        }
        let hold = self.budget.take_queue()?;
        let ledger = SharedSrqLedger::new(self.capacity, SHARED_SRQ_FLOOR);
        let srq = self.device.create_srq(ledger.depth())?;
        Ok(SharedQueue {
            ledger: Mutex::new(ledger),
            srq,
            rail: self.rail,
            _hold: hold,
        })
    }
}

impl SharedQueue {
    fn ledger(&self) -> MutexGuard<'_, SharedSrqLedger> {
        lock(&self.ledger)
    }

    /// Connections using the queue and what they hold (for tests).
    #[cfg(test)]
    pub(crate) fn counts(&self) -> SharedSrqLedger {
        *self.ledger()
    }
}

/// One receive connection's place in a shared queue. Dropped without [`Membership::leave`]
/// (a handshake that failed), everything it holds is written off.
pub(crate) struct Membership {
    queue: Arc<SharedQueue>,
    /// What the member held when it last told the ledger.
    settled: u32,
    left: bool,
}

impl Membership {
    fn new(queue: Arc<SharedQueue>) -> Membership {
        Membership {
            queue,
            settled: 0,
            left: false,
        }
    }

    /// The queue, to create a QP on.
    pub(crate) fn with_queue<R>(&self, create: impl FnOnce(&dyn SharedReceiveQueue) -> R) -> R {
        create(self.queue.srq.as_ref())
    }

    /// The queue itself (for tests).
    #[cfg(test)]
    pub(crate) fn queue(&self) -> &Arc<SharedQueue> {
        &self.queue
    }

    /// Whether the member held `batch` or more beyond its floor when it last told the ledger
    /// (what it consumed since then still counts as borrowed there).
    #[inline]
    pub(crate) fn borrowed_batch(&self, batch: u32) -> bool {
        self.settled >= SHARED_SRQ_FLOOR + batch.max(1)
    }

    /// IMMs consumed since the member last told the ledger, given that it holds `holding`.
    #[inline]
    pub(crate) fn unsettled(&self, holding: u32) -> u32 {
        self.settled.saturating_sub(holding)
    }

    /// The member holds `holding` and asks for `want` more; the queue posts first what the
    /// grant needs, so that a CTS relying on it never meets an empty queue.
    pub(crate) fn take(&mut self, holding: u32, want: u32) -> Result<Taken> {
        let mut ledger = self.queue.ledger();
        ledger.settle(self.settled, holding);
        self.settled = holding;
        let granted = ledger.take(holding, want);
        if granted.post > 0 {
            let wr_id = receive_wr_id(self.queue.rail);
            if let Err(error) = self.queue.srq.post_receives(granted.post, wr_id) {
                // Nothing is granted; whatever part of the batch the verb posted before it failed
                // may sit in the queue uncounted, so all of it is written off.
                ledger.give_back(holding + granted.receives, granted.receives);
                ledger.write_off(granted.post);
                return Err(Error::from(error));
            }
            ledger.on_posted(granted.post);
        }
        self.settled = holding + granted.receives;
        Ok(Taken {
            receives: granted.receives,
            room: ledger.room(),
            posted: granted.post > 0,
        })
    }

    /// Tells the ledger what the member's IMMs consumed; returns what the queue could still
    /// grant.
    pub(crate) fn settle(&mut self, holding: u32) -> u32 {
        let mut ledger = self.queue.ledger();
        ledger.settle(self.settled, holding);
        self.settled = holding;
        ledger.room()
    }

    /// Gives `n` of the member's `holding` back; returns what the queue could still grant.
    pub(crate) fn give_back(&mut self, holding: u32, n: u32) -> u32 {
        let mut ledger = self.queue.ledger();
        ledger.settle(self.settled, holding);
        ledger.give_back(holding, n);
        self.settled = holding.saturating_sub(n);
        ledger.room()
    }

    /// One of the member's IMMs consumed a receive it did not hold (its peer broke the
    /// protocol; the connection fails): see `SharedSrqLedger::consumed_unheld`.
    pub(crate) fn consumed_unheld(&mut self) {
        self.queue.ledger().consumed_unheld();
    }

    /// The member's peer broke the protocol: posts the ledger's spare receives for IMMs that may
    /// have taken receives unseen, and retires the queue (`SharedSrqLedger::quarantine`).
    pub(crate) fn quarantine(&mut self) {
        let mut ledger = self.queue.ledger();
        let spare = ledger.quarantine();
        if spare == 0 {
            return;
        }
        let wr_id = receive_wr_id(self.queue.rail);
        if let Err(error) = self.queue.srq.post_receives(spare, wr_id) {
            warn!(
                log::NET,
                "posting {spare} spare receives on a shared receive queue after a peer broke the \
                 protocol: {error}"
            );
        }
    }

    /// Leaves, once the member's QPs are destroyed: of its `holding`, as many as it has
    /// `outstanding` receives may have been consumed unseen and are written off.
    pub(crate) fn leave(mut self, holding: u32, outstanding: u32) {
        self.leave_with(holding, outstanding);
    }

    fn leave_with(&mut self, holding: u32, outstanding: u32) {
        let mut ledger = self.queue.ledger();
        ledger.settle(self.settled, holding);
        ledger.leave(holding, outstanding);
        self.left = true;
    }
}

impl Drop for Membership {
    fn drop(&mut self) {
        if !self.left {
            let settled = self.settled;
            self.leave_with(settled, settled);
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere while holding the lock leaves counts that are still consistent (every
    // update is a few integer operations that cannot panic); keep going.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
#[path = "receives_tests.rs"]
mod tests;
