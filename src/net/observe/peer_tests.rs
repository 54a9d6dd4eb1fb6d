//! The peer watch over a shared link: grace, spacing of reads, and the errors' words.

use super::*;
use crate::net::observe::link::tests::{link_comm, test_path};

fn peer() -> String {
    "peer 10.0.0.2:5000".to_string()
}

/// A watch on one comm and the share of its peer.
fn connected() -> (PeerWatch, Attachment) {
    let path = test_path();
    let (ours, theirs) = link_comm(path, path.peer_process);
    (PeerWatch::new(ours, String::new()), theirs)
}

fn settle() {
    // A notice or a FIN needs a moment to arrive even on loopback.
    std::thread::sleep(std::time::Duration::from_millis(50));
}

#[test]
fn a_live_peer_is_never_an_error() {
    let (mut watch, _theirs) = connected();
    for step in 0..50u64 {
        watch.check(step * CHECK_INTERVAL_NS, peer).unwrap();
    }
}

#[test]
fn a_peer_that_closed_its_comm_fails_pending_requests_after_the_grace() {
    let (mut watch, theirs) = connected();
    drop(theirs);
    settle();
    let start = 1_000;
    watch.check(start, peer).unwrap();
    watch
        .check(start + GRACE_NS - CHECK_INTERVAL_NS, peer)
        .unwrap();
    let error = watch.check(start + GRACE_NS, peer).unwrap_err();
    assert_eq!(error.kind, crate::error::ErrorKind::Remote, "{error}");
    assert!(
        error.message.contains("peer 10.0.0.2:5000")
            && error.message.contains("the peer closed its comm 2.0 s ago"),
        "{error}"
    );
}

#[test]
fn a_connection_that_ends_fails_pending_requests_after_the_grace() {
    let (mut watch, theirs) = connected();
    // What a killed process does: its end closes without a word.
    theirs.shutdown_for_tests();
    settle();
    watch.check(7, peer).unwrap();
    let error = watch.check(7 + GRACE_NS, peer).unwrap_err();
    assert!(
        error
            .message
            .contains("control connection was closed 2.0 s ago")
            && error.message.contains("still pending"),
        "{error}"
    );
}

#[test]
fn checks_are_spaced_by_the_interval() {
    let (mut watch, theirs) = connected();
    watch.check(0, peer).unwrap();
    drop(theirs);
    settle();
    // Not due yet: the close is not seen, so the grace has not started.
    watch.check(CHECK_INTERVAL_NS - 1, peer).unwrap();
    assert_eq!(watch.heard, Heard::Nothing);
    watch.check(CHECK_INTERVAL_NS, peer).unwrap();
    assert_ne!(watch.heard, Heard::Nothing);
}

#[test]
fn a_completion_puts_the_next_read_an_interval_away() {
    let (mut watch, theirs) = connected();
    drop(theirs);
    settle();
    watch.progressed(5);
    watch.check(5 + CHECK_INTERVAL_NS - 1, peer).unwrap();
    assert_eq!(
        watch.heard,
        Heard::Nothing,
        "no read while requests complete"
    );
    watch.check(5 + CHECK_INTERVAL_NS, peer).unwrap();
    assert_ne!(watch.heard, Heard::Nothing);
}

#[test]
fn no_connection_watches_nothing() {
    let mut watch = PeerWatch::none();
    watch.check(u64::MAX - 1, peer).unwrap();
}

#[test]
fn a_failure_the_peer_reports_fails_pending_requests_after_the_grace_with_its_text() {
    let (mut watch, theirs) = connected();
    let mut reporter = PeerWatch::new(theirs, String::new());
    reporter.notify_failure(&Error::remote(
        "the sup rail (mlx5_1) QP 0x12: retry exceeded",
    ));
    reporter.notify_failure(&Error::remote("a second failure is not sent"));
    // Its close follows its failure, as when a failed comm is closed: the reason stays.
    drop(reporter);
    settle();
    watch.check(1, peer).unwrap();
    watch.check(1 + GRACE_NS - CHECK_INTERVAL_NS, peer).unwrap();
    let error = watch.check(1 + GRACE_NS, peer).unwrap_err();
    assert!(
        error.message.contains("failed and said why")
            && error
                .message
                .contains("the sup rail (mlx5_1) QP 0x12: retry exceeded"),
        "{error}"
    );
    assert!(watch.check(2 * GRACE_NS, peer).is_err(), "it stays failed");
}
