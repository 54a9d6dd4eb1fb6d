//! The single policy function: how much of a transfer goes on SUP (docs/PROTOCOL.md §4).
//!
//! Why one function: every split decision flows through [`sup_bandwidth`], so the difference
//! between vanilla and advanced mode lives in exactly one place. Vanilla never touches the hint
//! SHM: path isolation alone decides (intra-island all SUP, inter-island all SOUT). Advanced mode
//! reads the agent's parts-per-1024 hint freshly on every `isend` (docs/PROTOCOL.md §4, 'Why the
//! sender decides');
//! the reader is passed as a closure so this stays pure and the SHM read happens only when needed.

use crate::mode::Mode;

use super::island::PathClass;

/// SUP share in parts per 1024 for one send (`0` all SOUT, `>= 1024` all SUP).
///
/// Vanilla: `IntraIsland => u32::MAX`, `InterIsland => 0`, and `hint` is never called.
/// Advanced: whatever `hint()` returns (the caller returns 0 when no hint is available, which
/// degrades safely to all SOUT: docs/AGENT.md, 'What it does').
#[inline]
pub fn sup_bandwidth(mode: Mode, class: PathClass, hint: impl FnOnce() -> u32) -> u32 {
    match mode {
        Mode::Vanilla => match class {
            PathClass::IntraIsland => u32::MAX,
            PathClass::InterIsland => 0,
        },
        Mode::Advanced => hint(),
    }
}

/// The BDP threshold (`MPIB_BDP_BYTES`; docs/ARCHITECTURE.md, 'Advanced mode and the agent'): in
/// advanced mode, an inter-island transfer of at most `bdp_bytes` bytes stays on SOUT whatever
/// the hint says (`bdp_bytes == 0` disables it). Why: a message that fits in the path's
/// bandwidth-delay product gains nothing from a second rail and pays the relay's extra latency.
#[inline]
pub fn within_bdp(mode: Mode, class: PathClass, size: u64, bdp_bytes: u64) -> bool {
    bdp_bytes > 0 && mode == Mode::Advanced && class == PathClass::InterIsland && size <= bdp_bytes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rail_mask::RailMask;
    use crate::split::RailSplit;

    #[test]
    fn vanilla_follows_island_and_never_reads_hint() {
        let never = || -> u32 { panic!("vanilla must not read the hint") };
        assert_eq!(
            sup_bandwidth(Mode::Vanilla, PathClass::IntraIsland, never),
            u32::MAX
        );
        assert_eq!(
            sup_bandwidth(Mode::Vanilla, PathClass::InterIsland, never),
            0
        );
    }

    #[test]
    fn advanced_returns_hint_for_both_classes() {
        for class in [PathClass::IntraIsland, PathClass::InterIsland] {
            assert_eq!(sup_bandwidth(Mode::Advanced, class, || 300), 300);
            assert_eq!(sup_bandwidth(Mode::Advanced, class, || 0), 0);
        }
    }

    #[test]
    fn bdp_threshold_keeps_small_inter_island_transfers_on_sout() {
        let inter = PathClass::InterIsland;
        assert!(within_bdp(Mode::Advanced, inter, 65536, 65536));
        assert!(!within_bdp(Mode::Advanced, inter, 65537, 65536));
        assert!(!within_bdp(
            Mode::Advanced,
            PathClass::IntraIsland,
            1,
            65536
        ));
        assert!(!within_bdp(Mode::Vanilla, inter, 1, 65536));
        // 0 disables it, even for an empty transfer.
        assert!(!within_bdp(Mode::Advanced, inter, 1, 0));
        assert!(!within_bdp(Mode::Advanced, inter, 0, 0));
        assert!(within_bdp(Mode::Advanced, inter, 0, 1));
    }

    #[test]
    fn vanilla_values_drive_split_to_one_rail() {
        let intra = sup_bandwidth(Mode::Vanilla, PathClass::IntraIsland, || 0);
        let inter = sup_bandwidth(Mode::Vanilla, PathClass::InterIsland, || 0);
        assert_eq!(RailSplit::new(intra, 4096).mask(), RailMask::SCALE_UP);
        assert_eq!(RailSplit::new(inter, 4096).mask(), RailMask::SCALE_OUT);
    }
}
