//! A receive connection whose peer sends more than it was given receives for, on a NIC whose
//! receive queue other connections share: the connection fails naming the rail, its QPs go at
//! once (it takes no more shared receives), and the queue admits no new connection.

use super::*;
use crate::proto::imm::Imm;
use crate::proto::rail_mask::RailMask;

#[test]
fn an_imm_beyond_what_a_connection_holds_fails_it_and_retires_its_queue() {
    let _guard = env_lock();
    let first = connect_pair(&[]);
    let second = connect_pair(&[]);
    transfer(&second, 4096);
    assert!(first.recv.queue_pairs() > 0);
    let imm = Imm {
        slot: 0,
        mask: RailMask::SCALE_UP,
        size_q: 1,
    };
    let error = first
        .recv
        .receive_imm(Rail::ScaleUp, imm.to_wire())
        .expect_err("an IMM with no receive held is a protocol error");
    assert!(
        error
            .message
            .contains("sup SRQ delivered more IMMs than receives posted"),
        "{error}"
    );
    assert_eq!(first.recv.queue_pairs(), 0, "its QPs went at once");
    assert!(pair_failure(&first).message.contains("protocol error"));
    // The other connection on the same queue still moves bytes; a new one gets a new queue.
    transfer(&second, 65_536);
    let third = connect_pair(&[]);
    transfer(&third, 4096);
    let device = third.ctx.plugin.device(0).unwrap();
    assert_eq!(
        device.receives[1].queues_alive(),
        2,
        "the retired queue and a new one"
    );
    for pair in [first, second, third] {
        close(pair);
    }
}
