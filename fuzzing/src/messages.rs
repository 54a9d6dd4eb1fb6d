//! Targets for the wire messages: the connection handshake, the frames of the control link, the
//! CTS entry and the completion record a peer writes into our memory, the RDMA immediate word,
//! and the agent socket's messages (both directions) with the agent's control commands.

use mpib_proto::agent_wire::{AgentRequest, AgentResponse, Header};
use mpib_proto::cts::{
    match_tag, Advertised, CompletionRecord, CtsEntry, CTS_ENTRY_SIZE, MAX_RECVS,
};
use mpib_proto::imm::Imm;
use mpib_proto::link_frame::{self, Decoded, End, Filed, Frame, Inbox, HANDSHAKES_MAX};
use mpib_proto::rail_mask::RailMask;
use mpib_proto::tcp_wire::{self, Hello, HEADER_LEN, HELLO_LEN};
use mpib_proto::wire::{ConnectReply, ConnectRequest, LinkAnswer, Ready};

/// The first `N` bytes of `data`, zero-padded: a decoder of fixed-size messages sees every
/// prefix the fuzzer tries.
fn fixed<const N: usize>(data: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    let n = data.len().min(N);
    out[..n].copy_from_slice(&data[..n]);
    out
}

/// The handshake a peer sends over the control socket: the first byte picks the message
/// (connect request, connect reply, ready with its link proposal, the link answer to a ready),
/// the rest is the message.
pub fn handshake(data: &[u8]) {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    match which % 4 {
        0 => {
            if let Ok(request) = ConnectRequest::decode(&fixed(rest)) {
                assert_eq!(ConnectRequest::decode(&request.encode()), Ok(request));
            }
        }
        1 => {
            if let Ok(reply) = ConnectReply::decode(&fixed(rest)) {
                assert_eq!(ConnectReply::decode(&reply.encode()), Ok(reply));
            }
        }
        2 => {
            if let Ok(ready) = Ready::decode(&fixed(rest)) {
                assert_eq!(Ready::decode(&ready.encode()), Ok(ready));
            }
        }
        _ => {
            let ready = Ready::decode(&fixed(rest)).unwrap_or(Ready {
                existing_link: 1,
                fresh_link: 2,
            });
            let answer = rest.get(mpib_proto::wire::READY_LEN..).unwrap_or_default();
            if let Ok(answer) = LinkAnswer::decode(&fixed(answer), &ready) {
                assert!(answer.link == ready.fresh_link || answer.link == ready.existing_link);
            }
        }
    }
}

/// What a peer sends on a control link (src/net/observe/link.rs): the first byte picks the end
/// that reads it, the rest is the stream. Every frame decoded re-encodes to the same bytes, and
/// the end's inbox stays within its bounds whatever it is fed; each handshake it opens is
/// expected, so later frames reach it.
pub fn link_frames(data: &[u8]) {
    let Some((&which, mut input)) = data.split_first() else {
        return;
    };
    let end = if which % 2 == 0 {
        End::Acceptor
    } else {
        End::Connector
    };
    let mut inbox = Inbox::new(end);
    loop {
        let (frame, used) = match link_frame::decode(input) {
            Decoded::Frame(frame, used) => (frame, used),
            Decoded::Incomplete | Decoded::Invalid(_) => return,
        };
        let mut again = Vec::new();
        match frame {
            Frame::Notice { kind, comm, text } => {
                if let Ok(text) = std::str::from_utf8(text) {
                    link_frame::encode_notice(&mut again, kind, comm, text);
                    assert_eq!(again, &input[..used]);
                }
            }
            Frame::Handshake {
                step,
                handshake,
                listen,
                payload,
            } => {
                link_frame::encode_handshake(&mut again, step, handshake, listen, payload);
                assert_eq!(again, &input[..used]);
                if let Filed::Opened { handshake, .. } =
                    inbox.file(step, handshake, listen, payload)
                {
                    assert!(
                        inbox.expect(handshake),
                        "an open the inbox let through fits"
                    );
                }
                assert!(inbox.open() <= HANDSHAKES_MAX);
                let _ = inbox.take(handshake);
            }
        }
        input = &input[used..];
    }
}

/// A clear-to-send entry the receiver writes into the sender's FIFO (64 bytes), then the checks
/// the sender runs on it: validation against every slot, entry and rail mask the rest of the
/// input names, and tag matching over a slot of such entries.
pub fn cts_entry(data: &[u8]) {
    let entry = CtsEntry::from_le_bytes(&fixed(data));
    assert_eq!(CtsEntry::from_le_bytes(&entry.to_le_bytes()), entry);
    let rest = data.get(CTS_ENTRY_SIZE..).unwrap_or_default();
    let [slot, index, rails, taken, tag]: [u8; 5] = fixed(rest);
    let _ = entry.validate(usize::from(slot), usize::from(index), RailMask(rails));
    let entries: Vec<Advertised> = data
        .chunks(CTS_ENTRY_SIZE)
        .take(MAX_RECVS + 1)
        .map(|chunk| Advertised::from(&CtsEntry::from_le_bytes(&fixed(chunk))))
        .collect();
    if let Some(at) = match_tag(&entries, taken, u32::from(tag)) {
        assert!(
            at < MAX_RECVS && taken & (1 << at) == 0,
            "matched a taken or extra entry"
        );
    }
}

/// The completion record the sender's leader rail writes with the signalling WRITE (48 bytes):
/// every byte is data, so it must round-trip exactly.
pub fn completion_record(data: &[u8]) {
    let bytes = fixed(data);
    let record = CompletionRecord::from_le_bytes(&bytes);
    assert_eq!(record.to_le_bytes(), bytes);
}

/// The 32-bit immediate of a WRITE_WITH_IMM, as it arrives (wire order) and as decoded.
pub fn imm(data: &[u8]) {
    let raw = u32::from_le_bytes(fixed(data));
    let imm = Imm::decode(raw);
    assert_eq!(Imm::decode(imm.encode()), imm);
    assert_eq!(imm.encode(), raw, "every value decodes, and back");
    let _ = imm.size_bytes();
    let imm = Imm::from_wire(raw);
    assert_eq!(Imm::from_wire(imm.to_wire()), imm);
}

/// The agent socket's bytes: a header, a request (what the agent reads from a plugin or any
/// local client), a response (what the plugin reads from whoever owns the socket), and, when
/// the bytes are text, a line on the agent's control socket.
pub fn agent_message(data: &[u8]) {
    let _ = Header::decode(data);
    if let Ok(request) = AgentRequest::decode(data) {
        assert_eq!(
            AgentRequest::decode(request.encode().as_bytes()),
            Ok(request)
        );
    }
    if let Ok(response) = AgentResponse::decode(data) {
        assert_eq!(
            AgentResponse::decode(response.encode().as_bytes()),
            Ok(response)
        );
        let _ = response.slot();
    }
    if let Ok(line) = std::str::from_utf8(data) {
        if let Ok(command) = mpib_agent::control::Command::parse(line) {
            assert_eq!(
                mpib_agent::control::Command::parse(&command.encode()),
                Ok(command)
            );
        }
        let _ = mpib_agent::config::Subnet::parse(line);
    }
}

/// What a stranger can send to a tcp fabric rail's port: the hello (first byte even) or a run of
/// message headers (odd). Whatever decodes re-encodes to the same bytes, so no field the
/// decoder accepted was lost or invented.
pub fn tcp_wire(data: &[u8]) {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    if which % 2 == 0 {
        let bytes = fixed::<HELLO_LEN>(rest);
        if let Ok(hello) = Hello::decode(&bytes) {
            assert_eq!(hello.encode(), bytes);
        }
        return;
    }
    for chunk in rest.chunks(HEADER_LEN) {
        let bytes = fixed::<HEADER_LEN>(chunk);
        match tcp_wire::Header::decode(&bytes) {
            Ok(header) => assert_eq!(header.encode(), bytes),
            Err(why) => assert!(!why.is_empty()),
        }
    }
}
