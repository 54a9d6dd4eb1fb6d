//! An in-test OTLP/gRPC receiver: a slow transfer on both rails arrives as one
//! `mpib.slow_transfer` span with two `mpib.rail_transfer` children, with their attributes and
//! the writer's timestamps, and nothing else arrives (the OTel layer is filtered); a failover
//! arrives as one `mpib.failover` span with its report as an event.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use mpib_probes::{now_ns, Direction, FailoverEvent, SlowTransfer};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

#[derive(Clone, Default)]
struct Sink(Arc<Mutex<Vec<ExportTraceServiceRequest>>>);

#[tonic::async_trait]
impl TraceService for Sink {
    async fn export(
        &self,
        request: Request<ExportTraceServiceRequest>,
    ) -> Result<Response<ExportTraceServiceResponse>, Status> {
        self.0.lock().unwrap().push(request.into_inner());
        Ok(Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

fn attrs(list: &[KeyValue]) -> BTreeMap<String, Value> {
    list.iter()
        .filter_map(|kv| Some((kv.key.clone(), kv.value.clone()?.value?)))
        .collect()
}

fn int(map: &BTreeMap<String, Value>, key: &str) -> i64 {
    match map.get(key) {
        Some(Value::IntValue(v)) => *v,
        other => panic!("{key} is not an int attribute: {other:?}"),
    }
}

fn text(map: &BTreeMap<String, Value>, key: &str) -> String {
    match map.get(key) {
        Some(Value::StringValue(v)) => v.clone(),
        other => panic!("{key} is not a string attribute: {other:?}"),
    }
}

type Spans = Vec<(Span, BTreeMap<String, Value>)>;

/// The spans received so far, once there are at least `want` (or after 20 s); checks the
/// resource.
async fn collect_spans(sink: &Sink, want: usize) -> Spans {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let requests = sink.0.lock().unwrap().clone();
        let mut spans = Vec::new();
        for rs in requests.iter().flat_map(|r| &r.resource_spans) {
            let resource = attrs(&rs.resource.as_ref().unwrap().attributes);
            assert_eq!(text(&resource, "service.name"), "mpib-collector");
            assert!(resource.contains_key("host.name") && resource.contains_key("process.pid"));
            for span in rs.scope_spans.iter().flat_map(|s| &s.spans) {
                spans.push((span.clone(), attrs(&span.attributes)));
            }
        }
        if spans.len() >= want || Instant::now() > deadline {
            break spans;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn check_children(spans: &Spans, parent: &Span, transfer: &SlowTransfer) {
    let children: Vec<_> = spans
        .iter()
        .filter(|(s, _)| s.name == "mpib.rail_transfer")
        .collect();
    assert_eq!(children.len(), 2);
    for (child, ca) in children {
        assert_eq!(child.trace_id, parent.trace_id);
        assert_eq!(child.parent_span_id, parent.span_id);
        let r = usize::try_from(int(ca, "mpib.rail_index")).unwrap();
        assert_eq!(text(ca, "mpib.rail"), ["sout", "sup"][r]);
        assert_eq!(text(ca, "mpib.device"), ["mlx5_0", "mlx5_1"][r]);
        assert_eq!(
            int(ca, "mpib.bytes"),
            i64::try_from(transfer.rail_bytes[r]).unwrap()
        );
        assert_eq!(int(ca, "mpib.qp_num"), i64::from(transfer.qp_num[r]));
        assert_eq!(child.start_time_unix_nano, transfer.post_ns[r]);
        assert_eq!(child.end_time_unix_nano, transfer.done_ns[r]);
    }
}

/// An OTLP/gRPC trace receiver on a free local port: its endpoint, what it received, its task.
async fn start_receiver() -> (
    String,
    Sink,
    tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let sink = Sink::default();
    let server = tonic::transport::Server::builder()
        .add_service(TraceServiceServer::new(sink.clone()))
        .serve_with_incoming(TcpIncoming::from(listener));
    (endpoint, sink, tokio::spawn(server))
}

/// The collector over `dir` with `args`, started off the runtime's threads.
async fn start_collector(dir: &TempDir, args: Vec<String>) -> Running {
    let path = dir.path().to_path_buf();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Running::start(&path, &args)
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_transfer_arrives_as_a_span_with_rail_children() {
    let (endpoint, sink, server) = start_receiver().await;

    let dir = TempDir::new("otlp");
    let probes = fixture_file(dir.path(), &live_writer());
    let base = now_ns() - 1_000_000;
    let transfer = both_rails_transfer(base, 3);
    probes.record_slow_transfer(&transfer);
    let mut args = isolated(&dir);
    args.extend([
        "--otlp-endpoint".into(),
        endpoint,
        "--interval-ms".into(),
        "100".into(),
    ]);
    let running = start_collector(&dir, args).await;
    let first = collect_spans(&sink, 3).await;
    assert!(first.len() >= 3, "spans did not arrive: {first:?}");
    // Ten more scans and exports: an unfiltered OTel layer would now send the exporter's own
    // h2/tonic/hyper spans.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let log = std::sync::Arc::clone(&running.log);
    let status = tokio::task::spawn_blocking(move || running.terminate())
        .await
        .unwrap();
    let stderr = log.lock().unwrap().join("\n");
    assert!(status.success(), "{stderr}");
    let spans = collect_spans(&sink, 3).await;
    server.abort();
    let names: Vec<&str> = spans
        .iter()
        .map(|(s, _)| s.name.as_str())
        .take(12)
        .collect();
    assert_eq!(
        spans.len(),
        3,
        "exactly one parent and two children, nothing else: {names:?}\n{stderr}"
    );

    let (parent, pa) = spans
        .iter()
        .find(|(s, _)| s.name == "mpib.slow_transfer")
        .unwrap();
    assert_eq!(parent.start_time_unix_nano, transfer.post_ns[0]);
    assert_eq!(parent.end_time_unix_nano, transfer.done_ns[1]);
    assert_eq!(int(pa, "mpib.size"), 1 << 20);
    assert_eq!(int(pa, "mpib.rail_mask"), 3);
    assert_eq!(int(pa, "mpib.sup_bw"), 324);
    assert_eq!(int(pa, "mpib.slot"), 7);
    assert_eq!(int(pa, "mpib.conn_index"), 3);
    assert_eq!(int(pa, "mpib.pid"), i64::from(std::process::id()));
    assert_eq!(text(pa, "mpib.peer"), "10.0.0.2:5000");
    assert_eq!(text(pa, "mpib.direction"), "send");
    assert_eq!(text(pa, "mpib.kind"), "slow");
    assert_eq!(text(pa, "mpib.nccl.function"), "AllReduce");
    assert_eq!(text(pa, "mpib.nccl.algorithm"), "Ring");
    assert_eq!(text(pa, "mpib.nccl.protocol"), "Simple");
    assert_eq!(int(pa, "mpib.nccl.peers"), 2);
    assert_eq!(int(pa, "mpib.nccl.flows_per_peer"), 4);
    assert_eq!(text(pa, "mpib.host"), HOST);

    check_children(&spans, parent, &transfer);
    assert!(stderr.contains("slow transfer"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_arrives_as_a_span_with_its_report_as_an_event() {
    let (endpoint, sink, server) = start_receiver().await;

    let dir = TempDir::new("otlp-failover");
    let probes = fixture_file(dir.path(), &live_writer());
    let base = now_ns() - 1_000_000;
    let failover = FailoverEvent {
        direction: Direction::Send,
        rail: 1,
        conn_index: 2,
        detected_ns: base,
        reported_ns: base + 3_000,
        resumed_ns: base + 9_000,
        replayed_transfers: 4,
        replayed_bytes: 5 << 20,
        epoch: 1,
        peer: "10.0.0.2:5000".parse().unwrap(),
        device: 0,
    };
    probes.record_slow_transfer(&failover.record());
    let mut args = isolated(&dir);
    args.extend([
        "--otlp-endpoint".into(),
        endpoint,
        "--interval-ms".into(),
        "100".into(),
    ]);
    let running = start_collector(&dir, args).await;
    let spans = collect_spans(&sink, 1).await;
    let log = std::sync::Arc::clone(&running.log);
    let status = tokio::task::spawn_blocking(move || running.terminate())
        .await
        .unwrap();
    server.abort();
    let stderr = log.lock().unwrap().join("\n");
    assert!(status.success(), "{stderr}");
    assert_eq!(spans.len(), 1, "one span, nothing else: {stderr}");
    let (span, attributes) = &spans[0];
    assert_eq!(span.name, "mpib.failover");
    assert_eq!(span.start_time_unix_nano, base);
    assert_eq!(span.end_time_unix_nano, base + 9_000);
    assert_eq!(span.events.len(), 1);
    assert_eq!(span.events[0].name, "mpib.failover.reported");
    assert_eq!(span.events[0].time_unix_nano, base + 3_000);
    assert_eq!(text(attributes, "mpib.rail"), "sup");
    assert_eq!(text(attributes, "mpib.device"), "mlx5_1");
    assert_eq!(text(attributes, "mpib.direction"), "send");
    assert_eq!(text(attributes, "mpib.peer"), "10.0.0.2:5000");
    assert_eq!(int(attributes, "mpib.conn_index"), 2);
    assert_eq!(int(attributes, "mpib.epoch"), 1);
    assert_eq!(int(attributes, "mpib.replayed_transfers"), 4);
    assert_eq!(int(attributes, "mpib.replayed_bytes"), 5 << 20);
    assert!(stderr.contains("rail failed over"), "{stderr}");
}
