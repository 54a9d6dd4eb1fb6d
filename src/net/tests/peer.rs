//! A peer that goes away while requests wait on it (its process killed, its comm aborted):
//! the waiting side's calls return an error naming the peer once its comm's close (said on the
//! shared control connection, src/net/observe/link.rs) is as old as the grace period, instead of
//! waiting forever. A killed process says nothing: its connection's end is what is heard then
//! (src/net/observe/peer_tests.rs).

use std::time::{Duration, Instant};

use super::*;
use crate::net::observe::peer::GRACE_NS;
use crate::net::tests::{connect_pair, env_lock, host_memory, recv_buffer, Pair};

/// Calls `step` until it fails; the error and how long that took.
fn until_error(mut step: impl FnMut() -> Result<()>) -> (crate::error::Error, Duration) {
    let started = Instant::now();
    loop {
        if let Err(error) = step() {
            return (error, started.elapsed());
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the call never failed: it would wait forever on a peer that is gone"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn assert_names_the_gone_peer(error: &crate::error::Error, took: Duration) {
    assert_eq!(error.kind, crate::error::ErrorKind::Remote, "{error}");
    assert!(
        error.message.contains("the peer closed its comm")
            && error.message.contains("control connection")
            && error.message.contains("still pending")
            && error.message.contains("127.0.0.1"),
        "{error}"
    );
    let grace = Duration::from_nanos(GRACE_NS);
    assert!(
        took >= grace && took < grace + Duration::from_secs(3),
        "failed after {took:?}"
    );
}

#[test]
fn a_receive_fails_once_the_sender_is_gone() {
    let _guard = env_lock();
    let Pair {
        send, recv, ctx, ..
    } = connect_pair(&[]);
    let mut sink = [0u8; 64];
    let memory = host_memory(CommRef::Recv(&recv), sink.as_mut_ptr() as u64, sink.len());
    let buffer = recv_buffer(sink.as_mut_ptr() as u64, sink.len(), 3, &memory);
    let request = irecv(&recv, &[buffer])
        .unwrap()
        .expect("a CTS slot is free");
    // Let the CTS reach the sender first: with nothing of ours on the wire afterwards, no QP
    // error can tell us the sender is gone (a CTS written to a destroyed QP would).
    for _ in 0..10 {
        // SAFETY: a live request of `recv`.
        assert!(!unsafe { test(request) }.unwrap().done);
    }
    close_send(send).unwrap();
    // SAFETY: a live request of `recv`.
    let (error, took) = until_error(|| unsafe { test(request) }.map(|_| ()));
    assert_names_the_gone_peer(&error, took);
    deregister_memory(CommRef::Recv(&recv), memory).unwrap();
    close_recv(recv).unwrap();
    finalize(ctx).unwrap();
}

#[test]
fn a_send_waiting_for_its_receive_fails_once_the_receiver_is_gone() {
    let _guard = env_lock();
    let Pair {
        send, recv, ctx, ..
    } = connect_pair(&[]);
    let source = [7u8; 64];
    let memory = host_memory(CommRef::Send(&send), source.as_ptr() as u64, source.len());
    close_recv(recv).unwrap();
    // No receive was ever posted: `isend` has no CTS and says "try again" until it knows.
    let (error, took) = until_error(|| {
        let request = isend(
            &send,
            source.as_ptr() as u64,
            64,
            3,
            &memory,
            std::ptr::null_mut(),
        )?;
        assert!(request.is_none(), "no receive was posted");
        Ok(())
    });
    assert_names_the_gone_peer(&error, took);
    deregister_memory(CommRef::Send(&send), memory).unwrap();
    close_send(send).unwrap();
    finalize(ctx).unwrap();
}

#[test]
fn a_peer_that_stays_is_waited_for_without_error() {
    let _guard = env_lock();
    let pair = connect_pair(&[]);
    let mut sink = [0u8; 64];
    let source = [5u8; 64];
    let rmh = host_memory(CommRef::Recv(&pair.recv), sink.as_mut_ptr() as u64, 64);
    let smh = host_memory(CommRef::Send(&pair.send), source.as_ptr() as u64, 64);
    let buffer = recv_buffer(sink.as_mut_ptr() as u64, 64, 3, &rmh);
    let received = irecv(&pair.recv, &[buffer])
        .unwrap()
        .expect("a CTS slot is free");
    // Longer than the grace with the sender alive and silent: no error.
    let started = Instant::now();
    while started.elapsed() < Duration::from_nanos(GRACE_NS) + Duration::from_millis(300) {
        // SAFETY: a live request of `pair.recv`.
        let outcome = unsafe { test(received) }.unwrap();
        assert!(!outcome.done, "nothing was sent");
        std::thread::sleep(Duration::from_millis(5));
    }
    let sent = loop {
        let request = isend(
            &pair.send,
            source.as_ptr() as u64,
            64,
            3,
            &smh,
            std::ptr::null_mut(),
        );
        if let Some(request) = request.unwrap() {
            break request;
        }
    };
    assert_eq!(crate::net::tests::wait(sent).sizes[0], 64);
    assert_eq!(crate::net::tests::wait(received).sizes[0], 64);
    assert_eq!(sink, source);
    deregister_memory(CommRef::Recv(&pair.recv), rmh).unwrap();
    deregister_memory(CommRef::Send(&pair.send), smh).unwrap();
    crate::net::tests::close(pair);
}
