//! Command line and environment: flags override environment variables, which override the
//! defaults. Parsing is a pure function of the arguments and an environment lookup, so it is
//! tested without touching the process environment.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

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
    /// OTLP/gRPC endpoint for slow-transfer traces; `None` = traces off.
    pub otlp_endpoint: Option<String>,
    /// The agent's hint file (advanced mode).
    pub hint_path: PathBuf,
    /// Root of sysfs (`/sys`); tests point it at a fake tree.
    pub sysfs_root: PathBuf,
    /// Scan and export once, print the Prometheus text to stdout and exit.
    pub once: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            probes_dir: PathBuf::from("/dev/shm/mpib"),
            interval: Duration::from_millis(1000),
            stale_after: Duration::from_secs(30),
            listen: SocketAddr::from(([127, 0, 0, 1], 9464)),
            otlp_endpoint: None,
            hint_path: PathBuf::from("/tmp/mpib/hints"),
            sysfs_root: PathBuf::from("/sys"),
            once: false,
        }
    }
}

/// What the command line asks for.
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
trace (one span, one child span per rail). Flags override environment variables.

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
    --otlp-endpoint <URL>    OTLP/gRPC endpoint for slow-transfer traces, such as
                             http://127.0.0.1:4317. Traces are off when unset.
                             [env: OTEL_EXPORTER_OTLP_ENDPOINT] [default: off]
    --hint-path <PATH>       The agent's hint file; feeds mpib_connection_hint_sup_ratio
                             for advanced-mode connections (absent file: no metric).
                             [env: MPIB_HINT_PATH] [default: /tmp/mpib/hints]
    --sysfs-root <DIR>       Root of sysfs for the NICs' own counters
                             (<DIR>/class/infiniband/<dev>/ports/<port>/{{counters,hw_counters}}).
                             [env: MPIB_SYSFS_ROOT] [default: /sys]
    --once                   Scan once, print the Prometheus text to stdout, flush traces
                             and exit (no HTTP endpoint).
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
    HintPath,
    SysfsRoot,
}

const OPTIONS: [(&str, &str, Opt); 7] = [
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
    ("--hint-path", "MPIB_HINT_PATH", Opt::HintPath),
    ("--sysfs-root", "MPIB_SYSFS_ROOT", Opt::SysfsRoot),
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
        Opt::IntervalMs => {
            let ms: u64 = value
                .parse()
                .map_err(|_| format!("'{value}' is not a number of milliseconds"))?;
            if !(1..=3_600_000).contains(&ms) {
                return Err(format!("{ms} ms is outside 1..=3600000"));
            }
            config.interval = Duration::from_millis(ms);
        }
        Opt::StaleAfter => config.stale_after = parse_duration(value)?,
        Opt::Listen => {
            config.listen = value
                .parse()
                .map_err(|_| format!("'{value}' is not an address like 127.0.0.1:9464"))?;
        }
        Opt::OtlpEndpoint => config.otlp_endpoint = Some(value.to_owned()),
        Opt::HintPath => config.hint_path = PathBuf::from(value),
        Opt::SysfsRoot => config.sysfs_root = PathBuf::from(value),
    }
    Ok(())
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
    fn help_names_every_flag_and_variable() {
        let help = help_text();
        for (flag, var, _) in OPTIONS {
            assert!(help.contains(flag) && help.contains(var), "{flag} {var}");
        }
        assert!(help.contains("--once") && help.contains("RUST_LOG"));
    }
}
