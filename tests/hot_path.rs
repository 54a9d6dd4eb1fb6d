//! The hot path does no upkeep: 10,000 transfers through the exported `ncclNetPlugin_v12` table
//! (`isend`, `irecv`, `test`) with 1,024 idle connections open beside the active one, in
//! advanced mode with the agent's hint file mapped (hint read on every slot) and probes on
//! (counters, histograms, events), make
//!
//! * no heap allocation (a counting global allocator watching this thread),
//! * no system call (a seccomp filter on this thread reports every call, `common/syscalls.rs`),
//! * no wait for a lock: another thread takes the plugin's global lock in a loop meanwhile
//!   (`getProperties`), so a data path that took it would sometimes wait (`futex`, a call).
//!
//! Set-up (init, connect, regMr) may do all three; only the data-path window is counted.
#![allow(clippy::unwrap_used, clippy::expect_used)] // A failed unwrap fails the test, with its message.

use std::cell::Cell;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, Ordering};

use nccl_net_mpib::ffi::ncclNetPlugin_v12;

#[path = "common/syscalls.rs"]
mod syscalls;
#[path = "common/table.rs"]
mod table;

#[path = "common/allocations.rs"]
mod allocations;
use allocations::{ALLOCATIONS, COUNTING};

const TRANSFERS: usize = 10_000;
const SIZES: [usize; 5] = [0, 1, 4097, 65536, 1 << 20];
/// Connections open and idle during the window.
const IDLE: usize = 1024;

#[test]
fn isend_irecv_and_test_allocate_syscall_and_lock_nothing_beside_idle_connections() {
    let agent = mpib_driver::Agent::start_in_temp().unwrap_or_else(|e| panic!("{e}"));
    agent.set_sup_bw_all(512);
    std::env::set_var("MPIB_FABRIC", "loopback");
    std::env::set_var("MPIB_MODE", "1"); // advanced: the hint read is on the path too
    for (name, value) in agent.env() {
        std::env::set_var(name, value);
    }
    std::env::set_var("MPIB_PROBES_SAMPLE", "1"); // every transfer also writes a ring event
    let probes_dir = std::env::temp_dir().join(format!("mpib-hot-path-{}", std::process::id()));
    std::env::set_var("MPIB_PROBES_DIR", &probes_dir);
    let net = &ncclNetPlugin_v12.0;
    let largest = SIZES[SIZES.len() - 1];
    let mut source: Vec<u8> = (0..largest).map(|i| i as u8).collect();
    let mut sink = vec![0u8; largest];
    // SAFETY: the buffers outlive the pair (closed below).
    let pair = unsafe { table::connect(net, None, &mut source, &mut sink) };
    let mut idle_buffers = vec![[0u8; 64]; 2 * IDLE];
    let idle: Vec<_> = idle_buffers
        .chunks_mut(2)
        // SAFETY: the buffers outlive the pairs (closed below).
        .map(|two| unsafe {
            let (a, b) = two.split_at_mut(1);
            table::connect(net, None, &mut a[0], &mut b[0])
        })
        .collect();
    assert_mapped(
        &agent.hint_path().display().to_string(),
        "the agent's hint file",
    );
    assert_mapped(&probes_dir.display().to_string(), "the probes file");
    let contend = AtomicBool::new(true);
    std::thread::scope(|scope| {
        scope.spawn(|| hold_the_global_lock_in_a_loop(&contend));
        let watch = syscalls::watch_this_thread().expect("seccomp user notification");
        COUNTING.with(|c| c.set(true));
        watch.start();
        for transfer in 0..TRANSFERS {
            let size = SIZES[transfer % SIZES.len()];
            // SAFETY: the buffers are the pair's registered ones.
            let (sent, received) = unsafe {
                let recv = table::irecv(net, &pair, sink.as_mut_ptr(), largest, 7, null_mut());
                let send = table::isend(net, &pair, source.as_mut_ptr(), size, 7, null_mut());
                table::wait_both(net, send, recv)
            };
            assert_eq!((sent as usize, received as usize), (size, size));
        }
        let calls = watch.stop();
        COUNTING.with(|c| c.set(false));
        contend.store(false, Ordering::SeqCst);
        let allocations = ALLOCATIONS.with(Cell::get);
        assert!(sink == source, "bytes differ after {TRANSFERS} transfers");
        assert_eq!(
            allocations, 0,
            "{allocations} heap allocations during {TRANSFERS} transfers"
        );
        let named: Vec<String> = (calls.iter().take(20))
            .map(|nr| format!("{nr} ({})", syscalls::name(*nr)))
            .collect();
        assert!(
            calls.is_empty(),
            "{} system calls during {TRANSFERS} transfers beside {IDLE} idle connections, \
             the first: {named:?}",
            calls.len()
        );
    });
    // SAFETY: no request in flight.
    unsafe {
        table::close(net, pair);
        for idle in idle {
            table::close(net, idle);
        }
    }
    drop(idle_buffers);
    let _ = std::fs::remove_dir_all(&probes_dir);
}

/// Asserts that a mapping of this process names `path`.
fn assert_mapped(path: &str, what: &str) {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    assert!(maps.contains(path), "{what} ({path}) is not mapped");
}

/// `getProperties` until told to stop: each takes the plugin's global lock.
fn hold_the_global_lock_in_a_loop(go_on: &AtomicBool) {
    let net = &ncclNetPlugin_v12.0;
    let mut properties = std::mem::MaybeUninit::uninit();
    while go_on.load(Ordering::SeqCst) {
        // SAFETY: device 0 exists; the output is writable.
        let code = unsafe { net.get_properties.unwrap()(0, properties.as_mut_ptr()) };
        assert_eq!(code, 0, "getProperties");
    }
}
