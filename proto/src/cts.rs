//! The CTS FIFO entry and the per-slot completion record (NCCL's `ncclIbSendFifo` and
//! `ncclIbRequestCompletionRecord`, adapted to two rails; docs/NCCL_NET_ABI.md §3.2–3.3,
//! docs/PROTOCOL.md §3 and §6).
//!
//! Why this layout: the receiver tells the sender where to write with one RDMA_WRITE of
//! `nreqs × 64` bytes into the sender's FIFO `[256][8]`. Each entry is 64 bytes so it never tears
//! under PCIe relaxed ordering, and `idx = fifo_head + 1` doubles as the "slot is filled" flag
//! the sender polls (a value never seen in that slot on the previous lap). An entry holds one
//! rkey per rail because the sender writes the head of the buffer on SUP and the tail on SOUT,
//! each with its own NIC's key.
//!
//! The structs are `#[repr(C)]` with their offsets asserted at compile time, because the bytes
//! are written by a remote NIC, not by Rust. The explicit little-endian byte codecs let the
//! engine read and write those bytes without any transmute.

use std::fmt;

use crate::rail::Rail;

use super::rail_mask::RailMask;

/// Slots in the CTS FIFO (also the number of requests in flight per connection).
pub const FIFO_SLOTS: usize = 256;
/// Receives grouped in one multi-receive (entries per slot).
pub const MAX_RECVS: usize = 8;
/// Bytes of one FIFO entry.
pub const CTS_ENTRY_SIZE: usize = 64;
/// Bytes of one completion record.
pub const COMPLETION_RECORD_SIZE: usize = 48;

/// One receive buffer advertised to the sender.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtsEntry {
    /// Remote (receiver) virtual address of the buffer.
    pub addr: u64,
    /// Posted size of the buffer; the send is clamped to it.
    pub size: u64,
    /// Remote key of the buffer's registration on each rail, by rail index.
    pub rkeys: [u32; 2],
    /// Number of receives in this multi-receive (same in every entry of the slot).
    pub nreqs: u32,
    /// NCCL tag used to match a send to one of the grouped receives.
    pub tag: u32,
    /// `fifo_head + 1` when the entry is valid for that `fifo_head`.
    pub idx: u64,
    /// Pads the entry to 64 bytes; its first 4 bytes carry the receiver's failovers so far
    /// ([`CtsEntry::failover_epoch`], docs/PROTOCOL.md §10), the rest are 0.
    pub padding: [u8; 24],
}

impl CtsEntry {
    /// The receiver's failovers when it wrote the entry: a sender that has taken fewer reports
    /// reads its mailbox before it loads the entry (crate::send_slots).
    #[inline]
    pub fn failover_epoch(&self) -> u32 {
        u32::from_le_bytes([
            self.padding[0],
            self.padding[1],
            self.padding[2],
            self.padding[3],
        ])
    }

    /// The entry, saying the receiver's failovers so far.
    #[inline]
    pub fn with_failover_epoch(mut self, epoch: u32) -> CtsEntry {
        self.padding[..4].copy_from_slice(&epoch.to_le_bytes());
        self
    }

    /// An entry nothing was written to (a fresh FIFO, or an unused element of an array).
    pub const EMPTY: CtsEntry = CtsEntry {
        addr: 0,
        size: 0,
        rkeys: [0; 2],
        nreqs: 0,
        tag: 0,
        idx: 0,
        padding: [0; 24],
    };
}

const _: () = {
    assert!(core::mem::size_of::<CtsEntry>() == CTS_ENTRY_SIZE);
    assert!(core::mem::align_of::<CtsEntry>() == 8);
    assert!(core::mem::offset_of!(CtsEntry, addr) == 0);
    assert!(core::mem::offset_of!(CtsEntry, size) == 8);
    assert!(core::mem::offset_of!(CtsEntry, rkeys) == 16);
    assert!(core::mem::offset_of!(CtsEntry, nreqs) == 24);
    assert!(core::mem::offset_of!(CtsEntry, tag) == 28);
    assert!(core::mem::offset_of!(CtsEntry, idx) == 32);
    assert!(core::mem::offset_of!(CtsEntry, padding) == 40);
};

/// FIFO slot of the request at `fifo_head`.
#[inline]
pub const fn slot_of(fifo_head: u64) -> usize {
    (fifo_head % FIFO_SLOTS as u64) as usize
}

/// The `idx` value that marks the slot of `fifo_head` as filled (docs/PROTOCOL.md §3).
#[inline]
pub const fn ready_idx(fifo_head: u64) -> u64 {
    fifo_head.wrapping_add(1)
}

/// Byte offset of entry `entry` of slot `slot` within the FIFO `[256][8]`.
#[inline]
pub const fn fifo_offset(slot: usize, entry: usize) -> u64 {
    ((slot * MAX_RECVS + entry) * CTS_ENTRY_SIZE) as u64
}

/// Bytes of the whole FIFO.
pub const FIFO_BYTES: usize = FIFO_SLOTS * MAX_RECVS * CTS_ENTRY_SIZE;

/// A received entry the sender must not act on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CtsError {
    /// Non-empty buffer advertised at address 0.
    ZeroAddress {
        /// FIFO slot.
        slot: usize,
        /// Entry within the slot.
        entry: usize,
    },
    /// Non-empty buffer with no key on a rail the connection uses.
    ZeroRkey {
        /// FIFO slot.
        slot: usize,
        /// Entry within the slot.
        entry: usize,
        /// Rail whose key is 0.
        rail: Rail,
    },
    /// `nreqs` outside `1..=8`.
    BadCount {
        /// FIFO slot.
        slot: usize,
        /// The count received.
        nreqs: u32,
    },
}

impl fmt::Display for CtsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CtsError::ZeroAddress { slot, entry } => write!(
                f,
                "peer posted incorrect receive info: CTS slot {slot} entry {entry} has address 0"
            ),
            CtsError::ZeroRkey { slot, entry, rail } => write!(
                f,
                "peer posted incorrect receive info: CTS slot {slot} entry {entry} has rkey 0 \
                 on rail {rail}"
            ),
            CtsError::BadCount { slot, nreqs } => write!(
                f,
                "peer posted incorrect receive info: CTS slot {slot} has nreqs {nreqs} \
                 (expected 1..={MAX_RECVS})"
            ),
        }
    }
}

impl std::error::Error for CtsError {}

impl CtsEntry {
    /// Validate a received entry (NCCL's "posted incorrect receive info" checks): `nreqs` in
    /// `1..=8`; unless `size == 0`, `addr != 0` and an rkey for every rail in `rails`.
    #[inline]
    pub fn validate(&self, slot: usize, entry: usize, rails: RailMask) -> Result<(), CtsError> {
        if self.nreqs == 0 || self.nreqs as usize > MAX_RECVS {
            return Err(CtsError::BadCount {
                slot,
                nreqs: self.nreqs,
            });
        }
        if self.size == 0 {
            return Ok(());
        }
        if self.addr == 0 {
            return Err(CtsError::ZeroAddress { slot, entry });
        }
        match rails.rails().find(|rail| self.rkeys[rail.index()] == 0) {
            Some(rail) => Err(CtsError::ZeroRkey { slot, entry, rail }),
            None => Ok(()),
        }
    }

    /// Whether this entry is the one posted for `fifo_head` (its ready flag is set).
    #[inline]
    pub const fn is_ready(&self, fifo_head: u64) -> bool {
        self.idx == ready_idx(fifo_head)
    }

    /// The entry's 64 bytes, little-endian, in `#[repr(C)]` layout.
    #[inline]
    pub fn to_le_bytes(&self) -> [u8; CTS_ENTRY_SIZE] {
        let mut bytes = [0u8; CTS_ENTRY_SIZE];
        bytes[0..8].copy_from_slice(&self.addr.to_le_bytes());
        bytes[8..16].copy_from_slice(&self.size.to_le_bytes());
        bytes[16..20].copy_from_slice(&self.rkeys[0].to_le_bytes());
        bytes[20..24].copy_from_slice(&self.rkeys[1].to_le_bytes());
        bytes[24..28].copy_from_slice(&self.nreqs.to_le_bytes());
        bytes[28..32].copy_from_slice(&self.tag.to_le_bytes());
        bytes[32..40].copy_from_slice(&self.idx.to_le_bytes());
        bytes[40..64].copy_from_slice(&self.padding);
        bytes
    }

    /// The entry held in 64 little-endian bytes.
    #[inline]
    pub fn from_le_bytes(bytes: &[u8; CTS_ENTRY_SIZE]) -> CtsEntry {
        let u32_at = |at: usize| {
            u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        let u64_at = |at: usize| (u32_at(at) as u64) | ((u32_at(at + 4) as u64) << 32);
        let mut padding = [0u8; 24];
        padding.copy_from_slice(&bytes[40..64]);
        CtsEntry {
            addr: u64_at(0),
            size: u64_at(8),
            rkeys: [u32_at(16), u32_at(20)],
            nreqs: u32_at(24),
            tag: u32_at(28),
            idx: u64_at(32),
            padding,
        }
    }
}

/// What the sender keeps of a CTS entry once it is loaded and checked: where the receive is, how
/// large, its keys and its tag (the count and the ready flag served the load). Half an entry's
/// 64 bytes: a send comm keeps a copy for each of its 256 slots' 8 entries, 64 KiB rather than
/// 128 (docs/PERFORMANCE.md, "Thousands of connections").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Advertised {
    /// Remote (receiver) virtual address of the buffer.
    pub addr: u64,
    /// Posted size of the buffer; the send is clamped to it.
    pub size: u64,
    /// Remote key of the buffer's registration on each rail, by rail index.
    pub rkeys: [u32; 2],
    /// NCCL tag the send is matched by.
    pub tag: u32,
}

impl Advertised {
    /// An unused element of an array.
    pub const EMPTY: Advertised = Advertised {
        addr: 0,
        size: 0,
        rkeys: [0; 2],
        tag: 0,
    };
}

const _: () = assert!(core::mem::size_of::<Advertised>() == 32);

impl From<&CtsEntry> for Advertised {
    #[inline]
    fn from(entry: &CtsEntry) -> Advertised {
        Advertised {
            addr: entry.addr,
            size: entry.size,
            rkeys: entry.rkeys,
            tag: entry.tag,
        }
    }
}

/// Tag matching within a multi-receive (NCCL): the first entry whose tag equals `tag` and whose
/// bit in `taken` is clear. Only the first `MAX_RECVS` entries are considered.
#[inline]
pub fn match_tag(entries: &[Advertised], taken: u8, tag: u32) -> Option<usize> {
    entries
        .iter()
        .take(MAX_RECVS)
        .enumerate()
        .position(|(index, entry)| entry.tag == tag && taken & (1 << index) == 0)
}

/// Per-slot completion record written by the sender's leader rail with the signalling
/// WRITE_WITH_IMM: exact size of each grouped buffer (docs/PROTOCOL.md §6), plus the
/// bytes each rail carried, so the receiver's per-rail byte counters are exact even though plain
/// RDMA_WRITEs raise no receive completion.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CompletionRecord {
    /// Bytes sent into each receive of the slot, by entry index.
    pub sizes: [u32; MAX_RECVS],
    /// Bytes the slot moved on each rail (SOUT, SUP).
    pub rail_bytes: [u64; 2],
}

const _: () = {
    assert!(core::mem::size_of::<CompletionRecord>() == COMPLETION_RECORD_SIZE);
    assert!(core::mem::align_of::<CompletionRecord>() == 8);
    assert!(core::mem::offset_of!(CompletionRecord, rail_bytes) == 32);
};

impl CompletionRecord {
    /// Byte offset of slot `slot`'s record within the records array `[256]`.
    #[inline]
    pub const fn offset(slot: usize) -> u64 {
        (slot * COMPLETION_RECORD_SIZE) as u64
    }

    /// The record's 48 bytes, little-endian.
    #[inline]
    pub fn to_le_bytes(&self) -> [u8; COMPLETION_RECORD_SIZE] {
        let mut bytes = [0u8; COMPLETION_RECORD_SIZE];
        for (chunk, size) in bytes[..32].chunks_exact_mut(4).zip(self.sizes) {
            chunk.copy_from_slice(&size.to_le_bytes());
        }
        for (chunk, count) in bytes[32..].chunks_exact_mut(8).zip(self.rail_bytes) {
            chunk.copy_from_slice(&count.to_le_bytes());
        }
        bytes
    }

    /// The record held in 48 little-endian bytes.
    #[inline]
    pub fn from_le_bytes(bytes: &[u8; COMPLETION_RECORD_SIZE]) -> CompletionRecord {
        let mut record = CompletionRecord::default();
        for (size, chunk) in record.sizes.iter_mut().zip(bytes[..32].chunks_exact(4)) {
            *size = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        }
        for (count, chunk) in record
            .rail_bytes
            .iter_mut()
            .zip(bytes[32..].chunks_exact(8))
        {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            *count = u64::from_le_bytes(word);
        }
        record
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn entry(tag: u32) -> CtsEntry {
        CtsEntry {
            addr: 0x1000,
            size: 4096,
            rkeys: [7, 9],
            nreqs: 1,
            tag,
            idx: 1,
            padding: [0; 24],
        }
    }

    #[test]
    fn slot_and_ready_flag() {
        assert_eq!(slot_of(0), 0);
        assert_eq!(slot_of(257), 1);
        assert_eq!(ready_idx(0), 1);
        assert_eq!(ready_idx(u64::MAX), 0);
        assert!(entry(0).is_ready(0));
        assert!(!entry(0).is_ready(256));
        assert_eq!(fifo_offset(1, 2), (8 + 2) * 64);
        assert_eq!(fifo_offset(255, 7) as usize + CTS_ENTRY_SIZE, FIFO_BYTES);
        assert_eq!(CompletionRecord::offset(3), 144);
    }

    #[test]
    fn validate_rules() {
        let good = entry(0);
        assert_eq!(good.validate(3, 0, RailMask::BOTH), Ok(()));
        let bad_count = CtsEntry { nreqs: 9, ..good };
        assert_eq!(
            bad_count.validate(3, 0, RailMask::BOTH),
            Err(CtsError::BadCount { slot: 3, nreqs: 9 })
        );
        let zero_count = CtsEntry {
            nreqs: 0,
            size: 0,
            ..good
        };
        assert!(matches!(
            zero_count.validate(3, 0, RailMask::BOTH),
            Err(CtsError::BadCount { .. })
        ));
        let no_addr = CtsEntry { addr: 0, ..good };
        assert_eq!(
            no_addr.validate(3, 1, RailMask::BOTH),
            Err(CtsError::ZeroAddress { slot: 3, entry: 1 })
        );
        let no_sup_key = CtsEntry {
            rkeys: [7, 0],
            ..good
        };
        assert_eq!(
            no_sup_key.validate(3, 1, RailMask::BOTH),
            Err(CtsError::ZeroRkey {
                slot: 3,
                entry: 1,
                rail: Rail::ScaleUp
            })
        );
        // Rails the connection does not use need no key.
        assert_eq!(no_sup_key.validate(3, 1, RailMask::SCALE_OUT), Ok(()));
        // An empty buffer needs neither address nor keys.
        let empty = CtsEntry {
            addr: 0,
            size: 0,
            rkeys: [0, 0],
            ..good
        };
        assert_eq!(empty.validate(3, 1, RailMask::BOTH), Ok(()));
    }

    #[test]
    fn error_text_names_place() {
        let text = CtsError::ZeroRkey {
            slot: 5,
            entry: 2,
            rail: Rail::ScaleUp,
        }
        .to_string();
        assert!(text.contains("slot 5") && text.contains("entry 2") && text.contains("sup"));
        assert!(CtsError::BadCount { slot: 1, nreqs: 0 }
            .to_string()
            .contains("nreqs 0"));
        assert!(CtsError::ZeroAddress { slot: 1, entry: 0 }
            .to_string()
            .contains("address 0"));
    }

    #[test]
    fn tag_matching_takes_first_free() {
        let entries = [entry(5), entry(6), entry(5)].map(|e| Advertised::from(&e));
        assert_eq!(match_tag(&entries, 0, 5), Some(0));
        assert_eq!(match_tag(&entries, 0b001, 5), Some(2));
        assert_eq!(match_tag(&entries, 0b101, 5), None);
        assert_eq!(match_tag(&entries, 0, 6), Some(1));
        assert_eq!(match_tag(&entries, 0, 7), None);
        assert_eq!(match_tag(&[], 0, 5), None);
        let many = [Advertised::from(&entry(1)); 10];
        assert_eq!(match_tag(&many, 0xFF, 1), None);
    }

    #[test]
    fn byte_layout_matches_repr_c() {
        let value = CtsEntry {
            addr: 0x0102_0304_0506_0708,
            size: 0x1112_1314_1516_1718,
            rkeys: [0x2122_2324, 0x2526_2728],
            nreqs: 0x3132_3334,
            tag: 0x3536_3738,
            idx: 0x4142_4344_4546_4748,
            padding: [0xAA; 24],
        };
        let bytes = value.to_le_bytes();
        assert_eq!(bytes[0], 0x08);
        assert_eq!(bytes[16..20], [0x24, 0x23, 0x22, 0x21]);
        assert_eq!(bytes[32], 0x48);
        assert_eq!(CtsEntry::from_le_bytes(&bytes), value);
    }

    proptest! {
        #[test]
        fn entry_bytes_roundtrip(
            addr in any::<u64>(), size in any::<u64>(), rkeys in any::<[u32; 2]>(),
            nreqs in any::<u32>(), tag in any::<u32>(), idx in any::<u64>(),
        ) {
            let value = CtsEntry { addr, size, rkeys, nreqs, tag, idx, padding: [0; 24] };
            prop_assert_eq!(CtsEntry::from_le_bytes(&value.to_le_bytes()), value);
        }

        #[test]
        fn record_bytes_roundtrip(sizes in any::<[u32; 8]>(), rail_bytes in any::<[u64; 2]>()) {
            let record = CompletionRecord { sizes, rail_bytes };
            prop_assert_eq!(CompletionRecord::from_le_bytes(&record.to_le_bytes()), record);
        }

        #[test]
        fn match_tag_result_is_free_and_first(
            tags in proptest::collection::vec(0u32..3, 0..10), taken in any::<u8>(), tag in 0u32..3,
        ) {
            let entries: Vec<Advertised> = tags.iter().map(|t| Advertised::from(&entry(*t))).collect();
            let found = match_tag(&entries, taken, tag);
            let expected = (0..entries.len().min(MAX_RECVS))
                .find(|i| entries[*i].tag == tag && taken & (1 << i) == 0);
            prop_assert_eq!(found, expected);
        }
    }
}
