//! Memory the NIC writes into while the plugin polls it (the sender's CTS FIFO, the receiver's
//! completion records) or that the NIC reads from (CTS and record shadows).
//!
//! Such memory must never sit behind a Rust `&mut`: the NIC (or the loopback fabric on another
//! thread) writes it asynchronously, exactly like DMA. So it is a raw, zeroed, 64-byte-aligned
//! allocation accessed only through atomic word loads and stores of `Copy` values. NCCL reads its
//! FIFO through `volatile`; with a NIC as the writer that works, but with a Rust thread as the
//! writer (the loopback and tcp fabrics) a volatile read racing a store is a data race, and
//! atomics are not. Those fabrics store polled memory as release-ordered words in ascending
//! address order (src/fabric/landing.rs), as a NIC's write becomes visible; reads here are
//! acquire-ordered words, so a caller that has seen a word written after others (a CTS entry's
//! `idx`) and reads again sees those others.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};

/// Regions at least this large (a CTS FIFO or its shadow: 128 KiB) are blocks of shared
/// mappings (`super::blocks`): kernel-zeroed, resident only once written (a connection that used
/// 3 of its 256 CTS slots holds 3 pages, not 32), given back to the system when the connection
/// closes instead of leaving a hole in the host process's heap (issue 22).
const BLOCK_AT_LEAST_BYTES: usize = 16 * 1024;

/// Where a region's memory came from.
enum Storage {
    /// `alloc_zeroed` with this layout.
    Heap(Layout),
    /// A block of this many bytes from `super::blocks`.
    Block(usize),
}

/// A fixed array of `T` in NIC-shared memory.
pub(crate) struct DmaRegion<T: Copy> {
    base: NonNull<T>,
    len: usize,
    storage: Storage,
    _owns: PhantomData<T>,
}

// SAFETY: the region is plain memory owned by this value; all access goes through atomic
// word reads/writes of `Copy` values, and the single-writer discipline is the caller's (one progress
// thread per comm), as for DMA memory shared with a NIC.
unsafe impl<T: Copy + Send> Send for DmaRegion<T> {}
// SAFETY: as above; shared references only expose atomic reads and writes and the address.
unsafe impl<T: Copy + Send> Sync for DmaRegion<T> {}

impl<T: Copy> DmaRegion<T> {
    /// Elements are whole 8-byte words, so they can be read and written as atomic words.
    const WORDS_ONLY: () = assert!(
        std::mem::size_of::<T>() % 8 == 0 && std::mem::align_of::<T>() <= 64,
        "DMA elements are whole words"
    );

    /// A zeroed region of `len` elements, 64-byte aligned (one CTS entry per cache line).
    pub(crate) fn zeroed(len: usize) -> Result<DmaRegion<T>> {
        let () = Self::WORDS_ONLY;
        let align = std::mem::align_of::<T>().max(64);
        let layout = Layout::array::<T>(len)
            .and_then(|l| l.align_to(align))
            .map_err(|e| Error::internal(format!("DMA region layout: {e}")))?;
        assert!(layout.size() > 0, "DMA regions are never empty");
        let (raw, storage) = if layout.size() >= BLOCK_AT_LEAST_BYTES && !cfg!(miri) {
            let bytes = layout
                .size()
                .next_multiple_of(crate::fabric::pages::page_size());
            // Page-aligned, so at least 64-byte aligned.
            (
                super::blocks::take(bytes)?.cast::<T>(),
                Storage::Block(bytes),
            )
        } else {
            // SAFETY: the layout has a non-zero size (asserted above).
            (
                unsafe { alloc_zeroed(layout) }.cast::<T>(),
                Storage::Heap(layout),
            )
        };
        let base = NonNull::new(raw)
            .ok_or_else(|| Error::system(format!("out of memory for {} bytes", layout.size())))?;
        Ok(DmaRegion {
            base,
            len,
            storage,
            _owns: PhantomData,
        })
    }

    /// Start address, for registration and remote addressing.
    pub(crate) fn addr(&self) -> u64 {
        self.base.as_ptr() as u64
    }

    /// Address of element `index`.
    pub(crate) fn addr_of(&self, index: usize) -> u64 {
        self.addr() + (index * std::mem::size_of::<T>()) as u64
    }

    /// Size in bytes.
    pub(crate) fn byte_len(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }

    /// Reads element `index` (the NIC, or a fabric thread, may have just written it) as
    /// acquire-ordered atomic words in ascending address order: each word is old or new, never
    /// torn, and every read after it sees what the writer stored before it.
    pub(crate) fn read(&self, index: usize) -> T {
        assert!(index < self.len, "DMA index {index} out of {}", self.len);
        let mut value = std::mem::MaybeUninit::<T>::uninit();
        let words = std::mem::size_of::<T>() / 8;
        // SAFETY: in bounds (checked); elements start 8-aligned and are whole words
        // (`WORDS_ONLY`), so every word is an aligned u64 inside the allocation, only ever
        // accessed atomically or by hardware; the copy fills all of `value`'s bytes, and `T` is
        // plain `Copy` data for which any bytes are valid (zeroed, then written by peers).
        unsafe {
            let source = self.base.as_ptr().add(index).cast::<u64>();
            let target = value.as_mut_ptr().cast::<u64>();
            for word in 0..words {
                let loaded = AtomicU64::from_ptr(source.add(word)).load(Ordering::Acquire);
                target.add(word).write_unaligned(loaded);
            }
            value.assume_init()
        }
    }

    /// Writes element `index` (a shadow the local NIC will read) as release-ordered atomic words.
    pub(crate) fn write(&self, index: usize, value: T) {
        assert!(index < self.len, "DMA index {index} out of {}", self.len);
        let words = std::mem::size_of::<T>() / 8;
        // SAFETY: as in `read`; the source is a live local value of whole words.
        unsafe {
            let target = self.base.as_ptr().add(index).cast::<u64>();
            let source = (&value as *const T).cast::<u64>();
            for word in 0..words {
                let loaded = source.add(word).read_unaligned();
                AtomicU64::from_ptr(target.add(word)).store(loaded, Ordering::Release);
            }
        }
    }

    /// Word `word` of element `index` alone, acquire-ordered: a mailbox's seal, read before the
    /// rest so that a reader that sees it sealed then reads the message whole.
    /// A mailbox may span elements (a failback message takes two): `word` counts from the
    /// element's start and must lie inside the region.
    pub(crate) fn read_word(&self, index: usize, word: usize) -> u64 {
        assert!(index < self.len, "DMA index {index} out of {}", self.len);
        assert!(
            index * std::mem::size_of::<T>() + 8 * (word + 1) <= self.byte_len(),
            "word {word} of element {index} outside the region"
        );
        // SAFETY: in bounds (both checked); an aligned word of the allocation (as in `read`).
        unsafe {
            let source = self.base.as_ptr().add(index).cast::<u64>().add(word);
            AtomicU64::from_ptr(source).load(Ordering::Acquire)
        }
    }

    /// `N` bytes from element `index` on (a message a peer writes into a mailbox, which may
    /// span elements), read as [`DmaRegion::read`] reads.
    pub(crate) fn read_bytes<const N: usize>(&self, index: usize) -> [u8; N] {
        let words = self.words_of::<N>(index);
        let mut bytes = [0u8; N];
        for (word, chunk) in bytes.chunks_exact_mut(8).enumerate() {
            // SAFETY: `words_of` checked that the N bytes are whole words inside the region.
            let loaded = unsafe { AtomicU64::from_ptr(words.add(word)) }.load(Ordering::Acquire);
            chunk.copy_from_slice(&loaded.to_le_bytes());
        }
        bytes
    }

    /// Writes `bytes` from element `index` on (a message the local NIC will send), as
    /// [`DmaRegion::write`] writes.
    pub(crate) fn write_bytes<const N: usize>(&self, index: usize, bytes: &[u8; N]) {
        let words = self.words_of::<N>(index);
        for (word, chunk) in bytes.chunks_exact(8).enumerate() {
            let value = u64::from_le_bytes(chunk.try_into().unwrap_or([0; 8]));
            // SAFETY: as in `read_bytes`.
            unsafe { AtomicU64::from_ptr(words.add(word)) }.store(value, Ordering::Release);
        }
    }

    /// The first word of element `index`, checking that `N` bytes from it are whole words
    /// inside the region.
    fn words_of<const N: usize>(&self, index: usize) -> *mut u64 {
        assert!(index < self.len, "DMA index {index} out of {}", self.len);
        assert!(
            N % 8 == 0 && index * std::mem::size_of::<T>() + N <= self.byte_len(),
            "{N} bytes from element {index} are not whole words inside the region"
        );
        // SAFETY: in bounds (checked); elements start 8-aligned.
        unsafe { self.base.as_ptr().add(index).cast::<u64>() }
    }
}

impl<T: Copy> Drop for DmaRegion<T> {
    fn drop(&mut self) {
        match self.storage {
            // SAFETY: allocated in `zeroed` with exactly this layout.
            Storage::Heap(layout) => unsafe { dealloc(self.base.as_ptr().cast(), layout) },
            // Nothing refers to the block any more: the registrations covering it were
            // dropped first.
            Storage::Block(bytes) => super::blocks::give_back(self.base.as_ptr().cast(), bytes),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::cts::{CompletionRecord, CtsEntry};

    #[test]
    fn elements_round_trip_and_start_zeroed() {
        let region = DmaRegion::<CtsEntry>::zeroed(16).unwrap();
        assert_eq!(region.read(15), CtsEntry::default());
        let entry = CtsEntry {
            addr: 0x1000,
            size: 4096,
            rkeys: [7, 8],
            nreqs: 2,
            tag: 9,
            idx: 3,
            padding: [0; 24],
        };
        region.write(5, entry);
        assert_eq!(region.read(5), entry);
        assert_eq!(region.addr_of(5) - region.addr(), 5 * 64);
        assert_eq!(region.byte_len(), 16 * 64);
    }

    /// A mailbox message goes in and comes out as bytes over the element's first words; its
    /// last word alone is what a reader looks at first, and the rest of the element is untouched.
    #[test]
    fn mailbox_bytes_round_trip_over_an_element() {
        let region = DmaRegion::<CtsEntry>::zeroed(4).unwrap();
        let message: [u8; 56] = std::array::from_fn(|i| i as u8 + 1);
        region.write_bytes(3, &message);
        assert_eq!(region.read_bytes::<56>(3), message);
        assert_eq!(
            region.read_word(3, 6),
            u64::from_le_bytes(message[48..56].try_into().unwrap())
        );
        assert_eq!(region.read_word(3, 7), 0, "past the message");
        assert_eq!(region.read(2), CtsEntry::default(), "the element before");
        let record = DmaRegion::<CompletionRecord>::zeroed(2).unwrap();
        record.write_bytes(1, &[0xAB; 16]);
        assert_eq!(record.read_bytes::<16>(1), [0xAB; 16]);
    }

    /// A message may span elements (failback's take two), never the region's end.
    #[test]
    fn a_message_spans_elements_but_not_the_regions_end() {
        let region = DmaRegion::<CompletionRecord>::zeroed(3).unwrap();
        let message: [u8; 80] = std::array::from_fn(|i| i as u8 + 1);
        region.write_bytes(1, &message);
        assert_eq!(region.read_bytes::<80>(1), message);
        assert_eq!(
            region.read_word(1, 9),
            u64::from_le_bytes(message[72..80].try_into().unwrap())
        );
        assert_eq!(
            region.read(0),
            CompletionRecord::default(),
            "the element before"
        );
        let past = std::panic::catch_unwind(|| region.write_bytes(2, &[0u8; 56]));
        assert!(
            past.is_err(),
            "56 bytes from the last 48-byte record pass the end"
        );
        let past = std::panic::catch_unwind(|| region.read_word(2, 6));
        assert!(past.is_err(), "a word past the end");
    }

    /// A CTS FIFO's worth is a block of a shared mapping, zeroed by the kernel, and works the
    /// same.
    #[test]
    fn a_large_region_is_a_zeroed_block() {
        let region = DmaRegion::<CtsEntry>::zeroed(2048).unwrap();
        if cfg!(miri) {
            // Miri has no mmap: the heap serves every size there.
            assert!(matches!(region.storage, Storage::Heap(_)));
        } else {
            assert!(matches!(region.storage, Storage::Block(131_072)));
            assert_eq!(region.addr() % 4096, 0, "page-aligned");
        }
        assert_eq!(region.read(2047), CtsEntry::default());
        let entry = CtsEntry {
            idx: 7,
            ..CtsEntry::default()
        };
        region.write(2047, entry);
        assert_eq!(region.read(2047), entry);
    }

    #[test]
    #[should_panic(expected = "DMA index 4 out of 4")]
    fn an_index_past_the_end_is_refused() {
        DmaRegion::<CompletionRecord>::zeroed(4).unwrap().read(4);
    }

    /// A writer thread and a reader share the region, as a fabric thread and the engine do:
    /// every access is atomic, so there is no data race (Miri checks it) and every word read is
    /// one the writer stored.
    #[test]
    fn a_writer_thread_and_a_reader_share_it_without_a_race() {
        let region = std::sync::Arc::new(DmaRegion::<CompletionRecord>::zeroed(2).unwrap());
        let writer = std::sync::Arc::clone(&region);
        let rounds = if cfg!(miri) { 20 } else { 2000 };
        let thread = std::thread::spawn(move || {
            for round in 1..=rounds {
                writer.write(
                    1,
                    CompletionRecord {
                        sizes: [round; 8],
                        rail_bytes: [u64::from(round); 2],
                    },
                );
            }
        });
        for _ in 0..rounds {
            let seen = region.read(1);
            assert!(seen.sizes.iter().all(|s| *s <= rounds));
        }
        thread.join().unwrap();
        assert_eq!(region.read(1).sizes, [rounds; 8]);
    }
}
