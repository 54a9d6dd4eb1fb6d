//! The shared receive queues of a loopback NIC: how connections join them, what a take posts,
//! what leaving gives back, and the NIC's `max_srq` named when no queue can be made.

use super::*;
use crate::fabric::loopback::tests::serial;
use crate::fabric::Fabric;

fn receives(faults: &str) -> (impl Drop, Arc<NicBudget>, SharedReceives) {
    let (guard, fabric) = serial(faults);
    let device = fabric.open("loop1", Rail::ScaleUp).expect("open");
    let budget = Arc::new(NicBudget::new(device.info(), Rail::ScaleUp));
    let shared = SharedReceives::new(device, Arc::clone(&budget), Rail::ScaleUp);
    (guard, budget, shared)
}

#[test]
fn connections_share_a_queue_until_their_floors_fill_half_of_it() {
    let (_serial, budget, shared) = receives("");
    let per_queue = SharedSrqLedger::new(SHARED_SRQ_CAPACITY, SHARED_SRQ_FLOOR).most_members();
    let mut members: Vec<Membership> = (0..per_queue).map(|_| shared.join().unwrap()).collect();
    assert_eq!(shared.queues_alive(), 1);
    assert_eq!(budget.in_use()[2], 1, "one SRQ of the NIC's max_srq");
    assert_eq!(members[0].queue().counts().members(), per_queue);
    members.push(shared.join().unwrap());
    assert_eq!(shared.queues_alive(), 2);
    assert_eq!(budget.in_use()[2], 2);
    drop(members.pop());
    assert_eq!(
        shared.queues_alive(),
        1,
        "a queue goes with its last connection"
    );
    assert_eq!(budget.in_use()[2], 1);
    drop(members);
    assert_eq!((shared.queues_alive(), budget.in_use()[2]), (0, 0));
}

#[test]
fn a_take_posts_what_it_grants_and_leaving_writes_off_only_the_outstanding() {
    let (_serial, _budget, shared) = receives("");
    let mut member = shared.join().unwrap();
    let taken = member.take(0, 17).unwrap();
    assert_eq!(taken.receives, 17);
    assert!(taken.posted);
    assert_eq!(taken.room, SHARED_SRQ_CAPACITY - 17, "{taken:?}");
    // Its IMMs consumed 5; the next take settles them and posts nothing (the spare covers it).
    let again = member.take(12, 10).unwrap();
    assert_eq!((again.receives, again.posted), (10, false));
    assert_eq!(
        again.room,
        taken.room + 5 - 10,
        "5 consumed, 10 more granted"
    );
    let queue = Arc::clone(member.queue());
    assert_eq!(queue.counts().granted(), 22);
    member.leave(22, 3);
    let ledger = queue.counts();
    assert_eq!(
        (ledger.members(), ledger.granted(), ledger.lost()),
        (0, 0, 3)
    );
}

#[test]
fn a_connection_dropped_without_leaving_writes_off_what_it_held() {
    let (_serial, _budget, shared) = receives("");
    let keep = shared.join().unwrap();
    let mut failed = shared.join().unwrap();
    failed.take(0, 4).unwrap();
    drop(failed);
    let ledger = keep.queue().counts();
    assert_eq!(
        (ledger.members(), ledger.granted(), ledger.lost()),
        (1, 0, 4)
    );
}

#[test]
fn a_nic_at_max_srq_refuses_a_new_queue_and_names_the_limit() {
    let (_serial, budget, shared) = receives("max_srq=sup:1");
    let per_queue = SharedSrqLedger::new(SHARED_SRQ_CAPACITY, SHARED_SRQ_FLOOR).most_members();
    let members: Vec<Membership> = (0..per_queue).map(|_| shared.join().unwrap()).collect();
    let error = shared.join().err().expect("refused").to_string();
    assert!(error.contains("holds 1 of 1 SRQs (max_srq)"), "{error}");
    assert!(
        error.contains("a new shared receive queue needs 1"),
        "{error}"
    );
    assert!(error.contains("loop1"), "{error}");
    assert_eq!(budget.in_use()[2], 1, "the refused queue took nothing");
    drop(members);
    assert!(shared.join().is_ok(), "room again once the queue is gone");
}
