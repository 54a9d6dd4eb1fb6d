//! The agent registration IPC messages (seed 001 §2.C.1).
//!
//! Why: in advanced mode every connection registers its SOUT and SUP address pairs with the
//! agent, which answers with the hint slot whose `sup_bw` the plugin then reads on every
//! `isend`; closing the connection deregisters it so the slot can be reused. The messages are
//! fixed-size (32-byte request, 16-byte response) with little-endian fields so the agent can be
//! written in any language; IP addresses stay as network-order bytes, exactly as on the wire.
//!
//! Layout: request = magic u32, kind u32 (1 register, 2 deregister), conn_id u64, sout_src,
//! sout_dst, sup_src, sup_dst (4 bytes each; zero for deregister). Response = magic u32,
//! status i32, hint_slot u32, reserved u32 (zero).

use super::cursor::{Reader, Writer};
use super::hint::HINT_MAX_ENTRIES;

/// "MPIR".
pub const AGENT_MAGIC: u32 = 0x4D50_4952;
/// Bytes of a request.
pub const REGISTER_LEN: usize = 32;
/// Bytes of a response.
pub const RESPONSE_LEN: usize = 16;

const KIND_REGISTER: u32 = 1;
const KIND_DEREGISTER: u32 = 2;

/// Plugin to agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AgentRequest {
    /// A connection was established: assign it a hint slot.
    Register {
        /// Connection identifier ([`conn_id`]).
        conn_id: u64,
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
        conn_id: u64,
    },
}

/// Agent to plugin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AgentResponse {
    /// 0 on success; negative on failure (the plugin then runs without hints: all SOUT).
    pub status: i32,
    /// Hint slot assigned (meaningful for a successful registration).
    pub hint_slot: u32,
}

fn magic_error(magic: u32) -> String {
    format!("agent message magic {magic:#010x}, expected {AGENT_MAGIC:#010x} (\"MPIR\")")
}

impl AgentRequest {
    /// The request as sent.
    pub fn encode(&self) -> [u8; REGISTER_LEN] {
        let mut bytes = [0u8; REGISTER_LEN];
        let mut writer = Writer::new(&mut bytes);
        writer.u32(AGENT_MAGIC);
        match *self {
            AgentRequest::Register {
                conn_id,
                sout_src,
                sout_dst,
                sup_src,
                sup_dst,
            } => {
                writer.u32(KIND_REGISTER);
                writer.u64(conn_id);
                for address in [sout_src, sout_dst, sup_src, sup_dst] {
                    writer.bytes(&address);
                }
            }
            AgentRequest::Deregister { conn_id } => {
                writer.u32(KIND_DEREGISTER);
                writer.u64(conn_id);
                writer.bytes(&[0; 16]);
            }
        }
        debug_assert_eq!(writer.position(), REGISTER_LEN);
        bytes
    }

    /// Parse and validate a request.
    pub fn decode(b: &[u8; REGISTER_LEN]) -> Result<Self, String> {
        let mut reader = Reader::new(b);
        let magic = reader.u32();
        if magic != AGENT_MAGIC {
            return Err(magic_error(magic));
        }
        let kind = reader.u32();
        let conn_id = reader.u64();
        let addresses: [[u8; 4]; 4] = [
            reader.array(),
            reader.array(),
            reader.array(),
            reader.array(),
        ];
        match kind {
            KIND_REGISTER => Ok(AgentRequest::Register {
                conn_id,
                sout_src: addresses[0],
                sout_dst: addresses[1],
                sup_src: addresses[2],
                sup_dst: addresses[3],
            }),
            KIND_DEREGISTER if addresses == [[0; 4]; 4] => Ok(AgentRequest::Deregister { conn_id }),
            KIND_DEREGISTER => Err(format!(
                "agent deregister request for connection {conn_id:#x} has non-zero address bytes"
            )),
            other => Err(format!(
                "agent request kind {other} (expected {KIND_REGISTER} register or \
                 {KIND_DEREGISTER} deregister)"
            )),
        }
    }
}

impl AgentResponse {
    /// The response as sent.
    pub fn encode(&self) -> [u8; RESPONSE_LEN] {
        let mut bytes = [0u8; RESPONSE_LEN];
        let mut writer = Writer::new(&mut bytes);
        writer.u32(AGENT_MAGIC);
        writer.i32(self.status);
        writer.u32(self.hint_slot);
        writer.u32(0);
        debug_assert_eq!(writer.position(), RESPONSE_LEN);
        bytes
    }

    /// Parse and validate a response.
    pub fn decode(b: &[u8; RESPONSE_LEN]) -> Result<Self, String> {
        let mut reader = Reader::new(b);
        let magic = reader.u32();
        if magic != AGENT_MAGIC {
            return Err(magic_error(magic));
        }
        let status = reader.i32();
        let hint_slot = reader.u32();
        let reserved = reader.u32();
        if reserved != 0 {
            return Err(format!(
                "agent response reserved field is {reserved:#x}, expected 0"
            ));
        }
        Ok(AgentResponse { status, hint_slot })
    }

    /// The usable hint slot: `Some` only for a successful response with a slot inside the SHM.
    pub fn slot(&self) -> Option<usize> {
        let slot = self.hint_slot as usize;
        (self.status == 0 && slot < HINT_MAX_ENTRIES).then_some(slot)
    }
}

/// Connection identifier `pid << 16 | counter`, unique per connection per process
/// (seed 001 §2.C.1).
pub const fn conn_id(pid: u32, counter: u16) -> u64 {
    ((pid as u64) << 16) | counter as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn request_layout() {
        let request = AgentRequest::Register {
            conn_id: 0x0102_0304_0506_0708,
            sout_src: [10, 0, 0, 1],
            sout_dst: [10, 0, 0, 2],
            sup_src: [192, 168, 0, 1],
            sup_dst: [192, 168, 0, 2],
        };
        let bytes = request.encode();
        assert_eq!(&bytes[..4], b"RIPM");
        assert_eq!(bytes[4..8], [1, 0, 0, 0]);
        assert_eq!(bytes[8], 0x08);
        assert_eq!(bytes[16..20], [10, 0, 0, 1]);
        assert_eq!(bytes[28..32], [192, 168, 0, 2]);
        assert_eq!(AgentRequest::decode(&bytes), Ok(request));
        let deregister = AgentRequest::Deregister { conn_id: 7 };
        assert_eq!(AgentRequest::decode(&deregister.encode()), Ok(deregister));
    }

    #[test]
    fn request_errors() {
        let mut bytes = AgentRequest::Deregister { conn_id: 7 }.encode();
        bytes[20] = 1;
        assert!(AgentRequest::decode(&bytes)
            .unwrap_err()
            .contains("non-zero"));
        bytes[4] = 3;
        assert!(AgentRequest::decode(&bytes).unwrap_err().contains("kind 3"));
        bytes[0] = 0;
        assert!(AgentRequest::decode(&bytes).unwrap_err().contains("magic"));
    }

    #[test]
    fn response_layout_and_slot() {
        let response = AgentResponse {
            status: -2,
            hint_slot: 5,
        };
        let bytes = response.encode();
        assert_eq!(bytes[4..8], (-2i32).to_le_bytes());
        assert_eq!(AgentResponse::decode(&bytes), Ok(response));
        assert_eq!(response.slot(), None);
        assert_eq!(
            AgentResponse {
                status: 0,
                hint_slot: 5
            }
            .slot(),
            Some(5)
        );
        assert_eq!(
            AgentResponse {
                status: 0,
                hint_slot: 256
            }
            .slot(),
            None
        );
        let mut bytes = bytes;
        bytes[12] = 1;
        assert!(AgentResponse::decode(&bytes)
            .unwrap_err()
            .contains("reserved"));
    }

    #[test]
    fn conn_id_packing() {
        assert_eq!(conn_id(0x1234, 0x0005), 0x1234_0005);
        assert_eq!(conn_id(u32::MAX, u16::MAX), 0xFFFF_FFFF_FFFF);
    }

    proptest! {
        #[test]
        fn request_roundtrip(conn in any::<u64>(), addresses in any::<[[u8; 4]; 4]>(), register in any::<bool>()) {
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
            prop_assert_eq!(AgentRequest::decode(&request.encode()), Ok(request));
        }

        #[test]
        fn response_roundtrip(status in any::<i32>(), hint_slot in any::<u32>()) {
            let response = AgentResponse { status, hint_slot };
            prop_assert_eq!(AgentResponse::decode(&response.encode()), Ok(response));
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in any::<[u8; REGISTER_LEN]>()) {
            if let Ok(request) = AgentRequest::decode(&bytes) {
                prop_assert_eq!(request.encode(), bytes);
            }
            let response: [u8; RESPONSE_LEN] = bytes[..RESPONSE_LEN].try_into().unwrap();
            if let Ok(decoded) = AgentResponse::decode(&response) {
                prop_assert_eq!(decoded.encode(), response);
            }
        }
    }
}
