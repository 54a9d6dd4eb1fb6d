//! The shared control link: proposals and answers agree on one connection, notices reach the
//! comm they name, and a link lives exactly as long as its comms.

use std::io::Write;
use std::net::{Ipv4Addr, TcpListener, TcpStream};

use super::ride::opens_waiting;
use super::*;

/// One handshake's TCP connection, both ends non-blocking: (connector's, acceptor's).
fn handshake_connection() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let ours = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (theirs, _) = listener.accept().unwrap();
    ours.set_nonblocking(true).unwrap();
    theirs.set_nonblocking(true).unwrap();
    (ours, theirs)
}

/// A path to a process of its own, so that tests running at once never share links.
pub(crate) fn test_path() -> PathKey {
    PathKey {
        peer_process: fresh_name() | 1 << 63,
        local: Ipv4Addr::LOCALHOST,
        remote: Ipv4Addr::LOCALHOST,
        budget_ms: 1000,
    }
}

/// Runs one handshake's link exchange between "processes" `connector` (this side's number in
/// the acceptor's registry) and the acceptor over `path`: (connector's share, acceptor's share).
pub(crate) fn link_comm(path: PathKey, connector: u64) -> (Attachment, Attachment) {
    let (ours, theirs) = handshake_connection();
    let names = Names {
        local: fresh_name(),
        peer: fresh_name(),
    };
    let proposal = propose(path, names, None, 0);
    let ready = Ready {
        existing_link: proposal.existing.as_ref().map_or(0, Attachment::link_id),
        fresh_link: proposal.fresh_link,
    };
    let theirs_names = Names {
        local: names.peer,
        peer: names.local,
    };
    let accepted = answer(connector, &ready, Some(&theirs), 1000, theirs_names, 0).unwrap();
    let chosen = accepted.link_id();
    let connected = settle(proposal, chosen, path, Some(&ours), names).unwrap();
    (connected, accepted)
}

fn wait_for(attachment: &Attachment, wanted: impl Fn(&Heard) -> bool) -> Heard {
    for step in 0..500 {
        let heard = attachment.hear(step);
        if wanted(&heard) {
            return heard;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    panic!("never heard it: {:?}", attachment.hear(0));
}

#[test]
fn later_comms_between_two_processes_ride_the_first_ones_link() {
    let path = test_path();
    let (a, a_peer) = link_comm(path, path.peer_process);
    let (b, b_peer) = link_comm(path, path.peer_process);
    assert_eq!(a.link_id(), b.link_id());
    assert!(Arc::ptr_eq(&a.link, &b.link) && Arc::ptr_eq(&a_peer.link, &b_peer.link));
    // Another path (another address or process) gets its own.
    let other = PathKey {
        budget_ms: 2000,
        ..path
    };
    let (c, _c_peer) = link_comm(other, path.peer_process);
    assert_ne!(c.link_id(), a.link_id());
}

#[test]
fn a_notice_reaches_the_comm_it_names_and_no_other() {
    let path = test_path();
    let (a, a_peer) = link_comm(path, path.peer_process);
    let (b, b_peer) = link_comm(path, path.peer_process);
    a_peer.tell_failed("the sup rail (mlx5_1) QP 0x12: retry exceeded");
    let heard = wait_for(&a, |h| !matches!(h, Heard::Nothing));
    assert!(
        matches!(&heard, Heard::Failed { text, .. } if text.contains("retry exceeded")),
        "{heard:?}"
    );
    assert_eq!(b.hear(1), Heard::Nothing);
    // Closing b's peer tells b, and the link stays for a.
    drop(b_peer);
    wait_for(&b, |h| matches!(h, Heard::Closed { .. }));
    assert!(
        matches!(a.hear(2), Heard::Failed { .. }),
        "a still knows why"
    );
    assert_eq!(a_peer.hear(3), Heard::Nothing);
}

#[test]
fn the_link_closes_with_its_last_comm_and_the_other_side_hears_it() {
    let path = test_path();
    let (a, a_peer) = link_comm(path, path.peer_process);
    let (b, b_peer) = link_comm(path, path.peer_process);
    drop(a);
    wait_for(&a_peer, |h| matches!(h, Heard::Closed { .. }));
    assert_eq!(b_peer.hear(1), Heard::Nothing, "the link lives on for b");
    let key = LinkKey::Outgoing(path);
    assert!(registry().links.contains_key(&key));
    drop(b);
    assert!(
        !registry().links.contains_key(&key),
        "closed with its last comm"
    );
    // b's peer hears b's close first; the end of the link after it does not hide it.
    wait_for(&b_peer, |h| matches!(h, Heard::Closed { .. }));
    // A killed process says nothing: the link's end is what its comms hear.
    let (c, c_peer) = link_comm(path, path.peer_process);
    assert_ne!(
        c.link_id(),
        b_peer.link_id(),
        "a new link once the old one closed"
    );
    let stream = c.link.lock().stream.try_clone().unwrap();
    stream.shutdown(std::net::Shutdown::Both).unwrap();
    let heard = wait_for(&c_peer, |h| matches!(h, Heard::LinkEnded { .. }));
    assert!(
        matches!(&heard, Heard::LinkEnded { why, .. } if why == "was closed"),
        "{heard:?}"
    );
}

#[test]
fn an_acceptor_that_closed_the_proposed_link_keeps_the_new_one_and_both_ends_agree() {
    let path = test_path();
    let (a, a_peer) = link_comm(path, path.peer_process);
    // The acceptor's side let go of the link (its comm closed) while this side still holds it.
    drop(a_peer);
    let (b, b_peer) = link_comm(path, path.peer_process);
    assert_ne!(b.link_id(), a.link_id(), "the answer picked the fresh link");
    assert_eq!(b.link_id(), b_peer.link_id());
    // And later connections propose the new one.
    let (c, _c_peer) = link_comm(path, path.peer_process);
    assert_eq!(c.link_id(), b.link_id());
}

#[test]
fn a_proposal_never_answered_is_given_back_and_its_notice_dropped() {
    let path = test_path();
    let (a, a_peer) = link_comm(path, path.peer_process);
    let names = Names {
        local: fresh_name(),
        peer: fresh_name(),
    };
    let proposal = propose(path, names, None, 0);
    assert_eq!(
        proposal.existing.as_ref().map(Attachment::link_id),
        Some(a.link_id())
    );
    assert_eq!(a.link.lock().comms, 2);
    drop(proposal);
    assert_eq!(a.link.lock().comms, 1);
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert_eq!(
        a_peer.hear(1),
        Heard::Nothing,
        "a notice for a comm never attached is dropped"
    );
}

#[test]
fn bytes_that_are_not_frames_end_the_link() {
    let path = test_path();
    let (a, a_peer) = link_comm(path, path.peer_process);
    let mut stream = a.link.lock().stream.try_clone().unwrap();
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: mpib\r\n\r\n")
        .unwrap();
    let heard = wait_for(&a_peer, |h| !matches!(h, Heard::Nothing));
    assert!(
        matches!(&heard, Heard::LinkEnded { why, .. } if why.contains("no frame")),
        "{heard:?}"
    );
}

#[test]
fn the_process_number_is_drawn_once_and_names_are_never_reused() {
    assert_eq!(process_id(), process_id());
    assert_ne!(process_id(), 0);
    let (x, y) = (fresh_name(), fresh_name());
    assert!(x != 0 && y > x);
}

#[test]
fn a_peer_that_reads_no_notices_has_its_link_shut_down_rather_than_lose_them() {
    let path = test_path();
    let (a, a_peer) = link_comm(path, path.peer_process);
    {
        let mut state = a.link.lock();
        // As if the peer had read nothing for a long while: the output is full.
        state.output.resize(OUTPUT_MAX, 0);
        state.queue_notice(NoticeKind::Closed, 42, "");
        assert!(state.output.is_empty());
        let why = &state.ended.as_ref().expect("the link ended").1;
        assert!(why.contains("unread"), "{why}");
    }
    assert!(matches!(a.hear(1), Heard::LinkEnded { .. }));
    wait_for(&a_peer, |h| matches!(h, Heard::LinkEnded { .. }));
}

#[test]
fn pumping_every_link_files_notices_nobody_asked_for() {
    let path = test_path();
    let (a, a_peer) = link_comm(path, path.peer_process);
    a_peer.tell_failed("the sout rail is gone");
    for _ in 0..200 {
        pump_all(5, &mut Vec::new());
        if a.link.lock().heard.get(&a.local) != Some(&Heard::Nothing) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    assert!(matches!(
        a.link.lock().heard.get(&a.local),
        Some(Heard::Failed { .. })
    ));
}

#[test]
fn a_notice_of_an_unknown_kind_ends_the_link() {
    let path = test_path();
    let (a, a_peer) = link_comm(path, path.peer_process);
    let mut stream = a.link.lock().stream.try_clone().unwrap();
    let mut frame = link_frame::NOTICE_MAGIC.to_vec();
    frame.push(9);
    frame.extend_from_slice(&a_peer.local.to_le_bytes());
    frame.extend_from_slice(&0u16.to_le_bytes());
    stream.write_all(&frame).unwrap();
    let heard = wait_for(&a_peer, |h| !matches!(h, Heard::Nothing));
    assert!(
        matches!(&heard, Heard::LinkEnded { why, .. } if why.contains("unknown kind 9")),
        "{heard:?}"
    );
}

/// Polls `receive` until it yields something other than "not yet".
fn ride_receive(ride: &mut Ride) -> Result<Vec<u8>, RideError> {
    for step in 0..1000 {
        pump_incoming(step);
        if let Some(message) = ride.receive(step).transpose() {
            return message;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    panic!("the ride heard nothing");
}

/// Polls the links peers made until an open for `listen` is filed.
fn next_open(listen: u64) -> (Ride, Vec<u8>) {
    for step in 0..1000 {
        pump_incoming(step);
        if let Some(open) = take_open(listen) {
            return open;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    panic!("no open for {listen:#x}");
}

#[test]
fn a_later_handshake_rides_the_link_to_its_listen_comm_and_back() {
    let path = test_path();
    let (a, a_peer) = link_comm(path, path.peer_process);
    let listen = fresh_name();
    let _opens = ListenOpens::register(listen);
    let mut ours = Ride::start(path, listen, 0).expect("the link is up");
    assert_eq!(a.link.lock().comms, 2, "the ride holds a share");
    ours.send(b"request", 0).unwrap();
    let (mut theirs, request) = next_open(listen);
    assert_eq!(request, b"request");
    assert_eq!(theirs.addresses().1, ours.addresses().0);
    theirs.send(b"reply", 0).unwrap();
    assert_eq!(ride_receive(&mut ours).unwrap(), b"reply");
    ours.send(b"ready", 0).unwrap();
    assert_eq!(ride_receive(&mut theirs).unwrap(), b"ready");
    theirs.send(b"answer", 0).unwrap();
    assert_eq!(ride_receive(&mut ours).unwrap(), b"answer");
    assert!(
        Arc::ptr_eq(ours.link(), &a.link) && Arc::ptr_eq(theirs.link(), &a_peer.link),
        "both ends on the link, no connection of its own"
    );
    ours.finish();
    theirs.finish();
    drop((ours, theirs));
    assert_eq!(a.link.lock().comms, 1, "the shares came back");
    assert_eq!(a.hear(1), Heard::Nothing, "finished rides say nothing");
}

#[test]
fn an_open_naming_no_listen_comm_fails_that_handshake_alone() {
    let path = test_path();
    let (a, a_peer) = link_comm(path, path.peer_process);
    let mut ride = Ride::start(path, 0x5eed, 0).unwrap();
    ride.send(b"request", 0).unwrap();
    let error = ride_receive(&mut ride).unwrap_err();
    assert!(
        matches!(&error, RideError::Abandoned(why) if why.contains("no open listen comm")),
        "{error}"
    );
    assert_eq!(a.hear(2), Heard::Nothing, "the link goes on");
    assert_eq!(a_peer.hear(2), Heard::Nothing);
    assert!(a.link.lock().ended.is_none());
}

#[test]
fn a_side_that_gives_up_tells_the_other() {
    let path = test_path();
    let (_a, _a_peer) = link_comm(path, path.peer_process);
    let listen = fresh_name();
    let registered = ListenOpens::register(listen);
    // The connector gives up after the acceptor took the open.
    let mut ours = Ride::start(path, listen, 0).unwrap();
    ours.send(b"request", 0).unwrap();
    let (mut theirs, _) = next_open(listen);
    ours.set_reason("connect to 127.0.0.1: aborted");
    drop(ours);
    let error = ride_receive(&mut theirs).unwrap_err();
    assert_eq!(
        error,
        RideError::Abandoned("connect to 127.0.0.1: aborted".into())
    );
    // A listen comm that closes with opens waiting refuses them.
    let mut waiting = Ride::start(path, listen, 0).unwrap();
    waiting.send(b"request", 0).unwrap();
    for step in 0..1000 {
        pump_incoming(step);
        if opens_waiting(listen) > 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    drop(registered);
    let error = ride_receive(&mut waiting).unwrap_err();
    assert!(
        matches!(&error, RideError::Abandoned(why) if why.contains("was closed")),
        "{error}"
    );
}

#[test]
fn opens_past_a_listen_comms_share_are_refused() {
    let path = test_path();
    let (_a, _a_peer) = link_comm(path, path.peer_process);
    let listen = fresh_name();
    let _opens = ListenOpens::register(listen);
    let mut rides: Vec<Ride> = (0..=ride::OPENS_PER_LISTEN_MAX)
        .map(|_| {
            let mut ride = Ride::start(path, listen, 0).unwrap();
            ride.send(b"request", 0).unwrap();
            ride
        })
        .collect();
    let last = rides.last_mut().unwrap();
    let error = ride_receive(last).unwrap_err();
    assert!(
        matches!(&error, RideError::Abandoned(why) if why.contains("already wait")),
        "{error}"
    );
    let filed = opens_waiting(listen);
    assert_eq!(filed, ride::OPENS_PER_LISTEN_MAX);
}

#[test]
fn a_ride_hears_its_link_end() {
    let path = test_path();
    let (a, _a_peer) = link_comm(path, path.peer_process);
    let mut ride = Ride::start(path, fresh_name(), 0).unwrap();
    a.shutdown_for_tests();
    let error = ride_receive(&mut ride).unwrap_err();
    assert!(matches!(error, RideError::LinkEnded(_)), "{error}");
    assert!(ride.link_ended());
    assert!(
        Ride::start(path, fresh_name(), 0).is_none(),
        "no ride on an ended link"
    );
}
