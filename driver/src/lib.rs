//! `mpib-driver`: drives the built MPIB plugin (`libnccl-net-mpib.so`) from the outside, exactly
//! through the exported `ncclNetPlugin_v7` … `_v12` tables, the way NCCL's proxy does.
//!
//! It deliberately does not depend on the `mpib` crate: [`abi`] is an independent `#[repr(C)]`
//! view of the ABI written from the fact sheet, so a layout slip on either side shows up.
//!
//! * [`plugin`]: find the built library, `dlopen(RTLD_NOW | RTLD_LOCAL)`, `dlsym` the tables.
//! * [`net`]: [`Net`], one version-neutral driver over the six tables.
//! * [`proxy`]: [`Pair`], a connected rank pair and a bounded, NCCL-like data loop over a
//!   [`Plan`].
//! * [`agent`]: a test agent for advanced mode (hint SHM + registration socket).
//! * [`cases`]: the conformance case list the loopback and the verbs rig both run.
//! * [`xfer`]: one side of a pair (receiver or sender), for cross-process runs (`mpib-xfer`) and
//!   their in-process twin on the loopback.
//! * [`rails`]: which rail carried the bytes, from the plugin's probes file.
//! * [`child`]: run one test in a fresh process (per-process plugin state, real unload).
//! * [`env`]: environment changes serialised with every `init`.
//! * [`testing`]: helpers shared by the integration tests.
//! * [`other_user`]: a second local user for the trust tests.
//! * [`harness`]: the cross-process cases over every topology (`mpib-harness`).

// The driver stands in for NCCL in tests and benchmarks. Its `expect`s state its own
// invariants (a pair connected before its comms are used, a region reserved before its buffers
// are handed out), whose breach should stop the run loudly; the plugin it drives has none.
#![allow(clippy::expect_used)]

pub mod abi;
pub mod agent;
pub mod batch;
pub mod cases;
pub mod child;
pub mod env;
pub mod error;
pub mod harness;
pub mod net;
pub mod other_user;
pub mod pattern;
pub mod plan;
pub mod plugin;
pub mod proxy;
pub mod rails;
pub mod ranks;
pub mod testing;
pub mod units;
pub mod xfer;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

pub use agent::Agent;
pub use error::{Error, Result};
pub use net::{CallTime, Net, NetCtx, Props};
pub use plan::Plan;
pub use plugin::{locate_built_plugin, running_plugin_threads, Plugin, Version};
pub use proxy::{Deadlines, Pair, PairOptions, Report};

/// The split rule MPIB applies per `isend` (docs/PROTOCOL.md §4): bytes on (SOUT, SUP) for a
/// message of `size` bytes at `sup_bw` parts per 1024. SUP carries the first
/// `(size * sup_bw) >> 10` bytes, rounded down to a multiple of 128; `0` means none, `>= 1024`
/// means all.
pub fn expected_split(size: usize, sup_bw: u32) -> (usize, usize) {
    let sup = match sup_bw {
        0 => 0,
        bw if bw >= 1024 => size,
        bw => ((((size as u128) * u128::from(bw)) >> 10) as usize) & !127,
    };
    (size - sup, sup)
}

/// Creates a fresh private directory under the system temp dir.
pub fn temp_dir(prefix: &str) -> Result<PathBuf> {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    for _ in 0..1000 {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("{prefix}-{}-{n}", std::process::id()));
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(Error::Io(format!("create {}: {e}", dir.display()))),
        }
    }
    Err(Error::Io(format!(
        "no free temp directory name for {prefix}"
    )))
}

/// Loads the plugin built for the current profile (see [`locate_built_plugin`]) under its NCCL
/// name.
pub fn load_built_plugin() -> Result<Plugin> {
    Plugin::load(locate_built_plugin(&plugin::current_profile())?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_rule_matches_the_seed_examples() {
        let mib = 1 << 20;
        assert_eq!(expected_split(mib, 0), (mib, 0));
        assert_eq!(expected_split(mib, 256), (786_432, 262_144));
        assert_eq!(expected_split(mib, 512), (524_288, 524_288));
        assert_eq!(expected_split(mib, 768), (262_144, 786_432));
        assert_eq!(expected_split(mib, 1024), (0, mib));
        assert_eq!(expected_split(mib, 5000), (0, mib));
        assert_eq!(expected_split(127, 1023), (127, 0));
        assert_eq!(expected_split(4097, 512), (2049, 2048));
        assert_eq!(expected_split(1000, 300), (1000 - 256, 256));
        assert_eq!(expected_split(0, 512), (0, 0));
    }
}
