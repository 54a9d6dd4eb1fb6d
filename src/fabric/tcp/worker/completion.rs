//! The ends of a QP's messages: executing what arrived, completing the sender's WRs, the error
//! state, and the QP connected to itself (the flush's), which runs every WR in place.

use super::*;

impl Worker {
    /// A message's bytes are all in: execute it.
    pub(super) fn finish_incoming(&mut self, shared: &Shared) {
        let Some(incoming) = self.incoming.take() else {
            return;
        };
        let header = incoming.header;
        match header.kind {
            Kind::Write => self.executed = Some(header.seq),
            Kind::WriteWithImm => {
                self.incoming = Some(incoming);
                self.waiting_receive = true;
                self.finish_write_with_imm(shared);
            }
            Kind::ReadResponse => self.complete_through(shared, header.seq),
            Kind::ReadRequest | Kind::Ack | Kind::Nak => {}
        }
    }

    /// Completes a landed WRITE_WITH_IMM with the SRQ's oldest receive; `false` while the SRQ
    /// is empty (the stream waits, as an RNR NAK retried forever would).
    pub(super) fn finish_write_with_imm(&mut self, shared: &Shared) -> bool {
        let Some(incoming) = self.incoming else {
            self.waiting_receive = false;
            return true;
        };
        let header = incoming.header;
        let mut state = shared.state();
        let Some(wr_id) = self.srq.and_then(|srq| state.take_receive(srq)) else {
            return false;
        };
        state.deliver(
            self.cq,
            Completion {
                wr_id,
                status: CompletionStatus::Success,
                opcode: CompletionOpcode::RecvRdmaWithImm,
                byte_len: header.length,
                imm: header.imm,
                qp_num: self.qpn,
                vendor_err: 0,
            },
        );
        drop(state);
        self.incoming = None;
        self.waiting_receive = false;
        self.executed = Some(header.seq);
        true
    }

    /// Every request up to `seq` was executed by the peer: complete them.
    pub(super) fn complete_through(&mut self, shared: &Shared, seq: u32) {
        let mut state = shared.state();
        let mut retired = 0;
        while let Some(front) = self.awaiting.front().copied() {
            if !seq_at_or_before(front.seq, seq) {
                break;
            }
            self.awaiting.pop_front();
            retired += 1;
            if front.signaled {
                let (opcode, byte_len) = match front.opcode {
                    SendOpcode::Read => (
                        CompletionOpcode::RdmaRead,
                        front.sge.map_or(0, |s| s.length),
                    ),
                    _ => (CompletionOpcode::RdmaWrite, 0),
                };
                state.deliver(self.cq, success(front.wr_id, opcode, byte_len, self.qpn));
            }
        }
        if let Some(qp) = state.qps.get_mut(&self.qpn) {
            qp.outstanding = qp.outstanding.saturating_sub(retired);
        }
    }

    /// The QP enters the error state: the oldest outstanding WR completes with `status` (always,
    /// as verbs reports errors of unsignaled WRs too), the others are flushed (completions for
    /// signaled ones), and posts fail from now on.
    pub(super) fn fail(&mut self, shared: &Shared, status: CompletionStatus, why: String) {
        if self.failed {
            return;
        }
        self.failed = true;
        self.incoming = None;
        self.waiting_receive = false;
        let mut state = shared.state();
        let mut pending: Vec<(u64, bool)> = self
            .awaiting
            .drain(..)
            .map(|r| (r.wr_id, r.signaled))
            .collect();
        if let Some(request) = self.sending.take().and_then(|o| o.request) {
            pending.push((request.wr_id, request.signaled));
        }
        pending.extend(self.queue.drain(..).map(|w| (w.wr_id, w.signaled)));
        if let Some(qp) = state.qps.get_mut(&self.qpn) {
            pending.extend(qp.submitted.drain(..).map(|w| (w.wr_id, w.signaled)));
            qp.outstanding = 0;
            qp.error = Some(why.clone());
        }
        let affected = pending.len();
        for (index, (wr_id, signaled)) in pending.into_iter().enumerate() {
            let status = if index == 0 {
                status
            } else {
                CompletionStatus::Flushed
            };
            if index == 0 || signaled {
                let mut completion = success(wr_id, CompletionOpcode::RdmaWrite, 0, self.qpn);
                completion.status = status;
                state.deliver(self.cq, completion);
            }
        }
        drop(state);
        if affected > 0 {
            warn!(
                crate::log::NET,
                "tcp {}: {why} ({affected} WRs failed)", shared.device
            );
        } else {
            // A peer closing a QP with nothing in flight is an ordinary teardown.
            trace!(crate::log::NET, "tcp {}: {why}", shared.device);
        }
    }

    /// The socket failed with `error` while `doing`: the peer is unreachable, as RC's retries
    /// running out (a user timeout, a reset, a refused connection).
    pub(super) fn socket_failed(
        &mut self,
        shared: &Shared,
        doing: &str,
        error: std::io::Error,
    ) -> bool {
        let peer = self.peer.map(|p| p.address.to_string()).unwrap_or_default();
        let why = format!("QP {} {doing} to/from {peer}: {error}", self.qpn);
        self.fail(shared, CompletionStatus::RetryExceeded, why);
        false
    }

    /// The peer closed the connection.
    pub(super) fn closed(&mut self, shared: &Shared) -> bool {
        let peer = self.peer.map(|p| p.address.to_string()).unwrap_or_default();
        let why = format!("QP {}: the peer at {peer} closed the connection", self.qpn);
        self.fail(shared, CompletionStatus::RetryExceeded, why);
        false
    }

    /// A registration went away while its bytes were arriving.
    pub(super) fn lost_registration(&mut self, shared: &Shared, header: Header) {
        let why = format!(
            "QP {}: the target of a {:?} of {} bytes at {:#x} (key {:#x}) was deregistered while it arrived",
            self.qpn, header.kind, header.length, header.addr, header.rkey
        );
        self.fail(shared, CompletionStatus::RemoteAccess, why);
    }

    /// A QP connected to itself (the flush's): every WR executes here, in order.
    pub(super) fn execute_locally(&mut self, shared: &Shared) {
        while let Some(wr) = self.queue.pop_front() {
            let length = u64::from(wr.length());
            let registry = shared.registry();
            let (source, target, right) = match (wr.opcode, wr.sge) {
                (SendOpcode::Read, Some(sge)) => (wr.remote_addr, sge.addr, RemoteRight::Read),
                (_, Some(sge)) => (sge.addr, wr.remote_addr, RemoteRight::Write),
                (_, None) => (0, 0, RemoteRight::Write),
            };
            let local_ok = wr
                .sge
                .map_or(true, |s| registry.local(s.lkey, s.addr, length));
            let remote_ok = registry.remote(wr.rkey, wr.remote_addr, length, right);
            if !local_ok || !remote_ok {
                drop(registry);
                self.queue.push_front(wr);
                let status = if local_ok {
                    CompletionStatus::RemoteAccess
                } else {
                    CompletionStatus::LocalProtection
                };
                let why = format!(
                    "QP {} (connected to itself): {:?} refused",
                    self.qpn, wr.opcode
                );
                self.fail(shared, status, why);
                return;
            }
            if length > 0 {
                // SAFETY: both ranges lie in live registrations (checked under the read lock);
                // the copy goes through atomics on the target, as every landing does.
                unsafe { copy_release(source, target, length as usize) };
            }
            drop(registry);
            let mut state = shared.state();
            if let SendOpcode::WriteWithImm { imm } = wr.opcode {
                match self.srq.and_then(|srq| state.take_receive(srq)) {
                    Some(wr_id) => {
                        let mut completion = success(
                            wr_id,
                            CompletionOpcode::RecvRdmaWithImm,
                            wr.length(),
                            self.qpn,
                        );
                        completion.imm = imm;
                        state.deliver(self.cq, completion);
                    }
                    None => {
                        drop(state);
                        self.queue.push_front(wr);
                        return;
                    }
                }
            }
            if wr.signaled {
                let opcode = match wr.opcode {
                    SendOpcode::Read => CompletionOpcode::RdmaRead,
                    _ => CompletionOpcode::RdmaWrite,
                };
                state.deliver(self.cq, success(wr.wr_id, opcode, wr.length(), self.qpn));
            }
            if let Some(qp) = state.qps.get_mut(&self.qpn) {
                qp.outstanding = qp.outstanding.saturating_sub(1);
            }
        }
    }
}

/// A successful completion.
fn success(wr_id: u64, opcode: CompletionOpcode, byte_len: u32, qp_num: u32) -> Completion {
    Completion {
        wr_id,
        status: CompletionStatus::Success,
        opcode,
        byte_len,
        imm: 0,
        qp_num,
        vendor_err: 0,
    }
}

/// The completion status a NAK carries.
pub(super) fn status_of(code: u8) -> CompletionStatus {
    match code {
        4 => CompletionStatus::LocalProtection,
        5 => CompletionStatus::Flushed,
        10 => CompletionStatus::RemoteAccess,
        12 => CompletionStatus::RetryExceeded,
        13 => CompletionStatus::ReceiverNotReady,
        other => CompletionStatus::Other(u32::from(other)),
    }
}

/// Copies `length` bytes from `source` to `target` through a bounded staging buffer, landing
/// them in ascending order (src/fabric/landing.rs).
///
/// # Safety
/// Both ranges must be mapped memory of this process covered by live registrations.
unsafe fn copy_release(source: u64, target: u64, length: usize) {
    let mut buffer = [0u8; 512];
    let mut done = 0;
    while done < length {
        let chunk = (length - done).min(buffer.len());
        // SAFETY: the source range is mapped (caller); volatile because a peer may write it.
        for (index, byte) in buffer[..chunk].iter_mut().enumerate() {
            // SAFETY: the source range is mapped (the caller's promise).
            *byte = unsafe { ((source as usize + done + index) as *const u8).read_volatile() };
        }
        // SAFETY: the target range is mapped registered memory (caller).
        unsafe { store_ordered(target + done as u64, &buffer[..chunk]) };
        done += chunk;
    }
}
