//! A slow transfer's rails and extent, as the collector's traces and `mpib-top` draw them.

use mpib_probes::{SlowTransfer, MAX_RAILS};

/// Rails whose bit is set in the mask and that have a post time.
pub fn active_rails(t: &SlowTransfer) -> Vec<usize> {
    (0..MAX_RAILS)
        .filter(|&r| t.rail_mask & (1 << r) != 0 && t.post_ns[r] != 0)
        .collect()
}

/// From the first post to the last completion over the [`active_rails`]; `None` when no rail
/// has a post time.
pub fn extent(t: &SlowTransfer) -> Option<(u64, u64)> {
    let rails = active_rails(t);
    let start = rails.iter().map(|&r| t.post_ns[r]).min()?;
    let end = rails.iter().map(|&r| t.done_ns[r]).max().unwrap_or(start);
    Some((start, end.max(start)))
}
