//! The bytes on a tcp fabric queue pair's connection (src/fabric/tcp): a hello that names the
//! QP pair and proves the connection's secret, then messages of a fixed 32-byte header and, for
//! writes and read responses, the payload.
//!
//! Why here, in the sans-IO crate: these are bytes a stranger can send to a rail's port, so
//! their decoders are pure functions, property-tested and fuzzed (fuzzing/src) like the
//! handshake's.
//!
//! Why explicit little-endian fields, validated on decode: the two ends are separate processes,
//! possibly different builds, and a header taken on faith would size a copy into registered
//! memory. Every kind, flag and reserved field is checked; a length above
//! [`MAX_MESSAGE_BYTES`] is refused before any byte is placed.

/// "MPIBTCP2": the first bytes of every QP connection (2: the hello carries the secret).
pub const HELLO_MAGIC: u64 = 0x4D50_4942_5443_5032;
/// Bytes of the hello.
pub const HELLO_LEN: usize = 32;
/// Bytes of a message header.
pub const HEADER_LEN: usize = 32;
/// Largest payload of one message (the engine's largest WR is far smaller: one transfer part).
pub const MAX_MESSAGE_BYTES: u32 = 1 << 31;

/// The active side's first bytes: which QP it wants, who it is, and the secret both ends of the
/// connection learnt in its handshake (`wire::ConnectRequest::secret`), which a stranger who
/// did not read that handshake cannot name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    /// The passive side's QP number.
    pub target_qpn: u32,
    /// The active side's QP number.
    pub source_qpn: u32,
    /// The active side's rail address (network order).
    pub source_addr: [u8; 4],
    /// The active side's listening port (its rail's service port).
    pub source_port: u16,
    /// The connection's secret.
    pub secret: u64,
}

impl Hello {
    /// The encoded bytes.
    pub fn encode(&self) -> [u8; HELLO_LEN] {
        let mut out = [0u8; HELLO_LEN];
        out[0..8].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
        out[8..12].copy_from_slice(&self.target_qpn.to_le_bytes());
        out[12..16].copy_from_slice(&self.source_qpn.to_le_bytes());
        out[16..20].copy_from_slice(&self.source_addr);
        out[20..22].copy_from_slice(&self.source_port.to_le_bytes());
        out[24..32].copy_from_slice(&self.secret.to_le_bytes());
        out
    }

    /// Decodes a hello; `Err` names what was wrong.
    pub fn decode(bytes: &[u8; HELLO_LEN]) -> Result<Hello, String> {
        let magic = u64::from_le_bytes(word(bytes, 0));
        if magic == HELLO_MAGIC - 1 {
            return Err("a hello of an older MPIB without the connection's secret".to_string());
        }
        if magic != HELLO_MAGIC {
            return Err(format!("bad hello magic {magic:#x}"));
        }
        if bytes[22..24] != [0, 0] {
            return Err("reserved hello bytes are not zero".to_string());
        }
        Ok(Hello {
            target_qpn: u32::from_le_bytes(word(bytes, 8)),
            source_qpn: u32::from_le_bytes(word(bytes, 12)),
            source_addr: word(bytes, 16),
            source_port: u16::from_le_bytes(word(bytes, 20)),
            secret: u64::from_le_bytes(word(bytes, 24)),
        })
    }
}

/// What a message is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// RDMA_WRITE: `length` payload bytes for `[addr, addr + length)` under `rkey`.
    Write = 1,
    /// RDMA_WRITE_WITH_IMM: the same, then one SRQ receive completed with `imm`.
    WriteWithImm = 2,
    /// RDMA_READ request: send back `[addr, addr + length)` under `rkey`.
    ReadRequest = 3,
    /// RDMA_READ response: `length` payload bytes for the request `seq`.
    ReadResponse = 4,
    /// Every request up to and including `seq` has been executed.
    Ack = 5,
    /// Request `seq` failed with `status` (an `ibv_wc_status` value); the QP is in error.
    Nak = 6,
}

impl Kind {
    fn from_code(code: u8) -> Option<Kind> {
        Some(match code {
            1 => Kind::Write,
            2 => Kind::WriteWithImm,
            3 => Kind::ReadRequest,
            4 => Kind::ReadResponse,
            5 => Kind::Ack,
            6 => Kind::Nak,
            _ => return None,
        })
    }

    /// Whether `length` payload bytes follow the header.
    pub fn has_payload(self) -> bool {
        matches!(self, Kind::Write | Kind::WriteWithImm | Kind::ReadResponse)
    }
}

/// The sender's WR is signaled (informational: every executed request is acknowledged,
/// cumulatively, once per pass of the responder's thread).
pub const FLAG_SIGNALED: u8 = 1;

/// One message header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// What the message is.
    pub kind: Kind,
    /// [`FLAG_SIGNALED`] or 0.
    pub flags: u8,
    /// `Nak` only: the completion status.
    pub status: u8,
    /// Payload bytes (requests: bytes to write or read).
    pub length: u32,
    /// The request's sequence number on this QP (responses: the request answered).
    pub seq: u32,
    /// Immediate data, network order as verbs carries it (`WriteWithImm`).
    pub imm: u32,
    /// Remote key.
    pub rkey: u32,
    /// Remote address.
    pub addr: u64,
}

impl Header {
    /// A response or acknowledgement header with no address.
    pub fn reply(kind: Kind, seq: u32, length: u32, status: u8) -> Header {
        Header {
            kind,
            flags: 0,
            status,
            length,
            seq,
            imm: 0,
            rkey: 0,
            addr: 0,
        }
    }

    /// The encoded bytes.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[0] = self.kind as u8;
        out[1] = self.flags;
        out[2] = self.status;
        out[4..8].copy_from_slice(&self.length.to_le_bytes());
        out[8..12].copy_from_slice(&self.seq.to_le_bytes());
        out[12..16].copy_from_slice(&self.imm.to_le_bytes());
        out[16..20].copy_from_slice(&self.rkey.to_le_bytes());
        out[24..32].copy_from_slice(&self.addr.to_le_bytes());
        out
    }

    /// Decodes and validates a header; `Err` names the field.
    pub fn decode(bytes: &[u8; HEADER_LEN]) -> Result<Header, String> {
        let kind = Kind::from_code(bytes[0])
            .ok_or_else(|| format!("unknown message kind {}", bytes[0]))?;
        let flags = bytes[1];
        if flags & !FLAG_SIGNALED != 0 {
            return Err(format!("unknown message flags {flags:#x}"));
        }
        if bytes[3] != 0 || bytes[20..24] != [0; 4] {
            return Err("reserved header bytes are not zero".to_string());
        }
        let header = Header {
            kind,
            flags,
            status: bytes[2],
            length: u32::from_le_bytes(word(bytes, 4)),
            seq: u32::from_le_bytes(word(bytes, 8)),
            imm: u32::from_le_bytes(word(bytes, 12)),
            rkey: u32::from_le_bytes(word(bytes, 16)),
            addr: u64::from_le_bytes(word(bytes, 24)),
        };
        if header.length > MAX_MESSAGE_BYTES {
            return Err(format!(
                "length {} above {MAX_MESSAGE_BYTES}",
                header.length
            ));
        }
        if matches!(kind, Kind::Ack | Kind::Nak) && header.length != 0 {
            return Err(format!("{kind:?} with length {}", header.length));
        }
        if kind == Kind::Nak && header.status == 0 {
            return Err("Nak with a success status".to_string());
        }
        Ok(header)
    }
}

/// `N` bytes of `bytes` from `at` (callers pass constant offsets inside the array).
fn word<const N: usize>(bytes: &[u8], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&bytes[at..at + N]);
    out
}

/// Whether sequence number `a` comes at or before `b` (wrapping, as RC's PSNs do).
pub fn seq_at_or_before(a: u32, b: u32) -> bool {
    (b.wrapping_sub(a) as i32) >= 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn any_kind() -> impl Strategy<Value = Kind> {
        prop_oneof![
            Just(Kind::Write),
            Just(Kind::WriteWithImm),
            Just(Kind::ReadRequest),
            Just(Kind::ReadResponse),
        ]
    }

    proptest! {
        #[test]
        fn headers_round_trip(kind in any_kind(), signaled in any::<bool>(), length in 0..=MAX_MESSAGE_BYTES,
                              seq in any::<u32>(), imm in any::<u32>(), rkey in any::<u32>(), addr in any::<u64>()) {
            let header = Header { kind, flags: u8::from(signaled), status: 0, length, seq, imm, rkey, addr };
            prop_assert_eq!(Header::decode(&header.encode()), Ok(header));
        }

        #[test]
        fn any_bytes_decode_or_name_the_field(bytes in any::<[u8; HEADER_LEN]>()) {
            match Header::decode(&bytes) {
                Ok(header) => prop_assert_eq!(header.encode(), bytes),
                Err(why) => prop_assert!(!why.is_empty()),
            }
        }

        #[test]
        fn hellos_round_trip(target in any::<u32>(), source in any::<u32>(), addr in any::<[u8; 4]>(), port in any::<u16>(), secret in any::<u64>()) {
            let hello = Hello { target_qpn: target, source_qpn: source, source_addr: addr, source_port: port, secret };
            prop_assert_eq!(Hello::decode(&hello.encode()), Ok(hello));
        }

        #[test]
        fn any_hello_bytes_decode_or_name_the_field(bytes in any::<[u8; HELLO_LEN]>()) {
            match Hello::decode(&bytes) {
                Ok(hello) => prop_assert_eq!(hello.encode(), bytes),
                Err(why) => prop_assert!(!why.is_empty()),
            }
        }
    }

    #[test]
    fn bad_headers_are_refused_by_name() {
        let good = Header::reply(Kind::Ack, 7, 0, 0).encode();
        let mut bad = good;
        bad[0] = 9;
        assert!(Header::decode(&bad).unwrap_err().contains("kind 9"));
        let mut bad = good;
        bad[1] = 2;
        assert!(Header::decode(&bad).unwrap_err().contains("flags"));
        let mut bad = good;
        bad[4] = 1;
        assert!(Header::decode(&bad)
            .unwrap_err()
            .contains("Ack with length 1"));
        let nak = Header::reply(Kind::Nak, 1, 0, 0).encode();
        assert!(Header::decode(&nak).unwrap_err().contains("success"));
        let mut hello = Hello {
            target_qpn: 1,
            source_qpn: 2,
            source_addr: [1; 4],
            source_port: 3,
            secret: 4,
        }
        .encode();
        let mut old = hello;
        hello[0] ^= 1;
        assert!(Hello::decode(&hello).unwrap_err().contains("magic"));
        // A peer of the hello without the secret ("MPIBTCP1") is named as one.
        old[0..8].copy_from_slice(&0x4D50_4942_5443_5031u64.to_le_bytes());
        assert!(Hello::decode(&old).unwrap_err().contains("older"));
    }

    #[test]
    fn sequence_order_wraps() {
        assert!(seq_at_or_before(5, 5));
        assert!(seq_at_or_before(u32::MAX, 1));
        assert!(!seq_at_or_before(2, 1));
    }
}
