//! The TCP fabric through the seam: two rails on loopback addresses, bytes landed, keys checked,
//! errors completed; and the rail specs.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;
use crate::fabric::{
    Access, Completion, CompletionOpcode, CompletionQueue, CompletionStatus, CqSettings,
    QpCapabilities, QpSettings, QueuePair, RemoteQp, SendOpcode, Sge, SharedReceiveQueue,
    WorkRequest,
};

struct End {
    device: Arc<dyn RailDevice>,
    cq: Box<dyn CompletionQueue>,
    srq: Box<dyn SharedReceiveQueue>,
    qp: Box<dyn QueuePair>,
}

/// The secret both ends' QPs were created with, as a connection's handshake gives them.
const SECRET: u64 = 0x5EC2_E7ED_0000_0001;

fn end(spec: &str) -> End {
    let device = TcpFabric::new().open(spec, Rail::ScaleOut).unwrap();
    let cq = device.create_cq(CqSettings { depth: 64 }).unwrap();
    let srq = device.create_srq(16).unwrap();
    let caps = QpCapabilities {
        max_send_wr: 32,
        max_inline: 0,
        secret: SECRET,
    };
    let qp = device
        .create_qp(cq.as_ref(), Some(srq.as_ref()), caps)
        .unwrap();
    End {
        device,
        cq,
        srq,
        qp,
    }
}

fn remote(end: &End) -> RemoteQp {
    RemoteQp {
        qp_num: end.qp.qp_num(),
        endpoint: end.device.info().endpoint,
    }
}

fn pair() -> (End, End) {
    let mut a = end("127.0.0.1");
    let mut b = end("lo=127.0.0.2");
    let settings = QpSettings {
        timeout: 14,
        retry_count: 2,
        ..QpSettings::default()
    };
    let (ra, rb) = (remote(&a), remote(&b));
    a.qp.connect(&rb, &settings).unwrap();
    b.qp.connect(&ra, &settings).unwrap();
    (a, b)
}

fn poll_one(cq: &mut dyn CompletionQueue) -> Completion {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut out = [Completion::EMPTY; 1];
    loop {
        if cq.poll(&mut out).unwrap() == 1 {
            return out[0];
        }
        assert!(Instant::now() < deadline, "no completion within 10 s");
        std::thread::sleep(Duration::from_micros(200));
    }
}

fn write(
    wr_id: u64,
    opcode: SendOpcode,
    source: &[u8],
    lkey: u32,
    target: u64,
    rkey: u32,
) -> WorkRequest {
    WorkRequest {
        wr_id,
        opcode,
        sge: Some(Sge {
            addr: source.as_ptr() as u64,
            length: source.len() as u32,
            lkey,
        }),
        remote_addr: target,
        rkey,
        signaled: true,
        inline: false,
    }
}

#[test]
fn writes_land_in_the_registered_region_small_and_large() {
    let (mut a, mut b) = pair();
    for size in [64usize, 3 << 20] {
        let source: Vec<u8> = (0..size).map(|i| (i * 7 + size) as u8).collect();
        let mut target = vec![0u8; size];
        let local = a
            .device
            .register(source.as_ptr() as u64, size, Access::LOCAL)
            .unwrap();
        let region = b
            .device
            .register(target.as_mut_ptr() as u64, size, Access::DATA)
            .unwrap();
        b.srq.post_receives(1, 77).unwrap();
        let imm = 0x1234_5678u32.to_be();
        let wr = write(
            5,
            SendOpcode::WriteWithImm { imm },
            &source,
            local.lkey,
            target.as_mut_ptr() as u64,
            region.rkey,
        );
        // SAFETY: both buffers live until the completions below are polled.
        unsafe { a.qp.post_send(&[wr]) }.unwrap();
        let received = poll_one(b.cq.as_mut());
        assert_eq!(
            (received.wr_id, received.status, received.opcode),
            (
                77,
                CompletionStatus::Success,
                CompletionOpcode::RecvRdmaWithImm
            )
        );
        assert_eq!((received.imm, received.byte_len), (imm, size as u32));
        let sent = poll_one(a.cq.as_mut());
        assert_eq!((sent.wr_id, sent.status), (5, CompletionStatus::Success));
        assert!(target == source, "{size} bytes differ");
        a.device.deregister(local).unwrap();
        b.device.deregister(region).unwrap();
    }
}

#[test]
fn a_write_outside_any_registration_fails_the_sender_and_lands_nowhere() {
    let (mut a, b) = pair();
    let source = vec![0xAAu8; 256];
    let mut target = vec![0u8; 256];
    let local = a
        .device
        .register(source.as_ptr() as u64, 256, Access::LOCAL)
        .unwrap();
    let region = b
        .device
        .register(target.as_mut_ptr() as u64, 128, Access::DATA)
        .unwrap();
    let wr = write(
        9,
        SendOpcode::Write,
        &source,
        local.lkey,
        target.as_mut_ptr() as u64,
        region.rkey,
    );
    // SAFETY: both buffers live until the completion is polled.
    unsafe { a.qp.post_send(&[wr]) }.unwrap();
    let sent = poll_one(a.cq.as_mut());
    assert_eq!(
        (sent.wr_id, sent.status),
        (9, CompletionStatus::RemoteAccess)
    );
    assert!(target.iter().all(|b| *b == 0), "nothing may land");
    let again = write(
        10,
        SendOpcode::Write,
        &source[..1],
        local.lkey,
        target.as_mut_ptr() as u64,
        region.rkey,
    );
    // SAFETY: as above.
    unsafe { a.qp.post_send(&[again]) }.unwrap();
    // A QP in the error state takes posts and flushes them, as verbs does.
    let flushed = poll_one(a.cq.as_mut());
    assert_eq!(
        (flushed.wr_id, flushed.status),
        (10, CompletionStatus::Flushed)
    );
    drop(b);
}

#[test]
fn a_write_with_imm_waits_for_a_receive() {
    let (mut a, mut b) = pair();
    let source = vec![3u8; 100];
    let mut target = [0u8; 100];
    let local = a
        .device
        .register(source.as_ptr() as u64, 100, Access::LOCAL)
        .unwrap();
    let region = b
        .device
        .register(target.as_mut_ptr() as u64, 100, Access::DATA)
        .unwrap();
    let wr = write(
        1,
        SendOpcode::WriteWithImm { imm: 1 },
        &source,
        local.lkey,
        target.as_mut_ptr() as u64,
        region.rkey,
    );
    // SAFETY: both buffers live until the completions are polled.
    unsafe { a.qp.post_send(&[wr]) }.unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let mut out = [Completion::EMPTY; 1];
    assert_eq!(b.cq.poll(&mut out).unwrap(), 0, "no receive posted yet");
    b.srq.post_receives(1, 2).unwrap();
    assert_eq!(poll_one(b.cq.as_mut()).wr_id, 2);
    assert_eq!(poll_one(a.cq.as_mut()).status, CompletionStatus::Success);
}

/// `fail` (a failover) on a connected QP: the rail thread takes it between two steps,
/// `quiesced` says so, posts are flushed from then, and the peer's QP, whose connection was
/// closed, fails its next write.
#[test]
fn a_failed_qp_quiesces_flushes_posts_and_its_peer_fails() {
    let (mut a, mut b) = pair();
    let mut target = vec![0u8; 16];
    let region = (b.device)
        .register(target.as_mut_ptr() as u64, 16, Access::DATA)
        .unwrap();
    let first = vec![3u8; 16];
    let first_local = a
        .device
        .register(first.as_ptr() as u64, 16, Access::LOCAL)
        .unwrap();
    let target_addr = target.as_mut_ptr() as u64;
    let wr = write(
        4,
        SendOpcode::Write,
        &first,
        first_local.lkey,
        target_addr,
        region.rkey,
    );
    // SAFETY: both buffers live until the completion is polled.
    unsafe { a.qp.post_send(&[wr]) }.unwrap();
    assert_eq!(poll_one(a.cq.as_mut()).status, CompletionStatus::Success);
    a.qp.fail().unwrap();
    a.qp.fail().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !a.qp.quiesced().unwrap() {
        assert!(Instant::now() < deadline, "the QP never quiesced");
        std::thread::sleep(Duration::from_millis(1));
    }
    let source = vec![1u8; 16];
    let local = a
        .device
        .register(source.as_ptr() as u64, 16, Access::LOCAL)
        .unwrap();
    let wr = write(5, SendOpcode::Write, &source, local.lkey, 0x1000, 1);
    // SAFETY: the post is flushed; nothing is read.
    unsafe { a.qp.post_send(&[wr]) }.unwrap();
    assert_eq!(poll_one(a.cq.as_mut()).status, CompletionStatus::Flushed);
    let peer_source = vec![2u8; 16];
    let peer_local = b
        .device
        .register(peer_source.as_ptr() as u64, 16, Access::LOCAL)
        .unwrap();
    let wr = write(
        6,
        SendOpcode::Write,
        &peer_source,
        peer_local.lkey,
        0x1000,
        1,
    );
    // SAFETY: the buffer lives until the completion is polled; the target is never touched.
    unsafe { b.qp.post_send(&[wr]) }.unwrap();
    let status = poll_one(b.cq.as_mut()).status;
    assert!(
        matches!(
            status,
            CompletionStatus::RetryExceeded | CompletionStatus::Flushed
        ),
        "{status:?}"
    );
}

#[test]
fn a_destroyed_peer_fails_the_next_write_with_retry_exceeded() {
    let (mut a, b) = pair();
    drop(b);
    let source = vec![1u8; 16];
    let local = a
        .device
        .register(source.as_ptr() as u64, 16, Access::LOCAL)
        .unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let wr = write(4, SendOpcode::Write, &source, local.lkey, 0x1000, 1);
    // SAFETY: the buffer lives until the completion is polled; the target is never touched.
    unsafe { a.qp.post_send(&[wr]) }.unwrap();
    // Flushed when the thread saw the close (or reset) before the post.
    let status = poll_one(a.cq.as_mut()).status;
    assert!(
        matches!(
            status,
            CompletionStatus::RetryExceeded | CompletionStatus::Flushed
        ),
        "{status:?}"
    );
}

#[test]
fn a_self_connected_qp_reads_local_memory() {
    let device = TcpFabric::new().open("127.0.0.1", Rail::ScaleUp).unwrap();
    let mut cq = device.create_cq(CqSettings { depth: 4 }).unwrap();
    let caps = QpCapabilities {
        max_send_wr: 4,
        max_inline: 0,
        secret: SECRET,
    };
    let mut qp = device.create_qp(cq.as_ref(), None, caps).unwrap();
    let own = RemoteQp {
        qp_num: qp.qp_num(),
        endpoint: device.info().endpoint,
    };
    qp.connect(&own, &QpSettings::default()).unwrap();
    let source = [42u64];
    let mut scratch = [0u64];
    let from = device
        .register(source.as_ptr() as u64, 8, Access::DATA)
        .unwrap();
    let into = device
        .register(scratch.as_mut_ptr() as u64, 8, Access::LOCAL)
        .unwrap();
    let wr = WorkRequest {
        wr_id: 3,
        opcode: SendOpcode::Read,
        sge: Some(Sge {
            addr: scratch.as_mut_ptr() as u64,
            length: 1,
            lkey: into.lkey,
        }),
        remote_addr: source.as_ptr() as u64,
        rkey: from.rkey,
        signaled: true,
        inline: false,
    };
    // SAFETY: both words live until the completion is polled.
    unsafe { qp.post_send(&[wr]) }.unwrap();
    let done = poll_one(cq.as_mut());
    assert_eq!(
        (done.wr_id, done.opcode, done.status),
        (3, CompletionOpcode::RdmaRead, CompletionStatus::Success)
    );
    assert_eq!(
        // SAFETY: the fabric wrote the word before the completion was delivered.
        unsafe { std::ptr::read_volatile(scratch.as_ptr()) } & 0xff,
        42
    );
}

#[test]
fn rail_specs_name_an_interface_an_address_or_both() {
    let interfaces = [
        crate::netif::Interface {
            name: "lo".into(),
            address: Ipv4Addr::LOCALHOST,
            netmask: Ipv4Addr::new(255, 0, 0, 0),
            is_loopback: true,
        },
        crate::netif::Interface {
            name: "eth1".into(),
            address: Ipv4Addr::new(10, 0, 1, 5),
            netmask: Ipv4Addr::new(255, 255, 255, 0),
            is_loopback: false,
        },
    ];
    let ok = |spec: &str| resolve_spec(spec, &interfaces).unwrap();
    assert_eq!(ok("eth1"), ("eth1".to_string(), Ipv4Addr::new(10, 0, 1, 5)));
    assert_eq!(
        ok("eth1=10.0.1.5"),
        ("eth1".to_string(), Ipv4Addr::new(10, 0, 1, 5))
    );
    assert_eq!(
        ok("10.0.1.5"),
        ("eth1".to_string(), Ipv4Addr::new(10, 0, 1, 5))
    );
    assert_eq!(
        ok("127.0.0.2"),
        ("lo".to_string(), Ipv4Addr::new(127, 0, 0, 2))
    );
    let bad = |spec: &str| resolve_spec(spec, &interfaces).unwrap_err().to_string();
    assert!(bad("eth9").contains("no interface `eth9`"));
    assert!(bad("eth1=10.0.1.6").contains("not up with address 10.0.1.6"));
    assert!(bad("eth1=ten").contains("not an IPv4 address"));
    assert!(bad("192.168.9.9").contains("no interface that is up has address 192.168.9.9"));
}

#[test]
fn the_user_timeout_is_rcs_retry_budget() {
    let settings = |timeout, retry_count| QpSettings {
        timeout,
        retry_count,
        ..QpSettings::default()
    };
    assert_eq!(device::user_timeout_ms(&settings(14, 6)), 469);
    assert_eq!(device::user_timeout_ms(&settings(20, 7)), 34_359);
}

/// QP numbers and memory keys start from a random draw (issue 34): a stranger who reaches a rail
/// port can no longer name a QP or a region by counting from the old fixed starts (0x100, 0x10).
#[test]
fn qp_numbers_and_keys_start_at_a_random_draw() {
    let (qpn, key) = super::device::random_starts();
    assert!(
        qpn >= 0x100 && key >= 0x10 && key % 2 == 0,
        "{qpn:#x} {key:#x}"
    );
    assert!(
        (qpn, key) != (0x100, 0x10),
        "drawn, not the old fixed starts"
    );
    assert_eq!(super::device::random_starts(), (qpn, key), "drawn once");
    let first = super::device::next_qpn();
    assert_eq!(super::device::next_qpn(), first.wrapping_add(1));
}

#[path = "tests_strangers.rs"]
mod strangers;
