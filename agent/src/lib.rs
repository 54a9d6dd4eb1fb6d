//! `mpib-agent`: the policy agent of MPIB's advanced mode.
//!
//! It owns the hint file the plugins read on every transfer, serves the registrations of the
//! reference agent interface (`include/mpib_agent.h`) on a Unix socket, and, once per interval,
//! reads the plugins' probes files and sets each flow's SUP share by its policy. See
//! `docs/AGENT.md` for the operator's view.

pub mod access;
pub mod catalog;
pub mod clients;
pub mod config;
pub mod control;
pub mod daemon;
pub mod http;
pub mod log;
pub mod measure;
pub mod metrics;
pub mod policy;
pub mod server;
pub mod shm;
pub mod slots;
pub mod state;
pub mod status;
pub mod wake;
