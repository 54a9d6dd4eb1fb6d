//! `--comms N`: N connections in one process, each with its sender and receiver thread, moving
//! each row at the same time; the first prints one row for all of them (bytes summed, time the
//! slowest connection's). Many communicators share a node's rails in a real job (NCCL opens
//! several per rank pair), and on the loopback rate model they share its modelled rails: this
//! is how a policy agent's aggregate is measured.
//!
//! The connections meet at a barrier before each timed pass and after it. The barrier waits at
//! most the run's `--timeout`, and a connection that fails releases the others at once with an
//! error, so a failure never leaves the rest waiting forever.

use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// One row's totals over the connections.
#[derive(Clone, Copy, Debug, Default)]
pub struct Totals {
    /// Payload bytes of every connection.
    pub bytes: u64,
    /// The slowest connection's timed pass.
    pub elapsed: Duration,
}

struct State {
    arrived: usize,
    generation: u64,
    failed: Option<String>,
    totals: Vec<Totals>,
    /// Per row, each connection's own pass.
    passes: Vec<Vec<Totals>>,
}

/// The connections of one run.
pub struct Group {
    members: usize,
    state: Mutex<State>,
    turn: Condvar,
}

impl Group {
    /// A group of `members` connections.
    pub fn new(members: usize) -> Group {
        Group {
            members,
            state: Mutex::new(State {
                arrived: 0,
                generation: 0,
                failed: None,
                totals: Vec::new(),
                passes: Vec::new(),
            }),
            turn: Condvar::new(),
        }
    }

    /// Connections in the group.
    pub fn members(&self) -> usize {
        self.members
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until every connection has arrived (or one failed, or `limit` passed).
    pub fn meet(&self, what: &str, limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        let mut state = self.lock();
        if let Some(why) = &state.failed {
            return Err(format!("another connection failed: {why}"));
        }
        let generation = state.generation;
        state.arrived += 1;
        if state.arrived == self.members {
            state.arrived = 0;
            state.generation += 1;
            self.turn.notify_all();
            return Ok(());
        }
        while state.generation == generation {
            if let Some(why) = &state.failed {
                return Err(format!("another connection failed: {why}"));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let missing = self.members - state.arrived;
                state.failed = Some(format!("{missing} connection(s) did not reach {what}"));
                self.turn.notify_all();
                return Err(format!(
                    "--comms: {missing} connection(s) did not reach {what} within {limit:?}"
                ));
            }
            state = self
                .turn
                .wait_timeout(state, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        Ok(())
    }

    /// Marks the group failed (the others stop at their next meeting, or at once if waiting).
    pub fn fail(&self, why: &str) {
        let mut state = self.lock();
        state.failed.get_or_insert_with(|| why.to_string());
        self.turn.notify_all();
    }

    /// Adds connection `member`'s pass to row `row`.
    pub fn add(&self, row: usize, member: usize, bytes: u64, elapsed: Duration) {
        let mut state = self.lock();
        if state.totals.len() <= row {
            state.totals.resize(row + 1, Totals::default());
            state
                .passes
                .resize(row + 1, vec![Totals::default(); self.members]);
        }
        let totals = &mut state.totals[row];
        totals.bytes += bytes;
        totals.elapsed = totals.elapsed.max(elapsed);
        if let Some(pass) = state.passes[row].get_mut(member) {
            *pass = Totals { bytes, elapsed };
        }
    }

    /// Row `row`'s totals of the connections `member % ways == way`, one per way (`--dev` with
    /// `ways` devices deals the connections out in turn): bytes summed, the slowest one's time.
    pub fn totals_by(&self, row: usize, ways: usize) -> Vec<Totals> {
        let state = self.lock();
        let mut out = vec![Totals::default(); ways.max(1)];
        for (member, pass) in state.passes.get(row).into_iter().flatten().enumerate() {
            let way = &mut out[member % ways.max(1)];
            way.bytes += pass.bytes;
            way.elapsed = way.elapsed.max(pass.elapsed);
        }
        out
    }

    /// Row `row`'s totals (complete once every connection has met after adding).
    pub fn totals(&self, row: usize) -> Totals {
        self.lock().totals.get(row).copied().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn members_meet_add_and_a_failure_releases_the_rest() {
        let group = Arc::new(Group::new(3));
        let threads: Vec<_> = (0..3u64)
            .map(|i| {
                let group = Arc::clone(&group);
                std::thread::spawn(move || {
                    group.meet("start", Duration::from_secs(5)).unwrap();
                    group.add(0, i as usize, 10 * (i + 1), Duration::from_millis(i + 1));
                    group.meet("end", Duration::from_secs(5)).unwrap();
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let totals = group.totals(0);
        assert_eq!(
            (totals.bytes, totals.elapsed),
            (60, Duration::from_millis(3))
        );
        // Two devices dealt in turn: members 0 and 2 on the first, member 1 on the second.
        let by_device: Vec<(u64, Duration)> = group
            .totals_by(0, 2)
            .iter()
            .map(|t| (t.bytes, t.elapsed))
            .collect();
        assert_eq!(
            by_device,
            [
                (40, Duration::from_millis(3)),
                (20, Duration::from_millis(2))
            ]
        );

        let waiting = Arc::clone(&group);
        let waiter = std::thread::spawn(move || waiting.meet("row 1", Duration::from_secs(30)));
        std::thread::sleep(Duration::from_millis(50));
        group.fail("connection 2: connect refused");
        let released = waiter.join().unwrap();
        assert!(released.unwrap_err().contains("connect refused"));
        let late = Group::new(2).meet("row 0", Duration::from_millis(20));
        assert!(late.unwrap_err().contains("did not reach row 0"));
    }
}
