use super::*;
use proptest::prelude::*;

fn frames(input: &[u8]) -> (Vec<Frame<'_>>, Decoded<'_>) {
    let mut found = Vec::new();
    let mut at = 0;
    loop {
        match decode(&input[at..]) {
            Decoded::Frame(frame, used) => {
                found.push(frame);
                at += used;
            }
            other => return (found, other),
        }
    }
}

#[test]
fn frames_round_trip_and_stop_at_an_incomplete_one() {
    let mut out = Vec::new();
    encode_notice(&mut out, NoticeKind::Failed, 7, "rail down");
    encode_handshake(&mut out, Step::Open, 9, 0xabc, &[1, 2, 3]);
    encode_notice(&mut out, NoticeKind::Closed, 8, "");
    assert_eq!(
        out.len(),
        notice_len("rail down") + HANDSHAKE_HEADER + 3 + notice_len("")
    );
    let (found, rest) = frames(&out);
    assert_eq!(
        rest,
        Decoded::Incomplete,
        "the end of the input is no error"
    );
    assert_eq!(
        found,
        vec![
            Frame::Notice {
                kind: NoticeKind::Failed,
                comm: 7,
                text: b"rail down"
            },
            Frame::Handshake {
                step: Step::Open,
                handshake: 9,
                listen: 0xabc,
                payload: &[1, 2, 3]
            },
            Frame::Notice {
                kind: NoticeKind::Closed,
                comm: 8,
                text: b""
            },
        ]
    );
    for cut in 1..out.len() {
        let (found, rest) = frames(&out[..cut]);
        assert!(found.len() <= 3);
        assert_eq!(
            rest,
            Decoded::Incomplete,
            "a prefix of {cut} bytes is incomplete, not invalid"
        );
    }
}

#[test]
fn long_texts_are_cut_at_a_character_boundary() {
    let text = "é".repeat(NOTICE_TEXT_MAX);
    let mut out = Vec::new();
    encode_notice(&mut out, NoticeKind::Failed, 1, &text);
    let Decoded::Frame(Frame::Notice { text: kept, .. }, _) = decode(&out) else {
        panic!("a notice");
    };
    assert_eq!(kept.len(), NOTICE_TEXT_MAX);
    assert!(std::str::from_utf8(kept).is_ok());
    assert_eq!(abandon_reason(&text).len(), HANDSHAKE_PAYLOAD_MAX);
}

#[test]
fn foreign_bytes_and_bad_fields_are_invalid() {
    assert!(matches!(decode(b"GET / HTTP/1.1"), Decoded::Invalid(_)));
    assert!(matches!(decode(b"MPIBX"), Decoded::Invalid(_)));
    assert_eq!(decode(b"MPIBH"), Decoded::Incomplete);
    let mut notice = Vec::new();
    encode_notice(&mut notice, NoticeKind::Closed, 1, "");
    notice[8] = 9;
    assert!(matches!(decode(&notice), Decoded::Invalid(why) if why.contains("kind 9")));
    let mut long = Vec::new();
    encode_handshake(&mut long, Step::ToAcceptor, 1, 0, &[]);
    long[25..27].copy_from_slice(&600u16.to_le_bytes());
    assert!(matches!(decode(&long), Decoded::Invalid(why) if why.contains("600 bytes")));
}

#[test]
fn each_end_takes_only_its_peers_steps() {
    let mut connector = Inbox::new(End::Connector);
    let mut acceptor = Inbox::new(End::Acceptor);
    for step in [Step::Open, Step::ToAcceptor] {
        assert!(matches!(
            connector.file(step, 1, 0, &[]),
            Filed::Violation(_)
        ));
    }
    assert!(matches!(
        acceptor.file(Step::ToConnector, 1, 0, &[]),
        Filed::Violation(_)
    ));
    assert_eq!(
        acceptor.file(Step::Open, 5, 77, b"request"),
        Filed::Opened {
            handshake: 5,
            listen: 77,
            request: b"request".to_vec()
        }
    );
    assert!(acceptor.expect(5));
    assert!(!acceptor.expect(5), "an identifier is expected once");
    assert!(matches!(
        acceptor.file(Step::Open, 5, 77, &[]),
        Filed::Violation(_)
    ));
    assert!(matches!(
        acceptor.file(Step::Open, 0, 77, &[]),
        Filed::Violation(_)
    ));
}

#[test]
fn a_handshake_gets_one_message_at_a_time_and_hears_an_abandon() {
    let mut inbox = Inbox::new(End::Connector);
    assert_eq!(
        inbox.file(Step::ToConnector, 3, 0, b"late"),
        Filed::Ignored,
        "not expected"
    );
    assert!(inbox.expect(3));
    assert_eq!(inbox.take(3), None);
    assert_eq!(inbox.file(Step::ToConnector, 3, 0, b"reply"), Filed::Kept);
    assert_eq!(inbox.take(3), Some(Ok(b"reply".to_vec())));
    assert_eq!(inbox.take(3), None, "taken once");
    assert_eq!(inbox.file(Step::ToConnector, 3, 0, b"one"), Filed::Kept);
    assert!(matches!(
        inbox.file(Step::ToConnector, 3, 0, b"two"),
        Filed::Refused { handshake: 3, .. }
    ));
    assert!(matches!(inbox.take(3), Some(Err(why)) if why.contains("two handshake messages")));
    assert!(inbox.expect(4));
    assert_eq!(
        inbox.file(Step::Abandoned, 4, 0, b"no listen comm"),
        Filed::Kept
    );
    assert_eq!(
        inbox.file(Step::ToConnector, 4, 0, b"after"),
        Filed::Ignored
    );
    assert_eq!(inbox.take(4), Some(Err("no listen comm".to_string())));
    assert_eq!(
        inbox.take(4),
        Some(Err("no listen comm".to_string())),
        "it stays given up"
    );
    inbox.forget(4);
    assert_eq!(inbox.take(4), None);
}

#[test]
fn opens_past_the_bound_are_refused() {
    let mut inbox = Inbox::new(End::Acceptor);
    for handshake in 1..=HANDSHAKES_MAX as u64 {
        assert!(matches!(
            inbox.file(Step::Open, handshake, 1, &[]),
            Filed::Opened { .. }
        ));
        assert!(inbox.expect(handshake));
    }
    let refused = inbox.file(Step::Open, HANDSHAKES_MAX as u64 + 1, 1, &[]);
    assert!(matches!(refused, Filed::Refused { .. }), "{refused:?}");
    assert!(!inbox.expect(HANDSHAKES_MAX as u64 + 1));
    inbox.forget(1);
    assert!(inbox.has_room());
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        Just(Step::Open),
        Just(Step::ToAcceptor),
        Just(Step::ToConnector),
        Just(Step::Abandoned)
    ]
}

proptest! {
    /// Whatever bytes arrive, in whatever pieces: decoding never panics, never reads past the
    /// input, and frames cut anywhere decode the same as whole.
    #[test]
    fn any_bytes_decode_without_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        let (found, _) = frames(&bytes);
        prop_assert!(found.len() <= bytes.len() / NOTICE_HEADER);
    }

    #[test]
    fn encoded_frames_decode_alike_in_any_split(
        payloads in proptest::collection::vec(
            (step(), any::<u64>(), any::<u64>(), proptest::collection::vec(any::<u8>(), 0..300)),
            1..6,
        ),
        split in any::<prop::sample::Index>(),
    ) {
        let mut out = Vec::new();
        for (step, handshake, listen, payload) in &payloads {
            encode_handshake(&mut out, *step, *handshake, *listen, payload);
        }
        let cut = split.index(out.len() + 1);
        let (before, _) = frames(&out[..cut]);
        let (whole, rest) = frames(&out);
        prop_assert_eq!(rest, Decoded::Incomplete);
        prop_assert_eq!(whole.len(), payloads.len());
        prop_assert!(before.len() <= whole.len());
        prop_assert_eq!(&whole[..before.len()], &before[..]);
    }

    /// An inbox fed anything holds at most one message per expected handshake, and never more
    /// handshakes than its bound.
    #[test]
    fn an_inbox_stays_bounded(
        frames in proptest::collection::vec((step(), 0u64..8, proptest::collection::vec(any::<u8>(), 0..16)), 0..64),
        acceptor in any::<bool>(),
    ) {
        let end = if acceptor { End::Acceptor } else { End::Connector };
        let mut inbox = Inbox::new(end);
        inbox.expect(1);
        for (step, handshake, payload) in frames {
            if let Filed::Opened { handshake, .. } = inbox.file(step, handshake, 0, &payload) {
                prop_assert!(inbox.expect(handshake));
            }
            prop_assert!(inbox.open() <= HANDSHAKES_MAX);
            if let Some(Ok(message)) = inbox.take(1) {
                prop_assert!(message.len() < 16);
            }
        }
    }
}
