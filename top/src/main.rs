//! `mpib-top`: see `mpib-top --help` and docs/OBSERVABILITY.md "mpib-top".

use std::process::ExitCode;

use mpib_top::config::{self, Command};

fn main() -> ExitCode {
    let args = std::env::args().skip(1);
    match config::parse(args, |name| std::env::var(name).ok()) {
        Ok(Command::Help) => {
            print!("{}", config::HELP);
            ExitCode::SUCCESS
        }
        Ok(Command::Version) => {
            println!("mpib-top {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Ok(Command::Run(config)) => match mpib_top::run::run(&config) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("mpib-top: {e}");
                ExitCode::from(1)
            }
        },
        Err(e) => {
            eprintln!("mpib-top: {e}");
            ExitCode::from(2)
        }
    }
}
