//! Tests of `params`: every variable parsed, defaulted and refused as the table says.

use super::*;
use std::collections::HashMap;

fn settings(pairs: &[(&str, &str)]) -> Result<Settings, ParamError> {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Settings::from_lookup(|name| map.get(name).cloned())
}

#[test]
fn defaults_match_the_table() {
    let s = settings(&[("MPIB_FABRIC", "loopback")]).unwrap();
    assert_eq!((s.sout_qps, s.sup_qps, s.cts_signal_interval), (2, 4, 128));
    assert_eq!((s.mode, s.island_prefix_len), (Mode::Vanilla, 24));
    assert_eq!(
        (s.hca_sout.as_str(), s.hca_sup.as_str()),
        ("loop0", "loop1")
    );
    for param in PARAMS {
        let text = match param.name {
            "MPIB_SOUT_QP" => s.sout_qps.to_string(),
            "MPIB_SUP_QP" => s.sup_qps.to_string(),
            "MPIB_CTS_SIGNAL_INTERVAL" => s.cts_signal_interval.to_string(),
            "MPIB_ISLAND_PREFIX_LEN" => s.island_prefix_len.to_string(),
            "MPIB_HINT_PATH" => s.hint_path.clone(),
            "MPIB_AGENT_SOCKET" => s.agent_socket.clone(),
            "MPIB_IB_TIMEOUT" => s.ib_timeout.to_string(),
            "MPIB_IB_RETRY_CNT" => s.ib_retry_count.to_string(),
            "MPIB_ADDR_RESOLVE_TIMEOUT_MS" => s.addr_resolve_timeout_ms.to_string(),
            "MPIB_IB_SL" => s.ib_service_level.to_string(),
            "MPIB_IB_PCI_RELAXED_ORDERING" => s.relaxed_ordering.to_string(),
            "MPIB_FORCE_FLUSH" => u8::from(s.force_flush).to_string(),
            "MPIB_PROBES" => u8::from(s.probes).to_string(),
            "MPIB_PROBES_DIR" => s.probes_dir.clone(),
            "MPIB_SLOW_US" => s.slow_us.to_string(),
            "MPIB_PROBES_SAMPLE" => s.probes_sample.to_string(),
            "MPIB_BDP_BYTES" => s.bdp_bytes.to_string(),
            "MPIB_SRQ_LOW_WATER" => s.srq_low_water.to_string(),
            "MPIB_SRQ_HIGH_WATER" => s.srq_high_water.to_string(),
            "MPIB_FAILOVER" => u8::from(s.failover).to_string(),
            "MPIB_FAILOVER_WATCHDOG_MS" => (s.watchdog_ns / 1_000_000).to_string(),
            "MPIB_FAILBACK" => u8::from(s.failback.is_some()).to_string(),
            "MPIB_FAILBACK_HOLD_MS" => failback_ms(&s, |f| f.hold_ns),
            "MPIB_FAILBACK_BACKOFF_MAX_MS" => failback_ms(&s, |f| f.backoff_max_ns),
            "MPIB_FAILBACK_ATTEMPT_MS" => failback_ms(&s, |f| f.attempt_ns),
            _ => continue,
        };
        assert_eq!(text, param.default, "{}", param.name);
    }
}

#[test]
fn an_agent_tag_moves_the_default_paths_only() {
    let s = settings(&[("MPIB_AGENT_TAG", "job-42.a")]).unwrap();
    assert_eq!(s.hint_path, "/tmp/mpib/job-42.a/hints");
    assert_eq!(s.agent_socket, "/tmp/mpib/job-42.a/agent.sock");
    let s = settings(&[("MPIB_AGENT_TAG", "t"), ("MPIB_HINT_PATH", "/run/h")]).unwrap();
    assert_eq!(
        (s.hint_path.as_str(), s.agent_socket.as_str()),
        ("/run/h", "/tmp/mpib/t/agent.sock")
    );
    for bad in ["..", ".", "a/b", "x y", &"t".repeat(65)] {
        let e = settings(&[("MPIB_AGENT_TAG", bad)]).unwrap_err();
        assert_eq!(e.name, "MPIB_AGENT_TAG", "{bad}");
        assert!(e.to_string().contains("one path component"), "{e}");
    }
}

#[test]
fn verbs_has_no_default_devices() {
    let s = settings(&[]).unwrap();
    assert_eq!(s.fabric, FabricKind::Verbs);
    assert!(s.hca_sout.is_empty() && s.hca_sup.is_empty());
}

#[test]
fn bad_values_name_the_variable() {
    let e = settings(&[("MPIB_SUP_QP", "0")]).unwrap_err();
    assert_eq!(e.name, "MPIB_SUP_QP");
    assert!(e.to_string().contains("MPIB_SUP_QP=\"0\""), "{e}");
    assert_eq!(
        settings(&[("MPIB_MODE", "2")]).unwrap_err().name,
        "MPIB_MODE"
    );
    assert_eq!(
        settings(&[("MPIB_FABRIC", "infiniband")]).unwrap_err().name,
        "MPIB_FABRIC"
    );
    let e = settings(&[("MPIB_CTS_SIGNAL_INTERVAL", "100")]).unwrap_err();
    assert_eq!(e.name, "MPIB_CTS_SIGNAL_INTERVAL");
    assert_eq!(
        settings(&[("MPIB_OOB_ADDR", "10.0.0")]).unwrap_err().name,
        "MPIB_OOB_ADDR"
    );
}

#[test]
fn users_and_groups_are_resolved_at_init() {
    let s = settings(&[
        ("MPIB_TRUSTED_UIDS", "root, 1234"),
        ("MPIB_PROBES_GROUP", "0"),
    ])
    .unwrap();
    assert_eq!((s.trusted_uids, s.probes_group), (vec![0, 1234], Some(0)));
    let s = settings(&[]).unwrap();
    assert_eq!((s.trusted_uids, s.probes_group), (vec![], None));
    let e = settings(&[("MPIB_PROBES_GROUP", "no-such-group-mpib")]).unwrap_err();
    assert_eq!(e.name, "MPIB_PROBES_GROUP");
    assert!(
        e.to_string()
            .contains("no group named \"no-such-group-mpib\""),
        "{e}"
    );
    let e = settings(&[("MPIB_TRUSTED_UIDS", "1,nobody-mpib")]).unwrap_err();
    assert_eq!(e.name, "MPIB_TRUSTED_UIDS");
}

#[test]
fn srq_water_marks_are_checked_against_each_other() {
    let marks = |vars: &[(&str, &str)]| settings(vars).map(|s| (s.srq_low_water, s.srq_high_water));
    assert_eq!(marks(&[]).unwrap(), (8, 512));
    assert_eq!(marks(&[("MPIB_SRQ_HIGH_WATER", "16")]).unwrap(), (8, 16));
    assert_eq!(marks(&[("MPIB_SRQ_HIGH_WATER", "4")]).unwrap(), (4, 4));
    let e = marks(&[("MPIB_SRQ_LOW_WATER", "8"), ("MPIB_SRQ_HIGH_WATER", "4")]).unwrap_err();
    assert_eq!(e.name, "MPIB_SRQ_LOW_WATER");
    assert!(e.to_string().contains("MPIB_SRQ_HIGH_WATER (4)"), "{e}");
    let e = marks(&[("MPIB_SRQ_HIGH_WATER", "0")]).unwrap_err();
    assert_eq!(e.name, "MPIB_SRQ_HIGH_WATER");
}

fn failback_ms(
    s: &Settings,
    field: impl Fn(&mpib_proto::failback::FailbackSettings) -> u64,
) -> String {
    s.failback
        .as_ref()
        .map_or(0, |f| field(f) / 1_000_000)
        .to_string()
}

#[test]
fn failback_is_on_unless_off_and_its_hold_down_fits_its_longest_wait() {
    assert!(settings(&[("MPIB_FAILBACK", "0")])
        .unwrap()
        .failback
        .is_none());
    let s = settings(&[
        ("MPIB_FAILBACK_HOLD_MS", "50"),
        ("MPIB_FAILBACK_ATTEMPT_MS", "70"),
    ])
    .unwrap();
    let failback = s.failback.unwrap();
    assert_eq!(
        (failback.hold_ns, failback.attempt_ns),
        (50_000_000, 70_000_000)
    );
    let e = settings(&[
        ("MPIB_FAILBACK_HOLD_MS", "9000"),
        ("MPIB_FAILBACK_BACKOFF_MAX_MS", "8000"),
    ])
    .unwrap_err();
    assert_eq!(e.name, "MPIB_FAILBACK_HOLD_MS");
    assert!(
        e.to_string()
            .contains("MPIB_FAILBACK_BACKOFF_MAX_MS (8000)"),
        "{e}"
    );
    let e = settings(&[("MPIB_FAILBACK", "2")]).unwrap_err();
    assert_eq!(e.name, "MPIB_FAILBACK");
}
