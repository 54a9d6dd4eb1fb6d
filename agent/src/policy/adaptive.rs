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
//!   an RC retransmission timeout): the NIC's retransmission counters growing faster than
//!   `overload_retransmissions_per_gb` of the flow's bytes on a rail, or its rate collapsing below
//!   `collapse_ratio` of its recent value right after its share grew, move the share away from
//!   that rail by `max_step` and cap that rail there for `hold_ms` (one cap per rail; the worse
//!   rail when both show it). While a cap holds, the mixing-penalty check is skipped.
//! - **stale telemetry**: nothing measured, the share holds; after twice `stale_ms`, the loop
//!   falls back to the `capacity` share until data flows again.
//!
//! Pure and deterministic: time is the sum of the samples' intervals.

use super::{capacity, Decision, Sample, FULL, SOUT, SUP};
use crate::config::AdaptiveTuning;

/// Weight of a new rate measurement in the running estimate.
const NEW_WEIGHT: f64 = 0.75;

/// A rail that carried at most this fraction of the bytes counts as idle for a single-rail
/// measurement (transfers posted before a switch still complete on the old rail).
const SOLO_TOLERANCE: f64 = 0.02;

/// The least bytes a rail's retransmissions are divided by (100 MB).
const MIN_NORMALISING_BYTES: u64 = 100_000_000;

/// A rail busy less than this fraction of the interval gave too few completions for its rate to
/// be judged collapsed (measured on the rig: 1 MiB parts at 10 MB/s, a handful per interval).
const MIN_BUSY_FRACTION: f64 = 0.8;

/// Consecutive collapsed intervals that count as overload (one can be a measuring artefact).
const COLLAPSE_INTERVALS: u8 = 2;

/// Intervals a single-rail probe may wait for a clean measurement.
const PROBE_INTERVALS: u8 = 3;

/// One flow's loop.
#[derive(Clone, Debug)]
pub struct Adaptive {
    share: u32,
    rate: [Option<f64>; 2],
    solo: [Option<f64>; 2],
    /// Both rails' rate sum when last measured together.
    mixed: Option<f64>,
    /// The flow is on this rail alone until the time (mixing penalty).
    single: Option<(usize, u64)>,
    /// Per rail: its share may not exceed the bound (parts per 1024 of that rail) until the
    /// time (overload).
    caps: [Option<(u32, u64)>; 2],
    /// The rail being measured alone after a suspected mixing penalty, and intervals left.
    probing: Option<(usize, u8)>,
    /// The rail whose share grew in the last step.
    grew: Option<usize>,
    /// Per rail: consecutive intervals its rate stayed collapsed after its share grew.
    collapsed: [u8; 2],
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

fn ms_to_ns(ms: u64) -> u64 {
    ms.saturating_mul(1_000_000)
}

impl Adaptive {
    /// A loop starting at `tuning.start_sup_bw`.
    pub fn new(tuning: &AdaptiveTuning) -> Adaptive {
        Adaptive {
            share: tuning.start_sup_bw.min(FULL),
            rate: [None; 2],
            solo: [None; 2],
            mixed: None,
            single: None,
            caps: [None; 2],
            probing: None,
            grew: None,
            collapsed: [0; 2],
            clock_ns: 0,
            stale_ns: 0,
        }
    }

    /// The share the loop last asked for.
    pub fn current(&self) -> u32 {
        self.share
    }

    /// Adopts a share set from outside (an operator's `set` that was released).
    pub fn adopt(&mut self, share: u32) {
        self.share = share.min(FULL);
        self.grew = None;
    }

    /// One interval.
    pub fn step(&mut self, sample: &Sample, tuning: &AdaptiveTuning) -> Decision {
        self.clock_ns = self.clock_ns.saturating_add(sample.interval_ns);
        if !sample.fresh() {
            return self.stale(sample, tuning);
        }
        self.stale_ns = 0;
        let now = self.clock_ns;
        self.single = self.single.filter(|(_, until)| now < *until);
        for cap in &mut self.caps {
            *cap = cap.filter(|(_, until)| now < *until);
        }
        self.track_collapse(sample, tuning);
        if let Some((rail, sign)) = self.overloaded(sample, tuning) {
            return self.back_off(rail, sign, tuning);
        }
        self.measure(sample);
        if let Some(decision) = self.probe_result(sample, tuning) {
            return decision;
        }
        if self.single.is_some() {
            return Decision::Keep;
        }
        if let Some(decision) = self.mixing_penalty(tuning) {
            return decision;
        }
        self.balance(tuning)
    }

    fn stale(&mut self, sample: &Sample, tuning: &AdaptiveTuning) -> Decision {
        self.stale_ns = self.stale_ns.saturating_add(sample.interval_ns);
        if self.stale_ns < ms_to_ns(tuning.stale_ms).saturating_mul(2) {
            return Decision::Keep;
        }
        let decision = match capacity::share(sample.link_rate) {
            Some(target) if target != self.share => self.set(target, "stale_fallback"),
            _ => Decision::Keep,
        };
        // Not a step of the loop: a rate on resuming is no sign that this move overloaded a rail.
        self.grew = None;
        decision
    }

    /// Retransmissions per GB a rail completed in the interval (the count is the NIC port's,
    /// shared with every other user of the port: it is normalised by this flow's bytes). At
    /// least [`MIN_NORMALISING_BYTES`] count as moved, so that one stray retransmission in an
    /// interval that completed almost nothing is not a flood.
    fn retransmission_rate(sample: &Sample, rail: usize) -> f64 {
        let bytes = sample.done_bytes[rail].max(MIN_NORMALISING_BYTES);
        sample.retransmissions[rail] as f64 / (bytes as f64 / 1e9)
    }

    /// The rail to back off from and the sign seen, if one shows overload (the worse one when
    /// both do).
    fn overloaded(
        &self,
        sample: &Sample,
        tuning: &AdaptiveTuning,
    ) -> Option<(usize, &'static str)> {
        let signal = |rail: usize| -> Option<(f64, &'static str)> {
            if rail_share(rail, self.share) == 0 {
                return None;
            }
            let rate = Self::retransmission_rate(sample, rail);
            if sample.retransmissions[rail] > 0 && rate > tuning.overload_retransmissions_per_gb {
                return Some((rate, "retransmissions"));
            }
            (self.collapsed[rail] >= COLLAPSE_INTERVALS).then_some((f64::MAX, "rate_collapse"))
        };
        match (signal(SOUT), signal(SUP)) {
            (Some(a), Some(b)) if b.0 > a.0 => Some((SUP, b.1)),
            (Some(a), _) => Some((SOUT, a.1)),
            (None, Some(b)) => Some((SUP, b.1)),
            (None, None) => None,
        }
    }

    /// Counts the intervals a rail's rate, relative to the other rail's, stays below
    /// `collapse_ratio` of the estimates' ratio after its share grew (a finish-time outlier: the
    /// rail's parts suddenly take far longer than the other's). Relative, because what slows
    /// both rails alike (more connections sharing the flow, a busy CPU) is no rail's overload.
    /// Not while a single-rail probe runs: moving all to one rail changes the rates by design.
    fn track_collapse(&mut self, sample: &Sample, tuning: &AdaptiveTuning) {
        for rail in [SOUT, SUP] {
            let other = 1 - rail;
            let collapsed = match (
                self.rate[rail],
                self.rate[other],
                sample.rate(rail),
                sample.rate(other),
            ) {
                (Some(before), Some(before_other), Some(now), Some(now_other)) => {
                    let busy = sample.busy_ns[rail] as f64 / sample.interval_ns.max(1) as f64;
                    busy >= MIN_BUSY_FRACTION
                        && now / now_other < tuning.collapse_ratio * (before / before_other)
                }
                _ => false,
            };
            let suspect = self.grew == Some(rail) || self.collapsed[rail] > 0;
            self.collapsed[rail] = if collapsed && suspect && self.probing.is_none() {
                self.collapsed[rail].saturating_add(1)
            } else {
                0
            };
        }
    }

    fn back_off(&mut self, rail: usize, sign: &'static str, tuning: &AdaptiveTuning) -> Decision {
        self.collapsed = [0; 2];
        let part = rail_share(rail, self.share).saturating_sub(tuning.max_step);
        let until = self.clock_ns.saturating_add(ms_to_ns(tuning.hold_ms));
        self.caps[rail] = Some((part, until));
        self.probing = None;
        if self.single.is_some_and(|(alone, _)| alone == rail) {
            self.single = None;
        }
        // The rate measured while overloaded says nothing about the rail's capacity.
        self.rate[rail] = None;
        // Moving away from this rail must not push the other past its own cap.
        let share = self.capped(share_for(rail, part));
        self.set(share, sign)
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
        let total = (sample.done_bytes[SOUT] as f64 + sample.done_bytes[SUP] as f64).max(1.0);
        // Alone only when the share asked for it too: an interval in which the other rail
        // happened to complete nothing (a slow rail, a short interval) says nothing of how this
        // one does alone.
        let share = f64::from(self.share) / f64::from(FULL);
        let asked = [share <= SOLO_TOLERANCE, share >= 1.0 - SOLO_TOLERANCE];
        let alone = |rail: usize| {
            asked[rail] && sample.done_bytes[1 - rail] as f64 / total <= SOLO_TOLERANCE
        };
        match rates {
            [Some(a), _] if alone(SOUT) => self.solo[SOUT] = Some(a),
            [_, Some(b)] if alone(SUP) => self.solo[SUP] = Some(b),
            [Some(a), Some(b)] => self.mixed = Some(a + b),
            _ => {}
        }
    }

    fn best_single(&self) -> Option<(usize, f64)> {
        [SOUT, SUP]
            .into_iter()
            .filter_map(|rail| self.solo[rail].map(|rate| (rail, rate)))
            .max_by(|x, y| x.1.total_cmp(&y.1))
    }

    /// After a single-rail probe: wait (a few intervals at most) for a clean measurement of the
    /// rail alone, then choose.
    fn probe_result(&mut self, sample: &Sample, tuning: &AdaptiveTuning) -> Option<Decision> {
        let (rail, left) = self.probing?;
        let total = (sample.done_bytes[SOUT] + sample.done_bytes[SUP]).max(1) as f64;
        let clean = sample.done_bytes[1 - rail] as f64 / total <= SOLO_TOLERANCE;
        if !clean && left > 1 {
            self.probing = Some((rail, left - 1));
            return Some(Decision::Keep);
        }
        self.probing = None;
        Some(self.choose_single(tuning))
    }

    /// Both rails measured alone and together: the best single rail when together is worse.
    fn choose_single(&mut self, tuning: &AdaptiveTuning) -> Decision {
        let (Some((best, best_rate)), Some(mixed)) = (self.best_single(), self.mixed) else {
            return self.balance(tuning);
        };
        if mixed >= (1.0 - tuning.mixing_margin) * best_rate {
            return self.balance(tuning);
        }
        let until = self.clock_ns.saturating_add(ms_to_ns(tuning.hold_ms));
        self.single = Some((best, until));
        self.set(share_for(best, FULL), "mixing_penalty")
    }

    fn mixing_penalty(&mut self, tuning: &AdaptiveTuning) -> Option<Decision> {
        if self.caps.iter().any(Option::is_some) {
            // A rail is capped for overload: going all on one rail could undo the cap.
            return None;
        }
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
            self.probing = Some((unseen, PROBE_INTERVALS));
            return Some(self.set(share_for(unseen, FULL), "probe_single_rail"));
        }
        Some(self.choose_single(tuning))
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

    /// `target` within every rail's cap.
    fn capped(&self, mut target: u32) -> u32 {
        for rail in [SOUT, SUP] {
            if let Some((part, _)) = self.caps[rail] {
                if rail_share(rail, target) > part {
                    target = share_for(rail, part);
                }
            }
        }
        target
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
