//! An overwrite-oldest, single-writer ring of fixed-size seqlocked records.
//!
//! This is the event ring of the probes file (slow transfers), written generically over the
//! payload size `N` (in `u64` words) so the same code also runs heap-backed: under miri, and
//! under loom with a 2-word payload that keeps the model small.
//!
//! # Protocol
//!
//! * The writer owns a monotonically increasing record index `n` (`RingControl::written`).
//!   Record `n` lives in slot `n & (capacity - 1)`.
//! * Writing record `n` (per-record seqlock): `seq = 2n + 1` (odd: being written), release
//!   fence, payload words (relaxed), `seq = 2n + 2` (Release: complete), then
//!   `written = n + 1` (Release). The writer never waits for a reader: when the ring is full it
//!   simply overwrites the oldest record (flight-recorder mode, LTTng "overwrite").
//! * A reader keeps a [`RingCursor`] (the next index it wants). It loads `written`; indices
//!   older than `written - capacity` are gone and counted as dropped. For each remaining index
//!   `i` it checks `seq == 2i + 2` before copying, copies, then re-checks `seq` after an
//!   acquire fence. Any mismatch means the slot was (or is being) overwritten by record
//!   `i + k * capacity`: the copy is discarded and counted as dropped. So a reader never
//!   returns a torn record, and `returned + dropped` accounts for every index exactly once.
//!
//! Reads use `Relaxed` loads followed by `fence(Acquire)` rather than `load(Acquire)`: the
//! collector maps the file read-only, and only relaxed atomic loads of at most 8 bytes are
//! guaranteed to work on read-only memory (`core::sync::atomic`, "Atomic accesses to
//! read-only memory"). A relaxed load followed by an acquire fence is at least as strong.
//!
//! # One writer at a time
//!
//! [`Ring::push`] must only be called by one thread at a time per ring. Several pushers would
//! not be memory-unsafe (everything is atomic) but could interleave two records in one slot,
//! which readers would then report as dropped. [`Ring::try_push`] makes any number of threads
//! safe without ever waiting: it takes the control block's writer flag with one swap, and a
//! thread that finds it taken gives its record up (the plugin counts those) instead of
//! spinning: a slow-transfer record is worth less than the proxy thread's time.

use crate::sync::{fence, load_own, AtomicU64, Ordering};

/// One slot of the ring: a sequence word and `N` payload words.
///
/// `seq` is 0 for a never-written slot, `2n + 1` while record `n` is being written and
/// `2n + 2` once record `n` is complete.
#[repr(C)]
pub struct SeqRecord<const N: usize> {
    seq: AtomicU64,
    words: [AtomicU64; N],
}

impl<const N: usize> SeqRecord<N> {
    /// A never-written slot (all zero, which is also what a fresh file holds).
    pub fn new() -> Self {
        SeqRecord {
            seq: AtomicU64::new(0),
            words: core::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    /// The `seq` value of a slot holding the complete record `index`.
    #[inline]
    pub const fn complete_seq(index: u64) -> u64 {
        index.wrapping_mul(2).wrapping_add(2)
    }

    /// Writer, step 1: mark the slot as being written with record `index`.
    #[inline]
    pub fn write_begin(&self, index: u64) {
        let odd = index.wrapping_mul(2).wrapping_add(1);
        self.seq.store(odd, Ordering::Relaxed);
        // SYNC: pairs with the fence(Acquire) in `read_validate`: a reader whose copy saw any
        // payload word stored after this fence also sees this odd seq (or a later one) when it
        // re-reads seq, so it rejects the copy.
        fence(Ordering::Release);
    }

    /// Writer, step 2: store the payload words.
    #[inline]
    pub fn write_words(&self, words: &[u64; N]) {
        for (slot, value) in self.words.iter().zip(words) {
            slot.store(*value, Ordering::Relaxed);
        }
    }

    /// Writer, step 3: publish record `index` as complete.
    #[inline]
    pub fn write_end(&self, index: u64) {
        // SYNC: pairs with the Relaxed load + fence(Acquire) in `read_begin`: a reader that sees
        // this even seq sees every payload word stored in `write_words`.
        self.seq.store(Self::complete_seq(index), Ordering::Release);
    }

    /// Writer: all three steps.
    #[inline]
    pub fn write(&self, index: u64, words: &[u64; N]) {
        self.write_begin(index);
        self.write_words(words);
        self.write_end(index);
    }

    /// Reader, step 1: the current `seq`, with acquire ordering for the copy that follows.
    #[inline]
    pub fn read_begin(&self) -> u64 {
        let seq = self.seq.load(Ordering::Relaxed);
        // SYNC: pairs with the Release store in `write_end`.
        fence(Ordering::Acquire);
        seq
    }

    /// Reader, step 2: copy the payload (possibly torn; only `read_validate` can tell).
    #[inline]
    pub fn read_words(&self) -> [u64; N] {
        core::array::from_fn(|i| self.words[i].load(Ordering::Relaxed))
    }

    /// Reader, step 3: whether the copy taken since `read_begin` returned `begin` is intact.
    #[inline]
    pub fn read_validate(&self, begin: u64) -> bool {
        // SYNC: pairs with the fence(Release) in `write_begin` (see there).
        fence(Ordering::Acquire);
        self.seq.load(Ordering::Relaxed) == begin
    }

    /// Reader: record `index` if this slot still holds it intact, `None` if it was overwritten
    /// (before or during the copy) or has not been written.
    #[inline]
    pub fn read(&self, index: u64) -> Option<[u64; N]> {
        let expected = Self::complete_seq(index);
        if self.read_begin() != expected {
            return None;
        }
        let words = self.read_words();
        self.read_validate(expected).then_some(words)
    }
}

impl<const N: usize> Default for SeqRecord<N> {
    fn default() -> Self {
        Self::new()
    }
}

/// The ring's control block: the total number of records ever written and the writer flag
/// of [`Ring::try_push`], alone on 128 bytes.
#[repr(C, align(128))]
pub struct RingControl {
    written: AtomicU64,
    writing: AtomicU64,
    _pad: [u8; 112],
}

impl RingControl {
    /// A control block for an empty ring.
    pub fn new() -> Self {
        RingControl {
            written: AtomicU64::new(0),
            writing: AtomicU64::new(0),
            _pad: [0; 112],
        }
    }
}

impl Default for RingControl {
    fn default() -> Self {
        Self::new()
    }
}

/// A reader's position in a ring, and what it has lost so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RingCursor {
    next: u64,
    dropped: u64,
}

impl RingCursor {
    /// A cursor at the oldest record (index 0): the first drain returns whatever is still held.
    pub const fn new() -> Self {
        RingCursor {
            next: 0,
            dropped: 0,
        }
    }

    /// A cursor at record `index` (for example the current `written`, to skip the history).
    pub const fn at(index: u64) -> Self {
        RingCursor {
            next: index,
            dropped: 0,
        }
    }

    /// The next record index this cursor will read.
    pub const fn next_index(&self) -> u64 {
        self.next
    }

    /// Records this cursor has lost to overwriting, over its whole life.
    pub const fn dropped_total(&self) -> u64 {
        self.dropped
    }
}

/// A view of a ring: its control block and its slots (a power-of-two count).
#[derive(Clone, Copy)]
pub struct Ring<'a, const N: usize> {
    ctrl: &'a RingControl,
    slots: &'a [SeqRecord<N>],
    mask: u64,
}

impl<'a, const N: usize> Ring<'a, N> {
    /// A ring over `slots`; `None` unless `slots.len()` is a non-zero power of two.
    pub fn new(ctrl: &'a RingControl, slots: &'a [SeqRecord<N>]) -> Option<Self> {
        if !slots.len().is_power_of_two() {
            return None;
        }
        let mask = u64::try_from(slots.len() - 1).ok()?;
        Some(Ring { ctrl, slots, mask })
    }

    /// Number of slots.
    pub fn capacity(&self) -> u64 {
        self.mask + 1
    }

    /// Total records ever pushed.
    #[inline]
    pub fn written(&self) -> u64 {
        let written = self.ctrl.written.load(Ordering::Relaxed);
        // SYNC: pairs with the Release store of `written` in `push`.
        fence(Ordering::Acquire);
        written
    }

    #[inline]
    fn slot(&self, index: u64) -> &'a SeqRecord<N> {
        // `mask < slots.len()`, so the index is in bounds and the check folds away.
        let at = (index & self.mask) as usize;
        &self.slots[at]
    }

    /// Writer: append `words` as the next record, overwriting the oldest when full. Never
    /// blocks, allocates or fails. Returns the record's index. Single writer (module docs).
    #[inline]
    pub fn push(&self, words: &[u64; N]) -> u64 {
        let index = load_own(&self.ctrl.written);
        self.slot(index).write(index, words);
        // SYNC: pairs with the Relaxed load + fence(Acquire) in `written`: a reader that sees
        // `index + 1` sees record `index` complete (or overwritten by a later one).
        self.ctrl
            .written
            .store(index.wrapping_add(1), Ordering::Release);
        index
    }

    /// Writer, from any thread: [`push`](Ring::push) unless another thread is pushing right
    /// now, in which case nothing is written and `None` returned. Never waits.
    #[inline]
    pub fn try_push(&self, words: &[u64; N]) -> Option<u64> {
        // SYNC: the Acquire swap pairs with the Release store that ends the previous holder's
        // push, so this thread's `load_own(written)` sees that push's store (the flag hands the
        // single-writer role from thread to thread).
        if self.ctrl.writing.swap(1, Ordering::Acquire) != 0 {
            return None;
        }
        let index = self.push(words);
        // SYNC: pairs with the Acquire swap above, in the next holder.
        self.ctrl.writing.store(0, Ordering::Release);
        Some(index)
    }

    /// Reader: pass every intact record from `cursor` up to the current end to `sink` (with its
    /// index), advance the cursor, and return how many records were lost in this call.
    ///
    /// A cursor beyond the end (a reader reused on a restarted writer) is pulled back to the end.
    pub fn drain(&self, cursor: &mut RingCursor, mut sink: impl FnMut(u64, [u64; N])) -> u64 {
        let written = self.written();
        cursor.next = cursor.next.min(written);
        let oldest = written.saturating_sub(self.capacity());
        let mut dropped = oldest.saturating_sub(cursor.next);
        cursor.next = cursor.next.max(oldest);
        while cursor.next < written {
            let index = cursor.next;
            match self.slot(index).read(index) {
                Some(words) => sink(index, words),
                None => dropped += 1,
            }
            cursor.next += 1;
        }
        cursor.dropped += dropped;
        dropped
    }
}

/// A ring on the heap, for tests, miri and loom (the probes file holds the same structures in
/// shared memory).
pub struct HeapRing<const N: usize> {
    ctrl: Box<RingControl>,
    slots: Box<[SeqRecord<N>]>,
}

impl<const N: usize> HeapRing<N> {
    /// An empty ring of `capacity` slots; `None` unless `capacity` is a non-zero power of two.
    pub fn new(capacity: usize) -> Option<Self> {
        if !capacity.is_power_of_two() {
            return None;
        }
        Some(HeapRing {
            ctrl: Box::new(RingControl::new()),
            slots: (0..capacity).map(|_| SeqRecord::new()).collect(),
        })
    }

    /// The ring view.
    pub fn ring(&self) -> Ring<'_, N> {
        Ring {
            ctrl: &self.ctrl,
            slots: &self.slots,
            mask: self.slots.len() as u64 - 1,
        }
    }

    /// Slot `at` (`index & (capacity - 1)`), for tests that interleave a writer by hand.
    pub fn slot(&self, at: usize) -> Option<&SeqRecord<N>> {
        self.slots.get(at)
    }
}

#[cfg(all(test, not(loom)))]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn words(index: u64) -> [u64; 3] {
        [index, index.wrapping_mul(31), !index]
    }

    fn intact(index: u64, w: [u64; 3]) -> bool {
        w == words(index)
    }

    fn drain_all(ring: &Ring<'_, 3>, cursor: &mut RingCursor) -> (Vec<u64>, u64) {
        let mut seen = Vec::new();
        let dropped = ring.drain(cursor, |i, w| {
            assert!(intact(i, w), "torn record {i}: {w:?}");
            seen.push(i);
        });
        (seen, dropped)
    }

    #[test]
    fn try_push_gives_up_while_another_thread_writes() {
        let heap = HeapRing::<3>::new(4).unwrap();
        heap.ctrl.writing.store(1, Ordering::Relaxed); // another pusher, mid-push
        assert_eq!(heap.ring().try_push(&words(0)), None);
        assert_eq!(heap.ring().written(), 0);
        heap.ctrl.writing.store(0, Ordering::Relaxed);
        assert_eq!(heap.ring().try_push(&words(0)), Some(0));
        assert_eq!(
            heap.ctrl.writing.load(Ordering::Relaxed),
            0,
            "flag released"
        );
    }

    #[test]
    fn try_push_from_many_threads_keeps_every_record_whole() {
        const PUSHES: u64 = if cfg!(miri) { 200 } else { 20_000 };
        let heap = HeapRing::<3>::new(64).unwrap();
        let ring = heap.ring();
        let given_up = std::sync::atomic::AtomicU64::new(0);
        std::thread::scope(|scope| {
            for thread in 0..4u64 {
                let (ring, given_up) = (&ring, &given_up);
                scope.spawn(move || {
                    for k in 0..PUSHES {
                        if ring.try_push(&[thread, k, !k]).is_none() {
                            given_up.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        let written = ring.written();
        assert_eq!(written + given_up.load(Ordering::Relaxed), 4 * PUSHES);
        let mut cursor = RingCursor::new();
        let mut returned = 0;
        let dropped = ring.drain(&mut cursor, |_, w| {
            assert!(w[0] < 4 && w[2] == !w[1], "torn record {w:?}");
            returned += 1;
        });
        assert_eq!(returned + dropped, written);
        assert_eq!(returned, 64, "a full ring holds its capacity");
    }

    #[test]
    fn ring_rejects_non_power_of_two() {
        assert!(HeapRing::<3>::new(0).is_none());
        assert!(HeapRing::<3>::new(6).is_none());
        assert!(HeapRing::<3>::new(8).is_some());
        let ctrl = RingControl::new();
        let slots: Vec<SeqRecord<3>> = (0..3).map(|_| SeqRecord::new()).collect();
        assert!(Ring::new(&ctrl, &slots).is_none());
        assert!(Ring::new(&ctrl, &slots[..2]).is_some());
    }

    #[test]
    fn ring_drains_in_order_without_loss() {
        let heap = HeapRing::<3>::new(8).unwrap();
        let ring = heap.ring();
        let mut cursor = RingCursor::new();
        for i in 0..5 {
            assert_eq!(ring.push(&words(i)), i);
        }
        assert_eq!(drain_all(&ring, &mut cursor), (vec![0, 1, 2, 3, 4], 0));
        assert_eq!(drain_all(&ring, &mut cursor), (vec![], 0));
        assert_eq!(cursor.next_index(), 5);
    }

    #[test]
    fn ring_overwrite_oldest_counts_dropped() {
        let heap = HeapRing::<3>::new(4).unwrap();
        let ring = heap.ring();
        let mut cursor = RingCursor::new();
        for i in 0..11 {
            ring.push(&words(i));
        }
        assert_eq!(drain_all(&ring, &mut cursor), (vec![7, 8, 9, 10], 7));
        assert_eq!(cursor.dropped_total(), 7);
        assert_eq!(ring.written(), 11);
        for i in 11..13 {
            ring.push(&words(i));
        }
        assert_eq!(drain_all(&ring, &mut cursor), (vec![11, 12], 0));
        assert_eq!(cursor.dropped_total(), 7);
    }

    #[test]
    fn ring_torn_read_detected_when_overwritten_during_copy() {
        let heap = HeapRing::<3>::new(2).unwrap();
        let ring = heap.ring();
        ring.push(&words(0));
        ring.push(&words(1));
        // A reader starts on record 0 (slot 0) ...
        let slot = heap.slot(0).unwrap();
        let begin = slot.read_begin();
        assert_eq!(begin, SeqRecord::<3>::complete_seq(0));
        // ... the writer laps it and is half-way through record 2 in the same slot ...
        slot.write_begin(2);
        slot.write_words(&words(2));
        let copy = slot.read_words();
        assert!(!intact(0, copy), "the copy really is overwritten");
        // ... so validation fails, both mid-write and after the write completes.
        assert!(!slot.read_validate(begin));
        slot.write_end(2);
        assert!(!slot.read_validate(begin));
        assert_eq!(slot.read(0), None);
        assert_eq!(slot.read(2), Some(words(2)));
    }

    #[test]
    fn ring_reader_skips_a_record_being_written() {
        let heap = HeapRing::<3>::new(2).unwrap();
        let ring = heap.ring();
        ring.push(&words(0));
        ring.push(&words(1));
        // The writer is in the middle of record 2 (slot 0) and has not bumped `written` yet.
        heap.slot(0).unwrap().write_begin(2);
        let mut cursor = RingCursor::new();
        assert_eq!(drain_all(&ring, &mut cursor), (vec![1], 1));
    }

    #[test]
    fn ring_cursor_beyond_end_is_pulled_back() {
        let heap = HeapRing::<3>::new(4).unwrap();
        let ring = heap.ring();
        ring.push(&words(0));
        let mut cursor = RingCursor::at(100);
        assert_eq!(drain_all(&ring, &mut cursor), (vec![], 0));
        assert_eq!(cursor.next_index(), 1);
    }

    #[test]
    fn ring_concurrent_reader_never_sees_torn_record() {
        let total: u64 = if cfg!(miri) { 300 } else { 200_000 };
        let heap = HeapRing::<3>::new(8).unwrap();
        std::thread::scope(|s| {
            s.spawn(|| {
                let ring = heap.ring();
                for i in 0..total {
                    ring.push(&words(i));
                }
            });
            let ring = heap.ring();
            let mut cursor = RingCursor::new();
            let mut returned = 0u64;
            let mut last = None;
            while cursor.next_index() < total {
                let (seen, _) = drain_all(&ring, &mut cursor);
                for i in seen {
                    assert!(last.map_or(true, |l| i > l), "out of order");
                    last = Some(i);
                    returned += 1;
                }
            }
            assert_eq!(returned + cursor.dropped_total(), total);
        });
    }
}
