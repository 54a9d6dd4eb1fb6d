//! The policy mode a connection runs in (`MPIB_MODE`, parsed by the plugin's settings).

/// Vanilla or advanced policy mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Topology-driven: intra-island all SUP, inter-island all SOUT.
    Vanilla,
    /// Agent-driven: the hint SHM decides the split.
    Advanced,
}
