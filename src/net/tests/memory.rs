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

/// The MRs each NIC of the pair's device holds for `regMr` handles.
fn registrations_held(pair: &Pair) -> [usize; 2] {
    pair.send.info.registrations.each_ref().map(|c| c.held())
}

#[test]
fn one_buffer_registered_through_several_comms_is_one_mr_per_nic() {
    let _guard = env_lock();
    let pair = connect_pair(&[]);
    let other = connect_pair(&[]);
    let buffer = vec![0u8; 3 * 4096 + 100];
    let (addr, len) = (buffer.as_ptr() as u64, buffer.len());
    let comms = [
        CommRef::Send(&pair.send),
        CommRef::Recv(&pair.recv),
        CommRef::Send(&other.send),
        CommRef::Recv(&other.recv),
    ];
    let handles: Vec<_> = comms.iter().map(|c| host_memory(*c, addr, len)).collect();
    assert_eq!(
        registrations_held(&pair),
        [1, 1],
        "one MR per NIC for 4 handles"
    );
    for rail in Rail::ALL {
        let keys: Vec<_> = handles
            .iter()
            .map(|h| (h.lkey(rail), h.rkey(rail)))
            .collect();
        assert!(keys.windows(2).all(|w| w[0] == w[1]), "{rail}: {keys:?}");
    }
    // A sub-range on the same pages is a different page range (fewer pages): its own MR.
    let part = host_memory(comms[0], addr + 8192, 64);
    assert_eq!(registrations_held(&pair), [2, 2]);
    deregister_memory(comms[0], part).unwrap();
    let mut handles = handles.into_iter();
    for (held, comm) in [3, 2, 1].into_iter().zip(&comms) {
        deregister_memory(*comm, handles.next().unwrap()).unwrap();
        assert_eq!(
            registrations_held(&pair),
            [1, 1],
            "{held} handles left share it"
        );
    }
    deregister_memory(comms[3], handles.next().unwrap()).unwrap();
    assert_eq!(
        registrations_held(&pair),
        [0, 0],
        "the last handle released it"
    );
    close(other);
    close(pair);
}

#[test]
fn a_registration_past_the_nics_mrs_is_refused_naming_max_mr_and_the_cache_is_unchanged() {
    let _guard = env_lock();
    // The pair's own regions take 2 of each side's on SUP (4); room for one regMr range more.
    let pair = connect_pair(&[("MPIB_LOOPBACK_FAULTS", "max_mr=sup:5")]);
    let buffers = [vec![0u8; 8192], vec![0u8; 8192]];
    let first = host_memory(
        CommRef::Send(&pair.send),
        buffers[0].as_ptr() as u64,
        buffers[0].len(),
    );
    let again = host_memory(
        CommRef::Recv(&pair.recv),
        buffers[0].as_ptr() as u64,
        buffers[0].len(),
    );
    let error = register_memory(
        CommRef::Send(&pair.send),
        buffers[1].as_ptr() as u64,
        buffers[1].len(),
        PTR_HOST,
    )
    .err()
    .expect("a second range is past max_mr");
    assert!(
        error.message.contains("max_mr") && error.message.contains("memory registration"),
        "{error}"
    );
    assert_eq!(
        registrations_held(&pair),
        [1, 1],
        "the refusal released SOUT's"
    );
    deregister_memory(CommRef::Send(&pair.send), first).unwrap();
    deregister_memory(CommRef::Recv(&pair.recv), again).unwrap();
    let second = host_memory(
        CommRef::Send(&pair.send),
        buffers[1].as_ptr() as u64,
        buffers[1].len(),
    );
    deregister_memory(CommRef::Send(&pair.send), second).unwrap();
    close(pair);
}
