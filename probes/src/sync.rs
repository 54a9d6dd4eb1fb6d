//! The one place atomics come from, so the same ring and counter code runs under loom.
//!
//! Model: crossbeam-epoch's private `primitive` module. Under `--cfg loom` the atomics, the
//! fence and the spin hint are loom's, so `tests/loom.rs` explores every interleaving of the
//! real code; otherwise they are `core`'s and cost nothing extra. Ring, histogram and counter
//! code import atomics only from here (`use crate::sync::...`).
//!
//! Loom atomics are not layout-compatible with `core`'s (they carry model state), so under
//! `cfg(loom)` only the heap-backed pieces (`ring`, `histogram`) are compiled; the file layout
//! and its compile-time asserts exist only in normal builds.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicU64, Ordering};

#[cfg(not(loom))]
pub(crate) use core::sync::atomic::{fence, AtomicU16, AtomicU32, AtomicU64, AtomicU8, Ordering};

/// The single writer's read of its own last store to `atomic` (counters, the ring's
/// `written`, the histogram's words).
///
/// Normally a `Relaxed` load, which for the only writer always returns its own last store.
/// Under loom it is `unsync_load`, which states the single-writer rule to the model: loom
/// fails the test if any other thread stores to `atomic` concurrently. It also keeps loom's
/// DPOR exploring the reader's races: loom remembers only the *last* access per atomic, so a
/// writer's own tracked load right before its store would hide an earlier reader load from
/// it, and the interleavings where the reader loses the race would never be tried.
#[inline(always)]
pub(crate) fn load_own(atomic: &AtomicU64) -> u64 {
    #[cfg(loom)]
    // SAFETY: the caller is the only thread that stores to `atomic` (single-writer rule),
    // so this load cannot race with a store; loom checks exactly that.
    let value = unsafe { atomic.unsync_load() };
    #[cfg(not(loom))]
    let value = atomic.load(Ordering::Relaxed);
    value
}

/// Back off inside a bounded retry loop: a CPU pause normally, a scheduler yield under loom
/// (loom needs the yield to explore the writer making progress instead of spinning forever).
#[inline]
pub(crate) fn spin_hint() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    core::hint::spin_loop();
}
