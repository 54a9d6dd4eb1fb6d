//! A test agent for advanced mode (`MPIB_MODE=1`; docs/AGENT.md, 'Writing your own agent'): it
//! owns the hint SHM file and serves the registration socket that hands each new connection a
//! hint slot.
//!
//! Hint file (4112 bytes, host byte order): header `{magic u32 = 0x4D504948, max_entries u32 =
//! 256, 8 reserved bytes}`, then 256 entries `{sup_bw u32, seq u32, src_ip u32, dst_ip u32}` (IPs
//! in network byte order). Socket messages, the reference agent interface (`include/mpib_agent.h`;
//! packed, little-endian, addresses in network order): header `{magic u32 = 0x4D504952, msg_len
//! u16, msg_type u8 (1 register, 2 deregister, 128 response), reserved u8}`; register request (28
//! bytes) `{header, conn_id u32, sout_src, sout_dst, sup_src, sup_dst}` -> response (16 bytes)
//! `{header, status u8 (0 ok, 1 no free slots, 2 invalid request), reserved [u8; 3], hint_slot
//! u32}`; deregister request (12 bytes) `{header, conn_id u32}` -> response (12 bytes) `{header,
//! status u8, reserved [u8; 3]}`. Written from the interface, not from the plugin's code, so the
//! tests check the plugin against an independent reading of it.

use std::io::{ErrorKind, Read, Write};
use std::net::Ipv4Addr;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use memmap2::MmapMut;

use crate::error::{Error, Result};

/// Header magic ("MPIH").
pub const HINT_MAGIC: u32 = 0x4D50_4948;
/// Registration magic ("MPIR").
pub const REG_MAGIC: u32 = 0x4D50_4952;
/// Entries in the hint file.
pub const MAX_ENTRIES: usize = 256;
/// Size of the hint file.
pub const HINT_FILE_SIZE: usize = 16 + MAX_ENTRIES * 16;
/// `msg_type` of a register request.
pub const MSG_REGISTER: u8 = 1;
/// `msg_type` of a deregister request.
pub const MSG_DEREGISTER: u8 = 2;
/// `msg_type` of a response.
pub const MSG_RESPONSE: u8 = 128;
/// Size of the header.
pub const HEADER_SIZE: usize = 8;
/// Size of a register request.
pub const REGISTER_SIZE: usize = 28;
/// Size of a register response.
pub const REGISTER_RESPONSE_SIZE: usize = 16;
/// Size of a deregister request and of its response.
pub const DEREGISTER_SIZE: usize = 12;
/// Status: done.
pub const STATUS_SUCCESS: u8 = 0;
/// Status: every slot is taken.
pub const STATUS_NO_FREE_SLOTS: u8 = 1;
/// Status: a malformed request (or, for a deregistration, a connection never registered).
pub const STATUS_INVALID: u8 = 2;

/// One connection the plugin registered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registration {
    /// `(pid << 16) | counter` in 32 bits, chosen by the plugin.
    pub conn_id: u32,
    /// Slot handed out.
    pub slot: u32,
    /// SOUT source.
    pub sout_src: Ipv4Addr,
    /// SOUT destination.
    pub sout_dst: Ipv4Addr,
    /// SUP source.
    pub sup_src: Ipv4Addr,
    /// SUP destination.
    pub sup_dst: Ipv4Addr,
    /// False after a deregistration.
    pub active: bool,
}

struct Shm {
    base: *mut u8,
    _map: MmapMut,
}

// SAFETY: `base` points into the mapping owned by `_map`; every access through it is atomic.
unsafe impl Send for Shm {}
// SAFETY: as above.
unsafe impl Sync for Shm {}

impl Shm {
    fn word(&self, offset: usize) -> &AtomicU32 {
        assert!(offset % 4 == 0 && offset + 4 <= HINT_FILE_SIZE);
        // SAFETY: the mapping is HINT_FILE_SIZE bytes, page-aligned, alive as long as `self`, and
        // every access to it (ours and the plugin's) is a 4-byte aligned atomic-width access.
        unsafe { AtomicU32::from_ptr(self.base.add(offset).cast()) }
    }
    fn entry(&self, slot: usize, field: usize) -> &AtomicU32 {
        self.word(16 + slot * 16 + field * 4)
    }
}

struct State {
    registrations: Vec<Registration>,
    next_slot: u32,
}

struct Shared {
    shm: Shm,
    state: Mutex<State>,
    default_sup_bw: AtomicU32,
    stop: AtomicBool,
}

fn ip(bytes: &[u8]) -> Ipv4Addr {
    Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3])
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Seqlock write (single writer: callers hold `state`).
    fn write_entry(&self, slot: usize, sup_bw: u32, ips: Option<(Ipv4Addr, Ipv4Addr)>) {
        let seq = self.shm.entry(slot, 1);
        let start = seq.load(Ordering::Relaxed) & !1; // a dead writer could have left it odd
        seq.store(start.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        self.shm.entry(slot, 0).store(sup_bw, Ordering::Relaxed);
        if let Some((src, dst)) = ips {
            self.shm
                .entry(slot, 2)
                .store(u32::from_ne_bytes(src.octets()), Ordering::Relaxed);
            self.shm
                .entry(slot, 3)
                .store(u32::from_ne_bytes(dst.octets()), Ordering::Relaxed);
        }
        seq.store(start.wrapping_add(2), Ordering::Release);
    }

    /// Answers one whole request of `msg_type` (its length already checked): the response's
    /// bytes.
    fn handle(&self, msg_type: u8, request: &[u8]) -> Vec<u8> {
        let conn_id = u32::from_le_bytes([request[8], request[9], request[10], request[11]]);
        let mut state = self.state();
        if msg_type == MSG_DEREGISTER {
            let found = state
                .registrations
                .iter_mut()
                .find(|r| r.conn_id == conn_id && r.active);
            let status = match found {
                Some(r) => {
                    r.active = false;
                    STATUS_SUCCESS
                }
                None => STATUS_INVALID,
            };
            return response(DEREGISTER_SIZE, status, None);
        }
        if state.next_slot as usize >= MAX_ENTRIES {
            return response(REGISTER_RESPONSE_SIZE, STATUS_NO_FREE_SLOTS, Some(0));
        }
        let slot = state.next_slot;
        state.next_slot += 1;
        let (sout_src, sout_dst) = (ip(&request[12..]), ip(&request[16..]));
        let bw = self.default_sup_bw.load(Ordering::Relaxed);
        self.write_entry(slot as usize, bw, Some((sout_src, sout_dst)));
        state.registrations.push(Registration {
            conn_id,
            slot,
            sout_src,
            sout_dst,
            sup_src: ip(&request[20..]),
            sup_dst: ip(&request[24..]),
            active: true,
        });
        response(REGISTER_RESPONSE_SIZE, STATUS_SUCCESS, Some(slot))
    }
}

/// A response of `len` bytes: header, status, three reserved bytes, and the slot when given.
fn response(len: usize, status: u8, slot: Option<u32>) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(len);
    bytes.extend_from_slice(&REG_MAGIC.to_le_bytes());
    bytes.extend_from_slice(&(len as u16).to_le_bytes());
    bytes.extend_from_slice(&[MSG_RESPONSE, 0, status, 0, 0, 0]);
    if let Some(slot) = slot {
        bytes.extend_from_slice(&slot.to_le_bytes());
    }
    bytes
}

/// The running agent. Dropping it stops the server and removes its files.
pub struct Agent {
    shared: Arc<Shared>,
    hint_path: PathBuf,
    socket_path: PathBuf,
    owned_dir: Option<PathBuf>,
    server: Option<JoinHandle<()>>,
}

impl Agent {
    /// Starts an agent in a fresh private directory under the system temp dir.
    pub fn start_in_temp() -> Result<Agent> {
        let dir = crate::temp_dir("mpib-agent")?;
        match Agent::start(&dir.join("hints"), &dir.join("agent.sock")) {
            Ok(mut agent) => {
                agent.owned_dir = Some(dir);
                Ok(agent)
            }
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                Err(e)
            }
        }
    }

    /// Creates the hint file at `hint_path` and serves registrations at `socket_path`.
    pub fn start(hint_path: &Path, socket_path: &Path) -> Result<Agent> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(hint_path)
            .map_err(|e| Error::Io(format!("create {}: {e}", hint_path.display())))?;
        file.set_len(HINT_FILE_SIZE as u64)?;
        // SAFETY: the file is ours, just sized; nobody truncates it while it is mapped.
        let mut map = unsafe { MmapMut::map_mut(&file) }
            .map_err(|e| Error::Io(format!("mmap {}: {e}", hint_path.display())))?;
        let shm = Shm {
            base: map.as_mut_ptr(),
            _map: map,
        };
        shm.word(4).store(MAX_ENTRIES as u32, Ordering::Relaxed);
        shm.word(8).store(0, Ordering::Relaxed);
        shm.word(12).store(0, Ordering::Relaxed);
        shm.word(0).store(HINT_MAGIC, Ordering::Release);
        let _ = std::fs::remove_file(socket_path);
        let listener = UnixListener::bind(socket_path)
            .map_err(|e| Error::Io(format!("bind {}: {e}", socket_path.display())))?;
        listener.set_nonblocking(true)?;
        let shared = Arc::new(Shared {
            shm,
            state: Mutex::new(State {
                registrations: Vec::new(),
                next_slot: 0,
            }),
            default_sup_bw: AtomicU32::new(0),
            stop: AtomicBool::new(false),
        });
        let server_shared = Arc::clone(&shared);
        let server = std::thread::Builder::new()
            .name("mpib-test-agent".into())
            .spawn(move || serve(&server_shared, &listener))?;
        Ok(Agent {
            shared,
            hint_path: hint_path.to_path_buf(),
            socket_path: socket_path.to_path_buf(),
            owned_dir: None,
            server: Some(server),
        })
    }

    /// `MPIB_HINT_PATH`.
    pub fn hint_path(&self) -> &Path {
        &self.hint_path
    }

    /// `MPIB_AGENT_SOCKET`.
    pub fn socket_path(&self) -> &Path {
        &self.socket_path
    }

    /// The `MPIB_*` variables that point the plugin at this agent, advanced mode included.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("MPIB_MODE", "1".to_string()),
            ("MPIB_HINT_PATH", self.hint_path.display().to_string()),
            ("MPIB_AGENT_SOCKET", self.socket_path.display().to_string()),
        ]
    }

    /// `sup_bw` written into each slot at registration (before the plugin can read it).
    pub fn set_default_sup_bw(&self, value: u32) {
        self.shared.default_sup_bw.store(value, Ordering::Relaxed);
    }

    /// Writes `sup_bw` for `slot` with the seqlock protocol (seq odd, value, seq even).
    pub fn set_sup_bw(&self, slot: u32, value: u32) {
        let _single_writer = self.shared.state();
        self.shared
            .write_entry(slot as usize % MAX_ENTRIES, value, None);
    }

    /// Sets `sup_bw` on every active registration and makes it the default for new ones.
    pub fn set_sup_bw_all(&self, value: u32) {
        self.set_default_sup_bw(value);
        for r in self.registrations().iter().filter(|r| r.active) {
            self.set_sup_bw(r.slot, value);
        }
    }

    /// Reads an entry: `(sup_bw, seq, src_ip, dst_ip)`.
    pub fn entry(&self, slot: u32) -> (u32, u32, u32, u32) {
        let s = slot as usize % MAX_ENTRIES;
        let f = |i| self.shared.shm.entry(s, i).load(Ordering::Acquire);
        (f(0), f(1), f(2), f(3))
    }

    /// Every registration so far, in arrival order.
    pub fn registrations(&self) -> Vec<Registration> {
        self.shared.state().registrations.clone()
    }

    /// Waits until at least `count` registrations arrived.
    pub fn wait_for_registrations(
        &self,
        count: usize,
        timeout: Duration,
    ) -> Result<Vec<Registration>> {
        let deadline = Instant::now() + timeout;
        loop {
            let regs = self.registrations();
            if regs.len() >= count {
                return Ok(regs);
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout(format!(
                    "agent saw {} registrations, expected {count} within {timeout:?}",
                    regs.len()
                )));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(server) = self.server.take() {
            let _ = server.join();
        }
        let _ = std::fs::remove_file(&self.socket_path);
        let _ = std::fs::remove_file(&self.hint_path);
        if let Some(dir) = &self.owned_dir {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

fn serve(shared: &Arc<Shared>, listener: &UnixListener) {
    let mut clients: Vec<JoinHandle<()>> = Vec::new();
    while !shared.stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((stream, _)) => {
                let client_shared = Arc::clone(shared);
                let spawned = std::thread::Builder::new()
                    .name("mpib-test-agent-client".into())
                    .spawn(move || serve_client(&client_shared, stream));
                if let Ok(handle) = spawned {
                    clients.push(handle);
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
        clients.retain(|c| !c.is_finished());
    }
    for client in clients {
        let _ = client.join();
    }
}

/// Serves requests on one connection until EOF or stop (the plugin may keep the connection open
/// or use one per request). A request with a bad magic or an unknown type closes the connection;
/// one whose length is wrong for its type gets status 2 and then the connection is closed.
fn serve_client(shared: &Shared, mut stream: UnixStream) {
    let configured = stream
        .set_nonblocking(false)
        .and_then(|()| stream.set_read_timeout(Some(Duration::from_millis(20))));
    if configured.is_err() {
        return;
    }
    let mut message = [0u8; REGISTER_SIZE];
    loop {
        if !read_full(shared, &mut stream, &mut message[..HEADER_SIZE]) {
            return;
        }
        let magic = u32::from_le_bytes([message[0], message[1], message[2], message[3]]);
        let msg_len = usize::from(u16::from_le_bytes([message[4], message[5]]));
        let msg_type = message[6];
        let (expected, invalid) = match msg_type {
            MSG_REGISTER => (
                REGISTER_SIZE,
                response(REGISTER_RESPONSE_SIZE, STATUS_INVALID, Some(0)),
            ),
            MSG_DEREGISTER => (
                DEREGISTER_SIZE,
                response(DEREGISTER_SIZE, STATUS_INVALID, None),
            ),
            _ => return,
        };
        if magic != REG_MAGIC {
            return;
        }
        if msg_len != expected {
            let _ = stream.write_all(&invalid);
            return;
        }
        if !read_full(shared, &mut stream, &mut message[HEADER_SIZE..expected]) {
            return;
        }
        if stream
            .write_all(&shared.handle(msg_type, &message[..expected]))
            .is_err()
        {
            return;
        }
    }
}

/// Fills `buffer` from the stream; false on EOF, an error or stop.
fn read_full(shared: &Shared, stream: &mut UnixStream, buffer: &mut [u8]) -> bool {
    let mut filled = 0;
    while filled < buffer.len() {
        if shared.stop.load(Ordering::Relaxed) {
            return false;
        }
        match stream.read(&mut buffer[filled..]) {
            Ok(0) => return false,
            Ok(n) => filled += n,
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) => {}
            Err(_) => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request as the interface lays it out (SOUT 10.0.0.1 -> 10.0.0.2, SUP 10.1.0.1 -> 10.1.0.2).
    fn request(msg_type: u8, conn_id: u32) -> Vec<u8> {
        let len = if msg_type == MSG_REGISTER {
            REGISTER_SIZE
        } else {
            DEREGISTER_SIZE
        };
        let mut r = REG_MAGIC.to_le_bytes().to_vec();
        r.extend_from_slice(&(len as u16).to_le_bytes());
        r.extend_from_slice(&[msg_type, 0]);
        r.extend_from_slice(&conn_id.to_le_bytes());
        if msg_type == MSG_REGISTER {
            r.extend_from_slice(&[10, 0, 0, 1, 10, 0, 0, 2, 10, 1, 0, 1, 10, 1, 0, 2]);
        }
        r
    }

    /// Sends `req`, reads a response of `len` bytes: (status, slot when there is one).
    fn roundtrip(stream: &mut UnixStream, req: &[u8], len: usize) -> (u8, Option<u32>) {
        stream.write_all(req).unwrap();
        let mut resp = vec![0u8; len];
        stream.read_exact(&mut resp).unwrap();
        assert_eq!(&resp[..4], b"RIPM", "magic");
        assert_eq!(usize::from(u16::from_le_bytes([resp[4], resp[5]])), len);
        assert_eq!(resp[6], MSG_RESPONSE);
        let slot = (len == REGISTER_RESPONSE_SIZE)
            .then(|| u32::from_le_bytes(resp[12..16].try_into().unwrap()));
        (resp[8], slot)
    }

    #[test]
    fn bad_requests_get_status_2_or_a_closed_connection() {
        let agent = Agent::start_in_temp().unwrap();
        let connect = || {
            let stream = UnixStream::connect(agent.socket_path()).unwrap();
            stream
                .set_read_timeout(Some(Duration::from_secs(5)))
                .unwrap();
            stream
        };
        let mut short = request(MSG_REGISTER, 5);
        short[4] = 20;
        assert_eq!(
            roundtrip(&mut connect(), &short[..20], REGISTER_RESPONSE_SIZE),
            (STATUS_INVALID, Some(0))
        );
        for bad in [[0u8; 8].to_vec(), {
            let mut r = request(MSG_DEREGISTER, 5);
            r[6] = 9;
            r
        }] {
            let mut stream = connect();
            stream.write_all(&bad).unwrap();
            let mut byte = [0u8; 1];
            // Closed: an EOF, or a reset when the agent left bytes of ours unread.
            let closed = match stream.read(&mut byte) {
                Ok(n) => n == 0,
                Err(e) => e.kind() == ErrorKind::ConnectionReset,
            };
            assert!(closed, "not closed after {bad:?}");
        }
        let mut stream = connect();
        let answer = roundtrip(&mut stream, &request(MSG_DEREGISTER, 99), DEREGISTER_SIZE);
        assert_eq!(answer, (STATUS_INVALID, None), "never registered");
        assert!(agent.registrations().is_empty());
    }

    #[test]
    fn registers_assigns_slots_and_writes_seqlocked_hints() {
        let agent = Agent::start_in_temp().unwrap();
        let bytes = std::fs::read(agent.hint_path()).unwrap();
        assert_eq!(bytes.len(), HINT_FILE_SIZE);
        assert_eq!(
            u32::from_ne_bytes(bytes[0..4].try_into().unwrap()),
            HINT_MAGIC
        );
        assert_eq!(u32::from_ne_bytes(bytes[4..8].try_into().unwrap()), 256);
        agent.set_default_sup_bw(512);
        let mut stream = UnixStream::connect(agent.socket_path()).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let register = |stream: &mut UnixStream, id| {
            roundtrip(stream, &request(MSG_REGISTER, id), REGISTER_RESPONSE_SIZE)
        };
        assert_eq!(register(&mut stream, 77), (STATUS_SUCCESS, Some(0)));
        let mut second = UnixStream::connect(agent.socket_path()).unwrap();
        second
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        assert_eq!(register(&mut second, 78), (STATUS_SUCCESS, Some(1)));
        let (bw, seq, src, dst) = agent.entry(0);
        assert_eq!((bw, seq % 2), (512, 0));
        assert_eq!(
            (src.to_ne_bytes(), dst.to_ne_bytes()),
            ([10, 0, 0, 1], [10, 0, 0, 2])
        );
        agent.set_sup_bw(1, 1024);
        let (bw, seq, _, _) = agent.entry(1);
        assert_eq!((bw, seq), (1024, 4));
        let deregister = |stream: &mut UnixStream, id| {
            roundtrip(stream, &request(MSG_DEREGISTER, id), DEREGISTER_SIZE).0
        };
        assert_eq!(deregister(&mut stream, 77), STATUS_SUCCESS);
        assert_eq!(deregister(&mut stream, 77), STATUS_INVALID);
        let regs = agent.registrations();
        assert_eq!(regs.len(), 2);
        assert_eq!(
            (regs[0].sup_src, regs[0].sup_dst),
            (Ipv4Addr::new(10, 1, 0, 1), Ipv4Addr::new(10, 1, 0, 2))
        );
        assert!(!regs[0].active && regs[1].active);
        let (hint, socket) = (
            agent.hint_path().to_path_buf(),
            agent.socket_path().to_path_buf(),
        );
        drop((stream, second));
        drop(agent);
        assert!(!hint.exists() && !socket.exists());
    }
}
