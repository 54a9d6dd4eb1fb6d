//! Watching a running plugin without slowing it: the probes file (`telemetry`,
//! `probes_access`), NCCL's profiler (`profiler`), device async events (`health`), the peer's
//! control connection (`peer`, shared per pair of processes: `link`), and the housekeeping thread that does the upkeep needing system
//! calls (`housekeeper`).

pub(crate) mod attributes;
pub(crate) mod health;
pub(crate) mod housekeeper;
pub(crate) mod link;
pub(crate) mod peer;
pub(crate) mod probes_access;
pub(crate) mod profiler;
pub(crate) mod telemetry;
