//! Unit tests of the loopback fabric's error paths: bad keys, CQ overflow, a full SRQ,
//! registration and QP setup errors, a destroyed peer. They share the helpers of `tests.rs`
//! and, like every test of the loopback world, hold `serial`.

use super::tests::{end, pair, poll, post, serial, statuses, write, Buf};
use crate::fabric::{
    Access, AsyncEvent, Completion, CompletionStatus, CqSettings, Fabric, MemoryKeys,
    QpCapabilities, QpSettings, Rail, RemoteQp, SendOpcode, Sge, WorkRequest,
};

#[test]
fn bad_rkey_is_remote_access_and_flushes_the_rest() {
    let (_s, fabric) = serial("");
    let (mut tx, mut rx) = pair(&fabric, 16, 8);
    let (src, dst) = (Buf::new(8, 1), Buf::new(8, 0));
    let lk = src.register(&*tx.dev, Access::LOCAL);
    let rk = dst.register(&*rx.dev, Access::DATA);
    let ro = dst.register(&*rx.dev, Access::LOCAL);
    let quiet = WorkRequest {
        signaled: false,
        ..write(3, &src, lk, &dst, rk)
    };
    let bad = WorkRequest {
        signaled: false,
        ..write(1, &src, lk, &dst, ro)
    };
    post(&mut *tx.qp, &[bad, quiet, write(2, &src, lk, &dst, rk)]).unwrap();
    let done = poll(&mut *tx.cq, 1);
    let got: Vec<_> = done.iter().map(|c| (c.wr_id, c.status)).collect();
    // Errors complete even when unsignaled; flushed WRs only when signaled.
    assert_eq!(
        got,
        [
            (1, CompletionStatus::RemoteAccess),
            (2, CompletionStatus::Flushed)
        ]
    );
    assert_eq!(dst.bytes(), vec![0; 8]);
    // A QP in error takes posts and flushes them, as verbs does: unsignaled, silently.
    post(&mut *tx.qp, &[quiet]).unwrap();
    assert!(poll(&mut *tx.cq, 1).is_empty());
    post(&mut *tx.qp, &[write(4, &src, lk, &dst, rk)]).unwrap();
    let flushed: Vec<_> = poll(&mut *tx.cq, 1)
        .iter()
        .map(|c| (c.wr_id, c.status))
        .collect();
    assert_eq!(flushed, [(4, CompletionStatus::Flushed)]);
    assert!(poll(&mut *rx.cq, 1).is_empty());
}

#[test]
fn bad_lkey_is_local_protection() {
    let (_s, fabric) = serial("");
    let (mut tx, rx) = pair(&fabric, 16, 8);
    let (src, dst) = (Buf::new(8, 1), Buf::new(8, 0));
    // The source is registered only on loop1 (the wrong rail): its lkey means nothing on loop0.
    let other = fabric.open("loop1", Rail::ScaleUp).unwrap();
    let wrong_rail = src.register(&*other, Access::LOCAL);
    let rk = dst.register(&*rx.dev, Access::DATA);
    let mut wr = write(1, &src, wrong_rail, &dst, rk);
    post(&mut *tx.qp, &[wr]).unwrap();
    assert_eq!(
        statuses(&poll(&mut *tx.cq, 1)),
        [CompletionStatus::LocalProtection]
    );
    // Also a range running past its registration.
    let (mut tx, _rx2) = pair(&fabric, 16, 8);
    let lk = src.register(&*tx.dev, Access::LOCAL);
    wr = write(2, &src, lk, &dst, rk);
    wr.sge = Some(Sge {
        addr: src.addr(4),
        length: 8,
        lkey: lk.lkey,
    });
    post(&mut *tx.qp, &[wr]).unwrap();
    assert_eq!(
        statuses(&poll(&mut *tx.cq, 1)),
        [CompletionStatus::LocalProtection]
    );
}

#[test]
fn cq_overflow_breaks_the_cq_and_raises_an_event() {
    let (_s, fabric) = serial("");
    let (mut tx, _rx) = pair(&fabric, 2, 8);
    while tx.dev.next_async_event().is_some() {}
    let (src, dst) = (Buf::new(8, 1), Buf::new(8, 0));
    let (lk, rk) = (
        src.register(&*tx.dev, Access::LOCAL),
        dst.register(&*tx.dev, Access::DATA),
    );
    let wr = write(1, &src, lk, &dst, rk);
    post(&mut *tx.qp, &[wr, wr, wr]).unwrap();
    let err = tx.cq.poll(&mut [Completion::EMPTY; 1]).unwrap_err();
    assert_eq!(err.verb, "ibv_poll_cq");
    assert!(
        tx.cq.poll(&mut [Completion::EMPTY; 4]).is_err(),
        "a broken CQ stays broken"
    );
    let mut events = std::iter::from_fn(|| tx.dev.next_async_event());
    assert!(events.any(|e| e == AsyncEvent::CqError));
}

#[test]
fn srq_refuses_posts_beyond_its_depth() {
    let (_s, fabric) = serial("");
    let (mut tx, mut rx) = pair(&fabric, 64, 32);
    let err = rx.srq.post_receives(17, 1).unwrap_err();
    assert_eq!((err.errno, err.verb), (libc::ENOMEM, "ibv_post_srq_recv"));
    rx.srq.post_receives(16, 1).unwrap();
    assert_eq!(rx.srq.post_receives(1, 1).unwrap_err().errno, libc::ENOMEM);
    // Nothing of the refused posts was added: exactly 16 IMMs find a receive.
    let wr = WorkRequest {
        wr_id: 5,
        opcode: SendOpcode::WriteWithImm { imm: 0 },
        sge: None,
        remote_addr: 0,
        rkey: 0,
        signaled: false,
        inline: false,
    };
    post(&mut *tx.qp, &[wr; 17]).unwrap();
    assert_eq!(poll(&mut *rx.cq, 3).len(), 16);
    assert_eq!(
        statuses(&poll(&mut *tx.cq, 1)),
        [CompletionStatus::ReceiverNotReady]
    );
}

#[test]
fn inline_payload_is_captured_at_post_time() {
    let (_s, fabric) = serial("");
    let (mut tx, rx) = pair(&fabric, 16, 8);
    let (src, dst) = (Buf::new(16, 0x11), Buf::new(16, 0));
    let rk = dst.register(&*rx.dev, Access::DATA);
    // Inline WRs carry no lkey the NIC checks.
    let wr = WorkRequest {
        inline: true,
        ..write(1, &src, MemoryKeys { lkey: 0, rkey: 0 }, &dst, rk)
    };
    post(&mut *tx.qp, &[wr]).unwrap();
    src.fill(0x22);
    assert_eq!(statuses(&poll(&mut *tx.cq, 1)), [CompletionStatus::Success]);
    assert_eq!(dst.bytes(), vec![0x11; 16]);
}

#[test]
fn registration_errors() {
    let (_s, fabric) = serial("");
    let dev = fabric.open("loop0", Rail::ScaleOut).unwrap();
    let err = dev
        .register_dmabuf(0, 4096, 0, 3, Access::DATA)
        .unwrap_err();
    assert_eq!(err.errno, libc::EOPNOTSUPP);
    let bogus = MemoryKeys { lkey: 0, rkey: 0 };
    assert_eq!(dev.deregister(bogus).unwrap_err().verb, "ibv_dereg_mr");
    assert_eq!(
        dev.register(0x1000, 4096, Access::DATA).unwrap_err().errno,
        libc::EFAULT
    );
    assert_eq!(
        dev.register(0, 16, Access::DATA).unwrap_err().errno,
        libc::EINVAL
    );
    let buf = Buf::new(64, 0);
    let keys = buf.register(&*dev, Access::DATA);
    assert!(keys.lkey != 0 && keys.rkey != 0 && keys.lkey != keys.rkey);
    dev.deregister(keys).unwrap();
    assert!(dev.deregister(keys).is_err(), "a key is released once");
}

#[test]
fn qp_setup_errors() {
    let (_s, fabric) = serial("");
    let mut a = end(&fabric, "loop0", Rail::ScaleOut, 4, 4);
    let b = end(&fabric, "loop0", Rail::ScaleOut, 4, 4);
    assert_ne!(a.qp.qp_num(), b.qp.qp_num());
    let (src, dst) = (Buf::new(8, 1), Buf::new(8, 0));
    let (lk, rk) = (
        src.register(&*a.dev, Access::LOCAL),
        dst.register(&*a.dev, Access::DATA),
    );
    assert!(
        post(&mut *a.qp, &[write(1, &src, lk, &dst, rk)]).is_err(),
        "not connected"
    );
    let gone = RemoteQp {
        qp_num: 0x00ff_fff0,
        endpoint: super::device::endpoint_of_gid([0; 16]),
    };
    let err = a.qp.connect(&gone, &QpSettings::default()).unwrap_err();
    assert!(err.to_string().contains("0xfffff0"), "{err}");
    // An endpoint another fabric made is refused, naming both fabrics.
    let foreign = RemoteQp {
        qp_num: b.qp.qp_num(),
        endpoint: crate::fabric::tcp::endpoint_of("127.0.0.1:7000".parse().unwrap()),
    };
    let err = a.qp.connect(&foreign, &QpSettings::default()).unwrap_err();
    assert!(
        err.to_string().contains("tcp fabric") && err.to_string().contains("loopback"),
        "{err}"
    );
    // A CQ of another device cannot serve this device's QP.
    let other = fabric.open("loop1", Rail::ScaleUp).unwrap();
    let caps = QpCapabilities {
        max_send_wr: 4,
        max_inline: 0,
        secret: 0,
    };
    assert!(other.create_qp(b.cq.as_ref(), None, caps).is_err());
    assert!(a.dev.create_cq(CqSettings { depth: 0 }).is_err());
}

#[test]
fn destroyed_peer_yields_retry_exceeded() {
    let (_s, fabric) = serial("");
    let (mut tx, rx) = pair(&fabric, 16, 8);
    let (src, dst) = (Buf::new(8, 1), Buf::new(8, 0));
    let (lk, rk) = (
        src.register(&*tx.dev, Access::LOCAL),
        dst.register(&*tx.dev, Access::DATA),
    );
    drop(rx);
    post(
        &mut *tx.qp,
        &[write(1, &src, lk, &dst, rk), write(2, &src, lk, &dst, rk)],
    )
    .unwrap();
    let got = statuses(&poll(&mut *tx.cq, 1));
    assert_eq!(
        got,
        [CompletionStatus::RetryExceeded, CompletionStatus::Flushed]
    );
}
