//! One pass of one row on one side: `count` iterations of `group` messages of `size` bytes, at
//! most `window` requests in flight, through the driver's bounded post/test loop
//! ([`mpib_driver::xfer::Loop`]). Each request is timed from its successful post to the `test`
//! that reports it done. Without `--verify` nothing touches the payload bytes; with it, the sender
//! fills each message with its own pattern just before posting it and the receiver checks every
//! byte as each receive completes (both costs then count in the timed pass).

use std::cell::RefCell;
use std::time::{Duration, Instant};

use mpib_driver::abi::PROXY_MAX_SUBS;
use mpib_driver::net::{MemHandle, RecvBuf, RecvComm, SendComm};
use mpib_driver::xfer::Loop;
use mpib_driver::{pattern, Error, Net, Result};

use crate::sweep::{RowSpec, Sweep};

/// What the pass moves and where the bytes live.
pub struct Pass<'a> {
    /// The sweep (window, group, verify, layout).
    pub sweep: &'a Sweep,
    /// The row.
    pub row: RowSpec,
    /// Iterations in this pass (warmup or timed).
    pub iters: u64,
    /// Seeds of this pass's patterns (both sides derive the same).
    pub seed: u64,
    /// Bound on the pass.
    pub deadline: Duration,
    /// Bytes between two buffers ([`Sweep::stride`], computed once: it scans every size).
    pub stride: usize,
    /// The registered region's first byte.
    pub base: *mut u8,
    /// Its registration.
    pub mhandle: &'a MemHandle,
}

/// What a pass measured.
#[derive(Clone, Debug, Default)]
pub struct Timing {
    /// First post to last completion.
    pub elapsed: Duration,
    /// Post to completion of every request, in completion order.
    pub latencies: Vec<Duration>,
    /// Payload bytes the completions reported (receiver) or posted (sender).
    pub bytes: u64,
}

impl Timing {
    /// The `p`-th percentile (nearest rank) latency; zero without samples.
    pub fn percentile(&self, p: f64) -> Duration {
        let mut sorted = self.latencies.clone();
        sorted.sort_unstable();
        let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
        sorted
            .get(rank.saturating_sub(1).min(sorted.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    }
}

/// Slots of buffers that requests in flight own: distinct per request when verifying (its bytes
/// stay until checked), one shared slot otherwise.
struct Slots {
    free: Vec<usize>,
    held: Vec<usize>,
    shared: bool,
}

impl Slots {
    fn new(count: usize, items: usize) -> Slots {
        Slots {
            free: (0..count).rev().collect(),
            held: vec![0; items],
            shared: count <= 1,
        }
    }

    /// A slot for item `i` (`None`: all busy, which the window rules out, so "try again").
    fn take(&mut self, i: usize) -> Option<usize> {
        if self.shared {
            return Some(0);
        }
        let slot = self.free.pop()?;
        self.held[i] = slot;
        Some(slot)
    }

    fn give_back(&mut self, i: usize) {
        if !self.shared {
            self.free.push(self.held[i]);
        }
    }
}

struct State {
    slots: Slots,
    posted: Vec<Option<Instant>>,
    timing: Timing,
}

fn state(slots: usize, items: usize) -> RefCell<State> {
    RefCell::new(State {
        slots: Slots::new(slots, items),
        posted: vec![None; items],
        timing: Timing {
            latencies: Vec::with_capacity(items),
            ..Timing::default()
        },
    })
}

/// The other side's failure, if any ([`crate::link::Link::peer_failed`]). Asked on every `test`
/// and on every post the plugin refuses ("try again"), so a side whose peer failed mid-row stops
/// at once instead of at its deadline, even with nothing in flight.
pub type Watch<'w> = &'w mut dyn FnMut() -> Option<String>;

fn check(watch: &RefCell<Watch<'_>>) -> Result<()> {
    let mut watch = watch.borrow_mut();
    match (*watch)() {
        Some(why) => Err(Error::Io(format!("stopped: {why}"))),
        None => Ok(()),
    }
}

impl Pass<'_> {
    fn buffer(&self, index: usize) -> *mut u8 {
        // SAFETY: callers pass indices below the region's buffer count (`Sweep::recv_len` /
        // `send_len` bytes were reserved), so the offset stays inside the region.
        unsafe { self.base.add(index * self.stride) }
    }

    fn where_(&self, iteration: usize, member: usize) -> String {
        format!(
            "iteration {iteration} (message {member} of {})",
            self.sweep.group
        )
    }

    /// The receiving side: `iters` grouped `irecv`s.
    pub fn recv(&self, net: &Net<'_>, comm: &RecvComm, watch: Watch<'_>) -> Result<Timing> {
        let (group, size) = (self.sweep.group, self.row.size);
        let count = self.iters as usize;
        let st = state(self.sweep.recv_slots(), count);
        let watch = RefCell::new(watch);
        let start = Instant::now();
        Loop {
            what: "irecv",
            count,
            window: self.sweep.window,
            deadline: self.deadline,
        }
        .run(
            |i| {
                let mut s = st.borrow_mut();
                let Some(slot) = s.slots.take(i) else {
                    return Ok(None);
                };
                let bufs: Vec<RecvBuf> = (0..group)
                    .map(|j| RecvBuf {
                        data: self.buffer(slot * group + j).cast(),
                        size,
                        tag: j as i32,
                        mhandle: self.mhandle.as_ptr(),
                    })
                    .collect();
                let posted_at = Instant::now();
                // SAFETY: the buffers lie in the registered region, which outlives the request
                // (a failed pass taints the side, and the region is then leaked, never freed).
                let request = unsafe { net.irecv(comm, &bufs) }
                    .map_err(|e| e.context(format!("irecv of {}", self.where_(i, 0))))?;
                match request {
                    Some(_) => s.posted[i] = Some(posted_at),
                    None => {
                        s.slots.give_back(i);
                        check(&watch)?;
                    }
                }
                Ok(request)
            },
            |i, request| {
                check(&watch)?;
                let mut sizes = [0i32; PROXY_MAX_SUBS];
                let done = net
                    .test(request, Some(&mut sizes[..]))
                    .map_err(|e| e.context(format!("test of irecv {}", self.where_(i, 0))))?;
                if done {
                    let mut s = st.borrow_mut();
                    self.received(&mut s, i, &sizes[..group])?;
                }
                Ok(done)
            },
        )?;
        let mut timing = st.into_inner().timing;
        timing.elapsed = start.elapsed();
        Ok(timing)
    }

    /// Bookkeeping for a completed receive: latency, sizes, and with `--verify` every byte.
    fn received(&self, s: &mut State, i: usize, sizes: &[i32]) -> Result<()> {
        let now = Instant::now();
        if let Some(posted) = s.posted[i] {
            s.timing.latencies.push(now - posted);
        }
        let slot = if s.slots.shared { 0 } else { s.slots.held[i] };
        for (j, &got) in sizes.iter().enumerate() {
            if usize::try_from(got).ok() != Some(self.row.size) {
                return Err(Error::Mismatch(format!(
                    "irecv {}: test reported {got} bytes, the sender sent {}",
                    self.where_(i, j),
                    self.row.size
                )));
            }
            s.timing.bytes += self.row.size as u64;
            if self.sweep.verify {
                let data = self.buffer(slot * self.sweep.group + j);
                // SAFETY: the request is done, so the plugin no longer writes these `size` bytes
                // of the region, and no other request owns this slot while we hold it.
                let bytes = unsafe { std::slice::from_raw_parts(data, self.row.size) };
                let seed = pattern::seed(self.seed, i as u64, j as u64);
                if let Some((at, expected, found)) = pattern::first_mismatch(bytes, seed) {
                    return Err(Error::Mismatch(format!(
                        "irecv {}: byte {at} of {} is {found:#04x}, expected {expected:#04x}",
                        self.where_(i, j),
                        self.row.size
                    )));
                }
            }
        }
        s.slots.give_back(i);
        Ok(())
    }

    /// The sending side: `iters * group` `isend`s (message `m` is member `m % group` of
    /// iteration `m / group`, tag = member).
    pub fn send(&self, net: &Net<'_>, comm: &SendComm, watch: Watch<'_>) -> Result<Timing> {
        let (group, size) = (self.sweep.group, self.row.size);
        let count = self.iters as usize * group;
        let st = state(self.sweep.send_slots(), count);
        let watch = RefCell::new(watch);
        let start = Instant::now();
        Loop {
            what: "isend",
            count,
            window: self.sweep.window,
            deadline: self.deadline,
        }
        .run(
            |m| {
                let mut s = st.borrow_mut();
                let Some(slot) = s.slots.take(m) else {
                    return Ok(None);
                };
                let (iteration, member) = (m / group, m % group);
                let tag = member as i32;
                let buffer = if self.sweep.verify { slot } else { member };
                let data = self.buffer(buffer);
                if self.sweep.verify {
                    // SAFETY: this slot belongs to no request in flight (taken above), and it
                    // lies in the region.
                    let bytes = unsafe { std::slice::from_raw_parts_mut(data, size) };
                    let seed = pattern::seed(self.seed, iteration as u64, member as u64);
                    pattern::fill(bytes, seed);
                }
                let posted_at = Instant::now();
                // SAFETY: registered bytes, untouched until the request is done (a failed pass
                // taints the side and the region is leaked).
                let request = unsafe { net.isend(comm, data.cast(), size, tag, self.mhandle) }
                    .map_err(|e| {
                        e.context(format!("isend of {}", self.where_(iteration, member)))
                    })?;
                match request {
                    Some(_) => s.posted[m] = Some(posted_at),
                    None => {
                        s.slots.give_back(m);
                        check(&watch)?;
                    }
                }
                Ok(request)
            },
            |m, request| {
                check(&watch)?;
                let mut got = [-1i32; 1];
                let done = net.test(request, Some(&mut got[..])).map_err(|e| {
                    e.context(format!(
                        "test of isend {}",
                        self.where_(m / group, m % group)
                    ))
                })?;
                if done {
                    let mut s = st.borrow_mut();
                    self.sent(&mut s, m, got[0])?;
                }
                Ok(done)
            },
        )?;
        let mut timing = st.into_inner().timing;
        timing.elapsed = start.elapsed();
        Ok(timing)
    }

    fn sent(&self, s: &mut State, m: usize, got: i32) -> Result<()> {
        if let Some(posted) = s.posted[m] {
            s.timing.latencies.push(posted.elapsed());
        }
        let group = self.sweep.group;
        if usize::try_from(got).ok() != Some(self.row.size) {
            return Err(Error::Mismatch(format!(
                "isend {}: test reported {got} bytes, posted {}",
                self.where_(m / group, m % group),
                self.row.size
            )));
        }
        s.timing.bytes += self.row.size as u64;
        s.slots.give_back(m);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let timing = Timing {
            latencies: (1..=100).rev().map(Duration::from_micros).collect(),
            ..Timing::default()
        };
        assert_eq!(timing.percentile(50.0), Duration::from_micros(50));
        assert_eq!(timing.percentile(99.0), Duration::from_micros(99));
        assert_eq!(timing.percentile(100.0), Duration::from_micros(100));
        assert_eq!(Timing::default().percentile(99.0), Duration::ZERO);
    }

    #[test]
    fn slots_are_exclusive_when_not_shared() {
        let mut slots = Slots::new(2, 4);
        assert_eq!(
            (slots.take(0), slots.take(1), slots.take(2)),
            (Some(0), Some(1), None)
        );
        slots.give_back(0);
        assert_eq!(slots.take(2), Some(0));
        let mut shared = Slots::new(1, 4);
        assert_eq!((shared.take(0), shared.take(1)), (Some(0), Some(0)));
    }
}
