//! Writer handles for the hot counters: [`RailProbe`] and [`TransferProbe`].
//!
//! # Writer lanes: exact with any number of threads
//!
//! NCCL drives each communicator from a proxy thread of its own, and a job holds several, so
//! several threads count into one process's probes at once. Each thread therefore writes its
//! own copy of the rail blocks and transfer counts, a *writer lane* ([`crate::lanes`]), and
//! readers sum the lanes. Within a lane every word has exactly one writing thread, so an update
//! is a plain `load` + `store` (`Relaxed`), ordinary `mov`/`add`/`mov`: no locked instruction
//! and no cache line shared between threads (`probes/benches/counters.rs` measures it against a
//! locked `fetch_add` on one shared block, with 1 and 8 threads). Threads beyond the owned
//! lanes share the last lane, whose handles say `shared` and add with `fetch_add` instead:
//! still exact, only slower.
//!
//! `Relaxed` is enough: each counter is an independent monotonic value (or a gauge) and
//! publishes no other data. Cache coherence alone gives a reader every word untorn and, per
//! word, never going backwards. Nothing on these paths allocates, locks or enters the kernel.

use crate::declared::{RailCounter, RailGauge};
use crate::histogram::bucket_index;
use crate::layout::{LaneBlock, RailBlock};
use crate::sync::{load_own, AtomicU64, Ordering};
use crate::writer::DUMMY;

/// Add `n` to a counter of the calling thread's lane: load + store, no locked instruction; or,
/// in the `shared` lane, a locked `fetch_add`.
#[inline(always)]
pub(crate) fn bump(counter: &AtomicU64, n: u64, shared: bool) {
    if shared {
        counter.fetch_add(n, Ordering::Relaxed);
        return;
    }
    // SYNC: none. The lane's only writer (module docs); readers load Relaxed and need no
    // ordering with any other word.
    let value = load_own(counter);
    counter.store(value.wrapping_add(n), Ordering::Relaxed);
}

/// Set a single-writer gauge.
#[inline(always)]
fn set(gauge: &AtomicU64, value: u64) {
    // SYNC: none (as in `bump`).
    gauge.store(value, Ordering::Relaxed);
}

/// Writer handle for one rail's counters and latency histogram in the calling thread's lane.
/// `Copy`, but only for the thread that got it ([`crate::ProbesFile::rail`]): a handle carried
/// to another thread writes a lane that is not its own. A disabled handle writes into a
/// private dummy block, so call sites never branch on "probes enabled".
#[derive(Clone, Copy)]
pub struct RailProbe<'a> {
    block: &'a RailBlock,
    shared: bool,
}

impl<'a> RailProbe<'a> {
    pub(crate) fn new(block: &'a RailBlock, shared: bool) -> Self {
        RailProbe { block, shared }
    }

    /// A handle that records nothing anyone reads.
    pub fn disabled() -> RailProbe<'static> {
        RailProbe {
            block: &DUMMY.rails[0],
            shared: false,
        }
    }

    /// Add `n` to the rail counter `counter` (a [`crate::declared`] constant such as
    /// `RAIL_TX_BYTES`).
    #[inline]
    pub fn add(self, counter: RailCounter, n: u64) {
        bump(&self.block.counters.values[counter.slot()], n, self.shared);
    }

    /// Add 1 to the rail counter `counter`.
    #[inline]
    pub fn inc(self, counter: RailCounter) {
        self.add(counter, 1);
    }

    /// Set the rail gauge `gauge` (such as `SRQ_DEPTH`) to `value`: this lane's last reading.
    #[inline]
    pub fn set(self, gauge: RailGauge, value: u64) {
        set(&self.block.counters.values[gauge.slot()], value);
    }

    /// One post-to-completion latency observation, in ns (log2 bucket + sum, seqlocked).
    #[inline]
    pub fn record_latency_ns(self, ns: u64) {
        let histogram = &self.block.latency.hist;
        if self.shared {
            histogram.record_shared(bucket_index(ns), ns);
        } else {
            histogram.record(bucket_index(ns), ns);
        }
    }
}

/// Writer handle for the transfer counters by active rail mask in the calling thread's lane.
/// `Copy`, for the thread that got it (as [`RailProbe`]).
///
/// These live in the lane's own block, not in a rail's block, because a transfer on both
/// rails belongs to neither rail alone.
#[derive(Clone, Copy)]
pub struct TransferProbe<'a> {
    block: &'a LaneBlock,
    shared: bool,
}

impl<'a> TransferProbe<'a> {
    pub(crate) fn new(block: &'a LaneBlock, shared: bool) -> Self {
        TransferProbe { block, shared }
    }

    /// A handle that records nothing anyone reads.
    pub fn disabled() -> TransferProbe<'static> {
        TransferProbe {
            block: &DUMMY.lanes[0],
            shared: false,
        }
    }

    /// One completed transfer with active rail mask `mask` (bit 0 = SOUT, bit 1 = SUP; higher
    /// bits ignored): counted as SOUT only, SUP only, both, or (mask 0) no rail.
    #[inline]
    pub fn record(self, mask: u8) {
        let counter = &self.block.transfers_by_mask[usize::from(mask & 3)];
        bump(counter, 1, self.shared);
    }
}

impl std::fmt::Debug for RailProbe<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RailProbe").finish_non_exhaustive()
    }
}

impl std::fmt::Debug for TransferProbe<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransferProbe").finish_non_exhaustive()
    }
}
