use super::*;
use crate::imm::SIZE_Q_SENTINEL;

fn slots(high: u32) -> RecvSlots {
    RecvSlots::new([Some(SrqCredits::new(high / 2, high)); 2])
}

fn imm(slot: u8, mask: RailMask, size_q: u32) -> Imm {
    Imm { slot, mask, size_q }
}

fn fill(slots: &mut RecvSlots, in_flight: u32) {
    for rail in Rail::ALL {
        let n = slots.wanted(rail, in_flight);
        slots.on_granted(rail, n);
    }
}

#[test]
fn a_receive_completes_when_every_rail_of_its_mask_delivered() {
    let mut slots = slots(8);
    fill(&mut slots, 1);
    let buffers = [RecvBuffer {
        addr: 0x100,
        size: 4096,
        rkeys: [5, 6],
        tag: 3,
    }];
    let entry = slots.cts_entry(buffers.len(), &buffers[0]);
    assert_eq!((entry.idx, entry.nreqs, entry.tag), (1, 1, 3));
    assert_eq!(slots.posted(11, 1), Ok(0));
    let sentinel = imm(0, RailMask::BOTH, SIZE_Q_SENTINEL);
    assert_eq!(
        slots.on_imm(Rail::ScaleUp, sentinel, RailMask::BOTH),
        Ok(ImmOutcome::Pending)
    );
    let done = slots
        .on_imm(Rail::ScaleOut, sentinel, RailMask::BOTH)
        .unwrap();
    assert_eq!(
        done,
        ImmOutcome::Complete(Completed {
            slot: 0,
            request: 11,
            count: 1,
            imm_size: None
        })
    );
    assert_eq!(slots.outstanding(), 0);
    assert_eq!(slots.srq(Rail::ScaleOut).unwrap().held(), 4);
}

#[test]
fn imms_that_break_the_protocol_are_named() {
    let mut slots = slots(4);
    assert_eq!(
        slots.on_imm(
            Rail::ScaleOut,
            imm(0, RailMask::SCALE_OUT, 1),
            RailMask::BOTH
        ),
        Err(RecvSlotError::SrqUnderflow(Rail::ScaleOut))
    );
    fill(&mut slots, 1);
    assert_eq!(
        slots.on_imm(
            Rail::ScaleOut,
            imm(5, RailMask::SCALE_OUT, 1),
            RailMask::BOTH
        ),
        Err(RecvSlotError::NoReceive(5))
    );
    slots.posted(1, 1).unwrap();
    slots
        .on_imm(Rail::ScaleOut, imm(0, RailMask::BOTH, 1), RailMask::BOTH)
        .unwrap();
    let error = slots
        .on_imm(Rail::ScaleUp, imm(0, RailMask::SCALE_UP, 1), RailMask::BOTH)
        .unwrap_err();
    assert!(
        matches!(error, RecvSlotError::Mask(0, MaskError::Mismatch { .. })),
        "{error}"
    );
    let no_srq = RecvSlots::new([Some(SrqCredits::new(1, 2)), None]);
    assert_eq!(no_srq.capacity(), 2);
}

#[test]
fn no_more_receives_are_outstanding_than_an_srq_holds() {
    let mut slots = slots(4);
    for request in 0..4 {
        assert_eq!(slots.can_post(), Ok(()));
        let in_flight = slots.outstanding() + 1;
        fill(&mut slots, in_flight);
        slots.posted(request, 1).unwrap();
    }
    assert_eq!(slots.can_post(), Err(RecvBlocked::SrqFull));
    assert!(slots.posted(9, 1).is_err());
    let done = slots.on_imm(
        Rail::ScaleOut,
        imm(2, RailMask::SCALE_OUT, 3),
        RailMask::BOTH,
    );
    assert!(matches!(
        done,
        Ok(ImmOutcome::Complete(Completed {
            request: 2,
            imm_size: Some(384),
            ..
        }))
    ));
    assert_eq!(slots.can_post(), Ok(()));
}

#[test]
fn the_head_waits_for_the_receive_256_earlier() {
    let mut slots = RecvSlots::new([Some(SrqCredits::new(512, 512)); 2]);
    fill(&mut slots, 256);
    for request in 0..256 {
        slots.posted(request, 1).unwrap();
    }
    assert_eq!(slots.can_post(), Err(RecvBlocked::SlotBusy));
}

#[test]
fn a_cts_goes_out_only_for_a_receive_every_rail_holds() {
    let mut slots = slots(8);
    assert!(!slots.covers(1));
    assert_eq!(
        slots.posted(1, 1),
        Err(RecvSlotError::Invariant(
            "a CTS goes out only when every rail holds a receive for it"
        ))
    );
    let wanted = slots.wanted(Rail::ScaleOut, 1);
    slots.on_granted(Rail::ScaleOut, wanted);
    slots.on_granted(Rail::ScaleUp, 0);
    assert!(
        !slots.covers(1),
        "a short take on one rail blocks the receive"
    );
    fill(&mut slots, 1);
    assert_eq!(slots.posted(1, 1), Ok(0));
    assert_eq!(slots.excess(Rail::ScaleOut, 1), 0);
}

#[test]
fn a_failover_awaits_only_the_receives_that_may_lack_the_failed_rails_part() {
    let mut slots = slots(8);
    fill(&mut slots, 4);
    let both = imm(0, RailMask::BOTH, SIZE_Q_SENTINEL);
    for request in 0..4 {
        slots.posted(request, 1).unwrap();
    }
    // Slot 0 got its SUP part, slot 1 its SOUT part, slot 2 a SOUT-only post is coming, slot 3
    // nothing yet.
    let on = |slot: u8, mask| imm(slot, mask, SIZE_Q_SENTINEL);
    assert_eq!(
        slots.on_imm(Rail::ScaleUp, both, RailMask::BOTH),
        Ok(ImmOutcome::Pending)
    );
    let one = on(1, RailMask::BOTH);
    assert_eq!(
        slots.on_imm(Rail::ScaleOut, one, RailMask::BOTH),
        Ok(ImmOutcome::Pending)
    );
    assert_eq!(slots.fail_rail(Rail::ScaleUp), Ok(true));
    assert_eq!(slots.imms_in_flight(), 4 + 3);
    assert_eq!(slots.fail_rail(Rail::ScaleUp), Ok(false), "failed once");
    // Receives are held for every IMM that may come before the report goes, and no receive is
    // posted meanwhile.
    assert_eq!(slots.can_post(), Err(RecvBlocked::ReportDue));
    let in_flight = slots.imms_in_flight();
    fill(&mut slots, in_flight);
    let report = slots.take_report().expect("covered: the report goes");
    assert_eq!((report.failed, report.head), (Rail::ScaleUp, 4));
    // 0 has its SUP part; 1 lacks it; 2 and 3 learned nothing.
    assert_eq!(report.awaiting.iter().collect::<Vec<_>>(), vec![1, 2, 3]);
    assert_eq!(slots.take_report(), None, "reported once");
    assert_eq!(slots.can_post(), Ok(()));
    // 0 completes on its SOUT part as it would have.
    let done = slots.on_imm(Rail::ScaleOut, both, RailMask::BOTH).unwrap();
    assert!(matches!(
        done,
        ImmOutcome::Complete(Completed { slot: 0, .. })
    ));
    // 1: its SOUT part again (a late one) is ignored, once; the replay completes it.
    assert_eq!(
        slots.on_imm(Rail::ScaleOut, one, RailMask::BOTH),
        Ok(ImmOutcome::Pending)
    );
    assert!(matches!(
        slots.on_imm(Rail::ScaleOut, one, RailMask::BOTH),
        Err(RecvSlotError::Mask(1, MaskError::Duplicate { .. }))
    ));
    let replay = Imm::replay(1, 3);
    let done = slots
        .on_imm(Rail::ScaleOut, replay, RailMask::BOTH)
        .unwrap();
    assert!(
        matches!(
            done,
            ImmOutcome::Complete(Completed {
                slot: 1,
                imm_size: Some(384),
                ..
            })
        ),
        "{done:?}"
    );
    // 2: a SOUT-only post completes it. A receive posted since awaits no replay.
    let sout = on(2, RailMask::SCALE_OUT);
    let done = slots.on_imm(Rail::ScaleOut, sout, RailMask::BOTH).unwrap();
    assert!(matches!(
        done,
        ImmOutcome::Complete(Completed { slot: 2, .. })
    ));
    let in_flight = slots.imms_in_flight() + 1;
    fill(&mut slots, in_flight);
    let fresh = slots.posted(9, 1).unwrap();
    assert_eq!(
        slots.on_imm(Rail::ScaleOut, Imm::replay(fresh as u8, 0), RailMask::BOTH),
        Err(RecvSlotError::UnawaitedReplay(fresh))
    );
    assert_eq!(
        slots.on_imm(Rail::ScaleUp, on(3, RailMask::SCALE_UP), RailMask::BOTH),
        Err(RecvSlotError::RailDown(Rail::ScaleUp))
    );
    assert_eq!(
        slots.fail_rail(Rail::ScaleOut),
        Err(RecvSlotError::NoSurvivor)
    );
}

#[test]
fn after_a_failover_a_new_receive_learns_only_the_survivor() {
    let mut slots = slots(8);
    fill(&mut slots, 1);
    slots.fail_rail(Rail::ScaleOut).unwrap();
    fill(&mut slots, 1);
    let report = slots
        .take_report()
        .expect("nothing outstanding: the report goes at once");
    assert!(report.awaiting.is_empty());
    let slot = slots.posted(7, 1).unwrap() as u8;
    assert_eq!(
        slots.cts_entry(1, &RecvBuffer::default()).failover_epoch(),
        1
    );
    let both = imm(slot, RailMask::BOTH, SIZE_Q_SENTINEL);
    assert!(matches!(
        slots.on_imm(Rail::ScaleUp, both, RailMask::BOTH),
        Err(RecvSlotError::Mask(_, MaskError::InvalidMask { .. }))
    ));
    let up = imm(slot, RailMask::SCALE_UP, 2);
    let done = slots.on_imm(Rail::ScaleUp, up, RailMask::BOTH).unwrap();
    assert!(matches!(
        done,
        ImmOutcome::Complete(Completed { request: 7, .. })
    ));
}

#[test]
fn a_rail_is_taken_back_only_once_nothing_of_its_failover_is_left() {
    let mut slots = slots(8);
    fill(&mut slots, 2);
    slots.posted(0, 1).unwrap();
    assert!(!slots.can_restore(Rail::ScaleUp), "a rail that is up");
    assert_eq!(
        slots.restore_rail(Rail::ScaleUp),
        Err(RecvSlotError::NotRestorable(Rail::ScaleUp))
    );
    assert_eq!(slots.fail_rail(Rail::ScaleUp), Ok(true));
    assert!(!slots.can_restore(Rail::ScaleUp), "the report is due");
    let in_flight = slots.imms_in_flight();
    fill(&mut slots, in_flight);
    let report = slots.take_report().unwrap();
    assert_eq!(report.awaiting.iter().collect::<Vec<_>>(), vec![0]);
    assert!(
        !slots.can_restore(Rail::ScaleUp),
        "a receive awaits its replay"
    );
    let done = slots
        .on_imm(Rail::ScaleOut, Imm::replay(0, 1), RailMask::BOTH)
        .unwrap();
    assert!(matches!(
        done,
        ImmOutcome::Complete(Completed { slot: 0, .. })
    ));
    assert!(slots.can_restore(Rail::ScaleUp));
    slots.restore_rail(Rail::ScaleUp).unwrap();
    assert!(slots.down().is_empty());
    // A split receive completes on both rails again.
    slots.posted(1, 1).unwrap();
    let both = imm(1, RailMask::BOTH, SIZE_Q_SENTINEL);
    assert_eq!(
        slots.on_imm(Rail::ScaleUp, both, RailMask::BOTH),
        Ok(ImmOutcome::Pending)
    );
    let done = slots.on_imm(Rail::ScaleOut, both, RailMask::BOTH).unwrap();
    assert!(matches!(
        done,
        ImmOutcome::Complete(Completed { slot: 1, .. })
    ));
    // And it may fail over again.
    assert_eq!(slots.fail_rail(Rail::ScaleUp), Ok(true));
}
