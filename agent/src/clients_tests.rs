//! Tests of the serving loop's table and accept rules (clients.rs).
use super::*;
use std::cell::RefCell;
use std::rc::Rc;

/// A client that only says whether it is idle or answering, and writes down how it was closed.
struct Fake {
    name: &'static str,
    idle: bool,
    answering: bool,
    closed: Rc<RefCell<Vec<String>>>,
}

impl Client for Fake {
    fn fd(&self) -> RawFd {
        -1
    }
    fn events(&self) -> i16 {
        libc::POLLIN
    }
    fn deadline(&self) -> Instant {
        Instant::now() + Duration::from_secs(60)
    }
    fn idle(&self) -> bool {
        self.idle
    }
    fn answering(&self) -> bool {
        self.answering
    }
    fn ready(&mut self) -> bool {
        true
    }
    fn timed_out(&mut self) {
        self.closed
            .borrow_mut()
            .push(format!("{} timed out", self.name));
    }
    fn evicted(&mut self) {
        self.closed
            .borrow_mut()
            .push(format!("{} evicted", self.name));
    }
}

fn fake(name: &'static str, idle: bool, closed: &Rc<RefCell<Vec<String>>>) -> Fake {
    Fake {
        name,
        idle,
        answering: !idle,
        closed: Rc::clone(closed),
    }
}

fn names(table: &Table<Fake>) -> Vec<&'static str> {
    table
        .clients
        .iter()
        .map(|entry| entry.client.name)
        .collect()
}

/// A full table evicts nobody until a newcomer is let in; the newcomer's place is taken from
/// the oldest idle client once it has had its time to speak, never from one mid-request or
/// mid-answer, nor from the newcomer; with none idle the table stays one past its cap and
/// takes no other newcomer.
#[test]
fn a_newcomer_takes_the_place_of_the_oldest_idle_client_only() {
    let closed = Rc::new(RefCell::new(Vec::new()));
    let start = Instant::now();
    let mut table = Table::new(2);
    table.push(fake("busy", false, &closed), start);
    table.push(fake("idle", true, &closed), start);
    assert!(table.make_room(start + Duration::from_secs(5)));
    assert!(closed.borrow().is_empty(), "nobody waits: nobody evicted");
    assert!(table.has_room(), "one newcomer may be let in");
    table.push(fake("new", true, &closed), start + Duration::from_secs(5));
    assert!(!table.has_room());
    assert!(
        !table.make_room(start + Duration::from_millis(50)),
        "too young"
    );
    assert_eq!(
        table.next_evictable(),
        Some(start + EVICTABLE_AFTER),
        "wake when the oldest idle client may be evicted"
    );
    assert!(table.make_room(start + Duration::from_secs(5)));
    assert_eq!(*closed.borrow(), ["idle evicted"]);
    assert_eq!(names(&table), ["busy", "new"]);
    assert_eq!(table.next_evictable(), None, "at the cap: nothing owed");

    (
        table.clients[1].client.idle,
        table.clients[1].client.answering,
    ) = (false, true);
    table.push(fake("newer", true, &closed), start + Duration::from_secs(6));
    assert!(
        !table.make_room(start + Duration::from_secs(9)),
        "the others are being served, the newcomer is not a candidate"
    );
    assert_eq!(table.next_evictable(), None);
    assert!(!table.has_room(), "no other newcomer until a place frees");
    assert_eq!(names(&table), ["busy", "new", "newer"]);
    assert_eq!(closed.borrow().len(), 1);

    // "new" stalls part-way through a request instead: with none idle, it gives its place.
    table.clients[1].client.answering = false;
    assert!(table.make_room(start + Duration::from_secs(9)));
    assert_eq!(names(&table), ["busy", "newer"]);
    assert_eq!(
        closed.borrow().last().map(String::as_str),
        Some("new evicted")
    );
}

/// Accepting stops after a batch, a failure that is not a want of resources evicts nobody and
/// rests the listener (longer each time in a row, up to a second), and a want of descriptors
/// gives up the oldest idle client (or rests the listener when none is idle).
#[test]
fn accept_failures_rest_the_listener_and_only_a_want_of_descriptors_evicts() {
    let closed = Rc::new(RefCell::new(Vec::new()));
    let mut table = Table::new(64);
    let mut failures = AcceptFailures::default();
    let mut accepts = 0;
    let mut flood = || {
        accepts += 1;
        Ok(Accepted::Client(fake("flood", true, &closed)))
    };
    accept_pending("test", &mut table, &mut flood, &mut failures);
    assert_eq!(accepts, ACCEPTS_PER_ROUND, "one batch per round");
    assert_eq!(table.clients.len(), ACCEPTS_PER_ROUND);

    let mut invalid = || Err(std::io::Error::from_raw_os_error(libc::EINVAL));
    let mut rests = Vec::new();
    for _ in 0..6 {
        let before = Instant::now();
        accept_pending("test", &mut table, &mut invalid, &mut failures);
        let until = failures.paused_until.unwrap_or(before);
        assert!(failures.resting_until(before).is_some());
        rests.push(until.saturating_duration_since(before).as_millis() / 100);
    }
    assert_eq!(
        rests,
        [1, 2, 4, 8, 10, 10],
        "tenths of a second, doubling up to 1 s"
    );
    assert!(closed.borrow().is_empty(), "an odd failure evicts nobody");
    assert_eq!(
        failures.resting_until(Instant::now() + Duration::from_secs(2)),
        None,
        "a rest over is no deadline to wake for"
    );

    let mut aborted = || Err(std::io::Error::from_raw_os_error(libc::ECONNABORTED));
    let mut failures = AcceptFailures::default();
    accept_pending("test", &mut table, &mut aborted, &mut failures);
    assert!(
        failures.resting_until(Instant::now()).is_none(),
        "one connection's error: take the next"
    );

    let mut emfile = || Err(std::io::Error::from_raw_os_error(libc::EMFILE));
    accept_pending("test", &mut table, &mut emfile, &mut failures);
    assert_eq!(*closed.borrow(), ["flood evicted"]);
    assert!(
        failures.resting_until(Instant::now()).is_none(),
        "a place freed: try again"
    );
    let mut lone = Table::new(4);
    lone.push(fake("busy", false, &closed), Instant::now());
    accept_pending("test", &mut lone, &mut emfile, &mut failures);
    assert_eq!(lone.clients.len(), 1, "a client being served is kept");
    assert!(
        failures.resting_until(Instant::now()).is_some(),
        "nothing to give up: rest"
    );
}
