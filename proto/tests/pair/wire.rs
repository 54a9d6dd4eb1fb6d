//! The wire between the pair's two sides: each rail one queue pair, in order on itself, and
//! the ways a rail is cut. A cut may drop the sender's writes, the receiver's writes, or only
//! the acknowledgements of the sender's writes: on RC those ride back to the sender, so a write
//! whose acknowledgement is lost has landed at the receiver (bytes and IMM), and the sender's
//! work request only ever completes in error (`RETRY_EXC_ERR`, then flushed). That is the case
//! the failover's rule is for (docs/PROTOCOL.md §10): the sender cannot tell a lost write from a
//! lost acknowledgement, so only the receiver's report says what to replay.

use mpib_proto::cts::COMPLETION_RECORD_SIZE;
use mpib_proto::post_plan;
use mpib_proto::rail::Rail;
use mpib_proto::work::SendOpcode;

use super::{
    Pair, LKEYS, NOTICE_MAILBOX_BASE, NOTICE_SHADOW_BASE, RECORDS_BASE, RECV_BASE, RKEYS,
    SEND_BASE, SHADOW_BASE,
};

impl Pair {
    /// The sender's writes on `rail` are dropped from now on, with what is on the wire.
    pub(super) fn cut_data(&mut self, rail: Rail) {
        self.data_cut[rail.index()] = true;
        self.rails[rail.index()].clear();
    }

    /// The receiver's writes on `rail` are dropped from now on.
    pub(super) fn cut_cts(&mut self, rail: Rail) {
        self.cts_cut[rail.index()] = true;
        self.cts.retain(|(on, _)| *on != rail);
    }

    /// The acknowledgements of the sender's writes on `rail` are dropped from now on: what is
    /// on the wire there, and what is posted there until the sender finds the rail failed,
    /// still lands at the receiver, and completes nothing at the sender.
    pub(super) fn cut_acks(&mut self, rail: Rail) {
        self.ack_cut[rail.index()] = true;
    }

    /// Stores the plan's record and puts its chains on the wire.
    pub(super) fn post_plan(&mut self, slot: usize, mut plan: post_plan::PostPlan) {
        if let Some(record) = plan.record {
            let at = slot * COMPLETION_RECORD_SIZE;
            self.shadow[at..at + COMPLETION_RECORD_SIZE].copy_from_slice(&record.to_le_bytes());
        }
        for rail in plan.mask.rails() {
            self.posted_on[rail.index()] += 1;
            let chain = plan.chain_mut(rail);
            let last = chain.len() - 1;
            chain[last].wr_id = slot as u64;
            if !self.data_cut[rail.index()] {
                self.rails[rail.index()].extend(chain.iter().copied());
            }
        }
    }

    /// Executes the head of `rail`'s queue: its bytes land, then its IMM (if it has a receive)
    /// and its send completion, unless the rail lost its acknowledgements.
    pub(super) fn deliver(&mut self, rail: Rail) {
        let i = rail.index();
        let Some(wr) = self.rails[i].front().copied() else {
            return;
        };
        let imm = match wr.opcode {
            SendOpcode::WriteWithImm { imm } => Some(imm),
            SendOpcode::Write | SendOpcode::Read => None,
        };
        if imm.is_some() && self.srq_posted[i] == 0 {
            return; // RNR: retried when a receive is posted
        }
        self.rails[i].pop_front();
        assert!(wr.rkey == RKEYS[i], "{rail} write with another rail's rkey");
        if let Some(sge) = wr.sge {
            assert!(
                sge.lkey == LKEYS[i],
                "{rail} write with another rail's lkey"
            );
            let bytes = self.local(sge.addr, sge.length as usize).to_vec();
            self.remote(wr.remote_addr, bytes.len())
                .copy_from_slice(&bytes);
        }
        if let Some(imm) = imm {
            self.srq_posted[i] -= 1;
            self.recv_cq.push_back((rail, imm));
        }
        if wr.signaled && self.ack_cut[i] {
            // Landed, and the receiver may take its IMM, but the sender never hears of it: it
            // learns what arrived from the receiver's report alone.
            self.lost_acks += 1;
        } else if wr.signaled {
            self.send_cq.push_back((rail, wr.wr_id as usize));
        }
    }

    fn local(&self, addr: u64, length: usize) -> &[u8] {
        let (memory, base): (&[u8], u64) = if addr >= NOTICE_SHADOW_BASE {
            (&self.notice_shadow, NOTICE_SHADOW_BASE)
        } else if addr >= SHADOW_BASE {
            (&self.shadow, SHADOW_BASE)
        } else {
            (&self.send_memory, SEND_BASE)
        };
        &memory[(addr - base) as usize..][..length]
    }

    fn remote(&mut self, addr: u64, length: usize) -> &mut [u8] {
        let (memory, base): (&mut [u8], u64) = if addr >= NOTICE_MAILBOX_BASE {
            (&mut self.notice_mailbox, NOTICE_MAILBOX_BASE)
        } else if addr >= RECORDS_BASE {
            (&mut self.records, RECORDS_BASE)
        } else {
            (&mut self.recv_memory, RECV_BASE)
        };
        &mut memory[(addr - base) as usize..][..length]
    }
}
