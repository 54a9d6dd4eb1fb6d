//! The columns of `mpib-agent`'s `flows` reply (agent/src/status.rs writes it, `mpib-top` reads
//! it): declared here once, for both.

macro_rules! first_flows_columns {
    () => {
        "flow\tsout_pair\tpolicy\tsup_bw\tmeasured_sup_bw\tsout_bytes_per_second\tsup_bytes_per_second\tthroughput_bytes_per_second\tconnections\trecovered"
    };
}

/// The first columns of the agent's `flows` reply: what a reader requires (a later agent adds columns after
/// them, as this one added `measured_connections`).
pub const FLOWS_HEADER_FIRST: &str = first_flows_columns!();

/// The header line of the agent's `flows` reply: the columns, in order.
pub const FLOWS_HEADER: &str = concat!(
    first_flows_columns!(),
    "\tmeasured_connections\tfailed_over_rails"
);
