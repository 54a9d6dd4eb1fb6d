//! The human view `mpib-agent status` prints: the agent, then one line per flow with its policy,
//! the share asked and the share its bytes took, and the measured rates.

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
        "{:>4}  {:<31}  {:<9}  {:>6}  {:>8}  {:>11}  {:>11}  {:>11}  {:>5}",
        "FLOW",
        "SOUT PAIR",
        "POLICY",
        "SUP_BW",
        "MEASURED",
        "SOUT RATE",
        "SUP RATE",
        "THROUGHPUT",
        "CONNS"
    );
    for flow in state.slots.flows() {
        let Some(agent) = state.flows.get(&flow.slot) else {
            continue;
        };
        let sample = &agent.measured.sample;
        let policy = match agent.pinned {
            Some(_) => "pinned",
            None => agent.policy.kind().name(),
        };
        let measured = sample
            .measured_share()
            .map_or("-".to_string(), |s| s.to_string());
        let throughput = sample.fresh().then(|| sample.throughput());
        let _ = writeln!(
            out,
            "{:>4}  {:<31}  {:<9}  {:>6}  {:>8}  {:>11}  {:>11}  {:>11}  {:>5}{}",
            flow.slot,
            flow.pair.to_string(),
            policy,
            agent.sup_bw,
            measured,
            rate(sample.rate(SOUT)),
            rate(sample.rate(SUP)),
            rate(throughput),
            flow.connections.len(),
            if flow.recovered {
                "  (from before a restart)"
            } else {
                ""
            }
        );
    }
    out
}
