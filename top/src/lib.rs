//! mpib-top: a live terminal view of every MPIB rail, connection and agent decision on a node.
//!
//! It maps the plugin's probes files read-only with the collector's checks
//! (`mpib_node::trust`), reads the agent's hint file and control socket and the NICs'
//! sysfs counters, and shows rates over each interval: on a live screen (ratatui), as text frames
//! (`-b`, like `top -b`), or as JSON documents (`--once --json`). It never writes or deletes a
//! file. Modules: [`config`] (flags), [`scan`] (which files), [`sample`] and [`describe`] (the
//! rates), [`nic`], [`agent`], [`frame`] (what is shown), [`view`] (sort and filter),
//! [`screen`] (the drawing), [`run`] (the loops).

#![forbid(unsafe_code)]

pub mod agent;
pub mod config;
pub mod describe;
pub mod format;
pub mod frame;
pub mod nic;
pub mod run;
pub mod sample;
pub mod scan;
pub mod screen;
pub mod view;
