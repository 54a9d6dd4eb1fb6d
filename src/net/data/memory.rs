//! `regMr` / `regMrDmaBuf` / `deregMr`: one handle registering a buffer on both rails.

use std::os::fd::{FromRawFd, OwnedFd};

use crate::error::{Error, Result};
use crate::fabric::{Access, Rail};

use crate::net::setup::resources::{Devices, Registration};
use crate::net::{PTR_CUDA, PTR_DMABUF, PTR_HOST};

const MEMORY_MAGIC: u32 = 0x4D45_4D52; // "MEMR"

/// A registration NCCL passes back to `isend`/`irecv`/`deregMr`.
pub struct MemoryHandle {
    magic: u32,
    addr: u64,
    len: u64,
    registrations: [Registration; 2],
    /// The duplicated DMA-BUF fd, kept while registered (NCCL closes its own on return).
    _dmabuf: Option<OwnedFd>,
}

impl MemoryHandle {
    /// Whether this is a live handle (catches stale or foreign pointers early).
    pub(crate) fn is_valid(&self) -> bool {
        self.magic == MEMORY_MAGIC
    }

    /// Local key on `rail`.
    pub(crate) fn lkey(&self, rail: Rail) -> u32 {
        self.registrations[rail.index()].keys().lkey
    }

    /// Remote key on `rail`.
    pub(crate) fn rkey(&self, rail: Rail) -> u32 {
        self.registrations[rail.index()].keys().rkey
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

/// Registers host memory on both rails.
pub(crate) fn register(
    devices: &Devices,
    addr: u64,
    size: usize,
    ptr_type: i32,
) -> Result<Box<MemoryHandle>> {
    check_type(devices, ptr_type, false)?;
    if addr == 0 && size > 0 {
        return Err(Error::invalid_argument("regMr: data is NULL"));
    }
    let register = |rail: Rail| Registration::new(&devices[rail.index()], addr, size, DATA_ACCESS);
    let registrations = [register(Rail::ScaleOut)?, register(Rail::ScaleUp)?];
    Ok(Box::new(MemoryHandle {
        magic: MEMORY_MAGIC,
        addr,
        len: size as u64,
        registrations,
        _dmabuf: None,
    }))
}

/// Registers a DMA-BUF range on both rails, keeping a duplicate of `fd` for the handle's life.
pub(crate) fn register_dmabuf(
    devices: &Devices,
    addr: u64,
    size: usize,
    ptr_type: i32,
    offset: u64,
    fd: i32,
) -> Result<Box<MemoryHandle>> {
    check_type(devices, ptr_type, true)?;
    // SAFETY: fcntl(F_DUPFD_CLOEXEC) on an arbitrary int is safe; failure is reported.
    let duplicate = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if duplicate < 0 {
        return Err(Error::invalid_argument(format!(
            "regMrDmaBuf: fd {fd} cannot be duplicated: {}",
            std::io::Error::last_os_error()
        )));
    }
    // SAFETY: `duplicate` is a fresh descriptor owned by nobody else.
    let owned = unsafe { OwnedFd::from_raw_fd(duplicate) };
    let register = |rail: Rail| -> Result<Registration> {
        let device = &devices[rail.index()];
        let keys = device.register_dmabuf(offset, size, addr, duplicate, DATA_ACCESS)?;
        Ok(Registration::from_keys(device, keys))
    };
    let registrations = [register(Rail::ScaleOut)?, register(Rail::ScaleUp)?];
    Ok(Box::new(MemoryHandle {
        magic: MEMORY_MAGIC,
        addr,
        len: size as u64,
        registrations,
        _dmabuf: Some(owned),
    }))
}

/// Deregisters both rails, reporting the first failure. Takes the `Box` NCCL's handle was.
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
