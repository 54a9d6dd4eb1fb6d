//! Zeroed, page-aligned blocks for the larger NIC-shared regions (a connection's CTS FIFO and its
//! shadow, 128 KiB each), carved from mappings of [`BLOCKS_PER_MAPPING`] blocks that every
//! connection of the process shares.
//!
//! Why not the heap: `alloc_zeroed` at 64-byte alignment clears every byte, so each region was
//! resident from the start, and closing thousands of connections left 128 KiB holes in the host
//! process's heap that only `malloc_trim` gave back (issue 22). Why not a mapping per region: on
//! Soft-RoCE every QP, CQ and SRQ already maps its queue into the process (about 24 mappings a
//! connection pair), and two more per pair would bring `vm.max_map_count` (65,530) closer
//! (docs/PERFORMANCE.md "Thousands of connections: what each costs"). So blocks come from shared
//! mappings, are resident only once written, go back to the system (`MADV_DONTNEED`, which also
//! makes them read as zero again) when their connection closes, and are reused by the next one; a
//! mapping whose blocks are all free is unmapped.

use std::sync::Mutex;

use crate::error::{Error, Result};

/// Blocks per shared mapping (one bit each in [`Mapping::free`]): 4 MiB of address space for
/// 128 KiB blocks.
const BLOCKS_PER_MAPPING: usize = 32;
/// Every block of a mapping free.
const ALL_FREE: u32 = u32::MAX;

/// One shared mapping and which of its blocks are free (bit `i` = block `i`).
struct Mapping {
    base: usize,
    free: u32,
}

/// The mappings of one block size.
struct Size {
    block_bytes: usize,
    mappings: Vec<Mapping>,
}

/// Every block size in use (a connection uses one or two).
static SIZES: Mutex<Vec<Size>> = Mutex::new(Vec::new());

fn sizes() -> std::sync::MutexGuard<'static, Vec<Size>> {
    SIZES
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A zeroed block of `bytes` (a whole number of pages), page-aligned.
pub(crate) fn take(bytes: usize) -> Result<*mut u8> {
    let mut sizes = sizes();
    let index = match sizes.iter().position(|s| s.block_bytes == bytes) {
        Some(index) => index,
        None => {
            sizes.push(Size {
                block_bytes: bytes,
                mappings: Vec::new(),
            });
            sizes.len() - 1
        }
    };
    let size = &mut sizes[index];
    if let Some(mapping) = size.mappings.iter_mut().find(|m| m.free != 0) {
        let block = mapping.free.trailing_zeros() as usize;
        mapping.free &= !(1 << block);
        return Ok((mapping.base + block * bytes) as *mut u8);
    }
    let length = bytes * BLOCKS_PER_MAPPING;
    // SAFETY: a fresh private anonymous mapping; no address hint, no file. NORESERVE: the
    // blocks not yet taken are address space, not memory the system must promise.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            length,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(Error::system(format!(
            "mmap of {length} bytes for NIC-shared regions: {}",
            std::io::Error::last_os_error()
        )));
    }
    size.mappings.push(Mapping {
        base: base as usize,
        free: ALL_FREE & !1,
    });
    Ok(base.cast())
}

/// Gives back a block [`take`] returned for `bytes`: its pages go back to the system and read as
/// zero when the block is taken again.
pub(crate) fn give_back(block: *mut u8, bytes: usize) {
    let mut sizes = sizes();
    let Some(size) = sizes.iter_mut().find(|s| s.block_bytes == bytes) else {
        warn!(
            crate::log::NET,
            "teardown: a {bytes}-byte block that was never taken"
        );
        return;
    };
    let address = block as usize;
    let length = bytes * BLOCKS_PER_MAPPING;
    let Some(position) = size
        .mappings
        .iter()
        .position(|m| m.base <= address && address < m.base + length)
    else {
        warn!(
            crate::log::NET,
            "teardown: block {block:p} is in no mapping"
        );
        return;
    };
    let mapping = &mut size.mappings[position];
    // SAFETY: the block lies inside this live mapping; nothing refers to it any more (the
    // registrations covering it were dropped first). DONTNEED on private anonymous memory
    // frees the pages and makes them read as zero.
    if unsafe { libc::madvise(block.cast(), bytes, libc::MADV_DONTNEED) } != 0 {
        warn!(
            crate::log::NET,
            "teardown: madvise of a {bytes}-byte block: {}",
            std::io::Error::last_os_error()
        );
    }
    mapping.free |= 1 << ((address - mapping.base) / bytes);
    if mapping.free == ALL_FREE {
        let base = mapping.base;
        size.mappings.swap_remove(position);
        // SAFETY: the whole mapping is free: no block of it is in use.
        if unsafe { libc::munmap(base as *mut libc::c_void, length) } != 0 {
            warn!(
                crate::log::NET,
                "teardown: munmap of {length} bytes: {}",
                std::io::Error::last_os_error()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Blocks of one size share mappings, come back zeroed, and a mapping goes once all of its
    /// blocks are back (an odd size of its own, so other tests' blocks do not interfere).
    #[test]
    fn blocks_share_mappings_come_back_zeroed_and_free_their_mapping() {
        let bytes = 5 * 4096;
        let first = take(bytes).unwrap();
        let second = take(bytes).unwrap();
        assert_eq!(
            second as usize - first as usize,
            bytes,
            "neighbours in one mapping"
        );
        assert_eq!(first as usize % 4096, 0);
        // SAFETY: both blocks are ours, `bytes` long.
        unsafe {
            first.write_bytes(0xAB, bytes);
            second.write(1);
        }
        give_back(first, bytes);
        let again = take(bytes).unwrap();
        assert_eq!(again, first, "the free block is reused");
        // SAFETY: as above.
        let all_zero = unsafe { std::slice::from_raw_parts(again, bytes) }
            .iter()
            .all(|b| *b == 0);
        assert!(all_zero, "a reused block reads as zero");
        let mappings = |sizes: &Vec<Size>| {
            sizes
                .iter()
                .find(|s| s.block_bytes == bytes)
                .map_or(0, |s| s.mappings.len())
        };
        assert_eq!(mappings(&sizes()), 1);
        give_back(again, bytes);
        give_back(second, bytes);
        assert_eq!(mappings(&sizes()), 0, "an all-free mapping is unmapped");
    }
}
