use std::io::Write;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;

use super::*;

const SENDER: Ipv4Addr = Ipv4Addr::new(10, 100, 0, 9);

fn hello() -> Hello {
    Hello {
        target_qpn: 0x1234,
        source_qpn: 0x5678,
        source_addr: SENDER.octets(),
        source_port: 4000,
        secret: 0x5EC2E7,
    }
}

/// A connection: the end the rail keeps, and the far end a test writes into.
fn connection() -> (OwnedFd, UnixStream) {
    let (near, far) = UnixStream::pair().unwrap();
    (OwnedFd::from(near), far)
}

fn dropped_why(outcome: &Outcome) -> &str {
    match outcome {
        Outcome::Dropped { why, .. } => why,
        Outcome::Hello { .. } => panic!("a hello, not a drop"),
    }
}

#[test]
fn a_hello_in_pieces_is_handed_on_once_whole() {
    let mut unclaimed = Unclaimed::new();
    let (near, mut far) = connection();
    let now = Instant::now();
    assert!(matches!(unclaimed.make_room(now), Ok(None)));
    let token = unclaimed.admit(near, SENDER, now);
    assert!(Unclaimed::owns(token));
    let bytes = hello().encode();
    far.write_all(&bytes[..10]).unwrap();
    let mut out = Vec::new();
    unclaimed.pass(now, &mut out);
    assert!(out.is_empty(), "a third of a hello is not a hello");
    // Not marked readable: not read, however much has come.
    far.write_all(&bytes[10..]).unwrap();
    unclaimed.pass(now, &mut out);
    assert!(out.is_empty());
    unclaimed.mark_readable(token);
    unclaimed.pass(now, &mut out);
    match out.pop() {
        Some(Outcome::Hello {
            hello: got, sender, ..
        }) => {
            assert_eq!((got, sender), (hello(), SENDER));
        }
        _ => panic!("the whole hello should be handed on"),
    }
    assert!(unclaimed.is_empty());
}

/// A full table keeps young connections (a burst of real ones waits for their hellos to be
/// read) and pushes the oldest out once it had its time.
#[test]
fn past_the_cap_the_oldest_connection_is_pushed_out_once_it_had_its_time() {
    let mut unclaimed = Unclaimed::new();
    let now = Instant::now();
    let mut far_ends = Vec::new();
    for index in 0..MAX_UNCLAIMED {
        let (near, far) = connection();
        far_ends.push(far);
        let sender = Ipv4Addr::new(10, 0, 0, index as u8);
        assert!(matches!(unclaimed.make_room(now), Ok(None)));
        unclaimed.admit(near, sender, now);
    }
    assert!(!unclaimed.has_room());
    let early = now + PUSH_OUT_AFTER / 2;
    assert_eq!(
        unclaimed.make_room(early).err(),
        Some(now + PUSH_OUT_AFTER),
        "too young"
    );
    let pushed_out = unclaimed.make_room(now + PUSH_OUT_AFTER).unwrap();
    let (near, _far) = connection();
    unclaimed.admit(near, SENDER, now + PUSH_OUT_AFTER);
    match pushed_out {
        Some((sender, why)) => {
            assert_eq!(sender, Ipv4Addr::new(10, 0, 0, 0), "the oldest");
            assert!(why.contains("oldest of 64"), "{why}");
        }
        _ => panic!("the oldest should have been pushed out"),
    }
    assert_eq!(unclaimed.entries.len(), MAX_UNCLAIMED);
}

#[test]
fn a_silent_connection_is_dropped_at_the_deadline_and_no_sooner() {
    let mut unclaimed = Unclaimed::new();
    let (near, _far) = connection();
    let now = Instant::now();
    unclaimed.admit(near, SENDER, now);
    assert_eq!(unclaimed.next_deadline(), Some(now + HELLO_DEADLINE));
    let mut out = Vec::new();
    unclaimed.pass(now + HELLO_DEADLINE - Duration::from_millis(1), &mut out);
    assert!(out.is_empty());
    unclaimed.pass(now + HELLO_DEADLINE, &mut out);
    assert!(dropped_why(&out[0]).contains("no whole hello within 2 s"));
    assert!(unclaimed.is_empty() && unclaimed.next_deadline().is_none());
}

#[test]
fn a_close_or_junk_before_the_hello_drops_the_connection_by_name() {
    let mut unclaimed = Unclaimed::new();
    let now = Instant::now();
    let (near, far) = connection();
    unclaimed.admit(near, SENDER, now);
    drop(far);
    let (near, mut far) = connection();
    unclaimed.admit(near, SENDER, now);
    far.write_all(&[0x5a; HELLO_LEN]).unwrap();
    let mut out = Vec::new();
    unclaimed.pass(now, &mut out);
    let mut reasons: Vec<&str> = out.iter().map(dropped_why).collect();
    reasons.sort_unstable();
    assert!(reasons[0].contains("bad hello magic"), "{reasons:?}");
    assert!(reasons[1].contains("closed before"), "{reasons:?}");
}
