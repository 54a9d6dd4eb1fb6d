//! Memory the NIC writes into while the plugin polls it (the sender's CTS FIFO, the receiver's
//! completion records) or that the NIC reads from (CTS and record shadows).
//!
//! Such memory must never sit behind a Rust `&mut`: the NIC (or the loopback fabric on another
//! thread) writes it asynchronously, exactly like DMA. So it is a raw, zeroed, 64-byte-aligned
//! allocation accessed only through volatile reads and writes of `Copy` values, the way NCCL reads
//! its `volatile` FIFO.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::marker::PhantomData;
use std::ptr::NonNull;

use crate::error::{Error, Result};

/// A fixed array of `T` in NIC-shared memory.
pub(crate) struct DmaRegion<T: Copy> {
    base: NonNull<T>,
    len: usize,
    layout: Layout,
    _owns: PhantomData<T>,
}

// SAFETY: the region is plain memory owned by this value; all access goes through volatile
// reads/writes of `Copy` values, and the single-writer discipline is the caller's (one progress
// thread per comm), as for DMA memory shared with a NIC.
unsafe impl<T: Copy + Send> Send for DmaRegion<T> {}
// SAFETY: as above; shared references only expose volatile reads and the address.
unsafe impl<T: Copy + Send> Sync for DmaRegion<T> {}

impl<T: Copy> DmaRegion<T> {
    /// A zeroed region of `len` elements, 64-byte aligned (one CTS entry per cache line).
    pub(crate) fn zeroed(len: usize) -> Result<DmaRegion<T>> {
        let align = std::mem::align_of::<T>().max(64);
        let layout = Layout::array::<T>(len)
            .and_then(|l| l.align_to(align))
            .map_err(|e| Error::internal(format!("DMA region layout: {e}")))?;
        assert!(layout.size() > 0, "DMA regions are never empty");
        // SAFETY: the layout has a non-zero size (asserted above).
        let raw = unsafe { alloc_zeroed(layout) }.cast::<T>();
        let base = NonNull::new(raw)
            .ok_or_else(|| Error::system(format!("out of memory for {} bytes", layout.size())))?;
        Ok(DmaRegion {
            base,
            len,
            layout,
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

    /// Volatile read of element `index` (the NIC may have just written it).
    pub(crate) fn read(&self, index: usize) -> T {
        assert!(index < self.len, "DMA index {index} out of {}", self.len);
        // SAFETY: in bounds (checked), aligned, initialised (zeroed `Copy` data).
        unsafe { self.base.as_ptr().add(index).read_volatile() }
    }

    /// Volatile write of element `index` (a shadow the local NIC will read).
    pub(crate) fn write(&self, index: usize, value: T) {
        assert!(index < self.len, "DMA index {index} out of {}", self.len);
        // SAFETY: in bounds (checked) and aligned; the NIC only reads shadows after the post.
        unsafe { self.base.as_ptr().add(index).write_volatile(value) }
    }
}

impl<T: Copy> Drop for DmaRegion<T> {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with exactly this layout.
        unsafe { dealloc(self.base.as_ptr().cast(), self.layout) }
    }
}
