//! The loop against a model of two rails: each transfer of `SIZE` bytes is split by the share,
//! each rail moves its part at its rate (both rates scaled down to `mixed` when both carry data,
//! the nccl#2310 case), and the window keeps both rails busy, so a transfer takes the longer of
//! its two parts.

use super::*;
use proptest::prelude::*;

const SIZE: f64 = 4.0 * 1048576.0;
const TICK_NS: u64 = 100_000_000;
const GB: f64 = 1e9;

#[derive(Clone, Copy)]
struct Rails {
    sout: f64,
    sup: f64,
    /// Both rails' total while both carry data (0: no penalty).
    mixed: f64,
}

impl Rails {
    fn rates(&self, share: u32) -> [f64; 2] {
        let both = share > 0 && share < FULL;
        if both && self.mixed > 0.0 {
            let scale = (self.mixed / (self.sout + self.sup)).min(1.0);
            [self.sout * scale, self.sup * scale]
        } else {
            [self.sout, self.sup]
        }
    }

    fn throughput(&self, share: u32) -> f64 {
        let s = f64::from(share) / f64::from(FULL);
        let rate = self.rates(share);
        let time = ((1.0 - s) * SIZE / rate[SOUT]).max(s * SIZE / rate[SUP]);
        SIZE / time
    }

    fn best(&self) -> f64 {
        (0..=FULL).map(|s| self.throughput(s)).fold(0.0, f64::max)
    }

    fn sample(&self, share: u32) -> Sample {
        let s = f64::from(share) / f64::from(FULL);
        let rate = self.rates(share);
        let parts = [(1.0 - s) * SIZE, s * SIZE];
        let transfers = TICK_NS as f64 / 1e9 * self.throughput(share) / SIZE;
        let mut sample = Sample {
            interval_ns: TICK_NS,
            link_rate: [self.sout, self.sup],
            ..Sample::default()
        };
        for rail in [SOUT, SUP] {
            sample.done_bytes[rail] = (transfers * parts[rail]) as u64;
            sample.busy_ns[rail] = (transfers * parts[rail] / rate[rail] * 1e9) as u64;
        }
        sample
    }
}

/// Runs `ticks` intervals; returns the throughput of each.
fn run(loop_state: &mut Adaptive, rails: Rails, ticks: usize) -> Vec<f64> {
    let tuning = AdaptiveTuning::default();
    (0..ticks)
        .map(|_| {
            let sample = rails.sample(loop_state.current());
            loop_state.step(&sample, &tuning);
            rails.throughput(loop_state.current())
        })
        .collect()
}

fn independent() -> Rails {
    Rails {
        sout: 2.0 * GB,
        sup: 4.0 * GB,
        mixed: 0.0,
    }
}

#[test]
fn from_all_sout_reaches_the_sum_within_two_seconds() {
    let rails = independent();
    let mut flow = Adaptive::new(&AdaptiveTuning::default());
    let series = run(&mut flow, rails, 20);
    let last = *series.last().unwrap();
    assert!(last >= 0.95 * rails.best(), "{series:?}");
    let reached = series
        .iter()
        .position(|t| *t >= 0.95 * rails.best())
        .unwrap();
    assert!(reached < 10, "reached at tick {reached}: {series:?}");
    assert!((670..=700).contains(&flow.current()), "{}", flow.current());
}

#[test]
fn a_degraded_rail_moves_the_split_within_two_seconds() {
    let mut rails = independent();
    let mut flow = Adaptive::new(&AdaptiveTuning::default());
    run(&mut flow, rails, 20);
    rails.sup = 0.5 * GB;
    let series = run(&mut flow, rails, 20);
    assert!(*series.last().unwrap() >= 0.9 * rails.best(), "{series:?}");
    assert!(series[..]
        .iter()
        .rev()
        .take(5)
        .all(|t| *t >= 0.9 * rails.best()));
}

#[test]
fn the_mixing_penalty_ends_on_the_best_single_rail() {
    let rails = Rails {
        mixed: 1.5 * GB,
        ..independent()
    };
    let mut flow = Adaptive::new(&AdaptiveTuning::default());
    let series = run(&mut flow, rails, 30);
    assert_eq!(flow.current(), FULL, "{series:?}");
    assert!(*series.last().unwrap() >= 0.95 * rails.best());
    // It tries both rails again after the hold, and comes back.
    let later = run(&mut flow, rails, 200);
    let good = later.iter().filter(|t| **t >= 0.95 * rails.best()).count();
    assert!(
        good >= 190,
        "{good} of 200 intervals at the best single rail"
    );
}

#[test]
fn stale_telemetry_holds_then_falls_back_to_capacity() {
    let tuning = AdaptiveTuning::default();
    let mut flow = Adaptive::new(&tuning);
    run(&mut flow, independent(), 3);
    let before = flow.current();
    let idle = Sample {
        interval_ns: TICK_NS,
        link_rate: [2.0 * GB, 2.0 * GB],
        ..Sample::default()
    };
    let ticks_to_fallback = (2 * tuning.stale_ms * 1_000_000 / TICK_NS) as usize;
    for _ in 1..ticks_to_fallback {
        assert_eq!(flow.step(&idle, &tuning), Decision::Keep);
    }
    assert_eq!(flow.current(), before);
    assert_eq!(
        flow.step(&idle, &tuning),
        Decision::Set {
            sup_bw: 512,
            reason: "stale_fallback"
        }
    );
}

#[test]
fn retransmissions_back_off_and_cap_the_rail() {
    let tuning = AdaptiveTuning::default();
    let mut flow = Adaptive::new(&tuning);
    let rails = independent();
    run(&mut flow, rails, 20);
    let at = flow.current();
    // A few retransmissions on the port (another flow's, or noise) are not overload.
    let mut noise = rails.sample(at);
    noise.retransmissions = [3, 3];
    assert_eq!(flow.step(&noise, &tuning), Decision::Keep);
    let mut sample = rails.sample(at);
    sample.retransmissions[SUP] = 1000;
    assert_eq!(
        flow.step(&sample, &tuning),
        Decision::Set {
            sup_bw: at - tuning.max_step,
            reason: "retransmissions"
        }
    );
    run(&mut flow, rails, 50);
    assert!(
        flow.current() <= at - tuning.max_step,
        "capped during the hold"
    );
    run(&mut flow, rails, 100);
    assert!(
        flow.current() > at - tuning.max_step,
        "free again after the hold"
    );
}

#[test]
fn both_rails_overloaded_backs_off_the_worse_and_keeps_both_caps() {
    let tuning = AdaptiveTuning::default();
    let mut flow = Adaptive::new(&tuning);
    let rails = independent();
    run(&mut flow, rails, 20);
    let at = flow.current();
    let mut sample = rails.sample(at);
    sample.retransmissions = [500, 5000];
    let decision = flow.step(&sample, &tuning);
    assert_eq!(
        decision,
        Decision::Set {
            sup_bw: at - tuning.max_step,
            reason: "retransmissions"
        },
        "SUP has more per GB"
    );
    let mut sample = rails.sample(flow.current());
    sample.retransmissions = [50_000, 0];
    // SOUT overloaded too: its cap is set, but moving toward SUP would break SUP's cap.
    assert_eq!(flow.step(&sample, &tuning), Decision::Keep);
    run(&mut flow, rails, 50);
    let share = flow.current();
    assert!(share <= at - tuning.max_step, "the SUP cap holds: {share}");
}

#[test]
fn a_probe_waits_for_transfers_still_on_the_old_rail() {
    // The mixing case, but every sample after a switch still carries 10 % on the other rail.
    let rails = Rails {
        mixed: 1.5 * GB,
        ..independent()
    };
    let tuning = AdaptiveTuning::default();
    let mut flow = Adaptive::new(&tuning);
    let mut previous = flow.current();
    for _ in 0..40 {
        let mut sample = rails.sample(flow.current());
        if previous != flow.current() && (flow.current() == 0 || flow.current() == FULL) {
            let other = if flow.current() == FULL { SOUT } else { SUP };
            sample.done_bytes[other] = sample.done_bytes[1 - other] / 9;
            sample.busy_ns[other] = sample.busy_ns[1 - other] / 9;
        }
        previous = flow.current();
        flow.step(&sample, &tuning);
    }
    assert_eq!(flow.current(), FULL, "ends on SUP alone");
}

proptest! {
    /// Any pair of independent rails from 0.1 to 10 GB/s: within 2 s the loop is at 95 % of the
    /// best split and the share stays in 0..=1024.
    #[test]
    fn converges_for_any_rates(sout in 0.1f64..10.0, sup in 0.1f64..10.0) {
        let rails = Rails { sout: sout * GB, sup: sup * GB, mixed: 0.0 };
        let mut flow = Adaptive::new(&AdaptiveTuning::default());
        let series = run(&mut flow, rails, 20);
        prop_assert!(flow.current() <= FULL);
        prop_assert!(*series.last().unwrap() >= 0.95 * rails.best(), "{:?}", series);
    }
}
