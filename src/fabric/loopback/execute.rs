//! Progress: executing posted WRs the way an RC NIC would.
//!
//! One pass runs each QP's in-flight queue in FIFO order (RC keeps order within a QP) and the
//! QPs in creation order, or, under `reorder`, SUP before SOUT and newest first, to prove the
//! engine never relies on order across QPs or rails. Everything runs under the world lock, so a
//! pass is atomic with respect to posts and polls.

use super::device::device_gid;
use super::qp::InFlight;
use super::queues::deliver;
use super::World;
use crate::fabric::landing::land;
use crate::fabric::{Completion, CompletionOpcode, CompletionStatus, Rail, SendOpcode};

/// What executing the head WR of a QP did.
enum Step {
    /// The WR cannot run yet (its peer has not connected); the QP waits, keeping its order.
    Blocked,
    /// The WR ran (or failed) with this status.
    Done(CompletionStatus),
}

/// Runs one progress pass over every QP of the world that has WRs in flight, in creation order
/// (or the `reorder` order), as a pass over all of them would: executing a WR never queues one
/// on another QP, so the QPs with work are known before the pass starts.
pub(crate) fn progress(world: &mut World) {
    world.pass = world.pass.wrapping_add(1);
    // Without rates every WR is due (a WR admitted under an earlier model is not held back).
    if world.inflight_wrs == 0 {
        // Nothing queued anywhere: polling an idle CQ costs the same with 10 QPs or 10,000.
        return;
    }
    let now_ns = world.rates_now_ns().unwrap_or(u64::MAX);
    // Taken out and put back: the list keeps its capacity, so a pass never allocates.
    let mut busy = std::mem::take(&mut world.busy);
    if world.faults.reorder {
        // SUP before SOUT, newest first within a rail.
        busy.sort_unstable_by_key(|&(created, qpn)| {
            let sout = world
                .qps
                .get(qpn)
                .is_some_and(|qp| qp.rail == Rail::ScaleOut);
            (sout, std::cmp::Reverse(created))
        });
    } else if busy.windows(2).any(|pair| pair[0] > pair[1]) {
        // Usually one or two QPs, already in order: checked before sorting.
        busy.sort_unstable();
    }
    // Runs each and keeps those left with work, in one walk.
    let mut kept = 0;
    for next in 0..busy.len() {
        let (_, qpn) = busy[next];
        if world.qps.contains(qpn) {
            run_qp(world, qpn, now_ns);
            if world.qps.get(qpn).is_some_and(|qp| !qp.inflight.is_empty()) {
                busy[kept] = busy[next];
                kept += 1;
            }
        }
    }
    busy.truncate(kept);
    world.busy = busy;
}

/// Executes QP `index`'s ready WRs in order until its queue is empty, a WR is held back by
/// `delay` or has not yet arrived under the rate model, a WR is blocked, or a WR fails (which
/// flushes the rest).
fn run_qp(world: &mut World, index: u32, now_ns: u64) {
    loop {
        let Some(head) = world.qps[index].inflight.front().copied() else {
            return;
        };
        if head.ready_pass > world.pass || head.ready_at_ns > now_ns {
            return;
        }
        let status = match execute(world, index, &head) {
            Step::Blocked => return,
            Step::Done(status) => status,
        };
        let inflight = &mut world.qps[index].inflight;
        inflight.pop_front();
        restart_if_empty(inflight);
        world.inflight_wrs -= 1;
        finish(world, index, &head, status);
        if status != CompletionStatus::Success {
            flush(world, index);
            return;
        }
    }
}

/// Executes one WR: reachability, protection checks, the receive for an IMM, the copy, and the
/// receiver's completion. Returns the sender-side status.
fn execute(world: &mut World, index: u32, head: &InFlight) -> Step {
    use CompletionStatus::{LocalProtection, ReceiverNotReady, RemoteAccess, RetryExceeded};
    if head.inject_fail {
        return Step::Done(RetryExceeded);
    }
    let qp = &world.qps[index];
    let Some(peer) = qp.peer else {
        return Step::Done(RetryExceeded);
    };
    if world.cut[qp.rail.index()] {
        // The rail's wire is cut (the `cut` knob): nothing gets through, either way.
        return Step::Done(RetryExceeded);
    }
    // A destroyed peer, a wrong GID, a peer in error or connected elsewhere never ACKs: on
    // hardware the transport retries run out.
    let Some(peer_index) = world.qp_index(peer.qpn) else {
        return Step::Done(RetryExceeded);
    };
    let remote = &world.qps[peer_index];
    if device_gid(remote.device) != peer.gid || remote.error {
        return Step::Done(RetryExceeded);
    }
    match remote.peer {
        None => return Step::Blocked,
        Some(back) if back.qpn != qp.qpn => return Step::Done(RetryExceeded),
        Some(_) => {}
    }
    let wr = head.wr;
    let len = wr.length();
    if let (false, Some(sge), true) = (wr.inline, wr.sge, len > 0) {
        if !world.devices[qp.device].local_ok(&sge) {
            return Step::Done(LocalProtection);
        }
    }
    // A zero-byte write touches no memory, so (as on hardware) its rkey is not checked.
    let remote_device = &world.devices[remote.device];
    let allowed = match wr.opcode {
        SendOpcode::Read => remote_device.remote_read_ok(wr.remote_addr, len.into(), wr.rkey),
        _ => remote_device.remote_write_ok(wr.remote_addr, len.into(), wr.rkey),
    };
    if len > 0 && !allowed {
        return Step::Done(RemoteAccess);
    }
    let (remote_qpn, remote_cq, remote_srq) = (remote.qpn, remote.cq, remote.srq);
    let receive = match wr.opcode {
        SendOpcode::Read => {
            if let Some(sge) = wr.sge.filter(|s| s.length > 0) {
                // SAFETY: the source lies in a live registration of the peer allowing remote
                // reads and the destination in one of ours (checked above); `post_send`'s
                // contract keeps both valid until this WR completes.
                unsafe {
                    std::ptr::copy(
                        wr.remote_addr as *const u8,
                        sge.addr as *mut u8,
                        sge.length as usize,
                    )
                };
            }
            return Step::Done(CompletionStatus::Success);
        }
        SendOpcode::Write => None,
        SendOpcode::WriteWithImm { imm } => {
            // The responder needs a receive before it accepts the message (RNR NAK otherwise),
            // so nothing is placed when the SRQ is empty.
            let srq = remote_srq.and_then(|id| world.srq_index(id));
            match srq.and_then(|s| world.srqs[s].take()) {
                Some(recv_wr_id) => Some((recv_wr_id, imm)),
                None => return Step::Done(ReceiverNotReady),
            }
        }
    };
    copy_payload(world, index, head);
    if let Some((recv_wr_id, imm)) = receive {
        let completion = Completion {
            wr_id: recv_wr_id,
            status: CompletionStatus::Success,
            opcode: CompletionOpcode::RecvRdmaWithImm,
            byte_len: len,
            imm,
            qp_num: remote_qpn,
            vendor_err: 0,
        };
        deliver(world, remote_cq, completion);
    }
    Step::Done(CompletionStatus::Success)
}

/// Copies the WR's payload to its remote address (both ranges were checked against
/// registrations, or the source is the QP's own inline slot).
fn copy_payload(world: &World, index: u32, head: &InFlight) {
    let wr = &head.wr;
    let Some(sge) = wr.sge else { return };
    let len = sge.length as usize;
    if len == 0 {
        return;
    }
    let qp = &world.qps[index];
    let src = if wr.inline {
        let offset = qp.inline_offset(head.seq);
        match qp.inline_buf.get(offset..offset + len) {
            Some(slot) => slot.as_ptr(),
            None => return,
        }
    } else {
        sge.addr as *const u8
    };
    let dst = wr.remote_addr;
    let (src_start, dst_start) = (src as u64, dst);
    let overlapping = src_start < dst_start + len as u64 && dst_start < src_start + len as u64;
    // SAFETY: the destination lies inside a live registration of the peer's device and the
    // source inside one of ours (or is our own inline slot). `QueuePair::post_send`'s contract
    // makes the poster guarantee that both stay valid memory until this WR's chain completes,
    // which cannot happen before this copy. Ranges that do not overlap land in ascending order
    // as a NIC's would (src/fabric/landing.rs); overlapping ones (a QP writing within its own
    // registered buffer, never memory the engine polls) are moved with `copy` (memmove).
    unsafe {
        if overlapping {
            std::ptr::copy(src, dst as *mut u8, len);
        } else {
            land(dst, std::slice::from_raw_parts(src, len));
        }
    }
}

/// Completes an executed WR on the sender side: error completions are always generated, success
/// ones only for signaled WRs; either way the send-queue accounting is updated.
fn finish(world: &mut World, index: u32, head: &InFlight, status: CompletionStatus) {
    let generated = head.wr.signaled
        || !matches!(
            status,
            CompletionStatus::Success | CompletionStatus::Flushed
        );
    let qp = &mut world.qps[index];
    qp.retire(generated);
    if !generated {
        return;
    }
    let completion = Completion {
        wr_id: head.wr.wr_id,
        status,
        opcode: match head.wr.opcode {
            SendOpcode::Read => CompletionOpcode::RdmaRead,
            _ => CompletionOpcode::RdmaWrite,
        },
        byte_len: 0,
        imm: 0,
        qp_num: qp.qpn,
        vendor_err: vendor_err(status),
    };
    let cq = qp.cq;
    deliver(world, cq, completion);
}

/// Puts QP `index` in the error state and flushes every WR still queued behind the failed one
/// (or, for `QueuePair::fail`, every WR queued).
pub(crate) fn flush(world: &mut World, index: u32) {
    world.qps[index].error = true;
    while let Some(next) = world.qps[index].inflight.pop_front() {
        world.inflight_wrs -= 1;
        finish(world, index, &next, CompletionStatus::Flushed);
    }
}

/// WRs posted on QP `index` while it is in the error state: flushed at once, as a NIC flushes
/// what is posted on a QP in error (a completion for each signaled one); they take no send-queue
/// slot.
pub(crate) fn flush_posted(world: &mut World, index: u32, chain: &[crate::fabric::WorkRequest]) {
    let (qpn, cq) = (world.qps[index].qpn, world.qps[index].cq);
    for wr in chain.iter().filter(|wr| wr.signaled) {
        let vendor = vendor_err(CompletionStatus::Flushed);
        deliver(world, cq, Completion::flushed(wr, qpn, vendor));
    }
}

/// Starts an emptied ring again at its front. A ring buffer that keeps going round writes every
/// slot of its capacity over time, so each of thousands of QPs would hold its whole send queue
/// in memory however shallow its backlog; starting again at the front keeps only the slots its
/// deepest backlog used (docs/PERFORMANCE.md "Thousands of connections: what each costs").
/// `clear` on an empty ring moves no element and frees nothing.
pub(crate) fn restart_if_empty<T>(ring: &mut std::collections::VecDeque<T>) {
    if ring.is_empty() {
        ring.clear();
    }
}

/// A vendor error code for error completions (the ConnectX CQE syndromes), so error reports
/// look like the hardware's.
fn vendor_err(status: CompletionStatus) -> u32 {
    match status {
        CompletionStatus::Success => 0,
        CompletionStatus::LocalProtection => 0x04,
        CompletionStatus::Flushed => 0x05,
        CompletionStatus::RemoteAccess => 0x13,
        CompletionStatus::RetryExceeded => 0x15,
        CompletionStatus::ReceiverNotReady => 0x16,
        CompletionStatus::Other(code) => code,
    }
}
