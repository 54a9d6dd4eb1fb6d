use super::*;
use proptest::prelude::*;

const MS: u64 = 1_000_000;

fn settings() -> FailbackSettings {
    FailbackSettings {
        hold_ns: 500 * MS,
        backoff_max_ns: 8_000 * MS,
        attempt_ns: 1_000 * MS,
    }
}

#[test]
fn a_failed_rail_is_tried_a_hold_down_later_and_backs_off_to_the_cap() {
    let mut timer = FailbackTimer::new(settings());
    assert!(timer.is_up() && !timer.due(u64::MAX));
    timer.failed(1_000 * MS);
    assert!(!timer.due(1_499 * MS) && timer.due(1_500 * MS));
    let mut now = 1_500 * MS;
    let mut waits = Vec::new();
    for expected in 1..=6 {
        assert_eq!(timer.start(now), expected);
        assert_eq!(timer.trying(), Some(expected));
        assert!(!timer.expired(now + 999 * MS) && timer.expired(now + 1_000 * MS));
        timer.attempt_failed(now);
        let mut at = now;
        while !timer.due(at) {
            at += MS;
        }
        waits.push((at - now) / MS);
        now = at;
    }
    assert_eq!(waits, vec![500, 1_000, 2_000, 4_000, 8_000, 8_000]);
    timer.restored(now);
    assert!(timer.is_up() && timer.trying().is_none() && !timer.due(u64::MAX));
}

#[test]
fn a_port_that_is_down_holds_attempts_and_its_return_starts_the_hold_down_again() {
    let mut timer = FailbackTimer::new(settings());
    timer.failed(0);
    timer.port(false, 100 * MS);
    assert!(!timer.due(60_000 * MS));
    timer.port(true, 60_000 * MS);
    assert!(!timer.due(60_400 * MS) && timer.due(60_500 * MS));
    // A port that flaps inside the hold-down starts it again.
    timer.port(false, 60_200 * MS);
    timer.port(true, 60_300 * MS);
    assert!(!timer.due(60_700 * MS) && timer.due(60_800 * MS));
}

#[test]
fn a_rail_that_fails_again_soon_after_it_came_back_waits_longer_each_time() {
    let mut timer = FailbackTimer::new(settings());
    let mut now = 0;
    let mut holds = Vec::new();
    for _ in 0..6 {
        timer.failed(now);
        let failed_at = now;
        while !timer.due(now) {
            now += MS;
        }
        holds.push((now - failed_at) / MS);
        timer.start(now);
        timer.restored(now);
        now += 100 * MS; // fails again 100 ms after coming back
    }
    assert_eq!(holds, vec![500, 1_000, 2_000, 4_000, 8_000, 8_000]);
    // A rail that stayed up for ten hold-downs starts from the setting again.
    timer.failed(now + 5_000 * MS);
    assert!(timer.due(now + 5_500 * MS) && !timer.due(now + 5_499 * MS));
}

#[test]
fn messages_name_their_queue_pairs_and_refuse_too_many() {
    let offer = RestoreMessage::new(3, Rail::ScaleUp, &[7, 8, 9]).unwrap();
    assert_eq!(offer.qp_nums(), &[7, 8, 9]);
    assert_eq!(
        RestoreMessage::decode_offer(&offer.encode_offer()),
        Ok(offer)
    );
    // An offer is not an answer, and an unsealed mailbox is nothing yet.
    assert_eq!(
        RestoreMessage::decode_answer(&offer.encode_offer()),
        Err(RestoreError::Unsealed)
    );
    assert_eq!(
        RestoreMessage::decode_offer(&[0; RESTORE_MESSAGE_LEN]),
        Err(RestoreError::Unsealed)
    );
    assert_eq!(
        RestoreMessage::new(1, Rail::ScaleOut, &[1; RESTORE_MAX_QPS + 1]),
        Err(RestoreError::TooManyQueuePairs(RESTORE_MAX_QPS as u8 + 1))
    );
    // The attempt travels in 16 bits: an answer still matches its attempt past 65,535.
    let late = RestoreMessage::new(65_537, Rail::ScaleUp, &[7]).unwrap();
    let decoded = RestoreMessage::decode_answer(&late.encode_answer()).unwrap();
    assert!(decoded.answers(65_537, Rail::ScaleUp) && !decoded.answers(2, Rail::ScaleUp));
    assert!(!decoded.answers(65_537, Rail::ScaleOut));
    let refusal = RestoreMessage::new(4, Rail::ScaleOut, &[]).unwrap();
    assert!(RestoreMessage::decode_answer(&refusal.encode_answer())
        .unwrap()
        .qp_nums()
        .is_empty());
    let mut bad = offer.encode_offer();
    bad[6] = 9;
    assert_eq!(
        RestoreMessage::decode_offer(&bad),
        Err(RestoreError::BadRail(9))
    );
    let mut bad = offer.encode_offer();
    bad[7] = 17;
    assert_eq!(
        RestoreMessage::decode_offer(&bad),
        Err(RestoreError::TooManyQueuePairs(17))
    );
}

proptest! {
    #[test]
    fn messages_round_trip(
        attempt in 1u32..0xFFFF,
        up in any::<bool>(),
        qp_nums in proptest::collection::vec(any::<u32>(), 0..=RESTORE_MAX_QPS),
    ) {
        let rail = if up { Rail::ScaleUp } else { Rail::ScaleOut };
        let message = RestoreMessage::new(attempt, rail, &qp_nums).unwrap();
        prop_assert_eq!(RestoreMessage::decode_offer(&message.encode_offer()), Ok(message));
        prop_assert_eq!(RestoreMessage::decode_answer(&message.encode_answer()), Ok(message));
        prop_assert_eq!(message.qp_nums(), &qp_nums[..]);
    }

    #[test]
    fn any_bytes_decode_without_panic(bytes in proptest::collection::vec(any::<u8>(), RESTORE_MESSAGE_LEN)) {
        let mut message = [0u8; RESTORE_MESSAGE_LEN];
        message.copy_from_slice(&bytes);
        let _ = RestoreMessage::decode_offer(&message);
        let _ = RestoreMessage::decode_answer(&message);
    }

    /// Whatever happens, the timer is due only while the rail is down and no attempt is under
    /// way, and never twice in a row without a failure in between.
    #[test]
    fn the_timer_is_due_only_while_waiting(steps in proptest::collection::vec((0u8..6, 0u64..3_000), 1..64)) {
        let mut timer = FailbackTimer::new(settings());
        let mut now = 0u64;
        for (step, advance) in steps {
            now += advance * MS;
            match step {
                0 => timer.failed(now),
                1 => timer.port(false, now),
                2 => timer.port(true, now),
                3 => if timer.due(now) { timer.start(now); },
                4 => timer.attempt_failed(now),
                _ => if timer.trying().is_some() { timer.restored(now) },
            }
            if timer.due(now) {
                prop_assert!(!timer.is_up() && timer.trying().is_none());
            }
            if timer.is_up() {
                prop_assert!(!timer.due(u64::MAX) && !timer.expired(u64::MAX));
            }
        }
    }
}
