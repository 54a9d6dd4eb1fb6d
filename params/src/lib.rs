//! `mpib-params`: what the plugin reads from its environment and how it pairs NICs, for every
//! program that must read them the same way (the plugin, `mpib-agent`, `mpib-top`) without the
//! plugin's RDMA dependencies (no rdma-sys here: `cargo tree -p mpib-agent` shows none).
//!
//! * [`params`]: every `MPIB_*` variable, declared once, parsed into [`params::Settings`].
//! * [`pairing`]: which NICs fuse into which NCCL device.
//! * [`users`]: users and groups named in settings.
//! * [`FabricKind`]: the backend `MPIB_FABRIC` names.

mod kind;
pub mod pairing;
pub mod params;
pub mod users;

pub use kind::FabricKind;
