//! The connect/accept handshake messages over the TCP control connection (docs/PROTOCOL.md §1).
//!
//! Why explicit bytes: the two ends may run different builds, so the message is a declared
//! sequence of little-endian fields in a fixed-size array, never a transmuted `#[repr(C)]`
//! struct. Magic and version come first so a stray or older peer is rejected before anything
//! else is trusted, and decoding validates every bound and enum code, because a QP count or rail
//! flag taken on faith would size arrays and index QPs later.
//!
//! Why an agreement check: both ends classify the path from the SAME address pair (the control
//! socket's two ends) and derive the QP layout from it (docs/PROTOCOL.md §1–2). The connector
//! sends what it computed; the acceptor compares with its own result and refuses with a reason
//! instead of creating QPs that would never pair up.
//!
//! Sequence: connector sends [`ConnectRequest`]; acceptor answers [`ConnectReply`] (possibly a
//! refusal); after both sides move their QPs to RTS the connector sends the ready marker.

use std::fmt;

use crate::mode::Mode;
use crate::rail::Rail;

use super::cursor::{Reader, Writer};
use super::island::PathClass;

/// "MPIBHSK1".
pub const HANDSHAKE_MAGIC: u64 = 0x4D50_4942_4853_4B31;
/// Bumped on any change of layout or meaning.
pub const HANDSHAKE_VERSION: u32 = 5;
/// Largest QP array of one connection (both rails).
pub const MAX_QPS: usize = 32;
/// Largest QP count on one rail.
pub const MAX_QPS_PER_RAIL: u8 = 16;
/// "MPIBRDY1": the connector's final "my QPs are ready" marker.
pub const READY_MAGIC: u64 = 0x4D50_4942_5244_5931;
/// "MPIBLNK1": the acceptor's answer to the ready marker: which control link it keeps.
pub const LINK_MAGIC: u64 = 0x4D50_4942_4C4E_4B31;

const HEADER_LEN: usize = 8 + 4;
/// Bytes of a fabric's opaque endpoint ([`RailEndpoint::endpoint`]).
pub const RAIL_ENDPOINT_BYTES: usize = 24;
const ENDPOINT_LEN: usize = 4 + 16 + RAIL_ENDPOINT_BYTES;
const QP_NUMS_LEN: usize = MAX_QPS * 4;
const KEYS_LEN: usize = 2 * 4;

/// Bytes of an encoded [`ConnectRequest`].
pub const CONNECT_REQUEST_LEN: usize =
    HEADER_LEN + 8 + 4 + 4 + 2 * ENDPOINT_LEN + QP_NUMS_LEN + 8 + KEYS_LEN + 8 + 8 + 8;
/// Bytes of an encoded [`ConnectReply`].
pub const CONNECT_REPLY_LEN: usize =
    HEADER_LEN + 8 + 2 * ENDPOINT_LEN + QP_NUMS_LEN + 8 + KEYS_LEN + 8 + 8;
/// Bytes of the ready marker and its link proposal.
pub const READY_LEN: usize = 8 + 8 + 8;
/// Bytes of the acceptor's link answer.
pub const LINK_ANSWER_LEN: usize = 8 + 8;

/// How to reach one rail of one end.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct RailEndpoint {
    /// Whether this end has the rail at all.
    pub present: bool,
    /// The rail device's IP address as IPv6 (IPv4 addresses IPv4-mapped): what islands and the
    /// agent's flows are keyed by.
    pub address: [u8; 16],
    /// How the fabric reaches the rail's queue pairs, in its own encoding: opaque here (the
    /// fabric's `connect` decodes and checks it; src/fabric/mod.rs `Endpoint`).
    pub endpoint: [u8; RAIL_ENDPOINT_BYTES],
}

/// Connector to acceptor: what the connector computed and how to reach its QPs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectRequest {
    /// Connector's policy mode.
    pub mode: Mode,
    /// Connector's classification of the address pair.
    pub class: PathClass,
    /// Island prefix length the connector used.
    pub prefix_len: u8,
    /// SOUT QPs the connector created.
    pub sout_qps: u8,
    /// SUP QPs the connector created (after suppression).
    pub sup_qps: u8,
    /// Control socket local address as the connector sees it (network order).
    pub connector_addr: [u8; 4],
    /// Control socket peer address as the connector sees it (network order).
    pub acceptor_addr: [u8; 4],
    /// Connector's rails, by rail index.
    pub rails: [RailEndpoint; 2],
    /// QP numbers, in QP-array order; entries past `sout_qps + sup_qps` are unused.
    pub qp_nums: [u32; MAX_QPS],
    /// Address of the connector's (sender's) CTS FIFO.
    pub fifo_addr: u64,
    /// Remote keys of the FIFO, by rail index.
    pub fifo_rkeys: [u32; 2],
    /// The connector's name for this connection on the shared control link: the acceptor puts
    /// it in the notices it sends about its end (failed, closed).
    pub conn_id: u64,
    /// The connector's process, a random number drawn once per process: with the link
    /// identifier it names a control link between the two processes.
    pub process: u64,
    /// Whether the connector allows failover (`MPIB_FAILOVER`): its FIFO and completion record
    /// shadow then end in the failover mailboxes (docs/PROTOCOL.md §10).
    pub failover: bool,
    /// The connection's secret, drawn by the connector from `getrandom`: both ends create their
    /// QPs with it, and a fabric whose QP connections anyone could open (tcp) takes only those
    /// whose hello carries it (`tcp_wire::Hello::secret`; version 5).
    pub secret: u64,
}

/// Why the acceptor refused a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Different handshake versions.
    VersionMismatch = 1,
    /// Different `MPIB_MODE`.
    ModeMismatch = 2,
    /// Different island classification of the same address pair.
    ClassMismatch = 3,
    /// Different QP counts.
    QpCountMismatch = 4,
    /// A rail the layout needs is missing on one end.
    RailMissing = 5,
    /// The acceptor failed for its own reasons.
    Internal = 6,
}

/// Acceptor to connector: agreement (or refusal) and how to reach the acceptor's QPs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectReply {
    /// `Some` when the acceptor refuses; the other fields are then informational.
    pub refusal: Option<Refusal>,
    /// Acceptor's policy mode.
    pub mode: Mode,
    /// Acceptor's classification.
    pub class: PathClass,
    /// SOUT QPs the acceptor created.
    pub sout_qps: u8,
    /// SUP QPs the acceptor created.
    pub sup_qps: u8,
    /// Acceptor's rails, by rail index.
    pub rails: [RailEndpoint; 2],
    /// QP numbers, in QP-array order.
    pub qp_nums: [u32; MAX_QPS],
    /// Address of the acceptor's (receiver's) completion records.
    pub records_addr: u64,
    /// Remote keys of the records, by rail index.
    pub records_rkeys: [u32; 2],
    /// The acceptor's name for this connection on the shared control link.
    pub conn_id: u64,
    /// The acceptor's process (drawn once per process, as [`ConnectRequest::process`]).
    pub process: u64,
    /// Whether the connection fails over: both ends allow it (the acceptor answers the
    /// connector's [`ConnectRequest::failover`] with its own setting and'ed in).
    pub failover: bool,
}

/// The connector's ready marker: its QPs are at RTS, and which control link the connection
/// should keep. Both ends must keep the same one, so the connector proposes and the acceptor
/// answers ([`LinkAnswer`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ready {
    /// A link from the connector to the acceptor's process the connector holds open (0: none):
    /// the connection rides it if the acceptor holds it too.
    pub existing_link: u64,
    /// Otherwise this handshake's TCP connection becomes a new link with this identifier
    /// (never 0).
    pub fresh_link: u64,
}

/// The acceptor's answer: the link the connection rides, one of the proposal's two.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinkAnswer {
    /// [`Ready::existing_link`] or [`Ready::fresh_link`].
    pub link: u64,
}

/// A message that is not a valid handshake message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WireError {
    /// Wrong magic: not an MPIB peer, or a stream out of step.
    BadMagic(u64),
    /// Different handshake version.
    BadVersion(u32),
    /// A field outside its range.
    BadField {
        /// Field name.
        field: &'static str,
        /// The value received.
        value: u64,
    },
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::BadMagic(magic) => write!(
                f,
                "handshake magic {magic:#018x} (expected {HANDSHAKE_MAGIC:#018x}): peer is not \
                 MPIB or the stream is out of step"
            ),
            WireError::BadVersion(version) => write!(
                f,
                "peer speaks handshake version {version}, this build speaks {HANDSHAKE_VERSION}"
            ),
            WireError::BadField { field, value } => {
                write!(f, "handshake field `{field}` has invalid value {value}")
            }
        }
    }
}

impl std::error::Error for WireError {}

/// Wire code of a mode (the `MPIB_MODE` value): 0 vanilla, 1 advanced.
pub const fn mode_code(mode: Mode) -> u8 {
    match mode {
        Mode::Vanilla => 0,
        Mode::Advanced => 1,
    }
}

/// The mode with wire code `code`.
pub fn mode_from_code(code: u8) -> Option<Mode> {
    match code {
        0 => Some(Mode::Vanilla),
        1 => Some(Mode::Advanced),
        _ => None,
    }
}

fn bad(field: &'static str, value: impl Into<u64>) -> WireError {
    WireError::BadField {
        field,
        value: value.into(),
    }
}

fn check(field: &'static str, value: u8, valid: bool) -> Result<u8, WireError> {
    if valid {
        Ok(value)
    } else {
        Err(bad(field, value))
    }
}

fn write_header(writer: &mut Writer<'_>) {
    writer.u64(HANDSHAKE_MAGIC);
    writer.u32(HANDSHAKE_VERSION);
}

/// Reads a message's first word, which must be `expected`.
fn read_magic(reader: &mut Reader<'_>, expected: u64) -> Result<(), WireError> {
    match reader.u64() {
        magic if magic == expected => Ok(()),
        magic => Err(WireError::BadMagic(magic)),
    }
}

fn read_header(reader: &mut Reader<'_>) -> Result<(), WireError> {
    read_magic(reader, HANDSHAKE_MAGIC)?;
    let version = reader.u32();
    if version != HANDSHAKE_VERSION {
        return Err(WireError::BadVersion(version));
    }
    Ok(())
}

fn write_reserved(writer: &mut Writer<'_>, count: usize) {
    for _ in 0..count {
        writer.u8(0);
    }
}

fn read_reserved(reader: &mut Reader<'_>, count: usize) -> Result<(), WireError> {
    for _ in 0..count {
        let byte = reader.u8();
        check("reserved", byte, byte == 0)?;
    }
    Ok(())
}

fn write_endpoints(writer: &mut Writer<'_>, rails: &[RailEndpoint; 2]) {
    for endpoint in rails {
        writer.u8(u8::from(endpoint.present));
        writer.bytes(&[0; 3]);
        writer.bytes(&endpoint.address);
        writer.bytes(&endpoint.endpoint);
    }
}

fn read_endpoints(reader: &mut Reader<'_>) -> Result<[RailEndpoint; 2], WireError> {
    let mut rails = [RailEndpoint::default(); 2];
    for endpoint in &mut rails {
        let present = reader.u8();
        endpoint.present = check("rail.present", present, present <= 1)? == 1;
        read_reserved(reader, 3)?;
        endpoint.address = reader.array();
        endpoint.endpoint = reader.array();
    }
    Ok(rails)
}

fn write_words<const N: usize>(writer: &mut Writer<'_>, words: &[u32; N]) {
    for word in words {
        writer.u32(*word);
    }
}

fn read_words<const N: usize>(reader: &mut Reader<'_>) -> [u32; N] {
    let mut words = [0u32; N];
    for word in &mut words {
        *word = reader.u32();
    }
    words
}

/// Decode and bound-check mode, class and the two QP counts (shared by both messages).
fn read_layout(
    mode: u8,
    class: u8,
    sout_qps: u8,
    sup_qps: u8,
) -> Result<(Mode, PathClass, u8, u8), WireError> {
    let mode = mode_from_code(mode).ok_or_else(|| bad("mode", mode))?;
    let class = PathClass::from_code(class).ok_or_else(|| bad("class", class))?;
    check("sout_qps", sout_qps, sout_qps <= MAX_QPS_PER_RAIL)?;
    check("sup_qps", sup_qps, sup_qps <= MAX_QPS_PER_RAIL)?;
    let total = usize::from(sout_qps) + usize::from(sup_qps);
    if total > MAX_QPS {
        return Err(bad("total_qps", total as u64));
    }
    Ok((mode, class, sout_qps, sup_qps))
}

impl ConnectRequest {
    /// The message as sent.
    pub fn encode(&self) -> [u8; CONNECT_REQUEST_LEN] {
        let mut bytes = [0u8; CONNECT_REQUEST_LEN];
        let mut writer = Writer::new(&mut bytes);
        write_header(&mut writer);
        writer.u8(mode_code(self.mode));
        writer.u8(self.class.code());
        writer.u8(self.prefix_len);
        writer.u8(self.sout_qps);
        writer.u8(self.sup_qps);
        writer.u8(u8::from(self.failover));
        write_reserved(&mut writer, 2);
        writer.bytes(&self.connector_addr);
        writer.bytes(&self.acceptor_addr);
        write_endpoints(&mut writer, &self.rails);
        write_words(&mut writer, &self.qp_nums);
        writer.u64(self.fifo_addr);
        write_words(&mut writer, &self.fifo_rkeys);
        writer.u64(self.conn_id);
        writer.u64(self.process);
        writer.u64(self.secret);
        debug_assert_eq!(writer.position(), CONNECT_REQUEST_LEN);
        bytes
    }

    /// Parse and validate a received request.
    pub fn decode(bytes: &[u8; CONNECT_REQUEST_LEN]) -> Result<Self, WireError> {
        let mut reader = Reader::new(bytes);
        read_header(&mut reader)?;
        let [mode, class, prefix_len, sout_qps, sup_qps] = reader.array();
        let (mode, class, sout_qps, sup_qps) = read_layout(mode, class, sout_qps, sup_qps)?;
        let prefix_len = check("prefix_len", prefix_len, prefix_len <= 32)?;
        let failover = reader.u8();
        let failover = check("failover", failover, failover <= 1)? == 1;
        read_reserved(&mut reader, 2)?;
        let request = ConnectRequest {
            failover,
            mode,
            class,
            prefix_len,
            sout_qps,
            sup_qps,
            connector_addr: reader.array(),
            acceptor_addr: reader.array(),
            rails: read_endpoints(&mut reader)?,
            qp_nums: read_words(&mut reader),
            fifo_addr: reader.u64(),
            fifo_rkeys: read_words(&mut reader),
            conn_id: reader.u64(),
            process: reader.u64(),
            secret: reader.u64(),
        };
        debug_assert_eq!(reader.position(), CONNECT_REQUEST_LEN);
        if request.secret == 0 {
            return Err(bad("secret", 0u64));
        }
        Ok(request)
    }
}

impl ConnectReply {
    /// The message as sent.
    pub fn encode(&self) -> [u8; CONNECT_REPLY_LEN] {
        let mut bytes = [0u8; CONNECT_REPLY_LEN];
        let mut writer = Writer::new(&mut bytes);
        write_header(&mut writer);
        writer.u8(self.refusal.map_or(0, Refusal::code));
        writer.u8(mode_code(self.mode));
        writer.u8(self.class.code());
        writer.u8(self.sout_qps);
        writer.u8(self.sup_qps);
        writer.u8(u8::from(self.failover));
        write_reserved(&mut writer, 2);
        write_endpoints(&mut writer, &self.rails);
        write_words(&mut writer, &self.qp_nums);
        writer.u64(self.records_addr);
        write_words(&mut writer, &self.records_rkeys);
        writer.u64(self.conn_id);
        writer.u64(self.process);
        debug_assert_eq!(writer.position(), CONNECT_REPLY_LEN);
        bytes
    }

    /// Parse and validate a received reply.
    pub fn decode(bytes: &[u8; CONNECT_REPLY_LEN]) -> Result<Self, WireError> {
        let mut reader = Reader::new(bytes);
        read_header(&mut reader)?;
        let [refusal, mode, class, sout_qps, sup_qps] = reader.array();
        let refusal = match refusal {
            0 => None,
            code => Some(Refusal::from_code(code).ok_or_else(|| bad("refusal", code))?),
        };
        let (mode, class, sout_qps, sup_qps) = read_layout(mode, class, sout_qps, sup_qps)?;
        let failover = reader.u8();
        let failover = check("failover", failover, failover <= 1)? == 1;
        read_reserved(&mut reader, 2)?;
        let reply = ConnectReply {
            failover,
            refusal,
            mode,
            class,
            sout_qps,
            sup_qps,
            rails: read_endpoints(&mut reader)?,
            qp_nums: read_words(&mut reader),
            records_addr: reader.u64(),
            records_rkeys: read_words(&mut reader),
            conn_id: reader.u64(),
            process: reader.u64(),
        };
        debug_assert_eq!(reader.position(), CONNECT_REPLY_LEN);
        Ok(reply)
    }
}

impl Ready {
    /// The message as sent.
    pub fn encode(&self) -> [u8; READY_LEN] {
        let mut bytes = [0u8; READY_LEN];
        let mut writer = Writer::new(&mut bytes);
        writer.u64(READY_MAGIC);
        writer.u64(self.existing_link);
        writer.u64(self.fresh_link);
        bytes
    }

    /// Parse and validate a received ready marker.
    pub fn decode(bytes: &[u8; READY_LEN]) -> Result<Ready, WireError> {
        let mut reader = Reader::new(bytes);
        read_magic(&mut reader, READY_MAGIC)?;
        let ready = Ready {
            existing_link: reader.u64(),
            fresh_link: reader.u64(),
        };
        if ready.fresh_link == 0 {
            return Err(bad("fresh_link", 0u64));
        }
        if ready.existing_link == ready.fresh_link {
            return Err(bad("existing_link", ready.existing_link));
        }
        Ok(ready)
    }
}

impl LinkAnswer {
    /// The message as sent.
    pub fn encode(&self) -> [u8; LINK_ANSWER_LEN] {
        let mut bytes = [0u8; LINK_ANSWER_LEN];
        let mut writer = Writer::new(&mut bytes);
        writer.u64(LINK_MAGIC);
        writer.u64(self.link);
        bytes
    }

    /// Parse a received answer and check it picks one of `proposed`'s links.
    pub fn decode(
        bytes: &[u8; LINK_ANSWER_LEN],
        proposed: &Ready,
    ) -> Result<LinkAnswer, WireError> {
        let mut reader = Reader::new(bytes);
        read_magic(&mut reader, LINK_MAGIC)?;
        let link = reader.u64();
        let known = link == proposed.fresh_link
            || (proposed.existing_link != 0 && link == proposed.existing_link);
        if !known {
            return Err(bad("link", link));
        }
        Ok(LinkAnswer { link })
    }
}

/// What the acceptor checks before creating QPs: both sides classify from the SAME address pair
/// and must agree on mode, class and QP counts; the connector must have SOUT, and SUP whenever
/// the layout has SUP QPs. `local_*` is the acceptor's own view (class from its local address
/// and the peer's address; QP counts after suppression). Returns the first disagreement.
pub fn check_agreement(
    request: &ConnectRequest,
    local_mode: Mode,
    local_class: PathClass,
    local_sout_qps: u8,
    local_sup_qps: u8,
) -> Result<(), Refusal> {
    if request.mode != local_mode {
        return Err(Refusal::ModeMismatch);
    }
    if request.class != local_class {
        return Err(Refusal::ClassMismatch);
    }
    if request.sout_qps != local_sout_qps || request.sup_qps != local_sup_qps {
        return Err(Refusal::QpCountMismatch);
    }
    let sup_needed = local_sup_qps > 0;
    if !request.rails[Rail::ScaleOut.index()].present
        || (sup_needed && !request.rails[Rail::ScaleUp.index()].present)
    {
        return Err(Refusal::RailMissing);
    }
    Ok(())
}

impl Refusal {
    /// Wire code (never 0: 0 means "accepted").
    pub fn code(self) -> u8 {
        self as u8
    }

    /// The refusal with wire code `code`.
    pub fn from_code(code: u8) -> Option<Refusal> {
        match code {
            1 => Some(Refusal::VersionMismatch),
            2 => Some(Refusal::ModeMismatch),
            3 => Some(Refusal::ClassMismatch),
            4 => Some(Refusal::QpCountMismatch),
            5 => Some(Refusal::RailMissing),
            6 => Some(Refusal::Internal),
            _ => None,
        }
    }

    /// What went wrong and what to check, for the error message on both ends.
    pub fn describe(self) -> &'static str {
        match self {
            Refusal::VersionMismatch => "peers run different MPIB handshake versions",
            Refusal::ModeMismatch => "peers disagree on MPIB_MODE (set it identically everywhere)",
            Refusal::ClassMismatch => {
                "peers classify the path differently (check MPIB_ISLAND_PREFIX_LEN on both ends)"
            }
            Refusal::QpCountMismatch => {
                "peers disagree on QP counts (check MPIB_SOUT_QP / MPIB_SUP_QP on both ends)"
            }
            Refusal::RailMissing => "a rail the connection needs is missing on one end",
            Refusal::Internal => "the accepting side failed internally (see its log)",
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.describe())
    }
}

#[cfg(test)]
mod tests;
