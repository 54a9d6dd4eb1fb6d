//! The `adaptive` policy: a closed loop that moves a flow's share toward equal finish times of
//! its SOUT and SUP parts, from each rail's measured rate while busy.
//!
//! Per interval, with `a` and `b` the SOUT and SUP rates while busy (completed bytes over busy
//! time, from the probes files):
//! - **balance**: the equal-finish share is `b / (a + b)`; the loop moves toward it by at most
//!   `max_step`, and only when the rates predict a gain of at least `min_gain` (near one end a
//!   few parts per 1024 matter: with SOUT at 1/8 of SUP's rate, 7/1024 off costs 5 %). A rail with no measurement yet gets
//!   `probe_step` to measure it (a flow starts at `start_sup_bw`, all SOUT by default: the safe
//!   side, approached upward).
//! - **mixing penalty** (NVIDIA/nccl#2310: two rails together slower than one): when the split
//!   is near balance and `a + b`, what both rails give together, is below the best single rail's
//!   rate by more than `mixing_margin`, the loop measures the rail it has never seen alone (one
//!   interval all on it), then puts the flow on the best single rail and holds there `hold_ms`
//!   before trying both again.
//! - **overload** (the cliff: a rail pushed past its capacity drops packets and every drop costs
//!   an RC retransmission timeout): retransmission counters growing on a rail, or its rate
//!   collapsing below `collapse_ratio` of its recent value right after its share grew, move the
//!   share away from that rail by `max_step` and cap it there for `hold_ms`.
//! - **stale telemetry**: nothing measured, the share holds; after twice `stale_ms`, the loop
//!   falls back to the `capacity` share until data flows again.
//!
//! Pure and deterministic: time is the sum of the samples' intervals.

use super::{capacity, Decision, Sample, FULL, SOUT, SUP};
use crate::config::AdaptiveTuning;

/// Weight of a new rate measurement in the running estimate.
const NEW_WEIGHT: f64 = 0.75;

/// A hold in force.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Hold {
    /// The flow is on this rail alone (mixing penalty).
    Single(usize),
    /// This rail's share may not exceed the bound (overload), parts per 1024 of that rail.
    Cap(usize, u32),
}

/// One flow's loop.
#[derive(Clone, Debug)]
pub struct Adaptive {
    share: u32,
    rate: [Option<f64>; 2],
    solo: [Option<f64>; 2],
    /// Both rails' rate sum when last measured together.
    mixed: Option<f64>,
    hold: Option<(Hold, u64)>,
    /// The rail being measured alone after a suspected mixing penalty.
    probing: Option<usize>,
    /// The rail whose share grew in the last step.
    grew: Option<usize>,
    clock_ns: u64,
    stale_ns: u64,
}

/// The share `rail` gets at SUP share `share`.
fn rail_share(rail: usize, share: u32) -> u32 {
    if rail == SUP {
        share
    } else {
        FULL - share
    }
}

/// The SUP share that gives `rail` the share `part`.
fn share_for(rail: usize, part: u32) -> u32 {
    if rail == SUP {
        part
    } else {
        FULL - part
    }
}

/// Throughput at share `share` for rails of rates `a` (SOUT) and `b` (SUP): a transfer takes
/// as long as its slower part.
fn predicted(a: f64, b: f64, share: u32) -> f64 {
    let s = f64::from(share) / f64::from(FULL);
    1.0 / ((1.0 - s) / a).max(s / b)
}

impl Adaptive {
    /// A loop starting at `tuning.start_sup_bw`.
    pub fn new(tuning: &AdaptiveTuning) -> Adaptive {
        Adaptive {
            share: tuning.start_sup_bw.min(FULL),
            rate: [None; 2],
            solo: [None; 2],
            mixed: None,
            hold: None,
            probing: None,
            grew: None,
            clock_ns: 0,
            stale_ns: 0,
        }
    }

    /// The share the loop last asked for.
    pub fn current(&self) -> u32 {
        self.share
    }

    /// Rates while busy, bytes per second (SOUT, SUP), as estimated.
    pub fn rates(&self) -> [Option<f64>; 2] {
        self.rate
    }

    /// Adopts a share set from outside (an operator's `set` that was released).
    pub fn adopt(&mut self, share: u32) {
        self.share = share.min(FULL);
        self.grew = None;
    }

    /// One interval.
    pub fn step(&mut self, sample: &Sample, tuning: &AdaptiveTuning) -> Decision {
        self.clock_ns += sample.interval_ns;
        if !sample.fresh() {
            return self.stale(sample, tuning);
        }
        self.stale_ns = 0;
        if let Some(hold) = self.hold.filter(|(_, until)| self.clock_ns >= *until) {
            let _ = hold;
            self.hold = None;
        }
        if let Some(rail) = self.overloaded(sample, tuning) {
            return self.back_off(rail, tuning);
        }
        self.measure(sample);
        if let Some(rail) = self.probing.take() {
            return self.after_probe(rail, tuning);
        }
        if let Some((Hold::Single(_), _)) = self.hold {
            return Decision::Keep;
        }
        if let Some(decision) = self.mixing_penalty(tuning) {
            return decision;
        }
        self.balance(tuning)
    }

    fn stale(&mut self, sample: &Sample, tuning: &AdaptiveTuning) -> Decision {
        self.stale_ns += sample.interval_ns;
        if self.stale_ns < 2 * tuning.stale_ms * 1_000_000 {
            return Decision::Keep;
        }
        match capacity::share(sample.link_rate) {
            Some(target) if target != self.share => self.set(target, "stale_fallback"),
            _ => Decision::Keep,
        }
    }

    /// The rail to back off from, if one shows overload.
    fn overloaded(&self, sample: &Sample, tuning: &AdaptiveTuning) -> Option<usize> {
        for rail in [SOUT, SUP] {
            if rail_share(rail, self.share) == 0 {
                continue;
            }
            if sample.retransmissions[rail] > 0 {
                return Some(rail);
            }
            let collapsed = match (self.rate[rail], sample.rate(rail)) {
                (Some(before), Some(now)) => now < tuning.collapse_ratio * before,
                _ => false,
            };
            if collapsed && self.grew == Some(rail) {
                return Some(rail);
            }
        }
        None
    }

    fn back_off(&mut self, rail: usize, tuning: &AdaptiveTuning) -> Decision {
        let part = rail_share(rail, self.share).saturating_sub(tuning.max_step);
        let until = self.clock_ns + tuning.hold_ms * 1_000_000;
        self.hold = Some((Hold::Cap(rail, part), until));
        // The rate measured while overloaded says nothing about the rail's capacity.
        self.rate[rail] = None;
        self.set(share_for(rail, part), "overload")
    }

    fn measure(&mut self, sample: &Sample) {
        let rates = [sample.rate(SOUT), sample.rate(SUP)];
        for rail in [SOUT, SUP] {
            if let Some(now) = rates[rail] {
                self.rate[rail] = Some(match self.rate[rail] {
                    Some(before) => NEW_WEIGHT * now + (1.0 - NEW_WEIGHT) * before,
                    None => now,
                });
            }
        }
        match rates {
            [Some(alone), None] => self.solo[SOUT] = Some(alone),
            [None, Some(alone)] => self.solo[SUP] = Some(alone),
            [Some(a), Some(b)] => self.mixed = Some(a + b),
            [None, None] => {}
        }
    }

    fn best_single(&self) -> Option<(usize, f64)> {
        [SOUT, SUP]
            .into_iter()
            .filter_map(|rail| self.solo[rail].map(|rate| (rail, rate)))
            .max_by(|x, y| x.1.total_cmp(&y.1))
    }

    fn after_probe(&mut self, _probed: usize, tuning: &AdaptiveTuning) -> Decision {
        let (Some((best, best_rate)), Some(mixed)) = (self.best_single(), self.mixed) else {
            return self.balance(tuning);
        };
        if mixed >= (1.0 - tuning.mixing_margin) * best_rate {
            return self.balance(tuning);
        }
        self.hold = Some((
            Hold::Single(best),
            self.clock_ns + tuning.hold_ms * 1_000_000,
        ));
        self.set(share_for(best, FULL), "mixing_penalty")
    }

    fn mixing_penalty(&mut self, tuning: &AdaptiveTuning) -> Option<Decision> {
        let (Some(a), Some(b)) = (self.rate[SOUT], self.rate[SUP]) else {
            return None;
        };
        let target = (b / (a + b) * f64::from(FULL)).round() as u32;
        if self.share.abs_diff(target) > tuning.max_step || self.share == 0 || self.share == FULL {
            return None;
        }
        let (_, best_rate) = self.best_single()?;
        if a + b >= (1.0 - tuning.mixing_margin) * best_rate {
            return None;
        }
        // Both rails together are slower than one alone: measure the rail never seen alone,
        // else go to the best one.
        if let Some(unseen) = [SOUT, SUP].into_iter().find(|r| self.solo[*r].is_none()) {
            self.probing = Some(unseen);
            return Some(self.set(share_for(unseen, FULL), "probe_single_rail"));
        }
        Some(self.after_probe(SOUT, tuning))
    }

    fn balance(&mut self, tuning: &AdaptiveTuning) -> Decision {
        let target = match (self.rate[SOUT], self.rate[SUP]) {
            (Some(a), Some(b)) => (b / (a + b) * f64::from(FULL)).round() as u32,
            (Some(_), None) => self.share.saturating_add(tuning.probe_step).min(FULL),
            (None, Some(_)) => self.share.saturating_sub(tuning.probe_step),
            (None, None) => return Decision::Keep,
        };
        let target = self.capped(target);
        let gain = match (self.rate[SOUT], self.rate[SUP]) {
            (Some(a), Some(b)) => predicted(a, b, target) / predicted(a, b, self.share) - 1.0,
            _ => f64::INFINITY,
        };
        if target == self.share || gain < tuning.min_gain {
            self.grew = None;
            return Decision::Keep;
        }
        let next = if target > self.share {
            self.share + (target - self.share).min(tuning.max_step)
        } else {
            self.share - (self.share - target).min(tuning.max_step)
        };
        self.set(next, "balance")
    }

    fn capped(&self, target: u32) -> u32 {
        match self.hold {
            Some((Hold::Cap(rail, part), _)) if rail_share(rail, target) > part => {
                share_for(rail, part)
            }
            _ => target,
        }
    }

    fn set(&mut self, share: u32, reason: &'static str) -> Decision {
        let share = share.min(FULL);
        self.grew = match share.cmp(&self.share) {
            std::cmp::Ordering::Greater => Some(SUP),
            std::cmp::Ordering::Less => Some(SOUT),
            std::cmp::Ordering::Equal => None,
        };
        if share == self.share {
            return Decision::Keep;
        }
        self.share = share;
        Decision::Set {
            sup_bw: share,
            reason,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
#[path = "tests_adaptive.rs"]
mod tests;
