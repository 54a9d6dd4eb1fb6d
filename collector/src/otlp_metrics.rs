//! OTLP metrics: each scan's points ([`ScanPoints`]) pushed to an OTLP endpoint over gRPC or
//! HTTP/protobuf, with the Prometheus names and labels (conversion in [`request`]).
//!
//! [`MetricsExporter`] sends one request; [`Pusher`] is the periodic side: it skips a scan
//! already sent, logs a failure once per distinct error and logs the recovery; [`run`] is the
//! task that drives it until shutdown, then sends the last scan once more.

mod convert;

use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_client::MetricsServiceClient;
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsPartialSuccess, ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use prost::Message as _;
use tokio::sync::watch;
use tokio::time::MissedTickBehavior;
use tonic::transport::{Channel, Endpoint};
use tracing::{info, warn};

pub use convert::{request, COLLECTOR_SERVICE, SCOPE_NAME, WRITER_SERVICE};

use crate::export::Exporter;
use crate::points::ScanPoints;

/// Time one export may take, connection included.
pub const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);
/// Content type of an OTLP/HTTP protobuf body.
pub const PROTOBUF: &str = "application/x-protobuf";

/// The OTLP transport, as `OTEL_EXPORTER_OTLP_PROTOCOL` names it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Protocol {
    /// OTLP/gRPC (`grpc`), usually port 4317.
    #[default]
    Grpc,
    /// OTLP/HTTP with protobuf bodies (`http/protobuf`), usually port 4318.
    HttpProtobuf,
}

impl Protocol {
    /// The value accepted by [`Protocol::parse`].
    pub const fn as_str(self) -> &'static str {
        match self {
            Protocol::Grpc => "grpc",
            Protocol::HttpProtobuf => "http/protobuf",
        }
    }

    /// `grpc` or `http/protobuf`.
    ///
    /// # Errors
    ///
    /// Any other value, named in the message with the accepted ones.
    pub fn parse(value: &str) -> Result<Protocol, String> {
        match value {
            "grpc" => Ok(Protocol::Grpc),
            "http/protobuf" => Ok(Protocol::HttpProtobuf),
            other => Err(format!(
                "unknown OTLP protocol '{other}' (accepted: grpc, http/protobuf)"
            )),
        }
    }
}

/// `{endpoint}/{path}` without a doubled slash.
pub fn signal_url(endpoint: &str, path: &str) -> String {
    format!("{}/{path}", endpoint.trim_end_matches('/'))
}

enum Transport {
    Grpc(MetricsServiceClient<Channel>),
    Http {
        client: Box<Client<HttpConnector, Full<Bytes>>>,
        uri: Uri,
    },
}

/// Sends scans to one OTLP endpoint.
pub struct MetricsExporter {
    endpoint: String,
    transport: Transport,
}

impl MetricsExporter {
    /// An exporter to `endpoint` (the base URL: gRPC `http://host:4317`, HTTP
    /// `http://host:4318`, to which `/v1/metrics` is added). Nothing connects before the first
    /// export. Call inside a Tokio runtime.
    ///
    /// # Errors
    ///
    /// `endpoint` is not a usable URI.
    pub fn new(endpoint: &str, protocol: Protocol) -> Result<MetricsExporter, String> {
        let invalid = |e: &dyn std::fmt::Display| format!("OTLP endpoint '{endpoint}': {e}");
        let transport = match protocol {
            Protocol::Grpc => {
                let channel = Endpoint::from_shared(endpoint.to_owned())
                    .map_err(|e| invalid(&e))?
                    .connect_timeout(EXPORT_TIMEOUT)
                    .timeout(EXPORT_TIMEOUT)
                    .connect_lazy();
                Transport::Grpc(MetricsServiceClient::new(channel))
            }
            Protocol::HttpProtobuf => {
                let url = signal_url(endpoint, "v1/metrics");
                let uri: Uri = url.parse().map_err(|e| invalid(&e))?;
                if uri.scheme_str() != Some("http") {
                    return Err(invalid(&"only http:// is supported"));
                }
                let mut connector = HttpConnector::new();
                connector.set_connect_timeout(Some(EXPORT_TIMEOUT));
                let client = Box::new(Client::builder(TokioExecutor::new()).build(connector));
                Transport::Http { client, uri }
            }
        };
        Ok(MetricsExporter {
            endpoint: endpoint.to_owned(),
            transport,
        })
    }

    /// The endpoint as given.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Send `scan` (nothing when it has no points), within [`EXPORT_TIMEOUT`].
    ///
    /// # Errors
    ///
    /// The endpoint cannot be reached, did not answer in time, or answered with a gRPC error
    /// or a non-2xx HTTP status: the text names the endpoint and the status.
    pub async fn export(&self, scan: &ScanPoints, collector_host: &str) -> Result<(), String> {
        if scan.points.is_empty() {
            return Ok(());
        }
        let request = request(scan, collector_host);
        let sent = tokio::time::timeout(EXPORT_TIMEOUT, self.send(request)).await;
        let response = match sent {
            Ok(Ok(response)) => response,
            Ok(Err(e)) => return Err(format!("OTLP metrics to {}: {e}", self.endpoint)),
            Err(_) => {
                return Err(format!(
                    "OTLP metrics to {}: no answer within {} s",
                    self.endpoint,
                    EXPORT_TIMEOUT.as_secs()
                ))
            }
        };
        if let Some(partial) = response.partial_success {
            log_partial_success(&self.endpoint, &partial);
        }
        Ok(())
    }

    async fn send(
        &self,
        request: ExportMetricsServiceRequest,
    ) -> Result<ExportMetricsServiceResponse, String> {
        match &self.transport {
            Transport::Grpc(client) => {
                let mut client = client.clone();
                match client.export(request).await {
                    Ok(response) => Ok(response.into_inner()),
                    Err(status) => Err(format!(
                        "gRPC status {:?}: {}",
                        status.code(),
                        status.message()
                    )),
                }
            }
            Transport::Http { client, uri } => post(client, uri, &request).await,
        }
    }
}

async fn post(
    client: &Client<HttpConnector, Full<Bytes>>,
    uri: &Uri,
    request: &ExportMetricsServiceRequest,
) -> Result<ExportMetricsServiceResponse, String> {
    let mut http_request = Request::new(Full::new(Bytes::from(request.encode_to_vec())));
    *http_request.method_mut() = Method::POST;
    *http_request.uri_mut() = uri.clone();
    http_request
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(PROTOBUF));
    let response = client
        .request(http_request)
        .await
        .map_err(|e| format!("POST {uri}: {}", with_sources(&e)))?;
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("POST {uri}: HTTP {status}, body: {e}"))?
        .to_bytes();
    if !status.is_success() {
        let text = String::from_utf8_lossy(&body);
        let text: String = text.chars().take(200).collect();
        return Err(format!("POST {uri}: HTTP {status} {}", text.trim()));
    }
    // An empty or undecodable body is still a success: the status said so.
    Ok(ExportMetricsServiceResponse::decode(body).unwrap_or_default())
}

/// `e` followed by its sources (hyper's own text is only "client error (Connect)").
fn with_sources(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

fn log_partial_success(endpoint: &str, partial: &ExportMetricsPartialSuccess) {
    if partial.rejected_data_points > 0 || !partial.error_message.is_empty() {
        warn!(
            "OTLP metrics to {endpoint}: {} data points rejected: {}",
            partial.rejected_data_points, partial.error_message
        );
    }
}

/// What [`Pusher::push`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pushed {
    /// The scan was already sent, or has no points (before the first scan): nothing to do.
    Unchanged,
    /// Sent, and the endpoint accepted it.
    Sent,
    /// The export failed with this error.
    Failed(String),
}

/// The periodic exporter's state: the last scan sent and the error being reported.
pub struct Pusher {
    exporter: MetricsExporter,
    host: String,
    last_sent_ns: Option<u64>,
    failing: Option<String>,
}

impl Pusher {
    /// Push through `exporter`; `host` is the collector's host name (its own resource).
    pub fn new(exporter: MetricsExporter, host: String) -> Pusher {
        Pusher {
            exporter,
            host,
            last_sent_ns: None,
            failing: None,
        }
    }

    /// Send `scan` unless it was the last one sent (`force` sends it anyway). A failure is
    /// logged when its text differs from the previous one; the first success after failures
    /// logs the recovery.
    pub async fn push(&mut self, scan: &ScanPoints, force: bool) -> Pushed {
        // An empty scan (before the first one) proves nothing about the endpoint: not an export.
        let sent = !force && self.last_sent_ns == Some(scan.time_ns);
        if sent || scan.points.is_empty() {
            return Pushed::Unchanged;
        }
        match self.exporter.export(scan, &self.host).await {
            Ok(()) => {
                self.last_sent_ns = Some(scan.time_ns);
                if self.failing.take().is_some() {
                    info!(
                        "OTLP metrics to {}: exporting again",
                        self.exporter.endpoint()
                    );
                }
                Pushed::Sent
            }
            Err(e) => {
                if self.failing.as_deref() != Some(e.as_str()) {
                    warn!("{e} (reported once until it changes or recovers)");
                    self.failing = Some(e.clone());
                }
                Pushed::Failed(e)
            }
        }
    }

    /// The error being reported, if the last export failed.
    pub fn failing(&self) -> Option<&str> {
        self.failing.as_deref()
    }
}

/// Every `interval`, push the last finished scan of `source`; when `stop` turns true (or its
/// sender goes away), push the last scan once more and return.
pub async fn run(
    mut pusher: Pusher,
    source: Arc<Exporter>,
    interval: Duration,
    mut stop: watch::Receiver<bool>,
) {
    // The first export one interval after the start: the scan has run by then.
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        if *stop.borrow() {
            break;
        }
        tokio::select! {
            _ = ticker.tick() => {
                let pushed = pusher.push(&source.last_points(), false).await;
                source.count_otlp_export(&pushed);
            }
            changed = stop.changed() => {
                if changed.is_err() {
                    break;
                }
            }
        }
    }
    // The caller scanned once more before stopping: this sends that last scan (or retries an
    // unsent one), and skips one already sent.
    let pushed = pusher.push(&source.last_points(), false).await;
    source.count_otlp_export(&pushed);
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn protocols_parse_and_name_the_accepted_values() {
        assert_eq!(Protocol::parse("grpc"), Ok(Protocol::Grpc));
        assert_eq!(Protocol::parse("http/protobuf"), Ok(Protocol::HttpProtobuf));
        let e = Protocol::parse("http/json").unwrap_err();
        assert!(
            e.contains("'http/json'") && e.contains("grpc, http/protobuf"),
            "{e}"
        );
        for p in [Protocol::Grpc, Protocol::HttpProtobuf] {
            assert_eq!(Protocol::parse(p.as_str()), Ok(p));
        }
        assert_eq!(Protocol::default(), Protocol::Grpc);
    }

    #[test]
    fn signal_urls_have_one_slash() {
        assert_eq!(
            signal_url("http://h:4318", "v1/metrics"),
            "http://h:4318/v1/metrics"
        );
        assert_eq!(
            signal_url("http://h:4318/", "v1/traces"),
            "http://h:4318/v1/traces"
        );
    }

    #[tokio::test]
    async fn bad_endpoints_are_refused() {
        for protocol in [Protocol::Grpc, Protocol::HttpProtobuf] {
            let e = MetricsExporter::new("not a uri", protocol).err().unwrap();
            assert!(e.contains("'not a uri'"), "{e}");
        }
        let e = MetricsExporter::new("https://h:4318", Protocol::HttpProtobuf)
            .err()
            .unwrap();
        assert!(e.contains("only http://"), "{e}");
    }

    fn scan(time_ns: u64, with_point: bool) -> ScanPoints {
        use crate::catalog::{Kind, Unit};
        use crate::points::{Family, Point, Value};
        let family = Arc::new(Family {
            name: "mpib_probes_files".to_owned(),
            kind: Kind::Gauge,
            unit: Unit::Count,
            help: "files".to_owned(),
            labels: &["host"],
        });
        let points = with_point
            .then(|| Point {
                family,
                labels: vec![("host".to_owned(), "h".to_owned())],
                start_ns: 1,
                value: Value::Gauge(1.0),
            })
            .into_iter()
            .collect();
        ScanPoints { time_ns, points }
    }

    /// An endpoint that refuses connections (a port just released).
    fn closed_endpoint() -> String {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", listener.local_addr().unwrap())
    }

    #[tokio::test]
    async fn pusher_skips_sent_scans_and_reports_failures_once() {
        for protocol in [Protocol::Grpc, Protocol::HttpProtobuf] {
            let endpoint = closed_endpoint();
            let exporter = MetricsExporter::new(&endpoint, protocol).unwrap();
            let mut pusher = Pusher::new(exporter, "h".to_owned());
            let Pushed::Failed(e) = pusher.push(&scan(1, true), false).await else {
                panic!("{protocol:?}: sent to a closed port")
            };
            assert!(e.contains(&endpoint), "{e}");
            assert_eq!(pusher.failing(), Some(e.as_str()));
            // Not marked as sent: tried again next time.
            assert!(matches!(
                pusher.push(&scan(1, true), false).await,
                Pushed::Failed(_)
            ));
            // An empty scan sends nothing and is not an export: the failure is not over.
            assert_eq!(pusher.push(&scan(2, false), false).await, Pushed::Unchanged);
            assert_eq!(pusher.push(&scan(2, false), true).await, Pushed::Unchanged);
            assert_eq!(pusher.failing(), Some(e.as_str()));
        }
    }
}
