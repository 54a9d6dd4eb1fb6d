//! Connections accepted on a tcp rail's port that have not said yet which QP they are for.
//!
//! Why bounded, short-lived and read only when readable: anyone who reaches the port can open
//! them. Kept without limit for 10 s each and every one read on every pass of the rail thread,
//! 2,000 idle ones doubled the thread's CPU and cut the rail's throughput by a third, and enough
//! of them ran the process out of descriptors (issue 34). A real peer writes its hello right
//! after its connect completes, so it needs neither many places nor long: at most
//! [`MAX_UNCLAIMED`] wait at once, each for at most [`HELLO_DEADLINE`], and only those epoll
//! reported readable are read. A full table takes a new connection only in the place of the
//! oldest, and only once that one has had [`PUSH_OUT_AFTER`] to say its hello: a burst of real
//! connections (a connection's QPs and its peers' all connecting at once, more than the table
//! holds) waits in the listener's backlog until the ones ahead are claimed, rather than pushing
//! each other out before their hellos were read.

use std::collections::{HashMap, VecDeque};
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use super::socket;
use crate::proto::tcp_wire::{Hello, HELLO_LEN};

/// Connections waiting for their hello at once, per rail. A connection's QPs connect a few at a
/// time per rail (a dozen per connection at most, `wire::MAX_QPS`), and NCCL brings its
/// connections up one call at a time, so real hellos never queue this deep.
pub(super) const MAX_UNCLAIMED: usize = 64;
/// How long a connection may take to send its whole hello.
pub(super) const HELLO_DEADLINE: Duration = Duration::from_secs(2);
/// How long a connection keeps its place against newer ones: time enough for a real peer's
/// hello, which its rail thread writes as soon as its connect completes.
pub(super) const PUSH_OUT_AFTER: Duration = Duration::from_millis(250);
/// The epoll tokens of unclaimed connections: above every QP number (a `u32`), below the rail
/// thread's own tokens (src/fabric/tcp/thread.rs, from `u64::MAX` down).
const FIRST_TOKEN: u64 = 1 << 32;
const LAST_TOKEN: u64 = u64::MAX - 64;

struct Entry {
    socket: OwnedFd,
    sender: Ipv4Addr,
    hello: [u8; HELLO_LEN],
    got: usize,
    since: Instant,
}

/// What became of an unclaimed connection.
pub(super) enum Outcome {
    /// Its hello is in (decoded, not yet checked against the QP it names).
    Hello {
        socket: OwnedFd,
        sender: Ipv4Addr,
        hello: Hello,
    },
    /// Dropped (closed here), and why.
    Dropped { sender: Ipv4Addr, why: String },
}

/// The rail's unclaimed connections.
pub(super) struct Unclaimed {
    entries: HashMap<u64, Entry>,
    /// Tokens in the order they came (some already gone): the oldest first, whose deadline is
    /// the nearest.
    arrivals: VecDeque<u64>,
    readable: Vec<u64>,
    next_token: u64,
}

impl Unclaimed {
    pub(super) fn new() -> Unclaimed {
        Unclaimed {
            entries: HashMap::with_capacity(MAX_UNCLAIMED + 1),
            arrivals: VecDeque::new(),
            readable: Vec::new(),
            next_token: FIRST_TOKEN,
        }
    }

    /// Whether `token` is an unclaimed connection's.
    pub(super) fn owns(token: u64) -> bool {
        (FIRST_TOKEN..LAST_TOKEN).contains(&token)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Makes a place for one more connection at `now`: `Ok(None)` when there is one,
    /// `Ok(Some((sender, why)))` the oldest pushed out for it, `Err(when)` none before `when`
    /// (every waiting one is younger than [`PUSH_OUT_AFTER`]).
    pub(super) fn make_room(
        &mut self,
        now: Instant,
    ) -> Result<Option<(Ipv4Addr, String)>, Instant> {
        if self.entries.len() < MAX_UNCLAIMED {
            return Ok(None);
        }
        let Some((token, sender)) = self.oldest() else {
            return Ok(None);
        };
        let since = self.entries.get(&token).map_or(now, |entry| entry.since);
        if now.saturating_duration_since(since) < PUSH_OUT_AFTER {
            return Err(since + PUSH_OUT_AFTER);
        }
        self.entries.remove(&token);
        let why = format!("the oldest of {MAX_UNCLAIMED} connections without a hello");
        Ok(Some((sender, why)))
    }

    /// Whether [`Unclaimed::make_room`] need push anyone out.
    pub(super) fn has_room(&self) -> bool {
        self.entries.len() < MAX_UNCLAIMED
    }

    /// Takes in a connection from `sender` (after [`Unclaimed::make_room`]): its epoll token.
    pub(super) fn admit(&mut self, socket: OwnedFd, sender: Ipv4Addr, now: Instant) -> u64 {
        let token = self.next_token;
        self.next_token = match token + 1 {
            next if next < LAST_TOKEN => next,
            _ => FIRST_TOKEN,
        };
        let entry = Entry {
            socket,
            sender,
            hello: [0; HELLO_LEN],
            got: 0,
            since: now,
        };
        self.entries.insert(token, entry);
        self.arrivals.push_back(token);
        // Bytes that came with the connection raise no edge of their own: read once now.
        self.readable.push(token);
        token
    }

    /// epoll said `token`'s connection has bytes (or closed).
    pub(super) fn mark_readable(&mut self, token: u64) {
        if self.entries.contains_key(&token) {
            self.readable.push(token);
        }
    }

    /// Reads the hellos of the connections marked readable and drops those past the deadline.
    pub(super) fn pass(&mut self, now: Instant, out: &mut Vec<Outcome>) {
        while let Some(token) = self.readable.pop() {
            let Some(entry) = self.entries.get_mut(&token) else {
                continue;
            };
            let sender = entry.sender;
            match read_hello(entry) {
                Ok(None) => {}
                Ok(Some(hello)) => {
                    if let Some(entry) = self.entries.remove(&token) {
                        let socket = entry.socket;
                        out.push(Outcome::Hello {
                            socket,
                            sender,
                            hello,
                        });
                    }
                }
                Err(why) => {
                    self.entries.remove(&token);
                    out.push(Outcome::Dropped { sender, why });
                }
            }
        }
        while let Some((token, sender)) = self.oldest() {
            let expired = (self.entries.get(&token))
                .is_some_and(|entry| now.duration_since(entry.since) >= HELLO_DEADLINE);
            if !expired {
                break;
            }
            self.entries.remove(&token);
            let why = format!("no whole hello within {} s", HELLO_DEADLINE.as_secs());
            out.push(Outcome::Dropped { sender, why });
        }
    }

    /// When the oldest connection's deadline passes.
    pub(super) fn next_deadline(&mut self) -> Option<Instant> {
        let (token, _) = self.oldest()?;
        self.entries
            .get(&token)
            .map(|entry| entry.since + HELLO_DEADLINE)
    }

    /// The oldest connection still waiting (forgetting the arrivals already gone).
    fn oldest(&mut self) -> Option<(u64, Ipv4Addr)> {
        while let Some(&token) = self.arrivals.front() {
            if let Some(entry) = self.entries.get(&token) {
                return Some((token, entry.sender));
            }
            self.arrivals.pop_front();
        }
        None
    }
}

/// Reads what has come of `entry`'s hello: `Ok(Some)` once whole and well-formed, `Ok(None)`
/// while more is to come, `Err` why the connection is to be dropped.
fn read_hello(entry: &mut Entry) -> Result<Option<Hello>, String> {
    while entry.got < HELLO_LEN {
        let target = entry.hello[entry.got..].as_mut_ptr() as u64;
        match socket::receive(entry.socket.as_raw_fd(), target, HELLO_LEN - entry.got) {
            Ok(None) => return Ok(None),
            Ok(Some(0)) => return Err("closed before its whole hello".to_string()),
            Ok(Some(n)) => entry.got += n,
            Err(e) => return Err(e.to_string()),
        }
    }
    Hello::decode(&entry.hello).map(Some)
}

#[cfg(test)]
#[path = "unclaimed_tests.rs"]
mod tests;
