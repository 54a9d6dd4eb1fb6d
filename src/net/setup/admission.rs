//! How many handshakes this process runs at once towards one listening socket.
//!
//! The first handshake towards a process is a TCP connection of its own (a descriptor on each
//! side), which becomes the two processes' control link (src/net/observe/link.rs); the later
//! ones ride that link and cost no descriptor (src/net/observe/link_ride.rs). NCCL starts every
//! `connect` of a batch before any completes (docs/NCCL_NET_ABI.md "Connection setup"), so
//! without a bound 8,192 connects would each open a connection before the first had made the
//! link. Here a `connect` is admitted only while fewer than [`IN_FLIGHT_LINKED`] handshakes run
//! to its destination — one, until a handshake there has made the link that the later ones then
//! ride, and again one if that link closed — and otherwise answers "not yet" holding nothing,
//! as NCCL expects of a `connect` that is not done. The destination is the listening socket a handle names, which is one per peer
//! process and device (src/net/setup/listener.rs). Past the first, the bound is on the work in
//! flight (each admitted handshake builds its queues), not on descriptors.
//!
//! A handshake in flight may wait on something outside this process's batch: the peer may be
//! another rank that polls its `accept` only after a setup of its own, which may in turn wait for
//! a `connect` of this process that is not admitted (several ranks or communicators in one
//! process share the destinations), and NCCL may abandon a `connect` half way (an abort) and
//! never drop it. So the bound gives way when stuck: when nothing towards a destination was
//! admitted or finished for [`STALL`], one more is admitted. The bound costs a batch nothing
//! while its handshakes progress, and a stuck one at most [`STALL`] per extra handshake.
//!
//! What this keeps per destination (a count, when it last moved) stays for the process's life:
//! one entry per peer socket ever connected to.

use std::collections::HashMap;
use std::net::SocketAddrV4;
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// Handshakes in flight at once towards a destination this process has a link to (they ride
/// it: no descriptor each).
pub(crate) const IN_FLIGHT_LINKED: u32 = 128;
/// With nothing admitted or finished towards a destination for this long, one more handshake is
/// admitted whatever the bound.
pub(crate) const STALL: Duration = Duration::from_secs(1);

struct Destination {
    in_flight: u32,
    /// When a handshake to it was last admitted or finished.
    moved: Instant,
}

fn destinations() -> MutexGuard<'static, HashMap<SocketAddrV4, Destination>> {
    static DESTINATIONS: OnceLock<Mutex<HashMap<SocketAddrV4, Destination>>> = OnceLock::new();
    DESTINATIONS
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A handshake's place among those in flight to its destination, given back on drop.
#[derive(Debug)]
pub(crate) struct Admission {
    destination: SocketAddrV4,
}

impl Admission {
    /// A place for a handshake to `destination`, or `None` while it has its share in flight
    /// (and they moved within [`STALL`]); the share is [`IN_FLIGHT_LINKED`] while this process
    /// holds a link to the destination's process (`linked`: the handshakes ride it), else one.
    pub(crate) fn try_admit(destination: SocketAddrV4, linked: bool) -> Option<Admission> {
        Admission::try_admit_at(destination, linked, Instant::now())
    }

    fn try_admit_at(destination: SocketAddrV4, linked: bool, now: Instant) -> Option<Admission> {
        let mut destinations = destinations();
        let entry = destinations.entry(destination).or_insert(Destination {
            in_flight: 0,
            moved: now,
        });
        let share = if linked { IN_FLIGHT_LINKED } else { 1 };
        let stuck = now.saturating_duration_since(entry.moved) >= STALL;
        if entry.in_flight >= share && !stuck {
            return None;
        }
        entry.in_flight += 1;
        entry.moved = now;
        Some(Admission { destination })
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        if let Some(entry) = destinations().get_mut(&self.destination) {
            entry.in_flight = entry.in_flight.saturating_sub(1);
            entry.moved = Instant::now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn destination(port: u16) -> SocketAddrV4 {
        SocketAddrV4::new(Ipv4Addr::new(127, 9, 9, 9), port)
    }

    #[test]
    fn one_handshake_until_a_link_exists_then_a_bounded_share() {
        let to = destination(40_001);
        let first = Admission::try_admit(to, false).expect("the first is admitted");
        assert!(
            Admission::try_admit(to, false).is_none(),
            "one until a link exists"
        );
        assert!(
            Admission::try_admit(destination(40_002), false).is_some(),
            "another destination has its own share"
        );
        // The first made the link.
        drop(first);
        let admitted: Vec<_> = (0..IN_FLIGHT_LINKED)
            .map_while(|_| Admission::try_admit(to, true))
            .collect();
        assert_eq!(admitted.len(), IN_FLIGHT_LINKED as usize);
        assert!(
            Admission::try_admit(to, true).is_none(),
            "the share is bounded"
        );
        assert!(
            Admission::try_admit(to, false).is_none(),
            "the link gone, one at most again"
        );
        drop(admitted);
        assert!(Admission::try_admit(to, true).is_some(), "places come back");
    }

    #[test]
    fn a_stuck_destination_admits_one_more_after_the_stall() {
        let to = destination(40_004);
        let start = Instant::now();
        let stuck = Admission::try_admit_at(to, false, start).expect("the first is admitted");
        assert!(Admission::try_admit_at(to, false, start + STALL / 2).is_none());
        let next =
            Admission::try_admit_at(to, false, start + STALL).expect("admitted past the stall");
        assert!(
            Admission::try_admit_at(to, false, start + STALL + STALL / 2).is_none(),
            "the stall counts again from the last admission"
        );
        drop((stuck, next));
    }

    #[test]
    fn a_failed_first_handshake_gives_its_place_back_without_a_link() {
        let to = destination(40_003);
        drop(Admission::try_admit(to, false).expect("admitted"));
        let again = Admission::try_admit(to, false).expect("the place came back");
        assert!(
            Admission::try_admit(to, false).is_none(),
            "still one: no link was made"
        );
        drop(again);
    }
}
