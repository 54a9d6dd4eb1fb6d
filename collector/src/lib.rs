//! MPIB collector: the sidecar that exports the plugin's probes files.
//!
//! The plugin (one writer per process) keeps per-rail counters, a connection table and an
//! event ring of slow transfers in a shared-memory file under `MPIB_PROBES_DIR` (layout:
//! `docs/PROBES_LAYOUT.md`, crate `mpib-probes`). This crate maps each file read-only and
//! exports:
//! - Prometheus text at `/metrics` ([`prometheus`]) and OTLP metrics ([`otlp_metrics`]), both
//!   rendered from one model of the series ([`export`]): the families of [`catalog::CATALOG`]
//!   and the values the files declare, listed with units and meanings in
//!   `docs/OBSERVABILITY.md`;
//! - OTLP traces: one span per slow transfer with a child span per rail ([`traces`]);
//! - the rail NICs' own sysfs counters ([`sysfs`]).
//!
//! The heavy dependencies (tokio, hyper, tonic, opentelemetry) live here only, never in the
//! plugin. Nothing here is `unsafe`: the probes crate owns the mapping.
//!
//! Modules: [`config`] (flags and environment), [`collector`] (the scan and the file life
//! cycle), [`process`] (one writer's series), [`export`] (the metric model and series
//! lifetimes), [`points`] (its data), [`prometheus`] (its text), [`latency`] (the histogram's
//! bounds), [`hint`] (the agent's hint file), [`files`], [`trust`] (which files are
//! exported), [`server`], [`app`].

#![forbid(unsafe_code)]

pub mod app;
pub mod catalog;
pub mod collector;
pub mod config;
mod connections;
pub mod export;
pub mod latency;
pub mod otlp_metrics;
pub mod points;
pub mod process;
pub mod prometheus;
pub mod server;
pub mod traces;

pub use mpib_node::{files, hint, sysfs, trust};
