//! Memory through the engine: the optional flush read-back (`MPIB_FORCE_FLUSH`) and the
//! registrations the rails refuse.

use super::*;

#[test]
fn force_flush_reads_back_one_byte_per_rail() {
    let _guard = env_lock();
    let pair = connect_pair(&[("MPIB_FORCE_FLUSH", "1")]);
    assert_eq!(properties(0).unwrap().force_flush, 1);
    let mut sink = vec![0u8; 4096];
    let rmh = host_memory(
        CommRef::Recv(&pair.recv),
        sink.as_mut_ptr() as u64,
        sink.len(),
    );
    let buffer = recv_buffer(sink.as_mut_ptr() as u64, sink.len(), 1, &rmh);
    let empty = RecvBuffer {
        capacity: 0,
        ..buffer
    };
    assert!(
        iflush(&pair.recv, &[empty]).unwrap().is_none(),
        "nothing to flush for 0 bytes"
    );
    let request = iflush(&pair.recv, &[buffer])
        .unwrap()
        .expect("a flush request");
    let outcome = wait(request);
    assert_eq!(outcome.count, 0);
    transfer(&pair, 4096); // the comm still works after a flush
    deregister_memory(CommRef::Recv(&pair.recv), rmh).unwrap();
    close(pair);
}

#[test]
fn without_force_flush_iflush_has_nothing_to_wait_for() {
    let _guard = env_lock();
    let pair = connect_pair(&[]);
    assert_eq!(properties(0).unwrap().force_flush, 0);
    let mut sink = vec![0u8; 64];
    let rmh = host_memory(CommRef::Recv(&pair.recv), sink.as_mut_ptr() as u64, 64);
    let buffer = recv_buffer(sink.as_mut_ptr() as u64, 64, 1, &rmh);
    assert!(iflush(&pair.recv, &[buffer]).unwrap().is_none());
    deregister_memory(CommRef::Recv(&pair.recv), rmh).unwrap();
    close(pair);
}

#[test]
fn gpu_memory_is_refused_when_the_rails_cannot_register_it() {
    let _guard = env_lock();
    let pair = connect_pair(&[]);
    assert_eq!(
        properties(0).unwrap().ptr_support,
        PTR_HOST,
        "loopback rails: host memory only"
    );
    let buffer = [0u8; 64];
    let error = register_memory(
        CommRef::Send(&pair.send),
        buffer.as_ptr() as u64,
        64,
        PTR_CUDA,
    )
    .err()
    .expect("CUDA memory is refused");
    assert_eq!(error.kind, crate::error::ErrorKind::InvalidUsage, "{error}");
    assert!(
        error.message.contains("loop0") && error.message.contains("ptrSupport"),
        "{error}"
    );
    let error = register_dmabuf(
        CommRef::Recv(&pair.recv),
        buffer.as_ptr() as u64,
        64,
        PTR_CUDA,
        0,
        0,
    )
    .err()
    .expect("DMA-BUF is refused");
    assert!(error.message.contains("DMA-BUF"), "{error}");
    close(pair);
}
