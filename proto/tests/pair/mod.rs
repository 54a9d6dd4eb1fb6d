//! A sender core and a receiver core wired back to back, with no fabric: the engine's steps
//! (`src/net/data/send`, `src/net/data/recv.rs`) reduced to what the protocol needs, driven by a script
//! of events.
//!
//! The wire between them models RC semantics as docs/PROTOCOL.md §2 relies on them: each rail
//! is one queue pair, in order on itself and unordered against the other; a write lands its
//! bytes before its IMM completes; an IMM needs a posted SRQ receive on its rail and waits
//! (RNR) until there is one; the receiver's CTS write lands in the sender's FIFO one entry at a
//! time. A cut rail drops what it carries and completes nothing, on either side; a cut may take
//! one direction only (the data, or the receiver's writes to the sender), or only the
//! acknowledgements of the sender's writes (they land, and the sender never hears: `wire.rs`).
//! With failover on (`failover.rs`), a side that detects a failed rail puts its end in error
//! (nothing more crosses it either way) and the two go on over the other, as
//! docs/PROTOCOL.md §10 says.

mod failback;
mod failover;
mod wire;

use std::collections::VecDeque;

use mpib_proto::chain::RecordTarget;
use mpib_proto::cts::{
    slot_of, CompletionRecord, CtsEntry, COMPLETION_RECORD_SIZE, FIFO_SLOTS, MAX_RECVS,
};
use mpib_proto::failover::{FailoverReport, FAILOVER_NOTICE_LEN};
use mpib_proto::imm::Imm;
use mpib_proto::post_plan;
use mpib_proto::rail::Rail;
use mpib_proto::rail_mask::RailMask;
use mpib_proto::recv_slots::{ImmOutcome, RecvBuffer, RecvSlots};
use mpib_proto::send_slots::{Head, SendBuffer, SendProgress, SendSlots};
use mpib_proto::srq::SrqCredits;
use mpib_proto::srq_shared::{SharedSrqLedger, SHARED_SRQ_FLOOR};
use mpib_proto::work::WorkRequest;

/// Sender data buffers start here; receiver buffers at [`RECV_BASE`].
const SEND_BASE: u64 = 0x1000_0000;
const RECV_BASE: u64 = 0x2000_0000;
/// The sender's record shadow and the receiver's records.
const SHADOW_BASE: u64 = 0x3000_0000;
const RECORDS_BASE: u64 = 0x4000_0000;
/// The sender's failover notice shadow and the receiver's mailbox it is written to.
const NOTICE_SHADOW_BASE: u64 = 0x5000_0000;
const NOTICE_MAILBOX_BASE: u64 = 0x6000_0000;
const RKEYS: [u32; 2] = [11, 12];
const LKEYS: [u32; 2] = [21, 22];

/// One buffer of a grouped transfer: the receive's capacity and the send's size.
#[derive(Clone, Copy, Debug)]
pub struct Buffer {
    pub capacity: u64,
    pub send: u64,
}

/// One grouped transfer (1..=8 buffers, tags 0..n) and the SUP share its sends get.
#[derive(Clone, Debug)]
pub struct Group {
    pub buffers: Vec<Buffer>,
    pub share: u32,
}

/// An event of the script.
#[derive(Clone, Copy, Debug)]
pub enum Event {
    /// The receiver polls its CQ, refills, and posts the next receive if it may.
    Receiver,
    /// The sender posts what is matched, matches one send, and polls its CQ.
    Sender,
    /// The head of a rail's queue is executed.
    Deliver(Rail),
    /// The next CTS entry (or failover report) lands in the sender's memory.
    Cts,
    /// From now on this rail drops everything, both ways.
    Cut(Rail),
    /// From now on this rail drops the sender's writes (data, IMMs, notices).
    CutData(Rail),
    /// From now on this rail drops the receiver's writes (CTS entries, reports).
    CutCts(Rail),
    /// From now on this rail drops the acknowledgements of the sender's writes: they still
    /// land at the receiver (bytes and IMM), and their completions never reach the sender.
    CutAcks(Rail),
    /// A side finds the rail failed (an error completion, a port event; or wrongly): its end
    /// goes to error and it fails over (with failover on).
    Detect(Side, Rail),
    /// The rail's wire works again, and it comes back if its failover is over on both sides
    /// (else nothing changes: the offer is refused).
    Restore(Rail),
}

/// One side of the pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Sender,
    Receiver,
}

/// What the receiver writes into the sender's memory.
#[derive(Clone, Copy, Debug)]
enum ToSender {
    /// A CTS entry at this FIFO index.
    Cts(usize, CtsEntry),
    /// The failover report, into the sender's mailbox.
    Report(FailoverReport),
}

/// The outcome of a receive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Received {
    pub sizes: Vec<u64>,
}

/// The pair's state; the fields the properties read are public.
pub struct Pair {
    groups: Vec<Group>,
    layout: Vec<Vec<(u64, u64)>>,
    send_memory: Vec<u8>,
    recv_memory: Vec<u8>,
    shadow: Vec<u8>,
    records: Vec<u8>,
    sender: SendSlots,
    fifo: Vec<CtsEntry>,
    /// Sends not yet matched: (group, buffer).
    sends: VecDeque<(usize, usize)>,
    /// Per request index, its group; per group, its first request index.
    owners: Vec<usize>,
    first_request: Vec<usize>,
    requests_done: Vec<bool>,
    receiver: RecvSlots,
    next_receive: usize,
    srq_posted: [u32; 2],
    /// Each rail's shared receive queue's ledger, and what the receiver last settled there.
    ledgers: [SharedSrqLedger; 2],
    settled: [u32; 2],
    rails: [VecDeque<WorkRequest>; 2],
    /// Per rail, whether the sender's writes (data), the receiver's (CTS), and the sender's
    /// completions (the acknowledgements of its writes) are dropped.
    data_cut: [bool; 2],
    cts_cut: [bool; 2],
    ack_cut: [bool; 2],
    /// The receiver's writes to the sender in order, each with the rail it rides.
    cts: VecDeque<(Rail, ToSender)>,
    /// The rail the receiver's CTS writes ride (SUP for vanilla intra-island, else SOUT).
    cts_rail: Rail,
    /// Every CTS entry the receiver wrote, by FIFO index (its shadow, rewritten on failover).
    cts_shadow: Vec<CtsEntry>,
    /// Failover on: each side detects a failed rail (and the pair finds a cut that stalls it).
    failover: bool,
    notice_shadow: [u8; FAILOVER_NOTICE_LEN],
    notice_mailbox: [u8; FAILOVER_NOTICE_LEN],
    /// The failover report last written into the sender's memory, and the epochs taken.
    report_mailbox: Option<FailoverReport>,
    notice_taken: u32,
    /// Both rails failed: the connection ends (the properties expect nothing more).
    pub no_survivor: bool,
    /// Transfers sent again whole after a failover, and reports the sender took.
    pub replays: usize,
    pub reports: usize,
    /// Rails that came back, and the transfers posted on each rail so far.
    pub restores: usize,
    pub posted_on: [usize; 2],
    /// Signalled writes that landed at the receiver and never completed at the sender.
    pub lost_acks: usize,
    send_cq: VecDeque<(Rail, usize)>,
    recv_cq: VecDeque<(Rail, u32)>,
    now: u64,
    received_count: usize,
    done_count: usize,
    /// Per group, the receive's result once complete (a second completion is an error).
    pub received: Vec<Option<Received>>,
    /// Per group, whether every send of it was reported done.
    pub sent: Vec<bool>,
    /// The first protocol error either side reported.
    pub error: Option<String>,
}

impl Pair {
    /// A pair set up for `groups`, with SRQs of `srq_high` receives (low-water half of it);
    /// `send_order` permutes each group's sends (NCCL issues them in any order).
    pub fn new(groups: Vec<Group>, srq_high: u32, send_order: &[usize]) -> Pair {
        let mut layout = Vec::new();
        let mut end = 0u64;
        for group in &groups {
            let mut offsets = Vec::new();
            for buffer in &group.buffers {
                offsets.push((end, buffer.capacity.max(buffer.send)));
                end += buffer.capacity.max(buffer.send) + 128;
            }
            layout.push(offsets);
        }
        let send_memory = (0..end).map(|i| (i % 251 + 1) as u8).collect();
        // Each group's sends in a rotated, possibly reversed, tag order.
        let mut sends = VecDeque::new();
        let mut owners = Vec::new();
        let mut first_request = Vec::new();
        for (g, group) in groups.iter().enumerate() {
            let n = group.buffers.len();
            let turn = send_order.get(g).copied().unwrap_or(0);
            let mut order: Vec<usize> = (0..n).map(|k| (k + turn) % n).collect();
            if turn % 2 == 1 {
                order.reverse();
            }
            sends.extend(order.into_iter().map(|r| (g, r)));
            first_request.push(owners.len());
            owners.extend(std::iter::repeat(g).take(n));
        }
        let credits = SrqCredits::new(srq_high / 2, srq_high);
        Pair {
            received: vec![None; groups.len()],
            sent: vec![false; groups.len()],
            requests_done: vec![false; sends.len()],
            groups,
            layout,
            send_memory,
            recv_memory: vec![0; end as usize],
            shadow: vec![0; FIFO_SLOTS * COMPLETION_RECORD_SIZE],
            records: vec![0; FIFO_SLOTS * COMPLETION_RECORD_SIZE],
            sender: SendSlots::new(),
            fifo: vec![CtsEntry::EMPTY; FIFO_SLOTS * MAX_RECVS],
            sends,
            owners,
            first_request,
            receiver: RecvSlots::new([Some(credits); 2]),
            next_receive: 0,
            srq_posted: [0; 2],
            ledgers: [ledger(srq_high); 2],
            settled: [0; 2],
            rails: [VecDeque::new(), VecDeque::new()],
            data_cut: [false; 2],
            cts_cut: [false; 2],
            ack_cut: [false; 2],
            cts: VecDeque::new(),
            cts_rail: Rail::ScaleOut,
            cts_shadow: vec![CtsEntry::EMPTY; FIFO_SLOTS * MAX_RECVS],
            failover: false,
            notice_shadow: [0; FAILOVER_NOTICE_LEN],
            notice_mailbox: [0; FAILOVER_NOTICE_LEN],
            report_mailbox: None,
            notice_taken: 0,
            no_survivor: false,
            replays: 0,
            reports: 0,
            restores: 0,
            posted_on: [0; 2],
            lost_acks: 0,
            send_cq: VecDeque::new(),
            recv_cq: VecDeque::new(),
            now: 1,
            received_count: 0,
            done_count: 0,
            error: None,
        }
    }

    /// With failover on, and the receiver's CTS writes on `cts_rail`.
    pub fn with_failover(mut self, cts_rail: Rail) -> Pair {
        self.failover = true;
        self.cts_rail = cts_rail;
        self
    }

    /// Runs one event; a protocol error stops the pair (recorded in `error`).
    pub fn step(&mut self, event: Event) {
        if self.error.is_some() || self.no_survivor {
            return;
        }
        self.now += 1;
        let result = match event {
            Event::Receiver => self.receiver_step(),
            Event::Sender => self.sender_step(),
            Event::Deliver(rail) => {
                self.deliver(rail);
                Ok(())
            }
            Event::Cts => {
                self.land_cts();
                Ok(())
            }
            Event::Cut(rail) => {
                self.cut_data(rail);
                self.cut_cts(rail);
                Ok(())
            }
            Event::CutData(rail) => {
                self.cut_data(rail);
                Ok(())
            }
            Event::CutCts(rail) => {
                self.cut_cts(rail);
                Ok(())
            }
            Event::CutAcks(rail) => {
                self.cut_acks(rail);
                Ok(())
            }
            Event::Detect(side, rail) => self.detect(side, rail),
            Event::Restore(rail) => self.restore(rail),
        };
        if let Err(error) = result {
            self.error = Some(error);
        }
    }

    /// Runs every kind of event in turn until nothing changes (or `limit` rounds). With
    /// failover on, a cut that stalls the pair is found by the side whose writes it drops, as
    /// their error completions would tell it.
    pub fn drain(&mut self, limit: usize) {
        for _ in 0..limit {
            let before = self.progress();
            self.round();
            if self.progress() == before && self.cts.is_empty() && !self.find_a_cut() {
                return;
            }
        }
    }

    /// Every kind of event once: each side's step, a CTS landing, each rail's next delivery.
    pub fn round(&mut self) {
        for event in [
            Event::Receiver,
            Event::Cts,
            Event::Sender,
            Event::Deliver(Rail::ScaleOut),
            Event::Deliver(Rail::ScaleUp),
        ] {
            self.step(event);
        }
    }

    /// What the pair has done so far, to see it stop.
    fn progress(&self) -> (usize, usize, usize, usize, usize, usize) {
        (
            self.received_count,
            self.sends.len(),
            self.next_receive,
            self.rails[0].len() + self.rails[1].len(),
            self.send_cq.len() + self.recv_cq.len(),
            self.done_count,
        )
    }

    /// Work requests on `rail`'s wire, not yet executed.
    pub fn on_the_wire(&self, rail: Rail) -> usize {
        self.rails[rail.index()].len()
    }

    /// Receiver slots still outstanding.
    pub fn outstanding(&self) -> u32 {
        self.receiver.outstanding()
    }

    /// The bytes group `g`'s buffer `r` received, and those its send sent.
    pub fn bytes(&self, g: usize, r: usize, length: u64) -> (&[u8], &[u8]) {
        let (offset, _) = self.layout[g][r];
        let range = offset as usize..(offset + length) as usize;
        (&self.recv_memory[range.clone()], &self.send_memory[range])
    }

    fn receiver_step(&mut self) -> Result<(), String> {
        self.poll_receiver_cq()?;
        self.read_notice()?;
        self.refill(self.receiver.imms_in_flight());
        self.send_report();
        if self.next_receive < self.groups.len() && self.receiver.can_post().is_ok() {
            let in_flight = self.receiver.imms_in_flight() + 1;
            self.refill(in_flight);
            if self.receiver.covers(in_flight) {
                self.post_receive()?;
            }
        }
        Ok(())
    }

    /// Takes every IMM the receiver's completion queue holds.
    fn poll_receiver_cq(&mut self) -> Result<(), String> {
        while let Some((rail, wire)) = self.recv_cq.pop_front() {
            let imm = Imm::from_wire(wire);
            let outcome = self
                .receiver
                .on_imm(rail, imm, RailMask::BOTH)
                .map_err(|e| e.to_string())?;
            if let ImmOutcome::Complete(done) = outcome {
                self.finish_receive(done.slot, done.request, done.imm_size)?;
            }
        }
        Ok(())
    }

    /// As the engine does: settles what the receiver's IMMs consumed, gives back an idle
    /// holding, and takes what `in_flight` receives need from the rail's shared queue, whose
    /// posts land on the wire's queue before any CTS that relies on them.
    fn refill(&mut self, in_flight: u32) {
        for rail in Rail::ALL {
            let i = rail.index();
            let held = |receiver: &RecvSlots| receiver.srq(rail).map_or(0, SrqCredits::held);
            let ledger = &mut self.ledgers[i];
            ledger.settle(self.settled[i], held(&self.receiver));
            let excess = self.receiver.excess(rail, in_flight);
            ledger.give_back(held(&self.receiver), excess);
            self.receiver.on_given_back(rail, excess);
            let want = self.receiver.wanted(rail, in_flight);
            let granted = ledger.take(held(&self.receiver), want);
            self.srq_posted[i] += granted.post;
            ledger.on_posted(granted.post);
            self.receiver.on_granted(rail, granted.receives);
            self.settled[i] = held(&self.receiver);
        }
    }

    fn post_receive(&mut self) -> Result<(), String> {
        let g = self.next_receive;
        let buffers: Vec<RecvBuffer> = (self.groups[g].buffers.iter().enumerate())
            .map(|(r, buffer)| RecvBuffer {
                addr: RECV_BASE + self.layout[g][r].0,
                size: buffer.capacity,
                rkeys: RKEYS,
                tag: r as u32,
            })
            .collect();
        let slot = slot_of(self.receiver.fifo_head());
        for (r, buffer) in buffers.iter().enumerate() {
            let entry = self.receiver.cts_entry(buffers.len(), buffer);
            self.cts_shadow[slot * MAX_RECVS + r] = entry;
            self.write_to_sender(ToSender::Cts(slot * MAX_RECVS + r, entry));
        }
        let posted = self.receiver.posted(g as u16, buffers.len() as u8);
        posted.map_err(|e| e.to_string())?;
        self.next_receive += 1;
        Ok(())
    }

    fn finish_receive(&mut self, slot: usize, g: u16, imm_size: Option<u64>) -> Result<(), String> {
        let g = usize::from(g);
        let group = &self.groups[g];
        let sizes = match (group.buffers.len(), imm_size) {
            (1, Some(bytes)) => vec![bytes.min(group.buffers[0].capacity)],
            _ => {
                let at = slot * COMPLETION_RECORD_SIZE;
                let bytes = self.records[at..at + COMPLETION_RECORD_SIZE].try_into();
                let record = CompletionRecord::from_le_bytes(bytes.map_err(|_| "record")?);
                (group.buffers.iter().enumerate())
                    .map(|(r, b)| u64::from(record.sizes[r]).min(b.capacity))
                    .collect()
            }
        };
        if self.received[g].replace(Received { sizes }).is_some() {
            return Err(format!("group {g} completed twice"));
        }
        self.received_count += 1;
        Ok(())
    }

    fn sender_step(&mut self) -> Result<(), String> {
        self.read_report()?;
        self.post_ready()?;
        if let Some(&(g, r)) = self.sends.front() {
            if self.head_matching()? {
                let buffer = self.groups[g].buffers[r];
                if let Some(matched) = self.sender.match_send(r as u32, buffer.send) {
                    let request = self.request_index(g, r);
                    let local = SendBuffer {
                        request,
                        addr: SEND_BASE + self.layout[g][r].0,
                        lkeys: LKEYS,
                        size: matched.size,
                    };
                    self.sender
                        .take(matched, local)
                        .map_err(|e| e.to_string())?;
                    self.sends.pop_front();
                    self.post_ready()?;
                }
            }
        }
        self.poll_sender_cq()
    }

    /// Takes every completion the sender's completion queue holds.
    fn poll_sender_cq(&mut self) -> Result<(), String> {
        while let Some((rail, slot)) = self.send_cq.pop_front() {
            let progress = self.sender.complete(slot, rail, self.now);
            if progress.map_err(|e| e.to_string())? == SendProgress::SlotDone {
                self.send_done(slot)?;
            }
        }
        Ok(())
    }

    /// `slot`'s sends are done.
    fn send_done(&mut self, slot: usize) -> Result<(), String> {
        let state = *self.sender.slot(slot);
        for buffer in state.buffers() {
            let request = usize::from(buffer.request);
            if std::mem::replace(&mut self.requests_done[request], true) {
                return Err(format!("request {request} reported done twice"));
            }
            self.done_count += 1;
            let g = self.owners[request];
            let n = self.groups[g].buffers.len();
            let first = self.first_request[g];
            self.sent[g] = self.requests_done[first..first + n].iter().all(|d| *d);
        }
        Ok(())
    }

    fn request_index(&self, g: usize, r: usize) -> u16 {
        (self.first_request[g] + r) as u16
    }

    fn head_matching(&mut self) -> Result<bool, String> {
        match self.sender.head() {
            Head::Matching => Ok(true),
            Head::Busy => Ok(false),
            Head::NeedsCts { seq } => {
                let base = slot_of(seq) * MAX_RECVS;
                let fifo = &self.fifo;
                let loaded = self.sender.load_cts(|r| fifo[base + r], RailMask::BOTH);
                loaded.map_err(|e| e.to_string())
            }
        }
    }

    fn post_ready(&mut self) -> Result<(), String> {
        self.post_replays()?;
        while let Some(slot) = self.sender.next_to_post() {
            let state = *self.sender.slot(slot);
            let g = self.owners[usize::from(state.buffers()[0].request)];
            let shares = vec![self.groups[g].share; state.buffers().len()];
            let target = record_target(slot);
            let plan = match self.survivor() {
                // A rail failed: everything on the other.
                Some(rail) => post_plan::plan_on(slot as u8, &state, rail, target, false),
                None => post_plan::plan(slot as u8, &state, &shares, target),
            };
            self.post_plan(slot, plan);
            self.sender
                .posted(slot, plan.mask, self.now)
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

/// Where `slot`'s completion record goes, from the sender's shadow.
fn record_target(slot: usize) -> RecordTarget {
    RecordTarget {
        local_addr: SHADOW_BASE + CompletionRecord::offset(slot),
        lkeys: LKEYS,
        remote_addr: RECORDS_BASE + CompletionRecord::offset(slot),
        rkeys: RKEYS,
        length: COMPLETION_RECORD_SIZE as u32,
    }
}

/// A rail's shared queue as the engine sizes it for one connection holding up to `high`.
fn ledger(high: u32) -> SharedSrqLedger {
    let mut ledger = SharedSrqLedger::new(4 * high, SHARED_SRQ_FLOOR.min(high));
    ledger.join().expect("an empty ledger admits a member");
    ledger
}
