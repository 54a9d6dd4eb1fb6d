//! Per-rail QP pools and which QP carries what (docs/PROTOCOL.md §2).
//!
//! Why this layout:
//! * The QP array is contiguous by rail, `[SOUT_0 .. SOUT_{n-1}, SUP_0 .. SUP_{m-1}]`, so the
//!   rail of a QP is a comparison and the two pools can have different sizes
//!   (`MPIB_SOUT_QP`, `MPIB_SUP_QP`).
//! * Vanilla inter-island connections create no SUP QPs at all (path isolation): the SUP fabric
//!   does not reach the peer. Both ends derive this from the same address pair, so the counts
//!   agree without negotiation (docs/PROTOCOL.md §1–2).
//! * A request never stripes across QPs of one rail; it uses one QP per rail, picked
//!   round-robin by `fifo_head`, which spreads consecutive requests evenly over each pool
//!   (docs/PROTOCOL.md §2).
//! * CTS is pinned to a single QP so the periodic signalling rule drains exactly that QP's send
//!   queue (see `signal`).

use crate::mode::Mode;
use crate::rail::Rail;

use super::island::PathClass;
use super::rail_mask::RailMask;

/// QP counts of one connection, per rail, after path-isolation suppression.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpLayout {
    scale_out: u8,
    scale_up: u8,
}

impl QpLayout {
    /// Layout for the configured counts; vanilla + inter-island suppresses every SUP QP.
    #[inline]
    pub fn new(sout_qps: u8, sup_qps: u8, mode: Mode, class: PathClass) -> QpLayout {
        let suppressed = mode == Mode::Vanilla && class == PathClass::InterIsland;
        QpLayout {
            scale_out: sout_qps,
            scale_up: if suppressed { 0 } else { sup_qps },
        }
    }

    /// Number of QPs on `rail`.
    #[inline]
    pub const fn count(self, rail: Rail) -> usize {
        match rail {
            Rail::ScaleOut => self.scale_out as usize,
            Rail::ScaleUp => self.scale_up as usize,
        }
    }

    /// Number of QPs on both rails (length of the QP array).
    #[inline]
    pub const fn total(self) -> usize {
        self.scale_out as usize + self.scale_up as usize
    }

    /// Index in the QP array of `rail`'s first QP.
    #[inline]
    pub const fn first(self, rail: Rail) -> usize {
        match rail {
            Rail::ScaleOut => 0,
            Rail::ScaleUp => self.scale_out as usize,
        }
    }

    /// Rails that have at least one QP.
    #[inline]
    pub const fn rails(self) -> RailMask {
        let mut mask = RailMask::NONE;
        if self.scale_out != 0 {
            mask = mask.with(Rail::ScaleOut);
        }
        if self.scale_up != 0 {
            mask = mask.with(Rail::ScaleUp);
        }
        mask
    }

    /// Rail of the QP at `qp_index`, `None` past the end of the array.
    #[inline]
    pub fn rail_of(self, qp_index: usize) -> Option<Rail> {
        if qp_index < self.count(Rail::ScaleOut) {
            Some(Rail::ScaleOut)
        } else if qp_index < self.total() {
            Some(Rail::ScaleUp)
        } else {
            None
        }
    }

    /// The QP of `rail` that carries the request at `fifo_head`: SOUT `fifo_head % n`, SUP
    /// `n + fifo_head % m`; `None` if the rail has no QPs. Sender and receiver both index by the
    /// same `fifo_head`, so a request's writes and its CTS bookkeeping agree on the QP.
    #[inline]
    pub fn qp_for_request(self, fifo_head: u64, rail: Rail) -> Option<usize> {
        let count = self.count(rail) as u64;
        if count == 0 {
            return None;
        }
        Some(self.first(rail) + (fifo_head % count) as usize)
    }

    /// The one QP that carries every CTS write: vanilla intra-island uses the first SUP QP
    /// (strict path isolation keeps even control traffic on SUP); everything else uses QP 0
    /// (SOUT), which is always routable. If vanilla intra-island somehow has no SUP QP, QP 0 is
    /// returned rather than an index past the array.
    #[inline]
    pub fn cts_qp(self, mode: Mode, class: PathClass) -> usize {
        if mode == Mode::Vanilla && class == PathClass::IntraIsland && self.scale_up != 0 {
            self.first(Rail::ScaleUp)
        } else {
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn layout(sout: u8, sup: u8) -> QpLayout {
        QpLayout::new(sout, sup, Mode::Advanced, PathClass::IntraIsland)
    }

    #[test]
    fn round_robin_table() {
        // docs/PROTOCOL.md §2 worked by hand for SOUT_QP=2, SUP_QP=3.
        let qps = layout(2, 3);
        let table = [
            (0, 0, 2),
            (1, 1, 3),
            (2, 0, 4),
            (3, 1, 2),
            (4, 0, 3),
            (5, 1, 4),
        ];
        for (fifo_head, sout, sup) in table {
            assert_eq!(qps.qp_for_request(fifo_head, Rail::ScaleOut), Some(sout));
            assert_eq!(qps.qp_for_request(fifo_head, Rail::ScaleUp), Some(sup));
        }
        let rails: Vec<_> = (0..6).map(|index| qps.rail_of(index)).collect();
        let (out, up) = (Some(Rail::ScaleOut), Some(Rail::ScaleUp));
        assert_eq!(rails, vec![out, out, up, up, up, None]);
    }

    #[test]
    fn vanilla_inter_island_suppresses_scale_up() {
        let qps = QpLayout::new(2, 4, Mode::Vanilla, PathClass::InterIsland);
        assert_eq!((qps.count(Rail::ScaleUp), qps.total()), (0, 2));
        assert_eq!(qps.rails(), RailMask::SCALE_OUT);
        assert_eq!(qps.qp_for_request(7, Rail::ScaleUp), None);
        assert_eq!(qps.rail_of(2), None);
        for (mode, class) in [
            (Mode::Vanilla, PathClass::IntraIsland),
            (Mode::Advanced, PathClass::InterIsland),
            (Mode::Advanced, PathClass::IntraIsland),
        ] {
            let qps = QpLayout::new(2, 4, mode, class);
            assert_eq!((qps.total(), qps.rails()), (6, RailMask::BOTH));
        }
    }

    #[test]
    fn cts_qp_by_policy() {
        let (sout, sup) = (3, 2);
        let pick = |mode, class| QpLayout::new(sout, sup, mode, class).cts_qp(mode, class);
        assert_eq!(pick(Mode::Vanilla, PathClass::IntraIsland), 3);
        assert_eq!(pick(Mode::Vanilla, PathClass::InterIsland), 0);
        assert_eq!(pick(Mode::Advanced, PathClass::IntraIsland), 0);
        assert_eq!(pick(Mode::Advanced, PathClass::InterIsland), 0);
        let no_sup = layout(2, 0);
        assert_eq!(no_sup.cts_qp(Mode::Vanilla, PathClass::IntraIsland), 0);
    }

    #[test]
    fn first_and_rails() {
        let qps = layout(2, 3);
        assert_eq!(
            (qps.first(Rail::ScaleOut), qps.first(Rail::ScaleUp)),
            (0, 2)
        );
        assert_eq!(layout(0, 1).rails(), RailMask::SCALE_UP);
        assert_eq!(layout(0, 0).rails(), RailMask::NONE);
    }

    fn lcm(a: u64, b: u64) -> u64 {
        let (mut x, mut y) = (a, b);
        while y != 0 {
            (x, y) = (y, x % y);
        }
        a / x * b
    }

    proptest! {
        #[test]
        fn even_use_over_lcm_window(sout in 1u8..=16, sup in 1u8..=16, start in 0u64..(1 << 62)) {
            let qps = layout(sout, sup);
            let window = lcm(sout as u64, sup as u64);
            let mut uses = [0u64; 32];
            for step in 0..window {
                let head = start + step;
                for rail in Rail::ALL {
                    let index = qps.qp_for_request(head, rail).unwrap();
                    prop_assert_eq!(qps.rail_of(index), Some(rail));
                    let first = qps.first(rail);
                    prop_assert!(index >= first && index < first + qps.count(rail));
                    uses[index] += 1;
                }
            }
            for (index, used) in uses.iter().enumerate().take(qps.total()) {
                let rail = qps.rail_of(index).unwrap();
                prop_assert_eq!(*used, window / qps.count(rail) as u64);
            }
        }

        #[test]
        fn indices_in_range(sout in 0u8..=16, sup in 0u8..=16, head in any::<u64>()) {
            let qps = layout(sout, sup);
            for rail in Rail::ALL {
                match qps.qp_for_request(head, rail) {
                    Some(index) => prop_assert_eq!(qps.rail_of(index), Some(rail)),
                    None => prop_assert_eq!(qps.count(rail), 0),
                }
            }
            prop_assert!(qps.cts_qp(Mode::Vanilla, PathClass::IntraIsland) < qps.total().max(1));
        }
    }
}
