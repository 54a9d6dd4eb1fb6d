//! Unit tests of the fault knobs. Each holds `serial`, which installs the knobs and removes
//! them afterwards; none assumes QP numbers, and the `delay` test measures progress passes
//! rather than polls, since any poll in the process runs a pass.

use super::tests::{end, link, pair, poll, post, serial, statuses, write, Buf};
use super::{world, LoopbackFabric};
use crate::fabric::{Access, CompletionStatus, Rail, SendOpcode, WorkRequest};

/// Runs one SOUT write of 0xaa and one SUP write of 0xbb to the same bytes, posted SOUT first,
/// and returns what the bytes hold after one progress pass.
fn race(faults: &str) -> u8 {
    let (_s, fabric) = serial(faults);
    let mut sout = end(&fabric, "loop0", Rail::ScaleOut, 8, 4);
    let mut sout_rx = end(&fabric, "loop0", Rail::ScaleOut, 8, 4);
    let mut sup = end(&fabric, "loop1", Rail::ScaleUp, 8, 4);
    let mut sup_rx = end(&fabric, "loop1", Rail::ScaleUp, 8, 4);
    link(&mut sout, &mut sout_rx);
    link(&mut sup, &mut sup_rx);
    let (a, b, dst) = (Buf::new(4, 0xaa), Buf::new(4, 0xbb), Buf::new(4, 0));
    let wa = write(
        1,
        &a,
        a.register(&*sout.dev, Access::LOCAL),
        &dst,
        dst.register(&*sout.dev, Access::DATA),
    );
    let wb = write(
        2,
        &b,
        b.register(&*sup.dev, Access::LOCAL),
        &dst,
        dst.register(&*sup.dev, Access::DATA),
    );
    post(&mut *sout.qp, &[wa]).unwrap();
    post(&mut *sup.qp, &[wb]).unwrap();
    assert_eq!(poll(&mut *sout.cq, 1).len(), 1);
    assert_eq!(poll(&mut *sup.cq, 1).len(), 1);
    dst.bytes()[0]
}

#[test]
fn reorder_runs_sup_before_sout() {
    // Creation order: SOUT executes first, so SUP's bytes land last.
    assert_eq!(race(""), 0xbb);
    assert_eq!(race("reorder"), 0xaa);
}

#[test]
fn delay_holds_wrs_for_n_passes() {
    let (_s, fabric) = serial("delay=sout:2");
    let (mut tx, _rx) = pair(&fabric, 8, 4);
    let (src, dst) = (Buf::new(8, 7), Buf::new(8, 0));
    let (lk, rk) = (
        src.register(&*tx.dev, Access::LOCAL),
        dst.register(&*tx.dev, Access::DATA),
    );
    post(&mut *tx.qp, &[write(1, &src, lk, &dst, rk)]).unwrap();
    let posted_at = world().pass;
    let mut polls = 0;
    while poll(&mut *tx.cq, 1).is_empty() {
        polls += 1;
        assert!(polls < 10, "the delayed WR never ran");
    }
    // Held during two passes, executed in the third.
    assert!(world().pass - posted_at >= 3);
    assert!(polls <= 2);
    assert_eq!(dst.bytes(), vec![7; 8]);
}

#[test]
fn fail_gives_retry_exceeded_then_flushed() {
    let (_s, fabric) = serial("fail=sout:2");
    let (mut tx, _rx) = pair(&fabric, 8, 8);
    let (src, dst) = (Buf::new(8, 7), Buf::new(8, 0));
    let (lk, rk) = (
        src.register(&*tx.dev, Access::LOCAL),
        dst.register(&*tx.dev, Access::DATA),
    );
    let chain = [1, 2, 3].map(|id| write(id, &src, lk, &dst, rk));
    post(&mut *tx.qp, &chain).unwrap();
    let got = statuses(&poll(&mut *tx.cq, 1));
    use CompletionStatus::{Flushed, RetryExceeded, Success};
    assert_eq!(got, [Success, RetryExceeded, Flushed]);
    post(&mut *tx.qp, &chain[..1]).unwrap();
    assert_eq!(statuses(&poll(&mut *tx.cq, 1)), [Flushed]);
}

#[test]
fn cut_fails_every_later_wr_of_the_rail_either_way_and_lands_nothing() {
    let (_s, fabric) = serial("cut=sout:2");
    let (mut tx, mut rx) = pair(&fabric, 8, 8);
    let (src, dst) = (Buf::new(8, 7), Buf::new(8, 0));
    let (lk, rk) = (
        src.register(&*tx.dev, Access::LOCAL),
        dst.register(&*tx.dev, Access::DATA),
    );
    post(&mut *tx.qp, &[write(1, &src, lk, &dst, rk)]).unwrap();
    assert_eq!(statuses(&poll(&mut *tx.cq, 1)), [CompletionStatus::Success]);
    let (back, sink) = (Buf::new(8, 9), Buf::new(8, 0));
    let (back_lk, sink_rk) = (
        back.register(&*rx.dev, Access::LOCAL),
        sink.register(&*rx.dev, Access::DATA),
    );
    // The second WR on the rail cuts it: it fails, and so does the other direction's next.
    let (again, other) = (Buf::new(8, 3), Buf::new(8, 0));
    let (again_lk, other_rk) = (
        again.register(&*tx.dev, Access::LOCAL),
        other.register(&*tx.dev, Access::DATA),
    );
    post(&mut *tx.qp, &[write(2, &again, again_lk, &other, other_rk)]).unwrap();
    assert_eq!(
        statuses(&poll(&mut *tx.cq, 1)),
        [CompletionStatus::RetryExceeded]
    );
    post(&mut *rx.qp, &[write(3, &back, back_lk, &sink, sink_rk)]).unwrap();
    assert_eq!(
        statuses(&poll(&mut *rx.cq, 1)),
        [CompletionStatus::RetryExceeded]
    );
    assert_eq!((other.bytes(), sink.bytes()), (vec![0; 8], vec![0; 8]));
}

#[test]
fn a_failed_qp_flushes_what_it_holds_and_is_quiesced_at_once() {
    let (_s, fabric) = serial("delay=sout:5");
    let (mut tx, _rx) = pair(&fabric, 8, 8);
    let (src, dst) = (Buf::new(8, 7), Buf::new(8, 0));
    let (lk, rk) = (
        src.register(&*tx.dev, Access::LOCAL),
        dst.register(&*tx.dev, Access::DATA),
    );
    post(&mut *tx.qp, &[write(1, &src, lk, &dst, rk)]).unwrap();
    tx.qp.fail().unwrap();
    assert!(tx.qp.quiesced().unwrap());
    assert_eq!(statuses(&poll(&mut *tx.cq, 1)), [CompletionStatus::Flushed]);
    assert_eq!(dst.bytes(), vec![0; 8], "nothing landed");
    post(&mut *tx.qp, &[write(2, &src, lk, &dst, rk)]).unwrap();
    assert_eq!(statuses(&poll(&mut *tx.cq, 1)), [CompletionStatus::Flushed]);
}

#[test]
fn fail_leaves_the_other_rail_alone() {
    let (_s, fabric) = serial("fail=sup:1");
    let (mut tx, _rx) = pair(&fabric, 8, 8);
    let (src, dst) = (Buf::new(8, 7), Buf::new(8, 0));
    let (lk, rk) = (
        src.register(&*tx.dev, Access::LOCAL),
        dst.register(&*tx.dev, Access::DATA),
    );
    post(&mut *tx.qp, &[write(1, &src, lk, &dst, rk)]).unwrap();
    assert_eq!(statuses(&poll(&mut *tx.cq, 1)), [CompletionStatus::Success]);
}

#[test]
fn starve_yields_receiver_not_ready() {
    let (_s, fabric) = serial("starve=sup:1");
    let mut tx = end(&fabric, "loop1", Rail::ScaleUp, 8, 8);
    let mut rx = end(&fabric, "loop1", Rail::ScaleUp, 8, 8);
    link(&mut tx, &mut rx);
    // The post succeeds but only one receive is accepted.
    rx.srq.post_receives(4, 9).unwrap();
    let wr = WorkRequest {
        wr_id: 1,
        opcode: SendOpcode::WriteWithImm { imm: 1 },
        sge: None,
        remote_addr: 0,
        rkey: 0,
        signaled: true,
        inline: false,
    };
    post(&mut *tx.qp, &[wr, WorkRequest { wr_id: 2, ..wr }]).unwrap();
    assert_eq!(poll(&mut *rx.cq, 1).len(), 1);
    let got = statuses(&poll(&mut *tx.cq, 1));
    assert_eq!(
        got,
        [
            CompletionStatus::Success,
            CompletionStatus::ReceiverNotReady
        ]
    );
}

#[test]
fn bad_knob_names_the_variable() {
    let (_s, _fabric) = serial("");
    let err = LoopbackFabric::new("reorder,delay=sup", "").unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("MPIB_LOOPBACK_FAULTS") && text.contains("`delay=sup`"),
        "{text}"
    );
    assert!(LoopbackFabric::new("starve=sout:3", "")
        .unwrap()
        .has_faults());
}

#[test]
fn arp_holds_a_rail_unresolved_for_n_polls() {
    let (_s, fabric) = serial("arp=sup:3");
    let sout = end(&fabric, "loop0", Rail::ScaleOut, 8, 4);
    let sup = end(&fabric, "loop1", Rail::ScaleUp, 8, 4);
    let mut on_sout = sout.dev.resolve_peer(&sout.dev.info().endpoint).unwrap();
    assert!(on_sout.poll().unwrap(), "the knob names SUP only");
    let mut first = sup.dev.resolve_peer(&sup.dev.info().endpoint).unwrap();
    let mut second = sup.dev.resolve_peer(&sup.dev.info().endpoint).unwrap();
    // Three polls between all of the rail's resolutions, then every one is ready.
    assert!(!first.poll().unwrap());
    assert!(!second.poll().unwrap());
    assert!(!first.poll().unwrap());
    assert!(
        first.describe().contains("after 2 poll(s)"),
        "{}",
        first.describe()
    );
    assert!(second.poll().unwrap());
    assert!(first.poll().unwrap());
}

#[test]
fn connecting_an_unresolved_rail_waits_like_the_kernel() {
    let (_s, fabric) = serial("arp=sout:1000");
    let mut a = end(&fabric, "loop0", Rail::ScaleOut, 8, 4);
    let mut b = end(&fabric, "loop0", Rail::ScaleOut, 8, 4);
    let started = std::time::Instant::now();
    link(&mut a, &mut b);
    let waited = started.elapsed();
    assert!(
        waited >= std::time::Duration::from_millis(1000),
        "the first connect waits for the address: {waited:?}"
    );
    assert!(
        waited < std::time::Duration::from_millis(1900),
        "only the first: {waited:?}"
    );
    let mut resolution = a.dev.resolve_peer(&b.dev.info().endpoint).unwrap();
    assert!(resolution.poll().unwrap(), "resolved by the wait");
}
