//! The agent's current decision per flow, asked over its control socket (`flows`, a header and
//! one tab-separated line per flow: docs/AGENT.md "status, flows and set"). The socket is local
//! and the agent answers at once; the short timeouts keep a stuck agent from stalling the screen.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use mpib_agent::status::FLOWS_HEADER;

use crate::frame::{Agent, Flow};

/// How long a reply may take.
const TIMEOUT: Duration = Duration::from_millis(300);

/// The flows of the agent at `control`, or why there are none.
pub fn flows(control: Option<&Path>) -> Agent {
    let Some(path) = control else {
        return Agent::Off;
    };
    match ask(path) {
        Ok(reply) => match parse(&reply) {
            Ok(flows) => Agent::Running { flows },
            Err(reason) => Agent::Unavailable {
                reason: format!("control socket {}: {reason}", path.display()),
            },
        },
        Err(e) => Agent::Unavailable {
            reason: format!("control socket {}: {e}", path.display()),
        },
    }
}

fn ask(path: &Path) -> std::io::Result<String> {
    let mut stream = UnixStream::connect(path)?;
    stream.set_read_timeout(Some(TIMEOUT))?;
    stream.set_write_timeout(Some(TIMEOUT))?;
    stream.write_all(b"flows\n")?;
    let mut reply = String::new();
    stream.take(1 << 20).read_to_string(&mut reply)?;
    Ok(reply)
}

/// Parses a `flows` reply.
///
/// # Errors
///
/// What was wrong: an agent that does not know `flows`, or a line that is not a flow.
pub fn parse(reply: &str) -> Result<Vec<Flow>, String> {
    let mut lines = reply.lines();
    match lines.next() {
        Some(FLOWS_HEADER) => {}
        Some(first) if first.starts_with("error:") => {
            return Err(format!(
                "the agent answered {first:?} (an agent older than `flows`?)"
            ))
        }
        other => return Err(format!("unexpected reply {other:?}")),
    }
    lines.map(flow).collect()
}

fn flow(line: &str) -> Result<Flow, String> {
    let fields: Vec<&str> = line.split('\t').collect();
    let bad = || format!("line {line:?} is not a flow");
    if fields.len() < 10 {
        return Err(bad());
    }
    let optional = |text: &str| -> Result<Option<f64>, String> {
        match text {
            "-" => Ok(None),
            text => text.parse().map(Some).map_err(|_| bad()),
        }
    };
    Ok(Flow {
        flow: fields[0].parse().map_err(|_| bad())?,
        sout_pair: fields[1].to_owned(),
        policy: fields[2].to_owned(),
        sup_bw: fields[3].parse().map_err(|_| bad())?,
        measured_sup_bw: optional(fields[4])?.map(|v| v as u32),
        throughput_bytes_per_second: optional(fields[7])?,
        connections: fields[8].parse().map_err(|_| bad())?,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_parses_and_a_bad_one_says_why() {
        let reply = format!(
            "{FLOWS_HEADER}\n0\t10.0.0.1->10.0.1.2\tadaptive\t683\t681\t2010000000\t3980000000\t5870000000\t16\t0\n\
             2\t10.0.0.1->10.0.2.9\tadaptive\t597\t-\t-\t-\t-\t0\t1\n"
        );
        let flows = parse(&reply).unwrap();
        assert_eq!(flows.len(), 2);
        assert_eq!(flows[0].sup_bw, 683);
        assert_eq!(flows[0].measured_sup_bw, Some(681));
        assert_eq!(flows[1].throughput_bytes_per_second, None);
        assert!(parse("error: unknown command \"flows\"\n")
            .unwrap_err()
            .contains("older"));
        assert!(parse(&format!("{FLOWS_HEADER}\n1\tx\n"))
            .unwrap_err()
            .contains("not a flow"));
        let missing = flows_of(Some(Path::new("/nonexistent/agent.control")));
        assert!(missing.contains("/nonexistent/agent.control"), "{missing}");
        assert!(matches!(super::flows(None), Agent::Off));
    }

    fn flows_of(path: Option<&Path>) -> String {
        match super::flows(path) {
            Agent::Unavailable { reason } => reason,
            other => panic!("{other:?}"),
        }
    }
}
