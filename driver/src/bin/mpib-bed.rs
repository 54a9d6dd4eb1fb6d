//! `mpib-bed`: the bed of the harness (`mpib_driver::harness::bed`) for scripts that drive it
//! themselves (scripts/lib/perf/bed.sh): build it and leave it up, shape a rail, cut or restore
//! one, tear it down. The harness's own cases build, cut and tear down the same bed in-process.
//!
//! ```text
//! mpib-bed [--prefix NAME] [--hosts N] up | down | shape RAIL RATE | cut RAIL down|one-way | restore RAIL
//! ```
//!
//! RAIL is 0 (SOUT) or 1 (SUP); cuts and restores act on host A's end. `restore` brings the link
//! up and leaves the rail unshaped (shape it again after). Exit status 0 on success, 1 with the
//! failing command named, 2 on bad arguments. Needs root.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use mpib_driver::harness::bed::{teardown, Bed, BedOptions};
use mpib_driver::harness::topology::{Cut, Topology};
use mpib_driver::harness::Settings;

const USAGE: &str = "usage: mpib-bed [--prefix NAME] [--hosts N] up | down | shape RAIL RATE | \
cut RAIL down|one-way | restore RAIL";

fn rail(word: Option<&String>) -> Result<usize, String> {
    match word.map(String::as_str) {
        Some("0") => Ok(0),
        Some("1") => Ok(1),
        other => Err(format!("RAIL {other:?}: 0 (SOUT) or 1 (SUP)\n{USAGE}")),
    }
}

fn run() -> Result<(), String> {
    let mut words: Vec<String> = std::env::args().skip(1).collect();
    let mut options = BedOptions {
        prefix: "mpib_bed".into(),
        hosts: 2,
        rates: [String::new(), String::new()],
        fault_rate: "0".into(),
        scale: "loopback".into(),
        process_limit: Duration::from_secs(60),
        bin: PathBuf::from("target/release"),
        every_case: Settings::default(),
        scratch: None,
    };
    while words.first().is_some_and(|w| w.starts_with("--")) {
        let flag = words.remove(0);
        let value = (!words.is_empty())
            .then(|| words.remove(0))
            .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        match flag.as_str() {
            "--prefix" => options.prefix = value,
            "--hosts" => {
                options.hosts = value
                    .parse()
                    .map_err(|_| format!("--hosts {value:?}: a number"))?
            }
            _ => return Err(format!("unknown flag {flag}\n{USAGE}")),
        }
    }
    let command = words.first().map(String::as_str).unwrap_or("");
    match command {
        "up" => Bed::build(options).map(Bed::leave),
        "down" => {
            teardown(&options.prefix);
            Ok(())
        }
        "shape" => {
            let rate = words
                .get(2)
                .ok_or_else(|| format!("shape needs RAIL and RATE\n{USAGE}"))?;
            Bed::attach(options).shape(rail(words.get(1))?, rate)
        }
        "cut" => {
            let how = match words.get(2).map(String::as_str) {
                Some("down") => Cut::LinkDown,
                Some("one-way") => Cut::OneWay,
                other => return Err(format!("cut {other:?}: down or one-way\n{USAGE}")),
            };
            Bed::attach(options).cut(0, rail(words.get(1))?, how)
        }
        "restore" => Bed::attach(options).mend(0, rail(words.get(1))?),
        _ => Err(USAGE.to_string()),
    }
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) if message.starts_with("usage") || message.contains(USAGE) => {
            eprintln!("mpib-bed: {message}");
            ExitCode::from(2)
        }
        Err(message) => {
            eprintln!("mpib-bed: {message}");
            ExitCode::FAILURE
        }
    }
}
