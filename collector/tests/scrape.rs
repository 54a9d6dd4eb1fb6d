//! A scrape of the collector checked against a known fixture and against the catalog; NIC
//! counters from a fake sysfs tree; the hint ratio from a fake hint file; the command line.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::float_cmp)]

mod common;

use std::collections::BTreeSet;
use std::fs;
use std::time::Duration;

use common::*;
use mpib_collector::catalog::{families, Family, Kind};
use mpib_probes::{Merge, ProbesFile, ProcessCounter, ValueUnit, DECLARATIONS};

/// Families the fixture does not feed: no hint file and no sysfs in the isolated run.
const UNFED: [&str; 2] = ["mpib_connection_hint_sup_ratio", "mpib_nic_counter_total"];

/// The catalog plus the families the fixture file declares beyond this version's (a
/// histogram's sample names resolve to the histogram).
fn family_of(name: &str) -> Option<Family> {
    known_family(name).or_else(|| mpib_collector::catalog::family_of(name))
}

fn check_against_catalog(scrape: &Scrape) {
    for (family, kind) in &scrape.types {
        let spec =
            family_of(family).unwrap_or_else(|| panic!("family {family} is not in the catalog"));
        assert_eq!(kind, spec.kind.as_str(), "{family}");
    }
    for sample in &scrape.samples {
        let spec = family_of(&sample.name)
            .unwrap_or_else(|| panic!("sample {} is not in the catalog", sample.name));
        let mut want: BTreeSet<&str> = spec.labels.iter().copied().collect();
        if sample.name.ends_with("_bucket") && spec.kind == Kind::Histogram {
            want.insert("le");
        }
        let got: BTreeSet<&str> = sample.labels.keys().map(String::as_str).collect();
        assert_eq!(got, want, "labels of {sample:?}");
    }
    for spec in families() {
        if !UNFED.contains(&spec.name.as_str()) {
            assert!(
                scrape.has_family(&spec.name),
                "{} missing from\n{}",
                spec.name,
                scrape.text
            );
        }
    }
}

fn check_fixture_values(scrape: &Scrape) {
    let pid = std::process::id().to_string();
    let p = [("host", HOST), ("pid", pid.as_str())];
    let sout = [
        p[0],
        p[1],
        ("rail", "sout"),
        ("device", "mlx5_0"),
        ("port", "1"),
    ];
    let sup = [
        p[0],
        p[1],
        ("rail", "sup"),
        ("device", "mlx5_1"),
        ("port", "2"),
    ];
    let expect = [
        ("mpib_rail_tx_bytes_total", 1e6),
        ("mpib_rail_rx_bytes_total", 5e5),
        ("mpib_rail_work_requests_total", 40.0),
        ("mpib_rail_send_completions_total", 3.0),
        ("mpib_rail_recv_completions_total", 2.0),
        ("mpib_rail_error_completions_total", 1.0),
        ("mpib_srq_depth", 100.0),
        ("mpib_srq_low_water", 32.0),
        ("mpib_srq_high_water", 256.0),
        ("mpib_srq_refills_total", 1.0),
        ("mpib_srq_low_water_hits_total", 1.0),
        ("mpib_mask_mismatches_total", 1.0),
        ("mpib_protocol_errors_total", 1.0),
        ("mpib_cts_posted_total", 5.0),
        ("mpib_cts_signaled_total", 1.0),
    ];
    for (name, value) in expect {
        assert_eq!(scrape.value(name, &sout), value, "{name}");
    }
    assert_eq!(scrape.value("mpib_rail_tx_bytes_total", &sup), 250_000.0);
    assert_eq!(scrape.value("mpib_srq_depth", &sup), 7.0);
    assert_eq!(scrape.value("mpib_rail_rx_bytes_total", &sup), 0.0);
    // Values the fixture's file declares and this collector was not built with.
    assert_eq!(scrape.value("mpib_fixture_widgets_total", &sup), 7.0);
    assert_eq!(scrape.value("mpib_fixture_widgets_total", &sout), 0.0);
    assert_eq!(scrape.value("mpib_fixture_process_bytes_total", &p), 4096.0);
    assert!(
        scrape.text.contains(&format!(
            "# HELP mpib_fixture_widgets_total {}",
            WIDGETS_DECLARATION.help
        )),
        "{}",
        scrape.text
    );
    check_histogram(scrape, &sout, 3.0, 3_003_000e-9);
    check_histogram(scrape, &sup, 1.0, 100e-9);
    check_process_values(scrape);
    // The send connection's last transfer served a ring all-reduce (setNetAttr); the receive
    // connection's operation was never said, so it is not counted.
    let operation = [
        p[0],
        p[1],
        ("direction", "send"),
        ("function", "AllReduce"),
        ("algorithm", "Ring"),
        ("protocol", "Simple"),
    ];
    assert_eq!(
        scrape.value("mpib_connections_by_operation", &operation),
        1.0
    );
    assert_eq!(
        scrape.matching("mpib_connections_by_operation", &[]).len(),
        1
    );
    // The receive connection failed SUP over; nothing failed SOUT over (a series at 0).
    let degraded = [p[0], p[1], ("rail", "sup")];
    assert_eq!(scrape.value("mpib_degraded_connections", &degraded), 1.0);
    let sout = [p[0], p[1], ("rail", "sout")];
    assert_eq!(scrape.value("mpib_degraded_connections", &sout), 0.0);
    assert_eq!(scrape.value("mpib_degraded_seconds", &sout), 0.0);
    assert!(scrape.value("mpib_degraded_seconds", &degraded) >= 0.0);
}

fn check_process_values(scrape: &Scrape) {
    let pid = std::process::id().to_string();
    let p = [("host", HOST), ("pid", pid.as_str())];
    for (mask, n) in [("sout", 3.0), ("sup", 1.0), ("both", 2.0)] {
        assert_eq!(
            scrape.value("mpib_transfers_total", &[p[0], p[1], ("mask", mask)]),
            n
        );
    }
    let a = [
        ("peer", "10.0.0.2:5000"),
        ("direction", "send"),
        ("path_class", "inter"),
        ("mode", "vanilla"),
    ];
    let b = [
        ("peer", "10.0.0.3:6000"),
        ("direction", "recv"),
        ("path_class", "intra"),
        ("mode", "advanced"),
    ];
    let bytes = |labels: &[(&str, &str)], rail| {
        let mut l = labels.to_vec();
        l.push(("rail", rail));
        scrape.value("mpib_connection_bytes_total", &l)
    };
    assert_eq!((bytes(&a, "sout"), bytes(&a, "sup")), (700.0, 300.0));
    assert_eq!((bytes(&b, "sout"), bytes(&b, "sup")), (100.0, 900.0));
    let mut info = a.to_vec();
    info.push(("hint_slot", "0"));
    assert_eq!(scrape.value("mpib_connection_info", &info), 1.0);
    let mut info = b.to_vec();
    info.push(("hint_slot", "5"));
    assert_eq!(scrape.value("mpib_connection_info", &info), 1.0);
    assert_eq!(scrape.value("mpib_slow_transfers_total", &p), 1.0);
    assert_eq!(scrape.value("mpib_events_dropped_total", &p), 0.0);
    let age = scrape.value("mpib_writer_heartbeat_age_seconds", &p);
    assert!((0.0..60.0).contains(&age), "{age}");
    assert_eq!(scrape.value("mpib_probes_files", &[]), 1.0);
    for reason in ["version", "corrupt", "truncated"] {
        assert_eq!(
            scrape.value("mpib_probes_skipped_total", &[("reason", reason)]),
            0.0
        );
    }
    assert_eq!(scrape.value("mpib_probes_reaped_total", &[]), 0.0);
}

fn check_histogram(scrape: &Scrape, labels: &[(&str, &str)], count: f64, sum: f64) {
    let name = "mpib_transfer_latency_seconds";
    let buckets = scrape.matching(&format!("{name}_bucket"), labels);
    assert_eq!(buckets.len(), 64, "63 finite buckets and +Inf");
    let mut bounds: Vec<(f64, f64)> = buckets
        .iter()
        .map(|s| {
            let le = s.labels["le"].as_str();
            (
                if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().unwrap()
                },
                s.value,
            )
        })
        .collect();
    bounds.sort_by(|x, y| x.0.total_cmp(&y.0));
    assert!(
        bounds.windows(2).all(|w| w[0].1 <= w[1].1),
        "not cumulative: {bounds:?}"
    );
    assert_eq!(bounds.last().unwrap().1, count);
    assert_eq!(scrape.value(&format!("{name}_count"), labels), count);
    assert!((scrape.value(&format!("{name}_sum"), labels) - sum).abs() < 1e-12);
    if count == 3.0 {
        // 1500 ns twice: below 2047 ns (bucket 11), above 1023 ns.
        let at = |le: f64| bounds.iter().find(|b| (b.0 - le).abs() < 1e-15).unwrap().1;
        assert_eq!(at(1023e-9), 0.0);
        assert_eq!(at(2047e-9), 2.0);
        assert_eq!(at(4_194_303e-9), 3.0);
    }
}

#[test]
fn scrape_matches_fixture_and_catalog() {
    let dir = TempDir::new("scrape");
    let probes = fixture_file(dir.path(), &live_writer());
    fill_fixture(&probes);
    let mut args = isolated(&dir);
    args.extend(["--interval-ms".into(), "100".into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let running = Running::start(dir.path(), &args);
    let scrape = running.scrape_until(Duration::from_secs(20), |s| {
        s.get("mpib_slow_transfers_total", &[]).is_some()
    });
    check_against_catalog(&scrape);
    check_fixture_values(&scrape);
    assert_eq!(
        running.log_lines("slow transfer"),
        1,
        "one INFO line per slow transfer"
    );
    assert!(running.terminate().success(), "SIGTERM is a clean exit");
}

#[test]
fn once_prints_the_exposition() {
    let dir = TempDir::new("once");
    let probes = fixture_file(dir.path(), &live_writer());
    fill_fixture(&probes);
    let (scrape, stderr) = scrape_isolated(&dir, &[]);
    check_against_catalog(&scrape);
    check_fixture_values(&scrape);
    assert!(stderr.contains("slow transfer"), "{stderr}");
}

#[test]
fn a_declaration_that_takes_anothers_name_is_refused_alone() {
    let dir = TempDir::new("clash");
    // Same kind, unit and labels as the collector's own process counter: two values would
    // feed one series, so it is refused all the same.
    let clash = ProcessCounter::at(12).declare(
        ValueUnit::Count,
        Merge::Sum,
        "mpib_slow_transfers_total",
        "A process value under the collector's own name.",
    );
    let mut declarations = DECLARATIONS.to_vec();
    declarations.extend([WIDGETS_DECLARATION, clash]);
    let probes = ProbesFile::create_declaring(dir.path(), &live_writer(), &declarations).unwrap();
    probes.rail(0).add(WIDGETS, 3);
    probes.add(ProcessCounter::at(12), 99);
    let (scrape, stderr) = scrape_isolated(&dir, &[]);
    assert_eq!(
        scrape.value("mpib_probes_declarations_refused_total", &[]),
        1.0
    );
    assert_eq!(scrape.value("mpib_slow_transfers_total", &[]), 0.0);
    assert_eq!(scrape.matching("mpib_slow_transfers_total", &[]).len(), 1);
    let sout = [("rail", "sout")];
    assert_eq!(scrape.value("mpib_fixture_widgets_total", &sout), 3.0);
    assert!(
        stderr.contains(
            "not exporting a declaration: \"mpib_slow_transfers_total\" is one of the collector's own"
        ),
        "{stderr}"
    );
}

#[test]
fn nic_counters_from_a_fake_sysfs_tree() {
    let dir = TempDir::new("sysfs");
    let probes = fixture_file(dir.path(), &live_writer());
    fill_fixture(&probes);
    let sys = dir.join("sys");
    let port1 = sys.join("class/infiniband/mlx5_0/ports/1");
    fs::create_dir_all(port1.join("counters")).unwrap();
    fs::create_dir_all(port1.join("hw_counters")).unwrap();
    fs::write(port1.join("counters/port_xmit_data"), "1000\n").unwrap();
    fs::write(port1.join("counters/port_rcv_data"), "10\n").unwrap();
    fs::write(port1.join("counters/symbol_error"), "3\n").unwrap();
    fs::write(port1.join("hw_counters/out_of_buffer"), "5\n").unwrap();
    let other = sys.join("class/infiniband/mlx5_1/ports/2/hw_counters");
    fs::create_dir_all(&other).unwrap();
    fs::write(other.join("rnr_nak_retry_err"), "9\n").unwrap();
    let unused = sys.join("class/infiniband/mlx5_9/ports/1/counters");
    fs::create_dir_all(&unused).unwrap();
    fs::write(unused.join("symbol_error"), "1\n").unwrap();
    let sys = sys.display().to_string();
    let hints = dir.join("none").display().to_string();
    let out = run_once(dir.path(), &["--sysfs", &sys, "--hint-path", &hints]);
    assert!(out.status.success());
    let scrape = Scrape::parse(&String::from_utf8(out.stdout).unwrap());
    let nic = |dev, port, counter| {
        scrape.get(
            "mpib_nic_counter_total",
            &[("device", dev), ("port", port), ("counter", counter)],
        )
    };
    assert_eq!(nic("mlx5_0", "1", "port_xmit_data_bytes"), Some(4000.0));
    assert_eq!(nic("mlx5_0", "1", "port_rcv_data_bytes"), Some(40.0));
    assert_eq!(nic("mlx5_0", "1", "symbol_error"), Some(3.0));
    assert_eq!(nic("mlx5_0", "1", "out_of_buffer"), Some(5.0));
    assert_eq!(nic("mlx5_1", "2", "rnr_nak_retry_err"), Some(9.0));
    assert_eq!(nic("mlx5_0", "1", "port_xmit_data"), None);
    assert!(scrape
        .matching("mpib_nic_counter_total", &[("device", "mlx5_9")])
        .is_empty());
    assert_eq!(scrape.matching("mpib_nic_counter_total", &[]).len(), 5);
    assert_eq!(scrape.types["mpib_nic_counter_total"], "counter");
}

#[test]
fn hint_ratio_from_a_fake_hint_file() {
    let dir = TempDir::new("hint");
    let probes = fixture_file(dir.path(), &live_writer());
    fill_fixture(&probes);
    let hint_path = dir.join("hints");
    // slot 5 (the advanced connection) = 768/1024; slot 0 (vanilla) must not be exported.
    fs::write(
        &hint_path,
        mpib_collector::hint::encode(&[(5, 768, 4), (0, 512, 2)]),
    )
    .unwrap();
    let hints = hint_path.display().to_string();
    let sys = dir.join("none").display().to_string();
    let out = run_once(dir.path(), &["--hint-path", &hints, "--sysfs", &sys]);
    assert!(out.status.success());
    let scrape = Scrape::parse(&String::from_utf8(out.stdout).unwrap());
    let ratios = scrape.matching("mpib_connection_hint_sup_ratio", &[]);
    assert_eq!(ratios.len(), 1, "advanced connections only: {ratios:?}");
    let labels = &ratios[0].labels;
    assert_eq!(ratios[0].value, 0.75);
    assert_eq!(labels["peer"], "10.0.0.3:6000");
    assert_eq!(labels["mode"], "advanced");
    assert!(!labels.contains_key("hint_slot"));
    // A hint above 1024 is clamped to 1.
    fs::write(&hint_path, mpib_collector::hint::encode(&[(5, 4096, 6)])).unwrap();
    let out = run_once(dir.path(), &["--hint-path", &hints, "--sysfs", &sys]);
    let scrape = Scrape::parse(&String::from_utf8(out.stdout).unwrap());
    assert_eq!(scrape.value("mpib_connection_hint_sup_ratio", &[]), 1.0);
}

#[test]
fn help_and_bad_flags() {
    let exe = env!("CARGO_BIN_EXE_mpib-collector");
    let out = std::process::Command::new(exe)
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    for needle in [
        "--probes-dir",
        "MPIB_PROBES_DIR",
        "--interval-ms",
        "--stale-after",
        "--listen",
        "--otlp-endpoint",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "--hint-path",
        "MPIB_HINT_PATH",
        "--sysfs",
        "--once",
    ] {
        assert!(help.contains(needle), "--help lacks {needle}");
    }
    for bad in [&["--bogus"][..], &["--interval-ms", "soon"], &["--listen"]] {
        let out = std::process::Command::new(exe).args(bad).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert!(
            stderr.contains("error:") && stderr.contains("--help"),
            "{stderr}"
        );
    }
}

/// Two fused devices sharing their SUP NIC: one series per NIC (the shared one counted once,
/// labelled with its rail), connection series told apart by `nccl_device`.
#[test]
fn devices_label_connections_and_a_shared_nic_is_one_series() {
    use mpib_probes::declared::RAIL_TX_BYTES;
    use mpib_probes::{DeviceEntry, Direction, Mode, PathClass, RailInfo};
    let dir = TempDir::new("devices");
    let nic = |device: &str| RailInfo {
        device: device.into(),
        port: 1,
        speed_mbps: 100_000,
    };
    let mut writer = live_writer();
    writer.rails = vec![nic("mlx5_0"), nic("mlx5_2"), nic("mlx5_1")];
    writer.devices = vec![
        DeviceEntry {
            name: "mlx5_0+mlx5_1".into(),
            nics: [0, 2],
        },
        DeviceEntry {
            name: "mlx5_2+mlx5_1".into(),
            nics: [1, 2],
        },
    ];
    let probes = ProbesFile::create(dir.path(), &writer).unwrap();
    for (slot, bytes) in [(0, 10), (1, 20), (2, 30)] {
        probes.rail(slot).add(RAIL_TX_BYTES, bytes);
    }
    let mut claims = Vec::new();
    for (device, port) in [(0u8, 5000), (1, 5000)] {
        let info = mpib_probes::ConnectionInfo {
            device,
            ..conn_info(
                [10, 0, 0, 2],
                port,
                Direction::Send,
                PathClass::IntraIsland,
                Mode::Vanilla,
                0,
            )
        };
        let claimed = probes.claim_connection(&info).unwrap();
        claimed.add_split([device as u64 + 1, 100]);
        claims.push(claimed);
    }
    let (scrape, stderr) = scrape_isolated(&dir, &[]);
    let sent = |rail, device| {
        scrape.value(
            "mpib_rail_tx_bytes_total",
            &[("rail", rail), ("device", device)],
        )
    };
    assert_eq!(sent("sout", "mlx5_0"), 10.0);
    assert_eq!(sent("sout", "mlx5_2"), 20.0);
    assert_eq!(sent("sup", "mlx5_1"), 30.0, "the shared SUP NIC, once");
    assert_eq!(scrape.matching("mpib_rail_tx_bytes_total", &[]).len(), 3);
    for (device, sout) in [("mlx5_0+mlx5_1", 1.0), ("mlx5_2+mlx5_1", 2.0)] {
        let labels = [
            ("nccl_device", device),
            ("peer", "10.0.0.2:5000"),
            ("rail", "sout"),
        ];
        assert_eq!(
            scrape.value("mpib_connection_bytes_total", &labels),
            sout,
            "{device}"
        );
    }
    assert!(
        stderr.contains("devices [mlx5_0+mlx5_1, mlx5_2+mlx5_1]"),
        "the startup line lists the devices: {stderr}"
    );
    drop(claims);
}
