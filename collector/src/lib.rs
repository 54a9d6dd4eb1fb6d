//! MPIB collector: the sidecar that exports the plugin's probes files.
//!
//! The plugin (one writer per process) keeps per-rail counters, a connection table and an
//! event ring of slow transfers in a shared-memory file under `MPIB_PROBES_DIR` (layout:
//! `docs/PROBES_LAYOUT.md`, crate `mpib-probes`). This crate maps each file read-only and
//! exports:
//! - Prometheus text at `/metrics` (a `metrics-exporter-prometheus` recorder, plus the latency
//!   histogram it renders itself): the families of [`catalog::CATALOG`], listed with units and
//!   meanings in `docs/OBSERVABILITY.md`;
//! - OTLP traces: one span per slow transfer with a child span per rail ([`traces`]);
//! - the rail NICs' own sysfs counters ([`sysfs`]).
//!
//! The heavy dependencies (tokio, hyper, tonic, opentelemetry) live here only, never in the
//! plugin. Nothing here is `unsafe`: the probes crate owns the mapping.
//!
//! Modules: [`config`] (flags and environment), [`collector`] (the scan and the file life
//! cycle), [`process`] (one writer's series), [`export`] (the recorder), [`latency`] (the
//! histogram text), [`hint`] (the agent's hint file), [`files`], [`trust`] (which files are
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
pub mod server;
pub mod traces;

pub use mpib_node::{files, hint, sysfs, trust};
