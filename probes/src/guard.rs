//! Shared mappings of files another process can shrink: a fault in one becomes zeros, not a
//! `SIGBUS` that ends the process.
//!
//! # Why
//!
//! The plugin maps the agent's hint file and its own probes file; the collector maps every
//! probes file; the agent maps its hint file. Any process that may write such a file can shrink
//! it (`truncate`, `open(O_TRUNC)`, an agent that re-sizes on restart), and the kernel then
//! delivers `SIGBUS` to every process that touches a page past the new end: a training job
//! dies because a cleanup script truncated a file (`docs/SECURITY.md`, "Shared files").
//! Checking the size before each access cannot close the race, and a `pread` per access would
//! put a system call on the hot path.
//!
//! # How
//!
//! A mapping is registered here ([`GuardedRange::new`]). One process-wide `SIGBUS` handler,
//! installed on the first registration, looks the faulting address up in a fixed table of
//! registered ranges (atomics only: no lock, no allocation in the handler). If the address is in
//! one, the handler maps anonymous zero pages over the whole range (`mmap` with `MAP_FIXED`) and
//! marks the range faulted; the faulting access is then retried by the CPU and reads 0 (or
//! writes into memory nobody else sees). Owners poll [`GuardedRange::faulted`] off the hot path
//! and fall back: the hint reader to all-SOUT, the probes writer to no telemetry, the collector
//! to dropping the file. A fault anywhere else is passed on to the handler that was installed
//! before (or, if there was none, the default action is restored and the fault repeats, ending
//! the process as it would have without this module).
//!
//! Zeros are a safe reading everywhere: a hint entry of zeros is an even sequence with a SUP
//! share of 0 (all SOUT), and a probes file of zeros reads as "not published" to a reader that
//! opens it again.
//!
//! A `SIGBUS` sent by another process (`kill -BUS`, `si_code <= 0`) is never looked up: it goes
//! to the previous action as it would have (the default action ends the process; an ignored one
//! is ignored). When the library that holds this module is unloaded (NCCL 2.28+ `dlclose`s its
//! net plugin), a `.fini_array` entry puts the previous action back, so no handler is left
//! pointing at unmapped code.
//!
//! A handler installed later by another library (a framework's own `SIGBUS` handler) runs
//! before this one; if it ends the process, nothing here can help.

use std::io;
use std::os::unix::fs::MetadataExt as _;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Ranges that can be registered at once (connections map the hint file once each).
pub const GUARDED_RANGES: usize = 512;

/// A slot's state word is `(generation << 2) | state`: a new registration in the same slot has
/// a new word, so a handler that read a range while the slot changed hands notices it.
const FREE: u32 = 0;
const CLAIMED: u32 = 1;
const ACTIVE: u32 = 2;
const STATE_BITS: u32 = 3;

struct Slot {
    state: AtomicU32,
    start: AtomicUsize,
    len: AtomicUsize,
    faulted: AtomicBool,
}

impl Slot {
    const fn new() -> Slot {
        Slot {
            state: AtomicU32::new(FREE),
            start: AtomicUsize::new(0),
            len: AtomicUsize::new(0),
            faulted: AtomicBool::new(false),
        }
    }
}

static SLOTS: [Slot; GUARDED_RANGES] = [const { Slot::new() }; GUARDED_RANGES];

/// The `SIGBUS` action found before the handler was installed (the one faults outside the table
/// go to); set before the handler is.
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();
/// Whether the handler is installed, or the installation error.
static INSTALLED: OnceLock<Result<(), i32>> = OnceLock::new();

/// A registered mapping; unregistered on drop (drop it before unmapping).
#[derive(Debug)]
pub struct GuardedRange {
    slot: usize,
}

impl GuardedRange {
    /// Register the mapping at `start` (page-aligned, as `mmap` returns it) of `len` bytes
    /// (rounded up to whole pages), installing the handler on first use.
    ///
    /// # Errors
    ///
    /// The handler could not be installed (the `sigaction` errno), `start` is not page-aligned,
    /// or every one of the [`GUARDED_RANGES`] entries is in use.
    pub fn new(start: *const u8, len: usize) -> io::Result<GuardedRange> {
        install()?;
        let page = page_size();
        let start = start as usize;
        if start % page != 0 || len == 0 {
            let msg = format!("guard: mapping at {start:#x} ({len} bytes) is not page-aligned");
            return Err(io::Error::new(io::ErrorKind::InvalidInput, msg));
        }
        let len = len.div_ceil(page) * page;
        for (index, slot) in SLOTS.iter().enumerate() {
            let word = slot.state.load(Ordering::Relaxed);
            if word & STATE_BITS != FREE {
                continue;
            }
            let generation = (word >> 2).wrapping_add(1) << 2;
            let claimed = slot.state.compare_exchange(
                word,
                generation | CLAIMED,
                Ordering::Acquire,
                Ordering::Relaxed,
            );
            if claimed.is_ok() {
                slot.start.store(start, Ordering::Relaxed);
                slot.len.store(len, Ordering::Relaxed);
                slot.faulted.store(false, Ordering::Relaxed);
                // SYNC: pairs with the handler's Acquire load of the state: it sees the range.
                slot.state.store(generation | ACTIVE, Ordering::Release);
                return Ok(GuardedRange { slot: index });
            }
        }
        Err(io::Error::other(format!(
            "guard: all {GUARDED_RANGES} guarded mappings are in use"
        )))
    }

    /// Whether a fault replaced the mapping with zero pages (the file shrank under it).
    #[inline]
    pub fn faulted(&self) -> bool {
        SLOTS[self.slot].faulted.load(Ordering::Relaxed)
    }
}

/// What happened to the file behind a guarded mapping, as its owner finds out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lost {
    /// It shrank under the mapping: a fault replaced the mapping with zero pages.
    Shrank = 1,
    /// Another file is at its path now (renamed over it).
    Replaced = 2,
    /// Nothing is at its path any more.
    Removed = 3,
}

impl Lost {
    /// The reason, as the WARN lines say it.
    pub const fn reason(self) -> &'static str {
        match self {
            Lost::Shrank => "it shrank under the mapping (truncated by another process)",
            Lost::Replaced => "another file was put in its place",
            Lost::Removed => "it was removed",
        }
    }

    /// A non-zero code, to keep in an atomic byte.
    pub const fn code(self) -> u8 {
        self as u8
    }

    /// The value of [`code`](Lost::code); `None` for 0 (not lost).
    pub const fn from_code(code: u8) -> Option<Lost> {
        match code {
            1 => Some(Lost::Shrank),
            2 => Some(Lost::Replaced),
            3 => Some(Lost::Removed),
            _ => None,
        }
    }
}

impl GuardedRange {
    /// Whether the mapping still shows the file at `path` whose device and inode were
    /// `identity` when it was mapped: [`Lost::Shrank`] after a fault (no system call), else one
    /// `lstat` of the path (a path that cannot be checked counts as still there). Call it off
    /// the hot path.
    pub fn lost(&self, path: &Path, identity: (u64, u64)) -> Option<Lost> {
        if self.faulted() {
            return Some(Lost::Shrank);
        }
        match std::fs::symlink_metadata(path) {
            Ok(m) if (m.dev(), m.ino()) == identity => None,
            Ok(_) => Some(Lost::Replaced),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Some(Lost::Removed),
            Err(_) => None,
        }
    }
}

impl Drop for GuardedRange {
    fn drop(&mut self) {
        let state = &SLOTS[self.slot].state;
        let generation = state.load(Ordering::Relaxed) & !STATE_BITS;
        state.store(generation | FREE, Ordering::Release);
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size)
        .ok()
        .filter(|s| *s > 0)
        .unwrap_or(4096)
}

fn install() -> io::Result<()> {
    let installed = INSTALLED.get_or_init(|| {
        // SAFETY: an all-zero sigaction is a valid value to fill; sigaction(2) with a valid
        // new action and an out-pointer, as documented. The previous action is kept before the
        // new one is in place, so the handler always finds it.
        unsafe {
            let mut previous: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut previous) != 0 {
                return Err(io::Error::last_os_error().raw_os_error().unwrap_or(0));
            }
            let _ = PREVIOUS.set(previous);
            let mut action: libc::sigaction = std::mem::zeroed();
            let handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                on_sigbus;
            action.sa_sigaction = handler as libc::sighandler_t;
            action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut action.sa_mask);
            if libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut()) != 0 {
                return Err(io::Error::last_os_error().raw_os_error().unwrap_or(0));
            }
            Ok(())
        }
    });
    match installed {
        Ok(()) => Ok(()),
        Err(errno) => Err(io::Error::other(format!(
            "guard: cannot install the SIGBUS handler: {}",
            io::Error::from_raw_os_error(*errno)
        ))),
    }
}

/// Put the previous `SIGBUS` action back if ours is still installed: run when the library is
/// unloaded (`dlclose`) or the process exits, so no handler points at unmapped code.
pub(crate) extern "C" fn uninstall() {
    let (Some(Ok(())), Some(previous)) = (INSTALLED.get(), PREVIOUS.get()) else {
        return;
    };
    // SAFETY: sigaction(2) reads the current action into a zeroed value, and puts back the
    // action that was installed before ours only while ours is the one in place.
    unsafe {
        let mut current: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut current) != 0 {
            return;
        }
        let handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            on_sigbus;
        if current.sa_sigaction == handler as libc::sighandler_t {
            libc::sigaction(libc::SIGBUS, previous, std::ptr::null_mut());
        }
    }
}

/// Runs [`uninstall`] when this image is unloaded or the process exits.
#[used]
#[link_section = ".fini_array"]
static UNINSTALL_ON_UNLOAD: extern "C" fn() = uninstall;

/// The handler: zero pages over a registered range, or the previous action. Only atomics and
/// the async-signal-safe system calls `mmap`, `sigaction` and `raise`.
extern "C" fn on_sigbus(
    signal: libc::c_int,
    info: *mut libc::siginfo_t,
    context: *mut libc::c_void,
) {
    // SAFETY: the kernel passes a valid siginfo_t for a SA_SIGINFO handler.
    let (code, address) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    // A signal another process sent has no fault address (si_addr overlays its pid and uid).
    if code > 0 && replace_range(address) {
        return;
    }
    pass_on(signal, code, info, context);
}

/// Map zero pages over the registered range holding `address`; whether one did.
fn replace_range(address: usize) -> bool {
    for slot in &SLOTS {
        // SYNC: pairs with the Release store in `GuardedRange::new`.
        let word = slot.state.load(Ordering::Acquire);
        if word & STATE_BITS != ACTIVE {
            continue;
        }
        let start = slot.start.load(Ordering::Relaxed);
        let len = slot.len.load(Ordering::Relaxed);
        // SYNC: the range read belongs to this registration only if the word did not change.
        std::sync::atomic::fence(Ordering::Acquire);
        if slot.state.load(Ordering::Relaxed) != word {
            continue;
        }
        if address < start || address - start >= len {
            continue;
        }
        // SAFETY: [start, start + len) is a live mapping its owner registered and keeps until
        // it unregisters; replacing it with private anonymous pages of the same size keeps every
        // pointer into it valid (they now read zeros).
        let mapped = unsafe {
            libc::mmap(
                start as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if mapped == libc::MAP_FAILED {
            return false;
        }
        slot.faulted.store(true, Ordering::Relaxed);
        return true;
    }
    false
}

/// Give a signal that is not ours to the action installed before this module's.
fn pass_on(
    signal: libc::c_int,
    code: libc::c_int,
    info: *mut libc::siginfo_t,
    context: *mut libc::c_void,
) {
    let previous = PREVIOUS.get();
    let handler = previous.map_or(libc::SIG_DFL, |p| p.sa_sigaction);
    let sent = code <= 0;
    if handler == libc::SIG_IGN && sent {
        return;
    }
    if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
        // SAFETY: restoring the default action with a zeroed sigaction. A fault then repeats
        // when this returns and ends the process with SIGBUS, as it would have without this
        // module (an ignored SIGBUS from a fault would loop forever); a sent signal is raised
        // again, with the same result.
        unsafe {
            let mut default: libc::sigaction = std::mem::zeroed();
            default.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(libc::SIGBUS, &default, std::ptr::null_mut());
            if sent {
                libc::raise(libc::SIGBUS);
            }
        }
        return;
    }
    let siginfo = previous.is_some_and(|p| p.sa_flags & libc::SA_SIGINFO != 0);
    // SAFETY: `handler` is the function the previous owner of SIGBUS installed, with the
    // signature its SA_SIGINFO flag says.
    unsafe {
        if siginfo {
            let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                std::mem::transmute(handler);
            f(signal, info, context);
        } else {
            let f: extern "C" fn(libc::c_int) = std::mem::transmute(handler);
            f(signal);
        }
    }
}
