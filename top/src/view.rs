//! What the operator chose to see: the sort, the filter, pause, help and the values pane, and
//! the frame they make of a sample (the screen, the text frames and the JSON all show it).

use crate::frame::{Connection, Frame, Process};

/// How processes and connections are ordered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SortKey {
    /// Bytes per second, highest first.
    Rate,
    /// Error completions and retransmissions per second (then in total), most first.
    Errors,
    /// Pid, lowest first.
    Pid,
}

impl SortKey {
    /// Its name on the screen.
    pub fn name(self) -> &'static str {
        match self {
            SortKey::Rate => "rate",
            SortKey::Errors => "errors",
            SortKey::Pid => "pid",
        }
    }
}

/// The operator's choices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ViewState {
    /// The order.
    pub sort: SortKey,
    /// Shown are processes and connections matching it (empty: all).
    pub filter: String,
    /// The filter being typed, while it is.
    pub editing: Option<String>,
    /// Sampling paused: the screen keeps the last frame.
    pub paused: bool,
    /// The help is shown.
    pub help: bool,
    /// Every declared value is listed instead of the connections.
    pub values: bool,
    /// Colour on the screen.
    pub color: bool,
}

impl ViewState {
    /// The first state.
    pub fn new(sort: SortKey, filter: String, color: bool) -> ViewState {
        ViewState {
            sort,
            filter,
            editing: None,
            paused: false,
            help: false,
            values: false,
            color,
        }
    }
}

/// A process's bytes per second, all devices.
pub fn process_rate(p: &Process) -> f64 {
    p.devices
        .iter()
        .map(|d| {
            d.sent_bytes_per_second.unwrap_or(0.0) + d.received_bytes_per_second.unwrap_or(0.0)
        })
        .sum()
}

/// A process's errors: per second (error completions and NIC retransmissions), then in total;
/// a NIC two devices share counted once.
pub fn process_errors(p: &Process) -> (f64, u64) {
    let mut seen = Vec::new();
    let mut per_second = 0.0;
    let mut total = 0;
    for r in p.devices.iter().flat_map(|d| d.rails.iter()) {
        if seen.contains(&(&r.nic, r.port)) {
            continue;
        }
        seen.push((&r.nic, r.port));
        per_second += r.error_completions_per_second.unwrap_or(0.0)
            + r.retransmissions_per_second.unwrap_or(0.0);
        total += r.error_completions;
    }
    (per_second, total)
}

fn matches(text: &str, filter: &str) -> bool {
    text.to_lowercase().contains(filter)
}

fn process_matches(p: &Process, filter: &str) -> bool {
    matches(&p.pid.to_string(), filter)
        || matches(&p.user, filter)
        || p.devices.iter().any(|d| matches(&d.name, filter))
}

fn connection_matches(c: &Connection, filter: &str) -> bool {
    matches(&c.peer, filter) || matches(&c.device, filter)
}

/// The frame as `state` shows it: filtered, then sorted.
pub fn apply(frame: &Frame, state: &ViewState) -> Frame {
    let filter = state.filter.to_lowercase();
    let mut out = frame.clone();
    if !filter.is_empty() {
        out.processes.retain_mut(|p| {
            if process_matches(p, &filter) {
                return true;
            }
            p.connections.retain(|c| connection_matches(c, &filter));
            !p.connections.is_empty()
        });
        let shown: Vec<u32> = out.processes.iter().map(|p| p.pid).collect();
        out.slowest.retain(|s| {
            shown.contains(&s.pid)
                && (matches(&s.peer, &filter)
                    || out
                        .processes
                        .iter()
                        .any(|p| p.pid == s.pid && process_matches(p, &filter)))
        });
    }
    match state.sort {
        SortKey::Pid => out.processes.sort_by_key(|p| p.pid),
        SortKey::Rate => out.processes.sort_by(|a, b| {
            process_rate(b)
                .total_cmp(&process_rate(a))
                .then(a.pid.cmp(&b.pid))
        }),
        SortKey::Errors => out.processes.sort_by(|a, b| {
            let (ea, eb) = (process_errors(a), process_errors(b));
            eb.0.total_cmp(&ea.0)
                .then(eb.1.cmp(&ea.1))
                .then(a.pid.cmp(&b.pid))
        }),
    }
    for p in &mut out.processes {
        match state.sort {
            SortKey::Pid => p.connections.sort_by_key(|c| c.index),
            SortKey::Rate | SortKey::Errors => p.connections.sort_by(|a, b| {
                let rate = |c: &Connection| c.bytes_per_second.unwrap_or(0.0);
                rate(b).total_cmp(&rate(a)).then(a.index.cmp(&b.index))
            }),
        }
    }
    out
}
