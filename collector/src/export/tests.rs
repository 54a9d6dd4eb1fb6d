//! The model's rules: what a scan publishes, how long a writer's last points last, a restart.

use super::*;
use crate::catalog::{declared_family, PROBES_FILES, PROBES_REAPED};
use mpib_probes::{Declared, DECLARATIONS};

fn declared(exporter: &Exporter, name: &str) -> Arc<Family> {
    let d = DECLARATIONS.iter().find(|d| d.name == name).unwrap();
    exporter
        .admit(declared_family(&Declared::from(d)).unwrap())
        .unwrap()
}

fn rail(pid: &str) -> [&str; 5] {
    ["h", pid, "sout", "mlx5_0", "1"]
}

/// The published `(name, pid label, value)` of every counter point.
fn counters(exporter: &Exporter) -> Vec<(String, Option<String>, u64)> {
    let scan = exporter.last_points();
    let mut out = Vec::new();
    for p in &scan.points {
        if let Value::Counter(v) = p.value {
            out.push((p.family.name.clone(), p.label("pid").map(str::to_owned), v));
        }
    }
    out
}

fn tx(pid: &str, value: u64) -> (String, Option<String>, u64) {
    (
        "mpib_rail_tx_bytes_total".to_owned(),
        Some(pid.to_owned()),
        value,
    )
}

#[test]
fn a_scan_publishes_what_it_recorded_and_nothing_else() {
    let exporter = Exporter::new();
    let tx_family = declared(&exporter, "mpib_rail_tx_bytes_total");
    let depth = declared(&exporter, "mpib_srq_depth");
    exporter.counter(&tx_family, &rail("7"), 10, 1);
    exporter.counter(&tx_family, &rail("7"), 12, 1); // set twice: the last value
    exporter.gauge(&depth, &rail("7"), 3.0, 1);
    exporter.gauge(&PROBES_FILES, &["h", "extra"], 1.0, 1); // wrong arity: dropped
    exporter.counter(&PROBES_FILES, &["h"], 1, 1); // wrong kind: dropped
    assert!(
        exporter.last_points().points.is_empty(),
        "nothing before the scan ends"
    );
    exporter.finish_scan(42);
    let scan = exporter.last_points();
    assert_eq!(scan.time_ns, 42);
    assert_eq!(counters(&exporter), [tx("7", 12)]);
    assert_eq!(scan.points.len(), 2);
    assert_eq!(scan.points[0].label("rail"), Some("sout"));
    let text = exporter.render();
    assert!(
        text.contains("# TYPE mpib_rail_tx_bytes_total counter"),
        "{text}"
    );
    assert!(
        text.contains(
            "mpib_rail_tx_bytes_total{host=\"h\",pid=\"7\",rail=\"sout\",device=\"mlx5_0\",port=\"1\"} 12\n"
        ),
        "{text}"
    );
    assert!(!text.contains("mpib_probes_files"), "{text}");
    // The next scan records only the gauge: the counter's series is gone.
    exporter.gauge(&depth, &rail("7"), 4.0, 1);
    exporter.finish_scan(43);
    assert!(counters(&exporter).is_empty());
    assert!(!exporter.render().contains("mpib_rail_tx_bytes_total"));
}

#[test]
fn a_writer_that_went_away_lingers_for_three_scans() {
    let exporter = Exporter::new();
    let tx_family = declared(&exporter, "mpib_rail_tx_bytes_total");
    exporter.counter(&tx_family, &rail("7"), 10, 1);
    exporter.counter(&tx_family, &rail("8"), 5, 2);
    exporter.finish_scan(1000);
    // Scan 2: pid 7's last export, then it went away; pid 8 goes on.
    exporter.counter(&tx_family, &rail("7"), 11, 1);
    exporter.linger("h", 7, 1);
    exporter.counter(&tx_family, &rail("8"), 6, 2);
    exporter.finish_scan(1100);
    assert_eq!(counters(&exporter), [tx("8", 6), tx("7", 11)]);
    for (scan, value) in [(1200, 7), (1300, 8)] {
        exporter.counter(&tx_family, &rail("8"), value, 2);
        exporter.finish_scan(scan);
        assert_eq!(
            counters(&exporter),
            [tx("8", value), tx("7", 11)],
            "scan {scan}"
        );
    }
    // The fourth scan since its last export: gone, whatever the clock says.
    exporter.counter(&tx_family, &rail("8"), 9, 2);
    exporter.finish_scan(0);
    assert_eq!(counters(&exporter), [tx("8", 9)]);
}

#[test]
fn a_series_recorded_twice_keeps_its_last_value() {
    let exporter = Exporter::new();
    let tx_family = declared(&exporter, "mpib_rail_tx_bytes_total");
    exporter.counter(&tx_family, &rail("7"), 1, 1);
    exporter.counter(&tx_family, &rail("8"), 2, 1);
    exporter.counter(&tx_family, &rail("7"), 3, 1);
    exporter.finish_scan(1);
    assert_eq!(counters(&exporter), [tx("8", 2), tx("7", 3)]);
}

#[test]
fn a_restarted_writer_replaces_the_old_series_at_once() {
    let exporter = Exporter::new();
    let tx_family = declared(&exporter, "mpib_rail_tx_bytes_total");
    let depth = declared(&exporter, "mpib_srq_depth");
    exporter.counter(&tx_family, &rail("7"), 1000, 1);
    exporter.gauge(&depth, &rail("7"), 9.0, 1);
    exporter.finish_scan(10);
    // The same pid starts again: the old file superseded (last export), the new one exported.
    exporter.counter(&tx_family, &rail("7"), 1000, 1);
    exporter.gauge(&depth, &rail("7"), 9.0, 1);
    exporter.linger("h", 7, 1);
    exporter.counter(&tx_family, &rail("7"), 10, 2);
    exporter.finish_scan(20);
    assert_eq!(counters(&exporter), [tx("7", 10)]);
    let scan = exporter.last_points();
    assert!(scan.points.iter().all(|p| p.start_ns == 2), "{scan:?}");
    // The old writer's last points do not come back later either.
    exporter.finish_scan(30);
    assert!(exporter.last_points().points.is_empty());
}

#[test]
fn a_declared_name_cannot_take_another_familys() {
    let exporter = Exporter::new();
    // Same kind, unit and labels as the collector's own: still refused.
    let own = Family::of_spec(&PROBES_REAPED);
    let e = exporter.admit(own).unwrap_err();
    assert!(e.contains("one of the collector's own families"), "{e}");
    let first = Family {
        name: "mpib_other".to_owned(),
        ..Family::of_spec(&PROBES_FILES)
    };
    exporter.admit(first.clone()).unwrap();
    let other_kind = Family {
        kind: Kind::Counter,
        ..first
    };
    let e = exporter.admit(other_kind).unwrap_err();
    assert!(e.contains("already exported as a gauge"), "{e}");
    let sample = Family {
        name: "mpib_transfer_latency_seconds_sum".to_owned(),
        ..Family::of_spec(&PROBES_FILES)
    };
    assert!(exporter.admit(sample).unwrap_err().contains("histogram"));
    let new = Family {
        name: "mpib_new".to_owned(),
        ..Family::of_spec(&PROBES_FILES)
    };
    let first = exporter.admit(new.clone()).unwrap();
    assert!(Arc::ptr_eq(&first, &exporter.admit(new).unwrap()));
}
