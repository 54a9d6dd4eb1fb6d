//! Thousands of connections in one process (issue 22): N connection pairs opened through the
//! exported `ncclNetPlugin_v12` table on the loopback fabric, as NCCL's proxy opens one per peer
//! and channel, then one verified 64 KiB transfer on every pair with all of them in flight, then
//! everything closed again. Per N it reports:
//!
//! * connect time per pair (listen → connect/accept both up → closeListen), p50 / p99 / total;
//! * what each open pair holds: resident memory, file descriptors, mappings (from /proc/self);
//! * the transfer wave's time per transfer;
//! * `test` on one pending receive with N − 1 idle connections around it, against N = 1;
//! * after closing everything: resident memory before and after `malloc_trim(0)` against the
//!   baseline, over `--cycles` open/close cycles (flat after trimming: no leak).
//!
//! `cargo bench --bench scale -- --pairs 1,64,1024,8192 --cycles 3` (the defaults); `--order
//! batched` sets the pairs up in NCCL's batch order (every listen first, then connect and accept
//! round-robin) instead of one pair at a time; `--warm 300`
//! adds 300 small transfers on every pair, one at a time, and prints what a pair holds once it
//! has gone round its 256 CTS slots, as a busy connection has. With
//! `--fabric verbs` it runs on the NICs the environment names (`MPIB_HCA_SOUT`, `MPIB_HCA_SUP`,
//! `MPIB_OOB_ADDR`: the rig's) instead of the loopback fabric, and prints what `rdma resource
//! show` counts on each NIC while the pairs are open. Prints a table and one
//! `row pairs=N ...` line per N for scripts; the batched order also prints the most descriptors
//! open at once while the batch connected. A pair holds no descriptor of its own, connected or
//! connecting (one listening socket per device, one control link per pair of processes, which
//! carries the handshakes after the first: src/net/setup/listener.rs,
//! src/net/observe/link_ride.rs); the first `init` raises the soft limit to the hard one all the
//! same.
#![allow(clippy::unwrap_used, clippy::expect_used)] // A failed unwrap fails the test, with its message.

use std::alloc::{GlobalAlloc, Layout, System};
use std::ffi::c_void;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Instant;

use nccl_net_mpib::ffi::ncclNetPlugin_v12;
use nccl_net_mpib::ffi::types::NetV12;

mod common;
#[path = "../tests/common/table.rs"]
mod table;

use common::median;
use table::{check, TablePair};

/// Bytes each pair moves in the transfer wave.
const TRANSFER: usize = 64 * 1024;
/// `test` calls timed on the one pending receive (`--test-calls`).
const TEST_CALLS: usize = 200_000;

/// Live heap bytes by allocation size class (`2^k` ..< `2^(k+1)` bytes), for `--heap`.
static LIVE_HEAP: [AtomicI64; 40] = [const { AtomicI64::new(0) }; 40];

fn size_class(size: usize) -> usize {
    (usize::BITS - size.max(1).leading_zeros() - 1).min(39) as usize
}

/// The system allocator, keeping live bytes per size class.
struct TrackingAllocator;

// SAFETY: forwards to the system allocator unchanged; tracking is one relaxed atomic add.
unsafe impl GlobalAlloc for TrackingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE_HEAP[size_class(layout.size())].fetch_add(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LIVE_HEAP[size_class(layout.size())].fetch_add(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE_HEAP[size_class(layout.size())].fetch_sub(layout.size() as i64, Ordering::Relaxed);
        LIVE_HEAP[size_class(new_size)].fetch_add(new_size as i64, Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_HEAP[size_class(layout.size())].fetch_sub(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: TrackingAllocator = TrackingAllocator;

fn live_heap() -> [i64; 40] {
    std::array::from_fn(|k| LIVE_HEAP[k].load(Ordering::Relaxed))
}

/// Resident bytes, descriptors and mappings of this process.
#[derive(Clone, Copy, Debug)]
struct Footprint {
    resident: u64,
    /// Pages pinned for the NIC (`VmPin`: registrations on verbs; 0 on loopback).
    pinned: u64,
    descriptors: u64,
    mappings: u64,
}

fn footprint() -> Footprint {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .expect("statm resident field");
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
    let descriptors = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64);
    let mappings = std::fs::read_to_string("/proc/self/maps").map_or(0, |m| m.lines().count());
    let pinned = common::pinned_bytes();
    Footprint {
        resident: pages * page,
        pinned,
        descriptors,
        mappings: mappings as u64,
    }
}

fn trim() {
    // SAFETY: glibc's malloc_trim has no preconditions.
    unsafe { libc::malloc_trim(0) };
}

/// The `pct`-th percentile of sorted `values`.
fn percentile(sorted: &[f64], pct: f64) -> f64 {
    let index = ((sorted.len() as f64 - 1.0) * pct / 100.0).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

/// One cycle's figures.
struct Cycle {
    /// Pairs opened (fewer than asked when a limit stopped them).
    opened: usize,
    connect_ns: Vec<f64>,
    connect_total_s: f64,
    open: Footprint,
    transfer_ns: f64,
    test_ns: f64,
    closed_untrimmed: u64,
    closed_trimmed: u64,
    /// Live heap bytes per size class while the pairs were open.
    heap_open: [i64; 40],
    /// Resident bytes after `--warm` transfers on every pair.
    warm: Option<u64>,
    /// `--order batched`: the most descriptors open at once while the batch connected, over
    /// those open before it (read once per round over the batch).
    connecting_descriptors: Option<u64>,
}

/// Opens a pair per sink chunk until one fails (a limit): the pairs and each one's connect time.
fn open_pairs(net: &NetV12, source: &mut [u8], sinks: &mut [u8]) -> (Vec<TablePair>, Vec<f64>) {
    let pairs = sinks.len() / TRANSFER;
    let mut connect_ns = Vec::with_capacity(pairs);
    let mut opened: Vec<TablePair> = Vec::with_capacity(pairs);
    for sink in sinks.chunks_mut(TRANSFER) {
        let one = Instant::now();
        // SAFETY: `source` and `sinks` outlive the pairs (the caller closes them first).
        match unsafe { table::try_connect(net, None, source, sink) } {
            Ok(pair) => opened.push(pair),
            Err(why) => {
                // Past a limit: what was opened is measured; the plugin's log line says why.
                println!(
                    "        pair {} of {pairs}: {why}; measuring the {} opened",
                    opened.len() + 1,
                    opened.len()
                );
                break;
            }
        }
        connect_ns.push(one.elapsed().as_nanos() as f64);
    }
    (opened, connect_ns)
}

/// `--order batched`: NCCL's order for a batch (`ncclTransportP2pSetup`, docs/NCCL_NET_ABI.md
/// "Connection setup"): every `listen` first (a context per pair, as per communicator), then
/// `connect` and `accept` polled round-robin over all of them, `closeListen` after each
/// `accept`, then the registrations. A pair's connect time is then the batch's over its pairs.
fn open_pairs_batched(
    net: &NetV12,
    source: &mut [u8],
    sinks: &mut [u8],
) -> (Vec<TablePair>, Vec<f64>, u64) {
    let pairs = sinks.len() / TRANSFER;
    let before = footprint().descriptors;
    let mut peak = before;
    let started = Instant::now();
    let mut config = nccl_net_mpib::ffi::types::NetCommConfig { traffic_class: -1 };
    let mut opened: Vec<TablePair> = Vec::with_capacity(pairs);
    let mut handles = vec![[0u8; 128]; pairs];
    let mut listens: Vec<*mut c_void> = vec![null_mut(); pairs];
    for (index, handle) in handles.iter_mut().enumerate() {
        let mut pair = TablePair::empty();
        // SAFETY: NCCL ABI calls with valid pointers.
        unsafe {
            check(
                net.init.unwrap()(&mut pair.ctx, index as u64 + 2, &mut config, None, None),
                "init",
            );
            check(
                net.listen.unwrap()(pair.ctx, 0, handle.as_mut_ptr().cast(), &mut listens[index]),
                "listen",
            );
        }
        opened.push(pair);
    }
    let mut up = 0;
    while up < 2 * pairs {
        peak = peak.max(footprint().descriptors);
        for (index, pair) in opened.iter_mut().enumerate() {
            // SAFETY: NCCL ABI calls on live objects; each listen is closed once.
            unsafe {
                if pair.send.is_null() {
                    let handle = handles[index].as_mut_ptr().cast();
                    let code =
                        net.connect.unwrap()(pair.ctx, 0, handle, &mut pair.send, null_mut());
                    check(code, "connect");
                    up += usize::from(!pair.send.is_null());
                }
                if pair.recv.is_null() {
                    check(
                        net.accept.unwrap()(listens[index], &mut pair.recv, null_mut()),
                        "accept",
                    );
                    if !pair.recv.is_null() {
                        check(net.close_listen.unwrap()(listens[index]), "closeListen");
                        up += 1;
                    }
                }
            }
        }
    }
    let per_pair = started.elapsed().as_nanos() as f64 / pairs as f64;
    for (pair, sink) in opened.iter_mut().zip(sinks.chunks_mut(TRANSFER)) {
        // SAFETY: `source` and `sinks` outlive the pairs (the caller closes them first).
        unsafe { table::register(net, pair, source, sink) };
    }
    (opened, vec![per_pair; pairs], peak.saturating_sub(before))
}

/// `--order batched` (NCCL's, [`open_pairs_batched`]) or `sequential` (the default: a pair at a
/// time, [`open_pairs`]).
fn batched() -> bool {
    let args: Vec<String> = std::env::args().collect();
    args.windows(2)
        .any(|w| w[0] == "--order" && w[1] == "batched")
}

/// `--warm K`: K more small transfers on every pair, one at a time, so that each connection
/// goes round its CTS slots (256) and queues as a busy one does; the resident bytes then.
fn warm_up(net: &NetV12, opened: &[TablePair], base: *mut u8, sink_base: *mut u8) -> Option<u64> {
    let warm_transfers = common::argument("--warm", 0);
    (warm_transfers > 0).then(|| {
        for (i, pair) in opened.iter().enumerate() {
            for _ in 0..warm_transfers {
                // SAFETY: each pair's sink chunk and the source lie in its registrations.
                let (sent, received) = unsafe {
                    let recv =
                        table::irecv(net, pair, sink_base.add(i * TRANSFER), 64, 4, null_mut());
                    let send = table::isend(net, pair, base.add(i), 64, 4, null_mut());
                    table::wait_both(net, send, recv)
                };
                assert_eq!((sent, received), (64, 64));
            }
        }
        footprint().resident
    })
}

/// ns per `test` on one pending receive of `pair` (which stays pending: the pair closes with it,
/// as on NCCL's abort), with the other pairs idle around it.
fn time_test(net: &NetV12, pair: &TablePair, sink: *mut u8) -> f64 {
    let test = net.test.unwrap();
    // SAFETY: the pair's sink lies in its registration.
    let pending = unsafe { table::irecv(net, pair, sink, 64, 2, null_mut()) };
    let started = Instant::now();
    let test_calls = common::argument("--test-calls", TEST_CALLS).max(1);
    for _ in 0..test_calls {
        let (mut done, mut sizes) = (0, [0i32; 8]);
        // SAFETY: a live request; outputs valid.
        check(
            unsafe { test(pending, &mut done, sizes.as_mut_ptr()) },
            "test",
        );
        assert_eq!(done, 0, "nothing sends: the receive stays pending");
    }
    started.elapsed().as_nanos() as f64 / test_calls as f64
}

/// Opens `pairs` pairs, moves one verified transfer on each, times `test`, closes them all.
fn cycle(net: &NetV12, pairs: usize) -> Cycle {
    // Zeroed memory comes from the kernel untouched: the sinks count as resident only once the
    // transfers wrote them, after the per-pair footprint was taken.
    let mut source: Vec<u8> = (0..TRANSFER + pairs).map(|i| (i * 7 % 251) as u8).collect();
    let mut sinks = vec![0u8; TRANSFER * pairs];
    let started = Instant::now();
    let (opened, mut connect_ns, connecting_descriptors) = if batched() {
        let (opened, connect_ns, peak) = open_pairs_batched(net, &mut source, &mut sinks);
        (opened, connect_ns, Some(peak))
    } else {
        let (opened, connect_ns) = open_pairs(net, &mut source, &mut sinks);
        (opened, connect_ns, None)
    };
    assert!(!opened.is_empty(), "not even one pair opened");
    let pairs = opened.len();
    let connect_total_s = started.elapsed().as_secs_f64();
    let open = footprint();
    if on_verbs() {
        print_rdma_resources(pairs);
        println!(
            "        pinned: {:.1} kB per pair",
            open.pinned as f64 / pairs as f64 / 1e3
        );
    }
    let heap_open = live_heap();

    let started = Instant::now();
    let base = source.as_mut_ptr();
    let sink_base = sinks.as_mut_ptr();
    let requests: Vec<(*mut c_void, *mut c_void)> = opened
        .iter()
        .enumerate()
        .map(|(i, pair)| {
            // SAFETY: each pair's sink chunk and the source lie in its registrations.
            unsafe {
                let recv = table::irecv(
                    net,
                    pair,
                    sink_base.add(i * TRANSFER),
                    TRANSFER,
                    1,
                    null_mut(),
                );
                let send = table::isend(net, pair, base.add(i), TRANSFER, 1, null_mut());
                (send, recv)
            }
        })
        .collect();
    for (send, recv) in requests {
        // SAFETY: live requests of this table; every pair's transfer is already in flight.
        let (sent, received) = unsafe { table::wait_both(net, send, recv) };
        assert_eq!((sent, received), (TRANSFER as i32, TRANSFER as i32));
    }
    let transfer_ns = started.elapsed().as_nanos() as f64 / pairs as f64;
    for (i, sink) in sinks.chunks(TRANSFER).take(opened.len()).enumerate() {
        assert!(
            sink == &source[i..i + TRANSFER],
            "pair {i} of {pairs}: the received bytes differ from what was sent"
        );
    }

    let warm = warm_up(net, &opened, base, sink_base);

    let test_ns = time_test(net, &opened[0], sink_base);

    for pair in opened {
        // SAFETY: pairs from `table::connect`; pair 0 closes with a receive pending, as on
        // NCCL's abort.
        unsafe { table::close(net, pair) };
    }
    drop(sinks);
    drop(source);
    let closed_untrimmed = footprint().resident;
    trim();
    let closed_trimmed = footprint().resident;
    connect_ns.sort_by(f64::total_cmp);
    Cycle {
        opened: pairs,
        connect_ns,
        connect_total_s,
        open,
        transfer_ns,
        test_ns,
        closed_untrimmed,
        closed_trimmed,
        heap_open,
        warm,
        connecting_descriptors,
    }
}

/// Heap bytes per pair by allocation size class, largest first (`--heap`).
fn print_heap(open: &[i64; 40], baseline: &[i64; 40], pairs: usize) {
    let mut classes: Vec<(usize, f64)> = (0..40)
        .map(|k| (k, (open[k] - baseline[k]) as f64 / pairs as f64))
        .filter(|(_, bytes)| bytes.abs() >= 64.0)
        .collect();
    classes.sort_by(|a, b| b.1.total_cmp(&a.1));
    let total: f64 = classes.iter().map(|(_, b)| b).sum();
    print!("        heap/pair {:.1} kB:", total / 1e3);
    for (k, bytes) in classes {
        print!(
            " [{}..{}) {:.1} kB;",
            1u64 << k,
            1u64 << (k + 1),
            bytes / 1e3
        );
    }
    println!();
}

/// The kernel's count of verbs objects per NIC (`rdma resource show`), with the pairs open.
fn print_rdma_resources(pairs: usize) {
    match std::process::Command::new("rdma")
        .args(["resource", "show"])
        .output()
    {
        Ok(out) => {
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                println!("        rdma with {pairs} pairs open: {}", line.trim());
            }
        }
        Err(e) => println!("        rdma resource show: {e}"),
    }
}

/// `--fabric verbs`: the NICs the environment names instead of the loopback fabric.
fn on_verbs() -> bool {
    let args: Vec<String> = std::env::args().collect();
    args.windows(2)
        .any(|w| w[0] == "--fabric" && w[1] == "verbs")
}

fn list_argument(name: &str, default: &[usize]) -> Vec<usize> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| default.to_vec())
}

fn main() {
    let pair_counts = list_argument("--pairs", &[1, 64, 1024, 8192]);
    let cycles = common::argument("--cycles", 3).max(1);
    if !on_verbs() {
        std::env::set_var("MPIB_FABRIC", "loopback");
    }
    std::env::set_var("MPIB_MODE", "1");
    std::env::set_var("MPIB_AGENT_SOCKET", "/nonexistent/mpib-agent.sock");
    let probes = std::env::temp_dir().join(format!("mpib-scale-{}", std::process::id()));
    std::env::set_var("MPIB_PROBES_DIR", &probes);
    let net = &ncclNetPlugin_v12.0;
    // One context held across cycles: the devices stay open, as in a job.
    let mut holder: *mut c_void = null_mut();
    let mut config = nccl_net_mpib::ffi::types::NetCommConfig { traffic_class: -1 };
    // SAFETY: NCCL ABI call with valid pointers.
    check(
        unsafe { net.init.unwrap()(&mut holder, 1, &mut config, None, None) },
        "init",
    );
    trim();
    let baseline = footprint();
    println!(
        "baseline: {:.1} MB resident, {} descriptors, {} mappings",
        baseline.resident as f64 / 1e6,
        baseline.descriptors,
        baseline.mappings
    );
    println!(
        "{:>6} {:>5} {:>10} {:>10} {:>9} {:>10} {:>7} {:>8} {:>11} {:>9} {:>12} {:>12}",
        "pairs",
        "cycle",
        "conn p50",
        "conn p99",
        "conn tot",
        "RSS/pair",
        "fd/pair",
        "map/pair",
        "xfer/pair",
        "test ns",
        "closed +MB",
        "trimmed +MB"
    );
    let heap_baseline = live_heap();
    let show_heap = std::env::args().any(|a| a == "--heap");
    let mut one_test_ns = None;
    for &pairs in &pair_counts {
        // Each figure of the row is the median over the cycles.
        let mut figures: Vec<[f64; 10]> = Vec::new();
        let mut opened = pairs;
        for round in 0..cycles {
            let c = cycle(net, pairs);
            let per = |open: u64, base: u64| open.saturating_sub(base) as f64 / c.opened as f64;
            let growth = |after: u64| (after as f64 - baseline.resident as f64) / 1e6;
            let row = [
                percentile(&c.connect_ns, 50.0) / 1e6,
                percentile(&c.connect_ns, 99.0) / 1e6,
                c.connect_total_s,
                per(c.open.resident, baseline.resident) / 1e3,
                per(c.open.descriptors, baseline.descriptors),
                per(c.open.mappings, baseline.mappings),
                c.transfer_ns / 1e3,
                c.test_ns,
                growth(c.closed_untrimmed),
                growth(c.closed_trimmed),
            ];
            println!(
                "{pairs:>6} {round:>5} {:>8.3}ms {:>8.3}ms {:>8.2}s {:>8.1}kB {:>7.2} {:>8.2} {:>9.1}us {:>9.1} {:>12.1} {:>12.1}",
                row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7], row[8], row[9]
            );
            if show_heap {
                print_heap(&c.heap_open, &heap_baseline, c.opened);
            }
            opened = opened.min(c.opened);
            if let Some(peak) = c.connecting_descriptors {
                println!("        while the batch connected: at most {peak} more descriptors open");
            }
            if let Some(warm) = c.warm {
                println!(
                    "        after --warm transfers on every pair: {:.1} kB resident per pair",
                    per(warm, baseline.resident) / 1e3
                );
            }
            figures.push(row);
        }
        let m: Vec<f64> = (0..10)
            .map(|k| median(figures.iter().map(|row| row[k]).collect()))
            .collect();
        let reference = *one_test_ns.get_or_insert(m[7]);
        println!(
"row pairs={pairs} opened={opened} connect_p50_ms={:.3} connect_p99_ms={:.3} connect_total_s={:.2} rss_per_pair_kb={:.1} fds_per_pair={:.2} maps_per_pair={:.2} transfer_us={:.1} test_ns={:.1} test_vs_one={:.3} closed_mb={:.1} trimmed_mb={:.1} baseline_mb={:.1}",
            m[0], m[1], m[2], m[3], m[4], m[5], m[6], m[7], m[7] / reference, m[8], m[9],
            baseline.resident as f64 / 1e6,
        );
    }
    // SAFETY: the context from init above.
    check(unsafe { net.finalize.unwrap()(holder) }, "finalize");
    let _ = std::fs::remove_dir_all(&probes);
}
