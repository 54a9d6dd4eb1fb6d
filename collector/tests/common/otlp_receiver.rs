//! An in-test OTLP receiver for metrics and traces, over gRPC (tonic services) or HTTP/protobuf
//! (a small hyper server: `POST /v1/metrics`, `POST /v1/traces`). It runs on its own runtime
//! thread, so that blocking tests can use it; every request is kept in [`Received`].

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt as _, Full};
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use mpib_collector::otlp_metrics::Protocol;
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsPartialSuccess, ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tonic::transport::server::TcpIncoming;

/// What the receiver got, and how it answers.
#[derive(Clone)]
pub struct Received {
    pub metrics: Arc<Mutex<Vec<ExportMetricsServiceRequest>>>,
    pub traces: Arc<Mutex<Vec<ExportTraceServiceRequest>>>,
    /// HTTP status of the answers (a gRPC answer is `unavailable` unless it is 200).
    pub status: Arc<AtomicU16>,
    /// Data points reported rejected in a metrics answer's `partial_success` (0: none).
    pub rejected: Arc<Mutex<i64>>,
}

impl Default for Received {
    fn default() -> Self {
        Received {
            metrics: Arc::default(),
            traces: Arc::default(),
            status: Arc::new(AtomicU16::new(200)),
            rejected: Arc::default(),
        }
    }
}

impl Received {
    fn ok(&self) -> bool {
        self.status.load(Ordering::Relaxed) == 200
    }

    fn metrics_response(&self) -> ExportMetricsServiceResponse {
        let rejected = *self.rejected.lock().unwrap();
        ExportMetricsServiceResponse {
            partial_success: (rejected > 0).then(|| ExportMetricsPartialSuccess {
                rejected_data_points: rejected,
                error_message: "rejected by the test".into(),
            }),
        }
    }
}

#[tonic::async_trait]
impl MetricsService for Received {
    async fn export(
        &self,
        request: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        if !self.ok() {
            return Err(tonic::Status::unavailable("the test says no"));
        }
        self.metrics.lock().unwrap().push(request.into_inner());
        Ok(tonic::Response::new(self.metrics_response()))
    }
}

#[tonic::async_trait]
impl TraceService for Received {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        if !self.ok() {
            return Err(tonic::Status::unavailable("the test says no"));
        }
        self.traces.lock().unwrap().push(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// A running receiver; stopped on drop.
pub struct Receiver {
    /// Base URL to pass as `--otlp-endpoint`.
    pub endpoint: String,
    pub received: Received,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Receiver {
    /// Listen on 127.0.0.1:0 with `protocol`.
    pub fn start(protocol: Protocol) -> Receiver {
        let received = Received::default();
        let (stop, stopped) = oneshot::channel();
        let (addr_tx, addr_rx) = std::sync::mpsc::channel::<SocketAddr>();
        let state = received.clone();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
                addr_tx.send(listener.local_addr().unwrap()).unwrap();
                match protocol {
                    Protocol::Grpc => serve_grpc(listener, state, stopped).await,
                    Protocol::HttpProtobuf => serve_http(listener, state, stopped).await,
                }
            });
        });
        let addr = addr_rx.recv_timeout(Duration::from_secs(10)).unwrap();
        Receiver {
            endpoint: format!("http://{addr}"),
            received,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    pub fn metrics(&self) -> Vec<ExportMetricsServiceRequest> {
        self.received.metrics.lock().unwrap().clone()
    }

    pub fn traces(&self) -> Vec<ExportTraceServiceRequest> {
        self.received.traces.lock().unwrap().clone()
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<Span> {
        self.traces()
            .iter()
            .flat_map(|r| &r.resource_spans)
            .flat_map(|rs| &rs.scope_spans)
            .flat_map(|ss| ss.spans.clone())
            .collect()
    }

    /// Answer every later request with HTTP `status` (gRPC: `unavailable` unless 200).
    pub fn answer_with(&self, status: u16) {
        self.received.status.store(status, Ordering::Relaxed);
    }

    /// Wait (at most `limit`) until `check` accepts the metrics requests; returns them.
    pub fn wait_metrics(
        &self,
        limit: Duration,
        check: impl Fn(&[ExportMetricsServiceRequest]) -> bool,
    ) -> Option<Vec<ExportMetricsServiceRequest>> {
        let deadline = Instant::now() + limit;
        loop {
            let requests = self.metrics();
            if check(&requests) {
                return Some(requests);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Wait (at most `limit`) until at least `n` spans arrived; returns them all.
    pub fn wait_spans(&self, limit: Duration, n: usize) -> Vec<Span> {
        let deadline = Instant::now() + limit;
        loop {
            let spans = self.spans();
            if spans.len() >= n || Instant::now() > deadline {
                return spans;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn serve_grpc(listener: TcpListener, state: Received, stopped: oneshot::Receiver<()>) {
    tonic::transport::Server::builder()
        .add_service(MetricsServiceServer::new(state.clone()))
        .add_service(TraceServiceServer::new(state))
        .serve_with_incoming_shutdown(TcpIncoming::from(listener), async {
            let _ = stopped.await;
        })
        .await
        .unwrap();
}

async fn serve_http(listener: TcpListener, state: Received, mut stopped: oneshot::Receiver<()>) {
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let state = state.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req| handle(req, state.clone()));
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
            _ = &mut stopped => return,
        }
    }
}

fn answer(status: StatusCode, body: Vec<u8>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/x-protobuf"),
    );
    response
}

async fn handle(
    request: Request<Incoming>,
    state: Received,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let is_protobuf = request
        .headers()
        .get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes() == b"application/x-protobuf");
    let route = (request.method().clone(), request.uri().path().to_owned());
    let Ok(body) = request.into_body().collect().await.map(|b| b.to_bytes()) else {
        return Ok(answer(StatusCode::BAD_REQUEST, b"unreadable body".to_vec()));
    };
    if !is_protobuf {
        return Ok(answer(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            b"not application/x-protobuf".to_vec(),
        ));
    }
    let status = StatusCode::from_u16(state.status.load(Ordering::Relaxed)).unwrap();
    if status != StatusCode::OK {
        return Ok(answer(status, b"the test says no".to_vec()));
    }
    let response = match route {
        (Method::POST, path) if path == "/v1/metrics" => {
            let Ok(decoded) = ExportMetricsServiceRequest::decode(body) else {
                return Ok(answer(StatusCode::BAD_REQUEST, b"bad protobuf".to_vec()));
            };
            state.metrics.lock().unwrap().push(decoded);
            state.metrics_response().encode_to_vec()
        }
        (Method::POST, path) if path == "/v1/traces" => {
            let Ok(decoded) = ExportTraceServiceRequest::decode(body) else {
                return Ok(answer(StatusCode::BAD_REQUEST, b"bad protobuf".to_vec()));
            };
            state.traces.lock().unwrap().push(decoded);
            ExportTraceServiceResponse::default().encode_to_vec()
        }
        _ => return Ok(answer(StatusCode::NOT_FOUND, b"no such path".to_vec())),
    };
    Ok(answer(StatusCode::OK, response))
}
