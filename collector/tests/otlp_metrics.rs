//! OTLP metrics (and traces over HTTP) into the in-test receiver: hand-built points through
//! `MetricsExporter` over both protocols; the running collector's OTLP metrics compared with
//! a Prometheus scrape of the same collector; `--otlp-signals` switching traces and metrics
//! independently; traces over HTTP/protobuf.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::float_cmp)]

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use common::otlp_receiver::Receiver;
use common::*;
use mpib_collector::catalog::{Kind, MetricSpec, PROBES_FILES, TRANSFER_LATENCY};
use mpib_collector::otlp_metrics::{request, MetricsExporter, Protocol};
use mpib_collector::points::{Family, HistogramValue, Point, ScanPoints, Value};
use mpib_probes::{now_ns, ProbesFile};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AttrValue;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use opentelemetry_proto::tonic::metrics::v1::number_data_point::Value as NumberValue;
use opentelemetry_proto::tonic::metrics::v1::AggregationTemporality;

const PROTOCOLS: [Protocol; 2] = [Protocol::Grpc, Protocol::HttpProtobuf];
const WAIT: Duration = Duration::from_secs(20);

/// A rail counter the probes crate declares.
const RAIL_TX: &str = "mpib_rail_tx_bytes_total";

fn family(spec: &MetricSpec) -> Arc<Family> {
    Arc::new(Family::of_spec(spec))
}

fn labels(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// A writer's counter and histogram and the collector's own gauge.
fn hand_built_scan() -> ScanPoints {
    let rail = [
        ("host", "w"),
        ("pid", "42"),
        ("rail", "sout"),
        ("device", "mlx5_0"),
        ("port", "1"),
    ];
    let histogram = HistogramValue {
        bounds: vec![1e-6, 1e-3],
        counts: vec![2, 0, 1],
        sum: 0.5,
        count: 3,
    };
    ScanPoints {
        time_ns: 2_000_000,
        points: vec![
            Point {
                family: Arc::new(mpib_collector::catalog::find(RAIL_TX).unwrap()),
                labels: labels(&rail),
                start_ns: 1_000,
                value: Value::Counter(1_000_000),
            },
            Point {
                family: family(&TRANSFER_LATENCY),
                labels: labels(&rail),
                start_ns: 1_000,
                value: Value::Histogram(histogram),
            },
            Point {
                family: family(&PROBES_FILES),
                labels: labels(&[("host", "c")]),
                start_ns: 500,
                value: Value::Gauge(1.0),
            },
        ],
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn exporter_delivers_hand_built_points_over_both_protocols() {
    let rt = runtime();
    for protocol in PROTOCOLS {
        let receiver = Receiver::start(protocol);
        // A trailing slash must not matter.
        let endpoint = format!("{}/", receiver.endpoint);
        let scan = hand_built_scan();
        rt.block_on(async {
            let exporter = MetricsExporter::new(&endpoint, protocol).unwrap();
            exporter.export(&ScanPoints::default(), "c").await.unwrap();
            exporter.export(&scan, "c").await.unwrap();
            *receiver.received.rejected.lock().unwrap() = 1;
            exporter.export(&scan, "c").await.unwrap(); // partial success: logged, not an error
        });
        let got = receiver.metrics();
        assert_eq!(got.len(), 2, "{protocol:?}: an empty scan sends nothing");
        assert_eq!(got[0], request(&scan, "c"), "{protocol:?}");
        let rms = &got[0].resource_metrics;
        assert_eq!(rms.len(), 2, "{protocol:?}: the writer and the collector");
        let resource = attrs(&rms[0].resource.as_ref().unwrap().attributes);
        assert_eq!(resource["service.name"], s("mpib"));
        assert_eq!(resource["host.name"], s("w"));
        assert_eq!(resource["process.pid"], AttrValue::IntValue(42));
        let metrics = &rms[0].scope_metrics[0].metrics;
        assert_eq!(metrics[0].name, "mpib_rail_tx_bytes_total");
        let Some(Data::Histogram(h)) = &metrics[1].data else {
            panic!("{protocol:?}: not a histogram")
        };
        assert_eq!(h.data_points[0].bucket_counts, [2, 0, 1]);
    }
}

#[test]
fn export_errors_name_the_endpoint_and_the_status() {
    let rt = runtime();
    for (protocol, status) in [
        (Protocol::Grpc, "Unavailable"),
        (Protocol::HttpProtobuf, "503"),
    ] {
        let receiver = Receiver::start(protocol);
        receiver.answer_with(503);
        let e = rt.block_on(async {
            let exporter = MetricsExporter::new(&receiver.endpoint, protocol).unwrap();
            exporter.export(&hand_built_scan(), "c").await.unwrap_err()
        });
        assert!(
            e.contains(&receiver.endpoint) && e.contains(status),
            "{protocol:?}: {e}"
        );
    }
}

fn attrs(list: &[KeyValue]) -> BTreeMap<String, AttrValue> {
    list.iter()
        .filter_map(|kv| Some((kv.key.clone(), kv.value.clone()?.value?)))
        .collect()
}

fn s(v: &str) -> AttrValue {
    AttrValue::StringValue(v.to_owned())
}

/// A fixture file of a live writer started at `start_ns`.
fn fixture(dir: &TempDir, start_ns: u64) -> ProbesFile {
    let probes = fixture_file(dir.path(), &writer(std::process::id(), start_ns));
    fill_fixture(&probes);
    probes
}

fn start(dir: &TempDir, endpoint: &str, protocol: Protocol, signals: &str) -> Running {
    start_every(dir, endpoint, protocol, signals, "200")
}

fn start_every(
    dir: &TempDir,
    endpoint: &str,
    protocol: Protocol,
    signals: &str,
    interval_ms: &str,
) -> Running {
    let mut args = isolated(dir);
    args.extend(
        [
            "--otlp-endpoint",
            endpoint,
            "--otlp-protocol",
            protocol.as_str(),
            "--otlp-signals",
            signals,
            "--otlp-metrics-interval-ms",
            interval_ms,
            "--interval-ms",
            "100",
        ]
        .map(str::to_owned),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Running::start(dir.path(), &args)
}

fn has_metric(requests: &[ExportMetricsServiceRequest], name: &str) -> bool {
    requests
        .iter()
        .flat_map(|r| &r.resource_metrics)
        .flat_map(|rm| &rm.scope_metrics)
        .flat_map(|sm| &sm.metrics)
        .any(|m| m.name == name)
}

/// One data point as received, with its resource.
#[derive(Debug)]
struct Series {
    name: String,
    labels: BTreeMap<String, String>,
    resource: BTreeMap<String, AttrValue>,
    start_ns: u64,
    time_ns: u64,
    value: Got,
}

#[derive(Debug)]
enum Got {
    Int(i64),
    Double(f64),
    Histogram {
        bounds: Vec<f64>,
        counts: Vec<u64>,
        sum: f64,
        count: u64,
    },
}

fn string_labels(list: &[KeyValue]) -> BTreeMap<String, String> {
    attrs(list)
        .into_iter()
        .map(|(k, v)| match v {
            AttrValue::StringValue(v) => (k, v),
            other => panic!("label {k} is not a string: {other:?}"),
        })
        .collect()
}

/// Every data point of `request`, checking each metric against the catalog (kind, unit,
/// cumulative temporality, monotonic sums).
fn flatten(request: &ExportMetricsServiceRequest) -> Vec<Series> {
    let cumulative = AggregationTemporality::Cumulative as i32;
    let mut out = Vec::new();
    for rm in &request.resource_metrics {
        let resource = attrs(&rm.resource.as_ref().unwrap().attributes);
        let metrics = rm.scope_metrics.iter().flat_map(|sm| &sm.metrics);
        for metric in metrics {
            let spec = known_family(&metric.name)
                .unwrap_or_else(|| panic!("{} is not in the catalog", metric.name));
            assert_eq!(metric.unit, spec.unit.ucum(), "{}", metric.name);
            assert_eq!(metric.description, spec.help, "{}", metric.name);
            let mut push = |attributes: &[KeyValue], start_ns, time_ns, value| {
                out.push(Series {
                    name: metric.name.clone(),
                    labels: string_labels(attributes),
                    resource: resource.clone(),
                    start_ns,
                    time_ns,
                    value,
                });
            };
            match (&metric.data, spec.kind) {
                (Some(Data::Sum(sum)), Kind::Counter) => {
                    assert!(sum.is_monotonic, "{}", metric.name);
                    assert_eq!(sum.aggregation_temporality, cumulative, "{}", metric.name);
                    for p in &sum.data_points {
                        let Some(NumberValue::AsInt(v)) = p.value else {
                            panic!("{}: not an int: {p:?}", metric.name)
                        };
                        let t = (p.start_time_unix_nano, p.time_unix_nano);
                        push(&p.attributes, t.0, t.1, Got::Int(v));
                    }
                }
                (Some(Data::Gauge(gauge)), Kind::Gauge) => {
                    for p in &gauge.data_points {
                        let Some(NumberValue::AsDouble(v)) = p.value else {
                            panic!("{}: not a double: {p:?}", metric.name)
                        };
                        let t = (p.start_time_unix_nano, p.time_unix_nano);
                        push(&p.attributes, t.0, t.1, Got::Double(v));
                    }
                }
                (Some(Data::Histogram(h)), Kind::Histogram) => {
                    assert_eq!(h.aggregation_temporality, cumulative, "{}", metric.name);
                    for p in &h.data_points {
                        let value = Got::Histogram {
                            bounds: p.explicit_bounds.clone(),
                            counts: p.bucket_counts.clone(),
                            sum: p.sum.unwrap(),
                            count: p.count,
                        };
                        let t = (p.start_time_unix_nano, p.time_unix_nano);
                        push(&p.attributes, t.0, t.1, value);
                    }
                }
                (data, kind) => panic!("{}: {kind:?} sent as {data:?}", metric.name),
            }
        }
    }
    out
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1e-12)
}

/// Every counter and gauge sample of the scrape has its OTLP point with the same value (the
/// heartbeat age moves between scans: within 2 s; the export counter only grows).
fn check_numbers(scrape: &Scrape, series: &[Series]) {
    for sample in &scrape.samples {
        let spec = known_family(&sample.name)
            .or_else(|| mpib_collector::catalog::family_of(&sample.name))
            .unwrap_or_else(|| panic!("{} is not in the catalog", sample.name));
        if spec.kind == Kind::Histogram {
            continue;
        }
        let found: Vec<&Series> = series
            .iter()
            .filter(|s| s.name == sample.name && s.labels == sample.labels)
            .collect();
        assert_eq!(found.len(), 1, "{sample:?} in OTLP: {found:?}");
        let got = match found[0].value {
            Got::Int(v) => v as f64,
            Got::Double(v) => v,
            Got::Histogram { .. } => panic!("{sample:?} arrived as a histogram"),
        };
        // Ages grow between the scrape and the export read here.
        if ["mpib_writer_heartbeat_age_seconds", "mpib_degraded_seconds"]
            .contains(&sample.name.as_str())
        {
            assert!((got - sample.value).abs() < 2.0, "{sample:?}: {got}");
        } else if sample.name == "mpib_otlp_metric_exports_total" {
            // Counts the exports themselves: the request read here is a later one.
            assert!(got >= sample.value, "{sample:?}: {got}");
            let ok = sample.labels.get("result").map(String::as_str) == Some("ok");
            assert!(!ok || got >= 1.0, "{sample:?}: {got}");
        } else {
            assert_eq!(got, sample.value, "{sample:?}");
        }
    }
}

/// The latency histograms: count, sum and the cumulative `_bucket` lines.
fn check_histograms(scrape: &Scrape, series: &[Series]) {
    let name = TRANSFER_LATENCY.name;
    let counts = scrape.matching(&format!("{name}_count"), &[]);
    assert!(!counts.is_empty(), "no histogram in\n{}", scrape.text);
    for count_sample in counts {
        let key = &count_sample.labels;
        let point = series
            .iter()
            .find(|s| s.name == name && &s.labels == key)
            .unwrap_or_else(|| panic!("no OTLP histogram for {key:?}"));
        let Got::Histogram {
            bounds,
            counts,
            sum,
            count,
        } = &point.value
        else {
            panic!("{key:?}: not a histogram")
        };
        assert_eq!(*count as f64, count_sample.value, "{key:?}");
        assert_eq!(counts.len(), bounds.len() + 1, "{key:?}");
        assert_eq!(counts.iter().sum::<u64>(), *count, "{key:?}");
        let pairs: Vec<(&str, &str)> = key.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert!(
            close(*sum, scrape.value(&format!("{name}_sum"), &pairs)),
            "{key:?}"
        );
        let buckets: Vec<&Sample> = scrape
            .matching(&format!("{name}_bucket"), &pairs)
            .into_iter()
            .filter(|b| b.labels.len() == key.len() + 1)
            .collect();
        assert_eq!(
            buckets.len(),
            bounds.len() + 1,
            "{key:?}: one line per bucket"
        );
        for bucket in buckets {
            let le = bucket.labels["le"].as_str();
            let cumulative: u64 = if le == "+Inf" {
                *count
            } else {
                let le: f64 = le.parse().unwrap();
                let i = bounds
                    .iter()
                    .position(|b| close(*b, le))
                    .unwrap_or_else(|| panic!("{key:?}: no bound {le} in {bounds:?}"));
                counts[..=i].iter().sum()
            };
            assert_eq!(cumulative as f64, bucket.value, "{key:?} le={le}");
        }
    }
}

/// Resources and start times: writer series on the writer's resource with its start, the
/// collector's own on the collector's resource.
fn check_resources(series: &[Series], writer_start: u64, collector_pid: u32) {
    let time = series[0].time_ns;
    for p in series {
        assert_eq!(p.time_ns, time, "one scan per request: {p:?}");
        let host = s(&p.labels["host"]);
        assert_eq!(p.resource["host.name"], host, "{p:?}");
        if let Some(pid) = p.labels.get("pid") {
            assert_eq!(p.resource["service.name"], s("mpib"), "{p:?}");
            let pid: i64 = pid.parse().unwrap();
            assert_eq!(p.resource["process.pid"], AttrValue::IntValue(pid), "{p:?}");
            assert_eq!(pid, i64::from(std::process::id()), "{p:?}");
            assert_eq!(p.labels["host"], HOST, "{p:?}");
            assert_eq!(p.start_ns, writer_start, "{p:?}");
        } else {
            assert_eq!(p.resource["service.name"], s("mpib-collector"), "{p:?}");
            let pid = AttrValue::IntValue(i64::from(collector_pid));
            assert_eq!(p.resource["process.pid"], pid, "{p:?}");
            assert!(p.start_ns > 0 && p.start_ns <= time, "{p:?}");
        }
    }
}

/// The collector's OTLP metrics match a scrape of the same collector.
fn metrics_match_the_scrape(protocol: Protocol) {
    let receiver = Receiver::start(protocol);
    let dir = TempDir::new("otlp-metrics");
    let writer_start = now_ns() - 5_000_000_000;
    let _probes = fixture(&dir, writer_start);
    let running = start(&dir, &receiver.endpoint, protocol, "metrics");
    let collector_pid = running.child.as_ref().unwrap().id();
    let arrived = receiver.wait_metrics(WAIT, |r| has_metric(r, RAIL_TX));
    assert!(
        arrived.is_some(),
        "{protocol:?}: no rail counters within {WAIT:?}; got {:?}",
        receiver.metrics().len()
    );
    let pid = std::process::id().to_string();
    let sout = [("pid", pid.as_str()), ("rail", "sout")];
    let scrape = running.scrape_until(WAIT, |s| s.get(RAIL_TX, &sout).is_some());
    // A request sent after the scrape: counters do not move, so it must agree.
    let before = receiver.metrics().len();
    let requests = receiver
        .wait_metrics(WAIT, |r| r.len() > before)
        .expect("no request after the scrape");
    let series = flatten(requests.last().unwrap());
    // Every family of the catalog the fixture feeds (no hint file, no sysfs here), and the
    // two values only the fixture's file declares.
    let arrived: std::collections::BTreeSet<&str> =
        series.iter().map(|s| s.name.as_str()).collect();
    let unfed = ["mpib_connection_hint_sup_ratio", "mpib_nic_counter_total"];
    let fixture = [WIDGETS_DECLARATION.name, FIXTURE_PROCESS_DECLARATION.name];
    let families = mpib_collector::catalog::families();
    let expected = families
        .iter()
        .map(|f| f.name.as_str())
        .filter(|n| !unfed.contains(n));
    for name in expected.chain(fixture) {
        assert!(
            arrived.contains(name),
            "{protocol:?}: {name} did not arrive"
        );
    }
    check_numbers(&scrape, &series);
    check_histograms(&scrape, &series);
    check_resources(&series, writer_start, collector_pid);
    assert!(running.terminate().success());
}

#[test]
fn metrics_match_the_scrape_over_grpc() {
    metrics_match_the_scrape(Protocol::Grpc);
}

#[test]
fn metrics_match_the_scrape_over_http() {
    metrics_match_the_scrape(Protocol::HttpProtobuf);
}

#[test]
fn sigterm_exports_the_last_scan_before_exiting() {
    let receiver = Receiver::start(Protocol::Grpc);
    let dir = TempDir::new("otlp-sigterm");
    let _probes = fixture(&dir, now_ns());
    // An hour between exports: only the final one can arrive during this test.
    let running = start_every(
        &dir,
        &receiver.endpoint,
        Protocol::Grpc,
        "metrics",
        "3600000",
    );
    let pid = std::process::id().to_string();
    let sout = [("pid", pid.as_str()), ("rail", "sout")];
    running.scrape_until(WAIT, |s| s.get(RAIL_TX, &sout).is_some());
    assert!(
        receiver.metrics().is_empty(),
        "an export before the first scan or the interval"
    );
    assert!(running.terminate().success());
    let requests = receiver.metrics();
    assert_eq!(requests.len(), 1, "one final export");
    assert!(has_metric(&requests, RAIL_TX));
}

#[test]
fn once_exports_the_metrics_before_exiting() {
    let receiver = Receiver::start(Protocol::HttpProtobuf);
    let dir = TempDir::new("otlp-once");
    let _probes = fixture(&dir, now_ns());
    let mut args = isolated(&dir);
    args.extend(
        [
            "--otlp-endpoint",
            receiver.endpoint.as_str(),
            "--otlp-protocol",
            "http/protobuf",
        ]
        .map(str::to_owned),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run_once(dir.path(), &args);
    assert!(out.status.success());
    assert!(
        has_metric(&receiver.metrics(), RAIL_TX),
        "no metrics after --once: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn traces_only_sends_no_metrics() {
    for protocol in PROTOCOLS {
        let receiver = Receiver::start(protocol);
        let dir = TempDir::new("otlp-traces-only");
        let _probes = fixture(&dir, now_ns());
        let running = start(&dir, &receiver.endpoint, protocol, "traces");
        let spans = receiver.wait_spans(WAIT, 3);
        assert!(
            spans.iter().any(|s| s.name == "mpib.slow_transfer"),
            "{protocol:?}: no span: {spans:?}"
        );
        // Several metrics intervals later: still none.
        std::thread::sleep(Duration::from_millis(1000));
        assert!(running.terminate().success());
        assert!(receiver.metrics().is_empty(), "{protocol:?}");
    }
}

#[test]
fn metrics_only_sends_no_traces() {
    for protocol in PROTOCOLS {
        let receiver = Receiver::start(protocol);
        let dir = TempDir::new("otlp-metrics-only");
        let _probes = fixture(&dir, now_ns());
        let running = start(&dir, &receiver.endpoint, protocol, "metrics");
        let arrived = receiver.wait_metrics(WAIT, |r| has_metric(r, RAIL_TX));
        assert!(arrived.is_some(), "{protocol:?}: no metrics");
        // The slow transfer has been read (and would have been sent within 100 ms).
        let pid = std::process::id().to_string();
        running.scrape_until(WAIT, |s| {
            s.get("mpib_slow_transfers_total", &[("pid", pid.as_str())]) == Some(1.0)
        });
        std::thread::sleep(Duration::from_millis(1000));
        assert!(running.terminate().success());
        assert!(receiver.traces().is_empty(), "{protocol:?}");
    }
}

#[test]
fn traces_over_http_arrive_as_spans() {
    let receiver = Receiver::start(Protocol::HttpProtobuf);
    let dir = TempDir::new("otlp-http-traces");
    let _probes = fixture(&dir, now_ns());
    let running = start(
        &dir,
        &receiver.endpoint,
        Protocol::HttpProtobuf,
        "traces,metrics",
    );
    let spans = receiver.wait_spans(WAIT, 3);
    let log = running.log.lock().unwrap().join("\n");
    let parents: Vec<_> = spans
        .iter()
        .filter(|s| s.name == "mpib.slow_transfer")
        .collect();
    assert_eq!(parents.len(), 1, "{spans:?}\n{log}");
    let children = spans
        .iter()
        .filter(|s| s.name == "mpib.rail_transfer" && s.parent_span_id == parents[0].span_id);
    assert_eq!(children.count(), 2, "{spans:?}");
    let resource = attrs(
        &receiver.traces()[0].resource_spans[0]
            .resource
            .as_ref()
            .unwrap()
            .attributes,
    );
    assert_eq!(resource["service.name"], s("mpib-collector"));
    assert!(running.terminate().success());
}
