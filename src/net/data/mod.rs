//! The data path, driven by NCCL's progress thread: `send` and `recv` drive the protocol core's
//! slot state machines (`mpib_proto::send_slots`, `recv_slots`) against the fabric, `flush` the
//! optional read-back, `request` the handles NCCL holds, `memory` the registrations, `dma` the
//! regions the NIC writes into.

pub(crate) mod blocks;
pub(crate) mod dma;
pub(crate) mod flush;
pub(crate) mod memory;
pub(crate) mod recv;
pub(crate) mod registrations;
pub(crate) mod request;
pub(crate) mod send;
