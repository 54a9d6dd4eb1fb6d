//! A QP's incoming messages: reading headers and payloads off the socket, checking a write
//! against the rail's live registrations, and landing its bytes (staged and ordered for what the
//! engine may poll, straight into the region for payloads; src/fabric/landing.rs).

use super::*;

impl Worker {
    /// Reads and executes messages; `true` when the budget ran out.
    pub(super) fn receive_some(&mut self, shared: &Shared, fd: i32, budget: &mut usize) -> bool {
        loop {
            if self.failed || self.refused {
                return false;
            }
            if self.waiting_receive && !self.finish_write_with_imm(shared) {
                return false;
            }
            if *budget == 0 {
                return true;
            }
            let Some(incoming) = self.incoming else {
                match socket::receive(
                    fd,
                    self.in_header[self.in_got..].as_mut_ptr() as u64,
                    HEADER_LEN - self.in_got,
                ) {
                    Ok(None) => return false,
                    Ok(Some(0)) => return self.closed(shared),
                    Ok(Some(n)) => self.in_got += n,
                    Err(e) => return self.socket_failed(shared, "receiving", e),
                }
                if self.in_got == HEADER_LEN {
                    self.in_got = 0;
                    self.start_incoming(shared);
                }
                continue;
            };
            match self.place(shared, fd, incoming, budget) {
                Ok(Placement::Done) => self.finish_incoming(shared),
                Ok(Placement::Partial) => {}
                Ok(Placement::Drained) | Err(()) => return false,
            }
        }
    }

    /// A header arrived: check it and begin its message.
    fn start_incoming(&mut self, shared: &Shared) {
        // Any word from the peer shows it alive and executing in order.
        if !self.awaiting.is_empty() {
            self.waiting_since = Some(Instant::now());
        }
        let header = match Header::decode(&self.in_header) {
            Ok(header) => header,
            Err(why) => {
                let why = format!("QP {}: a bad message from the peer: {why}", self.qpn);
                self.fail(shared, CompletionStatus::Other(1), why);
                return;
            }
        };
        if let Err(why) = self.in_sequence(&header) {
            let why = format!(
                "QP {}: a message out of sequence from the peer: {why}",
                self.qpn
            );
            self.fail(shared, CompletionStatus::Other(1), why);
            return;
        }
        let length = u64::from(header.length);
        match header.kind {
            Kind::Write | Kind::WriteWithImm => {
                let right = RemoteRight::Write;
                if !shared
                    .registry()
                    .remote(header.rkey, header.addr, length, right)
                {
                    self.refuse(shared, header);
                    return;
                }
                self.incoming = Some(Incoming { header, placed: 0 });
            }
            Kind::ReadRequest => {
                if !shared
                    .registry()
                    .remote(header.rkey, header.addr, length, RemoteRight::Read)
                {
                    self.refuse(shared, header);
                    return;
                }
                self.control.push_back(Control::ReadResponse {
                    seq: header.seq,
                    addr: header.addr,
                    length: header.length,
                });
            }
            Kind::ReadResponse => {
                let expected = self.awaiting.iter().find(|r| r.seq == header.seq);
                let fits = expected.is_some_and(|r| {
                    r.opcode == SendOpcode::Read && r.sge.map_or(0, |s| s.length) == header.length
                });
                if !fits {
                    let why = format!(
                        "QP {}: a read response for no read (seq {})",
                        self.qpn, header.seq
                    );
                    self.fail(shared, CompletionStatus::Other(1), why);
                    return;
                }
                self.incoming = Some(Incoming { header, placed: 0 });
            }
            Kind::Ack => self.complete_through(shared, header.seq),
            Kind::Nak => {
                self.complete_through(shared, header.seq.wrapping_sub(1));
                let status = status_of(header.status);
                let why = format!(
                    "QP {}: the peer refused request {} ({})",
                    self.qpn,
                    header.seq,
                    status.text()
                );
                self.fail(shared, status, why);
            }
        }
    }

    /// Whether `header`'s sequence number is one the peer may send now: a request the next in
    /// the peer's order (RC's expected PSN; one TCP stream carries them in post order), an
    /// acknowledgement or refusal one of a request this side has sent.
    fn in_sequence(&mut self, header: &Header) -> Result<(), String> {
        match header.kind {
            Kind::Write | Kind::WriteWithImm | Kind::ReadRequest => {
                if header.seq != self.expected_request {
                    return Err(format!(
                        "{:?} numbered {}, expected {}",
                        header.kind, header.seq, self.expected_request
                    ));
                }
                self.expected_request = self.expected_request.wrapping_add(1);
            }
            Kind::Ack | Kind::Nak => {
                let newest_sent = self.next_seq.wrapping_sub(1);
                if !seq_at_or_before(header.seq, newest_sent) {
                    return Err(format!(
                        "{:?} of request {}, past the newest sent ({newest_sent})",
                        header.kind, header.seq
                    ));
                }
            }
            // Matched against the reads in flight by sequence number where it is handled.
            Kind::ReadResponse => {}
        }
        Ok(())
    }

    /// A request the registry does not allow: answer with a NAK, then the QP is in error.
    fn refuse(&mut self, shared: &Shared, header: Header) {
        warn!(
            crate::log::NET,
            "tcp {}: QP {} refused {:?} of {} bytes at {:#x} under rkey {:#x}: no live registration allows it",
            shared.device,
            self.qpn,
            header.kind,
            header.length,
            header.addr,
            header.rkey
        );
        self.control
            .push_back(Control::Nak(header.seq, CompletionStatus::RemoteAccess));
        // Nothing more is read from a peer that broke the rules.
        self.incoming = None;
        self.waiting_receive = false;
        self.in_got = 0;
        self.refused = true;
    }

    /// Lands payload bytes of `incoming`; `Ok(true)` once all are in.
    fn place(
        &mut self,
        shared: &Shared,
        fd: i32,
        incoming: Incoming,
        budget: &mut usize,
    ) -> Result<Placement, ()> {
        let header = incoming.header;
        let length = header.length as usize;
        if !header.kind.has_payload() || incoming.placed == length {
            return Ok(Placement::Done);
        }
        let (key, addr) = match header.kind {
            Kind::ReadResponse => {
                let sge = self
                    .awaiting
                    .iter()
                    .find(|r| r.seq == header.seq)
                    .and_then(|r| r.sge)
                    .ok_or(())?;
                (sge.lkey, sge.addr)
            }
            _ => (header.rkey, header.addr),
        };
        let allowed = |registry: &crate::fabric::tcp::memory::Registry| match header.kind {
            Kind::ReadResponse => registry.local(key, addr, header.length.into()),
            _ => registry.remote(key, addr, header.length.into(), RemoteRight::Write),
        };
        let mut placed = incoming.placed;
        let received = if length <= STAGE_MAX {
            let target = self.staging[placed..length].as_mut_ptr() as u64;
            socket::receive(fd, target, length - placed)
        } else {
            // Straight into the region, under the read lock so the registration stays.
            let registry = shared.registry();
            if !allowed(&registry) {
                drop(registry);
                self.lost_registration(shared, header);
                return Err(());
            }
            let chunk = (length - placed).min(*budget);
            socket::receive(fd, addr + placed as u64, chunk)
        };
        match received {
            Ok(None) => return Ok(Placement::Drained),
            Ok(Some(0)) => {
                self.closed(shared);
                return Err(());
            }
            Ok(Some(n)) => {
                placed += n;
                *budget = budget.saturating_sub(n);
            }
            Err(e) => {
                self.socket_failed(shared, "receiving a payload", e);
                return Err(());
            }
        }
        self.incoming = Some(Incoming { header, placed });
        if placed < length {
            return Ok(Placement::Partial);
        }
        if length <= STAGE_MAX {
            let registry = shared.registry();
            if !allowed(&registry) {
                drop(registry);
                self.lost_registration(shared, header);
                return Err(());
            }
            // SAFETY: the registry (read-locked) has a live registration covering the range;
            // registered memory is only read by the engine through atomic loads or after a
            // completion (src/net/data/dma.rs).
            unsafe { store_ordered(addr, &self.staging[..length]) };
        }
        Ok(Placement::Done)
    }
}
