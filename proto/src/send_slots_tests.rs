use super::*;
use crate::cts::CtsError;

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
