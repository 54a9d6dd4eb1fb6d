//! One thread serving every client of a listening socket: `poll(2)` on the listener and the
//! clients, each client a small state machine with its own deadline. The registration socket
//! and the metrics endpoint both run on it.
//!
//! Why not a thread per client with a cap: the cap was the attack. 70 idle connections held
//! the 64 threads of the registration socket for a second each and real registrations, which
//! wait 500 ms, went unanswered; 130 to the metrics port, served one at a time with a 2 s read
//! timeout, made a scrape take 6 s. Here an idle client costs a descriptor and a table entry,
//! and is closed at its deadline.
//!
//! Each round of the loop serves every ready client once (a client answers at most one request
//! per round) and accepts at most [`ACCEPTS_PER_ROUND`] newcomers, so neither a client that
//! pipelines requests nor a flood of connections keeps the thread from the others.
//!
//! The table is capped. A newcomer is accepted while the table has at most the cap, so it may
//! briefly hold one more; that newcomer's place is then taken from the oldest **idle** client
//! (between messages: nothing of a request received, no answer being written) that has had
//! [`EVICTABLE_AFTER`] to speak, or, with none idle, from the oldest one stalled part-way
//! through a request that long: a real client's request arrives whole (a registration is 28
//! bytes, a scrape's request head one write), so a partial one still there a round later is a
//! client holding a place, not one being served. A client writing its answer is never evicted
//! (its deadline bounds it), and nobody is evicted while no newcomer waits. When no client can
//! give up its place, the listener is not polled: newcomers wait in the kernel's backlog until a
//! client finishes, times out or may be evicted. A flood of idle or half-sent connections so
//! delays a newcomer by at most [`EVICTABLE_AFTER`] and never refuses it (a real client sends at
//! once, so it is served on the next round, long before it could become the oldest).

use std::io::ErrorKind;
use std::os::unix::io::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::log;
use crate::wake::{poll, poll_entry};

/// How long a new client is safe from eviction: time enough to be read and answered.
pub const EVICTABLE_AFTER: Duration = Duration::from_millis(100);
/// Connections accepted per round at most: between two batches every ready client is served.
pub const ACCEPTS_PER_ROUND: usize = 16;
/// How long the listener rests after an accept failure other than a want of descriptors or
/// memory (which an eviction may cure), doubled on each failure in a row up to
/// [`ACCEPT_PAUSE_LONGEST`]: a listener that keeps failing must not make the thread spin.
const ACCEPT_PAUSE_FIRST: Duration = Duration::from_millis(100);
const ACCEPT_PAUSE_LONGEST: Duration = Duration::from_secs(1);

/// A client connection the loop serves.
pub trait Client {
    /// Its socket.
    fn fd(&self) -> RawFd;
    /// `POLLIN` while it waits to read, `POLLOUT` while it has an answer to write.
    fn events(&self) -> i16;
    /// When it is closed if it has not finished.
    fn deadline(&self) -> Instant;
    /// Whether it is between messages: nothing of a request received, no answer being
    /// written. Only such a client may be evicted.
    fn idle(&self) -> bool;
    /// Whether it is writing an answer: such a client is never evicted.
    fn answering(&self) -> bool {
        false
    }
    /// Its socket is ready (or failed): read or write what it can, answering at most one
    /// request; false closes it.
    fn ready(&mut self) -> bool;
    /// It is being closed at its deadline (count it, for instance).
    fn timed_out(&mut self);
    /// It is being closed to make room for a newer client.
    fn evicted(&mut self);
}

/// What an accept gave.
pub enum Accepted<C> {
    /// A client to serve.
    Client(C),
    /// None pending.
    None,
}

/// Serves clients of `listener` until `stop` is set and `stop_fd` is readable (the stopping
/// thread sets the flag, then wakes `stop_fd`); at most `max_clients` at once, and one more
/// while its place is being made. `accept` takes one pending connection (non-blocking) and makes
/// its client; `name` is for the log.
pub fn serve<C: Client>(
    name: &str,
    listener: RawFd,
    stop: &AtomicBool,
    stop_fd: RawFd,
    max_clients: usize,
    mut accept: impl FnMut() -> std::io::Result<Accepted<C>>,
) {
    let mut table: Table<C> = Table::new(max_clients);
    let mut failures = AcceptFailures::default();
    let mut entries = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        table.expire(now);
        // A newcomer let in past the cap is owed a place: take it as soon as one may be.
        table.make_room(now);
        let listening = table.has_room() && failures.resting_until(now).is_none();
        entries.clear();
        entries.push(poll_entry(stop_fd, libc::POLLIN));
        // A full table does not poll the listener: newcomers wait in the backlog, not spin.
        entries.push(poll_entry(
            if listening { listener } else { -1 },
            libc::POLLIN,
        ));
        entries.extend(
            table
                .clients
                .iter()
                .map(|entry| poll_entry(entry.client.fd(), entry.client.events())),
        );
        let deadline = [
            table.next_deadline(),
            table.next_evictable(),
            failures.resting_until(now),
        ]
        .into_iter()
        .flatten()
        .min();
        if let Err(e) = poll(&mut entries, deadline) {
            log::error(&format!("{name}: poll failed, stopping: {e}"));
            return;
        }
        if entries[0].revents != 0 && stop.load(Ordering::Relaxed) {
            return;
        }
        table.serve_ready(&entries[2..]);
        if entries[1].revents != 0 {
            accept_pending(name, &mut table, &mut accept, &mut failures);
        }
    }
}

/// A client and when it came.
struct Entry<C> {
    client: C,
    since: Instant,
}

/// The clients, in the order they came (the first is the oldest).
struct Table<C> {
    clients: Vec<Entry<C>>,
    max_clients: usize,
}

impl<C: Client> Table<C> {
    fn new(max_clients: usize) -> Table<C> {
        Table {
            clients: Vec::new(),
            max_clients: max_clients.max(1),
        }
    }

    /// Whether a newcomer may be accepted: the table holds at most the cap (one more is let in,
    /// and its place made by [`Table::make_room`]).
    fn has_room(&self) -> bool {
        self.clients.len() <= self.max_clients
    }

    fn push(&mut self, client: C, now: Instant) {
        self.clients.push(Entry { client, since: now });
    }

    /// Closes the clients past their deadline.
    fn expire(&mut self, now: Instant) {
        self.clients.retain_mut(|entry| {
            let expired = entry.client.deadline() <= now;
            if expired {
                entry.client.timed_out();
            }
            !expired
        });
    }

    /// Serves the clients whose entries (in table order) report an event; closes those done.
    fn serve_ready(&mut self, entries: &[libc::pollfd]) {
        let mut index = 0;
        self.clients.retain_mut(|entry| {
            let revents = entries.get(index).map_or(0, |e| e.revents);
            index += 1;
            revents == 0 || entry.client.ready()
        });
    }

    /// Where the table is past its cap (a newcomer let in), evicts the oldest idle client that
    /// has had [`EVICTABLE_AFTER`] to speak; the newest, the newcomer itself, is not a candidate.
    /// False when the table stays past its cap.
    fn make_room(&mut self, now: Instant) -> bool {
        if self.clients.len() <= self.max_clients {
            return true;
        }
        let Some(index) = self.oldest_idle() else {
            return false;
        };
        if now.saturating_duration_since(self.clients[index].since) < EVICTABLE_AFTER {
            return false;
        }
        self.evict(index);
        true
    }

    /// When the table is past its cap and its oldest idle client is too young to evict: when it
    /// may be.
    fn next_evictable(&self) -> Option<Instant> {
        if self.clients.len() <= self.max_clients {
            return None;
        }
        let index = self.oldest_idle()?;
        Some(self.clients[index].since + EVICTABLE_AFTER)
    }

    /// The earliest client deadline.
    fn next_deadline(&self) -> Option<Instant> {
        self.clients
            .iter()
            .map(|entry| entry.client.deadline())
            .min()
    }

    /// The index of the client but the newest that gives up its place first: the oldest idle
    /// one, else the oldest stalled mid-request (not writing an answer).
    fn oldest_idle(&self) -> Option<usize> {
        let older = &self.clients[..self.clients.len().saturating_sub(1)];
        (older.iter().position(|entry| entry.client.idle()))
            .or_else(|| older.iter().position(|entry| !entry.client.answering()))
    }

    /// Gives up the oldest idle client, whatever its age (out of descriptors); false when none
    /// is idle.
    fn give_up_oldest_idle(&mut self) -> bool {
        let Some(index) = self.clients.iter().position(|entry| entry.client.idle()) else {
            return false;
        };
        self.evict(index);
        true
    }

    fn evict(&mut self, index: usize) {
        let mut entry = self.clients.remove(index);
        entry.client.evicted();
    }
}

/// Accepts pending connections, at most [`ACCEPTS_PER_ROUND`], while the table has room.
fn accept_pending<C: Client>(
    name: &str,
    table: &mut Table<C>,
    accept: &mut impl FnMut() -> std::io::Result<Accepted<C>>,
    failures: &mut AcceptFailures,
) {
    for _ in 0..ACCEPTS_PER_ROUND {
        if !table.has_room() {
            return;
        }
        match accept() {
            Ok(Accepted::Client(client)) => {
                failures.succeeded();
                let now = Instant::now();
                table.push(client, now);
                table.make_room(now);
            }
            Ok(Accepted::None) => return,
            Err(e) if passing(&e) => {}
            Err(e) if out_of_resources(&e) => {
                // Out of descriptors or memory: give up the oldest idle client, so that the
                // pending connection can be taken and the listener stops making every poll
                // return at once; with none idle, rest the listener instead.
                let evicted = table.give_up_oldest_idle();
                failures.failed(name, &e, !evicted);
                return;
            }
            Err(e) => {
                failures.failed(name, &e, true);
                return;
            }
        }
    }
}

/// An accept error that concerns the one connection (interrupted, or a network error pending
/// on it, which accept(2) says to treat like EAGAIN): take the next.
fn passing(error: &std::io::Error) -> bool {
    error.kind() == ErrorKind::Interrupted
        || matches!(
            error.raw_os_error(),
            Some(
                libc::ECONNABORTED
                    | libc::EPROTO
                    | libc::ENETDOWN
                    | libc::ENOPROTOOPT
                    | libc::EHOSTDOWN
                    | libc::ENONET
                    | libc::EHOSTUNREACH
                    | libc::EOPNOTSUPP
                    | libc::ENETUNREACH
            )
        )
}

/// An accept error that closing a client may cure.
fn out_of_resources(error: &std::io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// Accept failures: logged at most once per 10 s with their count, and the listener's rest.
struct AcceptFailures {
    last_logged: Option<Instant>,
    unlogged: u64,
    /// Until when the listener is not polled.
    paused_until: Option<Instant>,
    /// The next rest.
    pause: Duration,
}

impl Default for AcceptFailures {
    fn default() -> Self {
        AcceptFailures {
            last_logged: None,
            unlogged: 0,
            paused_until: None,
            pause: ACCEPT_PAUSE_FIRST,
        }
    }
}

impl AcceptFailures {
    /// Until when the listener rests, if it does at `now` (a rest over is no deadline to wake
    /// for: the loop would spin on it).
    fn resting_until(&self, now: Instant) -> Option<Instant> {
        self.paused_until.filter(|until| now < *until)
    }

    /// An accept succeeded: the next failure rests the listener for the shortest time again.
    fn succeeded(&mut self) {
        self.pause = ACCEPT_PAUSE_FIRST;
        self.paused_until = None;
    }

    /// Counts (and maybe logs) a failure; with `rest`, rests the listener.
    fn failed(&mut self, name: &str, error: &std::io::Error, rest: bool) {
        let now = Instant::now();
        self.unlogged += 1;
        let due = self.last_logged.map_or(true, |at| {
            now.saturating_duration_since(at) >= Duration::from_secs(10)
        });
        if due {
            log::warn(&format!(
                "{name}: accept failed {} time(s) since the last such line: {error}",
                self.unlogged
            ));
            self.unlogged = 0;
            self.last_logged = Some(now);
        }
        if rest {
            self.paused_until = Some(now + self.pause);
            self.pause = (self.pause * 2).min(ACCEPT_PAUSE_LONGEST);
        }
    }
}

#[cfg(test)]
#[path = "clients_tests.rs"]
mod tests;
