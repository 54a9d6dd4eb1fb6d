//! The operators' control socket: `status`, `flows` and `set`, one line in, text out.
//!
//! Why a separate socket: the registration socket speaks the reference interface byte for byte
//! and must stay open to every job; changing a flow's share is an operator's act, so the control
//! socket is created mode 0600 (the agent's user only). `mpib-agent status` and `mpib-agent set`
//! are its clients.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::io::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::log;
use crate::server::Shared;
use crate::status;
use crate::wake::{poll, poll_entry};

/// A command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    /// The status view.
    Status,
    /// The flows, one tab-separated line each, for programs ([`status::flows`]).
    Flows,
    /// Pin a flow (`None`: every flow) to a share, or (`None` share) hand it back to its policy.
    Set(Option<u32>, Option<u32>),
}

impl Command {
    /// Parses `status`, `flows`, `set FLOW|all SUP_BW|auto`.
    pub fn parse(line: &str) -> Result<Command, String> {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["status"] => Ok(Command::Status),
            ["flows"] => Ok(Command::Flows),
            ["set", flow, share] => {
                let flow = match *flow {
                    "all" | "--all" => None,
                    text => Some(text.parse::<u32>().map_err(|_| {
                        format!("flow {text:?}: expected a slot number from `status`, or --all")
                    })?),
                };
                let share = match *share {
                    "auto" => None,
                    text => Some(text.parse::<u32>().ok().filter(|v| *v <= 1024).ok_or_else(
                        || format!("share {text:?}: expected 0..1024 (parts per 1024) or auto"),
                    )?),
                };
                Ok(Command::Set(flow, share))
            }
            _ => Err(format!(
                "unknown command {line:?}: expected `status`, `flows` or `set FLOW|all SUP_BW|auto`"
            )),
        }
    }

    /// The line a client sends.
    pub fn encode(&self) -> String {
        match self {
            Command::Status => "status\n".into(),
            Command::Flows => "flows\n".into(),
            Command::Set(flow, share) => format!(
                "set {} {}\n",
                flow.map_or("all".to_string(), |f| f.to_string()),
                share.map_or("auto".to_string(), |s| s.to_string())
            ),
        }
    }
}

/// Serves the control socket until stop, one command at a time (only the agent's user can
/// connect), waiting on the socket rather than polling it.
pub fn serve(listener: UnixListener, shared: Shared, describe: String) {
    let _ = listener.set_nonblocking(true);
    while !shared.stop.load(Ordering::Relaxed) {
        let mut entries = [
            poll_entry(shared.stopping.fd(), libc::POLLIN),
            poll_entry(listener.as_raw_fd(), libc::POLLIN),
        ];
        if let Err(e) = poll(&mut entries, None) {
            log::error(&format!("control socket: poll failed, stopping: {e}"));
            return;
        }
        if entries[1].revents == 0 {
            continue;
        }
        if let Ok((stream, _)) = listener.accept() {
            answer(stream, &shared, &describe);
        }
    }
}

fn answer(stream: UnixStream, shared: &Shared, describe: &str) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
    let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
    let mut line = String::new();
    let mut reader = BufReader::new(std::io::Read::take(&stream, 256));
    if reader.read_line(&mut line).is_err() {
        return;
    }
    let reply = match Command::parse(line.trim()) {
        Ok(Command::Status) => {
            let policies = shared.policies.load();
            let state = shared.lock();
            status::render(&state, &policies, describe)
        }
        Ok(Command::Flows) => status::flows(&shared.lock()),
        Ok(Command::Set(flow, share)) => match pin(shared, flow, share) {
            Ok(n) => {
                let what = share.map_or("its policy".to_string(), |s| format!("sup_bw {s}"));
                log::info(&format!("operator: {n} flow(s) set to {what}"));
                format!("ok: {n} flow(s) set to {what}\n")
            }
            Err(e) => format!("error: {e}\n"),
        },
        Err(e) => format!("error: {e}\n"),
    };
    let mut stream = stream;
    let _ = stream.write_all(reply.as_bytes());
}

/// Pins under the lock and returns before anything is logged.
fn pin(shared: &Shared, flow: Option<u32>, share: Option<u32>) -> Result<usize, String> {
    shared.lock().pin(flow, share)
}

/// Sends `command` to the agent's control socket at `path` and returns its reply.
pub fn request(path: &Path, command: Command) -> Result<String, String> {
    let name = path.display();
    let mut stream = UnixStream::connect(path).map_err(|e| {
        format!("control socket {name}: cannot connect ({e}); is mpib-agent running?")
    })?;
    let timeout = Some(Duration::from_secs(5));
    let _ = stream.set_read_timeout(timeout);
    let _ = stream.set_write_timeout(timeout);
    stream
        .write_all(command.encode().as_bytes())
        .map_err(|e| format!("control socket {name}: {e}"))?;
    let mut reply = String::new();
    std::io::Read::read_to_string(&mut stream, &mut reply)
        .map_err(|e| format!("control socket {name}: {e}"))?;
    Ok(reply)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::Command;

    #[test]
    fn commands_round_trip_and_bad_ones_say_why() {
        for c in [
            Command::Status,
            Command::Flows,
            Command::Set(Some(3), Some(512)),
            Command::Set(None, None),
        ] {
            assert_eq!(Command::parse(c.encode().trim()).unwrap(), c);
        }
        assert!(Command::parse("set 3 2000")
            .unwrap_err()
            .contains("0..1024"));
        assert!(Command::parse("set x 1").unwrap_err().contains("flow"));
        assert!(Command::parse("reboot").unwrap_err().contains("unknown"));
    }
}
