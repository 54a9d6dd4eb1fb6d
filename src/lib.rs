//! MPIB: a multi-rail NCCL net plugin that fuses a scale-out NIC (SOUT) and a scale-up NIC (SUP)
//! into one NCCL device, one device per such pair of a node ([`pairing`]).
//!
//! Layers, from the C ABI down (see `docs/ARCHITECTURE.md`):
//! * [`ffi`]: the exported `ncclNetPlugin_v7` ... `_v12` tables, thin per-version adapters, the
//!   panic/NULL boundary.
//! * [`net`]: the one internal implementation (comms, handshake, data path engine).
//! * [`proto`]: the sans-IO protocol core (CTS FIFO, imm codec, split, SRQ credits, completion
//!   masks, wr_id packing, signalling policy). No `unsafe`, no I/O.
//! * [`fabric`]: the verbs-shaped seam and its backends (in-process loopback; real verbs).

#![deny(unsafe_op_in_unsafe_fn)]

#[macro_use]
pub mod log;
pub mod error;
pub mod fabric;
pub mod ffi;
mod native_thread;
pub mod net;
mod netif;
pub use mpib_params::{pairing, params};
mod random;
/// The sans-IO protocol core, its own crate (`proto/`) so that tools depend on it alone.
pub use mpib_proto as proto;
mod trust;
