//! Unit tests of the loopback fabric's data path, driven through the seam's trait objects, and
//! the helpers the fault tests share.
//!
//! The world is process-global and cargo runs tests on parallel threads, so every test holds
//! [`serial`] (which also resets the fault knobs) and no test assumes particular QP numbers or
//! keys.

use std::sync::{Arc, Mutex, MutexGuard};

use super::LoopbackFabric;
use crate::fabric::{
    Access, Completion, CompletionOpcode, CompletionQueue, CompletionStatus, CqSettings, Fabric,
    FabricError, MemoryKeys, QpCapabilities, QpSettings, QueuePair, Rail, RailDevice, RemoteQp,
    SendOpcode, Sge, SharedReceiveQueue, WorkRequest,
};

/// Serialises the tests of this crate that use the loopback world (the knobs are global).
static SERIAL: Mutex<()> = Mutex::new(());

/// Holds [`SERIAL`]; resets the knobs to none when dropped, so that no knob leaks out.
pub(crate) struct Serial {
    /// The lock; dropped after `drop` has reset the knobs.
    _guard: MutexGuard<'static, ()>,
}

impl Drop for Serial {
    fn drop(&mut self) {
        let _ = LoopbackFabric::new("", "");
    }
}

/// Takes the serialisation lock and creates a fabric with `faults`. Any crate test that sets
/// loopback knobs, or must not see them, should hold the returned guard.
pub(crate) fn serial(faults: &str) -> (Serial, LoopbackFabric) {
    serial_with_rates(faults, "")
}

/// [`serial`] with rail rates (`MPIB_LOOPBACK_RAILS`) as well; the guard resets both.
pub(crate) fn serial_with_rates(faults: &str, rails: &str) -> (Serial, LoopbackFabric) {
    let guard = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let serial = Serial { _guard: guard };
    (
        serial,
        LoopbackFabric::new(faults, rails).expect("valid knobs"),
    )
}

/// A heap buffer addressed only through a raw pointer, as the NIC addresses memory.
pub(super) struct Buf {
    /// Start of the allocation (from `Box::into_raw`).
    ptr: *mut u8,
    /// Length.
    len: usize,
}

impl Buf {
    /// A buffer of `len` bytes, all `fill`.
    pub(super) fn new(len: usize, fill: u8) -> Buf {
        let ptr = Box::into_raw(vec![fill; len].into_boxed_slice()).cast::<u8>();
        Buf { ptr, len }
    }

    /// Address of byte `offset`.
    pub(super) fn addr(&self, offset: usize) -> u64 {
        self.ptr as u64 + offset as u64
    }

    /// A copy of the contents.
    pub(super) fn bytes(&self) -> Vec<u8> {
        // SAFETY: `ptr` is a live allocation of `len` bytes; nothing writes it concurrently
        // (progress only runs inside `poll`, on this thread).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }.to_vec()
    }

    /// Overwrites the contents with `fill`.
    pub(super) fn fill(&self, fill: u8) {
        // SAFETY: as in `bytes`, and the allocation is writable.
        unsafe { std::ptr::write_bytes(self.ptr, fill, self.len) };
    }

    /// Registers the buffer on `dev`.
    pub(super) fn register(&self, dev: &dyn RailDevice, access: Access) -> MemoryKeys {
        dev.register(self.addr(0), self.len, access)
            .expect("register")
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        let slice = std::ptr::slice_from_raw_parts_mut(self.ptr, self.len);
        // SAFETY: `ptr`/`len` came from `Box::into_raw` of a boxed slice and are freed once.
        drop(unsafe { Box::from_raw(slice) });
    }
}

/// One end of a connection: device, CQ, SRQ and QP.
pub(super) struct End {
    /// The opened device.
    pub(super) dev: Arc<dyn RailDevice>,
    /// Its QP (declared first so it is destroyed before its queues).
    pub(super) qp: Box<dyn QueuePair>,
    /// Send and receive completions.
    pub(super) cq: Box<dyn CompletionQueue>,
    /// Receives for incoming IMMs.
    pub(super) srq: Box<dyn SharedReceiveQueue>,
}

/// Opens `spec` as `rail` and creates a CQ of `cq_depth`, an SRQ of 16 and a QP with
/// `max_send_wr` send slots and 64 bytes of inline.
pub(super) fn end(fabric: &LoopbackFabric, spec: &str, rail: Rail, cq_depth: u32, sq: u32) -> End {
    let dev = fabric.open(spec, rail).expect("open");
    let cq = dev.create_cq(CqSettings { depth: cq_depth }).expect("cq");
    let srq = dev.create_srq(16).expect("srq");
    let caps = QpCapabilities {
        max_send_wr: sq,
        max_inline: 64,
        secret: 0,
    };
    let qp = dev
        .create_qp(cq.as_ref(), Some(srq.as_ref()), caps)
        .expect("qp");
    End { dev, qp, cq, srq }
}

/// Connects `a` and `b` to each other.
pub(super) fn link(a: &mut End, b: &mut End) {
    let remote = |e: &End| RemoteQp {
        qp_num: e.qp.qp_num(),
        endpoint: e.dev.info().endpoint,
    };
    let (ra, rb) = (remote(a), remote(b));
    a.qp.connect(&rb, &QpSettings::default())
        .expect("connect a");
    b.qp.connect(&ra, &QpSettings::default())
        .expect("connect b");
}

/// A connected SOUT pair on loop0 (sender, receiver), each from its own fabric value to show
/// that both reach the same world.
pub(super) fn pair(fabric: &LoopbackFabric, cq_depth: u32, sq: u32) -> (End, End) {
    let other = LoopbackFabric {
        faults: fabric.faults,
        speeds: std::sync::Arc::clone(&fabric.speeds),
        sysfs: None,
    };
    let mut tx = end(fabric, "loop0", Rail::ScaleOut, cq_depth, sq);
    let mut rx = end(&other, "loop0:1", Rail::ScaleOut, cq_depth, sq);
    link(&mut tx, &mut rx);
    (tx, rx)
}

/// An RDMA_WRITE of `len` bytes from `src` (lkey `lk`) to `dst` (rkey `rk`).
pub(super) fn write(
    wr_id: u64,
    src: &Buf,
    lk: MemoryKeys,
    dst: &Buf,
    rk: MemoryKeys,
) -> WorkRequest {
    let length = u32::try_from(src.len.min(dst.len)).unwrap();
    WorkRequest {
        wr_id,
        opcode: SendOpcode::Write,
        sge: Some(Sge {
            addr: src.addr(0),
            length,
            lkey: lk.lkey,
        }),
        remote_addr: dst.addr(0),
        rkey: rk.rkey,
        signaled: true,
        inline: false,
    }
}

/// Posts `chain` on `qp`.
pub(super) fn post(qp: &mut dyn QueuePair, chain: &[WorkRequest]) -> Result<(), FabricError> {
    // SAFETY: every test keeps its buffers and registrations alive until it has polled the
    // completions it waits for (and the buffers outlive the QPs, which are dropped first).
    unsafe { qp.post_send(chain) }
}

/// Polls `cq` up to `passes` times, collecting every completion.
pub(super) fn poll(cq: &mut dyn CompletionQueue, passes: usize) -> Vec<Completion> {
    let mut all = Vec::new();
    let mut out = [Completion::EMPTY; 8];
    for _ in 0..passes {
        let n = cq.poll(&mut out).expect("poll");
        all.extend_from_slice(&out[..n]);
    }
    all
}

/// The statuses of `completions`.
pub(super) fn statuses(completions: &[Completion]) -> Vec<CompletionStatus> {
    completions.iter().map(|c| c.status).collect()
}

#[test]
fn open_accepts_loop_devices_and_lists_them_on_error() {
    let (_s, fabric) = serial("");
    assert_eq!(fabric.name(), "loopback");
    let names = fabric.device_names();
    assert_eq!(names.len(), 16, "{names:?}");
    assert_eq!((names[0].as_str(), names[15].as_str()), ("loop0", "loop15"));
    assert!(fabric.open("loop1:1", Rail::ScaleUp).is_ok());
    for bad in ["mlx5_0", "loop0:2", "loop1:", "loop16:1"] {
        let err = fabric.open(bad, Rail::ScaleOut).err().expect("error");
        let text = err.to_string();
        assert!(
            text.contains(bad) && text.contains("loop0, loop1"),
            "{text}"
        );
    }
}

/// Every device is its own NIC: its own GID, address and GUID, as many as a large node has.
#[test]
fn devices_report_distinct_identities() {
    let (_s, fabric) = serial("");
    let infos: Vec<_> = fabric
        .device_names()
        .iter()
        .map(|name| fabric.open(name, Rail::ScaleOut).unwrap().info().clone())
        .collect();
    let a = &infos[0];
    assert_eq!((a.port, a.speed_mbps, a.active_mtu), (1, 100_000, 5));
    assert_eq!(a.address, std::net::IpAddr::from([127, 0, 0, 1]));
    assert!(a.pci_path.is_none());
    for (i, a) in infos.iter().enumerate() {
        for b in &infos[i + 1..] {
            assert!(a.endpoint != b.endpoint && a.address != b.address && a.guid != b.guid);
        }
    }
}

#[test]
fn write_lands_bytes_across_fabric_values() {
    let (_s, fabric) = serial("");
    let (mut tx, mut rx) = pair(&fabric, 16, 8);
    let (src, dst) = (Buf::new(256, 0x5a), Buf::new(256, 0));
    let (lk, rk) = (
        src.register(&*tx.dev, Access::LOCAL),
        dst.register(&*rx.dev, Access::DATA),
    );
    post(&mut *tx.qp, &[write(7, &src, lk, &dst, rk)]).unwrap();
    let done = poll(&mut *tx.cq, 1);
    assert_eq!(done.len(), 1);
    assert_eq!(
        (done[0].wr_id, done[0].status, done[0].qp_num),
        (7, CompletionStatus::Success, tx.qp.qp_num())
    );
    assert_eq!(done[0].opcode, CompletionOpcode::RdmaWrite);
    assert!(dst.bytes().iter().all(|&b| b == 0x5a));
    assert!(
        poll(&mut *rx.cq, 1).is_empty(),
        "a plain write completes nothing remotely"
    );
}

#[test]
fn write_with_imm_consumes_one_receive() {
    let (_s, fabric) = serial("");
    let (mut tx, mut rx) = pair(&fabric, 16, 8);
    let (src, dst) = (Buf::new(100, 3), Buf::new(100, 0));
    let (lk, rk) = (
        src.register(&*tx.dev, Access::LOCAL),
        dst.register(&*rx.dev, Access::DATA),
    );
    rx.srq.post_receives(1, 0xabc).unwrap();
    let imm = 0x1234_5678u32.to_be();
    let wr = WorkRequest {
        opcode: SendOpcode::WriteWithImm { imm },
        ..write(1, &src, lk, &dst, rk)
    };
    post(&mut *tx.qp, &[wr, WorkRequest { wr_id: 2, ..wr }]).unwrap();
    let got = poll(&mut *rx.cq, 1);
    assert_eq!(got.len(), 1, "only one receive was posted");
    let c = got[0];
    assert_eq!(
        (c.opcode, c.status, c.wr_id),
        (
            CompletionOpcode::RecvRdmaWithImm,
            CompletionStatus::Success,
            0xabc
        )
    );
    assert_eq!((c.imm, c.byte_len, c.qp_num), (imm, 100, rx.qp.qp_num()));
    assert_eq!(dst.bytes(), vec![3; 100]);
    // The second IMM found the SRQ empty: the seam's error completion for a missing receive.
    let sent = poll(&mut *tx.cq, 1);
    assert_eq!(
        statuses(&sent),
        [
            CompletionStatus::Success,
            CompletionStatus::ReceiverNotReady
        ]
    );
}

#[test]
fn unsignaled_writes_complete_silently() {
    let (_s, fabric) = serial("");
    let (mut tx, _rx) = pair(&fabric, 16, 8);
    let (src, dst) = (Buf::new(8, 9), Buf::new(8, 0));
    let (lk, rk) = (
        src.register(&*tx.dev, Access::LOCAL),
        dst.register(&*tx.dev, Access::DATA),
    );
    let wr = WorkRequest {
        signaled: false,
        ..write(1, &src, lk, &dst, rk)
    };
    post(&mut *tx.qp, &[wr]).unwrap();
    assert!(poll(&mut *tx.cq, 3).is_empty());
    assert_eq!(dst.bytes(), vec![9; 8]);
}

#[test]
fn only_signaled_completions_free_send_slots() {
    let (_s, fabric) = serial("");
    let (mut tx, _rx) = pair(&fabric, 16, 4);
    let (src, dst) = (Buf::new(8, 1), Buf::new(8, 0));
    let (lk, rk) = (
        src.register(&*tx.dev, Access::LOCAL),
        dst.register(&*tx.dev, Access::DATA),
    );
    let quiet = WorkRequest {
        signaled: false,
        ..write(1, &src, lk, &dst, rk)
    };
    post(&mut *tx.qp, &[quiet; 4]).unwrap();
    assert!(poll(&mut *tx.cq, 2).is_empty());
    // Executed, but no completion proves it: the four slots are still taken.
    let err = post(&mut *tx.qp, &[quiet]).unwrap_err();
    assert_eq!((err.errno, err.verb), (libc::ENOMEM, "ibv_post_send"));
    assert_eq!(err.qp_num, Some(tx.qp.qp_num()));
}

#[test]
fn signaled_completion_retires_earlier_unsignaled_wrs() {
    let (_s, fabric) = serial("");
    let (mut tx, _rx) = pair(&fabric, 16, 4);
    let (src, dst) = (Buf::new(8, 1), Buf::new(8, 0));
    let (lk, rk) = (
        src.register(&*tx.dev, Access::LOCAL),
        dst.register(&*tx.dev, Access::DATA),
    );
    let quiet = WorkRequest {
        signaled: false,
        ..write(1, &src, lk, &dst, rk)
    };
    post(
        &mut *tx.qp,
        &[quiet, quiet, quiet, write(9, &src, lk, &dst, rk)],
    )
    .unwrap();
    // The whole chain must fit or nothing is posted.
    assert_eq!(post(&mut *tx.qp, &[quiet]).unwrap_err().errno, libc::ENOMEM);
    assert_eq!(poll(&mut *tx.cq, 1).len(), 1);
    post(
        &mut *tx.qp,
        &[quiet, quiet, quiet, write(10, &src, lk, &dst, rk)],
    )
    .unwrap();
    assert_eq!(poll(&mut *tx.cq, 1)[0].wr_id, 10);
}

#[test]
fn order_within_a_qp_is_kept() {
    let (_s, fabric) = serial("");
    let (mut tx, _rx) = pair(&fabric, 16, 8);
    let dst = Buf::new(4, 0);
    let rk = dst.register(&*tx.dev, Access::DATA);
    let srcs: Vec<Buf> = (1..=5).map(|v| Buf::new(4, v)).collect();
    let chain: Vec<WorkRequest> = srcs
        .iter()
        .zip(1u64..)
        .map(|(s, id)| write(id, s, s.register(&*tx.dev, Access::LOCAL), &dst, rk))
        .collect();
    post(&mut *tx.qp, &chain).unwrap();
    let ids: Vec<u64> = poll(&mut *tx.cq, 1).iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, [1, 2, 3, 4, 5]);
    assert_eq!(dst.bytes(), vec![5; 4], "the last write lands last");
}
