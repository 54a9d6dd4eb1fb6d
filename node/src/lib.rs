//! `mpib-node`: what MPIB's node-side tools read, and the rules they read it by, written once
//! for `mpib-collector`, `mpib-agent` and `mpib-top`:
//!
//! * [`files`]: the probes directory's files and whose process wrote them (alive or not).
//! * [`trust`]: who may have written a file the tools map, and the checks before mapping it.
//! * [`hint`]: the agent's hint table, read without mapping it (layout in `mpib_proto::hint`).
//! * [`sysfs`]: NIC port counters under one sysfs root.
//! * [`transfers`]: a slow transfer's rails and extent.
//! * [`agent_status`]: the columns of the agent's `flows` reply.
//! * [`exposition`]: the Prometheus text format both endpoints (collector, agent) write.

pub mod agent_status;
pub mod exposition;
pub mod files;
pub mod hint;
pub mod sysfs;
pub mod transfers;
pub mod trust;
