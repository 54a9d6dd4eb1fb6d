//! The HTTP endpoint: `GET /metrics` serves the last published scan as Prometheus text
//! ([`crate::prometheus`]).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::{debug, warn};

use crate::export::Exporter;

pub use mpib_node::exposition::CONTENT_TYPE as TEXT_FORMAT;

/// Accept connections on `listener` until `shutdown` turns true.
pub async fn serve(
    listener: TcpListener,
    exporter: Arc<Exporter>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let exporter = Arc::clone(&exporter);
                    tokio::spawn(serve_connection(stream, exporter));
                }
                Err(e) => {
                    warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            _ = shutdown.changed() => break,
        }
    }
}

async fn serve_connection(stream: tokio::net::TcpStream, exporter: Arc<Exporter>) {
    let service = service_fn(move |request: Request<Incoming>| {
        let exporter = Arc::clone(&exporter);
        async move { Ok::<_, Infallible>(respond(&exporter, &request)) }
    });
    let served = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(10))
        .serve_connection(TokioIo::new(stream), service)
        .await;
    if let Err(e) = served {
        debug!("HTTP connection ended: {e}");
    }
}

fn respond(exporter: &Exporter, request: &Request<Incoming>) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match (request.method(), request.uri().path()) {
        (&Method::GET | &Method::HEAD, "/metrics") => {
            (StatusCode::OK, TEXT_FORMAT, exporter.render())
        }
        (&Method::GET | &Method::HEAD, "/") => (
            StatusCode::OK,
            "text/plain; charset=utf-8",
            "mpib-collector: metrics at /metrics\n".to_owned(),
        ),
        (&Method::GET | &Method::HEAD, _) => (
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "not found; metrics are at /metrics\n".to_owned(),
        ),
        _ => (
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain; charset=utf-8",
            "only GET and HEAD\n".to_owned(),
        ),
    };
    let body = if request.method() == Method::HEAD {
        String::new()
    } else {
        body
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}
