//! The C ABI: the exported `ncclNetPlugin_v7` ... `ncclNetPlugin_v12` tables.
//!
//! Layers, outermost first:
//! * [`tables`]: the six `#[no_mangle]` statics, the only dynamic symbols of the library;
//! * `adapters`: the `extern "C"` functions they point at, one-liners per ABI signature;
//! * `boundary`: the fence every body runs in (panics and errors become `ncclResult_t`, NULL
//!   pointers `ncclInvalidArgument`, outputs are written only on success and never read);
//! * `common`: one implementation of each entry point for all versions, calling [`crate::net`];
//! * `handle`: the only conversions between `void*` and Rust objects.
//!
//! [`types`] mirrors every C struct, with compile-time layout checks against the fact sheet
//! (`docs/NCCL_NET_ABI.md`).

mod adapters;
mod boundary;
mod common;
mod handle;
pub mod tables;
#[cfg(test)]
mod tests;
pub mod types;

pub use tables::{
    ncclNetPlugin_v10, ncclNetPlugin_v11, ncclNetPlugin_v12, ncclNetPlugin_v7, ncclNetPlugin_v8,
    ncclNetPlugin_v9,
};
