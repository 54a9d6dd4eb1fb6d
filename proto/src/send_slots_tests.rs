use super::*;
use crate::cts::CtsError;
use crate::failover::{FailoverReport, SlotSet};

fn entry(seq: u64, nreqs: u32, tag: u32, size: u64) -> CtsEntry {
    CtsEntry {
        addr: 0x1000 * u64::from(tag + 1),
        size,
        rkeys: [1, 2],
        nreqs,
        tag,
        idx: ready_idx(seq),
        padding: [0; 24],
    }
}

fn buffer(request: u16, size: u64) -> SendBuffer {
    SendBuffer {
        request,
        addr: 0x9000,
        lkeys: [3, 4],
        size,
    }
}

#[test]
fn a_slot_goes_round_idle_matching_posting_in_flight_idle() {
    let mut slots = SendSlots::new();
    assert_eq!(slots.head(), Head::NeedsCts { seq: 0 });
    let fifo = [entry(0, 2, 7, 100), entry(0, 2, 9, 50)];
    assert!(slots.load_cts(|r| fifo[r], RailMask::BOTH).unwrap());
    assert_eq!(slots.head(), Head::Matching);
    assert_eq!(slots.match_send(8, 10), None, "no entry has tag 8");
    let second = slots.match_send(9, 80).unwrap();
    assert_eq!(
        (second.entry, second.size),
        (1, 50),
        "clamped to the receive"
    );
    assert!(!slots.take(second, buffer(1, 50)).unwrap());
    let first = slots.match_send(7, 60).unwrap();
    assert!(
        slots.take(first, buffer(2, 60)).unwrap(),
        "last entry taken"
    );
    assert_eq!(slots.head(), Head::NeedsCts { seq: 1 });
    assert_eq!(slots.next_to_post(), Some(0));
    assert_eq!(slots.slot(0).phase(), Phase::Posting);
    slots.posted(0, RailMask::BOTH, 100).unwrap();
    assert_eq!(slots.next_to_post(), None);
    assert_eq!(
        slots.complete(0, Rail::ScaleUp, 150),
        Ok(SendProgress::RailDone)
    );
    assert_eq!(
        slots.complete(0, Rail::ScaleUp, 160),
        Err(SendSlotError::NotInFlight {
            slot: 0,
            rail: Rail::ScaleUp
        }),
        "a rail completes once"
    );
    assert_eq!(
        slots.complete(0, Rail::ScaleOut, 170),
        Ok(SendProgress::SlotDone)
    );
    assert_eq!(slots.slot(0).done_ns(), [170, 150]);
    assert_eq!(slots.slot(0).phase(), Phase::Idle);
}

#[test]
fn a_cts_is_not_loaded_until_every_entry_carries_the_sequence() {
    let mut slots = SendSlots::new();
    let mut fifo = [entry(0, 3, 0, 8), entry(0, 3, 1, 8), CtsEntry::EMPTY];
    assert!(!slots.load_cts(|r| fifo[r], RailMask::BOTH).unwrap());
    assert_eq!(slots.head(), Head::NeedsCts { seq: 0 });
    fifo[2] = entry(0, 3, 2, 8);
    assert!(slots.load_cts(|r| fifo[r], RailMask::BOTH).unwrap());
    assert_eq!(slots.slot(0).entries().len(), 3);
}

#[test]
fn nreqs_is_taken_from_a_read_after_idx_was_seen() {
    // The first read sees the new idx beside the previous use's nreqs (1): a reader that used
    // it would serve one receive of the grouped two.
    let mut slots = SendSlots::new();
    let fresh = [entry(0, 2, 0, 8), entry(0, 2, 1, 8)];
    let mut reads = 0;
    let loaded = slots.load_cts(
        |r| {
            reads += 1;
            if reads == 1 {
                CtsEntry {
                    nreqs: 1,
                    ..fresh[0]
                }
            } else {
                fresh[r]
            }
        },
        RailMask::BOTH,
    );
    assert!(loaded.unwrap());
    assert_eq!(slots.slot(0).entries().len(), 2);
}

#[test]
fn a_malformed_entry_is_refused_and_names_the_fault() {
    let mut slots = SendSlots::new();
    let bad = CtsEntry {
        rkeys: [1, 0],
        ..entry(0, 1, 0, 8)
    };
    let error = slots.load_cts(|_| bad, RailMask::BOTH).unwrap_err();
    assert!(
        matches!(error, SendSlotError::Cts(CtsError::ZeroRkey { .. })),
        "{error:?}"
    );
    assert_eq!(slots.head(), Head::NeedsCts { seq: 0 });
}

#[test]
fn slots_post_in_fifo_order_and_a_busy_slot_blocks_its_next_sequence() {
    let mut slots = SendSlots::new();
    for seq in 0..FIFO_SLOTS as u64 {
        let cts = entry(seq, 1, 0, 8);
        assert!(slots.load_cts(|_| cts, RailMask::SCALE_OUT).unwrap());
        let matched = slots.match_send(0, 8).unwrap();
        assert!(slots.take(matched, buffer(seq as u16, 8)).unwrap());
    }
    assert_eq!(slots.head(), Head::Busy, "sequence 256 waits for slot 0");
    assert!(
        slots.posted(1, RailMask::SCALE_OUT, 0).is_err(),
        "slot 0 posts first"
    );
    assert!(
        slots.posted(0, RailMask::NONE, 0).is_err(),
        "a posting uses a rail"
    );
    slots.posted(0, RailMask::SCALE_OUT, 0).unwrap();
    assert_eq!(slots.head(), Head::Busy);
    slots.complete(0, Rail::ScaleOut, 1).unwrap();
    assert_eq!(slots.head(), Head::NeedsCts { seq: 256 });
    assert!(slots.complete(999, Rail::ScaleOut, 1).is_err());
}

/// Loads, matches and posts sequence `seq` (one entry) on the rails of `mask`.
fn post_one(slots: &mut SendSlots, seq: u64, mask: RailMask) -> usize {
    let fifo = [entry(seq, 1, 0, 100)];
    assert!(slots.load_cts(|r| fifo[r], RailMask::BOTH).unwrap());
    let matched = slots.match_send(0, 100).unwrap();
    assert!(slots.take(matched, buffer(seq as u16, 100)).unwrap());
    let slot = slots.next_to_post().unwrap();
    slots.posted(slot, mask, seq).unwrap();
    slot
}

#[test]
fn a_report_settles_every_slot_that_used_the_failed_rail() {
    let mut slots = SendSlots::new();
    let awaited = post_one(&mut slots, 0, RailMask::BOTH);
    let arrived = post_one(&mut slots, 1, RailMask::BOTH);
    let sout_only = post_one(&mut slots, 2, RailMask::SCALE_OUT);
    let whole = post_one(&mut slots, 3, RailMask::BOTH);
    assert_eq!(
        slots.complete(whole, Rail::ScaleOut, 9),
        Ok(SendProgress::RailDone)
    );
    // The sender sees SUP fail: nothing more goes on it, and the receiver is asked.
    let notice = slots.rail_failed(Rail::ScaleUp).unwrap().unwrap();
    assert_eq!((notice.epoch, notice.failed), (1, Rail::ScaleUp));
    assert_eq!(slots.rail_failed(Rail::ScaleUp), Ok(None));
    assert_eq!(
        slots.complete(awaited, Rail::ScaleUp, 10),
        Ok(SendProgress::RailDone),
        "a late completion of the failed rail says nothing"
    );
    let mut awaiting = SlotSet::EMPTY;
    awaiting.insert(awaited);
    awaiting.insert(sout_only);
    let report = FailoverReport {
        epoch: 1,
        failed: Rail::ScaleUp,
        awaiting,
        head: 4,
    };
    let done = slots.on_report(&report).unwrap();
    // `whole` had its SOUT part confirmed and its SUP part arrived: done now.
    assert_eq!(done.iter().collect::<Vec<_>>(), vec![whole]);
    assert_eq!(
        slots.on_report(&report),
        Ok(SlotSet::EMPTY),
        "a report is taken once"
    );
    // `awaited` is replayed, and done once its first SOUT part and the replay completed.
    assert_eq!(slots.next_replay(), Some(awaited));
    slots.replayed(awaited).unwrap();
    assert_eq!(slots.next_replay(), None);
    assert!(slots.replayed(awaited).is_err(), "a replay is posted once");
    assert_eq!(
        slots.complete(awaited, Rail::ScaleOut, 11),
        Ok(SendProgress::RailDone)
    );
    assert_eq!(
        slots.complete(awaited, Rail::ScaleOut, 12),
        Ok(SendProgress::SlotDone)
    );
    // `arrived` waits for its SOUT part only; `sout_only` was never on SUP.
    assert_eq!(
        slots.complete(arrived, Rail::ScaleOut, 13),
        Ok(SendProgress::SlotDone)
    );
    assert_eq!(
        slots.complete(sout_only, Rail::ScaleOut, 14),
        Ok(SendProgress::SlotDone)
    );
    assert_eq!(
        slots.rail_failed(Rail::ScaleOut),
        Err(SendSlotError::NoSurvivor)
    );
}

#[test]
fn nothing_is_posted_on_a_failed_rail() {
    let mut slots = SendSlots::new();
    slots.rail_failed(Rail::ScaleOut).unwrap();
    let fifo = [entry(0, 1, 0, 100)];
    assert!(slots.load_cts(|r| fifo[r], RailMask::BOTH).unwrap());
    let matched = slots.match_send(0, 100).unwrap();
    assert!(slots.take(matched, buffer(0, 100)).unwrap());
    let slot = slots.next_to_post().unwrap();
    assert!(slots.posted(slot, RailMask::BOTH, 1).is_err());
    assert_eq!(slots.posted(slot, RailMask::SCALE_UP, 1), Ok(()));
}

#[test]
fn a_report_names_sequences_not_just_slots() {
    // Sequence 0 is still in flight here on both rails in slot 0; the receiver completed it and
    // awaits sequence 256 in the same slot (its head is past it).
    let mut slots = SendSlots::new();
    let slot = post_one(&mut slots, 0, RailMask::BOTH);
    let mut awaiting = SlotSet::EMPTY;
    awaiting.insert(slot);
    let report = FailoverReport {
        epoch: 1,
        failed: Rail::ScaleUp,
        awaiting,
        head: 257,
    };
    assert_eq!(slots.on_report(&report), Ok(SlotSet::EMPTY));
    assert_eq!(
        slots.next_replay(),
        None,
        "sequence 0 is not the one awaited"
    );
    assert_eq!(
        slots.complete(slot, Rail::ScaleOut, 3),
        Ok(SendProgress::SlotDone)
    );
}

#[test]
fn a_cts_written_after_a_report_waits_for_that_report() {
    let mut slots = SendSlots::new();
    let fifo = [entry(0, 1, 0, 100).with_failover_epoch(1)];
    assert_eq!(slots.load_cts(|r| fifo[r], RailMask::BOTH), Ok(false));
    let report = FailoverReport {
        epoch: 1,
        failed: Rail::ScaleOut,
        awaiting: SlotSet::EMPTY,
        head: 1,
    };
    slots.on_report(&report).unwrap();
    assert_eq!(slots.down(), RailMask::SCALE_OUT);
    assert_eq!(slots.load_cts(|r| fifo[r], RailMask::BOTH), Ok(true));
}

#[test]
fn a_connection_with_one_rail_has_no_survivor() {
    let mut slots = SendSlots::new();
    slots.use_rails(RailMask::SCALE_OUT);
    assert_eq!(
        slots.rail_failed(Rail::ScaleOut),
        Err(SendSlotError::NoSurvivor)
    );
}

#[test]
fn a_rail_comes_back_only_once_its_failover_settled() {
    let mut slots = SendSlots::new();
    assert!(slots.settled(), "nothing failed");
    let awaited = post_one(&mut slots, 0, RailMask::BOTH);
    assert_eq!(
        slots.rail_restored(Rail::ScaleUp),
        Err(SendSlotError::Invariant(
            "a rail comes back only after its failover settled"
        )),
        "a rail that is up does not come back"
    );
    slots.rail_failed(Rail::ScaleUp).unwrap();
    assert!(!slots.settled(), "the report has not come");
    let mut awaiting = SlotSet::EMPTY;
    awaiting.insert(awaited);
    let report = FailoverReport {
        epoch: 1,
        failed: Rail::ScaleUp,
        awaiting,
        head: 1,
    };
    slots.on_report(&report).unwrap();
    assert!(!slots.settled(), "a replay is to be posted");
    slots.replayed(awaited).unwrap();
    slots.complete(awaited, Rail::ScaleOut, 5).unwrap();
    assert!(!slots.settled(), "the replay is in flight");
    assert!(slots.rail_restored(Rail::ScaleUp).is_err());
    assert_eq!(
        slots.complete(awaited, Rail::ScaleOut, 6),
        Ok(SendProgress::SlotDone)
    );
    // A transfer posted on the survivor alone meanwhile does not hold the rail's return.
    let survivor_only = post_one(&mut slots, 1, RailMask::SCALE_OUT);
    assert!(slots.settled());
    slots.rail_restored(Rail::ScaleUp).unwrap();
    assert!(slots.down().is_empty());
    // Split again; a completion on the rail counts again.
    let split = post_one(&mut slots, 2, RailMask::BOTH);
    assert_eq!(
        slots.complete(split, Rail::ScaleUp, 7),
        Ok(SendProgress::RailDone)
    );
    assert_eq!(
        slots.complete(split, Rail::ScaleOut, 8),
        Ok(SendProgress::SlotDone)
    );
    assert_eq!(
        slots.complete(survivor_only, Rail::ScaleOut, 9),
        Ok(SendProgress::SlotDone)
    );
    // It may fail again: a second failover, with its own notice.
    let notice = slots.rail_failed(Rail::ScaleUp).unwrap().unwrap();
    assert_eq!((notice.epoch, notice.failed), (2, Rail::ScaleUp));
    assert!(!slots.settled());
}
