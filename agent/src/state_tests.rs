//! Tests of the agent's state (state.rs).
use super::*;

/// A configured SUP rate on a NIC two flows share is split like the NIC's own speed;
/// a rate not configured keeps the measured one.
#[test]
fn a_configured_rate_is_shared_like_the_nics_speed() {
    let mut measurement = FlowMeasurement {
        sharers: [1, 2],
        ..FlowMeasurement::default()
    };
    measurement.sample.link_rate = [1e9, 1e9];
    apply_configured_rates(&mut measurement, [0.0, 4e9]);
    assert_eq!(measurement.sample.link_rate, [1e9, 2e9]);
    let mut unknown = FlowMeasurement::default();
    apply_configured_rates(&mut unknown, [3e9, 0.0]);
    assert_eq!(
        unknown.sample.link_rate,
        [3e9, 0.0],
        "no sharers known: the whole rate"
    );
}

/// A state over a fresh hint file in the temp directory.
fn state(name: &str, policies: &Policies) -> State {
    let dir = std::env::temp_dir().join(format!("mpib-agent-state-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (hints, _) = HintFile::open(&dir.join("hints")).unwrap();
    State::new(hints, policies)
}

fn register(conn_id: u32, n: u8) -> AgentRequest {
    AgentRequest::Register {
        conn_id,
        sout_src: [10, 9, 0, n],
        sout_dst: [10, 8, 0, n],
        sup_src: [10, 7, 0, n],
        sup_dst: [10, 6, 0, n],
    }
}

/// Refusals for a flow limit are counted every time but queued for the log at most once per
/// period, as facts (pid, uid, counts) rather than text: naming the user runs `getent`, which
/// the caller does after unlocking ([`LimitRefusal::line`]).
#[test]
fn a_limit_refusal_is_queued_once_per_period_and_written_after_unlocking() {
    let policies = Policies {
        max_flows_per_process: 1,
        ..Policies::default()
    };
    let mut state = state("refusals", &policies);
    let process = Process {
        pid: 42,
        start_ticks: 1,
        uid: 0,
    };
    let status = |response| match response {
        AgentResponse::Register { status, .. } => status,
        AgentResponse::Deregister { status } => status,
    };
    assert_eq!(
        status(state.handle(process, register(1, 1), &policies)),
        AgentStatus::Success
    );
    for n in 2..=20 {
        assert_eq!(
            status(state.handle(process, register(u32::from(n), n), &policies)),
            AgentStatus::NoFreeSlots
        );
    }
    assert_eq!(state.counters.registrations.get("process_limit"), Some(&19));
    let queued = state.take_log();
    assert_eq!(
        queued,
        vec![LimitRefusal {
            refused: Refused::ProcessLimit,
            process,
            flows: 1,
            limit: 1,
            count: 1,
        }],
        "one record, for the first refusal of the period"
    );
    assert!(state.take_log().is_empty());
    let line = queued[0].line();
    assert!(
        line.contains("pid 42 has connections in 1 flow(s), the per-process limit"),
        "{line}"
    );
    let user = LimitRefusal {
        refused: Refused::UserLimit,
        count: 7,
        limit: 192,
        flows: 192,
        ..queued[0]
    };
    let line = user.line();
    assert!(
        line.contains("uid 0 (root) (pid 42) has connections in 192 flow(s)"),
        "{line}"
    );
    assert!(
        line.contains("7 refusal(s)") && line.contains("result=\"user_limit\""),
        "{line}"
    );
}
