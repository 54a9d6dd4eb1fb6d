//! Per-rail busy time of one send connection, for the policy agent (probes layout 1.1).
//!
//! Why: the `adaptive` policy balances the rails by their rates *while busy* (completed bytes
//! divided by the time the rail had at least one of the connection's parts in flight). Wall time
//! would charge a rail for the idle gaps of a bursty job; summing each part's post-to-completion
//! time would count overlapping parts twice. The clock accrues at every completion, so a rail
//! that never goes idle still reports its busy time as it goes (docs/PROBES_LAYOUT.md).

/// The busy clock of one rail of one connection.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct BusyClock {
    in_flight: u32,
    since_ns: u64,
    /// The last completion, and when its part was posted (the failover watchdog's evidence
    /// that the peer takes newer work on this rail: `proto::watchdog`).
    last_completion_ns: u64,
    last_completed_post_ns: u64,
}

impl BusyClock {
    /// A part was posted at `now_ns`.
    pub(crate) fn posted(&mut self, now_ns: u64) {
        if self.in_flight == 0 {
            self.since_ns = now_ns;
        }
        self.in_flight = self.in_flight.saturating_add(1);
    }

    /// Parts in flight now (published for the agent's sampler, docs/AGENT.md).
    pub(crate) fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// Parts in flight and the rail's last progress, for the failover watchdog
    /// (`proto::watchdog`).
    #[inline]
    pub(crate) fn progress(&self) -> crate::proto::watchdog::RailProgress {
        crate::proto::watchdog::RailProgress {
            in_flight: self.in_flight,
            last_progress_ns: self.since_ns,
            last_completion_ns: self.last_completion_ns,
            last_completed_post_ns: self.last_completed_post_ns,
        }
    }

    /// A part posted at `post_ns` completed at `now_ns`: the busy time accrued since the last
    /// mark.
    pub(crate) fn completed(&mut self, now_ns: u64, post_ns: u64) -> u64 {
        if self.in_flight == 0 {
            return 0;
        }
        self.last_completion_ns = now_ns;
        self.last_completed_post_ns = self.last_completed_post_ns.max(post_ns);
        let busy = now_ns.saturating_sub(self.since_ns);
        self.since_ns = now_ns;
        self.in_flight -= 1;
        busy
    }
}

#[cfg(test)]
mod tests {
    use super::BusyClock;

    #[test]
    fn overlapping_parts_count_once_and_gaps_not_at_all() {
        let mut clock = BusyClock::default();
        clock.posted(100);
        clock.posted(150);
        assert_eq!(clock.completed(300, 100), 200, "first completion: 100..300");
        assert_eq!(
            clock.completed(400, 150),
            100,
            "second: 300..400, not 150..400"
        );
        assert_eq!(
            clock.completed(500, 150),
            0,
            "a stray completion adds nothing"
        );
        clock.posted(1_000);
        assert_eq!(
            clock.completed(1_010, 1_000),
            10,
            "the idle 400..1000 is not busy"
        );
        let progress = clock.progress();
        assert_eq!(
            (progress.last_completion_ns, progress.last_completed_post_ns),
            (1_010, 1_000)
        );
    }
}
