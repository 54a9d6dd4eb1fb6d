//! Several ranks driving the plugin the way NCCL's transport layer does (issue 35), for the
//! `mpib-ranks` binary and the tests: ranks in one process (one proxy loop drives them all) or
//! one rank per process (ranks meet through handle files in a shared directory, as `mpib-xfer`'s
//! pair does).
//!
//! Setup follows `ncclTransportP2pSetup` (NCCL's `src/transport.cc`): every rank `listen`s once
//! per channel and publishes its handles, reads its next rank's, then polls `connect` and
//! `accept` round-robin until every connection is up, closing each listen comm once its `accept`
//! returned. A ring all-reduce then runs per size (src/ranks/schedule.rs), its result checked
//! word by word on every rank; at the end the comms close and the contexts are finalized, and
//! the caller drops the plugin (`dlclose`), with no `finalize` before v11, as NCCL does.

pub mod rank;
pub mod schedule;

use std::path::Path;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::net::Net;
use rank::{until, Rank};
use schedule::{Steps, ELEMENT};

/// What to run.
#[derive(Clone, Debug)]
pub struct Options {
    /// Ranks in the ring.
    pub ranks: usize,
    /// Channels: connections per rank and direction.
    pub channels: usize,
    /// The plugin's device.
    pub dev: i32,
    /// The Simple protocol's step sizes.
    pub steps: Steps,
    /// Bytes per all-reduce, one row each.
    pub sizes: Vec<usize>,
    /// Timed all-reduces per size (after `warmup` untimed ones).
    pub iterations: usize,
    pub warmup: usize,
    /// Bound on the setup and on each all-reduce.
    pub connect_deadline: Duration,
    pub data_deadline: Duration,
}

/// One size's figures, as nccl-tests prints them.
#[derive(Clone, Copy, Debug)]
pub struct Row {
    pub bytes: usize,
    /// Mean time of one all-reduce.
    pub time: Duration,
    /// Bytes / time.
    pub algorithm_gbps: f64,
    /// What each rank's links carried per second: algbw × 2 (ranks − 1) / ranks.
    pub bus_gbps: f64,
}

/// The word rank `rank` starts with at `word` in iteration `iteration` (distinct per rank, word
/// and iteration, so a word landed in the wrong place or left from before shows).
pub fn initial(rank: usize, word: usize, iteration: usize) -> u32 {
    (word as u32).wrapping_mul(2_654_435_761)
        ^ (rank as u32 + 1).wrapping_mul(40_503)
        ^ (iteration as u32).wrapping_mul(0x9E37_79B9)
}

/// Runs `local` (the ranks this process drives; all of them in one process) on `net`, meeting
/// the others through `rendezvous`. Every rank's result is checked; the first wrong word fails.
pub fn run(
    net: &Net<'_>,
    options: &Options,
    local: &[usize],
    rendezvous: &Path,
) -> Result<Vec<Row>> {
    let mut ranks = Vec::with_capacity(local.len());
    for &rank in local {
        let who = (options.ranks, rank);
        ranks.push(Rank::listen(
            net,
            who,
            options.channels,
            options.dev,
            options.steps,
            rendezvous,
        )?);
    }
    let outcome = run_with(&mut ranks, options, rendezvous);
    let closed: Vec<Result<()>> = ranks.into_iter().map(Rank::close).collect();
    let rows = outcome?;
    closed.into_iter().collect::<Result<Vec<()>>>()?;
    Ok(rows)
}

fn run_with(ranks: &mut [Rank<'_, '_>], options: &Options, rendezvous: &Path) -> Result<Vec<Row>> {
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
    let largest = options.sizes.iter().copied().max().unwrap_or(0) / ELEMENT;
    let mut data: Vec<Vec<u32>> = ranks.iter().map(|_| vec![0u32; largest]).collect();
    let mut rows = Vec::with_capacity(options.sizes.len());
    for &bytes in &options.sizes {
        let mut timed = Duration::ZERO;
        for iteration in 0..options.warmup + options.iterations {
            let took = all_reduce(ranks, &mut data, bytes, iteration, options)?;
            if iteration >= options.warmup {
                timed += took;
            }
        }
        let time = timed / options.iterations.max(1) as u32;
        let algorithm_gbps = bytes as f64 / time.as_secs_f64().max(1e-9) / 1e9;
        let n = options.ranks as f64;
        rows.push(Row {
            bytes,
            time,
            algorithm_gbps,
            bus_gbps: algorithm_gbps * 2.0 * (n - 1.0) / n,
        });
    }
    Ok(rows)
}

/// One all-reduce of `bytes` on every local rank, checked; its duration.
fn all_reduce(
    ranks: &mut [Rank<'_, '_>],
    data: &mut [Vec<u32>],
    bytes: usize,
    iteration: usize,
    options: &Options,
) -> Result<Duration> {
    let words = bytes / ELEMENT;
    for (rank, buffer) in ranks.iter_mut().zip(data.iter_mut()) {
        for (word, value) in buffer[..words].iter_mut().enumerate() {
            *value = initial(rank.rank, word, iteration);
        }
        rank.start_all_reduce(bytes)?;
    }
    let started = Instant::now();
    let what = format!("the all-reduce of {bytes} bytes (iteration {iteration})");
    until(options.data_deadline, &what, || {
        let mut done = true;
        for (rank, buffer) in ranks.iter_mut().zip(data.iter_mut()) {
            done &= rank.progress(&mut buffer[..words])?;
        }
        Ok(done)
    })?;
    let took = started.elapsed();
    for (rank, buffer) in ranks.iter().zip(data.iter()) {
        check(buffer, words, options.ranks, iteration).map_err(|e| {
            e.context(format!(
                "rank {} of {}, {bytes} bytes",
                rank.rank, options.ranks
            ))
        })?;
    }
    Ok(took)
}

/// Every word must be the sum of every rank's start.
fn check(buffer: &[u32], words: usize, ranks: usize, iteration: usize) -> Result<()> {
    let wrong = (0..words).filter(|&word| {
        let sum = (0..ranks).fold(0u32, |sum, rank| {
            sum.wrapping_add(initial(rank, word, iteration))
        });
        buffer[word] != sum
    });
    let mut wrong = wrong.peekable();
    let Some(&first) = wrong.peek() else {
        return Ok(());
    };
    Err(Error::Mismatch(format!(
        "{} of {words} words wrong, the first at word {first} (byte {})",
        wrong.count(),
        first * ELEMENT
    )))
}
