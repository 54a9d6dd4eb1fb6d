//! Command line and environment. Parsing is a pure function of the arguments and an environment
//! lookup, so it is tested without touching the process environment; the defaults of the paths
//! are the plugin's own (`MPIB_PROBES_DIR`, `MPIB_HINT_PATH`, `MPIB_AGENT_SOCKET`,
//! `MPIB_AGENT_TAG`, declared in the plugin's parameter table), so `mpib-top` looks where the
//! jobs on the node write.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use crate::view::SortKey;

/// Where the data comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sources {
    /// The probes files' directory.
    pub probes_dir: PathBuf,
    /// The agent's hint file (the split each flow is asked for).
    pub hint_path: PathBuf,
    /// The agent's control socket; `None` with `--agent-control off`.
    pub agent_control: Option<PathBuf>,
    /// The root under which `class/infiniband/<nic>/ports/<port>` holds the NICs' counters.
    pub sysfs_root: PathBuf,
    /// Only files these users own are shown (`None`: every trusted owner).
    pub allowed_uids: Option<BTreeSet<u32>>,
}

/// How the view is shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// The live screen, with keys.
    Interactive,
    /// Text frames on standard output, like `top -b`: `iterations` of them (`None`: until
    /// interrupted), as text or one JSON document per line.
    Batch {
        /// Frames to print.
        iterations: Option<u64>,
        /// JSON documents instead of text.
        json: bool,
    },
}

/// Everything the command line says.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Sources.
    pub sources: Sources,
    /// Time between two samples: rates are over this interval.
    pub interval: Duration,
    /// Screen or batch.
    pub output: Output,
    /// The first sort.
    pub sort: SortKey,
    /// The first filter (empty: none).
    pub filter: String,
    /// Columns of a batch frame.
    pub width: u16,
    /// Colour on the live screen (off with `NO_COLOR` or `--no-color`).
    pub color: bool,
}

/// What to do.
#[derive(Debug, PartialEq)]
pub enum Command {
    /// Show the view.
    Run(Box<Config>),
    /// Print the help.
    Help,
    /// Print the version.
    Version,
}

/// The help text.
pub const HELP: &str = "\
mpib-top: a live view of every MPIB rail, connection and agent decision on this node

usage: mpib-top [OPTIONS]

  --interval SECONDS      time between samples; rates are over it (default 1)
  --once                  print one frame (after one interval) and exit
  --json                  frames as JSON documents, one per line (with --once or -b)
  -b, --batch             print frames on standard output until -n or interrupted
  -n, --iterations N      frames to print in batch mode
  --sort rate|errors|pid  first sort (keys r, e, i change it; default rate)
  --filter TEXT           show only processes and connections whose pid, user,
                          device or peer contains TEXT (key f)
  --width COLUMNS         width of a text frame (default $COLUMNS, else 160)
  --no-color              no colour on the live screen (also NO_COLOR)
  --probes-dir DIR        probes files (MPIB_PROBES_DIR; default /dev/shm/mpib)
  --hint-path PATH        the agent's hint file (MPIB_HINT_PATH; default /tmp/mpib/hints)
  --agent-control PATH    the agent's control socket, or off (default: the agent
                          socket MPIB_AGENT_SOCKET with the extension .control)
  --sysfs DIR             the sysfs root, for the NICs' counters (MPIB_SYSFS; default /sys)
  --allowed-uids LIST     show only files these users own (comma-separated)
  -h, --help, --version

keys: r/e/i sort by rate/errors/pid, f or / filter (Enter applies, Esc clears),
      p or space pause, v declared values, h or ? help, q quit
";

/// Parses the arguments (without the program name) and the environment.
///
/// # Errors
///
/// A message naming the flag or variable that was wrong.
pub fn parse<I, E>(args: I, env: E) -> Result<Command, String>
where
    I: IntoIterator<Item = String>,
    E: Fn(&str) -> Option<String>,
{
    if env("MPIB_SYSFS_ROOT").is_some() {
        mpib_node::sysfs::refuse_old_name("MPIB_SYSFS_ROOT")?;
    }
    let settings = mpib_params::params::Settings::from_lookup(&env).map_err(|e| e.to_string())?;
    let lookup = |name: &str| env(name).filter(|v| !v.is_empty());
    let mut config = Config {
        sources: Sources {
            probes_dir: settings.probes_dir.into(),
            hint_path: settings.hint_path.into(),
            agent_control: Some(PathBuf::from(settings.agent_socket).with_extension("control")),
            sysfs_root: settings.sysfs.clone().into(),
            allowed_uids: None,
        },
        interval: Duration::from_secs(1),
        output: Output::Interactive,
        sort: SortKey::Rate,
        filter: String::new(),
        width: lookup("COLUMNS")
            .and_then(|c| c.parse().ok())
            .filter(|w| *w >= 40)
            .unwrap_or(160),
        color: lookup("NO_COLOR").is_none(),
    };
    let (mut once, mut batch, mut json, mut iterations) = (false, false, false, None);
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let mut value = |flag: &str| args.next().ok_or_else(|| format!("{flag} needs a value"));
        match arg.as_str() {
            "-h" | "--help" => return Ok(Command::Help),
            "--version" => return Ok(Command::Version),
            "--once" => once = true,
            "--json" => json = true,
            "-b" | "--batch" => batch = true,
            "--no-color" => config.color = false,
            "-n" | "--iterations" => iterations = Some(positive(&arg, &value(&arg)?)?),
            "--interval" => config.interval = interval(&value(&arg)?)?,
            "--sort" => config.sort = sort_key(&value(&arg)?)?,
            "--filter" => config.filter = value(&arg)?,
            "--width" => {
                let text = value(&arg)?;
                config.width = text.parse().ok().filter(|w| *w >= 40).ok_or_else(|| {
                    format!("--width {text:?}: expected a number of columns, at least 40")
                })?;
            }
            "--probes-dir" => config.sources.probes_dir = value(&arg)?.into(),
            "--hint-path" => config.sources.hint_path = value(&arg)?.into(),
            "--sysfs" => config.sources.sysfs_root = value(&arg)?.into(),
            "--sysfs-root" => mpib_node::sysfs::refuse_old_name(&arg)?,
            "--agent-control" => {
                let path = value(&arg)?;
                config.sources.agent_control = (path != "off").then(|| path.into());
            }
            "--allowed-uids" => {
                let list = value(&arg)?;
                let uids = mpib_node::trust::parse_uids(&list)
                    .map_err(|e| format!("--allowed-uids {list:?}: {e}"))?;
                config.sources.allowed_uids = Some(uids);
            }
            other => return Err(format!("unknown argument {other:?} (see --help)")),
        }
    }
    if json && !once && !batch {
        return Err("--json needs --once or -b: the live screen is not JSON".into());
    }
    if once && iterations.is_some_and(|n| n != 1) {
        return Err("--once prints one frame: leave out -n, or use -b -n N".into());
    }
    if once {
        config.output = Output::Batch {
            iterations: Some(1),
            json,
        };
    } else if batch || iterations.is_some() {
        config.output = Output::Batch { iterations, json };
    }
    Ok(Command::Run(Box::new(config)))
}

fn positive(flag: &str, text: &str) -> Result<u64, String> {
    text.parse()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("{flag} {text:?}: expected a positive number of frames"))
}

fn interval(text: &str) -> Result<Duration, String> {
    let seconds: f64 = text
        .parse()
        .map_err(|_| format!("--interval {text:?}: expected seconds, such as 1 or 0.5"))?;
    if !(0.05..=3600.0).contains(&seconds) {
        return Err(format!(
            "--interval {text:?}: expected 0.05 to 3600 seconds"
        ));
    }
    Ok(Duration::from_secs_f64(seconds))
}

fn sort_key(text: &str) -> Result<SortKey, String> {
    match text {
        "rate" => Ok(SortKey::Rate),
        "errors" => Ok(SortKey::Errors),
        "pid" => Ok(SortKey::Pid),
        _ => Err(format!("--sort {text:?}: expected rate, errors or pid")),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn run(args: &[&str], env: &[(&str, &str)]) -> Result<Config, String> {
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let lookup = move |name: &str| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
        match parse(args.iter().map(|a| a.to_string()), lookup)? {
            Command::Run(config) => Ok(*config),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_sysfs_root_has_one_name_and_the_old_ones_are_refused() {
        assert_eq!(
            run(&[], &[]).unwrap().sources.sysfs_root,
            PathBuf::from("/sys")
        );
        let c = run(&["--sysfs", "/fake"], &[("MPIB_SYSFS", "/env")]).unwrap();
        assert_eq!(c.sources.sysfs_root, PathBuf::from("/fake"));
        let c = run(&[], &[("MPIB_SYSFS", "/env")]).unwrap();
        assert_eq!(c.sources.sysfs_root, PathBuf::from("/env"));
        assert!(run(&["--sysfs-root", "/x"], &[])
            .unwrap_err()
            .contains("--sysfs DIR"));
        let variable = run(&[], &[("MPIB_SYSFS_ROOT", "/x")]).unwrap_err();
        assert!(variable.contains("MPIB_SYSFS names"), "{variable}");
    }

    #[test]
    fn defaults_are_the_plugins_paths() {
        let c = run(&[], &[]).unwrap();
        assert_eq!(c.sources.probes_dir, PathBuf::from("/dev/shm/mpib"));
        assert_eq!(c.sources.hint_path, PathBuf::from("/tmp/mpib/hints"));
        assert_eq!(
            c.sources.agent_control,
            Some(PathBuf::from("/tmp/mpib/agent.control"))
        );
        assert_eq!(c.output, Output::Interactive);
        assert!(c.color);
        let tagged = run(&[], &[("MPIB_AGENT_TAG", "job7"), ("NO_COLOR", "1")]).unwrap();
        assert_eq!(
            tagged.sources.agent_control,
            Some(PathBuf::from("/tmp/mpib/job7/agent.control"))
        );
        assert!(!tagged.color);
    }

    #[test]
    fn flags_override_the_environment_and_modes_combine() {
        let c = run(
            &[
                "--probes-dir",
                "/x",
                "--once",
                "--json",
                "--agent-control",
                "off",
            ],
            &[("MPIB_PROBES_DIR", "/y")],
        )
        .unwrap();
        assert_eq!(c.sources.probes_dir, PathBuf::from("/x"));
        assert_eq!(c.sources.agent_control, None);
        assert_eq!(
            c.output,
            Output::Batch {
                iterations: Some(1),
                json: true
            }
        );
        let b = run(&["-b", "-n", "3", "--interval", "0.5"], &[]).unwrap();
        assert_eq!(
            b.output,
            Output::Batch {
                iterations: Some(3),
                json: false
            }
        );
        assert_eq!(b.interval, Duration::from_millis(500));
    }

    #[test]
    fn bad_input_names_the_flag() {
        for (args, needle) in [
            (&["--interval", "0"][..], "--interval"),
            (&["--interval", "soon"][..], "--interval"),
            (&["-n", "0"][..], "-n"),
            (&["--sort", "name"][..], "--sort"),
            (&["--json"][..], "--json"),
            (&["--width", "10"][..], "--width"),
            (&["--allowed-uids", "x,"][..], "--allowed-uids"),
            (&["--frobnicate"][..], "--frobnicate"),
            (&["--probes-dir"][..], "--probes-dir needs a value"),
            (&["--once", "-n", "2"][..], "--once"),
        ] {
            let e = run(args, &[]).unwrap_err();
            assert!(e.contains(needle), "{args:?}: {e}");
        }
    }
}
