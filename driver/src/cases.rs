//! The conformance case list shared by the loopback and the verbs backends.
//!
//! A [`Case`] is a named, deterministic list of [`Step`]s (a [`Plan`], a pattern seed and an
//! iteration count), optionally with the SUP share the sender sets through the test agent before
//! it starts (advanced mode). Both sides of a cross-process run (`mpib-xfer`) build the same list
//! from the same names and walk it in the same order; the loopback runs the same names in one
//! process (`driver/tests/cases_loopback.rs`). Only the sizes scale with the fabric
//! ([`Scale`]): the Soft-RoCE rig moves 20–90 MB/s, so its largest message is 4 MiB, not 64 MiB.

use crate::error::{Error, Result};
use crate::pattern;
use crate::plan::Plan;
use crate::testing::{slot_capacity, BASIC_SIZES, LARGE_SIZE};

/// How big the messages get.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scale {
    /// The in-process loopback fabric: the core issue's sizes, up to 64 MiB.
    Loopback,
    /// The Soft-RoCE rig (emulated CPU, tens of MB/s): up to 4 MiB, fewer iterations.
    Rig,
}

impl Scale {
    /// Parses `loopback` or `rig`.
    pub fn parse(text: &str) -> Result<Scale> {
        match text {
            "loopback" => Ok(Scale::Loopback),
            "rig" => Ok(Scale::Rig),
            other => Err(Error::Refused(format!(
                "scale {other:?}: expected `loopback` or `rig`"
            ))),
        }
    }

    /// Single-message sizes every version must move byte-exactly.
    pub fn sizes(self) -> Vec<usize> {
        match self {
            Scale::Loopback => BASIC_SIZES.iter().copied().chain([LARGE_SIZE]).collect(),
            Scale::Rig => vec![0, 1, 127, 128, 4097, 64 << 10, (1 << 20) + 3, 4 << 20],
        }
    }

    /// Iterations of each small message (each iteration has its own pattern).
    pub fn iterations(self) -> u64 {
        match self {
            Scale::Loopback => 2,
            Scale::Rig => 2,
        }
    }

    /// The one large message of a split case (not a multiple of 128, so the split rounds).
    pub fn split_large(self) -> usize {
        (4 << 20) + 5
    }
}

/// One plan, run `iterations` times with the pattern of (`seed`, iteration).
#[derive(Clone, Debug)]
pub struct Step {
    /// What is posted.
    pub plan: Plan,
    /// Pattern seed (see [`pattern::seed`]).
    pub seed: u64,
    /// How many times; each iteration has its own bytes.
    pub iterations: u64,
}

/// A named list of steps.
#[derive(Clone, Debug)]
pub struct Case {
    /// The name it was built from (`sizes`, `split-256`, …).
    pub name: String,
    /// Advanced mode: the SUP share (parts per 1024) the sender sets on every hint slot before
    /// the first step. `None`: whatever the mode and island decide.
    pub sup_bw: Option<u32>,
    /// What is moved, in order.
    pub steps: Vec<Step>,
}

impl Case {
    /// An empty case (steps are added with [`Case::push`]).
    pub fn new(name: &str) -> Case {
        Case {
            name: name.to_string(),
            sup_bw: None,
            steps: Vec::new(),
        }
    }

    /// Adds a step; its seed comes from the case name, the step's position and the plan's label.
    pub fn push(&mut self, plan: Plan, iterations: u64) {
        let seed = pattern::case_id(&format!(
            "{}#{}:{}",
            self.name,
            self.steps.len(),
            plan.label
        ));
        self.steps.push(Step {
            plan,
            seed,
            iterations,
        });
    }

    /// Messages moved, iterations included.
    pub fn transfers(&self) -> u64 {
        self.steps
            .iter()
            .map(|s| s.plan.sends.len() as u64 * s.iterations)
            .sum()
    }

    /// Payload bytes moved, iterations included.
    pub fn payload_bytes(&self) -> u64 {
        self.steps
            .iter()
            .map(|s| s.plan.payload_bytes() as u64 * s.iterations)
            .sum()
    }

    /// Bytes expected on (SOUT, SUP) when each message of `size` bytes is split by `split`.
    pub fn rail_bytes(&self, split: impl Fn(usize) -> (usize, usize)) -> (u64, u64) {
        let mut total = (0u64, 0u64);
        for step in &self.steps {
            for send in &step.plan.sends {
                let (sout, sup) = split(send.size);
                total.0 += sout as u64 * step.iterations;
                total.1 += sup as u64 * step.iterations;
            }
        }
        total
    }
}

/// Every case name [`case`] knows (`split-N` takes any `N` in 0..=5000; any other name takes a
/// SUP share as `NAME@N`).
pub const NAMES: &[&str] = &[
    "sizes",
    "larger",
    "grouped",
    "outstanding",
    "pipeline",
    "split-N",
    "NAME@N",
];

/// The cases a vanilla pair runs (intra- and inter-island).
pub const VANILLA: &[&str] = &["sizes", "larger", "grouped", "outstanding", "pipeline"];

/// Grouped receives with `n = 1..=8` buffers: distinct tags, distinct sizes, sends posted in a
/// different order than the tags (reversed, then rotated), and sparse groups whose receives are
/// larger than the messages, some of them empty.
pub fn grouped_plans() -> Vec<Plan> {
    let mut plans = Vec::new();
    for n in 1..=8usize {
        let sizes: Vec<usize> = (0..n)
            .map(|i| 1000 * (i + 1) + 37 * i + if i % 3 == 0 { 0 } else { 128 })
            .collect();
        let tags: Vec<i32> = (0..n).map(|i| 100 + 7 * i as i32).collect();
        let reversed: Vec<usize> = (0..n).rev().collect();
        let rotated: Vec<usize> = (0..n).map(|i| (i + n / 2 + 1) % n).collect();
        plans.push(Plan::grouped(&sizes, &tags, &reversed));
        if n > 2 {
            plans.push(Plan::grouped(&sizes, &tags, &rotated));
            // NCCL posts capacities larger than the messages, and some subs can be empty.
            let sparse: Vec<usize> = sizes
                .iter()
                .enumerate()
                .map(|(i, s)| if i % 3 == 1 { 0 } else { *s })
                .collect();
            plans.push(Plan::grouped(&sparse, &tags, &rotated).with_capacities(|s| s + 8192));
        }
    }
    plans
}

/// 32 grouped receives of 8 buffers each (NCCL's request budget × `maxRecvs`), i.e. up to 256
/// sends in flight.
pub fn many_outstanding_plan() -> Plan {
    let sizes: Vec<usize> = (0..8).map(|i| 4096 + 128 * i + i).collect();
    let tags: Vec<i32> = (0..8).collect();
    let order: Vec<usize> = vec![3, 1, 7, 5, 0, 2, 6, 4];
    Plan::streams(
        32,
        &sizes,
        &tags,
        &order,
        crate::abi::NCCL_NET_MAX_REQUESTS,
        crate::abi::PLUGIN_REQUEST_SLOTS,
    )
    .labelled("256 sends in flight (32 x grouped n=8)")
}

/// 96 pipelined messages of mixed sizes, 16 in flight.
pub fn pipeline_plan() -> Plan {
    let cycle = [0usize, 1, 127, 128, 4097, 65_536, 1000, 8191];
    Plan::pipeline(96, |i| cycle[i % cycle.len()], 16).labelled("pipeline of 96 mixed sizes")
}

/// Sizes of the larger-receive case (each into a receive of NCCL's slot capacity).
pub const LARGER_SIZES: [usize; 6] = [0, 1, 127, 4097, 65_536 + 3, (1 << 20) + 3];

fn sizes_into(case: &mut Case, sizes: &[usize], iterations: u64) {
    for &size in sizes {
        case.push(Plan::single(size), iterations);
    }
}

fn larger_into(case: &mut Case) {
    for size in LARGER_SIZES {
        case.push(Plan::single(size).with_capacities(slot_capacity), 1);
    }
}

fn grouped_into(case: &mut Case) {
    for plan in grouped_plans() {
        case.push(plan, 1);
    }
}

fn parse_sup_bw(name: &str, text: &str) -> Result<u32> {
    text.parse::<u32>()
        .ok()
        .filter(|bw| *bw <= 5000)
        .ok_or_else(|| {
            Error::Refused(format!(
                "case {name:?}: the SUP share must be 0..=5000 (parts per 1024)"
            ))
        })
}

/// Builds the case called `name` at `scale`. `NAME@N` is case `NAME` run at SUP share `N`
/// (advanced mode; e.g. `grouped@512`).
pub fn case(name: &str, scale: Scale) -> Result<Case> {
    if let Some((base, share)) = name.split_once('@') {
        let mut case = case(base, scale)?;
        if case.sup_bw.is_some() {
            return Err(Error::Refused(format!(
                "case {name:?}: {base} already sets its SUP share"
            )));
        }
        case.sup_bw = Some(parse_sup_bw(name, share)?);
        case.name = name.to_string();
        for step in &mut case.steps {
            step.seed ^= pattern::case_id(name);
        }
        return Ok(case);
    }
    let mut case = Case::new(name);
    match name {
        "sizes" => sizes_into(&mut case, &scale.sizes(), scale.iterations()),
        "larger" => larger_into(&mut case),
        "grouped" => grouped_into(&mut case),
        "outstanding" => case.push(many_outstanding_plan(), 1),
        "pipeline" => case.push(pipeline_plan(), 2),
        split if split.starts_with("split-") => {
            case.sup_bw = Some(parse_sup_bw(split, &split["split-".len()..])?);
            // The rig's sizes at both scales: the split rounding is what is tested here.
            sizes_into(&mut case, &Scale::Rig.sizes(), 1);
            sizes_into(&mut case, &[scale.split_large()], 1);
            grouped_into(&mut case);
            larger_into(&mut case);
            case.push(
                Plan::pipeline(32, |i| 3000 + 1531 * i, 16).labelled("pipeline of 32"),
                1,
            );
        }
        other => {
            return Err(Error::Refused(format!(
                "unknown case {other:?}; known: {}",
                NAMES.join(", ")
            )))
        }
    }
    Ok(case)
}

/// Builds every case of a comma-separated list, in order.
pub fn parse_list(list: &str, scale: Scale) -> Result<Vec<Case>> {
    let cases = list
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(|n| case(n, scale))
        .collect::<Result<Vec<_>>>()?;
    if cases.is_empty() {
        return Err(Error::Refused(format!("no case named in {list:?}")));
    }
    Ok(cases)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_are_deterministic_and_scaled() {
        let a = parse_list("sizes,grouped,split-256", Scale::Rig).unwrap();
        let b = parse_list("sizes, grouped ,split-256", Scale::Rig).unwrap();
        assert_eq!(a.len(), 3);
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(x.name, y.name);
            let seeds = |c: &Case| c.steps.iter().map(|s| s.seed).collect::<Vec<_>>();
            assert_eq!(seeds(x), seeds(y));
        }
        assert_eq!(a[2].sup_bw, Some(256));
        let largest = |c: &Case| c.steps.iter().map(|s| s.plan.send_len()).max().unwrap();
        assert_eq!(largest(&a[0]), 4 << 20);
        let loopback = case("sizes", Scale::Loopback).unwrap();
        assert_eq!(largest(&loopback), LARGE_SIZE);
        assert!(case("split-9999", Scale::Rig).is_err());
        assert!(case("nope", Scale::Rig).is_err());
        assert!(parse_list(",", Scale::Rig).is_err());
        let at = case("grouped@512", Scale::Rig).unwrap();
        assert_eq!((at.sup_bw, at.name.as_str()), (Some(512), "grouped@512"));
        assert_ne!(
            at.steps[0].seed,
            case("grouped", Scale::Rig).unwrap().steps[0].seed
        );
        assert!(case("split-5@5", Scale::Rig).is_err());
        assert!(case("grouped@x", Scale::Rig).is_err());
        let split = case("split-512", Scale::Rig).unwrap();
        let (sout, sup) = split.rail_bytes(|s| crate::expected_split(s, 512));
        assert_eq!(sout + sup, split.payload_bytes());
        let seeds: std::collections::HashSet<u64> = split.steps.iter().map(|s| s.seed).collect();
        assert_eq!(
            seeds.len(),
            split.steps.len(),
            "every step has its own pattern"
        );
        for name in VANILLA {
            assert!(case(name, Scale::Rig).unwrap().transfers() > 0, "{name}");
        }
    }
}
