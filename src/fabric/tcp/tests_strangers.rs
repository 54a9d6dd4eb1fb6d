//! Strangers on a rail's port (issue 34): whoever reaches it cannot claim a QP without the
//! connection's secret, from an address other than its own, or as a peer other than the one
//! `connect` named; a claim refused leaves the QP as it was; silent connections are bounded;
//! and a request out of sequence fails the QP, naming it.

use std::io::{Read, Write};
use std::net::TcpStream;

use super::*;
use crate::proto::tcp_wire::{Header, Hello, Kind};

fn settings() -> QpSettings {
    QpSettings {
        timeout: 14,
        retry_count: 2,
        ..QpSettings::default()
    }
}

/// The rail port of `end`.
fn port_of(end: &End) -> std::net::SocketAddrV4 {
    super::super::socket_address(&end.device.info().endpoint).unwrap()
}

/// A hello from `from` (its rail and QP) for `to`'s QP with `secret`.
fn hello(from: &End, to: &End, secret: u64) -> Hello {
    Hello {
        target_qpn: to.qp.qp_num(),
        source_qpn: from.qp.qp_num(),
        source_addr: port_of(from).ip().octets(),
        source_port: port_of(from).port(),
        secret,
    }
}

/// A connection to `to`'s rail port that has sent `hello`.
fn stranger(to: &End, hello: &Hello) -> TcpStream {
    let mut stream = TcpStream::connect(port_of(to)).unwrap();
    stream.write_all(&hello.encode()).unwrap();
    stream
}

/// Whether the rail closed `stream` within 5 s.
fn closed(stream: &mut TcpStream) -> bool {
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut byte = [0u8; 1];
    matches!(stream.read(&mut byte), Ok(0))
}

/// A signaled write of 16 bytes from `from` into a fresh region of `to`, both completions checked.
fn transfer(from: &mut End, to: &mut End) {
    let source = vec![7u8; 16];
    let mut target = vec![0u8; 16];
    let local = (from.device)
        .register(source.as_ptr() as u64, 16, Access::LOCAL)
        .unwrap();
    let region = (to.device)
        .register(target.as_mut_ptr() as u64, 16, Access::DATA)
        .unwrap();
    to.srq.post_receives(1, 9).unwrap();
    let opcode = SendOpcode::WriteWithImm { imm: 1 };
    let wr = write(
        3,
        opcode,
        &source,
        local.lkey,
        target.as_mut_ptr() as u64,
        region.rkey,
    );
    // SAFETY: both buffers live until the completions below are polled.
    unsafe { from.qp.post_send(&[wr]) }.unwrap();
    assert_eq!(poll_one(to.cq.as_mut()).status, CompletionStatus::Success);
    assert_eq!(poll_one(from.cq.as_mut()).status, CompletionStatus::Success);
    assert_eq!(target, source);
}

/// Before `connect`, hellos without the secret, or naming an address they do not come from, are
/// dropped; the QP then connects to its real peer and moves bytes both ways. Before the fix the
/// first of them took the QP, and the real peer's connection was dropped as "taken".
#[test]
fn hellos_without_the_secret_or_from_elsewhere_are_dropped_and_the_qp_is_untouched() {
    let mut active = end("127.0.0.1");
    // The larger address waits for its peer's connection: the passive side.
    let mut victim = end("lo=127.0.0.2");
    let mut guessed = stranger(&victim, &hello(&active, &victim, SECRET ^ 1));
    let elsewhere = Hello {
        source_addr: [127, 0, 0, 9],
        ..hello(&active, &victim, SECRET)
    };
    let mut spoofed = stranger(&victim, &elsewhere);
    assert!(
        closed(&mut guessed),
        "a hello without the secret is dropped"
    );
    assert!(
        closed(&mut spoofed),
        "a hello naming another address is dropped"
    );
    let (to_victim, to_active) = (remote(&victim), remote(&active));
    victim.qp.connect(&to_active, &settings()).unwrap();
    active.qp.connect(&to_victim, &settings()).unwrap();
    transfer(&mut active, &mut victim);
    transfer(&mut victim, &mut active);
}

/// Once `connect` named the peer, a hello with the secret that names another peer QP is dropped,
/// and the QP waits for its peer's.
#[test]
fn a_hello_from_another_peer_after_connect_is_dropped_and_the_qp_waits_for_its_own() {
    let mut active = end("127.0.0.1");
    let mut victim = end("lo=127.0.0.2");
    victim.qp.connect(&remote(&active), &settings()).unwrap();
    let other = Hello {
        source_qpn: active.qp.qp_num() ^ 0x40,
        ..hello(&active, &victim, SECRET)
    };
    let mut impostor = stranger(&victim, &other);
    assert!(closed(&mut impostor));
    active.qp.connect(&remote(&victim), &settings()).unwrap();
    transfer(&mut active, &mut victim);
}

/// More silent connections than the rail keeps waiting: the oldest are pushed out, and the real
/// peer's connection, made after all of them, is still taken at once.
#[test]
fn a_flood_of_silent_connections_does_not_keep_the_peer_out() {
    let mut active = end("127.0.0.1");
    let mut victim = end("lo=127.0.0.2");
    let mut silent: Vec<TcpStream> = (0..super::super::unclaimed::MAX_UNCLAIMED + 8)
        .map(|_| TcpStream::connect(port_of(&victim)).unwrap())
        .collect();
    assert!(closed(&mut silent[0]), "the oldest is pushed out");
    victim.qp.connect(&remote(&active), &settings()).unwrap();
    active.qp.connect(&remote(&victim), &settings()).unwrap();
    transfer(&mut active, &mut victim);
}

/// The peer's requests must come numbered in order: a write numbered 1 lands and is
/// acknowledged, the next numbered 3 fails the QP (its oldest request completes in error).
#[test]
fn a_request_out_of_sequence_fails_the_qp() {
    // `active` stands for the peer's rail; the test speaks for its QP.
    let active = end("127.0.0.1");
    let mut victim = end("lo=127.0.0.2");
    victim.qp.connect(&remote(&active), &settings()).unwrap();
    let mut peer = stranger(&victim, &hello(&active, &victim, SECRET));
    let mut target = vec![0u8; 16];
    let addr = target.as_mut_ptr() as u64;
    let region = (victim.device).register(addr, 16, Access::DATA).unwrap();
    let request = |seq| Header {
        kind: Kind::Write,
        flags: 1,
        status: 0,
        length: 16,
        seq,
        imm: 0,
        rkey: region.rkey,
        addr,
    };
    peer.write_all(&request(1).encode()).unwrap();
    peer.write_all(&[5u8; 16]).unwrap();
    let mut ack = [0u8; 32];
    peer.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    peer.read_exact(&mut ack).unwrap();
    assert_eq!(Header::decode(&ack), Ok(Header::reply(Kind::Ack, 1, 0, 0)));
    // A request of the victim's own, left unanswered, completes with the QP's failure.
    let source = vec![1u8; 16];
    let local = (victim.device)
        .register(source.as_ptr() as u64, 16, Access::LOCAL)
        .unwrap();
    let wr = write(8, SendOpcode::Write, &source, local.lkey, 0x1000, 1);
    // SAFETY: the buffer lives until the completion is polled; the peer never executes it.
    unsafe { victim.qp.post_send(&[wr]) }.unwrap();
    peer.write_all(&request(3).encode()).unwrap();
    let failed = poll_one(victim.cq.as_mut());
    assert_eq!(
        (failed.wr_id, failed.status),
        (8, CompletionStatus::Other(1))
    );
    assert_eq!(&target[..], &[5u8; 16][..], "the write numbered 1 landed");
}
