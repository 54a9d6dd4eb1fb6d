//! Running the collector: logging, the optional OTLP pipeline, the scan loop, the endpoint
//! and a clean shutdown on SIGINT/SIGTERM (pending spans are flushed).

use std::io::Write as _;
use std::process::ExitCode;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;
use tokio::time::MissedTickBehavior;
use tracing::{error, info, warn, Level};
use tracing_subscriber::filter::{EnvFilter, Targets};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::Layer as _;

use crate::collector::{host_name, Collector};
use crate::config::Config;
use crate::server;
use crate::traces::Traces;

/// Log to stderr (`RUST_LOG`, default `info`); with traces, also send the collector's own
/// INFO spans to OTLP, filtered to this crate so that the exporter's own gRPC/HTTP machinery
/// (h2, tonic, hyper) never traces itself into the pipeline.
fn init_logging(traces: Option<&Traces>) {
    let env = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_filter(env);
    let otel = traces.map(|t| {
        tracing_opentelemetry::layer()
            .with_tracer(t.tracer().clone())
            .with_filter(Targets::new().with_target("mpib_collector", Level::INFO))
    });
    let installed = tracing_subscriber::registry()
        .with(fmt)
        .with(otel)
        .try_init();
    if let Err(e) = installed {
        eprintln!("mpib-collector: logging not initialised: {e}");
    }
}

async fn shutdown_traces(traces: Option<Arc<Traces>>) {
    let Some(traces) = traces else { return };
    match tokio::task::spawn_blocking(move || traces.shutdown()).await {
        Ok(Ok(())) => info!("traces flushed"),
        Ok(Err(e)) => warn!("flushing traces: {e}"),
        Err(e) => warn!("flushing traces: {e}"),
    }
}

/// Run the collector until a signal (or after one pass with `--once`). Call inside a
/// multi-threaded Tokio runtime.
pub async fn run(config: Config) -> ExitCode {
    let traces = match &config.otlp_endpoint {
        Some(endpoint) => {
            let delay = config.interval.clamp(
                std::time::Duration::from_millis(100),
                std::time::Duration::from_secs(5),
            );
            match Traces::new(endpoint, delay, &host_name()) {
                Ok(traces) => Some(Arc::new(traces)),
                Err(e) => {
                    eprintln!("mpib-collector: error: {e}");
                    return ExitCode::from(1);
                }
            }
        }
        None => None,
    };
    init_logging(traces.as_deref());
    let mut collector = Collector::new(config.clone(), traces.clone());
    if config.once {
        collector.scan();
        let mut stdout = std::io::stdout().lock();
        let printed = stdout
            .write_all(collector.render().as_bytes())
            .and_then(|()| stdout.flush());
        drop(stdout);
        shutdown_traces(traces).await;
        return match printed {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                error!("writing to stdout: {e}");
                ExitCode::from(1)
            }
        };
    }
    let code = serve_until_signal(&config, &mut collector).await;
    shutdown_traces(traces).await;
    code
}

async fn serve_until_signal(config: &Config, collector: &mut Collector) -> ExitCode {
    let listener = match TcpListener::bind(config.listen).await {
        Ok(listener) => listener,
        Err(e) => {
            error!("cannot listen on {}: {e}", config.listen);
            return ExitCode::from(1);
        }
    };
    let (mut term, mut int) = match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(term), Ok(int)) => (term, int),
        (Err(e), _) | (_, Err(e)) => {
            error!("cannot install signal handlers: {e}");
            return ExitCode::from(1);
        }
    };
    let url = match listener.local_addr() {
        Ok(addr) => format!("http://{addr}/metrics"),
        Err(_) => format!("http://{}/metrics", config.listen),
    };
    println!("mpib-collector: serving {url}");
    let _ = std::io::stdout().flush();
    info!(
        "serving {url}; scanning {} every {:?}",
        config.probes_dir.display(),
        config.interval
    );
    let (stop, stopped) = watch::channel(false);
    let server = tokio::spawn(server::serve(listener, collector.exporter(), stopped));
    let mut ticker = tokio::time::interval(config.interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => collector.scan(),
            _ = term.recv() => { info!("SIGTERM: shutting down"); break; }
            _ = int.recv() => { info!("SIGINT: shutting down"); break; }
        }
    }
    let _ = stop.send(true);
    let _ = server.await;
    ExitCode::SUCCESS
}
