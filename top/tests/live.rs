//! `mpib-top --once --json` against a running loopback job in advanced mode with the agent: its
//! totals, rates and split agree with what the probes file and the hint file say around it; a
//! process that exits disappears; a truncated, foreign or untrusted file is listed with its
//! reason.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use common::{agent, eventually, perf, perf_with, probes_file, process, temp_dir, top_json};
use mpib_node::hint::HintTable;
use mpib_probes::declared::{RAIL_RX_BYTES, RAIL_TX_BYTES, SRQ_HIGH_WATER, SRQ_LOW_WATER};
use mpib_probes::{now_ns, LoadState, ProbesReader, Snapshot};
use serde_json::Value;

fn reader(path: &std::path::Path) -> ProbesReader {
    match ProbesReader::open(path).unwrap() {
        LoadState::Ready(reader) => reader,
        _ => panic!("{} is not ready", path.display()),
    }
}

/// A rail's value in the document by its declared name.
fn value(rail: &Value, name: &str) -> u64 {
    rail["values"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == name)
        .unwrap_or_else(|| panic!("no {name} in {rail}"))["value"]
        .as_u64()
        .unwrap()
}

/// Per rail of device 0: (sent, received) between two snapshots.
fn moved(before: &Snapshot, after: &Snapshot, nic: usize) -> [u64; 2] {
    let (b, a) = (&before.rails[nic], &after.rails[nic]);
    [
        a.counter(RAIL_TX_BYTES) - b.counter(RAIL_TX_BYTES),
        a.counter(RAIL_RX_BYTES) - b.counter(RAIL_RX_BYTES),
    ]
}

#[test]
fn the_json_agrees_with_the_probes_and_the_agent_within_one_interval() {
    let dir = temp_dir("json");
    let _agent = agent(&dir);
    let job = perf(&dir, "sout=200MB/s,sup=400MB/s,latency=5us", true, "perf");
    let path = probes_file(&dir, job.pid());
    let reader = reader(&path);
    // The agent settles the flow's split (683 on these rails) within a few of its intervals.
    let settled = eventually(Duration::from_secs(20), || {
        let doc = top_json(&dir, &["--interval", "0.2"]);
        process(&doc, job.pid()).is_some_and(|p| {
            p["devices"][0]["split_asked"]
                .as_u64()
                .is_some_and(|s| (640..=726).contains(&s))
        })
    });
    assert!(settled, "the agent never asked for a split");

    let hints_before = HintTable::load(&dir.join("hints")).unwrap();
    let (t0, s0) = (now_ns(), reader.snapshot());
    let doc = top_json(&dir, &["--interval", "1"]);
    let (t1, s1) = (now_ns(), reader.snapshot());
    let hints_after = HintTable::load(&dir.join("hints")).unwrap();

    let p = process(&doc, job.pid()).unwrap_or_else(|| panic!("no process in {doc}"));
    let interval = doc["interval_seconds"].as_f64().unwrap();
    assert!((0.9..1.5).contains(&interval), "{interval}");
    let window = (t1 - t0) as f64 / 1e9;
    let device = &p["devices"][0];
    for (r, rail) in device["rails"].as_array().unwrap().iter().enumerate() {
        let nic = reader.info().devices[0].nics[r];
        // Totals: what the probes said before and after.
        let tx = value(rail, "mpib_rail_tx_bytes_total");
        let (tx0, tx1) = (
            s0.rails[nic].counter(RAIL_TX_BYTES),
            s1.rails[nic].counter(RAIL_TX_BYTES),
        );
        assert!(
            (tx0..=tx1).contains(&tx),
            "rail {r}: {tx0} <= {tx} <= {tx1}"
        );
        // Rates: top's interval lies inside the window, so it moved at most the window's
        // bytes; on a shaped rail the two rates agree.
        let [sent, received] = moved(&s0, &s1, nic);
        for (field, bytes) in [
            ("sent_bytes_per_second", sent),
            ("received_bytes_per_second", received),
        ] {
            let rate = rail[field].as_f64().unwrap();
            assert!(
                rate * interval <= bytes as f64 * 1.02,
                "rail {r} {field}: {rate} over {interval} s vs {bytes} B"
            );
            let probes_rate = bytes as f64 / window;
            assert!(
                (rate - probes_rate).abs() <= 0.2 * probes_rate,
                "rail {r} {field}: mpib-top {rate}, probes {probes_rate}"
            );
        }
        // The watermarks are set once per process: the same before, in the document, after.
        for (field, gauge) in [
            ("srq_low_water", SRQ_LOW_WATER),
            ("srq_high_water", SRQ_HIGH_WATER),
        ] {
            let shown = rail[field].as_u64().unwrap();
            assert!(shown > 0, "rail {r} {field}: {rail}");
            assert_eq!(shown, s0.rails[nic].gauge(gauge), "rail {r} {field}");
            assert_eq!(shown, s1.rails[nic].gauge(gauge), "rail {r} {field}");
        }
    }
    split_and_agent(&doc, device, [&s0, &s1], [&hints_before, &hints_after]);
}

/// The split: asked is the hint file's (when unchanged around the run), applied is what the
/// connections' bytes took; and the agent's decision for the flow, over its control socket.
fn split_and_agent(
    doc: &Value,
    device: &Value,
    [s0, s1]: [&Snapshot; 2],
    [hints_before, hints_after]: [&HintTable; 2],
) {
    let slot = s1
        .connections
        .iter()
        .find(|c| c.info.mode == mpib_probes::Mode::Advanced)
        .unwrap()
        .info
        .hint_slot;
    let asked = hints_after.sup_bw(slot).unwrap();
    let shown = device["split_asked"].as_u64().unwrap();
    if hints_before.sup_bw(slot) == Some(asked) {
        assert_eq!(shown, u64::from(asked), "{device}");
    } else {
        // The agent moved it during the run: what was shown is one of its settled values.
        assert!((640..=726).contains(&shown), "{device}");
    }
    let applied = device["split_applied"].as_u64().unwrap();
    let (mut sout, mut sup) = (0u64, 0u64);
    for c in s1.connections.iter() {
        if let Some(b) = s0
            .connections
            .iter()
            .find(|b| b.index == c.index && b.generation == c.generation)
        {
            sout += c.rail_bytes[0] - b.rail_bytes[0];
            sup += c.rail_bytes[1] - b.rail_bytes[1];
        }
    }
    let probes_split = (sup as f64 * 1024.0 / (sout + sup) as f64).round() as u64;
    assert!(
        applied.abs_diff(probes_split) <= 40,
        "applied {applied}, probes {probes_split}"
    );
    // The agent's decision for the flow, over its control socket.
    assert_eq!(doc["agent"]["state"], "running", "{doc}");
    let flow = &doc["agent"]["flows"][0];
    assert_eq!(flow["flow"].as_u64(), Some(u64::from(slot)), "{doc}");
    assert!(
        (640..=726).contains(&flow["sup_bw"].as_u64().unwrap()),
        "{flow}"
    );
    assert_eq!(flow["policy"], "adaptive");
}

#[test]
fn an_exited_process_disappears_and_bad_files_are_skipped_with_their_reason() {
    let dir = temp_dir("exit");
    let mut job = perf(&dir, "sout=200MB/s,sup=400MB/s,latency=5us", false, "perf");
    let path = probes_file(&dir, job.pid());
    let pid = job.pid();
    assert!(eventually(Duration::from_secs(10), || process(
        &top_json(&dir, &["--interval", "0.1"]),
        pid
    )
    .is_some()));

    // A truncated copy, a file of another format, and one anybody may write.
    let probes = dir.join("probes");
    let whole = std::fs::read(&path).unwrap();
    let me = std::process::id();
    std::fs::write(
        probes.join(format!("mpib-{me}-1.probes")),
        &whole[..whole.len() / 2],
    )
    .unwrap();
    std::fs::write(probes.join(format!("mpib-{me}-2.probes")), vec![b'x'; 8192]).unwrap();
    let open = probes.join(format!("mpib-{me}-3.probes"));
    std::fs::write(&open, &whole).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o666)).unwrap();

    // Killed: its file stays (only the collector reaps), and mpib-top no longer shows it.
    job.0.kill().unwrap();
    job.0.wait().unwrap();
    assert!(path.exists());
    let doc = top_json(&dir, &["--interval", "0.1"]);
    assert!(process(&doc, pid).is_none(), "{doc}");
    let skipped = doc["skipped"].as_array().unwrap();
    let reason_of = |n: u32| {
        skipped
            .iter()
            .find(|s| {
                s["path"]
                    .as_str()
                    .unwrap()
                    .ends_with(&format!("mpib-{me}-{n}.probes"))
            })
            .unwrap_or_else(|| panic!("file {n} not skipped: {doc}"))
    };
    assert_eq!(reason_of(1)["reason"], "truncated", "{doc}");
    assert!(
        reason_of(1)["detail"]
            .as_str()
            .unwrap()
            .contains("header says"),
        "{doc}"
    );
    assert_eq!(reason_of(2)["reason"], "corrupt", "{doc}");
    assert!(
        reason_of(2)["detail"]
            .as_str()
            .unwrap()
            .contains("bad magic"),
        "{doc}"
    );
    assert_eq!(reason_of(3)["reason"], "untrusted", "{doc}");
    assert!(
        reason_of(3)["detail"]
            .as_str()
            .unwrap()
            .contains("may write"),
        "{doc}"
    );
    assert_eq!(skipped.len(), 3, "{doc}");
    // The text frame names them too.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mpib-top"))
        .arg("--probes-dir")
        .arg(&probes)
        .args(["--agent-control", "off", "--once", "--interval", "0.1"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("SKIPPED FILES  3") && text.contains("bad magic"),
        "{text}"
    );
    assert!(text.contains("no process writes probes"), "{text}");
}

/// A job whose SUP rail was cut (vanilla: everything rode SUP) fails over to SOUT: its
/// device's SUP rail shows the connections that failed it over, and so does each connection.
#[test]
fn a_rail_failed_over_shows_on_its_device_and_connections() {
    let dir = temp_dir("failover");
    let rails = "sout=200MB/s,sup=200MB/s,latency=5us";
    let cut = [("MPIB_LOOPBACK_FAULTS", "cut=sup:50")];
    let job = perf_with(&dir, rails, false, "cut", &cut);
    probes_file(&dir, job.pid());
    let mut last = Value::Null;
    let shown = eventually(Duration::from_secs(20), || {
        last = top_json(&dir, &[]);
        let Some(p) = process(&last, job.pid()) else {
            return false;
        };
        let rails = p["devices"][0]["rails"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let down = |name: &str| {
            rails
                .iter()
                .find(|r| r["rail"] == name)
                .map(|r| r["failed_over_connections"].as_u64())
        };
        let marked = p["connections"].as_array().is_some_and(|c| {
            !c.is_empty()
                && c.iter()
                    .all(|c| c["failed_over"] == serde_json::json!(["sup"]))
        });
        down("sup") == Some(Some(2)) && down("sout") == Some(Some(0)) && marked
    });
    assert!(shown, "the failover never showed: {last:#}");
    drop(job);
}

/// A value this version was not built with, as a later plugin would declare it.
const WIDGETS: mpib_probes::RailCounter = mpib_probes::RailCounter::at(22);

#[test]
fn values_declared_later_show_with_no_change_and_only_slow_transfers_are_listed() {
    use mpib_probes::{
        DeviceEntry, Merge, ProbesFile, RailInfo, ValueUnit, WriterInfo, DECLARATIONS,
    };
    let dir = temp_dir("declared");
    let rails: Vec<RailInfo> = ["mlx5_0", "mlx5_1"]
        .iter()
        .map(|nic| RailInfo {
            device: (*nic).into(),
            port: 1,
            speed_mbps: 200_000,
        })
        .collect();
    let info = WriterInfo {
        pid: std::process::id(),
        start_ns: now_ns(),
        host: "node-a".into(),
        devices: vec![DeviceEntry::of_rails(&rails)],
        rails,
        slow_threshold_ns: 1_000_000,
        sample_one_in: 0,
    };
    let mut declarations = DECLARATIONS.to_vec();
    declarations.push(WIDGETS.declare(
        ValueUnit::Count,
        Merge::Sum,
        "mpib_fixture_widgets_total",
        "Widgets the test made.",
    ));
    let file = ProbesFile::create_declaring(&dir.join("probes"), &info, &declarations).unwrap();
    file.rail(1).add(WIDGETS, 7);
    // Three events: a slow transfer on both rails, one whose SUP bit is set but never posted
    // on (the rail does not count), and a 1-in-N sample (not slow: not listed).
    let base = now_ns();
    let event = |kind: u16, post: [u64; 2], done: [u64; 2]| mpib_probes::SlowTransfer {
        kind: mpib_probes::EventKind(kind),
        direction: mpib_probes::Direction::Send,
        rail_mask: 3,
        conn_index: mpib_probes::NO_CONNECTION,
        size: 1 << 20,
        post_ns: post,
        done_ns: done,
        rail_bytes: [700 << 10, 324 << 10],
        sup_bw: 324,
        slot: 0,
        qp_num: [1, 2],
        peer: "10.0.0.2:5000".parse().unwrap(),
        device: 0,
        operation: mpib_probes::Operation::default(),
    };
    file.record_slow_transfer(&event(1, [base, base + 1000], [base + 4000, base + 9000]));
    file.record_slow_transfer(&event(1, [base, 0], [base + 2000, base + 3000]));
    file.record_slow_transfer(&event(2, [base, base], [base + 50_000, base + 50_000]));
    file.heartbeat(now_ns());
    let doc = top_json(&dir, &["--interval", "0.1", "--agent-control", "off"]);
    let p = process(&doc, std::process::id()).unwrap_or_else(|| panic!("{doc}"));
    let sup = &p["devices"][0]["rails"][1];
    assert_eq!(sup["nic"], "mlx5_1", "{doc}");
    assert_eq!(value(sup, "mpib_fixture_widgets_total"), 7, "{doc}");
    assert_eq!(
        value(&p["devices"][0]["rails"][0], "mpib_fixture_widgets_total"),
        0
    );
    assert_eq!(doc["agent"]["state"], "off");
    let slowest = doc["slowest"].as_array().unwrap();
    assert_eq!(slowest.len(), 2, "{doc}");
    assert_eq!(slowest[0]["total_us"].as_f64(), Some(9.0), "{doc}");
    assert_eq!(slowest[0]["rail_us"][1].as_f64(), Some(8.0), "{doc}");
    assert_eq!(slowest[1]["total_us"].as_f64(), Some(2.0), "{doc}");
    assert!(slowest[1]["rail_us"][1].is_null(), "{doc}");
    // Batch mode: N frames, as text or one JSON document per line.
    let batch = |extra: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_mpib-top"))
            .arg("--probes-dir")
            .arg(dir.join("probes"))
            .args([
                "--agent-control",
                "off",
                "-b",
                "-n",
                "2",
                "--interval",
                "0.1",
            ])
            .args(extra)
            .output()
            .unwrap();
        assert!(out.status.success());
        String::from_utf8(out.stdout).unwrap()
    };
    let text = batch(&[]);
    assert_eq!(text.matches("mpib-top  1 processes").count(), 2, "{text}");
    assert!(text.contains("mlx5_0:1"), "{text}");
    let json = batch(&["--json"]);
    assert_eq!(json.lines().count(), 2, "{json}");
    for line in json.lines() {
        let doc: Value = serde_json::from_str(line).unwrap();
        assert!(process(&doc, std::process::id()).is_some(), "{doc}");
    }
}
