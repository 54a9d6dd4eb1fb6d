//! The shared listening socket: connections filed under the listen comm their claim names,
//! strangers dropped without failing anything, bounded queues.

use std::io::Write;
use std::net::TcpStream;

use super::*;

const LOCAL: Ipv4Addr = Ipv4Addr::LOCALHOST;

/// A listener of its own (the device index keeps tests apart), with `ids` registered.
fn listener(device: usize, ids: &[u64]) -> Arc<SharedListener> {
    let listener = SharedListener::join(device, LOCAL, ids[0]).unwrap();
    for id in &ids[1..] {
        let again = SharedListener::join(device, LOCAL, *id).unwrap();
        assert!(Arc::ptr_eq(&listener, &again), "one socket per device");
    }
    listener
}

fn connect(listener: &SharedListener, first_bytes: &[u8]) -> TcpStream {
    let mut stream = TcpStream::connect(listener.address()).unwrap();
    stream.write_all(first_bytes).unwrap();
    stream
}

/// Polls `listen_id` until a connection is filed for it (the bytes may take a moment to land).
fn next(listener: &SharedListener, listen_id: u64) -> Socket {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(Incoming::Socket(socket)) = listener.next_for(listen_id).unwrap() {
            return socket;
        }
        assert!(
            Instant::now() < deadline,
            "nothing filed for {listen_id:#x}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Calls `next_for` until no connection waits for its claim, and says what it returned.
fn settle(listener: &SharedListener, listen_id: u64) -> Option<Socket> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let got = match listener.next_for(listen_id).unwrap() {
            Some(Incoming::Socket(socket)) => Some(socket),
            Some(Incoming::Link(..)) => panic!("no link carries handshakes here"),
            None => None,
        };
        if got.is_some() || listener.unclaimed() == 0 {
            return got;
        }
        assert!(
            Instant::now() < deadline,
            "connections still wait for a claim"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn each_connection_goes_to_the_listen_comm_its_claim_names() {
    let (first, second) = (0x1111, 0x2222);
    let listener = listener(9001, &[first, second]);
    let _to_second = connect(&listener, &claim(second));
    let _to_first = connect(&listener, &claim(first));
    let for_first = next(&listener, first);
    let for_second = next(&listener, second);
    assert_ne!(
        for_first.peer_addr().unwrap().as_socket(),
        for_second.peer_addr().unwrap().as_socket()
    );
    assert!(listener.next_for(first).unwrap().is_none(), "one each");
    listener.leave(first);
    listener.leave(second);
}

#[test]
fn strangers_are_dropped_and_the_listen_comm_goes_on() {
    let id = 0x3333;
    let listener = listener(9002, &[id]);
    // A port scan's connect-and-close, junk, a claim for no listen comm, a short claim.
    drop(TcpStream::connect(listener.address()).unwrap());
    let _junk = connect(&listener, &[0x42; CLAIM_LEN]);
    let _unknown = connect(&listener, &claim(0x4444));
    let short = connect(&listener, &claim(id)[..7]);
    drop(short);
    assert!(
        settle(&listener, id).is_none(),
        "no stranger reaches the listen comm"
    );
    let _real = connect(&listener, &claim(id));
    next(&listener, id);
    listener.leave(id);
}

#[test]
fn a_silent_connection_waits_no_longer_than_the_deadline() {
    let id = 0x5555;
    let listener = listener(9003, &[id]);
    let _silent = TcpStream::connect(listener.address()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while listener.unclaimed() == 0 {
        assert!(listener.next_for(id).unwrap().is_none());
        assert!(Instant::now() < deadline, "the connection was never taken");
    }
    let almost = Instant::now() + CLAIM_DEADLINE - Duration::from_millis(100);
    assert!(listener.next_for_at(id, almost).unwrap().is_none());
    assert_eq!(listener.unclaimed(), 1, "still within its deadline");
    let past = Instant::now() + CLAIM_DEADLINE + Duration::from_millis(1);
    assert!(listener.next_for_at(id, past).unwrap().is_none());
    assert_eq!(listener.unclaimed(), 0, "dropped past the deadline");
    listener.leave(id);
}

#[test]
fn a_flood_of_silent_connections_delays_a_real_one_and_never_drops_it() {
    let id = 0x6666;
    let listener = listener(9004, &[id]);
    let mut silent = Vec::new();
    // One at a time, each taken in before the next, so the kernel's backlog never fills.
    while listener.unclaimed() < UNCLAIMED_MAX {
        let waiting = listener.unclaimed();
        silent.push(TcpStream::connect(listener.address()).unwrap());
        let deadline = Instant::now() + Duration::from_secs(5);
        while listener.unclaimed() == waiting {
            assert!(listener.next_for(id).unwrap().is_none());
            assert!(Instant::now() < deadline, "the connection was never taken");
        }
    }
    let _real = connect(&listener, &claim(id));
    for _ in 0..50 {
        assert!(
            listener.next_for(id).unwrap().is_none(),
            "not taken in past the bound"
        );
        assert_eq!(listener.unclaimed(), UNCLAIMED_MAX, "bounded");
        std::thread::sleep(Duration::from_millis(1));
    }
    // The silent ones' deadline passes: they go, and the real one comes out of the backlog.
    let past = Instant::now() + CLAIM_DEADLINE + Duration::from_millis(1);
    let deadline = Instant::now() + Duration::from_secs(5);
    while listener.next_for_at(id, past).unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "the real connection was never filed"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(listener.unclaimed(), 0);
    drop(silent);
    listener.leave(id);
}

#[test]
fn a_closed_listen_comms_connections_go_and_later_claims_for_it_are_strangers() {
    let (kept, closed) = (0x7777, 0x8888);
    let listener = listener(9005, &[kept, closed]);
    let mut early = connect(&listener, &claim(closed));
    let _other = connect(&listener, &claim(kept));
    next(&listener, kept);
    assert!(settle(&listener, kept).is_none(), "every claim read");
    listener.leave(closed);
    assert!(listener.next_for(closed).unwrap().is_none());
    // What was filed under it is closed: its connector hears the end.
    early
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut byte = [0u8; 1];
    let read = std::io::Read::read(&mut early, &mut byte);
    assert!(
        matches!(&read, Ok(0))
            || matches!(&read, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
        "the filed connection was closed: {read:?}"
    );
    let _late = connect(&listener, &claim(closed));
    assert!(settle(&listener, kept).is_none());
    listener.leave(kept);
}

#[test]
fn the_socket_goes_with_its_last_listen_comm() {
    let listener = listener(9006, &[0x9999]);
    let watched = Arc::downgrade(&listener);
    listener.leave(0x9999);
    drop(listener);
    assert!(
        watched.upgrade().is_none(),
        "no one holds the socket any more"
    );
    let fresh = SharedListener::join(9006, LOCAL, 0xAAAA).unwrap();
    assert!(
        !std::ptr::eq(Arc::as_ptr(&fresh), watched.as_ptr()),
        "the next listen makes a socket of its own"
    );
    fresh.leave(0xAAAA);
}

#[test]
fn a_claim_reads_back_and_anything_else_is_refused() {
    assert_eq!(read_claim(&claim(0xDEAD_BEEF)), Ok(0xDEAD_BEEF));
    let mut bytes = claim(1);
    bytes[0] = b'X';
    assert!(read_claim(&bytes).unwrap_err().contains("no MPIB claim"));
    assert_ne!(fresh_listen_id().unwrap(), fresh_listen_id().unwrap());
}
