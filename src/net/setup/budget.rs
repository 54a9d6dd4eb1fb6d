//! What each NIC can hold, and what the connections on it hold: a connection takes its QPs, its
//! completion queues and (receiving) its shared receive queues from both of its device's NICs
//! before it creates any, or is refused whole, with the limit, the NIC and the variable to change
//! named. Without this a connection past a NIC's `max_qp` failed in the middle of creating its
//! queues, with only the verb's errno to go on (NVIDIA/nccl#1191 and nccl-tests#78 are what that
//! looks like at scale; docs/ARCHITECTURE.md "What a connection takes").

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::fabric::{DeviceInfo, Rail};
use crate::proto::qp_layout::QpLayout;

/// The kinds of object a connection takes from a NIC, in the order of [`Need`]'s fields.
const KINDS: [&str; 4] = ["max_qp", "max_cq", "max_srq", "max_mr"];

/// What one connection takes from one NIC.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Need {
    /// Queue pairs (data QPs, plus the flush QP of a receive comm under `MPIB_FORCE_FLUSH`).
    pub qps: u32,
    /// Completion queues.
    pub cqs: u32,
    /// Shared receive queues (a connection takes none: the queues it shares take theirs when
    /// they are created, src/net/setup/receives.rs).
    pub srqs: u32,
    /// Memory registrations of its own: its CTS FIFO or shadow and its completion records (or
    /// their shadow) on each NIC, and the flush's scratch word. The buffers NCCL registers with
    /// `regMr` are taken one MR per page range as they are registered
    /// ([`NicBudget::take_registration`]), not per connection.
    pub mrs: u32,
}

impl Need {
    fn counts(self) -> [u32; 4] {
        [self.qps, self.cqs, self.srqs, self.mrs]
    }

    /// What a connection of `layout` takes from each rail's NIC: its QPs there, one CQ, and on
    /// the receiving side with flush QPs one more QP. Its receives come from a queue shared with
    /// up to 127 others, counted when that queue is made.
    pub(crate) fn of(layout: QpLayout, receiving: bool, flush: bool) -> [Need; 2] {
        Rail::ALL.map(|rail| {
            // The regions are registered on both NICs whatever rails the layout uses.
            let mrs = 2 + u32::from(receiving && flush);
            let qps = layout.count(rail) as u32;
            if qps == 0 {
                return Need {
                    mrs,
                    ..Need::default()
                };
            }
            Need {
                qps: qps + u32::from(receiving && flush),
                cqs: 1,
                srqs: 0,
                mrs,
            }
        })
    }
}

/// One NIC's limits and what the connections of this process hold of them.
pub(crate) struct NicBudget {
    name: String,
    rail: Rail,
    limits: [u32; 4],
    used: [AtomicU32; 4],
}

impl NicBudget {
    /// The budget of a NIC as it reports itself.
    pub(crate) fn new(info: &DeviceInfo, rail: Rail) -> NicBudget {
        NicBudget {
            name: info.name.clone(),
            rail,
            limits: limits(info),
            used: Default::default(),
        }
    }

    /// Objects of each kind in use (QPs, CQs, SRQs, MRs).
    #[cfg(test)]
    pub(crate) fn in_use(&self) -> [u32; 4] {
        self.used
            .each_ref()
            .map(|used| used.load(Ordering::Relaxed))
    }

    /// Takes `need`, or nothing and why not.
    fn take(&self, need: Need, variable: &str) -> Result<()> {
        let counts = need.counts();
        for kind in 0..KINDS.len() {
            let wanted = counts[kind];
            let limit = self.limits[kind];
            // Taken only if it fits, so that two connections made at once on different threads
            // never both see the other's share and are both refused.
            let taken =
                self.used[kind].fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                    used.checked_add(wanted).filter(|total| *total <= limit)
                });
            let Err(held) = taken else {
                continue;
            };
            for (used, count) in self.used.iter().zip(counts).take(kind) {
                used.fetch_sub(count, Ordering::Relaxed);
            }
            let advice = match kind {
                0 => format!("lower {variable} (QPs per connection on this rail), "),
                _ => String::new(),
            };
            let who = match kind {
                2 if wanted == 1 && counts[0] == 0 => "a new shared receive queue",
                3 if wanted == 1 && counts[0] == 0 => "a new memory registration (regMr)",
                _ => "this connection",
            };
            return Err(Error::system(format!(
                "the {} NIC {} holds {held} of {limit} {} ({}): {who} needs {wanted} \
                 more; {advice}spread the connections over more devices \
                 (MPIB_HCA_SOUT/MPIB_HCA_SUP), or close some first",
                self.rail,
                self.name,
                ["QPs", "CQs", "SRQs", "MRs"][kind],
                KINDS[kind],
            )));
        }
        Ok(())
    }

    /// Takes one shared receive queue (src/net/setup/receives.rs), held until the hold drops.
    pub(crate) fn take_queue(self: &Arc<Self>) -> Result<Hold> {
        self.take_one(Need {
            srqs: 1,
            ..Need::default()
        })
    }

    /// Takes one memory registration NCCL asked for with `regMr` (one per page range however
    /// many handles share it, src/net/data/registrations.rs), held until the hold drops.
    pub(crate) fn take_registration(self: &Arc<Self>) -> Result<Hold> {
        self.take_one(Need {
            mrs: 1,
            ..Need::default()
        })
    }

    fn take_one(self: &Arc<Self>, need: Need) -> Result<Hold> {
        self.take(need, "")?;
        Ok(Hold {
            budget: Arc::clone(self),
            need,
        })
    }

    fn give_back(&self, need: Need) {
        for (used, count) in self.used.iter().zip(need.counts()) {
            used.fetch_sub(count, Ordering::Relaxed);
        }
    }
}

/// A connection's objects on its two NICs, given back when it is dropped (with the connection,
/// or with a handshake that failed half-way: nothing is held by a connection that is not made).
pub(crate) struct Reservation {
    taken: [(Arc<NicBudget>, Need); 2],
}

impl Reservation {
    /// Takes `needs` from `budgets` (SOUT, SUP), both or neither.
    pub(crate) fn take(budgets: &[Arc<NicBudget>; 2], needs: [Need; 2]) -> Result<Reservation> {
        let variables = ["MPIB_SOUT_QP", "MPIB_SUP_QP"];
        budgets[0].take(needs[0], variables[0])?;
        if let Err(error) = budgets[1].take(needs[1], variables[1]) {
            budgets[0].give_back(needs[0]);
            return Err(error);
        }
        Ok(Reservation {
            taken: [
                (Arc::clone(&budgets[0]), needs[0]),
                (Arc::clone(&budgets[1]), needs[1]),
            ],
        })
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        for (budget, need) in &self.taken {
            budget.give_back(*need);
        }
    }
}

/// One object a NIC holds beyond any connection's (a shared receive queue, a `regMr`
/// registration), given back to its budget on drop.
pub(crate) struct Hold {
    budget: Arc<NicBudget>,
    need: Need,
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.budget.give_back(self.need);
    }
}

/// How many connections a device holds: the scarcest kind on either NIC, over what one
/// connection takes of it (a receiving one, which takes the most); a SUP NIC serving `sharers`
/// devices gives each its share. Never 0: NCCL treats 0 as "no limit" nowhere, and 1 is true of
/// any NIC that opened.
pub(crate) fn max_comms(limits: [[u32; 4]; 2], sharers: u32, per_comm: [Need; 2]) -> i32 {
    let mut comms = u32::MAX;
    for rail in 0..2 {
        let share = if rail == 1 { sharers.max(1) } else { 1 };
        for (limit, need) in limits[rail].iter().zip(per_comm[rail].counts()) {
            if let Some(fits) = (limit / share).checked_div(need) {
                comms = comms.min(fits);
            }
        }
    }
    comms.clamp(1, i32::MAX as u32) as i32
}

/// The limits of a NIC, in [`max_comms`]'s order.
pub(crate) fn limits(info: &DeviceInfo) -> [u32; 4] {
    [info.max_qp, info.max_cq, info.max_srq, info.max_mr]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(limits: [u32; 3]) -> Arc<NicBudget> {
        let info = DeviceInfo {
            name: "loop1".to_string(),
            port: 1,
            speed_mbps: 100_000,
            active_mtu: 5,
            link_layer: crate::fabric::LinkLayer::Ethernet,
            address: std::net::Ipv4Addr::LOCALHOST.into(),
            endpoint: crate::fabric::Endpoint::new(crate::fabric::FabricKind::Loopback, &[0; 16]),
            guid: 1,
            pci_path: None,
            max_qp: limits[0],
            max_cq: limits[1],
            max_srq: limits[2],
            max_srq_wr: 32_767,
            max_mr: 1_000_000,
        };
        Arc::new(NicBudget::new(&info, Rail::ScaleUp))
    }

    fn need(qps: u32, cqs: u32, srqs: u32) -> Need {
        Need {
            qps,
            cqs,
            srqs,
            mrs: 0,
        }
    }

    #[test]
    fn a_connection_takes_both_nics_or_neither_and_gives_back_on_drop() {
        let sout = budget([100, 100, 100]);
        let sup = budget([8, 100, 100]);
        let budgets = [Arc::clone(&sout), Arc::clone(&sup)];
        let first = Reservation::take(&budgets, [need(2, 1, 1), need(4, 1, 1)]).unwrap();
        let second = Reservation::take(&budgets, [need(2, 1, 1), need(4, 1, 1)]).unwrap();
        let error = Reservation::take(&budgets, [need(2, 1, 1), need(4, 1, 1)])
            .err()
            .unwrap()
            .to_string();
        assert!(error.contains("holds 8 of 8 QPs (max_qp)"), "{error}");
        assert!(error.contains("loop1"), "{error}");
        assert!(error.contains("MPIB_SUP_QP"), "{error}");
        assert_eq!(
            sout.in_use(),
            [4, 2, 2, 0],
            "the refused one took nothing from SOUT"
        );
        assert_eq!(sup.in_use(), [8, 2, 2, 0]);
        drop(first);
        assert_eq!(sup.in_use(), [4, 1, 1, 0]);
        drop(second);
        assert_eq!(sout.in_use(), [0, 0, 0, 0]);
        assert_eq!(sup.in_use(), [0, 0, 0, 0]);
    }

    #[test]
    fn a_scarce_cq_or_srq_refuses_without_touching_the_qps() {
        let sup = budget([100, 1, 100]);
        let sout = budget([100, 100, 100]);
        let budgets = [Arc::clone(&sout), Arc::clone(&sup)];
        let _one = Reservation::take(&budgets, [need(1, 1, 0), need(1, 1, 0)]).unwrap();
        let error = Reservation::take(&budgets, [need(1, 1, 0), need(1, 1, 0)])
            .err()
            .unwrap()
            .to_string();
        assert!(error.contains("CQs (max_cq)"), "{error}");
        assert!(
            !error.contains("MPIB_SUP_QP"),
            "QP counts do not help: {error}"
        );
        assert_eq!(sup.in_use(), [1, 1, 0, 0]);
    }

    /// Connections made at once on several threads: exactly as many as fit are taken.
    #[test]
    fn threads_racing_for_the_last_qps_take_exactly_what_fits() {
        let sout = budget([100, 1000, 1000]);
        let sup = budget([1000, 1000, 1000]);
        let budgets = [sout, sup];
        let taken: Vec<Option<Reservation>> = std::thread::scope(|scope| {
            let threads: Vec<_> = (0..8)
                .map(|_| {
                    scope.spawn(|| {
                        (0..40)
                            .map(|_| {
                                Reservation::take(&budgets, [need(1, 0, 0), need(1, 0, 0)]).ok()
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            threads
                .into_iter()
                .flat_map(|t| t.join().unwrap())
                .collect()
        });
        assert_eq!(
            taken.iter().flatten().count(),
            100,
            "320 tries for 100 SOUT QPs"
        );
        assert_eq!(budgets[0].in_use(), [100, 0, 0, 0]);
        assert_eq!(
            budgets[1].in_use(),
            [100, 0, 0, 0],
            "a refused one gave its SUP QP back"
        );
        drop(taken);
        assert_eq!(budgets[0].in_use(), [0, 0, 0, 0]);
    }

    #[test]
    fn max_comms_is_the_scarcest_kind_over_what_a_connection_takes() {
        let per_comm = [need(2, 1, 1), need(4, 1, 1)];
        let roomy = [100_000; 4];
        assert_eq!(
            max_comms([roomy, [1000, 100_000, 100_000, 100_000]], 1, per_comm),
            250
        );
        assert_eq!(
            max_comms([roomy, [1000, 100_000, 100_000, 100_000]], 2, per_comm),
            125
        );
        assert_eq!(
            max_comms([[100_000, 100_000, 30, 100_000], roomy], 1, per_comm),
            30
        );
        assert_eq!(max_comms([[1; 4]; 2], 1, per_comm), 1, "never 0");
        let none = [Need::default(), Need::default()];
        assert_eq!(max_comms([roomy, roomy], 1, none), i32::MAX);
    }

    #[test]
    fn a_receiver_takes_the_flush_qp_per_rail_it_uses_and_no_queue_of_its_own() {
        let layout = QpLayout::new(2, 4, crate::proto::mode::Mode::Advanced, PATH);
        let [sout, sup] = Need::of(layout, true, true);
        let mrs = |mrs, need: Need| Need { mrs, ..need };
        assert_eq!((sout, sup), (mrs(3, need(3, 1, 0)), mrs(3, need(5, 1, 0))));
        let [sout, sup] = Need::of(layout, false, true);
        assert_eq!((sout, sup), (mrs(2, need(2, 1, 0)), mrs(2, need(4, 1, 0))));
    }

    const PATH: crate::proto::island::PathClass = crate::proto::island::PathClass::IntraIsland;
}
