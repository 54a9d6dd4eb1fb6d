//! Unit and property tests of the handshake messages.

use super::*;
use proptest::prelude::*;

fn endpoint(seed: u8) -> RailEndpoint {
    RailEndpoint {
        present: true,
        address: [seed; 16],
        endpoint: [seed.wrapping_mul(3); RAIL_ENDPOINT_BYTES],
    }
}

fn request() -> ConnectRequest {
    let mut qp_nums = [0u32; MAX_QPS];
    qp_nums[..6].copy_from_slice(&[11, 12, 21, 22, 23, 24]);
    ConnectRequest {
        mode: Mode::Vanilla,
        class: PathClass::IntraIsland,
        prefix_len: 24,
        sout_qps: 2,
        sup_qps: 4,
        connector_addr: [10, 0, 0, 1],
        acceptor_addr: [10, 0, 0, 2],
        rails: [endpoint(1), endpoint(2)],
        qp_nums,
        fifo_addr: 0x7F00_0000_1000,
        fifo_rkeys: [0x100, 0x200],
        conn_id: 0x1234_0001,
        process: 0xABCD_0000_0000_0001,
        failover: true,
        secret: 0x5EC2_E700_0000_0001,
    }
}

fn reply() -> ConnectReply {
    let request = request();
    ConnectReply {
        refusal: None,
        mode: request.mode,
        class: request.class,
        sout_qps: 2,
        sup_qps: 4,
        rails: [endpoint(3), endpoint(4)],
        qp_nums: request.qp_nums,
        records_addr: 0x7F00_0000_2000,
        records_rkeys: [0x300, 0x400],
        conn_id: 0x5678_0002,
        process: 0xABCD_0000_0000_0002,
        failover: true,
    }
}

#[test]
fn lengths() {
    assert_eq!(CONNECT_REQUEST_LEN, 284);
    assert_eq!(CONNECT_REPLY_LEN, 268);
    assert_eq!(&READY.encode()[..8], b"1YDRBIPM");
    assert_eq!(&LinkAnswer { link: 5 }.encode()[..8], b"1KNLBIPM");
    assert_eq!(&request().encode()[..8], b"1KSHBIPM");
}

#[test]
fn roundtrip_examples() {
    assert_eq!(ConnectRequest::decode(&request().encode()), Ok(request()));
    assert_eq!(ConnectReply::decode(&reply().encode()), Ok(reply()));
    let refused = ConnectReply {
        refusal: Some(Refusal::ClassMismatch),
        ..reply()
    };
    assert_eq!(ConnectReply::decode(&refused.encode()), Ok(refused));
    assert_eq!(Ready::decode(&READY.encode()), Ok(READY));
    assert_eq!(Ready::decode(&[0; READY_LEN]), Err(WireError::BadMagic(0)));
    for link in [READY.existing_link, READY.fresh_link] {
        let answer = LinkAnswer { link };
        assert_eq!(LinkAnswer::decode(&answer.encode(), &READY), Ok(answer));
    }
}

const READY: Ready = Ready {
    existing_link: 7,
    fresh_link: 9,
};

#[test]
fn a_link_proposal_and_answer_must_make_sense() {
    let no_fresh = Ready {
        existing_link: 3,
        fresh_link: 0,
    };
    assert!(Ready::decode(&no_fresh.encode()).is_err());
    let same = Ready {
        existing_link: 3,
        fresh_link: 3,
    };
    assert!(Ready::decode(&same.encode()).is_err());
    // An answer naming a link that was not proposed (or "none", 0) is refused.
    let fresh_only = Ready {
        existing_link: 0,
        ..READY
    };
    for link in [0, 8, READY.existing_link] {
        let answer = LinkAnswer { link };
        assert!(
            LinkAnswer::decode(&answer.encode(), &fresh_only).is_err(),
            "{link}"
        );
    }
}

#[test]
fn header_rejected_first() {
    let mut bytes = request().encode();
    bytes[0] ^= 1;
    assert!(matches!(
        ConnectRequest::decode(&bytes),
        Err(WireError::BadMagic(_))
    ));
    let mut bytes = request().encode();
    bytes[8] = 1;
    assert_eq!(
        ConnectRequest::decode(&bytes),
        Err(WireError::BadVersion(1)),
        "the version before opaque endpoints"
    );
    let mut bytes = reply().encode();
    bytes[8] = 9;
    assert_eq!(ConnectReply::decode(&bytes), Err(WireError::BadVersion(9)));
    // A peer of the version before the connection's secret is told which versions differ.
    let mut bytes = request().encode();
    bytes[8] = 4;
    let refused = ConnectRequest::decode(&bytes).unwrap_err();
    assert_eq!(refused, WireError::BadVersion(4));
    assert!(
        refused
            .to_string()
            .contains("version 4, this build speaks 5"),
        "{refused}"
    );
}

#[test]
fn a_request_without_a_secret_is_refused() {
    let request = ConnectRequest {
        secret: 0,
        ..request()
    };
    assert_eq!(
        ConnectRequest::decode(&request.encode()),
        Err(WireError::BadField {
            field: "secret",
            value: 0
        })
    );
}

#[test]
fn fields_validated() {
    let cases: [(usize, u8, &str); 9] = [
        (12, 2, "mode"),
        (13, 2, "class"),
        (14, 33, "prefix_len"),
        (15, 17, "sout_qps"),
        (16, 17, "sup_qps"),
        (17, 2, "failover"),
        (18, 1, "reserved"),
        (28, 2, "rail.present"),
        (29, 1, "reserved"),
    ];
    for (offset, value, field) in cases {
        let mut bytes = request().encode();
        bytes[offset] = value;
        assert_eq!(
            ConnectRequest::decode(&bytes),
            Err(WireError::BadField {
                field,
                value: u64::from(value)
            }),
            "offset {offset}"
        );
    }
    let mut bytes = reply().encode();
    bytes[12] = 7;
    assert_eq!(
        ConnectReply::decode(&bytes),
        Err(WireError::BadField {
            field: "refusal",
            value: 7
        })
    );
}

#[test]
fn agreement() {
    let request = request();
    let (mode, class) = (Mode::Vanilla, PathClass::IntraIsland);
    assert_eq!(check_agreement(&request, mode, class, 2, 4), Ok(()));
    assert_eq!(
        check_agreement(&request, Mode::Advanced, class, 2, 4),
        Err(Refusal::ModeMismatch)
    );
    assert_eq!(
        check_agreement(&request, mode, PathClass::InterIsland, 2, 0),
        Err(Refusal::ClassMismatch)
    );
    assert_eq!(
        check_agreement(&request, mode, class, 2, 3),
        Err(Refusal::QpCountMismatch)
    );
    let mut no_sup = request;
    no_sup.rails[1].present = false;
    assert_eq!(
        check_agreement(&no_sup, mode, class, 2, 4),
        Err(Refusal::RailMissing)
    );
    let inter = ConnectRequest {
        class: PathClass::InterIsland,
        sup_qps: 0,
        ..no_sup
    };
    assert_eq!(
        check_agreement(&inter, mode, PathClass::InterIsland, 2, 0),
        Ok(())
    );
}

#[test]
fn refusal_codes() {
    for code in 1..=6 {
        let refusal = Refusal::from_code(code).unwrap();
        assert_eq!(refusal.code(), code);
        assert!(!refusal.describe().is_empty());
    }
    assert_eq!(Refusal::from_code(0), None);
    assert_eq!(Refusal::from_code(7), None);
    assert!(Refusal::ModeMismatch.to_string().contains("MPIB_MODE"));
    assert!(WireError::BadVersion(3).to_string().contains("version 3"));
}

fn any_endpoint() -> impl Strategy<Value = RailEndpoint> {
    (
        any::<bool>(),
        any::<[u8; 16]>(),
        any::<[u8; RAIL_ENDPOINT_BYTES]>(),
    )
        .prop_map(|(present, address, endpoint)| RailEndpoint {
            present,
            address,
            endpoint,
        })
}

fn any_layout() -> impl Strategy<Value = (Mode, PathClass, u8, u8)> {
    (any::<bool>(), any::<bool>(), 0u8..=16, 0u8..=16).prop_map(|(advanced, inter, a, b)| {
        let mode = if advanced {
            Mode::Advanced
        } else {
            Mode::Vanilla
        };
        let class = if inter {
            PathClass::InterIsland
        } else {
            PathClass::IntraIsland
        };
        (mode, class, a, b)
    })
}

fn any_qp_nums() -> impl Strategy<Value = [u32; MAX_QPS]> {
    proptest::collection::vec(any::<u32>(), MAX_QPS).prop_map(|words| words.try_into().unwrap())
}

proptest! {
    #[test]
    fn request_roundtrip(
        (mode, class, sout_qps, sup_qps) in any_layout(),
        prefix_len in 0u8..=32,
        addrs in any::<([u8; 4], [u8; 4])>(),
        rails in [any_endpoint(), any_endpoint()],
        qp_nums in any_qp_nums(),
        words in any::<(u64, [u32; 2], u64, u64)>(),
        failover in any::<bool>(),
        secret in 1..=u64::MAX,
    ) {
        let request = ConnectRequest {
            mode, class, prefix_len, sout_qps, sup_qps,
            connector_addr: addrs.0, acceptor_addr: addrs.1, rails, qp_nums,
            fifo_addr: words.0, fifo_rkeys: words.1, conn_id: words.2,
            process: words.3, failover, secret,
        };
        prop_assert_eq!(ConnectRequest::decode(&request.encode()), Ok(request));
    }

    #[test]
    fn reply_roundtrip(
        refusal in 0u8..=6,
        (mode, class, sout_qps, sup_qps) in any_layout(),
        rails in [any_endpoint(), any_endpoint()],
        qp_nums in any_qp_nums(),
        records in any::<(u64, [u32; 2], u64, u64)>(),
        failover in any::<bool>(),
    ) {
        let reply = ConnectReply {
            refusal: Refusal::from_code(refusal), mode, class, sout_qps, sup_qps, rails,
            qp_nums, records_addr: records.0, records_rkeys: records.1,
            conn_id: records.2, process: records.3, failover,
        };
        prop_assert_eq!(ConnectReply::decode(&reply.encode()), Ok(reply));
    }

    #[test]
    fn arbitrary_bytes_never_panic(
        body in proptest::collection::vec(any::<u8>(), CONNECT_REQUEST_LEN),
        keep_header in any::<bool>(),
    ) {
        let mut request: [u8; CONNECT_REQUEST_LEN] = body.clone().try_into().unwrap();
        let mut reply: [u8; CONNECT_REPLY_LEN] =
            body[..CONNECT_REPLY_LEN].try_into().unwrap();
        if keep_header {
            // Get past magic and version so the field checks are exercised too.
            let header = &self::request().encode()[..HEADER_LEN];
            request[..HEADER_LEN].copy_from_slice(header);
            reply[..HEADER_LEN].copy_from_slice(header);
        }
        if let Ok(decoded) = ConnectRequest::decode(&request) {
            prop_assert_eq!(decoded.encode(), request);
        }
        if let Ok(decoded) = ConnectReply::decode(&reply) {
            prop_assert_eq!(decoded.encode(), reply);
        }
        if let Ok(decoded) = Ready::decode(&request[..READY_LEN].try_into().unwrap()) {
            prop_assert_eq!(&decoded.encode()[..], &request[..READY_LEN]);
            let answer: [u8; LINK_ANSWER_LEN] = request[..LINK_ANSWER_LEN].try_into().unwrap();
            let _ = LinkAnswer::decode(&answer, &decoded);
        }
    }
}
