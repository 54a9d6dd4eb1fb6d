//! `regMr` / `regMrDmaBuf` / `deregMr`: one handle registering a buffer on both rails, through
//! each NIC's shared registrations (src/net/data/registrations.rs).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::fabric::{Access, FabricResult, MemoryKeys, Rail, RailDevice};
use crate::log;

use crate::net::data::registrations::{PageRange, RegistrationCache};
use crate::net::setup::comm::ConnectionInfo;
use crate::net::setup::resources::Devices;
use crate::net::{PTR_CUDA, PTR_DMABUF, PTR_HOST};

const MEMORY_MAGIC: u32 = 0x4D45_4D52; // "MEMR"

/// A registration NCCL passes back to `isend`/`irecv`/`deregMr`: a reference to each NIC's MR
/// of the buffer's pages, shared with every other handle of the same pages
/// (src/net/data/registrations.rs).
pub struct MemoryHandle {
    magic: u32,
    addr: u64,
    len: u64,
    registrations: [SharedRegistration; 2],
}

/// One handle's reference to one NIC's MR, released on drop if `deregMr` never came.
struct SharedRegistration {
    cache: Arc<RegistrationCache>,
    range: PageRange,
    keys: MemoryKeys,
    held: bool,
}

impl SharedRegistration {
    /// Releases the reference now, reporting the NIC's failure.
    fn release(mut self) -> Result<()> {
        self.held = false;
        self.cache.release(self.range)
    }
}

impl Drop for SharedRegistration {
    fn drop(&mut self) {
        if self.held {
            if let Err(e) = self.cache.release(self.range) {
                warn!(log::NET, "teardown: {e}");
            }
        }
    }
}

impl MemoryHandle {
    /// Whether this is a live handle (catches stale or foreign pointers early).
    pub(crate) fn is_valid(&self) -> bool {
        self.magic == MEMORY_MAGIC
    }

    /// Local key on `rail`.
    pub(crate) fn lkey(&self, rail: Rail) -> u32 {
        self.registrations[rail.index()].keys.lkey
    }

    /// Remote key on `rail`.
    pub(crate) fn rkey(&self, rail: Rail) -> u32 {
        self.registrations[rail.index()].keys.rkey
    }

    /// Whether `[addr, addr + len)` lies inside the registration.
    pub(crate) fn covers(&self, addr: u64, len: u64) -> bool {
        len == 0 || (addr >= self.addr && addr.saturating_add(len) <= self.addr + self.len)
    }

    /// Checks that a data-path buffer is inside this registration.
    pub(crate) fn check_covers(&self, what: &str, addr: u64, len: u64) -> Result<()> {
        if !self.is_valid() {
            return Err(Error::invalid_argument(format!(
                "{what}: mhandle is not a live MPIB registration"
            )));
        }
        if !self.covers(addr, len) {
            return Err(Error::invalid_argument(format!(
                "{what}: buffer [{addr:#x}, +{len}) is outside its registration [{:#x}, +{})",
                self.addr, self.len
            )));
        }
        Ok(())
    }
}

/// Data registrations ask for relaxed PCIe ordering; the backend grants it per
/// `MPIB_IB_PCI_RELAXED_ORDERING` (net_ib's default: when `ibv_reg_mr_iova2` exists).
const DATA_ACCESS: Access = Access {
    relaxed_ordering: true,
    ..Access::DATA
};

/// What both rails can register, as `NCCL_PTR_*` bits (host memory always).
pub(crate) fn pointer_support(devices: &Devices) -> i32 {
    let [sout, sup] = [devices[0].gpu_support(), devices[1].gpu_support()];
    let mut bits = PTR_HOST;
    if sout.peer_memory && sup.peer_memory {
        bits |= PTR_CUDA;
    }
    if sout.dmabuf && sup.dmabuf {
        bits |= PTR_DMABUF;
    }
    bits
}

fn check_type(devices: &Devices, ptr_type: i32, dmabuf: bool) -> Result<()> {
    let supported = pointer_support(devices);
    let wanted = match (ptr_type, dmabuf) {
        (PTR_HOST, false) => PTR_HOST,
        (PTR_CUDA, false) => PTR_CUDA,
        (PTR_CUDA | PTR_DMABUF, true) => PTR_DMABUF,
        (other, _) => {
            return Err(Error::invalid_argument(format!(
                "regMr: unknown pointer type {other}"
            )))
        }
    };
    if supported & wanted == 0 {
        return Err(Error::invalid_usage(format!(
            "regMr: pointer type {ptr_type}{} is not supported by both rails ({} and {}): \
             advertised ptrSupport is {supported:#x}",
            if dmabuf { " through DMA-BUF" } else { "" },
            devices[0].info().name,
            devices[1].info().name,
        )));
    }
    Ok(())
}

/// Takes `range` on both NICs: a reference to each one's MR of those pages, made by `register`
/// where it has none. Both or neither: a refusal by SUP releases what SOUT took.
fn acquire_both(
    info: &ConnectionInfo,
    range: PageRange,
    dmabuf: [Option<OwnedFd>; 2],
    register: impl Fn(&dyn RailDevice, Option<i32>) -> FabricResult<MemoryKeys>,
) -> Result<[SharedRegistration; 2]> {
    let [sout_fd, sup_fd] = dmabuf;
    let take = |rail: Rail, fd: Option<OwnedFd>| -> Result<SharedRegistration> {
        let cache = &info.registrations[rail.index()];
        let raw = fd.as_ref().map(|fd| fd.as_raw_fd());
        let keys = cache.acquire(range, fd, |device| register(device, raw))?;
        Ok(SharedRegistration {
            cache: Arc::clone(cache),
            range,
            keys,
            held: true,
        })
    };
    let sout = take(Rail::ScaleOut, sout_fd)?;
    let sup = take(Rail::ScaleUp, sup_fd)?;
    Ok([sout, sup])
}

/// Registers host (or GPU) memory on both rails: the pages holding `[addr, addr + size)`, one MR
/// per NIC however many handles ask for them.
pub(crate) fn register(
    info: &ConnectionInfo,
    addr: u64,
    size: usize,
    ptr_type: i32,
) -> Result<Box<MemoryHandle>> {
    check_type(&info.devices, ptr_type, false)?;
    if addr == 0 && size > 0 {
        return Err(Error::invalid_argument("regMr: data is NULL"));
    }
    let range = PageRange::host(addr, size, crate::fabric::pages::page_size() as u64);
    let registrations = acquire_both(info, range, [None, None], |device, _| {
        let len = usize::try_from(range.len).unwrap_or(usize::MAX);
        device.register(range.start, len, DATA_ACCESS)
    })?;
    Ok(Box::new(MemoryHandle {
        magic: MEMORY_MAGIC,
        addr,
        len: size as u64,
        registrations,
    }))
}

/// Duplicates NCCL's DMA-BUF descriptor, which it closes when the call returns.
fn duplicate(fd: i32) -> Result<OwnedFd> {
    // SAFETY: fcntl(F_DUPFD_CLOEXEC) on an arbitrary int is safe; failure is reported.
    let duplicate = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if duplicate < 0 {
        return Err(Error::invalid_argument(format!(
            "regMrDmaBuf: fd {fd} cannot be duplicated: {}",
            std::io::Error::last_os_error()
        )));
    }
    // SAFETY: `duplicate` is a fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(duplicate) })
}

/// Registers a DMA-BUF range on both rails, each NIC's MR keeping a duplicate of `fd` for as
/// long as it lives; a range already registered is shared like host pages.
pub(crate) fn register_dmabuf(
    info: &ConnectionInfo,
    addr: u64,
    size: usize,
    ptr_type: i32,
    offset: u64,
    fd: i32,
) -> Result<Box<MemoryHandle>> {
    check_type(&info.devices, ptr_type, true)?;
    let descriptors = [Some(duplicate(fd)?), Some(duplicate(fd)?)];
    let range = PageRange::dmabuf(addr, size);
    let registrations = acquire_both(info, range, descriptors, |device, kept| {
        device.register_dmabuf(offset, size, addr, kept.unwrap_or(fd), DATA_ACCESS)
    })?;
    Ok(Box::new(MemoryHandle {
        magic: MEMORY_MAGIC,
        addr,
        len: size as u64,
        registrations,
    }))
}

/// Releases the handle's references to both NICs' MRs, reporting the first failure. Takes the
/// `Box` NCCL's handle was.
#[allow(clippy::boxed_local)]
pub(crate) fn deregister(handle: Box<MemoryHandle>) -> Result<()> {
    let mut handle = *handle;
    if !handle.is_valid() {
        return Err(Error::invalid_argument(
            "deregMr: mhandle is not a live MPIB registration",
        ));
    }
    handle.magic = 0;
    let MemoryHandle { registrations, .. } = handle;
    let [sout, sup] = registrations;
    let first = sout.release();
    let second = sup.release();
    first.and(second)
}
