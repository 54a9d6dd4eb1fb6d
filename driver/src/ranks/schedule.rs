//! What one rank of a ring all-reduce sends and receives on one channel, in order: pure, so the
//! order and the data each transfer carries are tested apart from any plugin.
//!
//! NCCL's ring all-reduce (`nccl/src/device/all_reduce.h` `runRing`, Simple protocol) walks a
//! channel's part of the buffer in loops of `nranks` chunks: per loop, `nranks - 1` steps of
//! reduce-scatter (send a chunk, receive the previous rank's partial sum of the next one and add
//! it in), then `nranks - 1` steps of all-gather (send the fully reduced chunk on, receive the
//! next and keep it). The chunk is `ALLREDUCE_CHUNKSTEPS` (4) steps of the connection buffer and
//! travels in slices of `ALLREDUCE_SLICESTEPS` (2) steps, one `isend` each: with NCCL_STEPS = 8,
//! four slices are in flight per connection (`nccl/src/include/collectives.h`,
//! `nccl/src/transport/net.cc` `sendProxyProgress`). A slice sent at step k + 1 carries what the
//! slice received at step k left in the buffer, so it waits for that receive.

/// One `isend`: `length` bytes of the rank's buffer from `offset`, once the receive `after`
/// (an index into [`Schedule::receives`]) has completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Send {
    /// Where in the rank's buffer.
    pub offset: usize,
    /// Bytes.
    pub length: usize,
    /// The receive it waits for, if any.
    pub after: Option<usize>,
}

/// One `irecv`: `length` bytes for the rank's buffer at `offset`, added in (`reduce`) or copied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Receive {
    /// Where in the rank's buffer.
    pub offset: usize,
    /// Bytes.
    pub length: usize,
    /// Added into the buffer (`true`) or copied over it.
    pub reduce: bool,
}

/// A rank's transfers on one channel, each list in its connection's order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Schedule {
    /// The sends, in their connection's order.
    pub sends: Vec<Send>,
    /// The receives, in their connection's order.
    pub receives: Vec<Receive>,
}

/// Sizes of the Simple protocol's steps (bytes).
#[derive(Clone, Copy, Debug)]
pub struct Steps {
    /// One step of the connection buffer: NCCL_BUFFSIZE (4 MiB) / NCCL_STEPS (8).
    pub step: usize,
    /// Steps per chunk (ALLREDUCE_CHUNKSTEPS).
    pub chunk_steps: usize,
    /// Steps per slice, one `isend` (ALLREDUCE_SLICESTEPS).
    pub slice_steps: usize,
}

impl Steps {
    /// NCCL's defaults.
    pub const NCCL: Steps = Steps {
        step: (4 << 20) / 8,
        chunk_steps: 4,
        slice_steps: 2,
    };

    /// Bytes of one slice: the most one transfer carries.
    pub fn slice(&self) -> usize {
        self.step * self.slice_steps
    }
}

/// Element size the buffers are counted in (the driver reduces `u32` words).
pub const ELEMENT: usize = 4;

/// Rank `rank` of `ranks` on a channel whose part of the buffer is `[base, base + bytes)`.
pub fn ring_all_reduce(
    ranks: usize,
    rank: usize,
    base: usize,
    bytes: usize,
    steps: Steps,
) -> Schedule {
    let mut schedule = Schedule::default();
    if ranks < 2 || bytes == 0 {
        return schedule;
    }
    let chunk = steps.step * steps.chunk_steps;
    let mut done = 0;
    while done < bytes {
        let left = bytes - done;
        // As NCCL's runRing: a loop of `ranks` chunks, each at most `chunk`, whole elements.
        let this_chunk = left.div_ceil(ranks).div_ceil(ELEMENT).max(1) * ELEMENT;
        let this_chunk = this_chunk.min(chunk);
        let loop_bytes = (this_chunk * ranks).min(left);
        one_loop(
            &mut schedule,
            ranks,
            rank,
            base + done,
            loop_bytes,
            this_chunk,
            steps.slice(),
        );
        done += loop_bytes;
    }
    schedule
}

/// The `2 (ranks - 1)` steps of one loop over `[start, start + bytes)` in chunks of `chunk`.
fn one_loop(
    schedule: &mut Schedule,
    ranks: usize,
    rank: usize,
    start: usize,
    bytes: usize,
    chunk: usize,
    slice: usize,
) {
    // Chunk `index`'s range within the loop (the last ones may be short or empty).
    let range = |index: usize| {
        let from = (index * chunk).min(bytes);
        let to = ((index + 1) * chunk).min(bytes);
        (start + from, to - from)
    };
    let chunk_at = |step: usize, shift: usize| (rank + 2 * ranks - step % ranks - shift) % ranks;
    // The receive each slice of the current chunk landed in, for the next step's send.
    let mut landed: Vec<usize> = Vec::new();
    for step in 0..2 * (ranks - 1) {
        let (send_from, send_bytes) = range(chunk_at(step, 0));
        let sends = slices(send_bytes, slice);
        for (index, (offset, length)) in sends.iter().enumerate() {
            schedule.sends.push(Send {
                offset: send_from + offset,
                length: *length,
                after: landed.get(index).copied(),
            });
        }
        let (receive_at, receive_bytes) = range(chunk_at(step, 1));
        landed.clear();
        for (offset, length) in slices(receive_bytes, slice) {
            landed.push(schedule.receives.len());
            schedule.receives.push(Receive {
                offset: receive_at + offset,
                length,
                reduce: step < ranks - 1,
            });
        }
    }
}

/// A point-to-point transfer of `[from, from + length)`, one send per slice, none waiting.
pub fn sends(from: usize, length: usize, steps: Steps) -> Vec<Send> {
    let to_send = |(offset, length)| Send {
        offset: from + offset,
        length,
        after: None,
    };
    slices(length, steps.slice())
        .into_iter()
        .map(to_send)
        .collect()
}

/// Its receiving side, copied into `[into, into + length)`.
pub fn receives(into: usize, length: usize, steps: Steps) -> Vec<Receive> {
    let to_receive = |(offset, length)| Receive {
        offset: into + offset,
        length,
        reduce: false,
    };
    slices(length, steps.slice())
        .into_iter()
        .map(to_receive)
        .collect()
}

/// `(offset, length)` of the slices of `bytes`; an empty chunk still travels as one empty
/// transfer, as NCCL's steps do (the peer expects it).
fn slices(bytes: usize, slice: usize) -> Vec<(usize, usize)> {
    if bytes == 0 {
        return vec![(0, 0)];
    }
    (0..bytes.div_ceil(slice))
        .map(|index| {
            let offset = index * slice;
            (offset, slice.min(bytes - offset))
        })
        .collect()
}

#[cfg(test)]
#[path = "schedule_tests.rs"]
mod tests;
