//! Command-line parsing: every bad value is refused with a message naming the flag and the value
//! (exit status 2), before anything is loaded.

use std::path::PathBuf;
use std::time::Duration;

use mpib_driver::Version;

use crate::sweep::{self, Sweep, MAX_SIZES};
use crate::Failure;

pub const USAGE: &str = "\
usage: mpib-perf [--plugin PATH] [--abi N] [--dev N[,N...]]
                 [--listen [ADDR:]PORT | --peer HOST:PORT]
                 [--min-size BYTES] [--max-size BYTES] [--step-factor F]
                 [--iters N] [--warmup N] [--window N] [--group N] [--verify]
                 [--sup-bw N[,N...]] [--repeat N] [--comms N] [--json | --csv]
                 [--timeout S]

  --plugin PATH      the ncclNet plugin to load (default: as NCCL does with NCCL_NET_PLUGIN,
                     libnccl-net-<NAME>.so found by the dynamic loader, or a path; without
                     NCCL_NET_PLUGIN: the MPIB plugin built in this checkout)
  --abi N            drive ncclNetPlugin_vN, 7..12 (default: the newest it exports)
  --dev LIST         the plugin's device (default 0); one process: a list (0,1,2,3) moves each
                     row on every listed device at once, one connection each (or --comms N,
                     a multiple of the count, dealt out in turn), and prints each device's
                     GB/s after the row
  --listen [A:]PORT  two processes: be the receiver; accept one TCP connection on A:PORT (port 0:
                     any free port; the bound address is printed), send it the listen handle
  --peer HOST:PORT   two processes: be the sender; connect to a --listen side, send it the sweep
  --min-size BYTES   first message size (default 8; suffixes K, M, G are powers of 1024)
  --max-size BYTES   last message size (default 256M)
  --step-factor F    next size = size * F (default 2)
  --iters N          timed iterations per size (default: about 256 MiB per size, 20..1000)
  --warmup N         untimed iterations before each size (default 5)
  --window N         requests in flight per direction (default 8, NCCL's NCCL_STEPS)
  --group N          buffers per irecv, 1..8; the sender does N isends per iteration (default 1)
  --verify           fill a pattern per message and check every byte on the receiver
  --sup-bw LIST      MPIB advanced mode: run a test agent and set the SUP share (parts per 1024,
                     0..1024) to each value in turn, one table block each
  --repeat N         N rows per size, one after the other (a time series: with MPIB_MODE=1 and
                     no --sup-bw, watch mpib-agent move the split; the at_ms column says when,
                     unix_ms the same on the wall clock, to line up several processes' rows)
  --comms N          one process: N connections (1..16), each row moved by all of them at
                     once; one row for all (bytes summed, the slowest one's time, both rails'
                     bytes summed over the connections)
  --json             one JSON object per row on stdout (the header goes to stderr)
  --csv              a CSV header line and one line per row on stdout (the header to stderr)
  --timeout S        bound on every wait: TCP handshake, connect/accept, one size (default 60)
  --help             this text

Exit status: 0 done, 1 a run failed (the message names the call, size and iteration), 2 bad
arguments or a library that is not a usable plugin.";

/// Most connections `--comms` runs at once.
pub const MAX_COMMS: usize = 16;

/// Which side(s) this process runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// Sender and receiver in this process.
    OneProcess,
    /// The receiver of two processes, accepting the peer at this `[ADDR:]PORT`.
    Listen(String),
    /// The sender of two processes, connecting to this `HOST:PORT`.
    Peer(String),
}

/// Output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// A table on stdout.
    Table,
    /// JSON lines on stdout.
    Json,
    /// CSV on stdout.
    Csv,
}

/// Everything the command line says.
#[derive(Clone, Debug)]
pub struct Args {
    pub plugin: Option<PathBuf>,
    pub abi: Option<u32>,
    pub dev: i32,
    /// `--dev` as listed (`dev` is the first).
    pub devs: Vec<i32>,
    pub role: Role,
    pub sweep: Sweep,
    pub format: Format,
    pub timeout: Duration,
    /// Sweep flags given to a `--listen` side (they come from the sender there).
    pub ignored: Vec<String>,
    /// Connections moving each row together (one process only).
    pub comms: usize,
}

/// `--help`, or a run.
pub enum Parsed {
    Help,
    Run(Box<Args>),
}

fn usage(message: String) -> Failure {
    Failure::Usage(format!("{message}\n(see mpib-perf --help)"))
}

/// Parses a byte count: digits with an optional K, M or G (powers of 1024; `KiB`, `k`, `KB` also
/// read as 1024).
pub fn parse_bytes(flag: &str, text: &str) -> Result<usize, Failure> {
    let bad = || {
        usage(format!(
            "{flag} {text:?}: expected a byte count like 8, 64K, 256M or 1G"
        ))
    };
    mpib_driver::units::parse_bytes(text).ok_or_else(bad)
}

fn parse_number<T: std::str::FromStr + PartialOrd + std::fmt::Display>(
    flag: &str,
    text: &str,
    min: T,
    max: T,
) -> Result<T, Failure> {
    match text.trim().parse::<T>() {
        Ok(v) if v >= min && v <= max => Ok(v),
        _ => Err(usage(format!(
            "{flag} {text:?}: expected an integer from {min} to {max}"
        ))),
    }
}

/// `--sup-bw 512` or `--sup-bw 0,512,1024`.
pub fn parse_splits(text: &str) -> Result<Vec<Option<u32>>, Failure> {
    text.split(',')
        .map(|part| {
            parse_number::<u32>("--sup-bw", part, 0, 1024)
                .map(Some)
                .map_err(|_| {
                    usage(format!(
                        "--sup-bw {text:?}: {part:?} is not a share from 0 to 1024 (parts per \
                         1024; a list is comma separated)"
                    ))
                })
        })
        .collect()
}

/// `--abi 12` or `--abi v12`; only the versions the driver knows.
fn parse_abi(text: &str) -> Result<u32, Failure> {
    let number = text.trim().trim_start_matches('v').parse::<u32>().ok();
    match number.and_then(Version::from_number) {
        Some(version) => Ok(version.number()),
        None => Err(usage(format!(
            "--abi {text:?}: mpib-perf drives ncclNetPlugin_v7 ... ncclNetPlugin_v12 (--abi 7 \
             ... 12){}",
            match number {
                Some(n) => format!("; ncclNetPlugin_v{n} is not one of them"),
                None => String::new(),
            }
        ))),
    }
}

fn seconds(text: &str) -> Result<Duration, Failure> {
    text.trim()
        .parse::<f64>()
        .ok()
        .filter(|s| *s > 0.0 && *s <= 86_400.0)
        .map(Duration::from_secs_f64)
        .ok_or_else(|| {
            usage(format!(
                "--timeout {text:?}: expected a number of seconds above 0 (at most 86400)"
            ))
        })
}

/// Flags that shape the sweep (a `--listen` side takes them from the sender instead).
const SWEEP_FLAGS: [&str; 12] = [
    "--min-size",
    "--max-size",
    "--step-factor",
    "--iters",
    "--warmup",
    "--window",
    "--group",
    "--verify",
    "--repeat",
    "--sup-bw",
    "--json",
    "--csv",
];

/// Values as given, before the sizes are expanded.
struct Raw {
    min: usize,
    max: usize,
    factor: f64,
}

/// Parses `args` (without the program name).
pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Parsed, Failure> {
    let mut a = Args {
        plugin: None,
        abi: None,
        dev: 0,
        devs: vec![0],
        role: Role::OneProcess,
        sweep: Sweep {
            sizes: Vec::new(),
            splits: vec![None],
            iters: None,
            warmup: 5,
            window: 8,
            group: 1,
            verify: false,
            repeat: 1,
        },
        format: Format::Table,
        timeout: Duration::from_secs(60),
        ignored: Vec::new(),
        comms: 1,
    };
    let mut raw = Raw {
        min: 8,
        max: 256 << 20,
        factor: 2.0,
    };
    let mut it = args.into_iter();
    while let Some(flag) = it.next() {
        if flag == "-h" || flag == "--help" {
            return Ok(Parsed::Help);
        }
        if SWEEP_FLAGS.contains(&flag.as_str()) {
            a.ignored.push(flag.clone());
        }
        let mut value = || {
            it.next()
                .ok_or_else(|| usage(format!("{flag} needs a value")))
        };
        apply(&mut a, &mut raw, &flag, &mut value)?;
    }
    finish(a, &raw).map(|a| Parsed::Run(Box::new(a)))
}

/// One flag.
fn apply(
    a: &mut Args,
    raw: &mut Raw,
    flag: &str,
    value: &mut dyn FnMut() -> Result<String, Failure>,
) -> Result<(), Failure> {
    let s = &mut a.sweep;
    match flag {
        "--plugin" => a.plugin = Some(PathBuf::from(value()?)),
        "--abi" => a.abi = Some(parse_abi(&value()?)?),
        "--dev" => {
            a.devs = parse_devices(&value()?)?;
            a.dev = a.devs[0];
        }
        "--listen" => set_role(&mut a.role, Role::Listen(value()?))?,
        "--peer" => set_role(&mut a.role, Role::Peer(value()?))?,
        "--min-size" => raw.min = parse_bytes(flag, &value()?)?,
        "--max-size" => raw.max = parse_bytes(flag, &value()?)?,
        "--step-factor" => {
            let text = value()?;
            raw.factor = text
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|f| f.is_finite() && *f > 1.0 && *f <= 1024.0)
                .ok_or_else(|| {
                    usage(format!(
                        "--step-factor {text:?}: expected a number above 1 (at most 1024)"
                    ))
                })?;
        }
        "--iters" => s.iters = Some(parse_number(flag, &value()?, 1, 100_000_000)?),
        "--warmup" => s.warmup = parse_number(flag, &value()?, 0, 100_000_000)?,
        "--window" => s.window = parse_number(flag, &value()?, 1, sweep::MAX_WINDOW)?,
        "--group" => s.group = parse_number(flag, &value()?, 1, 8)?,
        "--verify" => s.verify = true,
        "--repeat" => s.repeat = parse_number(flag, &value()?, 1, 100_000)?,
        "--sup-bw" => s.splits = parse_splits(&value()?)?,
        "--json" => set_format(&mut a.format, Format::Json)?,
        "--csv" => set_format(&mut a.format, Format::Csv)?,
        "--timeout" => a.timeout = seconds(&value()?)?,
        "--comms" => a.comms = parse_number(flag, &value()?, 1, MAX_COMMS)?,
        other => return Err(usage(format!("unknown argument {other:?}"))),
    }
    Ok(())
}

fn set_role(role: &mut Role, new: Role) -> Result<(), Failure> {
    if *role != Role::OneProcess {
        return Err(usage(
            "--listen and --peer exclude each other (and each is given once)".into(),
        ));
    }
    *role = new;
    Ok(())
}

fn set_format(format: &mut Format, new: Format) -> Result<(), Failure> {
    if *format != Format::Table && *format != new {
        return Err(usage("--json and --csv exclude each other".into()));
    }
    *format = new;
    Ok(())
}

/// Cross-flag checks and the size list.
fn finish(mut a: Args, raw: &Raw) -> Result<Args, Failure> {
    if raw.min > raw.max {
        return Err(usage(format!(
            "--min-size {} is above --max-size {}",
            raw.min, raw.max
        )));
    }
    let limit = mpib_driver::abi::NCCL_MAX_NET_SIZE_BYTES;
    if raw.max > limit {
        return Err(usage(format!(
            "--max-size {}: above NCCL's largest message ({limit} bytes)",
            raw.max
        )));
    }
    a.sweep.sizes = sweep::sizes(raw.min, raw.max, raw.factor);
    if a.sweep.sizes.len() > MAX_SIZES {
        return Err(usage(format!(
            "--step-factor {}: from {} to {} bytes makes more than {MAX_SIZES} sizes",
            raw.factor, raw.min, raw.max
        )));
    }
    a.sweep
        .check_counts()
        .map_err(|e| usage(format!("--iters/--warmup: {e}")))?;
    if !matches!(a.role, Role::Listen(_)) {
        a.ignored.clear();
    }
    if a.devs.len() > 1 {
        if a.role != Role::OneProcess {
            return Err(usage(format!(
                "--dev {:?}: several devices are run in one process only (no --listen/--peer)",
                a.devs
            )));
        }
        a.comms = a.comms.max(a.devs.len());
        if a.comms % a.devs.len() != 0 {
            return Err(usage(format!(
                "--comms {}: not a multiple of the {} devices of --dev",
                a.comms,
                a.devs.len()
            )));
        }
    }
    if a.comms > 1 && a.role != Role::OneProcess {
        return Err(usage(format!(
            "--comms {}: several connections are run in one process only (no --listen/--peer)",
            a.comms
        )));
    }
    Ok(a)
}

/// `N` or a list `N,N,...` of distinct devices (at most `MAX_COMMS`).
fn parse_devices(text: &str) -> Result<Vec<i32>, Failure> {
    let devs = text
        .split(',')
        .map(|part| parse_number::<i32>("--dev", part.trim(), 0, 1023))
        .collect::<Result<Vec<_>, _>>()?;
    let repeated = devs.iter().enumerate().any(|(i, d)| devs[..i].contains(d));
    if devs.len() > MAX_COMMS || repeated {
        return Err(usage(format!(
            "--dev {text:?}: at most {MAX_COMMS} distinct devices"
        )));
    }
    Ok(devs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> Result<Args, String> {
        match parse(args.iter().map(|s| s.to_string())) {
            Ok(Parsed::Run(a)) => Ok(*a),
            Ok(Parsed::Help) => Err("help".into()),
            Err(Failure::Usage(m) | Failure::Run(m)) => Err(m),
        }
    }

    #[test]
    fn defaults_match_nccl_tests() {
        let a = run(&[]).unwrap();
        assert_eq!(a.sweep.sizes.first(), Some(&8));
        assert_eq!(a.sweep.sizes.last(), Some(&(256 << 20)));
        assert_eq!(a.sweep.sizes.len(), 26);
        assert_eq!((a.sweep.window, a.sweep.group, a.sweep.warmup), (8, 1, 5));
        assert_eq!(a.sweep.splits, [None]);
        assert_eq!((a.role, a.format), (Role::OneProcess, Format::Table));
    }

    #[test]
    fn sizes_take_suffixes() {
        assert_eq!(parse_bytes("--max-size", "64M").ok(), Some(64 << 20));
        assert_eq!(parse_bytes("--max-size", "4k").ok(), Some(4096));
        assert_eq!(parse_bytes("--max-size", "1GiB").ok(), Some(1 << 30));
        assert_eq!(parse_bytes("--max-size", "17").ok(), Some(17));
        let a = run(&["--min-size", "1K", "--max-size", "4K", "--step-factor", "4"]).unwrap();
        assert_eq!(a.sweep.sizes, [1024, 4096]);
    }

    #[test]
    fn bad_values_name_the_flag_and_the_value() {
        for (args, words) in [
            (&["--max-size", "12Q"][..], &["--max-size", "12Q"][..]),
            (&["--sup-bw", "0,2000"], &["--sup-bw", "2000"]),
            (&["--abi", "6"], &["--abi", "ncclNetPlugin_v6"]),
            (&["--window", "0"], &["--window", "\"0\""]),
            (&["--group", "9"], &["--group", "\"9\""]),
            (&["--timeout", "-1"], &["--timeout", "-1"]),
            (&["--step-factor", "1"], &["--step-factor"]),
            (&["--min-size", "2M", "--max-size", "1M"], &["--min-size"]),
            (&["--iters"], &["--iters needs a value"]),
            (
                &["--iters", "200000", "--group", "8"],
                &[
                    "--iters/--warmup",
                    "iters 200000 with group 8",
                    "1000000 messages",
                ],
            ),
            (&["--json", "--csv"], &["--json and --csv"]),
            (
                &["--listen", "1", "--peer", "h:1"],
                &["--listen and --peer"],
            ),
            (&["--bogus"], &["--bogus"]),
        ] {
            let message = run(args).unwrap_err();
            for word in words {
                assert!(message.contains(word), "{args:?}: {message}");
            }
        }
        assert_eq!(run(&["--help"]).unwrap_err(), "help");
    }

    #[test]
    fn sweep_flags_on_the_listener_are_noted() {
        let a = run(&["--listen", "5000", "--iters", "3"]).unwrap();
        assert_eq!(a.ignored, ["--iters"]);
        assert!(run(&["--iters", "3"]).unwrap().ignored.is_empty());
        let split = run(&["--sup-bw", "0,512,1024"]).unwrap();
        assert_eq!(split.sweep.splits, [Some(0), Some(512), Some(1024)]);
        assert_eq!(run(&["--abi", "v8"]).unwrap().abi, Some(8));
    }
}
