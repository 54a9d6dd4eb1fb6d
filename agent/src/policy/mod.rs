//! Policies: what SUP share (parts per 1024) each flow gets. Pure: a policy sees one flow's
//! [`Sample`] per interval and answers a [`Decision`]; no I/O, no clock of its own.
//!
//! - `static`: a fixed share from a rule (by subnet or island pair).
//! - `capacity` (the default): the share that gives both rails equal finish times if each runs at
//!   its link rate: `sup / (sout + sup)`.
//! - `adaptive`: the closed loop in [`adaptive`], from measured per-rail rates.

use serde::Deserialize;

pub mod adaptive;
pub mod capacity;

pub use adaptive::Adaptive;

/// A policy's name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PolicyKind {
    /// A fixed share.
    Static,
    /// From the link rates.
    Capacity,
    /// The closed loop.
    Adaptive,
}

impl PolicyKind {
    /// Its name in the configuration and the metrics.
    pub const fn name(self) -> &'static str {
        match self {
            PolicyKind::Static => "static",
            PolicyKind::Capacity => "capacity",
            PolicyKind::Adaptive => "adaptive",
        }
    }
}

/// Rail index of SOUT in the arrays below.
pub const SOUT: usize = 0;
/// Rail index of SUP.
pub const SUP: usize = 1;
/// The whole share.
pub const FULL: u32 = 1024;

/// One flow over one interval, summed over its senders' connections.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Sample {
    /// Length of the interval, ns.
    pub interval_ns: u64,
    /// Bytes per rail whose completion the senders saw.
    pub done_bytes: [u64; 2],
    /// Busy time per rail, ns: the time any of the flow's connections had a part in flight on it
    /// (sampled; summed over connections for files older than probes 2.2, measure.rs).
    pub busy_ns: [u64; 2],
    /// NIC retransmission-type counter increase per rail.
    pub retransmissions: [u64; 2],
    /// Link rate per rail, bytes per second (0 unknown): configured, else as the devices report.
    pub link_rate: [f64; 2],
}

impl Sample {
    /// Whether anything moved.
    pub fn fresh(&self) -> bool {
        self.done_bytes[SOUT] + self.done_bytes[SUP] > 0
    }

    /// Rate of `rail` while busy, bytes per second, when it carried data.
    pub fn rate(&self, rail: usize) -> Option<f64> {
        (self.done_bytes[rail] > 0 && self.busy_ns[rail] > 0)
            .then(|| self.done_bytes[rail] as f64 * 1e9 / self.busy_ns[rail] as f64)
    }

    /// Bytes per second of both rails over the interval.
    pub fn throughput(&self) -> f64 {
        let total = (self.done_bytes[SOUT] + self.done_bytes[SUP]) as f64;
        total * 1e9 / self.interval_ns.max(1) as f64
    }

    /// The SUP share of the bytes moved, parts per 1024.
    pub fn measured_share(&self) -> Option<u32> {
        let total = self.done_bytes[SOUT] + self.done_bytes[SUP];
        (total > 0).then(|| ((self.done_bytes[SUP] as f64 * 1024.0 / total as f64).round()) as u32)
    }
}

/// What to do with a flow's share.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Leave it.
    Keep,
    /// Set it, for this reason (a metrics label).
    Set {
        /// Parts per 1024.
        sup_bw: u32,
        /// Why.
        reason: &'static str,
    },
}

/// Per-flow policy state.
#[derive(Clone, Debug)]
pub enum FlowPolicy {
    /// Fixed.
    Static(u32),
    /// From the link rates.
    Capacity,
    /// The loop's state (boxed: much larger than the other variants).
    Adaptive(Box<Adaptive>),
}

impl FlowPolicy {
    /// Its kind.
    pub fn kind(&self) -> PolicyKind {
        match self {
            FlowPolicy::Static(_) => PolicyKind::Static,
            FlowPolicy::Capacity => PolicyKind::Capacity,
            FlowPolicy::Adaptive(_) => PolicyKind::Adaptive,
        }
    }

    /// The share a flow starts with before any sample.
    pub fn initial(&self, link_rate: [f64; 2]) -> u32 {
        match self {
            FlowPolicy::Static(v) => *v,
            FlowPolicy::Capacity => capacity::share(link_rate).unwrap_or(0),
            FlowPolicy::Adaptive(a) => a.current(),
        }
    }

    /// One interval's decision for a flow whose share is `current`.
    pub fn decide(
        &mut self,
        current: u32,
        sample: &Sample,
        tuning: &crate::config::AdaptiveTuning,
    ) -> Decision {
        match self {
            FlowPolicy::Static(v) => set_if_changed(current, *v, "rule"),
            FlowPolicy::Capacity => match capacity::share(sample.link_rate) {
                Some(v) => set_if_changed(current, v, "link_rates"),
                None => Decision::Keep,
            },
            FlowPolicy::Adaptive(loop_state) => loop_state.step(sample, tuning),
        }
    }
}

/// `Set` when `target` differs from `current`.
pub fn set_if_changed(current: u32, target: u32, reason: &'static str) -> Decision {
    if current == target {
        Decision::Keep
    } else {
        Decision::Set {
            sup_bw: target,
            reason,
        }
    }
}
