//! Several ranks driving the plugin the way NCCL's transport layer does (issue 35), for the
//! `mpib-ranks` binary and the tests: ranks in one process (one proxy loop drives them all) or
//! one rank per process (ranks meet through handle files in a shared directory, as `mpib-xfer`'s
//! pair does).
//!
//! Setup follows `ncclTransportP2pSetup` (NCCL's `nccl/src/transport.cc`): every rank
//! `listen`s for each connection it receives on (per peer and channel) and publishes the
//! handles, reads the handles of the ranks it sends to, then polls `connect` and `accept`
//! round-robin until every connection is up, closing each listen comm once its `accept`
//! returned. The op then runs per size (op.rs, schedule.rs), its result checked word by word on
//! every rank; at the end the comms close and the contexts are finalized, and the caller drops
//! the plugin (`dlclose`), with no `finalize` before v11, as NCCL does.

mod lane;
pub mod op;
pub mod rank;
pub mod schedule;

use std::path::Path;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::net::Net;
use op::Op;
use rank::Rank;
use schedule::ELEMENT;

/// What to run.
#[derive(Clone, Debug)]
pub struct Options {
    /// Ranks in the ring.
    pub ranks: usize,
    /// Channels: connections per rank and direction.
    pub channels: usize,
    /// The plugin's device.
    pub dev: i32,
    /// The collective.
    pub op: Op,
    /// Bytes per all-reduce, one row each.
    pub sizes: Vec<usize>,
    /// Timed all-reduces per size (after `warmup` untimed ones).
    pub iterations: usize,
    /// Untimed all-reduces per size before the timed ones.
    pub warmup: usize,
    /// Bound on the setup (every listen, connect and accept).
    pub connect_deadline: Duration,
    /// Bound on each all-reduce.
    pub data_deadline: Duration,
}

/// One size's figures, as nccl-tests prints them.
#[derive(Clone, Copy, Debug)]
pub struct Row {
    /// Bytes per all-reduce.
    pub bytes: usize,
    /// Mean time of one all-reduce.
    pub time: Duration,
    /// Bytes / time.
    pub algorithm_gbps: f64,
    /// What each rank's links carried per second: algbw × 2 (ranks − 1) / ranks.
    pub bus_gbps: f64,
}

/// Runs `local` (the ranks this process drives; all of them in one process) on `net`, meeting
/// the others through `rendezvous`. Every rank's result is checked; the first wrong word fails.
/// `connected` is called once every local connection is up (the binary marks it in the
/// rendezvous directory, for whoever waits on the ring to be running).
pub fn run(
    net: &Net<'_>,
    options: &Options,
    local: &[usize],
    rendezvous: &Path,
    connected: &mut dyn FnMut(),
) -> Result<Vec<Row>> {
    let mut ranks = Vec::with_capacity(local.len());
    for &rank in local {
        let who = (options.ranks, rank);
        let what = (options.op, options.channels);
        ranks.push(Rank::listen(net, who, what, options.dev, rendezvous)?);
    }
    let outcome = run_with(&mut ranks, options, rendezvous, connected);
    let closed: Vec<Result<()>> = ranks.into_iter().map(Rank::close).collect();
    let rows = outcome?;
    closed.into_iter().collect::<Result<Vec<()>>>()?;
    Ok(rows)
}

fn run_with(
    ranks: &mut [Rank<'_, '_>],
    options: &Options,
    rendezvous: &Path,
    connected: &mut dyn FnMut(),
) -> Result<Vec<Row>> {
    for rank in ranks.iter_mut() {
        rank.learn_peers(rendezvous, options.connect_deadline)?;
    }
    until(options.connect_deadline, "connect and accept", || {
        let mut up = true;
        for rank in ranks.iter_mut() {
            up &= rank.connect_round()?;
        }
        Ok(up)
    })?;
    connected();
    let largest = options.sizes.iter().copied().max().unwrap_or(0);
    let words = options.op.words(options.op.fit(largest, options.ranks));
    let mut data: Vec<Vec<u32>> = ranks.iter().map(|_| vec![0u32; words]).collect();
    let mut rows = Vec::with_capacity(options.sizes.len());
    for &size in &options.sizes {
        let bytes = options.op.fit(size, options.ranks);
        let mut timed = Duration::ZERO;
        for iteration in 0..options.warmup + options.iterations {
            let took = one_op(ranks, &mut data, bytes, iteration, options)?;
            if iteration >= options.warmup {
                timed += took;
            }
        }
        let time = timed / options.iterations.max(1) as u32;
        let algorithm_gbps = bytes as f64 / time.as_secs_f64().max(1e-9) / 1e9;
        rows.push(Row {
            bytes,
            time,
            algorithm_gbps,
            bus_gbps: algorithm_gbps * options.op.bus_factor(options.ranks),
        });
    }
    Ok(rows)
}

/// One op of `bytes` on every local rank, checked; its duration.
fn one_op(
    ranks: &mut [Rank<'_, '_>],
    data: &mut [Vec<u32>],
    bytes: usize,
    iteration: usize,
    options: &Options,
) -> Result<Duration> {
    let op = options.op;
    for (rank, buffer) in ranks.iter_mut().zip(data.iter_mut()) {
        op.fill(buffer, (options.ranks, rank.rank), bytes, iteration);
        rank.start(bytes)?;
    }
    let started = Instant::now();
    let what = format!("the {} of {bytes} bytes (iteration {iteration})", op.name());
    until(options.data_deadline, &what, || {
        let mut done = true;
        for (rank, buffer) in ranks.iter_mut().zip(data.iter_mut()) {
            done &= rank.progress(buffer)?;
        }
        Ok(done)
    })?;
    let took = started.elapsed();
    for (rank, buffer) in ranks.iter().zip(data.iter()) {
        check(op, buffer, (options.ranks, rank.rank), bytes, iteration).map_err(|e| {
            e.context(format!(
                "rank {} of {}, {bytes} bytes",
                rank.rank, options.ranks
            ))
        })?;
    }
    Ok(took)
}

/// Every word of the result must be what the op makes of every rank's start.
fn check(
    op: Op,
    buffer: &[u32],
    who: (usize, usize),
    bytes: usize,
    iteration: usize,
) -> Result<()> {
    let range = op.result(bytes);
    let (start, words) = (range.start, range.len());
    let wrong =
        (0..words).filter(|&word| buffer[start + word] != op.expected(who, words, word, iteration));
    let mut wrong = wrong.peekable();
    let Some(&first) = wrong.peek() else {
        return Ok(());
    };
    Err(Error::Mismatch(format!(
        "{} of {words} words of the result wrong, the first at word {first} (byte {})",
        wrong.count(),
        first * ELEMENT
    )))
}

/// Polls `round` until it says done, at most `limit`.
fn until(limit: Duration, what: &str, mut round: impl FnMut() -> Result<bool>) -> Result<()> {
    let deadline = Instant::now() + limit;
    while !round()? {
        if Instant::now() > deadline {
            return Err(Error::Timeout(format!("{what} not done within {limit:?}")));
        }
        std::thread::yield_now();
    }
    Ok(())
}
