//! How a fabric that executes RDMA writes in software lands bytes in memory the engine may be
//! polling at the same moment.
//!
//! The engine polls two kinds of memory that a peer writes (src/net/data/dma.rs): the sender's CTS
//! FIFO, where a receiver writes up to `MAX_RECVS` 64-byte entries in one write and each entry's
//! `idx` word sits after its fields, and the receiver's 48-byte completion records. Like NCCL's
//! net_ib, the engine trusts that a NIC makes a write visible in ascending address order, so once
//! it sees an entry's new `idx` the fields below it are new too (src/net/data/send/mod.rs
//! `load_cts`). `memcpy`/`memmove` promise no order (glibc's copies of several vectors may
//! store the first one last), and a plain store racing the engine's load is a data race. So
//! every write that can reach polled memory is stored here as release-ordered atomic words in
//! ascending address order, which the engine reads back as acquire-ordered atomic words.
//!
//! Writes larger than [`POLLED_WRITE_MAX`] are payloads: the engine never reads them until their
//! completion, which reaches it through the fabric's completion queue lock, so a plain copy is
//! both sound and fast for them.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

use crate::proto::cts::{COMPLETION_RECORD_SIZE, CTS_ENTRY_SIZE, MAX_RECVS};

/// The largest write that may target memory the engine polls: a page, well above a whole CTS
/// slot (`MAX_RECVS` × 64 bytes) and a completion record.
pub(crate) const POLLED_WRITE_MAX: usize = 4096;

const _: () = assert!(MAX_RECVS * CTS_ENTRY_SIZE <= POLLED_WRITE_MAX);
const _: () = assert!(COMPLETION_RECORD_SIZE <= POLLED_WRITE_MAX);

/// Lands `bytes` at `addr`: ordered atomic stores for a write that may reach polled memory, a
/// plain copy for a payload.
///
/// # Safety
/// `[addr, addr + bytes.len())` must be mapped, writable memory of this process that no Rust
/// reference covers, and must not overlap `bytes`.
pub(crate) unsafe fn land(addr: u64, bytes: &[u8]) {
    if bytes.len() <= POLLED_WRITE_MAX {
        // SAFETY: forwarded from the caller.
        unsafe { store_ordered(addr, bytes) }
    } else {
        // SAFETY: the caller vouches for the target and that the ranges do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), addr as *mut u8, bytes.len()) }
    }
}

/// Stores `bytes` at `addr` with release-ordered atomic stores in ascending address order: single
/// bytes up to the first 8-byte boundary, whole words, then the tail's bytes. A polled word lies
/// inside an aligned element, so it is always stored as one word.
///
/// # Safety
/// As for [`land`].
pub(crate) unsafe fn store_ordered(addr: u64, bytes: &[u8]) {
    let head = ((8 - addr % 8) % 8).min(bytes.len() as u64) as usize;
    let words = (bytes.len() - head) / 8;
    let mut offset = 0;
    while offset < head {
        // SAFETY: inside the range the caller vouches for; bytes need no alignment.
        unsafe { store_byte(addr + offset as u64, bytes[offset]) };
        offset += 1;
    }
    for chunk in bytes[head..head + words * 8].chunks_exact(8) {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let target = (addr + offset as u64) as *mut u64;
        // SAFETY: 8-aligned (the head brought `addr + offset` to a boundary) and inside the
        // range the caller vouches for; only accessed atomically while others may look.
        unsafe { AtomicU64::from_ptr(target) }.store(u64::from_ne_bytes(word), Ordering::Release);
        offset += 8;
    }
    while offset < bytes.len() {
        // SAFETY: as for the head.
        unsafe { store_byte(addr + offset as u64, bytes[offset]) };
        offset += 1;
    }
}

/// # Safety
/// `addr` must be mapped, writable memory of this process that no Rust reference covers.
unsafe fn store_byte(addr: u64, byte: u8) {
    // SAFETY: the caller's promise.
    unsafe { AtomicU8::from_ptr(addr as *mut u8) }.store(byte, Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    #[test]
    fn stores_land_whole_at_any_alignment() {
        for start in 0..8 {
            for len in [0, 1, 3, 8, 13, 64, 100] {
                let mut target = [0u64; 16];
                let bytes: Vec<u8> = (1..=len as u8).collect();
                let base = target.as_mut_ptr() as u64 + start;
                // SAFETY: `target` is a live local array read only after the stores.
                unsafe { land(base, &bytes) };
                let landed: Vec<u8> = target.iter().flat_map(|w| w.to_ne_bytes()).collect();
                let start = start as usize;
                assert_eq!(
                    &landed[start..start + len],
                    &bytes[..],
                    "at +{start}, {len} B"
                );
                assert!(landed[..start].iter().all(|b| *b == 0), "nothing before");
                assert!(
                    landed[start + len..].iter().all(|b| *b == 0),
                    "nothing after"
                );
            }
        }
    }

    #[test]
    fn payloads_land_whole() {
        let mut target = vec![0u8; POLLED_WRITE_MAX * 3];
        let bytes: Vec<u8> = (0..target.len()).map(|i| (i % 251) as u8).collect();
        // SAFETY: `target` is a live local buffer read only after the copy.
        unsafe { land(target.as_mut_ptr() as u64, &bytes) };
        assert_eq!(target, bytes);
    }

    /// Eight 64-byte entries written as one CTS slot, each word carrying the round, polled by a
    /// reader that waits for the last entry's `idx` word and then checks every word below it: a
    /// copy that stores out of order (a descending one fails this at once) lets it see old words;
    /// ascending ordered stores never do.
    #[test]
    fn a_reader_that_sees_the_last_idx_sees_every_word_below_it() {
        const WORDS: usize = MAX_RECVS * CTS_ENTRY_SIZE / 8;
        const IDX: usize = (MAX_RECVS - 1) * CTS_ENTRY_SIZE / 8 + 4;
        const ROUNDS: u64 = if cfg!(miri) { 40 } else { 20_000 };
        let region: Arc<Vec<AtomicU64>> = Arc::new((0..WORDS).map(|_| AtomicU64::new(0)).collect());
        let done = Arc::new(AtomicBool::new(false));
        let reader = {
            let (region, done) = (Arc::clone(&region), Arc::clone(&done));
            std::thread::spawn(move || {
                let mut torn = 0u64;
                while !done.load(Ordering::Acquire) {
                    let round = region[IDX].load(Ordering::Acquire);
                    torn += region[..IDX]
                        .iter()
                        .filter(|w| w.load(Ordering::Acquire) < round)
                        .count() as u64;
                }
                torn
            })
        };
        let base = region.as_ptr() as u64;
        for round in 1..=ROUNDS {
            let bytes: Vec<u8> = (0..WORDS).flat_map(|_| round.to_ne_bytes()).collect();
            // SAFETY: the region is live, only accessed atomically, and `bytes` is separate.
            unsafe { land(base, &bytes) };
        }
        done.store(true, Ordering::Release);
        assert_eq!(reader.join().unwrap(), 0, "words older than the idx seen");
    }
}
