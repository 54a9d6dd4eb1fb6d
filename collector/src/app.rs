//! Running the collector: logging, the optional OTLP pipelines (traces, metrics), the scan
//! loop, the endpoint and a clean shutdown on SIGINT/SIGTERM (pending spans are flushed and
//! the last scan's metrics exported once more).

use std::io::Write as _;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;
use tracing::{error, info, warn, Level};
use tracing_subscriber::filter::{EnvFilter, Targets};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::Layer as _;

use crate::collector::{host_name, Collector};
use crate::config::Config;
use crate::export::Exporter;
use crate::otlp_metrics::{self, MetricsExporter, Pusher};
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

/// The OTLP pipelines the configuration asks for (built inside the runtime).
fn otlp(config: &Config) -> Result<(Option<Arc<Traces>>, Option<Pusher>), String> {
    let traces = match config.traces_endpoint() {
        Some(endpoint) => {
            let delay = config
                .interval
                .clamp(Duration::from_millis(100), Duration::from_secs(5));
            let traces = Traces::new(endpoint, config.otlp_protocol, delay, &host_name())?;
            Some(Arc::new(traces))
        }
        None => None,
    };
    let pusher = match config.metrics_endpoint() {
        Some(endpoint) => {
            let exporter = MetricsExporter::new(endpoint, config.otlp_protocol)?;
            Some(Pusher::new(exporter, host_name()))
        }
        None => None,
    };
    Ok((traces, pusher))
}

/// Start the periodic OTLP metrics export of `exporter`'s scans; it stops (after one last
/// export) when `stopped` turns true.
fn spawn_metrics(
    pusher: Option<Pusher>,
    exporter: Arc<Exporter>,
    config: &Config,
    stopped: watch::Receiver<bool>,
) -> Option<JoinHandle<()>> {
    let pusher = pusher?;
    info!(
        "exporting OTLP metrics ({}) to {} every {:?}",
        config.otlp_protocol.as_str(),
        config.otlp_endpoint.as_deref().unwrap_or_default(),
        config.otlp_metrics_interval
    );
    let interval = config.otlp_metrics_interval;
    Some(tokio::spawn(otlp_metrics::run(
        pusher, exporter, interval, stopped,
    )))
}

/// Run the collector until a signal (or after one pass with `--once`). Call inside a
/// multi-threaded Tokio runtime.
pub async fn run(config: Config) -> ExitCode {
    let (traces, pusher) = match otlp(&config) {
        Ok(pipelines) => pipelines,
        Err(e) => {
            eprintln!("mpib-collector: error: {e}");
            return ExitCode::from(1);
        }
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
        if let Some(mut pusher) = pusher {
            let exporter = collector.exporter();
            let pushed = pusher.push(&exporter.last_points(), false).await;
            exporter.count_otlp_export(&pushed);
        }
        shutdown_traces(traces).await;
        return match printed {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                error!("writing to stdout: {e}");
                ExitCode::from(1)
            }
        };
    }
    let code = serve_until_signal(&config, &mut collector, pusher).await;
    shutdown_traces(traces).await;
    code
}

async fn serve_until_signal(
    config: &Config,
    collector: &mut Collector,
    pusher: Option<Pusher>,
) -> ExitCode {
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
    let metrics = spawn_metrics(pusher, collector.exporter(), config, stopped.clone());
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
    if metrics.is_some() {
        // The last values, for the metrics task's final export.
        collector.scan();
    }
    let _ = stop.send(true);
    let _ = server.await;
    if let Some(metrics) = metrics {
        if let Err(e) = metrics.await {
            warn!("OTLP metrics task: {e}");
        }
    }
    ExitCode::SUCCESS
}
