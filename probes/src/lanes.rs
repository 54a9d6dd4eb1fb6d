//! Writer lanes: which copy of the hot counters the calling thread writes.
//!
//! A thread's first update to a probes file claims a lane of that file with one compare-and-swap
//! on the lane's `owner` word, which takes the thread's kernel id (its tid), and remembers it in a
//! one-entry thread-local cache; every later update is a thread-local load and a compare. A lane
//! is free when its owner is 0 or names a thread of this process that has exited: the claim then
//! takes it over (Acquire), and counts are never reset, only handed on. A thread that finds no
//! free owned lane writes the shared lane with locked adds (counted in the process block's
//! `lane_overflows`).
//!
//! Why the owner is a tid and not a lease released on thread exit: a thread-local with a
//! destructor makes glibc pin the library that registered it (`__cxa_thread_atexit_impl` takes a
//! reference on the DSO until the thread exits), so `dlclose` would not unmap the plugin and its
//! statics would outlive a reload (tests/lifecycle.rs checks that the image is gone). The
//! thread-locals here are plain `Cell`s, which register nothing.

use std::cell::Cell;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::declared::WRITER_LANE_OVERFLOWS;
use crate::layout::{FileImage, SHARED_LANE};
use crate::writer::Owner;

thread_local! {
    /// The last (file serial, lane) this thread used: the hot path's whole lookup.
    static LAST: Cell<(u64, usize)> = const { Cell::new((0, 0)) };
}

/// The lane the calling thread writes in the file `owner` (claiming one on first use).
#[inline]
pub(crate) fn lane_of(owner: &Arc<Owner>) -> usize {
    let serial = owner.serial();
    match LAST.try_with(Cell::get) {
        Ok((last, lane)) if last == serial => lane,
        Err(_) => SHARED_LANE,
        Ok(_) => claim_lane(owner, serial),
    }
}

#[cold]
fn claim_lane(owner: &Arc<Owner>, serial: u64) -> usize {
    // SAFETY: gettid has no preconditions (one syscall per thread and file, off the hot path).
    let tid = u64::try_from(unsafe { libc::gettid() }).unwrap_or(0);
    let lane = claim(owner.image(), tid);
    let _ = LAST.try_with(|last| last.set((serial, lane)));
    lane
}

/// Whether thread `tid` of this process has exited (so its lane may be taken over). A thread
/// that cannot be asked about is taken to be alive: its lane is then left alone.
fn thread_gone(tid: u64) -> bool {
    let Ok(tid) = libc::pid_t::try_from(tid) else {
        return false;
    };
    // SAFETY: tgkill with signal 0 sends nothing; it only checks that the thread exists.
    let rc = unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, 0) };
    rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
}

/// The lane `tid` writes: one it already owns, else the first free one, else one whose owner
/// has exited, else the shared lane.
fn claim(image: &FileImage, tid: u64) -> usize {
    if tid == 0 {
        return SHARED_LANE;
    }
    let owned = &image.lanes[..SHARED_LANE];
    if let Some(lane) = owned
        .iter()
        .position(|block| block.owner.load(Ordering::Relaxed) == tid)
    {
        return lane;
    }
    for (lane, block) in owned.iter().enumerate() {
        // A lane whose owner is 0 has never been written: nothing to order.
        let free = block.owner.load(Ordering::Relaxed) == 0
            && block
                .owner
                .compare_exchange(0, tid, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok();
        if free {
            block.claims.fetch_add(1, Ordering::Relaxed);
            return lane;
        }
    }
    for (lane, block) in owned.iter().enumerate() {
        let previous = block.owner.load(Ordering::Relaxed);
        // SYNC: the exited owner's last stores precede its exit, which the kernel has completed
        // before tgkill reports ESRCH; Acquire orders this thread's later loads after the CAS.
        if previous != 0
            && thread_gone(previous)
            && block
                .owner
                .compare_exchange(previous, tid, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            block.claims.fetch_add(1, Ordering::Relaxed);
            return lane;
        }
    }
    image.process.values[WRITER_LANE_OVERFLOWS.slot()].fetch_add(1, Ordering::Relaxed);
    SHARED_LANE
}
