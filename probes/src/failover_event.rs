//! A failover as an event record (kind [`EventKind::FAILOVER`]): one connection end's failover
//! of a rail, with when it found the rail failed, when the receiver's report settled what rode
//! it, and when it went on with nothing of it left (docs/PROTOCOL.md §10). It travels in the
//! event ring's record like a slow transfer, its words meaning what `docs/PROBES_LAYOUT.md`
//! lists for kind 3, so that the ring, its writer and its readers stay one.

use std::net::SocketAddrV4;

use crate::operation::Operation;
use crate::types::{Direction, EventKind, SlowTransfer};

/// One connection end's failover of a rail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FailoverEvent {
    /// The end: send or receive.
    pub direction: Direction,
    /// The rail that failed (an index into `RAIL_NAMES`).
    pub rail: usize,
    /// Connection table index, or [`crate::NO_CONNECTION`].
    pub conn_index: u32,
    /// When this end found the rail failed (an error completion, a port event, the peer's
    /// word), ns since the Unix epoch.
    pub detected_ns: u64,
    /// When the receiver's report went out (the receiving end) or was taken (the sending end).
    pub reported_ns: u64,
    /// When this end went on with nothing of the failover left: every replay it asked for
    /// done (the sending end), the report out (the receiving end).
    pub resumed_ns: u64,
    /// Transfers sent again on the survivor (the sending end; 0 on the other).
    pub replayed_transfers: u64,
    /// Their bytes.
    pub replayed_bytes: u64,
    /// The failover's number on this end (1 for the first).
    pub epoch: u32,
    /// Peer address.
    pub peer: SocketAddrV4,
    /// The fused device the connection uses.
    pub device: u8,
}

impl FailoverEvent {
    /// The event as the ring's record.
    pub fn record(&self) -> SlowTransfer {
        let rail = self.rail.min(1);
        SlowTransfer {
            kind: EventKind::FAILOVER,
            direction: self.direction,
            rail_mask: 1 << rail,
            conn_index: self.conn_index,
            size: self.replayed_bytes,
            post_ns: [self.detected_ns, self.reported_ns],
            done_ns: [self.resumed_ns, 0],
            rail_bytes: [self.replayed_transfers, 0],
            sup_bw: 0,
            slot: self.epoch,
            qp_num: [0, 0],
            peer: self.peer,
            device: self.device,
            operation: Operation::default(),
        }
    }

    /// The failover a record of kind [`EventKind::FAILOVER`] holds; `None` for other kinds.
    pub fn of(record: &SlowTransfer) -> Option<FailoverEvent> {
        if record.kind != EventKind::FAILOVER {
            return None;
        }
        Some(FailoverEvent {
            direction: record.direction,
            rail: if record.rail_mask & 2 != 0 { 1 } else { 0 },
            conn_index: record.conn_index,
            detected_ns: record.post_ns[0],
            reported_ns: record.post_ns[1],
            resumed_ns: record.done_ns[0],
            replayed_transfers: record.rail_bytes[0],
            replayed_bytes: record.size,
            epoch: record.slot,
            peer: record.peer,
            device: record.device,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn a_failover_round_trips_through_the_record_words_and_other_kinds_are_not_one() {
        let event = FailoverEvent {
            direction: Direction::Send,
            rail: 1,
            conn_index: 4,
            detected_ns: 1_000,
            reported_ns: 2_000,
            resumed_ns: 3_000,
            replayed_transfers: 5,
            replayed_bytes: 6 << 20,
            epoch: 2,
            peer: SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 2), 5000),
            device: 1,
        };
        let record = event.record();
        assert_eq!(record.rail_mask, 2);
        assert_eq!(SlowTransfer::decode(&record.encode()), record);
        assert_eq!(FailoverEvent::of(&record), Some(event));
        let slow = SlowTransfer {
            kind: EventKind::SLOW,
            ..record
        };
        assert_eq!(FailoverEvent::of(&slow), None);
    }
}
