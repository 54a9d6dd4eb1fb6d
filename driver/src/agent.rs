//! A test agent for advanced mode (`MPIB_MODE=1`), per seed 001 §2.C: it owns the hint SHM file
//! and serves the registration socket that hands each new connection a hint slot.
//!
//! Hint file (4112 bytes, host byte order): header `{magic u32 = 0x4D504948, max_entries u32 =
//! 256, 8 reserved bytes}`, then 256 entries `{sup_bw u32, seq u32, src_ip u32, dst_ip u32}` (IPs
//! in network byte order). Socket request (32 bytes): `{magic u32 = 0x4D504952, kind u32 (1
//! register, 2 deregister), conn_id u64, sout_src [u8; 4], sout_dst [u8; 4], sup_src [u8; 4],
//! sup_dst [u8; 4]}`; response (16 bytes): `{magic u32, status i32 (0 ok), hint_slot u32,
//! reserved u32}`.

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
/// Request kind: register a connection.
pub const KIND_REGISTER: u32 = 1;
/// Request kind: deregister a connection.
pub const KIND_DEREGISTER: u32 = 2;
/// Size of a request.
pub const REQUEST_SIZE: usize = 32;
/// Size of a response.
pub const RESPONSE_SIZE: usize = 16;

/// One connection the plugin registered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registration {
    /// `(pid << 16) | counter`, chosen by the plugin.
    pub conn_id: u64,
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

    fn handle(&self, request: &[u8; REQUEST_SIZE]) -> [u8; RESPONSE_SIZE] {
        let word = |o: usize| {
            u32::from_ne_bytes([request[o], request[o + 1], request[o + 2], request[o + 3]])
        };
        let (magic, kind) = (word(0), word(4));
        let mut id = [0u8; 8];
        id.copy_from_slice(&request[8..16]);
        let conn_id = u64::from_ne_bytes(id);
        let (status, slot): (i32, u32) = if magic != REG_MAGIC {
            (-22, 0) // -EINVAL
        } else {
            let mut state = self.state();
            match kind {
                KIND_REGISTER if (state.next_slot as usize) < MAX_ENTRIES => {
                    let slot = state.next_slot;
                    state.next_slot += 1;
                    let bw = self.default_sup_bw.load(Ordering::Relaxed);
                    self.write_entry(
                        slot as usize,
                        bw,
                        Some((ip(&request[16..]), ip(&request[20..]))),
                    );
                    state.registrations.push(Registration {
                        conn_id,
                        slot,
                        sout_src: ip(&request[16..]),
                        sout_dst: ip(&request[20..]),
                        sup_src: ip(&request[24..]),
                        sup_dst: ip(&request[28..]),
                        active: true,
                    });
                    (0, slot)
                }
                KIND_REGISTER => (-28, 0), // -ENOSPC: all 256 slots handed out
                KIND_DEREGISTER => {
                    let found = state
                        .registrations
                        .iter_mut()
                        .find(|r| r.conn_id == conn_id && r.active);
                    match found {
                        Some(r) => {
                            r.active = false;
                            (0, r.slot)
                        }
                        None => (-2, 0), // -ENOENT
                    }
                }
                _ => (-22, 0),
            }
        };
        let mut response = [0u8; RESPONSE_SIZE];
        response[0..4].copy_from_slice(&REG_MAGIC.to_ne_bytes());
        response[4..8].copy_from_slice(&status.to_ne_bytes());
        response[8..12].copy_from_slice(&slot.to_ne_bytes());
        response
    }
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
/// or use one per request).
fn serve_client(shared: &Shared, mut stream: UnixStream) {
    let configured = stream
        .set_nonblocking(false)
        .and_then(|()| stream.set_read_timeout(Some(Duration::from_millis(20))));
    if configured.is_err() {
        return;
    }
    let mut request = [0u8; REQUEST_SIZE];
    let mut filled = 0;
    while !shared.stop.load(Ordering::Relaxed) {
        match stream.read(&mut request[filled..]) {
            Ok(0) => return,
            Ok(n) => {
                filled += n;
                if filled == REQUEST_SIZE {
                    filled = 0;
                    if stream.write_all(&shared.handle(&request)).is_err() {
                        return;
                    }
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) => {}
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(kind: u32, conn_id: u64) -> [u8; REQUEST_SIZE] {
        let mut r = [0u8; REQUEST_SIZE];
        r[0..4].copy_from_slice(&REG_MAGIC.to_ne_bytes());
        r[4..8].copy_from_slice(&kind.to_ne_bytes());
        r[8..16].copy_from_slice(&conn_id.to_ne_bytes());
        r[16..20].copy_from_slice(&[10, 0, 0, 1]);
        r[20..24].copy_from_slice(&[10, 0, 0, 2]);
        r
    }

    fn roundtrip(stream: &mut UnixStream, req: &[u8; REQUEST_SIZE]) -> (u32, i32, u32) {
        stream.write_all(req).unwrap();
        let mut resp = [0u8; RESPONSE_SIZE];
        stream.read_exact(&mut resp).unwrap();
        let w = |o: usize| u32::from_ne_bytes(resp[o..o + 4].try_into().unwrap());
        (w(0), w(4) as i32, w(8))
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
        assert_eq!(roundtrip(&mut stream, &request(1, 77)), (REG_MAGIC, 0, 0));
        let mut second = UnixStream::connect(agent.socket_path()).unwrap();
        second
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        assert_eq!(roundtrip(&mut second, &request(1, 78)), (REG_MAGIC, 0, 1));
        let (bw, seq, src, dst) = agent.entry(0);
        assert_eq!((bw, seq % 2), (512, 0));
        assert_eq!(
            (src.to_ne_bytes(), dst.to_ne_bytes()),
            ([10, 0, 0, 1], [10, 0, 0, 2])
        );
        agent.set_sup_bw(1, 1024);
        let (bw, seq, _, _) = agent.entry(1);
        assert_eq!((bw, seq), (1024, 4));
        assert_eq!(roundtrip(&mut stream, &request(2, 77)).1, 0);
        assert_eq!(roundtrip(&mut stream, &request(2, 77)).1, -2);
        let regs = agent.registrations();
        assert_eq!(regs.len(), 2);
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
