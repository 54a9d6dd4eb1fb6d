//! The collectives `mpib-ranks` runs: who connects to whom, what each connection carries, how
//! the result is checked and what bus bandwidth means for each (nccl-tests' definitions).
//!
//! Buffers are `u32` words. All-reduce works in place on `bytes`; all-to-all and send/recv read
//! an input of `bytes` and write an output of `bytes` right after it.

use super::schedule::{self, Receive, Schedule, Send, Steps, ELEMENT};

/// What to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Ring all-reduce (sum), NCCL's Simple protocol.
    AllReduce,
    /// Every rank sends a block of `bytes / ranks` to every other rank (NCCL's grouped p2p).
    AllToAll,
    /// Every rank sends `bytes` to the next rank and receives as many from the previous one
    /// (nccl-tests' `sendrecv_perf`).
    SendRecv,
}

/// `ncclFunc_t` values (NCCL's `nccl/src/include/nccl_common.h`).
const FUNCTION_ALL_REDUCE: u32 = 4;
const FUNCTION_SEND: u32 = 6;
const FUNCTION_RECEIVE: u32 = 7;
const FUNCTION_ALL_TO_ALL: u32 = 8;

impl Op {
    /// The operation a `--op` word names (`allreduce`, `alltoall`, `sendrecv`, or the same with
    /// a hyphen).
    pub fn parse(text: &str) -> Option<Op> {
        Some(match text {
            "allreduce" | "all-reduce" => Op::AllReduce,
            "alltoall" | "all-to-all" => Op::AllToAll,
            "sendrecv" | "send-recv" => Op::SendRecv,
            _ => return None,
        })
    }

    /// What the operation is, for the report's header.
    pub fn name(self) -> &'static str {
        match self {
            Op::AllReduce => "ring all-reduce (uint32 sum)",
            Op::AllToAll => "all-to-all (uint32)",
            Op::SendRecv => "send/recv to the next rank (uint32)",
        }
    }

    /// NCCL's Simple protocol sizes: collectives use the 4 MiB connection buffer in slices of
    /// two steps; point-to-point ones chunks of NCCL_P2P_NET_CHUNKSIZE (128 KiB), one per step.
    pub fn steps(self) -> Steps {
        match self {
            Op::AllReduce => Steps::NCCL,
            Op::AllToAll | Op::SendRecv => Steps {
                step: 128 << 10,
                chunk_steps: 1,
                slice_steps: 1,
            },
        }
    }

    /// The `ncclFunc_t` bit of each direction's operations (`setXferNetAttrs`), and whether
    /// algorithm and protocol are defined (collectives only).
    pub fn function_bits(self) -> (u32, u32, bool) {
        match self {
            Op::AllReduce => (1 << FUNCTION_ALL_REDUCE, 1 << FUNCTION_ALL_REDUCE, true),
            Op::AllToAll => (1 << FUNCTION_ALL_TO_ALL, 1 << FUNCTION_ALL_TO_ALL, false),
            Op::SendRecv => (1 << FUNCTION_SEND, 1 << FUNCTION_RECEIVE, false),
        }
    }

    /// Ranks `rank` sends to, and ranks it receives from.
    pub fn peers(self, ranks: usize, rank: usize) -> (Vec<usize>, Vec<usize>) {
        let next = (rank + 1) % ranks;
        let previous = (rank + ranks - 1) % ranks;
        match self {
            Op::AllReduce | Op::SendRecv => (vec![next], vec![previous]),
            Op::AllToAll => {
                let others: Vec<usize> = (0..ranks).filter(|&peer| peer != rank).collect();
                (others.clone(), others)
            }
        }
    }

    /// Words of the buffer a rank needs for `bytes`.
    pub fn words(self, bytes: usize) -> usize {
        match self {
            Op::AllReduce => bytes / ELEMENT,
            Op::AllToAll | Op::SendRecv => 2 * bytes / ELEMENT,
        }
    }

    /// The bytes a size moves per rank, rounded down to what the op can split evenly.
    pub fn fit(self, bytes: usize, ranks: usize) -> usize {
        match self {
            Op::AllToAll => bytes / (ranks * ELEMENT) * ranks * ELEMENT,
            Op::AllReduce | Op::SendRecv => bytes / ELEMENT * ELEMENT,
        }
    }

    /// Bus bandwidth from algorithm bandwidth (nccl-tests' factors).
    pub fn bus_factor(self, ranks: usize) -> f64 {
        let n = ranks as f64;
        match self {
            Op::AllReduce => 2.0 * (n - 1.0) / n,
            Op::AllToAll => (n - 1.0) / n,
            Op::SendRecv => 1.0,
        }
    }

    /// What `rank` sends to `peer` and receives from it on one channel (`channel` of
    /// `channels`), for `bytes`.
    pub fn schedule(self, shape: Shape, peer: usize, bytes: usize) -> (Vec<Send>, Vec<Receive>) {
        let steps = self.steps();
        let part = |from: usize, length: usize| {
            let words = length / ELEMENT;
            let first = words * shape.channel / shape.channels;
            let last = words * (shape.channel + 1) / shape.channels;
            (from + first * ELEMENT, (last - first) * ELEMENT)
        };
        match self {
            Op::AllReduce => {
                let (base, length) = part(0, bytes);
                let Schedule { sends, receives } =
                    schedule::ring_all_reduce(shape.ranks, shape.rank, base, length, steps);
                (sends, receives)
            }
            Op::SendRecv => {
                let (from, length) = part(0, bytes);
                let (into, _) = part(bytes, bytes);
                (
                    schedule::sends(from, length, steps),
                    schedule::receives(into, length, steps),
                )
            }
            Op::AllToAll => {
                let block = bytes / shape.ranks;
                let (from, length) = part(peer * block, block);
                let (into, _) = part(bytes + peer * block, block);
                (
                    schedule::sends(from, length, steps),
                    schedule::receives(into, length, steps),
                )
            }
        }
    }

    /// Fills rank `rank`'s buffer for `bytes` in `iteration`: its input words, and for the ops
    /// with an output, a filler no transfer writes (so a word left unwritten shows) and, for
    /// all-to-all, the block the rank keeps for itself, copied locally as NCCL does.
    pub fn fill(
        self,
        buffer: &mut [u32],
        (ranks, rank): (usize, usize),
        bytes: usize,
        iteration: usize,
    ) {
        let words = bytes / ELEMENT;
        for (word, value) in buffer[..words].iter_mut().enumerate() {
            *value = initial(rank, word, iteration);
        }
        if self == Op::AllReduce {
            return;
        }
        buffer[words..2 * words].fill(0xDEAD_BEEF ^ iteration as u32);
        if self == Op::AllToAll {
            let block = words / ranks;
            buffer.copy_within(rank * block..(rank + 1) * block, words + rank * block);
        }
    }

    /// What word `word` of rank `rank`'s result must be (the in-place buffer for all-reduce,
    /// the output for the others).
    pub fn expected(
        self,
        (ranks, rank): (usize, usize),
        words: usize,
        word: usize,
        iteration: usize,
    ) -> u32 {
        match self {
            Op::AllReduce => {
                (0..ranks).fold(0u32, |sum, r| sum.wrapping_add(initial(r, word, iteration)))
            }
            Op::SendRecv => initial((rank + ranks - 1) % ranks, word, iteration),
            Op::AllToAll => {
                let block = words / ranks;
                let (peer, within) = (word / block, word % block);
                initial(peer, rank * block + within, iteration)
            }
        }
    }

    /// The result's words within a rank's buffer for `bytes`.
    pub fn result(self, bytes: usize) -> std::ops::Range<usize> {
        let words = bytes / ELEMENT;
        match self {
            Op::AllReduce => 0..words,
            Op::AllToAll | Op::SendRecv => words..2 * words,
        }
    }
}

/// Where a schedule is for.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    /// Ranks in the ring.
    pub ranks: usize,
    /// This rank's index.
    pub rank: usize,
    /// The channel (connection pair) the schedule is for.
    pub channel: usize,
    /// Channels per rank pair.
    pub channels: usize,
}

/// The word rank `rank` starts with at `word` in iteration `iteration` (distinct per rank, word
/// and iteration, so a word landed in the wrong place or left from before shows).
pub fn initial(rank: usize, word: usize, iteration: usize) -> u32 {
    (word as u32).wrapping_mul(2_654_435_761)
        ^ (rank as u32 + 1).wrapping_mul(40_503)
        ^ (iteration as u32).wrapping_mul(0x9E37_79B9)
}
