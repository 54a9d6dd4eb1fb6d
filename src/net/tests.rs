//! Engine tests over the loopback fabric, through the internal API the FFI adapters call.

use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::*;

/// Env and the loopback world are process-wide: serialize the tests that set them.
pub(crate) fn env_lock() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

pub(crate) struct Pair {
    pub send: Box<SendComm>,
    pub recv: Box<RecvComm>,
    pub ctx: Arc<Context>,
}

pub(crate) fn connect_pair(vars: &[(&str, &str)]) -> Pair {
    for (name, _) in ENV_NAMES.iter().map(|n| (n, ())) {
        std::env::remove_var(name);
    }
    std::env::set_var("MPIB_FABRIC", "loopback");
    for (name, value) in vars {
        std::env::set_var(name, value);
    }
    let ctx = init(InitParams {
        traffic_class: -1,
        ..Default::default()
    })
    .unwrap();
    let mut handle = [0u8; HANDLE_SIZE];
    let mut listen_comm = listen(&ctx, 0, &mut handle).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let (mut send, mut recv) = (None, None);
    while send.is_none() || recv.is_none() {
        assert!(Instant::now() < deadline, "connect/accept did not finish");
        if send.is_none() {
            send = connect(&ctx, 0, &mut handle, -1).unwrap();
        }
        if recv.is_none() {
            recv = accept(&mut listen_comm).unwrap();
        }
    }
    close_listen(listen_comm).unwrap();
    Pair {
        send: send.unwrap(),
        recv: recv.unwrap(),
        ctx,
    }
}

const ENV_NAMES: [&str; 6] = [
    "MPIB_MODE",
    "MPIB_OOB_ADDR",
    "MPIB_LOOPBACK_FAULTS",
    "MPIB_SOUT_QP",
    "MPIB_SUP_QP",
    "MPIB_ISLAND_PREFIX_LEN",
];

pub(crate) fn wait(request: NonNull<Request>) -> TestOutcome {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        // SAFETY: a live request from isend/irecv.
        let outcome = unsafe { test(request) }.unwrap();
        if outcome.done {
            return outcome;
        }
        assert!(Instant::now() < deadline, "request did not complete");
    }
}

fn transfer(pair: &Pair, size: usize) {
    let source: Vec<u8> = (0..size.max(1)).map(|i| (i * 7 + size) as u8).collect();
    let mut sink = vec![0u8; size + 64];
    let smh = register_memory(
        CommRef::Send(&pair.send),
        source.as_ptr() as u64,
        size.max(1),
        PTR_HOST,
    )
    .unwrap();
    let rmh = register_memory(
        CommRef::Recv(&pair.recv),
        sink.as_mut_ptr() as u64,
        sink.len(),
        PTR_HOST,
    )
    .unwrap();
    let buffer = RecvBuffer {
        addr: sink.as_mut_ptr() as u64,
        capacity: sink.len(),
        tag: 9,
        memory: Some(&rmh),
        profiler_handle: std::ptr::null_mut(),
    };
    let rreq = loop {
        if let Some(r) = irecv(&pair.recv, &[buffer]).unwrap() {
            break r;
        }
    };
    let sreq = loop {
        if let Some(r) = isend(
            &pair.send,
            source.as_ptr() as u64,
            size,
            9,
            &smh,
            std::ptr::null_mut(),
        )
        .unwrap()
        {
            break r;
        }
        // SAFETY: live request.
        let _ = unsafe { test(rreq) }.unwrap();
    };
    let sent = wait(sreq);
    let received = wait(rreq);
    assert_eq!(sent.sizes[0] as usize, size);
    assert_eq!(received.sizes[0] as usize, size, "size {size}");
    assert!(
        sink[..size] == source[..size],
        "bytes differ at size {size}"
    );
    deregister_memory(CommRef::Send(&pair.send), smh).unwrap();
    deregister_memory(CommRef::Recv(&pair.recv), rmh).unwrap();
}

#[test]
fn moves_bytes_intra_island() {
    let _guard = env_lock();
    let pair = connect_pair(&[]);
    for size in [0, 1, 127, 128, 4097, (1 << 20) + 3] {
        transfer(&pair, size);
    }
    let Pair { send, recv, ctx } = pair;
    close_send(send).unwrap();
    close_recv(recv).unwrap();
    finalize(ctx).unwrap();
}
