//! The agent registration messages, byte for byte the reference MPIB agent interface
//! (`include/mpib_agent.h`; docs/AGENT.md, 'Writing your own agent').
//!
//! Why: in advanced mode every connection registers its SOUT and SUP address pairs with the
//! agent, which answers with the hint slot whose `sup_bw` the plugin then reads on every
//! `isend`; closing the connection deregisters it so the slot can be reused. An agent written for
//! the reference interface must be able to serve this plugin and the reverse, so the layout is
//! the reference's exactly: every field packed and little-endian, except the IPv4 addresses,
//! which stay in network order as on the wire.
//!
//! | message | bytes | layout after the header |
//! |---|---|---|
//! | header | 8 | magic u32 `0x4D504952` ("MPIR"), msg_len u16 (the whole message), msg_type u8 (1 register, 2 deregister, 128 response), reserved u8 |
//! | register request | 28 | conn_id u32, sout_src, sout_dst, sup_src, sup_dst (4 bytes each) |
//! | register response | 16 | status u8, reserved[3], hint_slot u32 |
//! | deregister request | 12 | conn_id u32 |
//! | deregister response | 12 | status u8, reserved[3] |
//!
//! Reserved bytes are written as zero and ignored when read, as the reference does.

use super::cursor::{Reader, Writer};
use super::hint::HINT_MAX_ENTRIES;

/// "MPIR" (bytes `52 49 50 4D` on the wire).
pub const AGENT_MAGIC: u32 = 0x4D50_4952;
/// Bytes of the header every message starts with.
pub const HEADER_LEN: usize = 8;
/// Bytes of a register request.
pub const REGISTER_REQUEST_LEN: usize = 28;
/// Bytes of a register response.
pub const REGISTER_RESPONSE_LEN: usize = 16;
/// Bytes of a deregister request.
pub const DEREGISTER_REQUEST_LEN: usize = 12;
/// Bytes of a deregister response.
pub const DEREGISTER_RESPONSE_LEN: usize = 12;
/// The longest message of the interface.
pub const MAX_MESSAGE_LEN: usize = REGISTER_REQUEST_LEN;
/// `msg_type` of a register request.
pub const MSG_REGISTER: u8 = 1;
/// `msg_type` of a deregister request.
pub const MSG_DEREGISTER: u8 = 2;
/// `msg_type` of every response.
pub const MSG_RESPONSE: u8 = 128;

/// The agent's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AgentStatus {
    /// 0: done (for a registration, `hint_slot` is valid).
    Success,
    /// 1: every hint slot is taken.
    NoFreeSlots,
    /// 2: the request was malformed.
    InvalidRequest,
}

impl AgentStatus {
    /// The status byte.
    pub const fn code(self) -> u8 {
        match self {
            AgentStatus::Success => 0,
            AgentStatus::NoFreeSlots => 1,
            AgentStatus::InvalidRequest => 2,
        }
    }

    /// The status of a status byte, `None` for a value the interface does not define.
    pub const fn from_code(code: u8) -> Option<AgentStatus> {
        match code {
            0 => Some(AgentStatus::Success),
            1 => Some(AgentStatus::NoFreeSlots),
            2 => Some(AgentStatus::InvalidRequest),
            _ => None,
        }
    }
}

/// A message's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// Bytes of the whole message, header included.
    pub msg_len: u16,
    /// [`MSG_REGISTER`], [`MSG_DEREGISTER`] or [`MSG_RESPONSE`].
    pub msg_type: u8,
}

impl Header {
    /// Reads the header at the start of `bytes` (at least [`HEADER_LEN`] of them) and checks the
    /// magic; the length and type are the caller's to check against what it expects.
    pub fn decode(bytes: &[u8]) -> Result<Header, String> {
        let Some(head) = bytes.get(..HEADER_LEN) else {
            return Err(format!(
                "agent message of {} bytes is shorter than its {HEADER_LEN}-byte header",
                bytes.len()
            ));
        };
        let mut reader = Reader::new(head);
        let magic = reader.u32();
        if magic != AGENT_MAGIC {
            return Err(format!(
                "agent message magic {magic:#010x}, expected {AGENT_MAGIC:#010x} (\"MPIR\")"
            ));
        }
        let msg_len = reader.u16();
        let msg_type = reader.u8();
        Ok(Header { msg_len, msg_type })
    }

    /// The length a message of `msg_type` must have, `None` for an unknown type (a response's
    /// length depends on what it answers: see [`AgentResponse::decode`]).
    pub const fn request_len(msg_type: u8) -> Option<usize> {
        match msg_type {
            MSG_REGISTER => Some(REGISTER_REQUEST_LEN),
            MSG_DEREGISTER => Some(DEREGISTER_REQUEST_LEN),
            _ => None,
        }
    }
}

/// An encoded message: the first `len` bytes of `bytes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Message {
    bytes: [u8; MAX_MESSAGE_LEN],
    len: usize,
}

impl Message {
    /// The message as sent.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }

    /// Writes a message of `len` bytes and `msg_type`, its body by `body`.
    fn build(len: usize, msg_type: u8, body: impl FnOnce(&mut Writer<'_>)) -> Message {
        let mut bytes = [0u8; MAX_MESSAGE_LEN];
        let mut writer = Writer::new(&mut bytes[..len]);
        writer.u32(AGENT_MAGIC);
        // len <= MAX_MESSAGE_LEN (28): fits u16.
        writer.u16(len as u16);
        writer.u8(msg_type);
        writer.u8(0);
        body(&mut writer);
        debug_assert_eq!(writer.position(), len);
        Message { bytes, len }
    }
}

/// Plugin to agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AgentRequest {
    /// A connection was established: assign it a hint slot.
    Register {
        /// Connection identifier ([`conn_id`]).
        conn_id: u32,
        /// SOUT source address (network order); with `sout_dst` it identifies the flow.
        sout_src: [u8; 4],
        /// SOUT destination address (network order).
        sout_dst: [u8; 4],
        /// SUP source address (network order).
        sup_src: [u8; 4],
        /// SUP destination address (network order).
        sup_dst: [u8; 4],
    },
    /// The connection was closed: release its slot.
    Deregister {
        /// Connection identifier.
        conn_id: u32,
    },
}

impl AgentRequest {
    /// The request as sent.
    pub fn encode(&self) -> Message {
        match *self {
            AgentRequest::Register {
                conn_id,
                sout_src,
                sout_dst,
                sup_src,
                sup_dst,
            } => Message::build(REGISTER_REQUEST_LEN, MSG_REGISTER, |writer| {
                writer.u32(conn_id);
                for address in [sout_src, sout_dst, sup_src, sup_dst] {
                    writer.bytes(&address);
                }
            }),
            AgentRequest::Deregister { conn_id } => {
                Message::build(DEREGISTER_REQUEST_LEN, MSG_DEREGISTER, |writer| {
                    writer.u32(conn_id)
                })
            }
        }
    }

    /// Parses one whole request: `bytes` must be exactly the message its header announces.
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        let header = Header::decode(bytes)?;
        let expected = Header::request_len(header.msg_type).ok_or_else(|| {
            format!(
                "agent request type {} (expected {MSG_REGISTER} register or {MSG_DEREGISTER} \
                 deregister)",
                header.msg_type
            )
        })?;
        if usize::from(header.msg_len) != expected || bytes.len() != expected {
            return Err(format!(
                "agent request type {} is {expected} bytes; its header says {} and {} arrived",
                header.msg_type,
                header.msg_len,
                bytes.len()
            ));
        }
        let mut reader = Reader::new(&bytes[HEADER_LEN..]);
        let conn_id = reader.u32();
        if header.msg_type == MSG_DEREGISTER {
            return Ok(AgentRequest::Deregister { conn_id });
        }
        Ok(AgentRequest::Register {
            conn_id,
            sout_src: reader.array(),
            sout_dst: reader.array(),
            sup_src: reader.array(),
            sup_dst: reader.array(),
        })
    }

    /// Bytes of the response that answers this request.
    pub const fn response_len(&self) -> usize {
        match self {
            AgentRequest::Register { .. } => REGISTER_RESPONSE_LEN,
            AgentRequest::Deregister { .. } => DEREGISTER_RESPONSE_LEN,
        }
    }
}

/// Agent to plugin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AgentResponse {
    /// The answer to a register request.
    Register {
        /// The outcome.
        status: AgentStatus,
        /// The slot assigned (meaningful with [`AgentStatus::Success`]).
        hint_slot: u32,
    },
    /// The answer to a deregister request.
    Deregister {
        /// The outcome.
        status: AgentStatus,
    },
}

impl AgentResponse {
    /// The response as sent.
    pub fn encode(&self) -> Message {
        match *self {
            AgentResponse::Register { status, hint_slot } => {
                Message::build(REGISTER_RESPONSE_LEN, MSG_RESPONSE, |writer| {
                    writer.u8(status.code());
                    writer.bytes(&[0; 3]);
                    writer.u32(hint_slot);
                })
            }
            AgentResponse::Deregister { status } => {
                Message::build(DEREGISTER_RESPONSE_LEN, MSG_RESPONSE, |writer| {
                    writer.u8(status.code());
                    writer.bytes(&[0; 3]);
                })
            }
        }
    }

    /// Parses one whole response; its length says what it answers (16 bytes a registration, 12
    /// a deregistration).
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        let header = Header::decode(bytes)?;
        if header.msg_type != MSG_RESPONSE {
            return Err(format!(
                "agent response type {}, expected {MSG_RESPONSE}",
                header.msg_type
            ));
        }
        if usize::from(header.msg_len) != bytes.len()
            || ![REGISTER_RESPONSE_LEN, DEREGISTER_RESPONSE_LEN].contains(&bytes.len())
        {
            return Err(format!(
                "agent response of {} bytes (header says {}); expected {REGISTER_RESPONSE_LEN} \
                 (register) or {DEREGISTER_RESPONSE_LEN} (deregister)",
                bytes.len(),
                header.msg_len
            ));
        }
        let mut reader = Reader::new(&bytes[HEADER_LEN..]);
        let code = reader.u8();
        let status = AgentStatus::from_code(code).ok_or_else(|| {
            format!("agent status {code} (expected 0 success, 1 no free slots, 2 invalid request)")
        })?;
        let _reserved: [u8; 3] = reader.array();
        if bytes.len() == DEREGISTER_RESPONSE_LEN {
            return Ok(AgentResponse::Deregister { status });
        }
        Ok(AgentResponse::Register {
            status,
            hint_slot: reader.u32(),
        })
    }

    /// The usable hint slot: `Some` only for a successful registration with a slot inside the SHM.
    pub fn slot(&self) -> Option<usize> {
        match *self {
            AgentResponse::Register {
                status: AgentStatus::Success,
                hint_slot,
            } => Some(hint_slot as usize).filter(|slot| *slot < HINT_MAX_ENTRIES),
            _ => None,
        }
    }
}

/// Connection identifier `pid << 16 | counter`, as the reference computes it in 32 bits (the
/// pid's high bits shift out; the counter tells a process's connections apart).
pub const fn conn_id(pid: u32, counter: u16) -> u32 {
    (pid << 16) | counter as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The register request of the reference interface, byte by byte (include/mpib_agent.h).
    const GOLDEN_REGISTER: [u8; 28] = [
        0x52, 0x49, 0x50, 0x4d, // magic "MPIR", little-endian
        28, 0, // msg_len
        1, 0, // msg_type register, reserved
        0x05, 0x00, 0x34, 0x12, // conn_id 0x12340005
        10, 0, 0, 1, 10, 0, 0, 2, // SOUT src, dst (network order)
        192, 168, 0, 1, 192, 168, 0, 2, // SUP src, dst
    ];
    const GOLDEN_REGISTER_RESPONSE: [u8; 16] = [
        0x52, 0x49, 0x50, 0x4d, 16, 0, 128, 0, // header
        0, 0, 0, 0, // status success, reserved
        7, 0, 0, 0, // hint_slot 7
    ];
    const GOLDEN_DEREGISTER: [u8; 12] =
        [0x52, 0x49, 0x50, 0x4d, 12, 0, 2, 0, 0x05, 0x00, 0x34, 0x12];
    const GOLDEN_DEREGISTER_RESPONSE: [u8; 12] =
        [0x52, 0x49, 0x50, 0x4d, 12, 0, 128, 0, 1, 0, 0, 0];

    fn register() -> AgentRequest {
        AgentRequest::Register {
            conn_id: 0x1234_0005,
            sout_src: [10, 0, 0, 1],
            sout_dst: [10, 0, 0, 2],
            sup_src: [192, 168, 0, 1],
            sup_dst: [192, 168, 0, 2],
        }
    }

    #[test]
    fn golden_bytes_both_ways() {
        assert_eq!(register().encode().as_bytes(), GOLDEN_REGISTER);
        assert_eq!(AgentRequest::decode(&GOLDEN_REGISTER), Ok(register()));
        let deregister = AgentRequest::Deregister {
            conn_id: 0x1234_0005,
        };
        assert_eq!(deregister.encode().as_bytes(), GOLDEN_DEREGISTER);
        assert_eq!(AgentRequest::decode(&GOLDEN_DEREGISTER), Ok(deregister));
        let response = AgentResponse::Register {
            status: AgentStatus::Success,
            hint_slot: 7,
        };
        assert_eq!(response.encode().as_bytes(), GOLDEN_REGISTER_RESPONSE);
        assert_eq!(
            AgentResponse::decode(&GOLDEN_REGISTER_RESPONSE),
            Ok(response)
        );
        let response = AgentResponse::Deregister {
            status: AgentStatus::NoFreeSlots,
        };
        assert_eq!(response.encode().as_bytes(), GOLDEN_DEREGISTER_RESPONSE);
        assert_eq!(
            AgentResponse::decode(&GOLDEN_DEREGISTER_RESPONSE),
            Ok(response)
        );
        assert_eq!(register().response_len(), REGISTER_RESPONSE_LEN);
        assert_eq!(deregister.response_len(), DEREGISTER_RESPONSE_LEN);
    }

    #[test]
    fn bad_requests_name_what_is_wrong() {
        let mut wrong_magic = GOLDEN_REGISTER;
        wrong_magic[0] = 0;
        let mut wrong_type = GOLDEN_REGISTER;
        wrong_type[6] = 9;
        let mut wrong_len = GOLDEN_REGISTER;
        wrong_len[4] = 27;
        let mut response_type = GOLDEN_REGISTER;
        response_type[6] = MSG_RESPONSE;
        for (bytes, expect) in [
            (&wrong_magic[..], "magic"),
            (&wrong_type[..], "type 9"),
            (&wrong_len[..], "header says 27"),
            (&GOLDEN_REGISTER[..27], "27 arrived"),
            (&GOLDEN_REGISTER[..5], "shorter than its 8-byte header"),
            (&response_type[..], "type 128"),
            (&GOLDEN_DEREGISTER_RESPONSE[..], "type 128"),
        ] {
            let error = AgentRequest::decode(bytes).unwrap_err();
            assert!(error.contains(expect), "{expect}: {error}");
        }
        // A reserved byte that is not zero is ignored, as the reference does.
        let mut reserved = GOLDEN_REGISTER;
        reserved[7] = 0xff;
        assert_eq!(AgentRequest::decode(&reserved), Ok(register()));
    }

    #[test]
    fn bad_responses_name_what_is_wrong() {
        let mut status = GOLDEN_REGISTER_RESPONSE;
        status[8] = 3;
        let mut request_type = GOLDEN_REGISTER_RESPONSE;
        request_type[6] = MSG_REGISTER;
        let mut length = GOLDEN_REGISTER_RESPONSE;
        length[4] = 12;
        for (bytes, expect) in [
            (&status[..], "status 3"),
            (&request_type[..], "type 1"),
            (&length[..], "header says 12"),
            (&GOLDEN_REGISTER[..], "type 1"),
        ] {
            let error = AgentResponse::decode(bytes).unwrap_err();
            assert!(error.contains(expect), "{expect}: {error}");
        }
    }

    #[test]
    fn only_a_successful_registration_in_range_has_a_slot() {
        let slot = |status, hint_slot| AgentResponse::Register { status, hint_slot }.slot();
        assert_eq!(slot(AgentStatus::Success, 5), Some(5));
        assert_eq!(slot(AgentStatus::Success, 256), None);
        assert_eq!(slot(AgentStatus::NoFreeSlots, 5), None);
        let deregistered = AgentResponse::Deregister {
            status: AgentStatus::Success,
        };
        assert_eq!(deregistered.slot(), None);
    }

    #[test]
    fn conn_id_packing() {
        assert_eq!(conn_id(0x1234, 0x0005), 0x1234_0005);
        // The reference computes it in 32 bits: the pid's high half shifts out.
        assert_eq!(conn_id(0xABCD_1234, 0xFFFF), 0x1234_FFFF);
    }

    proptest! {
        #[test]
        fn request_roundtrip(conn in any::<u32>(), addresses in any::<[[u8; 4]; 4]>(), register in any::<bool>()) {
            let request = if register {
                AgentRequest::Register {
                    conn_id: conn,
                    sout_src: addresses[0],
                    sout_dst: addresses[1],
                    sup_src: addresses[2],
                    sup_dst: addresses[3],
                }
            } else {
                AgentRequest::Deregister { conn_id: conn }
            };
            prop_assert_eq!(AgentRequest::decode(request.encode().as_bytes()), Ok(request));
        }

        #[test]
        fn response_roundtrip(code in 0u8..3, hint_slot in any::<u32>(), register in any::<bool>()) {
            let status = AgentStatus::from_code(code).unwrap();
            let response = if register {
                AgentResponse::Register { status, hint_slot }
            } else {
                AgentResponse::Deregister { status }
            };
            prop_assert_eq!(AgentResponse::decode(response.encode().as_bytes()), Ok(response));
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            // Whatever decodes re-encodes to the same bytes, reserved bytes aside.
            if let Ok(request) = AgentRequest::decode(&bytes) {
                let mut canonical = bytes.clone();
                canonical[7] = 0;
                let encoded = request.encode();
                prop_assert_eq!(encoded.as_bytes(), &canonical[..]);
            }
            if let Ok(response) = AgentResponse::decode(&bytes) {
                prop_assert_eq!(response.encode().as_bytes().len(), bytes.len());
            }
        }
    }
}
