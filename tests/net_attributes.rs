//! What NCCL says about each operation (`setNetAttr`, ABI v11+) is kept: called on the
//! communicators' contexts as NCCL's proxy calls it, before transfers, it shows in each
//! connection's probes slot (for its direction) and in the record of every transfer posted after
//! it; a point-to-point call after a collective drops the collective's algorithm and protocol
//! from what is shown (a NULL context or attribute pointer is refused: src/ffi/tests.rs). In a
//! child process: the probes directory and the sampling (every transfer recorded) are fixed at
//! the first `init`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // A failed unwrap fails the test, with its message.

#[path = "common/process.rs"]
mod process;

use std::ffi::c_void;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use mpib_driver::abi::{CommAttr, NetAttr};
use mpib_driver::batch::connect_batch;
use mpib_driver::net::{Net, NetCtx, RecvBuf};
use mpib_driver::{child, Version};
use mpib_probes::{Direction, EventCursor, LoadState, Operation, ProbesReader};

/// Bytes of each transfer.
const SIZE: usize = 4096;
/// `NCCL_PTR_HOST`.
const PTR_HOST: i32 = 1;
/// Where the child writes its probes file.
const DIR_VARIABLE: &str = "NET_ATTRIBUTES_DIR";

fn attr(op_bit: u32, algo_bit: u32, proto_bit: u32, peers: i32, flows: i32) -> NetAttr {
    let side = CommAttr {
        max_concurrent_peers: peers,
        min_concurrent_peers: peers,
        max_flows_per_peer: flows,
        min_flows_per_peer: flows,
    };
    NetAttr {
        send_comm_attr: side,
        recv_comm_attr: CommAttr {
            max_concurrent_peers: -1,
            min_concurrent_peers: -1,
            ..side
        },
        op: 1 << op_bit,
        algo: 1 << algo_bit,
        proto: 1 << proto_bit,
    }
}

#[test]
fn what_nccl_says_of_each_operation_reaches_the_slot_and_the_records() {
    let dir = std::env::temp_dir().join(format!("mpib-net-attributes-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let dir_text = dir.display().to_string();
    let env = [
        ("MPIB_FABRIC", "loopback"),
        ("MPIB_PROBES_DIR", dir_text.as_str()),
        ("MPIB_PROBES_SAMPLE", "1"),
        (DIR_VARIABLE, dir_text.as_str()),
    ];
    let outcome = child::run_test("child_attributes", &env, Duration::from_secs(120)).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    outcome.assert_success("child_attributes");
}

/// One transfer from `send` to `recv`, polled until both are done.
fn transfer(net: &Net<'_>, pair: &Pair, buffers: &mut [Vec<u8>; 2]) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let bufs = [RecvBuf {
        data: buffers[1].as_mut_ptr().cast(),
        size: SIZE,
        tag: 3,
        mhandle: pair.handles[1].as_ptr(),
    }];
    let (mut recv, mut send) = (None, None);
    while recv.is_none() || send.is_none() {
        assert!(Instant::now() < deadline, "the transfer was never posted");
        if recv.is_none() {
            // SAFETY: the buffer is registered and outlives the request (tested below).
            recv = unsafe { net.irecv(&pair.batch.recvs[0], &bufs) }.unwrap();
        }
        if send.is_none() {
            let data: *mut c_void = buffers[0].as_mut_ptr().cast();
            let handle = &pair.handles[0];
            // SAFETY: as above.
            send = unsafe { net.isend(&pair.batch.sends[0], data, SIZE, 3, handle) }.unwrap();
        }
    }
    let mut pending = vec![recv.unwrap(), send.unwrap()];
    while !pending.is_empty() {
        pending.retain(|request| !net.test(request, None).unwrap());
        assert!(Instant::now() < deadline, "the transfer never completed");
    }
}

struct Pair {
    batch: mpib_driver::batch::Batch,
    handles: [mpib_driver::net::MemHandle; 2],
}

impl Pair {
    /// One pair in NCCL's order, each side's buffer registered.
    fn open(net: &Net<'_>, contexts: [&NetCtx; 2], buffers: &mut [Vec<u8>; 2]) -> Pair {
        let [send_ctx, recv_ctx] = contexts;
        let batch = connect_batch(net, send_ctx, recv_ctx, 0, 1, Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("{e}"));
        let [source, sink] = buffers;
        let handles = [
            // SAFETY: the buffers outlive their handles (deregistered in `close`).
            unsafe { net.reg_mr(&batch.sends[0], source.as_mut_ptr().cast(), SIZE, PTR_HOST) },
            // SAFETY: as above.
            unsafe { net.reg_mr(&batch.recvs[0], sink.as_mut_ptr().cast(), SIZE, PTR_HOST) },
        ]
        .map(Result::unwrap);
        Pair { batch, handles }
    }

    fn close(self, net: &Net<'_>) {
        let Pair { batch, handles } = self;
        let [send_handle, recv_handle] = handles;
        net.dereg_mr(&batch.sends[0], send_handle).unwrap();
        net.dereg_mr(&batch.recvs[0], recv_handle).unwrap();
        batch.close(net).unwrap();
    }
}

/// The operation of this process's send and receive connections, and of the records written
/// since `cursor`.
fn seen(reader: &ProbesReader, cursor: &mut EventCursor) -> ([Operation; 2], Vec<Operation>) {
    let snapshot = reader.snapshot();
    let of = |direction| {
        let c = snapshot
            .connections
            .iter()
            .find(|c| c.info.direction == direction);
        c.expect("a connection of each direction").operation
    };
    let records = reader.drain_events(cursor).records;
    let sent = records.iter().map(|r| r.transfer.operation).collect();
    ([of(Direction::Send), of(Direction::Recv)], sent)
}

#[test]
#[ignore = "runs in a child process started by what_nccl_says_of_each_operation_reaches_the_slot_and_the_records"]
fn child_attributes() {
    if !child::is_child("child_attributes") {
        return;
    }
    let dir = PathBuf::from(std::env::var(DIR_VARIABLE).unwrap());
    let plugin = mpib_driver::load_built_plugin().unwrap_or_else(|e| panic!("{e}"));
    let net = plugin.net(Version::V12).unwrap();
    let (recv_ctx, send_ctx) = (net.init(0xD1).unwrap(), net.init(0xD2).unwrap());
    let mut buffers = [vec![7u8; SIZE], vec![0u8; SIZE]];
    let pair = Pair::open(&net, [&send_ctx, &recv_ctx], &mut buffers);
    let path = process::own_probes_path(&dir).expect("this process's probes file");
    let LoadState::Ready(reader) = ProbesReader::open(&path).unwrap() else {
        panic!("the probes file is not ready")
    };
    let mut cursor = EventCursor::default();

    // Before NCCL says anything: nothing shown.
    transfer(&net, &pair, &mut buffers);
    let (slots, records) = seen(&reader, &mut cursor);
    assert_eq!(slots, [Operation::default(); 2]);
    assert_eq!(
        records.len(),
        1,
        "every transfer is recorded (MPIB_PROBES_SAMPLE=1)"
    );
    assert!(!records[0].is_known(), "{records:?}");

    // A ring all-reduce, simple protocol, 2 peers and 8 flows each (NCCL's bits: AllReduce 4,
    // Ring 1, Simple 2), said on both communicators' contexts.
    let all_reduce = attr(4, 1, 2, 2, 8);
    net.set_net_attr(&send_ctx, &all_reduce).unwrap();
    net.set_net_attr(&recv_ctx, &all_reduce).unwrap();
    transfer(&net, &pair, &mut buffers);
    let (slots, records) = seen(&reader, &mut cursor);
    assert_eq!(
        slots[0].describe(),
        "AllReduce Ring Simple, 2 peers x 8 flows"
    );
    assert_eq!(
        slots[1].describe(),
        "AllReduce Ring Simple, - peers x 8 flows"
    );
    let sent: Vec<String> = records.iter().map(Operation::describe).collect();
    assert_eq!(
        sent,
        ["AllReduce Ring Simple, 2 peers x 8 flows"],
        "the send's record"
    );

    // Then a send (bit 6): NCCL leaves the algorithm and protocol as they were.
    net.set_net_attr(&send_ctx, &attr(6, 1, 2, 1, 1)).unwrap();
    transfer(&net, &pair, &mut buffers);
    let (slots, records) = seen(&reader, &mut cursor);
    assert_eq!(slots[0].name(), "Send");
    assert_eq!(
        slots[1].name(),
        "AllReduce Ring Simple",
        "the other context kept its own"
    );
    let sent: Vec<String> = records.iter().map(Operation::name).collect();
    assert_eq!(sent, ["Send"]);

    pair.close(&net);
    net.finalize(send_ctx).unwrap();
    net.finalize(recv_ctx).unwrap();
}
