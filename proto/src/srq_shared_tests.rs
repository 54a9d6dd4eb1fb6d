use super::*;
use proptest::prelude::*;

#[test]
fn members_hold_their_floor_and_borrow_the_rest() {
    let mut ledger = SharedSrqLedger::new(64, 8);
    assert_eq!(
        (ledger.depth(), ledger.capacity(), ledger.floor()),
        (127, 64, 8)
    );
    for _ in 0..4 {
        ledger.join().unwrap();
    }
    assert_eq!(
        ledger.join(),
        Err(JoinRefused::Full { members: 4 }),
        "floors in half"
    );
    let first = ledger.take(0, 40);
    assert_eq!(first.receives, 40, "8 of its floor and 32 borrowed");
    assert_eq!(first.post, 48, "posted up to what is granted and a spare");
    ledger.on_posted(first.post);
    let second = ledger.take(0, 40);
    assert_eq!(
        second.receives, 8,
        "its floor: the other floors stay reserved"
    );
    assert_eq!(second.post, 0, "the spare covered it");
    for _ in 0..2 {
        let floor = ledger.take(0, 8);
        assert_eq!(floor.receives, 8, "every floor still there");
        ledger.on_posted(floor.post);
    }
    assert_eq!(ledger.granted(), 64);
    // The first member's IMMs consumed 30 of its receives; settled, they borrow again.
    ledger.settle(40, 10);
    assert_eq!((ledger.posted(), ledger.granted()), (34, 34));
    assert_eq!(ledger.take(10, 40).receives, 30);
}

#[test]
fn leaving_with_receives_outstanding_writes_them_off_and_retires_the_queue() {
    let mut ledger = SharedSrqLedger::new(64, 8);
    ledger.join().unwrap();
    let granted = ledger.take(0, 20);
    ledger.on_posted(granted.post);
    ledger.leave(20, 16);
    assert_eq!(
        (ledger.members(), ledger.granted(), ledger.lost()),
        (0, 0, 16)
    );
    assert_eq!(ledger.posted(), granted.post - 16);
    assert_eq!(ledger.join(), Err(JoinRefused::Retired { lost: 16 }));
    assert!(JoinRefused::Retired { lost: 16 }
        .to_string()
        .contains("16 receives"));
}

#[test]
fn a_member_that_borrowed_everything_keeps_newcomers_out_until_it_gives_back() {
    let mut ledger = SharedSrqLedger::new(64, 8);
    ledger.join().unwrap();
    assert_eq!(
        ledger.take(0, 64).receives,
        64,
        "its floor and all the rest"
    );
    assert_eq!(ledger.join(), Err(JoinRefused::Full { members: 1 }));
    ledger.give_back(64, 40);
    ledger.join().unwrap();
    assert_eq!(ledger.take(0, 8).receives, 8);
}

#[test]
fn a_peer_that_broke_the_protocol_retires_its_queue_with_spare_receives_posted() {
    let mut ledger = SharedSrqLedger::new(64, 8);
    ledger.join().unwrap();
    let granted = ledger.take(0, 8);
    ledger.on_posted(granted.post);
    ledger.consumed_unheld();
    assert_eq!(ledger.posted(), granted.post - 1);
    assert_eq!(
        ledger.quarantine(),
        16,
        "a quarter of the capacity beyond the count"
    );
    assert_eq!(ledger.join(), Err(JoinRefused::Retired { lost: 16 }));
    assert_eq!(
        ledger.room(),
        64 - 8,
        "all but its floor still lendable to its members"
    );
}

/// What a member does in the model below.
#[derive(Clone, Copy, Debug)]
enum Step {
    Join,
    Take(u32),
    Consume,
    GiveBack(u32),
    Leave {
        outstanding: u32,
        consumed_unseen: u32,
    },
}

fn step() -> impl Strategy<Value = (usize, Step)> {
    let step = prop_oneof![
        Just(Step::Join),
        (1u32..80).prop_map(Step::Take),
        Just(Step::Consume),
        (0u32..40).prop_map(Step::GiveBack),
        (0u32..40, 0u32..40).prop_map(|(outstanding, consumed_unseen)| Step::Leave {
            outstanding,
            consumed_unseen,
        }),
    ];
    (0usize..6, step)
}

#[derive(Clone, Copy, Default)]
struct Member {
    holding: u32,
    settled: u32,
}

proptest! {
    /// Members join, take, consume, give back and leave (some with IMMs that consumed receives
    /// they never saw) in any order. The queue always physically holds a receive for every
    /// receive a member holds (no RNR), never more than its depth (no failed post), and while
    /// no more than its capacity was written off, a member under its floor gets its floor.
    #[test]
    fn the_queue_holds_every_held_receive_and_never_overflows(
        capacity in 16u32..200,
        floor in 1u32..10,
        steps in proptest::collection::vec(step(), 0..400),
    ) {
        let mut ledger = SharedSrqLedger::new(capacity, floor);
        let depth = ledger.depth();
        let mut members: [Option<Member>; 6] = [None; 6];
        let mut physical = 0u32;
        for (who, step) in steps {
            let slot = &mut members[who];
            match (step, slot.as_mut()) {
                (Step::Join, None) if ledger.join().is_ok() => {
                    *slot = Some(Member::default());
                }
                (Step::Take(want), Some(member)) => {
                    ledger.settle(member.settled, member.holding);
                    let floor_room = ledger.floor().saturating_sub(member.holding);
                    let granted = ledger.take(member.holding, want);
                    if ledger.lost() < ledger.capacity() {
                        prop_assert!(granted.receives >= want.min(floor_room), "floor refused");
                    }
                    physical += granted.post;
                    ledger.on_posted(granted.post);
                    member.holding += granted.receives;
                    member.settled = member.holding;
                }
                (Step::Consume, Some(member)) if member.holding > 0 => {
                    member.holding -= 1;
                    physical -= 1;
                }
                (Step::GiveBack(n), Some(member)) => {
                    ledger.settle(member.settled, member.holding);
                    let n = n.min(member.holding);
                    ledger.give_back(member.holding, n);
                    member.holding -= n;
                    member.settled = member.holding;
                }
                (Step::Leave { outstanding, consumed_unseen }, Some(member)) => {
                    ledger.settle(member.settled, member.holding);
                    let outstanding = outstanding.min(member.holding);
                    let unseen = consumed_unseen.min(outstanding);
                    physical -= unseen;
                    ledger.leave(member.holding, outstanding);
                    *slot = None;
                }
                _ => {}
            }
            let held: u32 = members.iter().flatten().map(|m| m.holding).sum();
            prop_assert!(physical >= held, "{physical} posted for {held} held");
            prop_assert!(physical <= depth, "{physical} posted on a queue of {depth}");
        }
    }
}
