//! Rail rates for the loopback fabric (`MPIB_LOOPBACK_RAILS`): a bandwidth and a base latency
//! per rail, an optional cap on both rails together, and an optional lower cap that applies only
//! while both rails carry data, all changeable on a schedule.
//!
//! Why it exists: without it the loopback moves data at memcpy speed, so nothing can show what a
//! split between two rails of different speeds gives, and software-emulated RDMA rails (Soft-RoCE
//! under qemu) share one CPU ceiling (docs/PERFORMANCE.md). The model is a virtual wire clock per
//! rail: a WR posted at time `t` starts when its rail's wire is free (`max(t, free)`), occupies it
//! for `bytes / rate`, and is delivered one base latency after it left the wire. A rail is a
//! device, not a connection: every QP of the process on `loop0` shares one clock, like every
//! connection of a process shares one NIC port.
//!
//! * `loopN=RATE` — NIC `loopN`'s own rate, over its rail's (`sout=`/`sup=` give every NIC
//!   opened as that rail its rate): a node of several NIC pairs, each NIC its own wire.
//! * `shared=RATE` — an upstream link both rails cross (a PCIe switch, a shared uplink): every
//!   byte also occupies the shared clock at that rate, so the two rails together never exceed it.
//! * `mixed=RATE` — the NVIDIA/nccl#2310 case, where splitting across a PIX and a PHB NIC made
//!   both slower than the faster NIC alone: while the other rail still carries data (its last WR
//!   is not through), a WR crosses the shared clock at `min(mixed, shared)` instead.
//!
//! Everything here is pure: time comes in as nanoseconds since the model's epoch, so the tests
//! drive it with a fake clock. The caller (the world, under its lock) supplies `now`.

use super::{fabric_error, DEVICES, DEVICE_NAMES};
use crate::fabric::{FabricError, Rail};

/// The variable the spec comes from; parse errors name it.
pub(crate) const RAILS_VAR: &str = "MPIB_LOOPBACK_RAILS";

/// Most phases a schedule may have (a typo like `;;;;` in a script should not allocate much).
const MAX_PHASES: usize = 64;

/// The rates in force during one phase. Rates are bytes per second; `None` = unlimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RailRates {
    /// Per-rail bandwidth, indexed by [`Rail::index`].
    pub(crate) rate: [Option<u64>; 2],
    /// Per-NIC bandwidth (`loopN=`), over the rail's when set; indexed like the devices.
    pub(crate) nic_rate: [Option<Option<u64>>; DEVICES],
    /// Per-rail base latency in nanoseconds (wire exit to delivery).
    pub(crate) latency_ns: [u64; 2],
    /// Cap on both rails together.
    pub(crate) shared: Option<u64>,
    /// Cap on both rails together while both carry data.
    pub(crate) mixed: Option<u64>,
}

impl Default for RailRates {
    fn default() -> RailRates {
        RailRates {
            rate: [None; 2],
            nic_rate: [None; DEVICES],
            latency_ns: [0; 2],
            shared: None,
            mixed: None,
        }
    }
}

impl RailRates {
    /// The rate of NIC `nic` opened as `rail`.
    fn of(&self, nic: usize, rail: Rail) -> Option<u64> {
        self.nic_rate
            .get(nic)
            .copied()
            .flatten()
            .unwrap_or(self.rate[rail.index()])
    }
}

/// The parsed schedule and the wire clocks. `phases` is empty when no rates were given: the
/// fabric then moves data as fast as it can, as before.
#[derive(Clone, Debug, Default)]
pub(crate) struct RateModel {
    /// `(start, rates)` per phase, start in ns since the epoch, strictly increasing, first 0.
    phases: Vec<(u64, RailRates)>,
    /// When each NIC's wire is next free (ns since the epoch).
    free_ns: [u64; DEVICES],
    /// When the shared clock is next free.
    shared_free_ns: u64,
    /// When each rail's last admitted WR is through both its wire and the shared clock: the
    /// rail carries data until then (the mixing cap's test).
    busy_ns: [u64; 2],
    /// The latest delivery time handed out per NIC (a phase that lowers the latency must not
    /// let a later WR overtake an earlier one).
    delivered_ns: [u64; DEVICES],
}

impl RateModel {
    /// The empty model (const: it initialises the process-global world).
    pub(crate) const fn new() -> RateModel {
        RateModel {
            phases: Vec::new(),
            free_ns: [0; DEVICES],
            shared_free_ns: 0,
            busy_ns: [0, 0],
            delivered_ns: [0; DEVICES],
        }
    }

    /// Parses `spec` (see [`parse_phases`]); the clocks start idle.
    pub(crate) fn parse(spec: &str) -> Result<RateModel, FabricError> {
        let phases = parse_phases(spec).map_err(|(token, why)| parse_error(spec, &token, why))?;
        Ok(RateModel {
            phases,
            ..RateModel::new()
        })
    }

    /// Whether any rate or latency is modelled (if not, callers skip reading the clock).
    pub(crate) fn active(&self) -> bool {
        !self.phases.is_empty()
    }

    /// The rates in force at `now_ns`.
    pub(crate) fn rates_at(&self, now_ns: u64) -> RailRates {
        self.phases
            .iter()
            .take_while(|(start, _)| *start <= now_ns)
            .last()
            .map(|(_, rates)| *rates)
            .unwrap_or_default()
    }

    /// Admits a WR of `bytes` posted at `now_ns` on the rail's own NIC (loop0 for SOUT, loop1
    /// for SUP), as a single-pair node does.
    #[cfg(test)]
    pub(crate) fn admit(&mut self, rail: Rail, bytes: u64, now_ns: u64) -> u64 {
        self.admit_on(rail.index(), rail, bytes, now_ns)
    }

    /// Admits a WR of `bytes` posted on NIC `nic` (opened as `rail`) at `now_ns`; returns when
    /// it is delivered. Deliveries on one NIC never go backwards in time, so RC order within a
    /// QP holds.
    pub(crate) fn admit_on(&mut self, nic: usize, rail: Rail, bytes: u64, now_ns: u64) -> u64 {
        let rates = self.rates_at(now_ns);
        let index = rail.index();
        let nic = nic.min(DEVICES - 1);
        let start = now_ns.max(self.free_ns[nic]);
        let rail_done = start.saturating_add(wire_ns(bytes, rates.of(nic, rail)));
        self.free_ns[nic] = rail_done;
        let other_busy = self.busy_ns[1 - index] > now_ns;
        let cap = match (other_busy, rates.mixed, rates.shared) {
            (true, Some(mixed), Some(shared)) => Some(mixed.min(shared)),
            (true, Some(mixed), None) => Some(mixed),
            (_, _, shared) => shared,
        };
        let done = match cap {
            None => rail_done,
            Some(cap) => {
                let shared_done = now_ns
                    .max(self.shared_free_ns)
                    .saturating_add(wire_ns(bytes, Some(cap)));
                self.shared_free_ns = shared_done;
                rail_done.max(shared_done)
            }
        };
        self.busy_ns[index] = self.busy_ns[index].max(done);
        let delivered = done
            .saturating_add(rates.latency_ns[index])
            .max(self.delivered_ns[nic]);
        self.delivered_ns[nic] = delivered;
        delivered
    }

    /// The configured rate of NIC `nic` opened as `rail` in the first phase, in Mbit/s (what
    /// the device reports as its speed), or `None` when unlimited.
    pub(crate) fn initial_speed_mbps(&self, nic: usize, rail: Rail) -> Option<u32> {
        let rate = self.phases.first()?.1.of(nic, rail)?;
        u32::try_from(rate.saturating_mul(8) / 1_000_000).ok()
    }
}

/// Nanoseconds `bytes` occupy a wire of `rate` bytes per second (0 when unlimited).
fn wire_ns(bytes: u64, rate: Option<u64>) -> u64 {
    match rate {
        None | Some(0) => 0,
        Some(rate) => {
            let ns = u128::from(bytes) * 1_000_000_000 / u128::from(rate);
            u64::try_from(ns).unwrap_or(u64::MAX)
        }
    }
}

/// Parses `PHASE(;PHASE)*` where a phase is `[TIME:]ITEM(,ITEM)*` and an item one of
/// `sout=RATE`, `sup=RATE`, `shared=RATE`, `mixed=RATE` (RATE a number with `B/s`, `KB/s`,
/// `MB/s`, `GB/s`, `Kbit/s`, `Mbit/s` or `Gbit/s`, or `off`), `latency=TIME`,
/// `sout.latency=TIME`, `sup.latency=TIME` (TIME a number with `ns`, `us`, `ms` or `s`). The
/// first phase starts at 0 (it may not carry a time); each later phase starts at its TIME after
/// the model took effect, strictly after the one before, and changes only what it names.
/// Errors are `(token, why)`.
fn parse_phases(spec: &str) -> Result<Vec<(u64, RailRates)>, (String, &'static str)> {
    let mut phases: Vec<(u64, RailRates)> = Vec::new();
    if spec.trim().is_empty() {
        return Ok(phases);
    }
    for (number, phase) in spec.split(';').map(str::trim).enumerate() {
        if phases.len() == MAX_PHASES {
            return Err((phase.to_string(), "more than 64 phases"));
        }
        let (start, items) = match phase.split_once(':') {
            Some((time, items)) if number > 0 => (parse_time(time)?, items),
            Some(_) => return Err((phase.to_string(), "the first phase starts at 0: no TIME:")),
            None if number > 0 => return Err((phase.to_string(), "a later phase needs TIME:")),
            None => (0, phase),
        };
        let mut rates = phases.last().map(|(_, r)| *r).unwrap_or_default();
        if phases.last().is_some_and(|(before, _)| start <= *before) {
            return Err((phase.to_string(), "phase times must increase"));
        }
        for item in items.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            apply_item(&mut rates, item)?;
        }
        phases.push((start, rates));
    }
    Ok(phases)
}

/// Applies one `KEY=VALUE` item to `rates`.
fn apply_item(rates: &mut RailRates, item: &str) -> Result<(), (String, &'static str)> {
    let (key, value) = item
        .split_once('=')
        .ok_or((item.to_string(), "expected KEY=VALUE"))?;
    let rail = |name: &str| {
        if name == "sout" {
            Rail::ScaleOut
        } else {
            Rail::ScaleUp
        }
    };
    match key.trim() {
        name @ ("sout" | "sup") => rates.rate[rail(name).index()] = parse_rate(value)?,
        "shared" => rates.shared = parse_rate(value)?,
        "mixed" => rates.mixed = parse_rate(value)?,
        "latency" => rates.latency_ns = [parse_time(value)?; 2],
        name if DEVICE_NAMES.contains(&name) => {
            let nic = DEVICE_NAMES.iter().position(|n| *n == name).unwrap_or(0);
            rates.nic_rate[nic] = Some(parse_rate(value)?);
        }
        name @ ("sout.latency" | "sup.latency") => {
            let rail_name = name.split('.').next().unwrap_or(name);
            rates.latency_ns[rail(rail_name).index()] = parse_time(value)?;
        }
        _ => return Err((item.to_string(), "unknown key")),
    }
    Ok(())
}

/// Splits `12.5GB/s` into (12.5, "GB/s").
fn split_number(text: &str) -> Option<(f64, &str)> {
    let text = text.trim();
    let end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let number = text[..end].parse::<f64>().ok()?;
    number.is_finite().then_some((number, text[end..].trim()))
}

/// Units of a rate, in bytes per second.
const RATE_UNITS: &[(&str, f64)] = &[
    ("B/s", 1.0),
    ("KB/s", 1e3),
    ("MB/s", 1e6),
    ("GB/s", 1e9),
    ("Kbit/s", 1e3 / 8.0),
    ("Mbit/s", 1e6 / 8.0),
    ("Gbit/s", 1e9 / 8.0),
];

/// Units of a time, in nanoseconds.
const TIME_UNITS: &[(&str, f64)] = &[("ns", 1.0), ("us", 1e3), ("ms", 1e6), ("s", 1e9)];

/// A number with one of `units`, scaled and rounded, checked to lie in `range`.
fn parse_scaled(
    text: &str,
    units: &[(&str, f64)],
    range: std::ops::RangeInclusive<f64>,
    (bad_unit, out_of_range): (&'static str, &'static str),
) -> Result<u64, (String, &'static str)> {
    let token = || text.trim().to_string();
    let (number, unit) = split_number(text).ok_or_else(|| (token(), bad_unit))?;
    let (_, scale) = units
        .iter()
        .find(|(name, _)| *name == unit)
        .ok_or_else(|| (token(), bad_unit))?;
    let value = (number * scale).round();
    if !range.contains(&value) {
        return Err((token(), out_of_range));
    }
    Ok(value as u64)
}

/// A rate in bytes per second (`None` for `off`).
fn parse_rate(text: &str) -> Result<Option<u64>, (String, &'static str)> {
    if text.trim() == "off" {
        return Ok(None);
    }
    let why = (
        "RATE is a number with B/s, KB/s, MB/s, GB/s, Kbit/s, Mbit/s or Gbit/s, or `off`",
        "RATE must be between 1 B/s and 1 PB/s",
    );
    parse_scaled(text, RATE_UNITS, 1.0..=1e15, why).map(Some)
}

/// A time in nanoseconds.
fn parse_time(text: &str) -> Result<u64, (String, &'static str)> {
    let why = (
        "TIME is a number with ns, us, ms or s",
        "TIME must be under 1e6 s",
    );
    parse_scaled(text, TIME_UNITS, 0.0..=1e15, why)
}

/// The error for a bad spec: names the variable, the whole value and the offending token.
fn parse_error(spec: &str, token: &str, why: &str) -> FabricError {
    let detail = format!(
        "{RAILS_VAR}=`{spec}`: bad item `{token}` ({why}); expected \
         `[TIME:]KEY=VALUE,...;TIME:KEY=VALUE,...` with KEY sout, sup, loop0 ... loop15, shared, \
         mixed (a rate or `off`), latency, sout.latency, sup.latency (a time), e.g. \
         `sout=2GB/s,sup=4GB/s,latency=5us;2s:sup=0.5GB/s`"
    );
    fabric_error(
        "LoopbackFabric::new",
        "loopback",
        None,
        libc::EINVAL,
        detail,
    )
}
