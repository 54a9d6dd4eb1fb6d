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
