//! Every committed fuzz input through its target, on the stable toolchain: the seed corpus
//! (`fuzz/corpus/<target>/`) and the inputs that once found a bug (`fuzz/regressions/<target>/`,
//! each a regression test). `MPIB_BLESS=1` rewrites the seeds from the encoders below.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use mpib_fuzzing::TARGETS;
use mpib_proto::agent_wire::{AgentRequest, AgentResponse, AgentStatus};
use mpib_proto::cts::{CompletionRecord, CtsEntry};
use mpib_proto::hint::{encode_header, HINT_FILE_LEN, HINT_HEADER_LEN};
use mpib_proto::imm::Imm;
use mpib_proto::island::PathClass;
use mpib_proto::mode::Mode;
use mpib_proto::rail_mask::RailMask;
use mpib_proto::tcp_wire::{Header, Hello, Kind};
use mpib_proto::wire::{
    ConnectReply, ConnectRequest, LinkAnswer, RailEndpoint, Ready, MAX_QPS, RAIL_ENDPOINT_BYTES,
};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz")
}

fn inputs(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|entries| entries.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    files.retain(|p| p.is_file());
    files.sort();
    files
}

/// A RoCE rail at 10.100.0.`last`, its endpoint as the verbs fabric encodes it (tag 1, MTU 3,
/// Ethernet, GID index 1, LID 0, the IPv4-mapped GID).
fn endpoint(last: u8) -> RailEndpoint {
    let mut address = [0u8; 16];
    address[10..12].copy_from_slice(&[0xff, 0xff]);
    address[12..].copy_from_slice(&[10, 100, 0, last]);
    let mut endpoint = [0u8; RAIL_ENDPOINT_BYTES];
    endpoint[..4].copy_from_slice(&[1, 3, 2, 1]);
    endpoint[6..22].copy_from_slice(&address);
    RailEndpoint {
        present: true,
        address,
        endpoint,
    }
}

fn handshake_seeds() -> Vec<Vec<u8>> {
    let request = ConnectRequest {
        mode: Mode::Advanced,
        class: PathClass::IntraIsland,
        prefix_len: 24,
        sout_qps: 2,
        sup_qps: 2,
        connector_addr: [10, 100, 0, 1],
        acceptor_addr: [10, 100, 0, 2],
        rails: [endpoint(1), endpoint(1)],
        qp_nums: core::array::from_fn(|i| 17 + i as u32),
        fifo_addr: 0x7f00_0000_1000,
        fifo_rkeys: [0x1234, 0x5678],
        conn_id: 0x0001_0002,
        process: 0x5eed_0000_0000_0001,
        failover: true,
        secret: 0x5eed_5ec2_e700_0001,
    };
    let reply = ConnectReply {
        refusal: None,
        mode: Mode::Advanced,
        class: PathClass::IntraIsland,
        sout_qps: 2,
        sup_qps: 2,
        rails: [endpoint(2), endpoint(2)],
        qp_nums: [33; MAX_QPS],
        records_addr: 0x7f00_0000_2000,
        records_rkeys: [0x9abc, 0xdef0],
        conn_id: 0x0003_0004,
        process: 0x5eed_0000_0000_0002,
        failover: true,
    };
    let ready = Ready {
        existing_link: 7,
        fresh_link: 8,
    };
    vec![
        [&[0u8][..], &request.encode()].concat(),
        [&[1u8][..], &reply.encode()].concat(),
        [&[2u8][..], &ready.encode()].concat(),
        [
            &[3u8][..],
            &ready.encode(),
            &LinkAnswer { link: 7 }.encode(),
        ]
        .concat(),
    ]
}

fn link_frame_seeds() -> Vec<Vec<u8>> {
    use mpib_proto::link_frame::{encode_handshake, encode_notice, NoticeKind, Step};
    let request = &handshake_seeds()[0][1..];
    let mut to_acceptor = vec![0u8];
    encode_handshake(&mut to_acceptor, Step::Open, 9, 0x5eed, request);
    encode_handshake(&mut to_acceptor, Step::ToAcceptor, 9, 0, &[1; 24]);
    encode_notice(&mut to_acceptor, NoticeKind::Closed, 3, "");
    let mut to_connector = vec![1u8];
    encode_handshake(&mut to_connector, Step::ToConnector, 9, 0, &[2; 268]);
    encode_handshake(
        &mut to_connector,
        Step::Abandoned,
        9,
        0,
        b"its accept failed",
    );
    encode_notice(
        &mut to_connector,
        NoticeKind::Failed,
        4,
        "the sup rail: retry exceeded",
    );
    vec![to_acceptor, to_connector]
}

fn cts_seeds() -> Vec<Vec<u8>> {
    let entry = CtsEntry {
        addr: 0x7f00_0000_4000,
        size: 1 << 20,
        rkeys: [7, 8],
        nreqs: 2,
        tag: 9,
        idx: 5,
        padding: [0; 24],
    };
    let checks = [5u8, 0, 3, 0, 9]; // slot, entry, rails, taken, tag
    vec![
        [&entry.to_le_bytes()[..], &checks].concat(),
        [entry.to_le_bytes(), entry.to_le_bytes()].concat(),
    ]
}

fn seeds(target: &str) -> Vec<Vec<u8>> {
    match target {
        "handshake" => handshake_seeds(),
        "link_frames" => link_frame_seeds(),
        "cts_entry" => cts_seeds(),
        "tcp_wire" => {
            let hello = Hello {
                target_qpn: 0x1234_0100,
                source_qpn: 0x1234_0101,
                source_addr: [10, 100, 1, 1],
                source_port: 40_000,
                secret: 0x5eed_5ec2_e700_0001,
            };
            let write = Header {
                kind: Kind::WriteWithImm,
                flags: 1,
                status: 0,
                length: 4096,
                seq: 1,
                imm: 0x0300_0001,
                rkey: 0x2468,
                addr: 0x7f00_0000_4000,
            };
            let ack = Header::reply(Kind::Ack, 1, 0, 0);
            vec![
                [&[0u8][..], &hello.encode()].concat(),
                [&[1u8][..], &write.encode(), &ack.encode()].concat(),
            ]
        }
        "completion_record" => {
            let record = CompletionRecord {
                sizes: [4096, 1, 0, 0, 0, 0, 0, 0],
                rail_bytes: [1365, 2732],
            };
            vec![record.to_le_bytes().to_vec()]
        }
        "imm" => {
            let imm = Imm {
                slot: 3,
                mask: RailMask::BOTH,
                size_q: 32,
            };
            vec![
                imm.encode().to_le_bytes().to_vec(),
                imm.to_wire().to_le_bytes().to_vec(),
            ]
        }
        "agent_message" => {
            let register = AgentRequest::Register {
                conn_id: 0x1234_0001,
                sout_src: [10, 0, 0, 1],
                sout_dst: [10, 0, 0, 2],
                sup_src: [10, 1, 0, 1],
                sup_dst: [10, 1, 0, 2],
            };
            let answer = AgentResponse::Register {
                status: AgentStatus::Success,
                hint_slot: 7,
            };
            vec![
                register.encode().as_bytes().to_vec(),
                AgentRequest::Deregister { conn_id: 5 }
                    .encode()
                    .as_bytes()
                    .to_vec(),
                answer.encode().as_bytes().to_vec(),
                b"set 3 512\n".to_vec(),
                b"10.0.0.0/8".to_vec(),
            ]
        }
        // Mode 1: a valid file (the fuzzer overwrites its header); mode 2: patches.
        "probes_file" => vec![vec![1u8], vec![2u8, 0x40, 0x00, 0x00, 0x00, 0x07]],
        "hint_file" => {
            let mut file = vec![0u8; HINT_FILE_LEN];
            file[..HINT_HEADER_LEN].copy_from_slice(&encode_header());
            vec![
                [&[3u8][..], &file].concat(),
                vec![0x83, 2, 0, 0, 0, 0, 2, 0, 0],
            ]
        }
        other => panic!("no seeds for target {other}"),
    }
}

#[test]
fn every_committed_input_passes_its_target() {
    let bless = std::env::var_os("MPIB_BLESS").is_some();
    let mut replayed = 0;
    for (name, target) in TARGETS {
        let corpus = fuzz_dir().join("corpus").join(name);
        if bless {
            std::fs::create_dir_all(&corpus).unwrap();
            for (i, seed) in seeds(name).iter().enumerate() {
                std::fs::write(corpus.join(format!("seed-{i}")), seed).unwrap();
            }
        }
        let seeded = inputs(&corpus);
        assert!(!seeded.is_empty(), "no seed corpus in {}", corpus.display());
        let regressions = inputs(&fuzz_dir().join("regressions").join(name));
        for input in seeded.iter().chain(&regressions) {
            target(&std::fs::read(input).unwrap());
            replayed += 1;
        }
    }
    assert!(replayed >= TARGETS.len());
}

#[test]
fn the_targets_take_any_short_input() {
    // Every length from 0 to 64 of a few byte patterns: the edges a corpus may not hold.
    for (_, target) in TARGETS {
        for len in 0..=64 {
            for fill in [0u8, 0xff, 0x5a] {
                target(&vec![fill; len]);
            }
        }
    }
}
