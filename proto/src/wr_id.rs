//! Packing of the 64-bit `wr_id` of MPIB work requests.
//!
//! Why pack: a send completion carries nothing but its `wr_id`, and the engine must route it
//! without a lookup table: which kind of WR (data, CTS, flush, receive), which rail and QP (to
//! return send-queue credits), which slot (to finish the request) and the QP's post counter
//! after the WR (so one signaled completion retires every earlier WR, see `credits`). Receives
//! on the shared receive queue are generic (docs/PROTOCOL.md §8), so they all share one `wr_id`
//! per rail and everything else comes from `imm_data`.
//!
//! ```text
//!  63..56 kind   55..48 rail   47..40 qp_index   39..32 slot   31..0 post_index
//! ```

use std::fmt;

use crate::rail::Rail;

/// What a work request was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum WrKind {
    /// Payload RDMA_WRITE / signalling RDMA_WRITE_WITH_IMM of a send.
    Data = 1,
    /// A CTS write into the sender's FIFO.
    Cts = 2,
    /// A flush (GPU visibility) read.
    Flush = 3,
    /// A generic shared-receive-queue receive.
    Receive = 4,
    /// A failover message's write: the sender's notice or the receiver's report
    /// (docs/PROTOCOL.md §10).
    Failover = 5,
}

impl WrKind {
    /// The kind with wire code `code`.
    #[inline]
    pub const fn from_code(code: u8) -> Option<WrKind> {
        match code {
            1 => Some(WrKind::Data),
            2 => Some(WrKind::Cts),
            3 => Some(WrKind::Flush),
            4 => Some(WrKind::Receive),
            5 => Some(WrKind::Failover),
            _ => None,
        }
    }
}

/// Decoded `wr_id`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WrId {
    /// What the work request was.
    pub kind: WrKind,
    /// Rail of the QP (or SRQ) it was posted on.
    pub rail: Rail,
    /// Index of the QP in the connection's QP array.
    pub qp_index: u8,
    /// FIFO slot of the request.
    pub slot: u8,
    /// The QP's wrapping post counter after this WR (see `credits`).
    pub post_index: u32,
}

/// A `wr_id` that MPIB never produced (unknown kind or rail byte).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WrIdError {
    /// The value received.
    pub raw: u64,
}

impl fmt::Display for WrIdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "wr_id {:#018x} is not an MPIB work request (kind byte {}, rail byte {})",
            self.raw,
            self.raw >> KIND_SHIFT,
            (self.raw >> RAIL_SHIFT) & 0xFF
        )
    }
}

impl std::error::Error for WrIdError {}

const KIND_SHIFT: u32 = 56;
const RAIL_SHIFT: u32 = 48;
const QP_SHIFT: u32 = 40;
const SLOT_SHIFT: u32 = 32;

impl WrId {
    /// The 64-bit value to put in the work request.
    #[inline]
    pub const fn pack(self) -> u64 {
        ((self.kind as u64) << KIND_SHIFT)
            | ((self.rail.index() as u64) << RAIL_SHIFT)
            | ((self.qp_index as u64) << QP_SHIFT)
            | ((self.slot as u64) << SLOT_SHIFT)
            | self.post_index as u64
    }

    /// Decode a completion's `wr_id`; unknown kind or rail bytes are an error.
    #[inline]
    pub fn unpack(raw: u64) -> Result<WrId, WrIdError> {
        let kind = WrKind::from_code((raw >> KIND_SHIFT) as u8).ok_or(WrIdError { raw })?;
        let rail =
            Rail::from_index(((raw >> RAIL_SHIFT) & 0xFF) as usize).ok_or(WrIdError { raw })?;
        Ok(WrId {
            kind,
            rail,
            qp_index: (raw >> QP_SHIFT) as u8,
            slot: (raw >> SLOT_SHIFT) as u8,
            post_index: raw as u32,
        })
    }
}

/// `wr_id` of every generic SRQ receive on `rail` (kind Receive, other fields 0).
#[inline]
pub const fn receive_wr_id(rail: Rail) -> u64 {
    WrId {
        kind: WrKind::Receive,
        rail,
        qp_index: 0,
        slot: 0,
        post_index: 0,
    }
    .pack()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn layout() {
        let id = WrId {
            kind: WrKind::Cts,
            rail: Rail::ScaleUp,
            qp_index: 0x12,
            slot: 0x34,
            post_index: 0x5678_9ABC,
        };
        assert_eq!(id.pack(), 0x0201_1234_5678_9ABC);
        assert_eq!(receive_wr_id(Rail::ScaleOut), 0x0400_0000_0000_0000);
        assert_eq!(receive_wr_id(Rail::ScaleUp), 0x0401_0000_0000_0000);
        let receive = WrId::unpack(receive_wr_id(Rail::ScaleUp)).unwrap();
        assert_eq!(
            (receive.kind, receive.rail),
            (WrKind::Receive, Rail::ScaleUp)
        );
    }

    #[test]
    fn foreign_values_rejected() {
        for raw in [0u64, 0x0600_0000_0000_0000, 0x0102_0000_0000_0000, u64::MAX] {
            assert_eq!(WrId::unpack(raw), Err(WrIdError { raw }));
        }
        let text = WrIdError {
            raw: 0x0902_0000_0000_0000,
        }
        .to_string();
        assert!(text.contains("kind byte 9") && text.contains("rail byte 2"));
    }

    fn any_kind() -> impl Strategy<Value = WrKind> {
        prop_oneof![
            Just(WrKind::Data),
            Just(WrKind::Cts),
            Just(WrKind::Flush),
            Just(WrKind::Receive),
            Just(WrKind::Failover)
        ]
    }

    proptest! {
        #[test]
        fn roundtrip(
            kind in any_kind(),
            rail in prop_oneof![Just(Rail::ScaleOut), Just(Rail::ScaleUp)],
            qp_index in any::<u8>(),
            slot in any::<u8>(),
            post_index in any::<u32>(),
        ) {
            let id = WrId { kind, rail, qp_index, slot, post_index };
            prop_assert_eq!(WrId::unpack(id.pack()), Ok(id));
        }

        #[test]
        fn unpack_accepts_only_known_bytes(raw in any::<u64>()) {
            let kind_ok = (1..=4).contains(&(raw >> 56));
            let rail_ok = (raw >> 48) & 0xFF <= 1;
            match WrId::unpack(raw) {
                Ok(id) => {
                    prop_assert!(kind_ok && rail_ok);
                    prop_assert_eq!(id.pack(), raw);
                }
                Err(error) => {
                    prop_assert!(!(kind_ok && rail_ok));
                    prop_assert_eq!(error.raw, raw);
                }
            }
        }
    }
}
