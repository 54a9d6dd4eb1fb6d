//! The shape of a send-queue work request, as the core builds it and a fabric posts it.
//!
//! Verbs-shaped (one SGE, RDMA_WRITE with or without an immediate, RDMA_READ) and plain `Copy`
//! values, so building a chain needs no allocation and no fabric.

/// A local scatter/gather element.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sge {
    /// Local virtual address.
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Local key of the memory region containing the range.
    pub lkey: u32,
}

/// Operation of a send-queue work request. Only the two MPIB needs exist.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendOpcode {
    /// RDMA_WRITE: place bytes, no receiver completion.
    Write,
    /// RDMA_WRITE_WITH_IMM: place bytes, then consume one receive and complete it with `imm`.
    /// `imm` is stored exactly as the wire carries it (network byte order), as in verbs.
    WriteWithImm {
        /// Immediate data, already in network byte order.
        imm: u32,
    },
    /// RDMA_READ: copy the remote range into the local SGE (the 1-byte flush read).
    Read,
}

/// One send-queue work request (one element of a chain).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkRequest {
    /// Caller's identifier, returned in the completion (see `proto::wr_id`).
    pub wr_id: u64,
    /// RDMA_WRITE or RDMA_WRITE_WITH_IMM.
    pub opcode: SendOpcode,
    /// Local data; `None` for a zero-byte write.
    pub sge: Option<Sge>,
    /// Remote virtual address written to.
    pub remote_addr: u64,
    /// Remote key of the target memory region.
    pub rkey: u32,
    /// Whether a completion is generated on the sender's CQ.
    pub signaled: bool,
    /// Whether the payload is copied at post time (small control writes).
    pub inline: bool,
}

impl WorkRequest {
    /// Number of payload bytes this WR moves.
    #[inline]
    pub fn length(&self) -> u32 {
        self.sge.map_or(0, |s| s.length)
    }
}
