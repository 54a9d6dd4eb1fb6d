//! The agent's own Prometheus endpoint: `GET /metrics` in the text exposition format, rendered
//! from the state under the lock, only families of [`crate::catalog`].
//! [`crate::http`] serves it.

use mpib_node::exposition::{Number, Text};

use crate::catalog::{self, MetricSpec};
use crate::config::Policies;
use crate::policy::{SOUT, SUP};
use crate::state::State;

struct Family<'a> {
    out: &'a mut Text,
    spec: &'static MetricSpec,
    host: &'a str,
}

impl<'a> Family<'a> {
    fn start(out: &'a mut Text, spec: &'static MetricSpec, host: &'a str) -> Family<'a> {
        out.family(spec.name, spec.kind, spec.help);
        Family { out, spec, host }
    }

    /// One sample; `values` are the label values after `host`, in the spec's order.
    fn sample(&mut self, values: &[&str], value: f64) {
        debug_assert_eq!(values.len() + 1, self.spec.labels.len());
        let host = std::iter::once(("host", self.host));
        let labels = host.chain(
            self.spec.labels[1..]
                .iter()
                .copied()
                .zip(values.iter().copied()),
        );
        self.out
            .sample(self.spec.name, "", labels, Number::Float(value));
    }
}

/// The exposition text.
pub fn render(state: &State, policies: &Policies, host: &str) -> String {
    let mut out = Text::new();
    let o = &mut out;
    let version = env!("CARGO_PKG_VERSION");
    Family::start(o, &catalog::INFO, host).sample(&[version, policies.default.name()], 1.0);
    Family::start(o, &catalog::SLOTS_USED, host).sample(&[], state.slots.used() as f64);
    Family::start(o, &catalog::SLOTS_TOTAL, host).sample(&[], state.slots.capacity() as f64);
    Family::start(o, &catalog::CONNECTIONS, host).sample(&[], state.slots.connections() as f64);
    let counters = &state.counters;
    let by_result = [
        (&catalog::REGISTRATIONS, &counters.registrations),
        (&catalog::DEREGISTRATIONS, &counters.deregistrations),
        (&catalog::BAD_CLIENTS, &counters.bad_clients),
        (&catalog::RECLAIMED, &counters.reclaimed),
        (&catalog::RELOADS, &counters.reloads),
    ];
    for (spec, map) in by_result {
        let mut family = Family::start(o, spec, host);
        for (key, value) in map.iter() {
            family.sample(&[key], *value as f64);
        }
    }
    let mut decisions = Family::start(o, &catalog::DECISIONS, host);
    for ((policy, reason), value) in &counters.decisions {
        decisions.sample(&[policy, reason], *value as f64);
    }
    Family::start(o, &catalog::EXTERNAL_WRITES, host).sample(&[], counters.external_writes as f64);
    Family::start(o, &catalog::PROBES_FILES, host).sample(&[], state.probes_files as f64);
    render_flows(o, state, host);
    out.finish()
}

/// A per-flow family's value for the flow at an index, if it has one.
type FlowValue<'a> = &'a dyn Fn(usize) -> Option<f64>;

fn render_flows(o: &mut Text, state: &State, host: &str) {
    let flows: Vec<_> = state
        .slots
        .flows()
        .filter_map(|f| state.flows.get(&f.slot).map(|a| (f, a)))
        .collect();
    let ids: Vec<[String; 3]> = flows
        .iter()
        .map(|(f, _)| {
            [
                f.slot.to_string(),
                f.pair.src.to_string(),
                f.pair.dst.to_string(),
            ]
        })
        .collect();
    let label = |i: usize| -> [&str; 3] { [&ids[i][0], &ids[i][1], &ids[i][2]] };
    let per_flow: [(&'static MetricSpec, FlowValue<'_>); 6] = [
        (&catalog::FLOW_SUP_RATIO, &|i| {
            Some(f64::from(flows[i].1.sup_bw) / 1024.0)
        }),
        (&catalog::FLOW_MEASURED_SUP_RATIO, &|i| {
            flows[i]
                .1
                .measured
                .sample
                .measured_share()
                .map(|s| f64::from(s) / 1024.0)
        }),
        (&catalog::FLOW_THROUGHPUT, &|i| {
            Some(flows[i].1.measured.sample.throughput())
        }),
        (&catalog::FLOW_PINNED, &|i| {
            Some(f64::from(u8::from(flows[i].1.pinned.is_some())))
        }),
        (&catalog::FLOW_MEASURED_CONNECTIONS, &|i| {
            Some(flows[i].1.measured.connections as f64)
        }),
        (&catalog::FLOW_TELEMETRY_AGE, &|i| Some(flows[i].1.idle_s)),
    ];
    for (spec, value) in per_flow {
        let mut family = Family::start(o, spec, host);
        for i in 0..flows.len() {
            if let Some(v) = value(i) {
                family.sample(&label(i), v);
            }
        }
    }
    let mut rates = Family::start(o, &catalog::FLOW_RAIL_RATE, host);
    for (i, (_, agent)) in flows.iter().enumerate() {
        for (rail, name) in [(SOUT, "sout"), (SUP, "sup")] {
            if let Some(r) = agent.measured.sample.rate(rail) {
                let [a, b, c] = label(i);
                rates.sample(&[a, b, c, name], r);
            }
        }
    }
}
