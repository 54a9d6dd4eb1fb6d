//! Lines on standard error, `mpib-agent LEVEL message`, for journald or a terminal.

fn line(level: &str, message: &str) {
    eprintln!("mpib-agent {level} {message}");
}

/// Something happened that an operator may want to know.
pub fn info(message: &str) {
    line("INFO", message);
}

/// Something is wrong but the agent goes on.
pub fn warn(message: &str) {
    line("WARN", message);
}

/// Something failed.
pub fn error(message: &str) {
    line("ERROR", message);
}
