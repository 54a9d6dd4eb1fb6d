//! The `mpib-agent` command: `run` (the daemon, the default), `status`, `set`.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use mpib_agent::access::{parse_ids, Kind};
use mpib_agent::config::{check_flow_limit, Paths};
use mpib_agent::control::{self, Command};
use mpib_agent::daemon::{self, Options};
use mpib_agent::policy::PolicyKind;

const USAGE: &str = "\
usage: mpib-agent [run] [--config PATH] [--policy static|capacity|adaptive] [--interval-ms N]
                  [--hint-path PATH] [--socket PATH] [--control PATH] [--probes-dir DIR]
                  [--metrics-listen ADDR:PORT|off] [--sysfs DIR]
                  [--allowed-uids LIST] [--allowed-gids LIST]
                  [--max-flows-per-process N] [--max-flows-per-user N]
       mpib-agent status [--control PATH]
       mpib-agent set FLOW|--all SUP_BW|auto [--control PATH]

  run               serve registrations and set each flow's SUP share (SIGHUP reloads --config,
                    SIGTERM/SIGINT stop)
  status            print the flows: policy, share asked and measured, per-rail rates
  set               pin a flow (a slot number from status) or every flow to SUP_BW parts per
                    1024, or hand it back to its policy with `auto`

  --config PATH     TOML policies and rules [env: MPIB_AGENT_CONFIG]
  --policy NAME     default policy, overriding the file [default: capacity]
  --interval-ms N   measuring and deciding interval, overriding the file [default: 100]
  --hint-path PATH  hint file [env: MPIB_HINT_PATH, MPIB_AGENT_TAG; default /tmp/mpib/hints]
  --socket PATH     registration socket [env: MPIB_AGENT_SOCKET, MPIB_AGENT_TAG;
                    default /tmp/mpib/agent.sock]
  --control PATH    operators' socket [default: the registration socket's path, .control]
  --probes-dir DIR  the plugins' probes files [env: MPIB_PROBES_DIR; default /dev/shm/mpib]
  --metrics-listen  Prometheus endpoint [default: 127.0.0.1:9465; off: none]
  --sysfs DIR       the sysfs root, for the NICs' counters [env: MPIB_SYSFS; default: /sys]
  --allowed-uids LIST
                    users who may register: uids or names, comma-separated; others are
                    answered status 2 [env: MPIB_AGENT_ALLOWED_UIDS; file: allowed_uids;
                    default: any local user, unless --allowed-gids is set]
  --allowed-gids LIST
                    groups who may register (the gid the client connects with): gids or
                    names [env: MPIB_AGENT_ALLOWED_GIDS; file: allowed_gids; default: any]
  --max-flows-per-process N
                    flows (hint slots) one process may have connections in, 1..256; a
                    registration past it that needs a new slot is answered status 1
                    [env: MPIB_AGENT_MAX_FLOWS_PER_PROCESS; file: max_flows_per_process;
                    default: 64]
  --max-flows-per-user N
                    flows the processes of one user may have connections in together while
                    another user has connections too (a user alone is held to the
                    per-process limit only), 1..256
                    [env: MPIB_AGENT_MAX_FLOWS_PER_USER; file: max_flows_per_user; default: 192]

Exit status: 0 stopped cleanly or command done, 1 failed, 2 bad arguments or configuration.";

enum Action {
    Run(Box<Options>),
    Status(PathBuf),
    Set(PathBuf, Command),
    Help,
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let action = match parse(&args) {
        Ok(action) => action,
        Err(message) => {
            eprintln!("mpib-agent: {message}\n(see mpib-agent --help)");
            return ExitCode::from(2);
        }
    };
    match action {
        Action::Help => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        Action::Run(options) => match daemon::run(&options) {
            Ok(()) => ExitCode::SUCCESS,
            Err(message) => {
                eprintln!("mpib-agent ERROR {message}");
                ExitCode::from(if message.starts_with("config") { 2 } else { 1 })
            }
        },
        Action::Status(path) => print_reply(control::request(&path, Command::Status)),
        Action::Set(path, command) => print_reply(control::request(&path, command)),
    }
}

fn print_reply(reply: Result<String, String>) -> ExitCode {
    match reply {
        Ok(text) if text.starts_with("error:") => {
            eprint!("mpib-agent: {}", &text["error: ".len()..]);
            ExitCode::from(1)
        }
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("mpib-agent: {message}");
            ExitCode::from(1)
        }
    }
}

/// The paths the plugin would use, from the same variables and parser.
fn plugin_paths() -> Result<(PathBuf, PathBuf, PathBuf, PathBuf), String> {
    let settings = mpib_params::params::Settings::from_lookup(|name| std::env::var(name).ok())
        .map_err(|e| e.to_string())?;
    Ok((
        settings.hint_path.into(),
        settings.agent_socket.into(),
        settings.probes_dir.into(),
        settings.sysfs.into(),
    ))
}

fn value<'a>(args: &'a [String], i: &mut usize, flag: &str) -> Result<&'a str, String> {
    *i += 1;
    args.get(*i)
        .map(String::as_str)
        .ok_or_else(|| format!("{flag} needs a value"))
}

/// What the flags said, before the configuration file fills the start-only settings.
struct Flags<'a> {
    options: Options,
    command: Option<&'a str>,
    positional: Vec<&'a str>,
    /// Start-only settings given on the command line (the file does not override them).
    control_given: bool,
    metrics_given: bool,
    sysfs_given: bool,
}

fn parse(args: &[String]) -> Result<Action, String> {
    if args.iter().any(|a| a == "-h" || a == "--help") {
        return Ok(Action::Help);
    }
    let (hint, socket, probes, sysfs) = plugin_paths()?;
    let paths = Paths {
        control_path: socket.with_extension("control"),
        hint_path: hint,
        socket_path: socket,
        probes_dir: probes,
        metrics_listen: Some(SocketAddr::from(([127, 0, 0, 1], 9465))),
        sysfs,
    };
    let mut flags = Flags {
        options: Options {
            paths,
            config_path: std::env::var_os("MPIB_AGENT_CONFIG").map(PathBuf::from),
            policy: None,
            interval_ms: None,
            allowed_uids: env_ids("MPIB_AGENT_ALLOWED_UIDS", Kind::Users)?,
            allowed_gids: env_ids("MPIB_AGENT_ALLOWED_GIDS", Kind::Groups)?,
            max_flows_per_process: env_flow_limit("MPIB_AGENT_MAX_FLOWS_PER_PROCESS")?,
            max_flows_per_user: env_flow_limit("MPIB_AGENT_MAX_FLOWS_PER_USER")?,
        },
        command: None,
        positional: Vec::new(),
        control_given: false,
        metrics_given: false,
        sysfs_given: false,
    };
    let mut i = 0;
    while i < args.len() {
        read_flag(args, &mut i, &mut flags)?;
        i += 1;
    }
    apply_file_settings(&mut flags)?;
    let Flags {
        options,
        command,
        positional,
        ..
    } = flags;
    let control = options.paths.control_path.clone();
    match (command.unwrap_or("run"), positional.as_slice()) {
        ("run", []) => Ok(Action::Run(Box::new(options))),
        ("status", []) => Ok(Action::Status(control)),
        ("set", [flow, share]) => {
            let command = Command::parse(&format!("set {flow} {share}"))?;
            Ok(Action::Set(control, command))
        }
        ("set", _) => Err("set needs FLOW (or --all) and SUP_BW (0..1024 or auto)".into()),
        (name, extra) => Err(format!("{name}: unexpected argument(s) {extra:?}")),
    }
}

/// One flag (with its value) or word at `args[*i]`.
fn read_flag<'a>(args: &'a [String], i: &mut usize, flags: &mut Flags<'a>) -> Result<(), String> {
    let arg = args[*i].as_str();
    let paths = &mut flags.options.paths;
    match arg {
        "--config" => flags.options.config_path = Some(value(args, i, arg)?.into()),
        "--policy" => flags.options.policy = Some(parse_policy(value(args, i, arg)?)?),
        "--interval-ms" => {
            let text = value(args, i, arg)?;
            let ms = text
                .parse::<u64>()
                .ok()
                .filter(|v| (10..=60_000).contains(v));
            flags.options.interval_ms =
                Some(ms.ok_or_else(|| format!("--interval-ms {text:?}: expected 10..60000"))?);
        }
        "--hint-path" => paths.hint_path = value(args, i, arg)?.into(),
        "--socket" => {
            paths.socket_path = value(args, i, arg)?.into();
            if !flags.control_given {
                paths.control_path = paths.socket_path.with_extension("control");
            }
        }
        "--control" => {
            paths.control_path = value(args, i, arg)?.into();
            flags.control_given = true;
        }
        "--probes-dir" => paths.probes_dir = value(args, i, arg)?.into(),
        "--metrics-listen" => {
            paths.metrics_listen = parse_listen(value(args, i, arg)?)?;
            flags.metrics_given = true;
        }
        "--sysfs" => {
            paths.sysfs = value(args, i, arg)?.into();
            flags.sysfs_given = true;
        }
        "--sysfs-root" => mpib_node::sysfs::refuse_old_name(arg)?,
        "--allowed-uids" => {
            flags.options.allowed_uids = Some(flag_ids(value(args, i, arg)?, arg, Kind::Users)?)
        }
        "--allowed-gids" => {
            flags.options.allowed_gids = Some(flag_ids(value(args, i, arg)?, arg, Kind::Groups)?)
        }
        "--max-flows-per-process" => {
            flags.options.max_flows_per_process = Some(flow_limit(arg, value(args, i, arg)?)?)
        }
        "--max-flows-per-user" => {
            flags.options.max_flows_per_user = Some(flow_limit(arg, value(args, i, arg)?)?)
        }
        "--all" => flags.positional.push("all"),
        flag if flag.starts_with('-') && flag.len() > 1 && flag.parse::<i64>().is_err() => {
            return Err(format!("unknown flag {flag:?}"))
        }
        word if flags.command.is_none() && ["run", "status", "set"].contains(&word) => {
            flags.command = Some(word)
        }
        word => flags.positional.push(word),
    }
    Ok(())
}

/// The start-only settings the configuration file gives where no flag did (a file that does not
/// load is reported by `run`).
fn apply_file_settings(flags: &mut Flags<'_>) -> Result<(), String> {
    let Ok(policies) = flags.options.load_policies() else {
        return Ok(());
    };
    let paths = &mut flags.options.paths;
    if let (false, Some(text)) = (flags.metrics_given, &policies.metrics_listen) {
        paths.metrics_listen = parse_listen(text)?;
    }
    if let (false, Some(path)) = (flags.control_given, &policies.control_path) {
        paths.control_path = path.clone();
    }
    if let (false, Some(path)) = (flags.sysfs_given, &policies.sysfs) {
        paths.sysfs = path.clone();
    }
    Ok(())
}

/// An allowed list from the variable `name`, if set and not empty.
fn env_ids(name: &str, kind: Kind) -> Result<Option<BTreeSet<u32>>, String> {
    match std::env::var(name) {
        Ok(value) if !value.is_empty() => flag_ids(&value, name, kind).map(Some),
        _ => Ok(None),
    }
}

/// A flow limit from the variable `name`, if set and not empty.
fn env_flow_limit(name: &str) -> Result<Option<usize>, String> {
    match std::env::var(name) {
        Ok(value) if !value.is_empty() => flow_limit(name, &value).map(Some),
        _ => Ok(None),
    }
}

/// A flow limit given as `text` by the flag or variable `name`.
fn flow_limit(name: &str, text: &str) -> Result<usize, String> {
    let value = text.trim().parse::<usize>().map_err(|_| {
        format!(
            "{name} {text:?}: expected a number of flows, 1..256 (256 = no limit beyond the slots)"
        )
    })?;
    check_flow_limit(name, value)
}

fn flag_ids(value: &str, name: &str, kind: Kind) -> Result<BTreeSet<u32>, String> {
    parse_ids(value, kind).map_err(|e| format!("{name}: {e}"))
}

fn parse_policy(text: &str) -> Result<PolicyKind, String> {
    match text {
        "static" => Ok(PolicyKind::Static),
        "capacity" => Ok(PolicyKind::Capacity),
        "adaptive" => Ok(PolicyKind::Adaptive),
        _ => Err(format!(
            "--policy {text:?}: expected static, capacity or adaptive"
        )),
    }
}

fn parse_listen(text: &str) -> Result<Option<SocketAddr>, String> {
    if text == "off" {
        return Ok(None);
    }
    text.parse::<SocketAddr>().map(Some).map_err(|_| {
        format!("metrics listen {text:?}: expected ADDR:PORT like 127.0.0.1:9465, or off")
    })
}
