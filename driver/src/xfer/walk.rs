//! Walking the case list on one side (with the per-rail checks), and both sides in one process.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::{at, Listener, Sender, Side, SideOptions};
use crate::abi::HANDLE_SIZE;
use crate::agent::Agent;
use crate::cases::Case;
use crate::error::{Error, Result};
use crate::plugin::{Plugin, Version};
use crate::rails::{Connection, Direction, PathClass, Probes};

/// What the walk checks besides the bytes.
#[derive(Clone, Copy, Debug, Default)]
pub struct Checks {
    /// Fail unless the plugin classified the connection so.
    pub class: Option<PathClass>,
    /// Compare each case's bytes per rail (from the probes file) with the split rule.
    pub rails: bool,
}

/// One case done.
#[derive(Clone, Debug)]
pub struct CaseResult {
    /// Its name.
    pub name: String,
    /// Messages moved.
    pub transfers: u64,
    /// Payload bytes moved.
    pub bytes: u64,
    /// Bytes on (SOUT, SUP), when the rails were checked.
    pub rail_bytes: Option<(u64, u64)>,
    /// Wall time (pattern fills and checks included).
    pub elapsed: Duration,
    /// Time with requests in flight (first post to last completion, summed over the plans).
    pub busy: Duration,
}

impl CaseResult {
    /// `sizes: 34 transfers, 10.50 MB in 1.20 s (9.1 MB/s in flight), rails SOUT 0 B / SUP …`.
    pub fn summary(&self) -> String {
        let mb = self.bytes as f64 / 1e6;
        let secs = self.elapsed.as_secs_f64();
        let busy = self.busy.as_secs_f64();
        let rails = match self.rail_bytes {
            Some((sout, sup)) => format!(", rails SOUT {sout} B / SUP {sup} B as expected"),
            None => String::new(),
        };
        format!(
            "{}: {} transfers, {mb:.2} MB in {secs:.2} s ({:.1} MB/s in flight){rails}",
            self.name,
            self.transfers,
            mb / busy.max(1e-9)
        )
    }
}

/// The split the plugin must apply to a message of `size` bytes on `connection` in `case`:
/// vanilla intra-island all SUP, vanilla inter-island all SOUT, advanced the agent's share.
pub fn expected_rails(connection: &Connection, case: &Case, size: usize) -> (usize, usize) {
    if connection.advanced {
        crate::expected_split(size, case.sup_bw.unwrap_or(0))
    } else {
        match connection.class {
            PathClass::Intra => (0, size),
            PathClass::Inter => (size, 0),
        }
    }
}

/// Walks `cases` in order on one side. The sender sets the agent's hints to each case's SUP
/// share first (advanced mode; cases without one run at 0). `log` gets one line per case.
pub fn walk(
    side: &mut impl Side,
    cases: &[Case],
    agent: Option<&Agent>,
    checks: Checks,
    mut log: impl FnMut(&CaseResult),
) -> Result<Vec<CaseResult>> {
    let version = side.version();
    let probes = if checks.rails || checks.class.is_some() {
        Some(Probes::open_own().map_err(|e| e.context("rail check (set MPIB_PROBES=1)"))?)
    } else {
        None
    };
    let connection = match &probes {
        Some(p) => Some(p.only(side_direction(side))?),
        None => None,
    };
    if let (Some(want), Some(c)) = (checks.class, connection) {
        if c.class != want {
            return Err(Error::Mismatch(format!(
                "{version}: the plugin classified the connection as {:?}-island, expected \
                 {want:?}-island (check MPIB_OOB_ADDR and MPIB_ISLAND_PREFIX_LEN)",
                c.class
            )));
        }
    }
    let mut results = Vec::new();
    for case in cases {
        if let Some(agent) = agent {
            agent.set_sup_bw_all(case.sup_bw.unwrap_or(0));
        }
        let before = match (&probes, connection) {
            (Some(p), Some(c)) if checks.rails => Some(p.at(c.index)?),
            _ => None,
        };
        let start = Instant::now();
        let mut busy = Duration::ZERO;
        for (index, step) in case.steps.iter().enumerate() {
            for iteration in 0..step.iterations {
                busy += side
                    .run_plan(&step.plan, step.seed, iteration)
                    .map_err(|e| e.context(at(version, case, index, step, iteration)))?;
            }
        }
        let elapsed = start.elapsed();
        let mut rail_bytes = None;
        if let (Some(p), Some(before)) = (&probes, before) {
            let after = p.at(before.index)?;
            let moved = (
                after.rail_bytes.0 - before.rail_bytes.0,
                after.rail_bytes.1 - before.rail_bytes.1,
            );
            let expected = case.rail_bytes(|size| expected_rails(&before, case, size));
            if moved != expected {
                return Err(Error::Mismatch(format!(
                    "{version} case {}: {:?} bytes per rail (SOUT, SUP) = {moved:?}, expected \
                     {expected:?} ({}, {:?}-island, sup_bw {:?})",
                    case.name,
                    side_direction(side),
                    if before.advanced {
                        "advanced"
                    } else {
                        "vanilla"
                    },
                    before.class,
                    case.sup_bw
                )));
            }
            rail_bytes = Some(moved);
        }
        let result = CaseResult {
            name: case.name.clone(),
            transfers: case.transfers(),
            bytes: case.payload_bytes(),
            rail_bytes,
            elapsed,
            busy,
        };
        log(&result);
        results.push(result);
    }
    Ok(results)
}

fn side_direction<S: Side>(_: &S) -> Direction {
    S::DIRECTION
}

/// Runs `cases` with the receiver and the sender on two threads of this process (the loopback
/// fabric is in-process), with the handle passed through a channel. The agent, if any, is driven
/// by the sender. Returns the sender's and the receiver's results.
pub fn run_in_process(
    plugin: &Plugin,
    version: Version,
    cases: &[Case],
    recv: &SideOptions,
    send: &SideOptions,
    agent: Option<&Agent>,
    checks: Checks,
) -> Result<(Vec<CaseResult>, Vec<CaseResult>)> {
    let (tx, rx) = mpsc::channel::<[u8; HANDLE_SIZE]>();
    std::thread::scope(|scope| {
        let receiver = scope.spawn(move || -> Result<Vec<CaseResult>> {
            let net = plugin.net(version)?;
            let listener = Listener::new(&net, recv)?;
            let _ = tx.send(listener.handle());
            let mut receiver = listener.accept()?;
            let results = walk(&mut receiver, cases, None, checks, |_| {})?;
            receiver.close()?;
            Ok(results)
        });
        let sender = scope.spawn(move || -> Result<Vec<CaseResult>> {
            let net = plugin.net(version)?;
            let handle = rx
                .recv_timeout(send.connect_deadline)
                .map_err(|_| Error::Timeout("the receiver published no handle".into()))?;
            let mut sender = Sender::connect(&net, send, &handle)?;
            if let Some(agent) = agent {
                agent.wait_for_registrations(1, Duration::from_secs(10))?;
            }
            let results = walk(&mut sender, cases, agent, checks, |_| {})?;
            sender.close()?;
            Ok(results)
        });
        let joined = |h: std::thread::ScopedJoinHandle<'_, Result<Vec<CaseResult>>>, who: &str| {
            h.join()
                .unwrap_or_else(|_| Err(Error::Contract(format!("the {who} thread panicked"))))
                .map_err(|e| e.context(who))
        };
        let received = joined(receiver, "receiver");
        let sent = joined(sender, "sender");
        Ok((sent?, received?))
    })
}
