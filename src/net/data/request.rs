//! Requests handed to NCCL: a pool of up to 256 per comm (NCCL's `NET_IB_MAX_REQUESTS`: 32
//! outstanding receives, each matching up to 8 sends), allocated and freed through an index stack.
//! The pool is made 32 requests at a time, as requests are wanted at once: the data path
//! allocates only the first time a comm has more than 32, 64, … requests in flight (at most seven
//! times in its life), and never otherwise touches the heap.

use std::ptr::NonNull;

use crate::proto::cts::{FIFO_SLOTS, MAX_RECVS};
use crate::proto::rail_mask::RailMask;

/// Requests per comm.
pub(crate) const POOL_SIZE: usize = FIFO_SLOTS;

const IN_USE: u32 = 0x5245_5155; // "REQU"
const FREE: u32 = 0x4652_4545; // "FREE"

/// Which comm type owns a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Owner {
    /// A send comm.
    Send,
    /// A receive comm.
    Recv,
}

/// A request as NCCL sees it (an opaque pointer into its comm's pool).
#[repr(C)]
pub struct Request {
    magic: u32,
    pub(crate) owner_kind: Owner,
    pub(crate) done: bool,
    pub(crate) index: u16,
    /// The owning comm (`SendComm` or `RecvComm`), for `test`, which gets no comm argument.
    pub(crate) owner: *const (),
    /// Fifo sequence number of the slot this request rides on.
    pub(crate) seq: u64,
    /// Buffers (receive) or 1 (send).
    pub(crate) count: u8,
    /// Send: the clamped size. Receive: capacities, replaced by the received sizes when done.
    pub(crate) sizes: [u64; MAX_RECVS],
    /// Profiler handle per buffer (NCCL's; may be NULL).
    pub(crate) profiler_handles: [usize; MAX_RECVS],
    /// Post time (ns, monotonic), for latency.
    pub(crate) posted_ns: u64,
    /// Flush: rails whose flush read has not completed yet.
    pub(crate) flush_pending: RailMask,
    /// NCCL profiler event handles per rail (0 = none).
    pub(crate) profiler_events: [usize; 2],
}

impl Request {
    const fn blank(index: u16) -> Request {
        Request {
            magic: FREE,
            owner_kind: Owner::Send,
            done: false,
            index,
            owner: std::ptr::null(),
            seq: 0,
            count: 0,
            sizes: [0; MAX_RECVS],
            profiler_handles: [0; MAX_RECVS],
            posted_ns: 0,
            flush_pending: RailMask::NONE,
            profiler_events: [0; 2],
        }
    }

    /// Whether the pointer NCCL gave back names a live request.
    pub(crate) fn is_live(&self) -> bool {
        self.magic == IN_USE
    }
}

/// Requests are made a chunk at a time: NCCL keeps at most `NCCL_NET_MAX_REQUESTS` (32)
/// receives of a comm in flight, and a send comm as many sends unless receives are grouped, so
/// most comms never need a second chunk (docs/PERFORMANCE.md "Thousands of connections").
const CHUNK: usize = 32;
const CHUNKS: usize = POOL_SIZE / CHUNK;
const _: () = assert!(POOL_SIZE % CHUNK == 0, "the pool is whole chunks");

/// The pool.
pub(crate) struct RequestPool {
    /// The chunks made so far, each [`CHUNK`] requests in one allocation released from its
    /// `Box`: every reference the engine takes and every pointer handed to NCCL is derived from
    /// these raw pointers, so taking one never invalidates another under Stacked or Tree Borrows
    /// (a pointer derived from `&mut requests[i]` of a boxed slice was invalidated by the next
    /// `&mut` reborrow of the slice, and `test` then read through it). A chunk never moves.
    /// Dangling past `made`, never dereferenced there (`slot` checks the index first).
    chunks: [NonNull<Request>; CHUNKS],
    made: usize,
    free: Box<[u16]>,
    free_count: usize,
}

// SAFETY: the pool owns its allocations exclusively (as the `Box`es they came from did); the
// requests hold only plain data and a raw owner pointer that is never dereferenced through the
// pool.
unsafe impl Send for RequestPool {}

const _: () = assert!(
    POOL_SIZE <= u16::MAX as usize + 1,
    "request indices are u16"
);

impl RequestPool {
    /// A pool of one chunk of free requests, growing to [`POOL_SIZE`].
    pub(crate) fn new() -> RequestPool {
        let mut pool = RequestPool {
            chunks: [NonNull::dangling(); CHUNKS],
            made: 0,
            free: vec![0; POOL_SIZE].into_boxed_slice(),
            free_count: 0,
        };
        pool.grow();
        pool
    }

    /// Makes the next chunk and frees its requests (lowest index taken first); `false` when the
    /// pool is whole, or the allocation failed (the caller then has no request, and NCCL calls
    /// again: the data path neither aborts nor waits on memory).
    #[cold]
    fn grow(&mut self) -> bool {
        if self.made == CHUNKS {
            return false;
        }
        let first = self.made * CHUNK;
        let mut requests: Vec<Request> = Vec::new();
        if requests.try_reserve_exact(CHUNK).is_err() {
            return false;
        }
        requests.extend((first..first + CHUNK).map(|index| Request::blank(index as u16)));
        let raw = Box::into_raw(requests.into_boxed_slice()).cast::<Request>();
        // SAFETY: `Box::into_raw` never returns null.
        self.chunks[self.made] = unsafe { NonNull::new_unchecked(raw) };
        self.made += 1;
        for index in (first..first + CHUNK).rev() {
            self.free[self.free_count] = index as u16;
            self.free_count += 1;
        }
        true
    }

    /// The request at `index`, as a raw pointer derived from its chunk's.
    #[inline]
    fn slot(&self, index: u16) -> NonNull<Request> {
        let index = usize::from(index);
        assert!(
            index < self.made * CHUNK,
            "request index {index} outside the pool"
        );
        // SAFETY: chunk `index / CHUNK` was made (checked above), and `index % CHUNK` is in
        // bounds of its allocation.
        unsafe { self.chunks[index / CHUNK].add(index % CHUNK) }
    }

    /// Takes a request, or `None` when all 256 are in flight (NCCL then retries).
    pub(crate) fn allocate(
        &mut self,
        owner_kind: Owner,
        owner: *const (),
        seq: u64,
    ) -> Option<u16> {
        if self.free_count == 0 && !self.grow() {
            return None;
        }
        self.free_count -= 1;
        let index = self.free[self.free_count];
        let request = self.get_mut(index);
        *request = Request::blank(index);
        request.magic = IN_USE;
        request.owner_kind = owner_kind;
        request.owner = owner;
        request.seq = seq;
        Some(index)
    }

    /// Returns a request to the pool.
    pub(crate) fn release(&mut self, index: u16) {
        let request = self.get_mut(index);
        if request.magic != IN_USE {
            return;
        }
        request.magic = FREE;
        self.free[self.free_count] = index;
        self.free_count += 1;
    }

    /// The request at `index`.
    pub(crate) fn get(&self, index: u16) -> &Request {
        // SAFETY: a live, initialised element of one of the pool's chunks; `&self` keeps the
        // pool (and so the chunk) alive and the engine mutably borrows no request meanwhile.
        unsafe { self.slot(index).as_ref() }
    }

    /// The request at `index`, mutably.
    pub(crate) fn get_mut(&mut self, index: u16) -> &mut Request {
        // SAFETY: as in `get`; `&mut self` makes this the only reference the engine holds, and
        // NCCL reads its pointer only inside calls, never while the engine holds this one.
        unsafe { self.slot(index).as_mut() }
    }

    /// Stable pointer handed to NCCL (derived from its chunk's, so later accesses keep it
    /// valid).
    pub(crate) fn pointer(&mut self, index: u16) -> NonNull<Request> {
        self.slot(index)
    }

    /// Requests currently handed out.
    #[cfg(test)]
    pub(crate) fn in_use(&self) -> usize {
        self.made * CHUNK - self.free_count
    }

    /// Chunks made so far.
    #[cfg(test)]
    pub(crate) fn chunks_made(&self) -> usize {
        self.made
    }
}

impl Drop for RequestPool {
    fn drop(&mut self) {
        for chunk in &self.chunks[..self.made] {
            let slice = std::ptr::slice_from_raw_parts_mut(chunk.as_ptr(), CHUNK);
            // SAFETY: every chunk made came from `Box::into_raw` of a `Box<[Request]>` of
            // `CHUNK` elements, and is released once, here.
            drop(unsafe { Box::from_raw(slice) });
        }
    }
}

/// Monotonic nanoseconds (CLOCK_MONOTONIC through std; vDSO, no syscall on Linux).
pub(crate) fn now_ns() -> u64 {
    use std::sync::OnceLock;
    use std::time::Instant;
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let epoch = EPOCH.get_or_init(Instant::now);
    epoch.elapsed().as_nanos() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_hands_out_every_request_once_then_refuses() {
        let mut pool = RequestPool::new();
        let mut seen = std::collections::HashSet::new();
        for seq in 0..POOL_SIZE as u64 {
            let index = pool.allocate(Owner::Recv, std::ptr::null(), seq).unwrap();
            assert!(seen.insert(index));
            assert!(pool.get(index).is_live());
        }
        assert_eq!(pool.allocate(Owner::Recv, std::ptr::null(), 0), None);
        pool.release(7);
        pool.release(7); // a double release is ignored
        assert!(!pool.get(7).is_live());
        assert_eq!(pool.allocate(Owner::Send, std::ptr::null(), 1), Some(7));
        assert_eq!(pool.in_use(), POOL_SIZE);
    }

    /// A comm with at most 32 requests in flight keeps one chunk, lowest indices first; the
    /// 33rd in flight makes the second.
    #[test]
    fn the_pool_grows_a_chunk_at_a_time_as_requests_are_wanted_at_once() {
        let mut pool = RequestPool::new();
        for round in 0..100 {
            let taken: Vec<u16> = (0..CHUNK)
                .map(|_| pool.allocate(Owner::Send, std::ptr::null(), round).unwrap())
                .collect();
            assert!(taken.iter().all(|&index| usize::from(index) < CHUNK));
            for index in taken {
                pool.release(index);
            }
        }
        assert_eq!(pool.chunks_made(), 1);
        let held: Vec<u16> = (0..=CHUNK)
            .map(|_| pool.allocate(Owner::Recv, std::ptr::null(), 0).unwrap())
            .collect();
        assert_eq!(pool.chunks_made(), 2);
        assert_eq!(held[CHUNK], CHUNK as u16, "the new chunk's lowest first");
        assert!(pool.get(held[CHUNK]).is_live());
        for index in held {
            pool.release(index);
        }
        assert_eq!(pool.in_use(), 0);
    }

    /// The pattern `isend`/`test` follow: a pointer handed to NCCL, then the engine updating
    /// other requests and this one, then NCCL's `test` reading through its pointer. Under Miri
    /// (the test command runs it with Tree Borrows) a pointer that a later reborrow invalidated
    /// is undefined behaviour.
    #[test]
    fn a_pointer_handed_out_stays_valid_while_the_engine_updates_requests() {
        let mut pool = RequestPool::new();
        let first = pool.allocate(Owner::Send, std::ptr::null(), 1).unwrap();
        let handed = pool.pointer(first);
        let second = pool.allocate(Owner::Send, std::ptr::null(), 2).unwrap();
        pool.get_mut(second).done = true;
        pool.get_mut(first).done = true;
        // SAFETY: the pool is alive and nothing borrows the request now.
        let seen = unsafe { handed.as_ref() };
        assert!(seen.is_live() && seen.done && seen.seq == 1);
        pool.release(first);
        pool.release(second);
    }
}
