//! Tests of the slot table (slots.rs).
use super::*;
use proptest::prelude::*;

fn pair(a: u8, b: u8) -> Pair {
    Pair {
        src: Ipv4Addr::new(10, 0, 0, a),
        dst: Ipv4Addr::new(10, 0, 0, b),
    }
}

fn key(pid: u32, id: u32) -> ConnectionKey {
    user_key(1000, pid, id)
}

fn user_key(uid: u32, pid: u32, id: u32) -> ConnectionKey {
    ConnectionKey {
        process: Process {
            pid,
            start_ticks: 1,
            uid,
        },
        conn_id: id,
    }
}

/// One process registering made-up pairs stops at its limit, and so does its user's second
/// process at the user's; another user still gets slots, a capped process still joins a
/// flow that has one, and a process below its limit again (a flow closed) takes new ones.
#[test]
fn one_process_or_user_cannot_take_every_slot() {
    let limits = FlowLimits {
        per_process: 4,
        per_user: 6,
    };
    let mut t = SlotTable::new(16);
    let mut taken = 0;
    for b in 1..=100u8 {
        match t.register(
            user_key(1000, 1, u32::from(b)),
            pair(1, b),
            pair(5, b),
            limits,
        ) {
            Ok(Registered::NewFlow(_)) => taken += 1,
            Err(Refused::ProcessLimit) => {}
            other => panic!("pair {b}: {other:?}"),
        }
    }
    assert_eq!((taken, t.used()), (4, 4), "the process stops at its limit");
    // The per-user limit holds while another user has connections.
    assert_eq!(
        t.register(user_key(1001, 4, 1), pair(4, 1), pair(8, 1), limits),
        Ok(Registered::NewFlow(4))
    );
    for b in 101..=110u8 {
        let result = t.register(
            user_key(1000, 2, u32::from(b)),
            pair(1, b),
            pair(5, b),
            limits,
        );
        assert!(
            matches!(result, Ok(_) | Err(Refused::UserLimit)),
            "{result:?}"
        );
    }
    assert_eq!(t.user_flow_count(1000), 6, "the user stops at its limit");
    assert_eq!(
        t.register(user_key(1001, 3, 1), pair(2, 1), pair(6, 1), limits),
        Ok(Registered::NewFlow(7)),
        "another user still gets a slot"
    );
    assert_eq!(
        t.register(user_key(1000, 1, 500), pair(2, 1), pair(6, 1), limits),
        Ok(Registered::Joined(7)),
        "joining a flow with a slot costs none"
    );
    assert_eq!(t.process_flow_count(user_key(1000, 1, 0).process), 5);
    // Process 1 is over its limit now (it joined a fifth flow): two of its flows must close
    // before it may open one.
    let new_flow = |t: &mut SlotTable, pid: u32, b: u8| {
        t.register(
            user_key(1000, pid, 600 + u32::from(b)),
            pair(3, b),
            pair(7, b),
            limits,
        )
    };
    assert_eq!(new_flow(&mut t, 1, 1), Err(Refused::ProcessLimit));
    for id in [1, 2] {
        assert_eq!(
            t.deregister(user_key(1000, 1, id)).map(|(_, freed)| freed),
            Some(true)
        );
    }
    assert!(matches!(new_flow(&mut t, 1, 2), Ok(Registered::NewFlow(_))));
    assert_eq!(new_flow(&mut t, 1, 3), Err(Refused::ProcessLimit));
    assert_eq!(
        new_flow(&mut t, 2, 4),
        Err(Refused::UserLimit),
        "the user's flows: 3 of process 1, 2 of process 2 and the shared one"
    );
}

/// A user alone on the node is held to the per-process limit only: its processes together take
/// slots past the per-user limit (the limit would keep slots for nobody). Once another user has
/// a connection, the first takes no new flow while past its limit; once that user is gone, it
/// may again. Flows taken back after a restart name no user.
#[test]
fn a_lone_user_is_held_to_the_process_limit_only() {
    let limits = FlowLimits {
        per_process: 4,
        per_user: 6,
    };
    let mut t = SlotTable::new(16);
    t.recover(15, pair(9, 9));
    let new_flow = |t: &mut SlotTable, uid: u32, pid: u32, b: u8| {
        t.register(
            user_key(uid, pid, u32::from(b)),
            pair(1, b),
            pair(5, b),
            limits,
        )
    };
    for b in 1..=12u8 {
        let pid = u32::from(b - 1) / 4 + 1;
        assert!(
            matches!(new_flow(&mut t, 1000, pid, b), Ok(Registered::NewFlow(_))),
            "flow {b} of process {pid}"
        );
    }
    assert_eq!(new_flow(&mut t, 1000, 1, 13), Err(Refused::ProcessLimit));
    assert_eq!(t.user_flow_count(1000), 12, "past the per-user limit of 6");
    assert!(matches!(
        new_flow(&mut t, 1001, 7, 20),
        Ok(Registered::NewFlow(_))
    ));
    assert_eq!(
        new_flow(&mut t, 1000, 4, 14),
        Err(Refused::UserLimit),
        "another user is present"
    );
    assert_eq!(
        t.register(user_key(1000, 4, 99), pair(1, 20), pair(5, 20), limits),
        Ok(Registered::Joined(12)),
        "joining costs no slot, even past the limit"
    );
    t.deregister(user_key(1001, 7, 20));
    assert!(!t.another_user_present(1000));
    assert!(matches!(
        new_flow(&mut t, 1000, 4, 14),
        Ok(Registered::NewFlow(_))
    ));
}

#[test]
fn one_slot_per_pair_freed_with_its_last_connection() {
    let mut t = SlotTable::new(2);
    assert_eq!(
        t.register(key(1, 1), pair(1, 2), pair(5, 6), FlowLimits::NONE),
        Ok(Registered::NewFlow(0))
    );
    assert_eq!(
        t.register(key(2, 1), pair(1, 2), pair(5, 6), FlowLimits::NONE),
        Ok(Registered::Joined(0))
    );
    assert_eq!(
        t.register(key(1, 2), pair(1, 3), pair(5, 7), FlowLimits::NONE),
        Ok(Registered::NewFlow(1))
    );
    assert_eq!(
        t.register(key(1, 3), pair(1, 4), pair(5, 8), FlowLimits::NONE),
        Err(Refused::NoFreeSlots),
        "full"
    );
    assert_eq!(
        t.register(key(2, 1), pair(1, 2), pair(5, 6), FlowLimits::NONE),
        Ok(Registered::Joined(0)),
        "the same key again stays"
    );
    assert_eq!(t.connections(), 3);
    // Key (1, 2) moves from pair 1->3 (its only connection) to 1->2: slot 1 is freed.
    assert_eq!(
        t.register(key(1, 2), pair(1, 2), pair(5, 6), FlowLimits::NONE),
        Ok(Registered::Joined(0))
    );
    assert_eq!(t.take_freed(), vec![1]);
    assert_eq!(t.find(1, 2), Some(key(1, 2)));
    assert_eq!(t.deregister(key(1, 2)), Some((0, false)));
    assert_eq!(t.deregister(key(1, 1)), Some((0, false)));
    assert_eq!(t.deregister(key(2, 1)), Some((0, true)));
    assert_eq!(t.deregister(key(2, 1)), None, "twice");
    assert_eq!(
        t.register(key(1, 3), pair(1, 4), pair(5, 8), FlowLimits::NONE),
        Ok(Registered::NewFlow(0))
    );
    assert_eq!((t.used(), t.connections()), (1, 1));
}

#[test]
fn exited_processes_lose_their_connections() {
    let mut t = SlotTable::new(4);
    t.register(key(1, 1), pair(1, 2), pair(5, 6), FlowLimits::NONE)
        .unwrap();
    t.register(key(2, 1), pair(1, 2), pair(5, 6), FlowLimits::NONE)
        .unwrap();
    t.register(key(2, 2), pair(1, 3), pair(5, 7), FlowLimits::NONE)
        .unwrap();
    let gone: Vec<Process> = t.processes().into_iter().filter(|p| p.pid == 2).collect();
    let (dropped, freed) = t.reclaim_exited(&gone);
    assert_eq!((dropped, freed), (2, vec![1]));
    assert_eq!(t.flow(0).unwrap().connections.len(), 1);
}

#[test]
fn recovered_flows_rejoin_or_are_freed_when_unused() {
    let mut t = SlotTable::new(8);
    t.recover(5, pair(1, 2));
    t.recover(6, pair(1, 3));
    assert_eq!(
        t.register(key(9, 1), pair(1, 2), pair(5, 6), FlowLimits::NONE),
        Ok(Registered::Joined(5))
    );
    assert_eq!(
        t.free_unused_recovered(&BTreeSet::from([6])),
        Vec::<u32>::new()
    );
    assert_eq!(t.free_unused_recovered(&BTreeSet::new()), vec![6]);
    assert!(!t.flow(5).unwrap().recovered);
}

proptest! {
    /// Whatever the sequence, pairs and slots stay one-to-one and every connection is in
    /// exactly the flow its index names.
    #[test]
    fn indexes_stay_consistent(ops in proptest::collection::vec((0u8..3, 1u32..6, 1u8..5), 0..200)) {
        let mut t = SlotTable::new(3);
        let limits = FlowLimits { per_process: 2, per_user: 2 };
        let key = |pid: u32, id: u32| user_key(pid % 2, pid, id);
        for (op, pid, b) in ops {
            match op {
                0 => {
                    let before = t.process_flow_count(key(pid, 0).process);
                    let result = t.register(key(pid, u32::from(b)), pair(1, b), pair(5, b), limits);
                    if let Ok(Registered::NewFlow(_)) = result {
                        prop_assert!(before < limits.per_process);
                    }
                }
                1 => { t.deregister(key(pid, u32::from(b))); }
                _ => {
                    let gone: Vec<Process> = t.processes().into_iter().filter(|p| p.pid == pid).collect();
                    t.reclaim_exited(&gone);
                }
            }
            let pairs: BTreeSet<Pair> = t.flows().map(|f| f.pair).collect();
            prop_assert_eq!(pairs.len(), t.used());
            prop_assert!(t.used() <= 3);
            let total: usize = t.flows().map(|f| f.connections.len()).sum();
            prop_assert_eq!(total, t.connections());
            prop_assert_eq!(t.per_process.values().sum::<usize>(), t.connections());
            prop_assert!(t.take_freed().iter().all(|s| t.flow(*s).is_none()));
            for f in t.flows() {
                prop_assert!(!f.connections.is_empty());
            }
            // The per-process and per-user counts are those the flows give.
            let mut by_process: BTreeMap<Process, BTreeMap<u32, usize>> = BTreeMap::new();
            let mut by_user: BTreeMap<u32, BTreeMap<u32, usize>> = BTreeMap::new();
            for f in t.flows() {
                for k in &f.connections {
                    *by_process.entry(k.process).or_default().entry(f.slot).or_default() += 1;
                    *by_user.entry(k.process.uid).or_default().entry(f.slot).or_default() += 1;
                }
            }
            prop_assert_eq!(&by_process, &t.process_flows);
            prop_assert_eq!(&by_user, &t.user_flows);
        }
    }
}
