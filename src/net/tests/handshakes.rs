//! Handshakes on the shared control link, through `listen`/`connect`/`accept`: a later
//! connection between two processes rides their link, and one whose link ends before the
//! acceptor read it starts again on a connection of its own (src/net/setup/connect.rs).

use std::sync::atomic::Ordering;

use super::*;
use crate::net::observe::housekeeper::LINKS_PAUSED;

/// Sets [`LINKS_PAUSED`] while held.
struct Paused;

impl Paused {
    fn pause() -> Paused {
        LINKS_PAUSED.store(true, Ordering::Relaxed);
        Paused
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        LINKS_PAUSED.store(false, Ordering::Relaxed);
    }
}

/// Polls `connect` and `accept` until both are done.
fn finish(
    ctx: &Arc<Context>,
    handle: &mut [u8; HANDLE_SIZE],
    listen_comm: &mut ListenComm,
) -> (Box<SendComm>, Box<RecvComm>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let (mut send, mut recv) = (None, None);
    while send.is_none() || recv.is_none() {
        assert!(Instant::now() < deadline, "connect/accept did not finish");
        if send.is_none() {
            send = connect(ctx, 0, handle, -1).unwrap();
        }
        if recv.is_none() {
            recv = accept(listen_comm).unwrap();
        }
    }
    (send.unwrap(), recv.unwrap())
}

#[test]
fn a_handshake_whose_link_closes_before_the_acceptor_reads_it_starts_again_on_its_own() {
    let _guard = env_lock();
    // Only the calls below read the links: the housekeeping thread would take the handshake
    // in at its own moment.
    let _paused = Paused::pause();
    let first = connect_pair(&[]);
    let recv_ctx = loopback_context(&[]);
    let mut handle = [0u8; HANDLE_SIZE];
    let mut listen_comm = listen(&recv_ctx, 0, &mut handle).unwrap();

    // The next connect to the same process rides the first pair's link: its request goes out
    // there within a few calls (a rail's queues per call, then the request)...
    for _ in 0..20 {
        assert!(connect(&first.ctx, 0, &mut handle, -1).unwrap().is_none());
    }
    // ...and before anything at the acceptor's end read it, that end's last comm closes, which
    // closes the link.
    let first_link = first.send.link_id();
    close_recv(first.recv).unwrap();

    let (send, recv) = finish(&first.ctx, &mut handle, &mut listen_comm);
    assert!(send.link_id().is_some());
    assert_ne!(
        send.link_id(),
        first_link,
        "started again on a connection of its own, which is a new link"
    );
    let second = Pair {
        send,
        recv,
        ctx: Arc::clone(&first.ctx),
        slowest_call: Duration::ZERO,
    };
    transfer(&second, 4097);

    // With the link up, a third connection rides it and keeps it.
    let (third_send, third_recv) = finish(&first.ctx, &mut handle, &mut listen_comm);
    assert_eq!(third_send.link_id(), second.send.link_id());
    close_send(third_send).unwrap();
    close_recv(third_recv).unwrap();
    close_send(first.send).unwrap();
    close_listen(listen_comm).unwrap();
    finalize(recv_ctx).unwrap();
    close(second);
}

#[test]
fn a_refusal_on_the_link_reaches_the_connector_whole_and_the_link_goes_on() {
    let _guard = env_lock();
    let first = connect_pair(&[]);
    let first_link = first.send.link_id();
    // A receiver with another SUP QP count refuses the next connection, which rides the link.
    let recv_ctx = loopback_context(&[("MPIB_SUP_QP", "3")]);
    let mut handle = [0u8; HANDLE_SIZE];
    let mut listen_comm = listen(&recv_ctx, 0, &mut handle).unwrap();
    let (mut connect_error, mut accept_error) = (None, None);
    let deadline = Instant::now() + Duration::from_secs(10);
    while connect_error.is_none() || accept_error.is_none() {
        assert!(
            Instant::now() < deadline,
            "the refusal did not reach both sides"
        );
        if connect_error.is_none() {
            match connect(&first.ctx, 0, &mut handle, -1) {
                Ok(None) => {}
                Ok(Some(_)) => panic!("a refused connection connected"),
                Err(error) => connect_error = Some(error),
            }
        }
        if accept_error.is_none() {
            match accept(&mut listen_comm) {
                Ok(None) => {}
                Ok(Some(_)) => panic!("a refused connection was accepted"),
                Err(error) => accept_error = Some(error),
            }
        }
    }
    // The connector hears the refusal itself (not that the handshake was given up, which
    // follows it), with both sides' counts; it did not start again elsewhere.
    let error = connect_error.unwrap();
    assert_eq!(error.kind, crate::error::ErrorKind::InvalidUsage, "{error}");
    assert!(
        error.message.contains("refused") && error.message.contains("sup=3"),
        "{error}"
    );
    assert!(accept_error.unwrap().message.contains("sup=4"));
    // The link and the pair on it go on, and the next connection rides it.
    transfer(&first, 4097);
    close_listen(listen_comm).unwrap();
    finalize(recv_ctx).unwrap();
    let recv_ctx = loopback_context(&[]);
    let mut handle = [0u8; HANDLE_SIZE];
    let mut listen_comm = listen(&recv_ctx, 0, &mut handle).unwrap();
    let (send, recv) = finish(&first.ctx, &mut handle, &mut listen_comm);
    assert_eq!(send.link_id(), first_link);
    close_send(send).unwrap();
    close_recv(recv).unwrap();
    close_listen(listen_comm).unwrap();
    finalize(recv_ctx).unwrap();
    close(first);
}
