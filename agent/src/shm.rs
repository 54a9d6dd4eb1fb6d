//! The hint file the agent owns: created once, reused across restarts, written with the seqlock.
//!
//! Why reuse: plugins map the file when their connection registers and read it on every
//! `isend` for the life of the job. A restarted agent that replaced the file would leave every
//! running job reading a file nobody writes; one that truncated it would deliver SIGBUS to them.
//! So the agent maps the existing file when it is one of ours (our owner, a regular file, the
//! right size and header), takes its entries back as flows, and only ever grows or creates it.
//! A new file is built under a temporary name and renamed into place, so a plugin never maps a
//! half-written header. Layout and seqlock: `mpib_proto::hint` (docs/AGENT.md).

use std::fs::{File, OpenOptions};
use std::io;
use std::net::Ipv4Addr;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, AtomicU32, Ordering};

use memmap2::MmapMut;
use mpib_probes::guard::GuardedRange;
use mpib_proto::hint::{
    check_header, encode_header, entry_offset, header_fields, DST_IP_OFFSET, HINT_FILE_LEN,
    HINT_HEADER_LEN, HINT_MAX_ENTRIES, SEQ_OFFSET, SRC_IP_OFFSET, SUP_BW_OFFSET,
};

/// One entry as read back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    /// SUP share, parts per 1024.
    pub sup_bw: u32,
    /// Seqlock sequence (even when stable).
    pub seq: u32,
    /// SOUT source address of the flow (0.0.0.0 when the slot is free).
    pub src: Ipv4Addr,
    /// SOUT destination address.
    pub dst: Ipv4Addr,
}

/// The mapped hint file.
pub struct HintFile {
    /// Turns a fault (someone shrank the file) into zero pages instead of a SIGBUS that would
    /// end the agent; dropped before `map`.
    guard: GuardedRange,
    map: MmapMut,
    path: PathBuf,
    /// Held open with an exclusive `flock`: one agent per hint file (two would hand out the same
    /// slots and each take the other's writes for an operator's).
    _lock: File,
}

/// How the file was obtained.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Opened {
    /// A new file was created.
    Created,
    /// An existing file of ours was reused (entries kept).
    Reused,
    /// An existing file of ours was damaged (size or header) and was reinitialised in place.
    Repaired,
}

impl HintFile {
    /// Opens `path` for writing: reuses a valid file of ours, repairs a damaged one, creates a
    /// missing one. Refuses a symlink, a non-regular file or a file owned by another user.
    pub fn open(path: &Path) -> Result<(HintFile, Opened), String> {
        let name = path.display();
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            create_private_dir(parent)?;
        }
        match OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
        {
            Ok(file) => Self::reuse(file, path),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Self::create(path),
            Err(e) => Err(format!(
                "hint file {name}: cannot open ({e}); a symlink is refused"
            )),
        }
    }

    fn reuse(file: File, path: &Path) -> Result<(HintFile, Opened), String> {
        let name = path.display();
        let meta = file
            .metadata()
            .map_err(|e| format!("hint file {name}: cannot stat: {e}"))?;
        if !meta.file_type().is_file() {
            return Err(format!("hint file {name}: not a regular file"));
        }
        // SAFETY: geteuid has no preconditions.
        let uid = unsafe { libc::geteuid() };
        if meta.uid() != uid {
            return Err(format!(
                "hint file {name}: owned by uid {}, not by this agent (uid {uid}); remove it or \
                 use another MPIB_HINT_PATH / MPIB_AGENT_TAG",
                meta.uid()
            ));
        }
        let mut opened = Opened::Reused;
        if meta.len() < HINT_FILE_LEN as u64 {
            // Grow, never shrink: a plugin mapping the file must never see it get shorter.
            file.set_len(HINT_FILE_LEN as u64)
                .map_err(|e| format!("hint file {name}: cannot extend: {e}"))?;
            opened = Opened::Repaired;
        }
        let mut hints = HintFile::map(&file, path)?;
        let header: [u8; HINT_HEADER_LEN] = hints.map[..HINT_HEADER_LEN]
            .try_into()
            .map_err(|_| format!("hint file {name}: short mapping"))?;
        let (magic, max_entries) = header_fields(&header);
        if check_header(magic, max_entries).is_err() {
            hints.map.fill(0);
            hints.map[..HINT_HEADER_LEN].copy_from_slice(&encode_header());
            opened = Opened::Repaired;
        }
        Ok((hints, opened))
    }

    fn create(path: &Path) -> Result<(HintFile, Opened), String> {
        let name = path.display();
        let temporary = path.with_extension(format!("new.{}", std::process::id()));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&temporary)
            .map_err(|e| format!("hint file {}: cannot create: {e}", temporary.display()))?;
        // Readable by every job on the host, whatever the agent's umask: jobs of other users
        // than the agent's map it. It holds no secret, only each flow's SUP share and its SOUT
        // address pair (which every local user can see in the routing table anyway); only the
        // agent writes it.
        let _ = file.set_permissions(std::fs::Permissions::from_mode(0o644));
        let built = file
            .set_len(HINT_FILE_LEN as u64)
            .map_err(|e| format!("hint file {name}: cannot size: {e}"))
            .and_then(|()| HintFile::map(&file, path))
            .and_then(|mut hints| {
                hints.map[..HINT_HEADER_LEN].copy_from_slice(&encode_header());
                hints
                    .map
                    .flush()
                    .map_err(|e| format!("hint file {name}: cannot flush: {e}"))?;
                std::fs::rename(&temporary, path)
                    .map_err(|e| format!("hint file {name}: cannot rename into place: {e}"))?;
                Ok(hints)
            });
        if built.is_err() {
            let _ = std::fs::remove_file(&temporary);
        }
        built.map(|hints| (hints, Opened::Created))
    }

    fn map(file: &File, path: &Path) -> Result<HintFile, String> {
        let lock = file
            .try_clone()
            .map_err(|e| format!("hint file {}: {e}", path.display()))?;
        // SAFETY: flock on a valid descriptor; non-blocking.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return Err(format!(
                "hint file {}: another mpib-agent holds it (one agent per hint file; use \
                 another MPIB_HINT_PATH or MPIB_AGENT_TAG)",
                path.display()
            ));
        }
        // SAFETY: a shared writable mapping of a file this process owns, at least HINT_FILE_LEN
        // long (checked or set by the callers); the agent never shrinks it. Plugins map it
        // read-only and every field is accessed through atomics on both sides.
        let map = unsafe { MmapMut::map_mut(file) }
            .map_err(|e| format!("hint file {}: cannot map: {e}", path.display()))?;
        if map.len() < HINT_FILE_LEN {
            return Err(format!(
                "hint file {}: {} bytes mapped, expected {HINT_FILE_LEN}",
                path.display(),
                map.len()
            ));
        }
        let guard = GuardedRange::new(map.as_ptr(), map.len())
            .map_err(|e| format!("hint file {}: {e}", path.display()))?;
        Ok(HintFile {
            guard,
            map,
            path: path.to_path_buf(),
            _lock: lock,
        })
    }

    /// Open the file at the same path again (repairing it), for a damaged mapping. The lock
    /// moves to the new descriptor; on failure this one keeps it.
    ///
    /// # Errors
    ///
    /// As [`HintFile::open`].
    pub fn reopen(&mut self) -> Result<Opened, String> {
        // SAFETY: flock on our own valid descriptor.
        unsafe { libc::flock(self._lock.as_raw_fd(), libc::LOCK_UN) };
        match HintFile::open(&self.path) {
            Ok((hints, opened)) => {
                *self = hints;
                Ok(opened)
            }
            Err(e) => {
                // SAFETY: as above.
                unsafe { libc::flock(self._lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
                Err(e)
            }
        }
    }

    /// Whether another process shrank the file (under the mapping: the agent's writes since
    /// went to private zero pages; or not yet touched), removed it or put another file in its
    /// place: plugins reading it have moved to all SOUT, and new connections could not map it.
    /// The agent then opens the file again (which repairs or recreates it) and writes its flows
    /// back. Two `stat`s, once per interval.
    pub fn damaged(&self) -> bool {
        // The file as the descriptor sees it: shrunk, even if no write has faulted yet.
        let ours = match self._lock.metadata() {
            Ok(m) if m.len() < HINT_FILE_LEN as u64 => return true,
            Ok(m) => (m.dev(), m.ino()),
            Err(_) => return self.guard.faulted(),
        };
        self.guard.lost(&self.path, ours).is_some()
    }

    /// Where the file is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn word(&self, slot: usize, field: usize) -> &AtomicU32 {
        assert!(slot < HINT_MAX_ENTRIES, "hint slot {slot} out of range");
        let offset = entry_offset(slot) + field;
        // SAFETY: offset + 4 <= HINT_FILE_LEN <= the mapping's length (checked in `map`); the
        // mapping is page aligned and entries are 16-byte aligned, so the u32 is aligned; the
        // memory is shared with readers, hence atomic access only.
        unsafe { AtomicU32::from_ptr(self.map.as_ptr().add(offset) as *mut u32) }
    }

    /// Reads entry `slot`.
    pub fn entry(&self, slot: usize) -> Entry {
        let load = |field| self.word(slot, field).load(Ordering::Acquire);
        Entry {
            sup_bw: load(SUP_BW_OFFSET),
            seq: load(SEQ_OFFSET),
            src: Ipv4Addr::from(load(SRC_IP_OFFSET).to_ne_bytes()),
            dst: Ipv4Addr::from(load(DST_IP_OFFSET).to_ne_bytes()),
        }
    }

    /// Writes `sup_bw` into `slot` under the seqlock: seq odd, value, seq even (one higher pair).
    pub fn write_sup_bw(&self, slot: usize, sup_bw: u32) {
        let seq = self.word(slot, SEQ_OFFSET);
        let before = seq.load(Ordering::Relaxed) & !1;
        seq.store(before.wrapping_add(1), Ordering::Relaxed);
        // SYNC: pairs with the reader's Acquire load of sup_bw and second seq load
        // (mpib_proto::hint::read_hint): a reader that sees the new value sees seq odd or
        // changed and retries.
        fence(Ordering::Release);
        self.word(slot, SUP_BW_OFFSET)
            .store(sup_bw, Ordering::Relaxed);
        seq.store(before.wrapping_add(2), Ordering::Release);
    }

    /// Marks `slot` as the flow `src -> dst` (addresses as on the wire, network order).
    pub fn write_flow(&self, slot: usize, src: Ipv4Addr, dst: Ipv4Addr) {
        // Outside the seqlock: the plugin never reads the addresses (they are for agents and
        // tools, and for a restarted agent to take its flows back).
        let release = Ordering::Release;
        self.word(slot, SRC_IP_OFFSET)
            .store(u32::from_ne_bytes(src.octets()), release);
        self.word(slot, DST_IP_OFFSET)
            .store(u32::from_ne_bytes(dst.octets()), release);
    }

    /// The slots that name a flow (a non-zero address pair): what a restarted agent takes back.
    pub fn flows(&self) -> Vec<(usize, Entry)> {
        (0..HINT_MAX_ENTRIES)
            .map(|slot| (slot, self.entry(slot)))
            .filter(|(_, e)| !e.src.is_unspecified() || !e.dst.is_unspecified())
            .collect()
    }
}

/// Creates the directory (mode 0755) if missing; refuses one owned by another user (anyone who
/// created `/tmp/mpib` first would otherwise control what the plugins read) and one its group or
/// others may write (they could remove the socket and bind their own, or swap the hint file:
/// every job would then register with, and read shares from, an impostor).
pub fn create_private_dir(dir: &Path) -> Result<(), String> {
    match std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)
    {
        Ok(()) => {}
        Err(e) => return Err(format!("directory {}: cannot create: {e}", dir.display())),
    }
    let meta = std::fs::symlink_metadata(dir)
        .map_err(|e| format!("directory {}: cannot stat: {e}", dir.display()))?;
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    if !meta.is_dir() {
        return Err(format!("{}: not a directory", dir.display()));
    }
    if meta.uid() != uid && meta.uid() != 0 {
        return Err(format!(
            "directory {} is owned by uid {}, not by this agent (uid {uid}) or root",
            dir.display(),
            meta.uid()
        ));
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(format!(
            "directory {} is writable by its group or others (mode {mode:04o}): they could \
             replace the agent's socket or hint file; chmod go-w it or use another directory",
            dir.display()
        ));
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use mpib_proto::hint::{read_hint, HintCell};

    struct Cell<'a>(&'a HintFile, usize);
    impl HintCell for Cell<'_> {
        fn load_seq(&self) -> u32 {
            self.0.entry(self.1).seq
        }
        fn load_sup_bw(&self) -> u32 {
            self.0.entry(self.1).sup_bw
        }
    }

    fn temp(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("mpib-agent-shm-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir.join("hints")
    }

    #[test]
    fn create_write_and_reuse_keeps_entries() {
        let path = temp("reuse");
        let (hints, how) = HintFile::open(&path).unwrap();
        assert_eq!(how, Opened::Created);
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            HINT_FILE_LEN as u64
        );
        hints.write_flow(7, Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2));
        hints.write_sup_bw(7, 683);
        assert_eq!(read_hint(&Cell(&hints, 7), 4), Some(683));
        assert_eq!(hints.entry(7).seq, 2);
        drop(hints);
        let (again, how) = HintFile::open(&path).unwrap();
        assert_eq!(how, Opened::Reused);
        let flows = again.flows();
        assert_eq!(flows.len(), 1);
        assert_eq!((flows[0].0, flows[0].1.sup_bw), (7, 683));
        assert_eq!(flows[0].1.src, Ipv4Addr::new(10, 0, 0, 1));
        std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
    }

    #[test]
    fn truncated_or_foreign_content_is_repaired_never_shrunk() {
        let path = temp("repair");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, b"garbage").unwrap();
        let (hints, how) = HintFile::open(&path).unwrap();
        assert_eq!(how, Opened::Repaired);
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            HINT_FILE_LEN as u64
        );
        assert!(hints.flows().is_empty());
        std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
    }

    #[test]
    fn a_directory_others_may_write_is_refused() {
        let path = temp("open-dir");
        let dir = path.parent().unwrap();
        std::fs::create_dir_all(dir).unwrap();
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let error = HintFile::open(&path).err().unwrap();
        assert!(
            error.contains("writable by its group or others (mode 1777)"),
            "{error}"
        );
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o750)).unwrap();
        assert!(HintFile::open(&path).is_ok());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_symlink_is_refused() {
        let path = temp("link");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", &path).unwrap();
        let error = HintFile::open(&path).err().unwrap();
        assert!(error.contains("symlink"), "{error}");
        std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
    }
}
