//! `mpib-ranks`: a collective over N ranks through the built plugin (ring all-reduce, all-to-all
//! or send/recv), driven the way NCCL's transport layer drives a net plugin
//! (`mpib_driver::ranks`: NCCL's batch setup order, one proxy loop, per-connection buffers in
//! Simple-protocol slices, `setNetAttr` per operation on v11+, no `finalize` before v11,
//! `dlclose` at the end), every result checked word by word. Prints a table like nccl-tests'.
//!
//! ```text
//! mpib-ranks --ranks N [--op allreduce|alltoall|sendrecv] [--rank R --rendezvous DIR]
//!            [--channels C] [--min-size B] [--max-size B] [--step-factor F] [--iters N]
//!            [--warmup N] [--version v12|v8|...] [--plugin PATH] [--dev N] [--timeout S]
//! ```
//!
//! Without `--rank`, this process runs every rank (one proxy loop for all, any fabric; the
//! rendezvous is a fresh temporary directory). With `--rank R`, it is rank R alone and meets the
//! others through handle files in DIR (a directory every rank sees: the bed's namespaces share
//! the file system), and writes DIR/rank-R.connected once its connections are up. Exit status 0 when every all-reduce was exact, 1 on the first failure (the
//! message names the rank, channel, call and size), 2 on bad arguments.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use mpib_driver::plugin::current_profile;
use mpib_driver::ranks::op::Op;
use mpib_driver::ranks::{self, Options, Row};
use mpib_driver::units::parse_bytes;
use mpib_driver::{locate_built_plugin, Plugin, Version};

const USAGE: &str = "usage: mpib-ranks --ranks N [--op allreduce|alltoall|sendrecv] \
[--rank R --rendezvous DIR] [--channels C] \
[--min-size B] [--max-size B] [--step-factor F] [--iters N] [--warmup N] [--version v12|v8|...] \
[--plugin PATH] [--dev N] [--timeout S]";

struct Args {
    options: Options,
    rank: Option<usize>,
    rendezvous: Option<PathBuf>,
    version: Option<u32>,
    plugin: Option<PathBuf>,
}

fn number<T: std::str::FromStr>(flag: &str, text: &str) -> Result<T, String> {
    text.parse()
        .map_err(|_| format!("{flag} {text:?}: expected a number\n{USAGE}"))
}

fn parse_args() -> Result<Args, String> {
    let mut options = Options {
        ranks: 0,
        channels: 2,
        dev: 0,
        op: Op::AllReduce,
        sizes: Vec::new(),
        iterations: 5,
        warmup: 1,
        connect_deadline: Duration::from_secs(60),
        data_deadline: Duration::from_secs(60),
    };
    let (mut min, mut max, mut factor) = (1024usize, 64 << 20, 2usize);
    let (mut rank, mut rendezvous, mut version, mut plugin) = (None, None, None, None);
    let mut words = std::env::args().skip(1);
    while let Some(flag) = words.next() {
        if flag == "--help" || flag == "-h" {
            return Err(USAGE.to_string());
        }
        let value = words
            .next()
            .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        let bytes = |v: &str| {
            parse_bytes(v)
                .ok_or_else(|| format!("{flag} {v:?}: expected a byte count like 1K or 64M"))
        };
        match flag.as_str() {
            "--ranks" => options.ranks = number(&flag, &value)?,
            "--op" => {
                options.op = Op::parse(&value)
                    .ok_or_else(|| format!("--op {value:?}: allreduce, alltoall or sendrecv"))?
            }
            "--rank" => rank = Some(number(&flag, &value)?),
            "--rendezvous" => rendezvous = Some(PathBuf::from(value)),
            "--channels" => options.channels = number(&flag, &value)?,
            "--min-size" => min = bytes(&value)?,
            "--max-size" => max = bytes(&value)?,
            "--step-factor" => factor = number(&flag, &value)?,
            "--iters" => options.iterations = number(&flag, &value)?,
            "--warmup" => options.warmup = number(&flag, &value)?,
            "--dev" => options.dev = number(&flag, &value)?,
            "--plugin" => plugin = Some(PathBuf::from(value)),
            "--version" => version = Some(number(&flag, value.trim_start_matches('v'))?),
            "--timeout" => {
                let seconds = Duration::from_secs(number(&flag, &value)?);
                (options.connect_deadline, options.data_deadline) = (seconds, seconds);
            }
            _ => return Err(format!("unknown argument {flag:?}\n{USAGE}")),
        }
    }
    check(&options, rank, rendezvous.is_some(), (min, max, factor))?;
    let mut size = min;
    while size <= max {
        options.sizes.push(size);
        size = size.saturating_mul(factor);
    }
    Ok(Args {
        options,
        rank,
        rendezvous,
        version,
        plugin,
    })
}

fn check(
    options: &Options,
    rank: Option<usize>,
    rendezvous: bool,
    (min, max, factor): (usize, usize, usize),
) -> Result<(), String> {
    if options.ranks < 2 {
        return Err(format!("--ranks: a ring needs 2 ranks or more\n{USAGE}"));
    }
    if rank.is_some_and(|r| r >= options.ranks) {
        return Err(format!("--rank must be below --ranks ({})", options.ranks));
    }
    if rank.is_some() != rendezvous {
        return Err(format!("--rank and --rendezvous go together\n{USAGE}"));
    }
    if !(1..=64).contains(&options.channels) {
        return Err("--channels: 1 to 64 (NCCL's MAXCHANNELS)".to_string());
    }
    if min < 4 || min % 4 != 0 || max % 4 != 0 || min > max || factor < 2 {
        return Err(
            "sizes are whole 4-byte words, --min-size ≥ 4 ≤ --max-size, --step-factor ≥ 2"
                .to_string(),
        );
    }
    if options.iterations == 0 {
        return Err("--iters: at least 1".to_string());
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    let who = match args.rank {
        Some(rank) => format!("mpib-ranks[rank {rank} of {}]", args.options.ranks),
        None => format!("mpib-ranks[{} ranks]", args.options.ranks),
    };
    match run(&args, &who) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            println!("{who}: FAILED: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args, who: &str) -> Result<(), String> {
    let path = match &args.plugin {
        Some(path) => path.clone(),
        None => locate_built_plugin(&current_profile()).map_err(|e| e.to_string())?,
    };
    let plugin = Plugin::load(&path).map_err(|e| e.to_string())?;
    let version: Version = plugin
        .select_version(args.version)
        .map_err(|e| e.to_string())?;
    let local: Vec<usize> = match args.rank {
        Some(rank) => vec![rank],
        None => (0..args.options.ranks).collect(),
    };
    let temporary;
    let rendezvous = match &args.rendezvous {
        Some(dir) => dir.clone(),
        None => {
            temporary = mpib_driver::temp_dir("mpib-ranks").map_err(|e| e.to_string())?;
            temporary.clone()
        }
    };
    let rows = {
        let net = plugin.net(version).map_err(|e| e.to_string())?;
        header(args, who, version);
        // With --rank, DIR/rank-R.connected says this rank's ring is up (tests wait on it).
        let mut connected = || {
            if let Some(rank) = args.rank {
                let _ = std::fs::write(rendezvous.join(format!("rank-{rank}.connected")), b"");
            }
        };
        ranks::run(&net, &args.options, &local, &rendezvous, &mut connected)
            .map_err(|e| e.to_string())?
    };
    if args.rendezvous.is_none() {
        let _ = std::fs::remove_dir_all(&rendezvous);
    }
    for row in &rows {
        print_row(row, args.options.op);
    }
    // The plugin is unloaded here (dlclose), as NCCL does when its last communicator goes.
    drop(plugin);
    let whose = match args.rank {
        Some(rank) => format!("on rank {rank}"),
        None => "on every rank".to_string(),
    };
    println!(
        "{who}: PASS {} size(s), every result exact {whose}",
        rows.len()
    );
    Ok(())
}

fn header(args: &Args, who: &str, version: Version) {
    let options = &args.options;
    let steps = options.op.steps();
    println!(
        "# {who}: {}, {} channel(s), ncclNetPlugin_{version}, Simple protocol steps of {} KiB, \
         slices of {} KiB, {} iteration(s) after {} warmup",
        options.op.name(),
        options.channels,
        steps.step >> 10,
        steps.slice() >> 10,
        options.iterations,
        options.warmup
    );
    println!(
        "# {:>12} {:>12} {:>7} {:>6} {:>11} {:>12} {:>12} {:>7}",
        "size", "count", "type", "redop", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong"
    );
}

fn print_row(row: &Row, op: Op) {
    let redop = if op == Op::AllReduce { "sum" } else { "none" };
    println!(
        "  {:>12} {:>12} {:>7} {:>6} {:>11.1} {:>12.3} {:>12.3} {:>7}",
        row.bytes,
        row.bytes / 4,
        "uint32",
        redop,
        row.time.as_secs_f64() * 1e6,
        row.algorithm_gbps,
        row.bus_gbps,
        0
    );
}
