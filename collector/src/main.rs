//! `mpib-collector`: the MPIB sidecar. See `mpib-collector --help`.

#![forbid(unsafe_code)]

use std::process::ExitCode;

use mpib_collector::config::{self, Command};

fn main() -> ExitCode {
    let args = std::env::args_os()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned());
    let command = match config::parse(args, |name| std::env::var(name).ok()) {
        Ok(command) => command,
        Err(e) => {
            eprintln!("mpib-collector: error: {e}\nTry 'mpib-collector --help' for the options.");
            return ExitCode::from(2);
        }
    };
    let config = match command {
        Command::Help => {
            print!("{}", config::help_text());
            return ExitCode::SUCCESS;
        }
        Command::Version => {
            println!("mpib-collector {}", env!("CARGO_PKG_VERSION"));
            return ExitCode::SUCCESS;
        }
        Command::Run(config) => config,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("mpib-collector")
        .enable_all()
        .build();
    match runtime {
        Ok(runtime) => runtime.block_on(mpib_collector::app::run(config)),
        Err(e) => {
            eprintln!("mpib-collector: error: cannot start the runtime: {e}");
            ExitCode::from(1)
        }
    }
}
