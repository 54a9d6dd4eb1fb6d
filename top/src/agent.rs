//! The agent's current decision per flow, asked over its control socket (`flows`, a header and
//! one tab-separated line per flow: docs/AGENT.md "status, flows and set"). The socket is local
//! and the agent answers at once; a stopped one costs a sample 300 ms at most ([`Asker`]).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use mpib_node::agent_status::FLOWS_HEADER_FIRST;

use crate::frame::{Agent, Flow};

/// How long a whole reply may take.
const DEADLINE: Duration = Duration::from_millis(300);

/// Asks the agent from a thread of its own, so that no agent, stopped or slow, holds a sample
/// up beyond [`DEADLINE`]: a connect to a socket whose backlog is full blocks, and a read
/// timeout bounds each read, not the reply. While a question is unanswered no other is asked.
pub struct Asker {
    control: Option<PathBuf>,
    waiting: Option<(Receiver<std::io::Result<String>>, Instant)>,
}

impl Asker {
    /// An asker of the agent at `control` (`None`: never asks).
    pub fn new(control: Option<PathBuf>) -> Asker {
        Asker {
            control,
            waiting: None,
        }
    }

    /// The flows, or why there are none.
    pub fn flows(&mut self) -> Agent {
        let Some(path) = self.control.clone() else {
            return Agent::Off;
        };
        let (reply, since) = self.waiting.take().unwrap_or_else(|| {
            let (sender, reply) = mpsc::channel();
            let asked = path.clone();
            std::thread::spawn(move || {
                let _ = sender.send(ask(&asked));
            });
            (reply, Instant::now())
        });
        let unavailable = |reason: String| Agent::Unavailable {
            reason: format!("control socket {}: {reason}", path.display()),
        };
        match reply.recv_timeout(DEADLINE.saturating_sub(since.elapsed())) {
            Ok(Ok(text)) => parse(&text).map_or_else(unavailable, |flows| Agent::Running { flows }),
            Ok(Err(e)) => unavailable(e.to_string()),
            Err(RecvTimeoutError::Timeout) => {
                let waited = since.elapsed().as_millis();
                self.waiting = Some((reply, since));
                unavailable(format!("no reply for {waited} ms (is the agent stopped?)"))
            }
            Err(RecvTimeoutError::Disconnected) => unavailable("the question was lost".into()),
        }
    }
}

/// How long the asking thread waits on each read or write before it gives up the question.
const STALLED: Duration = Duration::from_secs(5);

fn ask(path: &Path) -> std::io::Result<String> {
    let mut stream = UnixStream::connect(path)?;
    stream.set_read_timeout(Some(STALLED))?;
    stream.set_write_timeout(Some(STALLED))?;
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
        // A later agent may add columns after these.
        Some(header) if header.starts_with(FLOWS_HEADER_FIRST) => {}
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
        measured_connections: match fields.get(10) {
            Some(text) => Some(text.parse().map_err(|_| bad())?),
            None => None,
        },
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use mpib_node::agent_status::FLOWS_HEADER;

    #[test]
    fn a_reply_parses_and_a_bad_one_says_why() {
        let reply = format!(
            "{FLOWS_HEADER}\n0\t10.0.0.1->10.0.1.2\tadaptive\t683\t681\t2010000000\t3980000000\t5870000000\t16\t0\t8\n\
             2\t10.0.0.1->10.0.2.9\tadaptive\t597\t-\t-\t-\t-\t0\t1\n"
        );
        let flows = parse(&reply).unwrap();
        assert_eq!(flows.len(), 2);
        assert_eq!(flows[0].sup_bw, 683);
        assert_eq!(flows[0].measured_sup_bw, Some(681));
        assert_eq!(flows[1].throughput_bytes_per_second, None);
        assert_eq!(
            (flows[0].measured_connections, flows[1].measured_connections),
            (Some(8), None)
        );
        // An agent from before `measured_connections`: its header and lines end earlier.
        let older =
            format!("{FLOWS_HEADER_FIRST}\n0\t10.0.0.1->10.0.1.2\tstatic\t0\t-\t-\t-\t-\t2\t0\n");
        let older = parse(&older).unwrap();
        assert_eq!(
            (older[0].connections, older[0].measured_connections),
            (2, None)
        );
        assert!(parse("error: unknown command \"flows\"\n")
            .unwrap_err()
            .contains("older"));
        assert!(parse(&format!("{FLOWS_HEADER}\n1\tx\n"))
            .unwrap_err()
            .contains("not a flow"));
        assert_eq!(
            parse(&format!("{FLOWS_HEADER}\tlater_column\n")).unwrap(),
            []
        );
        let mut missing = Asker::new(Some("/nonexistent/agent.control".into()));
        assert!(
            matches!(missing.flows(), Agent::Unavailable { reason } if reason.contains("/nonexistent/agent.control"))
        );
        assert!(matches!(Asker::new(None).flows(), Agent::Off));
    }

    #[test]
    fn an_agent_that_never_answers_costs_a_sample_the_deadline_only() {
        let dir = std::env::temp_dir().join(format!("mpib-top-agent-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("agent.control");
        let _ = std::fs::remove_file(&path);
        // Listening, never accepting: the question waits in the backlog.
        let _listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let mut asker = Asker::new(Some(path));
        for _ in 0..3 {
            let started = Instant::now();
            let reason = match asker.flows() {
                Agent::Unavailable { reason } => reason,
                other => panic!("{other:?}"),
            };
            assert!(reason.contains("no reply"), "{reason}");
            assert!(started.elapsed() < DEADLINE * 3, "{:?}", started.elapsed());
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
