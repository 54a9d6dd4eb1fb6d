//! Device tests of the verbs backend: real libibverbs on two devices that reach each other
//! (in the Soft-RoCE rig: `rxe_a0` <-> `rxe_b0`). Ignored by default; run them in the rig:
//!
//! ```text
//! CARGO_TARGET_DIR=/tmp/tgt-verbs cargo test --test verbs_device --no-run
//! scripts/rxe-vm/run.sh /tmp/tgt-verbs/debug/deps/verbs_device-<hash> --ignored --test-threads=1
//! ```
//!
//! `MPIB_TEST_DEVICE_A` / `MPIB_TEST_DEVICE_B` name the two devices (default `rxe_a0`,
//! `rxe_b0`).
#![allow(clippy::unwrap_used, clippy::expect_used)] // A failed unwrap fails the test, with its message.

use std::cell::Cell;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nccl_net_mpib::fabric::verbs::{PortAddress, VerbsFabric};
use nccl_net_mpib::fabric::SendOpcode::{Read, Write, WriteWithImm};
use nccl_net_mpib::fabric::{
    Access, AsyncEvent, Completion, CompletionOpcode, CompletionQueue, CqSettings, Fabric,
    LinkLayer, MemoryKeys, QpCapabilities, QpSettings, QueuePair, Rail, RailDevice, RemoteQp,
    SendOpcode, Sge, SharedReceiveQueue, WorkRequest,
};
use nccl_net_mpib::params::Settings;

#[path = "common/allocations.rs"]
mod allocations;
use allocations::{ALLOCATIONS, COUNTING};

fn device_names() -> (String, String) {
    let a = std::env::var("MPIB_TEST_DEVICE_A").unwrap_or_else(|_| "rxe_a0".into());
    let b = std::env::var("MPIB_TEST_DEVICE_B").unwrap_or_else(|_| "rxe_b0".into());
    (a, b)
}

fn fabric() -> VerbsFabric {
    VerbsFabric::new(&Settings::from_lookup(|_| None).unwrap()).unwrap()
}

/// Rig-friendly transport settings: rxe under emulation is slow, and retry_cnt 7 means
/// "forever" there (rig doc), so failures must use fewer retries.
fn qp_settings() -> QpSettings {
    QpSettings {
        timeout: 14,
        retry_count: 3,
        ..QpSettings::default()
    }
}

/// One side of a connection: device, CQ, optional SRQ, one QP.
struct Side {
    device: Arc<dyn RailDevice>,
    cq: Box<dyn CompletionQueue>,
    srq: Option<Box<dyn SharedReceiveQueue>>,
    qp: Box<dyn QueuePair>,
}

fn side(device: Arc<dyn RailDevice>, with_srq: bool) -> Side {
    let cq = device.create_cq(CqSettings { depth: 256 }).unwrap();
    let srq = with_srq.then(|| device.create_srq(128).unwrap());
    let caps = QpCapabilities {
        max_send_wr: 64,
        max_inline: 64,
        secret: 0,
    };
    let qp = device.create_qp(cq.as_ref(), srq.as_deref(), caps).unwrap();
    Side {
        device,
        cq,
        srq,
        qp,
    }
}

fn remote_of(side: &Side) -> RemoteQp {
    let endpoint = side.device.info().endpoint;
    RemoteQp {
        qp_num: side.qp.qp_num(),
        endpoint,
    }
}

/// A connected pair: A sends, B receives on its SRQ.
fn pair() -> (Side, Side) {
    let (a, b) = device_names();
    let fabric = fabric();
    let mut sa = side(fabric.open(&a, Rail::ScaleOut).unwrap(), false);
    let mut sb = side(fabric.open(&b, Rail::ScaleOut).unwrap(), true);
    let (ra, rb) = (remote_of(&sa), remote_of(&sb));
    sa.qp.connect(&rb, &qp_settings()).unwrap();
    sb.qp.connect(&ra, &qp_settings()).unwrap();
    (sa, sb)
}

/// Polls until `n` completions arrived (or panics after a generous timeout: TCG is slow).
fn poll_n(cq: &mut dyn CompletionQueue, n: usize) -> Vec<Completion> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut out = vec![Completion::EMPTY; 32];
    let mut got = Vec::new();
    while got.len() < n {
        let k = cq.poll(&mut out).unwrap();
        got.extend_from_slice(&out[..k]);
        assert!(Instant::now() < deadline, "timed out with {got:?}");
        if k == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    got
}

/// Asserts that nothing more arrives for a while.
fn assert_quiet(cq: &mut dyn CompletionQueue, ms: u64) {
    let mut out = [Completion::EMPTY; 4];
    let end = Instant::now() + Duration::from_millis(ms);
    while Instant::now() < end {
        assert_eq!(cq.poll(&mut out).unwrap(), 0, "unexpected {:?}", out[0]);
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn register(device: &Arc<dyn RailDevice>, buf: &[u8], access: Access) -> MemoryKeys {
    device
        .register(buf.as_ptr() as u64, buf.len(), access)
        .unwrap()
}

/// A WR moving `src` (local key `lkey`; empty: no SGE) to or from `to` = (address, rkey).
fn wr(
    id: u64,
    op: SendOpcode,
    src: &[u8],
    lkey: u32,
    to: (u64, u32),
    signaled: bool,
) -> WorkRequest {
    let (addr, length) = (src.as_ptr() as u64, src.len() as u32);
    let sge = (!src.is_empty()).then_some(Sge { addr, length, lkey });
    let (remote_addr, rkey) = to;
    WorkRequest {
        wr_id: id,
        opcode: op,
        sge,
        remote_addr,
        rkey,
        signaled,
        inline: false,
    }
}

#[test]
#[ignore = "requires RDMA devices (run in the rxe rig)"]
fn open_reports_port_facts() {
    let (a, b) = device_names();
    let fabric = fabric();
    let names = fabric.device_names();
    assert!(names.contains(&a) && names.contains(&b), "{names:?}");
    let dev = fabric.open_device(&a, Rail::ScaleOut).unwrap();
    let info = dev.info().clone();
    eprintln!("{a}: {info:?}");
    eprintln!(
        "{a}: dmabuf_supported={} relaxed_ordering={} gdr_supported={} symbols={:?}",
        dev.dmabuf_supported(),
        dev.relaxed_ordering(),
        nccl_net_mpib::fabric::verbs::gdr_supported(),
        VerbsFabric::symbol_support()
    );
    assert!(
        dev.relaxed_ordering(),
        "setting 2 (default) with ibv_reg_mr_iova2"
    );
    assert_eq!((info.name.as_str(), info.port), (a.as_str(), 1));
    assert!(
        (1..=5).contains(&info.active_mtu) && info.speed_mbps > 0 && info.max_qp > 0,
        "{info:?}"
    );
    let port = PortAddress::decode(&info.endpoint).unwrap();
    if info.link_layer == LinkLayer::Ethernet {
        let mapped = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff];
        assert_eq!(&port.gid[..12], &mapped, "IPv4-mapped GID");
        assert!(info.address.is_ipv4(), "the GID's IPv4 address");
    }
    if a.starts_with("rxe") {
        let rxe = (port.gid_index, info.pci_path.as_deref());
        assert_eq!(rxe, (1, None), "the rig's rxe devices");
        assert_eq!(info.active_mtu, 5, "veth MTU 9000");
    }
    assert!(fabric.open(&format!("{a}:1"), Rail::ScaleUp).is_ok());
    let e = fabric
        .open(&format!("{a}:9"), Rail::ScaleUp)
        .map(|_| ())
        .unwrap_err();
    assert!(e.to_string().contains("port"), "{e}");
    let e = fabric
        .open("mpib_nonexistent", Rail::ScaleOut)
        .map(|_| ())
        .unwrap_err();
    assert!(e.detail.contains(&a) && e.detail.contains(&b), "{e}");
    assert_eq!(
        dev.next_async_event(),
        None,
        "non-blocking, nothing pending"
    );
}

#[test]
#[ignore = "requires RDMA devices (run in the rxe rig)"]
fn gid_index_override_is_used() {
    let (a, _) = device_names();
    let settings = Settings {
        gid_index: Some(1),
        ..Settings::from_lookup(|_| None).unwrap()
    };
    let dev = VerbsFabric::new(&settings)
        .unwrap()
        .open(&a, Rail::ScaleOut)
        .unwrap();
    let port = PortAddress::decode(&dev.info().endpoint).unwrap();
    assert_eq!(port.gid_index, 1);
    let settings = Settings {
        gid_index: Some(0),
        ..settings
    };
    // Index 0 is the link-local GID on RoCE: refused as unusable.
    let e = VerbsFabric::new(&settings)
        .unwrap()
        .open(&a, Rail::ScaleOut)
        .map(|_| ())
        .unwrap_err();
    assert!(e.verb == "ibv_query_gid", "{e}");
}

#[test]
#[ignore = "requires RDMA devices (run in the rxe rig)"]
fn write_with_imm_lands_bytes_and_completes_on_the_srq() {
    let (mut a, mut b) = pair();
    let src: Vec<u8> = (0..8192u32).map(|i| (i * 7 + 3) as u8).collect();
    let dst = vec![0u8; 8192];
    let skeys = register(&a.device, &src, Access::DATA);
    let dkeys = register(&b.device, &dst, Access::DATA);
    b.srq.as_mut().unwrap().post_receives(4, 77).unwrap();
    let imm = 0x1234_5678u32.to_be();
    let base = dst.as_ptr() as u64;
    let chain = [
        wr(
            1,
            Write,
            &src[..4096],
            skeys.lkey,
            (base, dkeys.rkey),
            false,
        ),
        wr(
            2,
            WriteWithImm { imm },
            &src[4096..],
            skeys.lkey,
            (base + 4096, dkeys.rkey),
            true,
        ),
    ];
    // SAFETY: (test) both buffers stay registered and untouched until the completions.
    unsafe { a.qp.post_send(&chain) }.unwrap();
    let sent = poll_n(a.cq.as_mut(), 1);
    assert_eq!(
        (sent[0].wr_id, sent[0].status.code(), sent[0].opcode),
        (2, 0, CompletionOpcode::RdmaWrite),
        "{sent:?}"
    );
    assert_eq!(sent[0].qp_num, a.qp.qp_num());
    let got = poll_n(b.cq.as_mut(), 1);
    let c = got[0];
    assert_eq!(
        (c.wr_id, c.status.code(), c.opcode),
        (77, 0, CompletionOpcode::RecvRdmaWithImm),
        "{c:?}"
    );
    assert_eq!((c.imm, c.byte_len, c.qp_num), (imm, 4096, b.qp.qp_num()));
    assert_eq!(dst, src, "bytes landed");
    // A zero-byte WRITE_WITH_IMM still consumes a receive.
    let empty = wr(3, WriteWithImm { imm: 9u32.to_be() }, &[], 0, (0, 0), true);
    // SAFETY: (test) no memory is touched.
    unsafe { a.qp.post_send(&[empty]) }.unwrap();
    poll_n(a.cq.as_mut(), 1);
    let c = poll_n(b.cq.as_mut(), 1)[0];
    assert_eq!(
        (c.imm, c.byte_len, c.opcode),
        (9u32.to_be(), 0, CompletionOpcode::RecvRdmaWithImm)
    );
    assert_quiet(a.cq.as_mut(), 50);
    a.device.deregister(skeys).unwrap();
    b.device.deregister(dkeys).unwrap();
    assert!(b.device.deregister(dkeys).is_err(), "twice");
}

#[test]
#[ignore = "requires RDMA devices (run in the rxe rig)"]
fn unsignaled_writes_complete_silently_and_inline_writes_copy_at_post() {
    let (mut a, b) = pair();
    let src = vec![0xabu8; 64 * 1024];
    let dst = vec![0u8; 64 * 1024 + 16];
    let skeys = register(&a.device, &src, Access::DATA);
    let dkeys = register(&b.device, &dst, Access::DATA);
    let base = dst.as_ptr() as u64;
    let mut chain: Vec<WorkRequest> = (0..8)
        .map(|i| {
            let part = &src[(i as usize) * 8192..][..8192];
            wr(
                10 + i,
                Write,
                part,
                skeys.lkey,
                (base + i * 8192, dkeys.rkey),
                false,
            )
        })
        .collect();
    let small = [0x5au8; 16];
    let mut inline = wr(20, Write, &small, 0, (base + 64 * 1024, dkeys.rkey), true);
    inline.inline = true;
    chain.push(inline);
    // SAFETY: (test) buffers stay registered until the completion; `small` is copied at post.
    unsafe { a.qp.post_send(&chain) }.unwrap();
    let got = poll_n(a.cq.as_mut(), 1);
    assert_eq!((got[0].wr_id, got[0].status.code()), (20, 0), "{got:?}");
    assert_quiet(a.cq.as_mut(), 100);
    assert!(dst[..64 * 1024].iter().all(|b| *b == 0xab));
    assert_eq!(&dst[64 * 1024..], &small);
    a.device.deregister(skeys).unwrap();
    b.device.deregister(dkeys).unwrap();
}

#[test]
#[ignore = "requires RDMA devices (run in the rxe rig)"]
fn rdma_read_copies_the_remote_range() {
    let (mut a, b) = pair();
    let remote: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
    let local = vec![0u8; 4096];
    let rkeys = register(&b.device, &remote, Access::DATA);
    let lkeys = register(&a.device, &local, Access::LOCAL);
    let read = wr(
        5,
        Read,
        &local,
        lkeys.lkey,
        (remote.as_ptr() as u64, rkeys.rkey),
        true,
    );
    // SAFETY: (test) both ranges stay registered until the completion.
    unsafe { a.qp.post_send(&[read]) }.unwrap();
    let c = poll_n(a.cq.as_mut(), 1)[0];
    assert_eq!(
        (c.wr_id, c.status.code(), c.opcode),
        (5, 0, CompletionOpcode::RdmaRead),
        "{c:?}"
    );
    assert_eq!(local, remote);
    a.device.deregister(lkeys).unwrap();
    b.device.deregister(rkeys).unwrap();
}

#[test]
#[ignore = "requires RDMA devices (run in the rxe rig)"]
fn a_bad_rkey_is_a_remote_access_error() {
    let (mut a, mut b) = pair();
    let src = vec![1u8; 1024];
    let dst = vec![0u8; 1024];
    let skeys = register(&a.device, &src, Access::DATA);
    let dkeys = register(&b.device, &dst, Access::DATA);
    b.srq.as_mut().unwrap().post_receives(1, 1).unwrap();
    let to = (dst.as_ptr() as u64, dkeys.rkey);
    let bad = wr(
        6,
        WriteWithImm { imm: 0 },
        &src,
        skeys.lkey,
        (to.0, to.1 ^ 0x5a5a_0000),
        true,
    );
    // SAFETY: (test) the local range stays registered; the remote one is refused.
    unsafe { a.qp.post_send(&[bad]) }.unwrap();
    let c = poll_n(a.cq.as_mut(), 1)[0];
    assert_eq!((c.wr_id, c.status.code()), (6, 10), "RemoteAccess: {c:?}");
    assert!(dst.iter().all(|b| *b == 0), "nothing placed");
    // The QP is in the error state now: a later WR is flushed.
    let next = wr(7, Write, &src, skeys.lkey, to, true);
    // SAFETY: (test) as above.
    if unsafe { a.qp.post_send(&[next]) }.is_ok() {
        let c = poll_n(a.cq.as_mut(), 1)[0];
        assert_eq!((c.wr_id, c.status.code()), (7, 5), "Flushed: {c:?}");
    }
    a.device.deregister(skeys).unwrap();
    b.device.deregister(dkeys).unwrap();
}

#[test]
#[ignore = "requires RDMA devices (run in the rxe rig)"]
fn registrations_relaxed_ordering_and_dmabuf() {
    let (a, _) = device_names();
    let dev = fabric().open(&a, Rail::ScaleOut).unwrap();
    let buf = vec![0u8; 1 << 20];
    let relaxed = Access {
        relaxed_ordering: true,
        ..Access::DATA
    };
    for access in [Access::DATA, Access::CONTROL, Access::LOCAL, relaxed] {
        let keys = register(&dev, &buf, access);
        dev.deregister(keys).unwrap();
    }
    let e = dev.register(0, 16, Access::DATA).unwrap_err();
    assert_eq!(e.errno, libc::EINVAL, "{e}");
    // No DMA-BUF exporter here: a bad fd must fail cleanly, naming the verb.
    let e = dev
        .register_dmabuf(0, 4096, 0, -1, Access::DATA)
        .unwrap_err();
    assert_eq!(e.verb, "ibv_reg_dmabuf_mr", "{e}");
    // Registrations left open are released with the device, without teardown failures.
    let before = VerbsFabric::teardown_failures();
    let _leaked = register(&dev, &buf, Access::DATA);
    drop(dev);
    assert_eq!(VerbsFabric::teardown_failures(), before);
}

#[test]
#[ignore = "requires RDMA devices (run in the rxe rig)"]
fn teardown_order_follows_ownership() {
    let before = VerbsFabric::teardown_failures();
    let (a, b) = pair();
    // Drop the queues before the QPs and the device handles first: the QPs keep them alive.
    for side in [b, a] {
        let Side {
            device,
            cq,
            srq,
            qp,
        } = side;
        drop((device, cq, srq));
        drop(qp);
    }
    assert_eq!(VerbsFabric::teardown_failures(), before);
}

#[test]
#[ignore = "requires RDMA devices (run in the rxe rig)"]
fn a_self_connected_qp_reads_its_own_memory() {
    // The flush pattern: one QP connected to itself, a 1-byte RDMA_READ.
    let (a, _) = device_names();
    let mut me = side(fabric().open(&a, Rail::ScaleOut).unwrap(), false);
    let remote = remote_of(&me);
    me.qp.connect(&remote, &qp_settings()).unwrap();
    let data = vec![0x42u8; 64];
    let scratch = vec![0u8; 8];
    let dkeys = register(&me.device, &data, Access::DATA);
    let skeys = register(&me.device, &scratch, Access::LOCAL);
    let read = wr(
        1,
        Read,
        &scratch[..1],
        skeys.lkey,
        (data.as_ptr() as u64, dkeys.rkey),
        true,
    );
    // SAFETY: (test) both ranges stay registered until the completion.
    unsafe { me.qp.post_send(&[read]) }.unwrap();
    let c = poll_n(me.cq.as_mut(), 1)[0];
    assert_eq!(
        (c.status.code(), c.opcode),
        (0, CompletionOpcode::RdmaRead),
        "{c:?}"
    );
    assert_eq!(scratch[0], 0x42);
    me.device.deregister(dkeys).unwrap();
    me.device.deregister(skeys).unwrap();
}

#[test]
#[ignore = "requires RDMA devices (run in the rxe rig)"]
fn the_data_path_does_not_allocate() {
    let (mut a, mut b) = pair();
    let src = vec![7u8; 9 * 1024];
    let dst = vec![0u8; 9 * 1024];
    let skeys = register(&a.device, &src, Access::DATA);
    let dkeys = register(&b.device, &dst, Access::DATA);
    let base = dst.as_ptr() as u64;
    let mut chain: Vec<WorkRequest> = (0..9u64)
        .map(|i| {
            let part = &src[(i as usize) * 1024..][..1024];
            wr(
                i,
                Write,
                part,
                skeys.lkey,
                (base + i * 1024, dkeys.rkey),
                false,
            )
        })
        .collect();
    chain[8].opcode = WriteWithImm { imm: 1 };
    chain[8].signaled = true;
    let mut out = [Completion::EMPTY; 8];
    let deadline = Instant::now() + Duration::from_secs(60);
    COUNTING.with(|c| c.set(true));
    let srq = b.srq.as_mut().unwrap();
    let mut done = [0usize; 2];
    for _ in 0..20 {
        srq.post_receives(1, 5).unwrap();
        // SAFETY: (test) both buffers stay registered; each round waits for its completions.
        unsafe { a.qp.post_send(&chain) }.unwrap();
        let target = [done[0] + 1, done[1] + 1];
        while done != target && Instant::now() < deadline {
            done[0] += a.cq.poll(&mut out).unwrap();
            done[1] += b.cq.poll(&mut out).unwrap();
        }
    }
    COUNTING.with(|c| c.set(false));
    assert_eq!(done, [20, 20]);
    assert_eq!(
        ALLOCATIONS.with(Cell::get),
        0,
        "post_send / post_receives / poll allocated"
    );
    assert_eq!(dst, src);
    a.device.deregister(skeys).unwrap();
    b.device.deregister(dkeys).unwrap();
}

/// The netdev of a device's port (that of GID 0).
fn netdev_of(device: &str) -> Option<String> {
    let path = format!("/sys/class/infiniband/{device}/ports/1/gid_attrs/ndevs/0");
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

fn ip_link(netdev: &str, state: &str) {
    let status = std::process::Command::new("ip")
        .args(["link", "set", netdev, state])
        .status()
        .unwrap();
    assert!(status.success(), "ip link set {netdev} {state}");
}

fn wait_event(device: &dyn RailDevice, want: AsyncEvent) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match device.next_async_event() {
            Some(event) if event == want => return,
            Some(other) => eprintln!("async event {other:?} while waiting for {want:?}"),
            None => std::thread::sleep(Duration::from_millis(10)),
        }
        assert!(Instant::now() < deadline, "no {want:?}");
    }
}

#[test]
#[ignore = "requires RDMA devices (run in the rxe rig)"]
fn zz_a_link_flap_is_reported_as_port_events() {
    // Runs last (tests run in name order with --test-threads=1): it takes B's link down and
    // up. Only on the rig's Soft-RoCE devices: never flap a real NIC.
    let (_, b) = device_names();
    let Some(netdev) = netdev_of(&b).filter(|_| b.starts_with("rxe")) else {
        eprintln!("skipped: {b} is not a rig device");
        return;
    };
    let dev = fabric().open(&b, Rail::ScaleUp).unwrap();
    while dev.next_async_event().is_some() {}
    ip_link(&netdev, "down");
    wait_event(dev.as_ref(), AsyncEvent::PortDown);
    ip_link(&netdev, "up");
    wait_event(dev.as_ref(), AsyncEvent::PortActive);
    assert!(!AsyncEvent::PortDown.is_fatal());
}
