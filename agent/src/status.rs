//! The human view `mpib-agent status` prints: the agent, then one line per flow with its policy,
//! the share asked and the share its bytes took, and the measured rates; and the same lines
//! tab-separated for programs (`flows`).

use std::fmt::Write;

use crate::config::Policies;
use crate::policy::{SOUT, SUP};
use crate::state::State;

fn rate(bytes_per_second: Option<f64>) -> String {
    match bytes_per_second {
        Some(r) if r >= 1e9 => format!("{:.2} GB/s", r / 1e9),
        Some(r) => format!("{:.1} MB/s", r / 1e6),
        None => "-".into(),
    }
}

/// The status text.
pub fn render(state: &State, policies: &Policies, describe: &str) -> String {
    let mut out = String::new();
    let up = state.started.elapsed().as_secs();
    let _ = writeln!(
        out,
        "mpib-agent {} pid {} up {}h{:02}m{:02}s, default policy {}, interval {} ms",
        env!("CARGO_PKG_VERSION"),
        std::process::id(),
        up / 3600,
        up / 60 % 60,
        up % 60,
        policies.default.name(),
        policies.interval_ms
    );
    let _ = writeln!(out, "{describe}");
    let _ = writeln!(
        out,
        "slots {}/{} used, {} connections, {} probes files",
        state.slots.used(),
        state.slots.capacity(),
        state.slots.connections(),
        state.probes_files
    );
    let _ = writeln!(
        out,
        "{:>4}  {:<31}  {:<9}  {:>6}  {:>8}  {:>11}  {:>11}  {:>11}  {:>5}  {:>5}",
        "FLOW",
        "SOUT PAIR",
        "POLICY",
        "SUP_BW",
        "MEASURED",
        "SOUT RATE",
        "SUP RATE",
        "THROUGHPUT",
        "CONNS",
        "SEEN"
    );
    for line in lines(state) {
        let _ = writeln!(
            out,
            "{:>4}  {:<31}  {:<9}  {:>6}  {:>8}  {:>11}  {:>11}  {:>11}  {:>5}  {:>5}{}",
            line.slot,
            line.pair,
            line.policy,
            line.sup_bw,
            line.measured.map_or("-".to_string(), |s| s.to_string()),
            rate(line.rates[SOUT]),
            rate(line.rates[SUP]),
            rate(line.throughput),
            line.connections,
            line.measured_connections,
            if line.recovered {
                "  (from before a restart)"
            } else {
                ""
            }
        );
        if !line.failed_over.is_empty() {
            let _ = writeln!(
                out,
                "      degraded: {} (connections running on the other rail alone)",
                line.failed_over
            );
        }
    }
    out
}

/// One flow as both views show it.
struct Line {
    slot: u32,
    pair: String,
    policy: &'static str,
    sup_bw: u32,
    measured: Option<u32>,
    rates: [Option<f64>; 2],
    throughput: Option<f64>,
    connections: usize,
    /// Send connections the last measurement read in the probes files.
    measured_connections: usize,
    recovered: bool,
    /// "sup failed over on 2 connection(s)", empty while no connection of the flow has.
    failed_over: String,
    /// The same for programs: `sup`, `sout,sup` or `-`.
    failed_over_rails: String,
}

fn lines(state: &State) -> Vec<Line> {
    let mut out = Vec::new();
    for flow in state.slots.flows() {
        let Some(agent) = state.flows.get(&flow.slot) else {
            continue;
        };
        let sample = &agent.measured.sample;
        out.push(Line {
            slot: flow.slot,
            pair: flow.pair.to_string(),
            policy: match agent.pinned {
                Some(_) => "pinned",
                None => agent.policy.kind().name(),
            },
            sup_bw: agent.sup_bw,
            measured: sample.measured_share(),
            rates: [sample.rate(SOUT), sample.rate(SUP)],
            throughput: sample.fresh().then(|| sample.throughput()),
            connections: flow.connections.len(),
            measured_connections: agent.measured.connections,
            recovered: flow.recovered,
            failed_over: failed_over(&agent.measured.failed_over),
            failed_over_rails: failed_over_rails(&agent.measured.failed_over),
        });
    }
    out
}

/// The rails a flow's connections failed over from, as the views say it ("" when none).
fn failed_over(counts: &[usize; 2]) -> String {
    let names = ["sout", "sup"];
    let parts: Vec<String> = [SOUT, SUP]
        .into_iter()
        .filter(|rail| counts[*rail] > 0)
        .map(|rail| {
            format!(
                "{} failed over on {} connection(s)",
                names[rail], counts[rail]
            )
        })
        .collect();
    parts.join(", ")
}

/// The rails a flow's connections failed over from, for programs: `sout`, `sup`, `sout,sup`, or
/// `-` when none.
fn failed_over_rails(counts: &[usize; 2]) -> String {
    let names = ["sout", "sup"];
    let rails: Vec<&str> = [SOUT, SUP]
        .into_iter()
        .filter(|rail| counts[*rail] > 0)
        .map(|rail| names[rail])
        .collect();
    if rails.is_empty() {
        "-".to_string()
    } else {
        rails.join(",")
    }
}

/// The columns every agent since `flows` exists sends first.
pub use mpib_node::agent_status::{FLOWS_HEADER, FLOWS_HEADER_FIRST};

/// The `flows` reply, for programs (`mpib-top`): [`FLOWS_HEADER`], then one tab-separated line
/// per flow; `-` where nothing was measured, rates in bytes per second, `recovered` 1 for a flow
/// restored from before a restart, `measured_connections` the send connections the last
/// measurement read, `failed_over_rails` the rails its open send connections failed over from
/// (`-`: none).
pub fn flows(state: &State) -> String {
    let mut out = format!("{FLOWS_HEADER}\n");
    let number = |v: Option<f64>| v.map_or("-".to_string(), |r| format!("{r:.0}"));
    for line in lines(state) {
        let _ = writeln!(
            out,
            "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
            line.slot,
            line.pair,
            line.policy,
            line.sup_bw,
            line.measured.map_or("-".to_string(), |s| s.to_string()),
            number(line.rates[SOUT]),
            number(line.rates[SUP]),
            number(line.throughput),
            line.connections,
            u8::from(line.recovered),
            line.measured_connections,
            line.failed_over_rails
        );
    }
    out
}
