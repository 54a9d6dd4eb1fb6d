//! The writer: creating, initialising, owning and removing one probes file per process.
//!
//! # Thread safety
//!
//! [`ProbesFile`] is `Send + Sync` and hands out handles that borrow it. Any number of threads
//! may count at once: [`ProbesFile::rail`] and [`ProbesFile::transfers`] give each thread the
//! handles of its own writer lane ([`crate::lanes`]), to be used by that thread only (take a
//! fresh handle per call rather than passing one to another thread);
//! [`ProbesFile::record_slow_transfer`] gives a record up rather than wait when another thread
//! is writing the ring (counted); [`ProbesFile::heartbeat`] is a plain store (the last writer
//! wins) and [`ProbesFile::claim_connection`] a CAS per slot. A connection handle has one
//! writer: the thread that moves the connection's data (NCCL drives a comm from one thread).
//!
//! # Resource cleanup
//!
//! [`ProbesFile::remove`] (or dropping the `ProbesFile`) stamps `closed_ns` in the header and
//! unlinks the file; the mapping itself lives until the `ProbesFile` is dropped, so handles
//! stay valid after `remove`. A plugin that keeps the `ProbesFile` in a `static` (`OnceLock`)
//! gets `'static` handles and calls `remove` from its finalize path. A crashed writer leaves
//! its file behind; the collector reaps it (stale heartbeat and dead pid).

use std::fs::{self, OpenOptions};
use std::io;
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64 as SerialCounter};
use std::sync::Arc;

use memmap2::{MmapOptions, MmapRaw};

use crate::claims::FreeSlots;
use crate::conn::{self, ConnectionProbe};
use crate::counters::{RailProbe, TransferProbe};
use crate::declared::{
    self, Declaration, ProcessCounter, CONNECTION_CLAIM_FAILURES, DECLARATIONS,
    DECLARATION_CAPACITY, EVENTS_CONTENDED,
};
use crate::guard::{GuardedRange, Lost};
use crate::lanes;
use crate::layout::{
    DeclarationRecord, DeviceDesc, FileImage, Header, RailDesc, ABI_VERSION, FILE_LEN, HEADER_LEN,
    MAGIC, MAX_DEVICES, MAX_NICS, MAX_RAILS, REGION_COUNT, REGION_TABLE, SHARED_LANE,
};
use crate::ring::Ring;
use crate::sync::{AtomicU32, AtomicU64, Ordering};
use crate::types::{encode_name, now_ns, ConnectionInfo, DeviceEntry, SlowTransfer, WriterInfo};

/// The target of every disabled handle: a zeroed, file-shaped block nobody reads. It lives in
/// `.bss`, so it costs no file size and only the pages actually written.
// SAFETY: all-zero bytes are a valid FileImage: it holds only atomics and byte arrays.
pub(crate) static DUMMY: FileImage = unsafe { core::mem::zeroed() };

/// The file name a writer with `pid` started at `start_ns` uses: `mpib-<pid>-<start_ns>.probes`.
pub fn file_name(pid: u32, start_ns: u64) -> String {
    format!("mpib-{pid}-{start_ns}.probes")
}

/// A created file: its mapping, shared by every handle that writes it.
pub(crate) struct Owner {
    /// Turns a fault of the mapping (the file shrank) into zero pages; dropped before `_map`.
    guard: GuardedRange,
    /// Keeps the mapping alive for as long as `image` is used.
    _map: MmapRaw,
    /// The file's device and inode, to notice it was removed or replaced.
    identity: (u64, u64),
    image: NonNull<FileImage>,
    /// Unique within the process: which file a thread's cached lane is for.
    serial: u64,
    path: PathBuf,
    removed: AtomicBool,
    /// Which connection slots are free (src/claims.rs): process memory, so that no reader of
    /// the file can steer where the writer claims.
    free_slots: FreeSlots,
}

// SAFETY: the image is shared memory accessed only through atomics (and header fields that
// are immutable once published); the mapping lives as long as the Owner.
unsafe impl Send for Owner {}
// SAFETY: as for Send.
unsafe impl Sync for Owner {}

impl Owner {
    pub(crate) fn image(&self) -> &FileImage {
        // SAFETY: `image` points into `_map`, a live FileImage-sized mapping.
        unsafe { self.image.as_ref() }
    }

    pub(crate) fn serial(&self) -> u64 {
        self.serial
    }
}

/// The writer side of a probes file (or, [`disabled`](ProbesFile::disabled), of nothing).
pub struct ProbesFile {
    image: NonNull<FileImage>,
    owner: Option<Arc<Owner>>,
}

/// The name the plugin uses for its probes handle.
pub type Probes = ProbesFile;

// SAFETY: the image is shared memory accessed only through atomics, plus header fields that
// are immutable after `create` returns; the mapping (or the static) outlives every borrow.
unsafe impl Send for ProbesFile {}
// SAFETY: as for Send: `&ProbesFile` only allows atomic access to the image.
unsafe impl Sync for ProbesFile {}

impl ProbesFile {
    /// Create `dir/mpib-<pid>-<start_ns>.probes` (creating `dir` too), size it, map it,
    /// initialise it and publish its version last.
    ///
    /// The file declares this version's values ([`DECLARATIONS`]).
    ///
    /// # Errors
    ///
    /// `InvalidInput` if `info.rails` does not hold 1 to [`MAX_NICS`] NICs, or `info.devices`
    /// 1 to [`MAX_DEVICES`] devices naming NIC slots that exist; otherwise any error from
    /// creating the directory or the file (which must not exist yet), sizing or mapping it.
    pub fn create(dir: &Path, info: &WriterInfo) -> io::Result<ProbesFile> {
        ProbesFile::create_declaring(dir, info, DECLARATIONS)
    }

    /// [`create`](ProbesFile::create) with `declarations` in the file's declarations region
    /// instead of this version's: how a test (or a newer writer) shows a reader values it was
    /// not built with.
    ///
    /// # Errors
    ///
    /// As `create`, and `InvalidInput` naming the declaration that [`declared::check`]
    /// refuses.
    pub fn create_declaring(
        dir: &Path,
        info: &WriterInfo,
        declarations: &[Declaration],
    ) -> io::Result<ProbesFile> {
        if let Err(msg) = check_nics(info) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, msg));
        }
        if let Err(msg) = declared::check(declarations) {
            let msg = format!("probes: {msg}");
            return Err(io::Error::new(io::ErrorKind::InvalidInput, msg));
        }
        fs::create_dir_all(dir)?;
        let path = dir.join(file_name(info.pid, info.start_ns));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)?;
        let mapped = file
            .set_len(FILE_LEN as u64)
            .and_then(|()| MmapOptions::new().len(FILE_LEN).map_raw(&file));
        let map = match mapped {
            Ok(map) => map,
            Err(err) => {
                let _ = fs::remove_file(&path);
                return Err(err);
            }
        };
        let Some(image) = NonNull::new(map.as_mut_ptr().cast::<FileImage>()) else {
            let _ = fs::remove_file(&path);
            return Err(io::Error::other("probes: mmap returned null"));
        };
        let guarded = GuardedRange::new(map.as_ptr(), FILE_LEN)
            .and_then(|guard| Ok((guard, file.metadata()?)));
        let (guard, metadata) = match guarded {
            Ok(guarded) => guarded,
            Err(err) => {
                let _ = fs::remove_file(&path);
                return Err(err);
            }
        };
        // SAFETY: the mapping is FILE_LEN = size_of::<FileImage>() bytes, page-aligned (so
        // 128-aligned), readable and writable, and lives in `owner` as long as `image`.
        unsafe { write_header(image.as_ptr().cast::<Header>(), &header_image(info)) };
        let records = declaration_records(declarations);
        // SAFETY: as above; the declarations region lies inside the mapping, no reference to
        // it exists yet, and the records are plain bytes written before the version.
        unsafe {
            let at = core::ptr::addr_of_mut!((*image.as_ptr()).declarations);
            at.write(records);
        }
        // SAFETY: as above; the header is now initialised, everything else is zero (valid).
        let header = unsafe { &image.as_ref().header };
        // SYNC: pairs with the Relaxed load + fence(Acquire) of the version in the reader's
        // `open`: a reader that sees the version sees the whole initialised header (Aeron's
        // cnc_version, written last).
        header.abi_version.store(ABI_VERSION, Ordering::Release);
        static SERIALS: SerialCounter = SerialCounter::new(1);
        let owner = Owner {
            guard,
            _map: map,
            identity: (metadata.dev(), metadata.ino()),
            image,
            serial: SERIALS.fetch_add(1, Ordering::Relaxed),
            path,
            removed: AtomicBool::new(false),
            free_slots: FreeSlots::default(),
        };
        Ok(ProbesFile {
            image,
            owner: Some(Arc::new(owner)),
        })
    }

    /// A probes handle that writes nowhere anyone reads (`MPIB_PROBES=0`): every handle it
    /// gives out works and costs the same as an enabled one, so call sites never branch.
    pub fn disabled() -> ProbesFile {
        ProbesFile {
            image: NonNull::from(&DUMMY),
            owner: None,
        }
    }

    #[inline]
    fn image(&self) -> &FileImage {
        // SAFETY: `image` points to the owned mapping or to DUMMY, both valid FileImages for
        // at least as long as `self`; all mutation goes through atomics.
        unsafe { self.image.as_ref() }
    }

    /// Whether this writes a real file.
    pub fn is_enabled(&self) -> bool {
        self.owner.is_some()
    }

    /// The file's path (`None` when disabled).
    pub fn path(&self) -> Option<&Path> {
        self.owner.as_ref().map(|o| o.path.as_path())
    }

    /// The calling thread's writer lane (lane 0 of the dummy when disabled).
    #[inline]
    fn lane(&self) -> usize {
        self.owner.as_ref().map_or(0, lanes::lane_of)
    }

    /// The calling thread's handle of NIC slot `nic` (an index into [`WriterInfo::rails`]); a
    /// disabled handle past [`MAX_NICS`]. A slot the writer did not describe (from
    /// `rails.len()` on) still has its block, which no reader reads. For this thread only
    /// (module docs).
    #[inline]
    pub fn rail(&self, nic: usize) -> RailProbe<'_> {
        if nic >= MAX_NICS {
            return RailProbe::disabled();
        }
        let lane = self.lane();
        match self.image().rails.get(lane * MAX_NICS + nic) {
            Some(block) => RailProbe::new(block, lane == SHARED_LANE),
            None => RailProbe::disabled(),
        }
    }

    /// The calling thread's handle of the transfer-by-rail-mask counters (for this thread only).
    #[inline]
    pub fn transfers(&self) -> TransferProbe<'_> {
        let lane = self.lane();
        match self.image().lanes.get(lane) {
            Some(block) => TransferProbe::new(block, lane == SHARED_LANE),
            None => TransferProbe::disabled(),
        }
    }

    /// Refresh the heartbeat (ns since the Unix epoch). Any thread; a plain store.
    #[inline]
    pub fn heartbeat(&self, now_ns: u64) {
        // SYNC: none: an independent value; readers load it Relaxed.
        self.image()
            .header
            .heartbeat_ns
            .store(now_ns, Ordering::Relaxed);
    }

    /// Claim a connection slot; `None` when disabled or when the table has no free slot (the
    /// failure is counted). Any thread. Callers that want no branch later use
    /// `.unwrap_or_else(ConnectionProbe::disabled)`.
    pub fn claim_connection(&self, info: &ConnectionInfo) -> Option<ConnectionProbe<'_>> {
        let owner = self.owner.as_ref()?;
        let image = self.image();
        let table = conn::ClaimTable {
            slots: &image.conns,
            free: &owner.free_slots,
            high_water: &image.header.connection_high_water,
        };
        let claimed = conn::claim(&table, info);
        if claimed.is_none() {
            // Several threads may claim: a locked add, off the hot path.
            self.add(CONNECTION_CLAIM_FAILURES, 1);
        }
        claimed
    }

    /// Add `n` to the process counter `counter` (a [`crate::declared`] constant such as
    /// `CONNECTIONS_WITHOUT_AGENT`). Any thread: a locked add, off the hot path.
    pub fn add(&self, counter: ProcessCounter, n: u64) {
        let values = &self.image().process.values;
        values[counter.slot()].fetch_add(n, Ordering::Relaxed);
    }

    /// Append a slow (or sampled) transfer to the event ring, overwriting the oldest record
    /// when full. Any thread; never waits: while another thread is writing the ring the record
    /// is given up and counted (`events_contended`).
    #[inline]
    pub fn record_slow_transfer(&self, transfer: &SlowTransfer) {
        let image = self.image();
        if let Some(ring) = Ring::new(&image.ring, &image.events) {
            if ring.try_push(&transfer.encode()).is_none() {
                self.add(EVENTS_CONTENDED, 1);
            }
        }
    }

    /// Total event records written so far.
    pub fn events_written(&self) -> u64 {
        let image = self.image();
        Ring::new(&image.ring, &image.events).map_or(0, |ring| ring.written())
    }

    /// What happened to the file if another process shrank, removed or replaced it (the
    /// writer goes on writing into memory nobody reads): `None` while it is fine, when
    /// disabled, and after [`remove`](ProbesFile::remove). One `stat` of the path; call it off
    /// the hot path.
    pub fn lost(&self) -> Option<&'static str> {
        let owner = self.owner.as_ref()?;
        if owner.removed.load(Ordering::Acquire) {
            return None;
        }
        owner
            .guard
            .lost(&owner.path, owner.identity)
            .map(Lost::reason)
    }

    /// Mark a clean shutdown (`closed_ns`) and unlink the file. Idempotent; handles stay
    /// valid until the `ProbesFile` is dropped. A no-op when disabled.
    ///
    /// # Errors
    ///
    /// Any error from unlinking other than "not found".
    pub fn remove(&self) -> io::Result<()> {
        let Some(owner) = &self.owner else {
            return Ok(());
        };
        if owner.removed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        // SYNC: none: read Relaxed by the collector, which only compares it with 0.
        let header = &self.image().header;
        header.closed_ns.store(now_ns().max(1), Ordering::Relaxed);
        // Another file now at the path is not ours to remove (the race with a rename between
        // this check and the unlink needs a process that can write the directory anyway).
        let ours = fs::symlink_metadata(&owner.path).map(|m| (m.dev(), m.ino()));
        if ours.is_ok_and(|identity| identity != owner.identity) {
            return Ok(());
        }
        match fs::remove_file(&owner.path) {
            Err(err) if err.kind() != io::ErrorKind::NotFound => Err(err),
            _ => Ok(()),
        }
    }
}

impl Drop for ProbesFile {
    fn drop(&mut self) {
        let _ = self.remove();
    }
}

impl std::fmt::Debug for ProbesFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProbesFile")
            .field("path", &self.path())
            .finish_non_exhaustive()
    }
}

/// 1 to [`MAX_NICS`] NIC slots; 1 to [`MAX_DEVICES`] devices, each naming slots that exist.
fn check_nics(info: &WriterInfo) -> Result<(), String> {
    if info.rails.is_empty() || info.rails.len() > MAX_NICS {
        return Err(format!(
            "probes: 1 to {MAX_NICS} NICs, got {}",
            info.rails.len()
        ));
    }
    if info.devices.is_empty() || info.devices.len() > MAX_DEVICES {
        let count = info.devices.len();
        return Err(format!("probes: 1 to {MAX_DEVICES} devices, got {count}"));
    }
    match info
        .devices
        .iter()
        .find(|d| d.nics.iter().any(|&nic| nic >= info.rails.len()))
    {
        Some(bad) => Err(format!(
            "probes: device {} names NIC slots {:?} of {}",
            bad.name,
            bad.nics,
            info.rails.len()
        )),
        None => Ok(()),
    }
}

/// The rail NIC slot `nic` serves: SUP when it is some device's SUP NIC and not its SOUT NIC.
pub(crate) fn rail_of(devices: &[DeviceEntry], nic: usize) -> usize {
    let sup = devices.iter().any(|d| d.nics[1] == nic && d.nics[0] != nic);
    usize::from(sup)
}

/// The header a writer with `info` publishes (version still 0).
fn header_image(info: &WriterInfo) -> Header {
    let rail = |i: usize| RailDesc {
        device: encode_name(info.rails.get(i).map_or("", |r| r.device.as_str())),
        port: info.rails.get(i).map_or(0, |r| r.port),
        speed_mbps: info.rails.get(i).map_or(0, |r| r.speed_mbps),
        rail: if i < info.rails.len() {
            rail_of(&info.devices, i) as u8
        } else {
            0
        },
        _reserved: [0; 55],
    };
    let device = |i: usize| DeviceDesc {
        name: encode_name(info.devices.get(i).map_or("", |d| d.name.as_str())),
        nics: info
            .devices
            .get(i)
            .map_or([0; MAX_RAILS], |d| d.nics.map(|n| n as u8)),
        _reserved: [0; 62],
    };
    Header {
        magic: MAGIC,
        abi_version: AtomicU32::new(0),
        header_len: HEADER_LEN as u32,
        file_len: FILE_LEN as u64,
        writer_pid: info.pid,
        rail_count: info.rails.len().min(MAX_NICS) as u32,
        start_ns: info.start_ns,
        heartbeat_ns: AtomicU64::new(info.start_ns),
        closed_ns: AtomicU64::new(0),
        slow_threshold_ns: info.slow_threshold_ns,
        sample_one_in: info.sample_one_in,
        region_count: REGION_COUNT as u32,
        regions: REGION_TABLE,
        device_count: info.devices.len().min(MAX_DEVICES) as u32,
        connection_high_water: AtomicU32::new(0),
        host_name: encode_name(&info.host),
        rails: std::array::from_fn(rail),
        devices: std::array::from_fn(device),
    }
}

/// The declarations region of a file declaring `declarations` (checked: they fit).
fn declaration_records(declarations: &[Declaration]) -> [DeclarationRecord; DECLARATION_CAPACITY] {
    let mut records = [DeclarationRecord::EMPTY; DECLARATION_CAPACITY];
    for (record, d) in records.iter_mut().zip(declarations) {
        *record = DeclarationRecord::encode(d);
    }
    records
}

/// Copy `src` into the header at `dst`, every byte except the version word (bytes 8..12),
/// which a reader may be polling and which `create` stores last, atomically.
///
/// # Safety
///
/// `dst` must be valid for writes of `HEADER_LEN` bytes and not otherwise accessed by this
/// process during the call.
unsafe fn write_header(dst: *mut Header, src: &Header) {
    const VERSION_AT: usize = core::mem::offset_of!(Header, abi_version);
    const AFTER_VERSION: usize = VERSION_AT + 4;
    let src = (src as *const Header).cast::<u8>();
    let dst = dst.cast::<u8>();
    // SAFETY: both ranges lie inside one HEADER_LEN-byte header (caller contract for `dst`,
    // a live value for `src`), a stack value and the mapping do not overlap, and Header has
    // no implicit padding (its size and offsets are asserted in `layout`).
    unsafe {
        core::ptr::copy_nonoverlapping(src, dst, VERSION_AT);
        core::ptr::copy_nonoverlapping(
            src.add(AFTER_VERSION),
            dst.add(AFTER_VERSION),
            HEADER_LEN - AFTER_VERSION,
        );
    }
}
