//! One thread serving every client of a listening socket: `poll(2)` on the listener and the
//! clients, each client a small state machine with its own deadline. The registration socket
//! and the metrics endpoint both run on it.
//!
//! Why not a thread per client with a cap: the cap was the attack. 70 idle connections held
//! the 64 threads of the registration socket for a second each and real registrations, which
//! wait 500 ms, went unanswered; 130 to the metrics port, served one at a time with a 2 s read
//! timeout, made a scrape take 6 s. Here an idle client costs a descriptor and a table entry,
//! and is closed at its deadline. The table is capped; past the cap the oldest client that has
//! had [`EVICTABLE_AFTER`] to speak is closed to make room, so a flood of idle connections
//! delays a newcomer by at most that long and never refuses it (a real client sends at once, so
//! it is served on the next round, long before it could become the oldest). When every client is
//! younger than that, newcomers wait in the kernel's backlog for a round.

use std::io::ErrorKind;
use std::os::unix::io::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::log;
use crate::wake::{poll, poll_entry};

/// How long a new client is safe from eviction: time enough to be read and answered.
pub const EVICTABLE_AFTER: Duration = Duration::from_millis(100);

/// A client connection the loop serves.
pub trait Client {
    /// Its socket.
    fn fd(&self) -> RawFd;
    /// `POLLIN` while it waits to read, `POLLOUT` while it has an answer to write.
    fn events(&self) -> i16;
    /// When it is closed if it has not finished.
    fn deadline(&self) -> Instant;
    /// Its socket is ready (or failed): read or write what it can; false closes it.
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

/// A client and when it came.
struct Entry<C> {
    client: C,
    since: Instant,
}

/// Serves clients of `listener` until `stop` is set and `stop_fd` is readable (the stopping
/// thread sets the flag, then wakes `stop_fd`); at most `max_clients` at once. `accept` takes
/// one pending connection (non-blocking) and makes its client; `name` is for the log.
pub fn serve<C: Client>(
    name: &str,
    listener: RawFd,
    stop: &AtomicBool,
    stop_fd: RawFd,
    max_clients: usize,
    mut accept: impl FnMut() -> std::io::Result<Accepted<C>>,
) {
    let max_clients = max_clients.max(1);
    // In the order they came: the first is the oldest.
    let mut clients: Vec<Entry<C>> = Vec::new();
    let mut accept_errors = AcceptErrors::default();
    let mut entries = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        clients.retain_mut(|entry| {
            let expired = entry.client.deadline() <= now;
            if expired {
                entry.client.timed_out();
            }
            !expired
        });
        let room = make_room(&mut clients, max_clients, now);
        entries.clear();
        entries.push(poll_entry(stop_fd, libc::POLLIN));
        // A full table does not poll the listener: newcomers wait in the backlog, not spin.
        entries.push(poll_entry(if room { listener } else { -1 }, libc::POLLIN));
        entries.extend(
            clients
                .iter()
                .map(|entry| poll_entry(entry.client.fd(), entry.client.events())),
        );
        let mut deadline = clients.iter().map(|entry| entry.client.deadline()).min();
        if let (false, Some(oldest)) = (room, clients.first()) {
            // Full: wake when the oldest may be evicted, to take a newcomer then.
            let evictable = oldest.since + EVICTABLE_AFTER;
            deadline = Some(deadline.map_or(evictable, |at| at.min(evictable)));
        }
        if let Err(e) = poll(&mut entries, deadline) {
            log::error(&format!("{name}: poll failed, stopping: {e}"));
            return;
        }
        if entries[0].revents != 0 && stop.load(Ordering::Relaxed) {
            return;
        }
        let mut index = 2;
        clients.retain_mut(|entry| {
            let revents = entries[index].revents;
            index += 1;
            revents == 0 || entry.client.ready()
        });
        if entries[1].revents != 0 {
            accept_pending(
                name,
                &mut clients,
                max_clients,
                &mut accept,
                &mut accept_errors,
            );
        }
    }
}

/// Makes room for one more client: true when there is (a client evicted if need be).
fn make_room<C: Client>(clients: &mut Vec<Entry<C>>, max_clients: usize, now: Instant) -> bool {
    if clients.len() < max_clients {
        return true;
    }
    match clients.first() {
        Some(oldest) if now.saturating_duration_since(oldest.since) >= EVICTABLE_AFTER => {
            let mut oldest = clients.remove(0);
            oldest.client.evicted();
            true
        }
        _ => false,
    }
}

/// Accepts what is pending while there is room.
fn accept_pending<C: Client>(
    name: &str,
    clients: &mut Vec<Entry<C>>,
    max_clients: usize,
    accept: &mut impl FnMut() -> std::io::Result<Accepted<C>>,
    errors: &mut AcceptErrors,
) {
    while make_room(clients, max_clients, Instant::now()) {
        match accept() {
            Ok(Accepted::Client(client)) => clients.push(Entry {
                client,
                since: Instant::now(),
            }),
            Ok(Accepted::None) => return,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => {
                errors.note(name, &e);
                // Out of descriptors (EMFILE, ENFILE): give up the oldest client, so that the
                // listener's pending connection does not make every poll return at once.
                if !clients.is_empty() {
                    let mut oldest = clients.remove(0);
                    oldest.client.evicted();
                } else {
                    std::thread::sleep(Duration::from_millis(10));
                }
                return;
            }
        }
    }
}

/// Accept failures, logged at most once per 10 s with their count.
#[derive(Default)]
struct AcceptErrors {
    last_logged: Option<Instant>,
    unlogged: u64,
}

impl AcceptErrors {
    fn note(&mut self, name: &str, error: &std::io::Error) {
        self.unlogged += 1;
        let due = self
            .last_logged
            .map_or(true, |at| at.elapsed() >= Duration::from_secs(10));
        if due {
            log::warn(&format!(
                "{name}: accept failed {} time(s) since the last such line: {error}",
                self.unlogged
            ));
            self.unlogged = 0;
            self.last_logged = Some(Instant::now());
        }
    }
}
