//! Command line and environment: flags override environment variables, which override the
//! defaults. Parsing is a pure function of the arguments and an environment lookup, so it is
//! tested without touching the process environment.

use std::collections::BTreeSet;
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::otlp_metrics::Protocol;

/// Everything the collector needs to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Directory scanned for `*.probes` files.
    pub probes_dir: PathBuf,
    /// Time between scans.
    pub interval: Duration,
    /// A writer whose pid is gone and whose heartbeat is older than this is reaped.
    pub stale_after: Duration,
    /// Address of the `/metrics` endpoint.
    pub listen: SocketAddr,
    /// OTLP endpoint (base URL) for slow-transfer traces and metrics; `None` = OTLP off.
    pub otlp_endpoint: Option<String>,
    /// OTLP transport for both signals.
    pub otlp_protocol: Protocol,
    /// Which signals go to the OTLP endpoint.
    pub otlp_signals: Signals,
    /// Time between OTLP metrics exports.
    pub otlp_metrics_interval: Duration,
    /// The agent's hint file (advanced mode).
    pub hint_path: PathBuf,
    /// Root of sysfs (`/sys`); tests point it at a fake tree.
    pub sysfs_root: PathBuf,
    /// Owners whose probes files may be exported; `None` = any owner (the other trust checks
    /// still apply: docs/SECURITY.md).
    pub allowed_uids: Option<BTreeSet<u32>>,
    /// Connection label sets of each process exported one by one; the rest only in the
    /// per-peer sums (src/connections.rs).
    pub connection_series: usize,
    /// Scan and export once, print the Prometheus text to stdout and exit.
    pub once: bool,
}

/// The default of `--connection-series`: a job of a few nodes lists every connection, and a
/// node of 8 processes exports at most 8 x 128 label sets of them (docs/OBSERVABILITY.md, "How
/// many series").
pub const DEFAULT_CONNECTION_SERIES: usize = 128;

/// The most `--connection-series` accepts.
const MAX_CONNECTION_SERIES: usize = 16_384;

impl Default for Config {
    fn default() -> Self {
        Config {
            probes_dir: PathBuf::from("/dev/shm/mpib"),
            interval: Duration::from_millis(1000),
            stale_after: mpib_node::files::STALE_AFTER,
            listen: SocketAddr::from(([127, 0, 0, 1], 9464)),
            otlp_endpoint: None,
            otlp_protocol: Protocol::Grpc,
            otlp_signals: Signals::default(),
            otlp_metrics_interval: Duration::from_millis(10_000),
            hint_path: PathBuf::from("/tmp/mpib/hints"),
            sysfs_root: PathBuf::from("/sys"),
            allowed_uids: None,
            connection_series: DEFAULT_CONNECTION_SERIES,
            once: false,
        }
    }
}

impl Config {
    /// The OTLP endpoint when traces are sent to it.
    pub fn traces_endpoint(&self) -> Option<&str> {
        self.otlp_endpoint
            .as_deref()
            .filter(|_| self.otlp_signals.traces)
    }

    /// The OTLP endpoint when metrics are sent to it.
    pub fn metrics_endpoint(&self) -> Option<&str> {
        self.otlp_endpoint
            .as_deref()
            .filter(|_| self.otlp_signals.metrics)
    }
}

/// The OTLP signals sent to the endpoint, each on or off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Signals {
    /// Slow transfers as spans.
    pub traces: bool,
    /// Every scan's series as metrics.
    pub metrics: bool,
}

impl Default for Signals {
    fn default() -> Self {
        Signals {
            traces: true,
            metrics: true,
        }
    }
}

impl Signals {
    /// A comma-separated list of `traces` and `metrics`, or `none`.
    ///
    /// # Errors
    ///
    /// Any other entry (or an empty list), named in the message.
    pub fn parse(value: &str) -> Result<Signals, String> {
        let accepted = "accepted: traces, metrics, traces,metrics or none";
        if value.trim() == "none" {
            return Ok(Signals {
                traces: false,
                metrics: false,
            });
        }
        let mut signals = Signals {
            traces: false,
            metrics: false,
        };
        for entry in value.split(',').map(str::trim) {
            match entry {
                "traces" => signals.traces = true,
                "metrics" => signals.metrics = true,
                other => return Err(format!("unknown OTLP signal '{other}' ({accepted})")),
            }
        }
        Ok(signals)
    }
}

/// What the command line asks for.
// Made once per run and matched at once: the size of `Run` costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Run the collector.
    Run(Config),
    /// Print [`help_text`] and exit 0.
    Help,
    /// Print the version and exit 0.
    Version,
}

/// A command line or environment value the collector cannot use (exit status 2).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

/// The `--help` text: every flag, its environment variable and its default.
pub fn help_text() -> String {
    format!(
        "mpib-collector {} - export MPIB probes files to Prometheus and OTLP

The MPIB plugin writes one probes file per process (per-rail counters, connections,
slow-transfer events) into shared memory. This sidecar maps them read-only and serves
them as Prometheus metrics; with an OTLP endpoint it also sends each slow transfer as a
trace (one span, one child span per rail) and pushes the same metrics as OTLP. Flags
override environment variables.

USAGE:
    mpib-collector [OPTIONS]

OPTIONS:
    --probes-dir <DIR>       Directory scanned for *.probes files. The plugin writes them
                             under the same variable. [env: MPIB_PROBES_DIR]
                             [default: /dev/shm/mpib]
    --interval-ms <MS>       Milliseconds between scans (1..=3600000); series of a writer
                             that went away disappear after 3 intervals.
                             [env: MPIB_COLLECTOR_INTERVAL_MS] [default: 1000]
    --stale-after <DUR>      A file whose writer pid is gone and whose heartbeat is older
                             than this is removed (reaped). Seconds, or with a unit:
                             500ms, 30s, 2m. [env: MPIB_COLLECTOR_STALE_AFTER] [default: 30s]
    --listen <ADDR>          Address of the Prometheus endpoint http://ADDR/metrics; port 0
                             picks a free port (printed on stdout).
                             [env: MPIB_COLLECTOR_LISTEN] [default: 127.0.0.1:9464]
    --otlp-endpoint <URL>    OTLP endpoint (base URL) for slow-transfer traces and
                             metrics: gRPC such as http://127.0.0.1:4317, HTTP such as
                             http://127.0.0.1:4318 (/v1/traces and /v1/metrics are added).
                             OTLP is off when unset.
                             [env: OTEL_EXPORTER_OTLP_ENDPOINT] [default: off]
    --otlp-protocol <P>      OTLP transport: grpc or http/protobuf.
                             [env: OTEL_EXPORTER_OTLP_PROTOCOL] [default: grpc]
    --otlp-signals <LIST>    Signals sent to the endpoint: traces, metrics,
                             traces,metrics or none. Metrics carry the Prometheus names
                             and labels. [env: MPIB_COLLECTOR_OTLP_SIGNALS]
                             [default: traces,metrics]
    --otlp-metrics-interval-ms <MS>
                             Milliseconds between OTLP metrics exports (100..=3600000);
                             each sends the last scan (cumulative values).
                             [env: OTEL_METRIC_EXPORT_INTERVAL] [default: 10000]
    --hint-path <PATH>       The agent's hint file; feeds mpib_connection_hint_sup_ratio
                             for advanced-mode connections (absent file: no metric).
                             [env: MPIB_HINT_PATH] [default: /tmp/mpib/hints]
    --sysfs <DIR>            The sysfs root, for the NICs' own counters
                             (<DIR>/class/infiniband/<dev>/ports/<port>/{{counters,hw_counters}}).
                             [env: MPIB_SYSFS] [default: /sys]
    --allowed-uids <LIST>    Export only probes files owned by these users: uids or user
                             names, comma-separated. Whatever the list, a file is exported
                             only when it is a regular file nobody but its owner may write,
                             owned by root or by the user of the live process it claims.
                             [env: MPIB_COLLECTOR_ALLOWED_UIDS] [default: any owner]
    --connection-series <N>  Connection label sets of each process exported one by one
                             (mpib_connection_*), 0..=16384; the process's later ones are
                             summed per device, peer host and direction only
                             (mpib_peer_*, which count every connection).
                             [env: MPIB_COLLECTOR_CONNECTION_SERIES] [default: 128]
    --once                   Scan once, print the Prometheus text to stdout, flush traces,
                             export the OTLP metrics once and exit (no HTTP endpoint).
    -h, --help               Print this help and exit.
    -V, --version            Print the version and exit.

LOGGING:
    Logs go to stderr; RUST_LOG sets the filter (default: info).

EXIT STATUS:
    0 on success or after SIGINT/SIGTERM, 1 on a runtime failure (such as an address in
    use), 2 on a bad flag or environment value.
",
        env!("CARGO_PKG_VERSION")
    )
}

#[derive(Clone, Copy)]
enum Opt {
    ProbesDir,
    IntervalMs,
    StaleAfter,
    Listen,
    OtlpEndpoint,
    OtlpProtocol,
    OtlpSignals,
    OtlpMetricsInterval,
    HintPath,
    SysfsRoot,
    AllowedUids,
    ConnectionSeries,
}

const OPTIONS: [(&str, &str, Opt); 12] = [
    ("--probes-dir", "MPIB_PROBES_DIR", Opt::ProbesDir),
    (
        "--interval-ms",
        "MPIB_COLLECTOR_INTERVAL_MS",
        Opt::IntervalMs,
    ),
    (
        "--stale-after",
        "MPIB_COLLECTOR_STALE_AFTER",
        Opt::StaleAfter,
    ),
    ("--listen", "MPIB_COLLECTOR_LISTEN", Opt::Listen),
    (
        "--otlp-endpoint",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        Opt::OtlpEndpoint,
    ),
    (
        "--otlp-protocol",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
        Opt::OtlpProtocol,
    ),
    (
        "--otlp-signals",
        "MPIB_COLLECTOR_OTLP_SIGNALS",
        Opt::OtlpSignals,
    ),
    (
        "--otlp-metrics-interval-ms",
        "OTEL_METRIC_EXPORT_INTERVAL",
        Opt::OtlpMetricsInterval,
    ),
    ("--hint-path", "MPIB_HINT_PATH", Opt::HintPath),
    ("--sysfs", "MPIB_SYSFS", Opt::SysfsRoot),
    (
        "--allowed-uids",
        "MPIB_COLLECTOR_ALLOWED_UIDS",
        Opt::AllowedUids,
    ),
    (
        "--connection-series",
        "MPIB_COLLECTOR_CONNECTION_SERIES",
        Opt::ConnectionSeries,
    ),
];

/// Parse `args` (without the program name), reading unset options from `env`.
///
/// # Errors
///
/// An unknown flag, a missing or invalid value, or an invalid environment value.
pub fn parse<I, E>(args: I, env: E) -> Result<Command, ConfigError>
where
    I: IntoIterator<Item = String>,
    E: Fn(&str) -> Option<String>,
{
    let mut config = Config::default();
    if env("MPIB_SYSFS_ROOT").is_some() {
        mpib_node::sysfs::refuse_old_name("MPIB_SYSFS_ROOT").map_err(ConfigError)?;
    }
    for (_, var, opt) in OPTIONS {
        if let Some(value) = env(var).filter(|v| !v.is_empty()) {
            apply(&mut config, opt, &value).map_err(|e| ConfigError(format!("{var}: {e}")))?;
        }
    }
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "-h" | "--help" => return Ok(Command::Help),
            "-V" | "--version" => return Ok(Command::Version),
            "--once" => {
                config.once = true;
                continue;
            }
            _ => {}
        }
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) => (flag.to_owned(), Some(value.to_owned())),
            None => (arg.clone(), None),
        };
        mpib_node::sysfs::refuse_old_name(&flag).map_err(ConfigError)?;
        let Some((name, _, opt)) = OPTIONS.iter().find(|(name, _, _)| *name == flag) else {
            return Err(ConfigError(format!("unknown option '{arg}'")));
        };
        let value = match inline.or_else(|| args.next()) {
            Some(value) => value,
            None => return Err(ConfigError(format!("{name} needs a value"))),
        };
        apply(&mut config, *opt, &value).map_err(|e| ConfigError(format!("{name}: {e}")))?;
    }
    Ok(Command::Run(config))
}

fn apply(config: &mut Config, opt: Opt, value: &str) -> Result<(), String> {
    match opt {
        Opt::ProbesDir => config.probes_dir = PathBuf::from(value),
        Opt::IntervalMs => config.interval = parse_ms(value, 1)?,
        Opt::StaleAfter => config.stale_after = parse_duration(value)?,
        Opt::Listen => {
            config.listen = value
                .parse()
                .map_err(|_| format!("'{value}' is not an address like 127.0.0.1:9464"))?;
        }
        Opt::OtlpEndpoint => config.otlp_endpoint = Some(value.to_owned()),
        Opt::OtlpProtocol => config.otlp_protocol = Protocol::parse(value)?,
        Opt::OtlpSignals => config.otlp_signals = Signals::parse(value)?,
        Opt::OtlpMetricsInterval => config.otlp_metrics_interval = parse_ms(value, 100)?,
        Opt::HintPath => config.hint_path = PathBuf::from(value),
        Opt::SysfsRoot => config.sysfs_root = PathBuf::from(value),
        Opt::AllowedUids => config.allowed_uids = Some(crate::trust::parse_uids(value)?),
        Opt::ConnectionSeries => {
            let bad =
                || format!("'{value}' is not a number of series in 0..={MAX_CONNECTION_SERIES}");
            let n: usize = value.parse().map_err(|_| bad())?;
            if n > MAX_CONNECTION_SERIES {
                return Err(bad());
            }
            config.connection_series = n;
        }
    }
    Ok(())
}

/// Milliseconds in `min..=3600000`.
fn parse_ms(value: &str, min: u64) -> Result<Duration, String> {
    let ms: u64 = value
        .parse()
        .map_err(|_| format!("'{value}' is not a number of milliseconds"))?;
    if !(min..=3_600_000).contains(&ms) {
        return Err(format!("{ms} ms is outside {min}..=3600000"));
    }
    Ok(Duration::from_millis(ms))
}

/// `30`, `30s`, `500ms` or `2m`.
fn parse_duration(value: &str) -> Result<Duration, String> {
    let bad = || format!("'{value}' is not a duration like 30s, 500ms or 2m");
    let (number, scale_ms) = if let Some(n) = value.strip_suffix("ms") {
        (n, 1)
    } else if let Some(n) = value.strip_suffix('s') {
        (n, 1000)
    } else if let Some(n) = value.strip_suffix('m') {
        (n, 60_000)
    } else {
        (value, 1000)
    };
    let n: u64 = number.trim().parse().map_err(|_| bad())?;
    n.checked_mul(scale_ms)
        .map(Duration::from_millis)
        .ok_or_else(bad)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn run(args: &[&str], env: &[(&str, &str)]) -> Result<Command, ConfigError> {
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        parse(args.iter().map(|s| s.to_string()), |k| {
            env.iter()
                .find(|(name, _)| name == k)
                .map(|(_, v)| v.clone())
        })
    }

    #[test]
    fn defaults() {
        assert_eq!(run(&[], &[]).unwrap(), Command::Run(Config::default()));
    }

    #[test]
    fn the_sysfs_root_has_one_name_and_the_old_ones_are_refused() {
        match run(&["--sysfs", "/fake"], &[]).unwrap() {
            Command::Run(config) => assert_eq!(config.sysfs_root, PathBuf::from("/fake")),
            other => panic!("{other:?}"),
        }
        match run(&[], &[("MPIB_SYSFS", "/env")]).unwrap() {
            Command::Run(config) => assert_eq!(config.sysfs_root, PathBuf::from("/env")),
            other => panic!("{other:?}"),
        }
        let flag = run(&["--sysfs-root", "/x"], &[]).unwrap_err().0;
        assert!(flag.contains("--sysfs DIR"), "{flag}");
        let variable = run(&[], &[("MPIB_SYSFS_ROOT", "/x")]).unwrap_err().0;
        assert!(variable.contains("MPIB_SYSFS names"), "{variable}");
    }

    #[test]
    fn flags_override_env() {
        let env = [
            ("MPIB_PROBES_DIR", "/e"),
            ("MPIB_COLLECTOR_INTERVAL_MS", "50"),
        ];
        let Command::Run(c) = run(&["--probes-dir", "/f", "--once"], &env).unwrap() else {
            panic!("not run")
        };
        assert_eq!(c.probes_dir, PathBuf::from("/f"));
        assert_eq!(c.interval, Duration::from_millis(50));
        assert!(c.once);
        let Command::Run(c) = run(&["--stale-after=500ms", "--listen=0.0.0.0:1"], &[]).unwrap()
        else {
            panic!("not run")
        };
        assert_eq!(c.stale_after, Duration::from_millis(500));
        assert_eq!(c.listen.port(), 1);
    }

    #[test]
    fn errors_name_the_problem() {
        let e = run(&["--bogus"], &[]).unwrap_err().0;
        assert!(e.contains("unknown option '--bogus'"), "{e}");
        let e = run(&["--interval-ms"], &[]).unwrap_err().0;
        assert!(e.contains("needs a value"), "{e}");
        let e = run(&["--interval-ms", "0"], &[]).unwrap_err().0;
        assert!(e.contains("outside"), "{e}");
        let e = run(&[], &[("MPIB_COLLECTOR_STALE_AFTER", "soon")])
            .unwrap_err()
            .0;
        assert!(e.starts_with("MPIB_COLLECTOR_STALE_AFTER"), "{e}");
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("7").unwrap(), Duration::from_secs(7));
    }

    #[test]
    fn otlp_options() {
        let Command::Run(c) = run(&[], &[]).unwrap() else {
            panic!("not run")
        };
        assert_eq!(c.otlp_protocol, Protocol::Grpc);
        assert_eq!(c.otlp_signals, Signals::default());
        assert_eq!(c.otlp_metrics_interval, Duration::from_secs(10));
        assert_eq!((c.traces_endpoint(), c.metrics_endpoint()), (None, None));
        let env = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://e:4318"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("MPIB_COLLECTOR_OTLP_SIGNALS", "metrics"),
            ("OTEL_METRIC_EXPORT_INTERVAL", "250"),
        ];
        let Command::Run(c) = run(&[], &env).unwrap() else {
            panic!("not run")
        };
        assert_eq!(c.otlp_protocol, Protocol::HttpProtobuf);
        assert_eq!(c.otlp_metrics_interval, Duration::from_millis(250));
        assert_eq!(c.traces_endpoint(), None);
        assert_eq!(c.metrics_endpoint(), Some("http://e:4318"));
        let args = ["--otlp-protocol=grpc", "--otlp-signals", "traces"];
        let Command::Run(c) = run(&args, &env).unwrap() else {
            panic!("not run")
        };
        assert_eq!(c.otlp_protocol, Protocol::Grpc);
        assert_eq!(c.traces_endpoint(), Some("http://e:4318"));
        assert_eq!(c.metrics_endpoint(), None);
        let Command::Run(c) = run(&["--otlp-signals", "none"], &env).unwrap() else {
            panic!("not run")
        };
        assert_eq!((c.traces_endpoint(), c.metrics_endpoint()), (None, None));
    }

    #[test]
    fn otlp_errors_name_the_value() {
        let e = run(&["--otlp-protocol", "http/json"], &[]).unwrap_err().0;
        assert!(
            e.starts_with("--otlp-protocol") && e.contains("'http/json'"),
            "{e}"
        );
        assert!(e.contains("grpc, http/protobuf"), "{e}");
        let e = run(&[], &[("MPIB_COLLECTOR_OTLP_SIGNALS", "logs")])
            .unwrap_err()
            .0;
        assert!(
            e.starts_with("MPIB_COLLECTOR_OTLP_SIGNALS") && e.contains("'logs'"),
            "{e}"
        );
        let e = run(&["--otlp-signals", "traces,"], &[]).unwrap_err().0;
        assert!(e.contains("''"), "{e}");
        let e = run(&["--otlp-metrics-interval-ms", "99"], &[])
            .unwrap_err()
            .0;
        assert!(e.contains("outside 100..=3600000"), "{e}");
        assert_eq!(Signals::parse(" metrics , traces"), Ok(Signals::default()));
    }

    #[test]
    fn allowed_uids() {
        let Command::Run(c) = run(&["--allowed-uids", "root, 1001"], &[]).unwrap() else {
            panic!("not run")
        };
        assert_eq!(c.allowed_uids, Some(BTreeSet::from([0, 1001])));
        let env = [("MPIB_COLLECTOR_ALLOWED_UIDS", "7")];
        let Command::Run(c) = run(&[], &env).unwrap() else {
            panic!("not run")
        };
        assert_eq!(c.allowed_uids, Some(BTreeSet::from([7])));
        let e = run(&["--allowed-uids=nobody-mpib-x"], &[]).unwrap_err().0;
        assert!(
            e.starts_with("--allowed-uids") && e.contains("no user named \"nobody-mpib-x\""),
            "{e}"
        );
        let e = run(&[], &[("MPIB_COLLECTOR_ALLOWED_UIDS", "1,,2")])
            .unwrap_err()
            .0;
        assert!(e.starts_with("MPIB_COLLECTOR_ALLOWED_UIDS"), "{e}");
    }

    #[test]
    fn connection_series() {
        let Command::Run(c) = run(&["--connection-series", "0"], &[]).unwrap() else {
            panic!("not run")
        };
        assert_eq!(c.connection_series, 0);
        let env = [("MPIB_COLLECTOR_CONNECTION_SERIES", "4096")];
        let Command::Run(c) = run(&[], &env).unwrap() else {
            panic!("not run")
        };
        assert_eq!(c.connection_series, 4096);
        let e = run(&["--connection-series=16385"], &[]).unwrap_err().0;
        assert!(
            e.starts_with("--connection-series") && e.contains("'16385'"),
            "{e}"
        );
        let e = run(&[], &[("MPIB_COLLECTOR_CONNECTION_SERIES", "many")])
            .unwrap_err()
            .0;
        assert!(e.starts_with("MPIB_COLLECTOR_CONNECTION_SERIES"), "{e}");
    }

    #[test]
    fn help_names_every_flag_and_variable() {
        let help = help_text();
        for (flag, var, _) in OPTIONS {
            assert!(help.contains(flag) && help.contains(var), "{flag} {var}");
        }
        assert!(help.contains("--once") && help.contains("RUST_LOG"));
    }
}
