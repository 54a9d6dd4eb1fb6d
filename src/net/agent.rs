//! Advanced mode's link to the policy agent (seed 001 §2.C): the registration socket that assigns
//! each connection a hint slot, and the hint SHM read with the seqlock on every transfer.
//!
//! Only advanced mode (`MPIB_MODE=1`) touches either; vanilla never opens them. When the agent is
//! absent the connection still works and every transfer goes 100 % SOUT (the seed's "safe
//! degradation"); that is logged once per connection at WARN so it is never silent.

use std::io::{Read, Write};
use std::net::Ipv4Addr;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU16, AtomicU32, Ordering};
use std::time::Duration;

use memmap2::Mmap;

use crate::log;
use crate::params::Settings;
use crate::proto::agent_wire::{
    conn_id, AgentRequest, AgentResponse, AgentStatus, Header, HEADER_LEN, MAX_MESSAGE_LEN,
};
use crate::proto::hint::{
    check_header, entry_offset, read_hint, HintCell, HINT_FILE_LEN, HINT_MAX_ENTRIES, SEQ_OFFSET,
    SUP_BW_OFFSET,
};

/// How long the control path waits for the agent (it is local; a stuck agent must not hang NCCL).
const AGENT_TIMEOUT: Duration = Duration::from_millis(500);
/// Seqlock read attempts per transfer before keeping the previous value.
const HINT_TRIES: u32 = 8;

static CONNECTION_COUNTER: AtomicU16 = AtomicU16::new(0);

/// A registered connection; deregistered (best effort) on drop.
#[derive(Debug)]
pub(crate) struct AgentRegistration {
    socket_path: String,
    conn_id: u32,
    /// The slot the agent assigned.
    pub hint_slot: u32,
}

impl AgentRegistration {
    /// Registers the connection's SOUT address pair (the control connection's addresses) and
    /// SUP address pair (from the SUP rails' GIDs, see [`ipv4_of_gid`]); `None` (with a WARN)
    /// when no agent answers.
    pub(crate) fn register(
        settings: &Settings,
        local: Ipv4Addr,
        peer: Ipv4Addr,
        sup: (Ipv4Addr, Ipv4Addr),
    ) -> Option<AgentRegistration> {
        let id = conn_id(
            std::process::id(),
            CONNECTION_COUNTER.fetch_add(1, Ordering::Relaxed),
        );
        let request = AgentRequest::Register {
            conn_id: id,
            sout_src: local.octets(),
            sout_dst: peer.octets(),
            sup_src: sup.0.octets(),
            sup_dst: sup.1.octets(),
        };
        match exchange(&settings.agent_socket, &request) {
            Ok(response) => match response.slot() {
                // slot() < HINT_MAX_ENTRIES (256): fits u32.
                Some(slot) => Some(AgentRegistration {
                    socket_path: settings.agent_socket.clone(),
                    conn_id: id,
                    hint_slot: slot as u32,
                }),
                None => {
                    warn!(
                        log::NET,
                        "agent at {} refused connection {local}->{peer} ({response:?}; slots are 0..{HINT_MAX_ENTRIES}); its transfers go 100% SOUT",
                        settings.agent_socket
                    );
                    None
                }
            },
            Err(e) => {
                warn!(
                    log::NET,
                    "MPIB_MODE=1 but the agent at MPIB_AGENT_SOCKET={} is unavailable ({e}); connection {local}->{peer} goes 100% SOUT",
                    settings.agent_socket
                );
                None
            }
        }
    }
}

impl Drop for AgentRegistration {
    fn drop(&mut self) {
        let request = AgentRequest::Deregister {
            conn_id: self.conn_id,
        };
        match exchange(&self.socket_path, &request) {
            Ok(AgentResponse::Deregister {
                status: AgentStatus::Success,
            }) => {}
            Ok(response) => info!(
                log::NET,
                "agent deregistration of {:#x} answered {response:?}", self.conn_id
            ),
            Err(e) => info!(
                log::NET,
                "agent deregistration of {:#x} failed: {e}", self.conn_id
            ),
        }
    }
}

/// Sends one request and reads its response: the header first, then as many bytes as it
/// announces, which must be what answers this request.
fn exchange(path: &str, request: &AgentRequest) -> std::io::Result<AgentResponse> {
    let mut stream = UnixStream::connect(path)?;
    stream.set_read_timeout(Some(AGENT_TIMEOUT))?;
    stream.set_write_timeout(Some(AGENT_TIMEOUT))?;
    stream.write_all(request.encode().as_bytes())?;
    let mut response = [0u8; MAX_MESSAGE_LEN];
    stream.read_exact(&mut response[..HEADER_LEN])?;
    let header = Header::decode(&response).map_err(std::io::Error::other)?;
    let expected = request.response_len();
    if usize::from(header.msg_len) != expected {
        return Err(std::io::Error::other(format!(
            "agent response announces {} bytes; the answer to this request is {expected}",
            header.msg_len
        )));
    }
    stream.read_exact(&mut response[HEADER_LEN..expected])?;
    AgentResponse::decode(&response[..expected]).map_err(std::io::Error::other)
}

/// The IPv4 address inside a RoCE v2 IPv4-mapped GID (`::ffff:a.b.c.d`), or 0.0.0.0 for any
/// other GID (InfiniBand, IPv6 RoCE): the agent identifies SUP flows by IPv4 pairs.
pub(crate) fn ipv4_of_gid(gid: &[u8; 16]) -> Ipv4Addr {
    if gid[..10].iter().all(|b| *b == 0) && gid[10..12] == [0xff, 0xff] {
        Ipv4Addr::new(gid[12], gid[13], gid[14], gid[15])
    } else {
        Ipv4Addr::UNSPECIFIED
    }
}

/// Reads one connection's hint entry; without a mapping or a slot it reads 0 (all SOUT).
pub(crate) struct HintReader {
    map: Option<Mmap>,
    slot: usize,
    last: u32,
}

impl HintReader {
    /// The reader for vanilla mode or when the agent is absent: always 0.
    pub(crate) fn none() -> HintReader {
        HintReader {
            map: None,
            slot: 0,
            last: 0,
        }
    }

    /// Maps the hint file read-only for `slot`; on any problem, WARN and read 0.
    pub(crate) fn open(settings: &Settings, slot: u32) -> HintReader {
        match map_hints(&settings.hint_path) {
            Ok(map) => HintReader {
                map: Some(map),
                slot: slot as usize,
                last: 0,
            },
            Err(e) => {
                warn!(
                    log::NET,
                    "MPIB_HINT_PATH={}: {e}; transfers go 100% SOUT", settings.hint_path
                );
                HintReader::none()
            }
        }
    }

    /// The agent's current SUP share (parts per 1024); keeps the last value if every try raced.
    pub(crate) fn read(&mut self) -> u32 {
        let Some(map) = &self.map else { return 0 };
        let cell = MappedCell {
            base: map.as_ptr(),
            offset: entry_offset(self.slot),
        };
        if let Some(value) = read_hint(&cell, HINT_TRIES) {
            self.last = value;
        }
        self.last
    }
}

fn map_hints(path: &str) -> Result<Mmap, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("cannot open: {e}"))?;
    let len = file
        .metadata()
        .map_err(|e| format!("cannot stat: {e}"))?
        .len();
    if len < HINT_FILE_LEN as u64 {
        return Err(format!("{len} bytes, expected {HINT_FILE_LEN}"));
    }
    // SAFETY: a read-only shared mapping; the agent writes the entries concurrently, which is
    // why every field is read through atomics (`MappedCell`).
    let map = unsafe { Mmap::map(&file) }.map_err(|e| format!("cannot map: {e}"))?;
    let word = |offset: usize| {
        u32::from_ne_bytes([
            map[offset],
            map[offset + 1],
            map[offset + 2],
            map[offset + 3],
        ])
    };
    check_header(word(0), word(4))?;
    Ok(map)
}

/// One hint entry inside the mapping.
struct MappedCell {
    base: *const u8,
    offset: usize,
}

impl MappedCell {
    fn load(&self, field: usize) -> u32 {
        // SAFETY: `offset + field + 4 <= HINT_FILE_LEN <= map length` (entry_offset stays inside
        // the 256 entries and the mapping was checked to be at least HINT_FILE_LEN); the address is
        // 4-byte aligned (page-aligned base, 16-byte entries); the agent writes it atomically.
        let atomic = unsafe { AtomicU32::from_ptr(self.base.add(self.offset + field) as *mut u32) };
        atomic.load(Ordering::Acquire)
    }
}

impl HintCell for MappedCell {
    fn load_seq(&self) -> u32 {
        self.load(SEQ_OFFSET)
    }
    fn load_sup_bw(&self) -> u32 {
        self.load(SUP_BW_OFFSET)
    }
}
