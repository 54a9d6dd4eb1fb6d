//! OTLP traces: each slow (or sampled) transfer becomes a span `mpib.slow_transfer` with one
//! child `mpib.rail_transfer` per active rail, with the writer's own timestamps; each failover
//! of a connection end becomes a span `mpib.failover` from when the end found the rail failed to
//! when it went on with nothing of it left, with an event `mpib.failover.reported` at the
//! receiver's report (docs/PROTOCOL.md §10).
//!
//! Spans are built with the OpenTelemetry API directly (explicit start and end times from the
//! event record, not the collector's clock). Integer attributes are `i64`: a `u64` would arrive
//! as a string. The exporter is OTLP/gRPC (tonic) or OTLP/HTTP protobuf (hyper); it must be
//! built inside a Tokio runtime, while the SDK's batch processor runs on its own thread (the
//! HTTP requests are therefore handed to the runtime, see [`RuntimeHttpClient`]).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;

use mpib_probes::{
    Direction, EventKind, FailoverEvent, FileInfo, SlowTransfer, SlowTransferRecord, MAX_RAILS,
    NO_CONNECTION, RAIL_NAMES,
};
use opentelemetry::trace::{
    Span as _, SpanKind, TraceContextExt, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_http::hyper::HyperClient;
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{SpanExporter, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, SdkTracer, SdkTracerProvider,
};
use opentelemetry_sdk::Resource;
use tokio::runtime::Handle;

use crate::otlp_metrics::{signal_url, Protocol, EXPORT_TIMEOUT};

/// Service name of the resource.
pub const SERVICE_NAME: &str = "mpib-collector";
/// Name of the parent span.
pub const SLOW_SPAN: &str = "mpib.slow_transfer";
/// Name of the per-rail child spans.
pub const RAIL_SPAN: &str = "mpib.rail_transfer";
/// Name of a failover's span, and of its event at the receiver's report.
pub const FAILOVER_SPAN: &str = "mpib.failover";
/// Name of the event at the receiver's report, inside [`FAILOVER_SPAN`].
pub const REPORTED_EVENT: &str = "mpib.failover.reported";

/// The tracer provider and its tracer.
pub struct Traces {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
}

impl Traces {
    /// Export to the OTLP `endpoint` (the base URL; over HTTP the spans go to
    /// `{endpoint}/v1/traces`) with `protocol`, batching for at most `delay`. Call inside a
    /// Tokio runtime. `host` and `pid` (the collector's) go into the resource.
    ///
    /// # Errors
    ///
    /// The exporter cannot be built (for example an invalid endpoint URI, or no runtime).
    pub fn new(
        endpoint: &str,
        protocol: Protocol,
        delay: Duration,
        host: &str,
    ) -> Result<Traces, String> {
        let built = match protocol {
            Protocol::Grpc => SpanExporter::builder()
                .with_tonic()
                .with_protocol(opentelemetry_otlp::Protocol::Grpc)
                .with_endpoint(endpoint)
                .with_timeout(EXPORT_TIMEOUT)
                .build(),
            Protocol::HttpProtobuf => SpanExporter::builder()
                .with_http()
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .with_endpoint(signal_url(endpoint, "v1/traces"))
                .with_timeout(EXPORT_TIMEOUT)
                .with_http_client(RuntimeHttpClient::new()?)
                .build(),
        };
        let exporter = built.map_err(|e| format!("OTLP exporter for {endpoint}: {e}"))?;
        let config = BatchConfigBuilder::default()
            .with_scheduled_delay(delay)
            .build();
        let processor = BatchSpanProcessor::builder(exporter)
            .with_batch_config(config)
            .build();
        let resource = Resource::builder()
            .with_service_name(SERVICE_NAME)
            .with_attributes([
                KeyValue::new("host.name", host.to_owned()),
                KeyValue::new("process.pid", i64::from(std::process::id())),
            ])
            .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_resource(resource)
            .build();
        let tracer = provider.tracer(SERVICE_NAME);
        Ok(Traces { provider, tracer })
    }

    /// The tracer (also handed to the `tracing` layer).
    pub fn tracer(&self) -> &SdkTracer {
        &self.tracer
    }

    /// Emit the spans of one event record from the writer described by `info`. Returns false
    /// (and emits nothing) when the record has no timestamps.
    pub fn emit(&self, info: &FileInfo, record: &SlowTransferRecord) -> bool {
        if let Some(failover) = FailoverEvent::of(&record.transfer) {
            return self.emit_failover(info, &failover);
        }
        let t = &record.transfer;
        let rails = active_rails(t);
        let Some((start, end)) = extent(t) else {
            return false;
        };
        let parent = self
            .tracer
            .span_builder(SLOW_SPAN)
            .with_kind(SpanKind::Internal)
            .with_start_time(time(start))
            .with_attributes(parent_attributes(info, t))
            .start(&self.tracer);
        let cx = Context::new().with_span(parent);
        for r in rails {
            let mut child = self
                .tracer
                .span_builder(RAIL_SPAN)
                .with_kind(SpanKind::Internal)
                .with_start_time(time(t.post_ns[r]))
                .with_attributes(rail_attributes(info, t, r))
                .start_with_context(&self.tracer, &cx);
            child.end_with_timestamp(time(t.done_ns[r].max(t.post_ns[r])));
        }
        cx.span().end_with_timestamp(time(end));
        true
    }

    /// Emit the span of one failover (`false`, nothing emitted, without a detection time).
    fn emit_failover(&self, info: &FileInfo, failover: &FailoverEvent) -> bool {
        if failover.detected_ns == 0 {
            return false;
        }
        let start = failover.detected_ns;
        let reported = failover.reported_ns.max(start);
        let end = failover.resumed_ns.max(reported);
        let event = opentelemetry::trace::Event::new(REPORTED_EVENT, time(reported), Vec::new(), 0);
        let mut span = self
            .tracer
            .span_builder(FAILOVER_SPAN)
            .with_kind(SpanKind::Internal)
            .with_start_time(time(start))
            .with_attributes(failover_attributes(info, failover))
            .with_events(vec![event])
            .start(&self.tracer);
        span.end_with_timestamp(time(end));
        true
    }

    /// Flush and stop (blocking: call from a blocking thread).
    ///
    /// # Errors
    ///
    /// The SDK's shutdown error, as text.
    pub fn shutdown(&self) -> Result<(), String> {
        self.provider.shutdown().map_err(|e| e.to_string())
    }
}

/// The hyper client of `opentelemetry-http`, with each request run on the Tokio runtime the
/// exporter was built in: the SDK's batch processor exports from its own thread, outside any
/// runtime, where hyper (and its timeout) cannot run.
#[derive(Debug)]
pub struct RuntimeHttpClient {
    client: HyperClient,
    runtime: Handle,
}

impl RuntimeHttpClient {
    /// A client bound to the current runtime.
    ///
    /// # Errors
    ///
    /// Called outside a Tokio runtime.
    pub fn new() -> Result<RuntimeHttpClient, String> {
        let runtime = Handle::try_current()
            .map_err(|e| format!("the OTLP/HTTP exporter needs a Tokio runtime: {e}"))?;
        Ok(RuntimeHttpClient {
            client: HyperClient::with_default_connector(EXPORT_TIMEOUT, None),
            runtime,
        })
    }
}

#[async_trait]
impl HttpClient for RuntimeHttpClient {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let client = self.client.clone();
        let task = self
            .runtime
            .spawn(async move { client.send_bytes(request).await });
        task.await?
    }
}

pub use mpib_node::transfers::{active_rails, extent};

fn time(ns: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(ns)
}

fn int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// `"slow"`, `"sampled"` or `"kind-N"`.
pub fn kind_name(kind: EventKind) -> String {
    match kind {
        EventKind::SLOW => "slow".to_owned(),
        EventKind::SAMPLED => "sampled".to_owned(),
        EventKind::FAILOVER => "failover".to_owned(),
        EventKind(other) => format!("kind-{other}"),
    }
}

/// `"send"`, `"recv"` or `"unknown-N"`.
pub fn direction_name(direction: Direction) -> String {
    match direction {
        Direction::Send => "send".to_owned(),
        Direction::Recv => "recv".to_owned(),
        Direction::Unknown(code) => format!("unknown-{code}"),
    }
}

/// A count NCCL said, -1 when it said nothing or said it is undefined.
fn count(operation: &mpib_probes::Operation, n: i32) -> i64 {
    if operation.is_known() && n >= 0 {
        i64::from(n)
    } else {
        -1
    }
}

fn parent_attributes(info: &FileInfo, t: &SlowTransfer) -> Vec<KeyValue> {
    let conn = if t.conn_index == NO_CONNECTION {
        -1
    } else {
        i64::from(t.conn_index)
    };
    vec![
        KeyValue::new("mpib.size", int(t.size)),
        KeyValue::new("mpib.rail_mask", i64::from(t.rail_mask)),
        KeyValue::new("mpib.sup_bw", i64::from(t.sup_bw)),
        KeyValue::new("mpib.slot", i64::from(t.slot)),
        KeyValue::new("mpib.peer", t.peer.to_string()),
        KeyValue::new("mpib.direction", direction_name(t.direction)),
        KeyValue::new("mpib.conn_index", conn),
        KeyValue::new("mpib.kind", kind_name(t.kind)),
        KeyValue::new(
            "mpib.nccl_device",
            crate::process::device_name(info, t.device),
        ),
        KeyValue::new("mpib.host", info.host.clone()),
        KeyValue::new("mpib.pid", i64::from(info.pid)),
        // What NCCL said the transfer served (`setNetAttr`; "none" before ABI v11).
        KeyValue::new("mpib.nccl.function", t.operation.function_label()),
        KeyValue::new("mpib.nccl.algorithm", t.operation.algorithm_label()),
        KeyValue::new("mpib.nccl.protocol", t.operation.protocol_label()),
        KeyValue::new("mpib.nccl.peers", count(&t.operation, t.operation.peers)),
        KeyValue::new(
            "mpib.nccl.flows_per_peer",
            count(&t.operation, t.operation.flows_per_peer),
        ),
    ]
}

fn failover_attributes(info: &FileInfo, f: &FailoverEvent) -> Vec<KeyValue> {
    let conn = if f.conn_index == NO_CONNECTION {
        -1
    } else {
        i64::from(f.conn_index)
    };
    let rail = f.rail.min(MAX_RAILS - 1);
    let (device, port) = nic_of(info, f.device, rail);
    vec![
        KeyValue::new("mpib.rail", RAIL_NAMES[rail]),
        KeyValue::new("mpib.device", device),
        KeyValue::new("mpib.port", i64::from(port)),
        KeyValue::new("mpib.direction", direction_name(f.direction)),
        KeyValue::new("mpib.peer", f.peer.to_string()),
        KeyValue::new("mpib.conn_index", conn),
        KeyValue::new("mpib.epoch", i64::from(f.epoch)),
        KeyValue::new("mpib.replayed_transfers", int(f.replayed_transfers)),
        KeyValue::new("mpib.replayed_bytes", int(f.replayed_bytes)),
        KeyValue::new(
            "mpib.nccl_device",
            crate::process::device_name(info, f.device),
        ),
        KeyValue::new("mpib.host", info.host.clone()),
        KeyValue::new("mpib.pid", i64::from(info.pid)),
    ]
}

/// The NIC (its device name and port) of fused device `device` on rail `r`.
fn nic_of(info: &FileInfo, device: u8, r: usize) -> (String, u32) {
    let nic = info
        .devices
        .get(usize::from(device))
        .map_or(r, |device| device.nics[r]);
    info.rails
        .get(nic)
        .map_or((String::new(), 0), |rail| (rail.device.clone(), rail.port))
}

fn rail_attributes(info: &FileInfo, t: &SlowTransfer, r: usize) -> Vec<KeyValue> {
    // The NIC that carried rail `r` of this transfer: its device's NIC on that rail.
    let (device, port) = nic_of(info, t.device, r);
    vec![
        KeyValue::new("mpib.rail", RAIL_NAMES[r]),
        KeyValue::new("mpib.rail_index", r as i64),
        KeyValue::new("mpib.bytes", int(t.rail_bytes[r])),
        KeyValue::new("mpib.qp_num", i64::from(t.qp_num[r])),
        KeyValue::new("mpib.device", device),
        KeyValue::new("mpib.port", i64::from(port)),
    ]
}
