//! Memory registration (plain, relaxed-ordering, DMA-BUF), the registration table, and the
//! GPUDirect RDMA / DMA-BUF detection NCCL uses to decide `NCCL_PTR_CUDA` / `NCCL_PTR_DMABUF`.

use std::ffi::c_int;

use super::library::{ibv_dereg_mr, ibv_reg_mr};
use rdma_sys::{ibv_access_flags, ibv_mr};

use super::device::{DeviceInner, MrEntry};
use super::sys;
use crate::fabric::{Access, FabricResult, MemoryKeys};
use crate::log;

/// The files whose presence means a GPUDirect RDMA peer-memory module is loaded (NCCL's
/// `ncclIbGdrSupport`): the MLNX_OFED `nv_peer_mem` module (two flavours) and the upstream
/// `nvidia_peermem`.
pub const GDR_PATHS: [&str; 3] = [
    "/sys/kernel/mm/memory_peers/nv_mem/version",
    "/sys/kernel/mm/memory_peers/nv_mem_nc/version",
    "/sys/module/nvidia_peermem/version",
];

/// Whether GPUDirect RDMA through a peer-memory module is available on this host, so that
/// `NCCL_PTR_CUDA` may be advertised (NCCL's test: any of [`GDR_PATHS`] exists). Looked at once
/// per process, as net_ib does (its `ibGdrSupportInitOnce`): `regMr` asks on every call, and
/// three `stat`s each time cost 55 µs a call under the rig's emulation.
pub fn gdr_supported() -> bool {
    static LOADED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *LOADED.get_or_init(|| GDR_PATHS.iter().any(|p| std::path::Path::new(p).exists()))
}

/// `ibv_access_flags` bits for a registration, and whether relaxed ordering applies: local
/// write always, remote write / read as asked, remote atomic for data buffers (remote write and
/// read, as NCCL registers them), and `IBV_ACCESS_RELAXED_ORDERING` when the registration asks
/// for it and the device allows it (`relaxed_enabled`).
pub(crate) fn access_flags(access: Access, relaxed_enabled: bool) -> (u32, bool) {
    let mut flags = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
    if access.remote_write {
        flags |= ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
    }
    if access.remote_read {
        flags |= ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
    }
    if access.remote_write && access.remote_read {
        flags |= ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0;
    }
    let relaxed = access.relaxed_ordering && relaxed_enabled;
    if relaxed {
        flags |= ibv_access_flags::IBV_ACCESS_RELAXED_ORDERING.0;
    }
    (flags, relaxed)
}

/// NCCL's DMA-BUF probe: `ibv_reg_dmabuf_mr` with fd -1 must fail; EOPNOTSUPP or
/// EPROTONOSUPPORT mean the kernel or provider has no DMA-BUF support, anything else (EBADF)
/// means it has.
pub(crate) fn probe_dmabuf(device: &DeviceInner) -> bool {
    let Some(reg) = sys::optional().reg_dmabuf_mr else {
        return false;
    };
    sys::clear_errno();
    // SAFETY: the PD is live; fd -1 makes the kernel refuse before touching any memory.
    let mr = unsafe { reg(device.pd(), 0, 0, 0, -1, 0) };
    let errno = sys::errno();
    if !mr.is_null() {
        // Impossible with fd -1, but never leak: release what was created.
        // SAFETY: `mr` was just returned by a registration on this PD.
        unsafe { ibv_dereg_mr(mr) };
        return true;
    }
    !(errno == libc::EOPNOTSUPP || errno == libc::EPROTONOSUPPORT)
}

impl DeviceInner {
    /// Registers `[addr, addr + len)` with `flags`; through `ibv_reg_mr_iova2` (iova = addr)
    /// when `relaxed`, else `ibv_reg_mr`.
    pub(crate) fn register(
        &self,
        addr: u64,
        len: usize,
        flags: u32,
        relaxed: bool,
    ) -> FabricResult<MemoryKeys> {
        let verb = if relaxed {
            "ibv_reg_mr_iova2"
        } else {
            "ibv_reg_mr"
        };
        if len == 0 || addr == 0 || addr.checked_add(len as u64).is_none() {
            return Err(self.error(verb, libc::EINVAL, format!("bad range {addr:#x}+{len}")));
        }
        sys::clear_errno();
        let mr = if relaxed {
            let Some(reg) = sys::optional().reg_mr_iova2 else {
                return Err(self.error(
                    verb,
                    libc::EOPNOTSUPP,
                    "libibverbs lacks ibv_reg_mr_iova2",
                ));
            };
            // SAFETY: the PD is live; the caller's range is passed on for the kernel to pin
            // (it fails with EFAULT rather than touching unmapped memory).
            unsafe { reg(self.pd(), addr as *mut _, len, addr, flags) }
        } else {
            let flags = c_int::try_from(flags).unwrap_or(0);
            // SAFETY: as above.
            unsafe { ibv_reg_mr(self.pd(), addr as *mut _, len, flags) }
        };
        self.adopt(mr, verb, || {
            format!("range {addr:#x}+{len}, access {flags:#x}")
        })
    }

    /// Registers a DMA-BUF range through `ibv_reg_dmabuf_mr`, found at run time. The fd is only
    /// borrowed for the call.
    pub(crate) fn register_dmabuf(
        &self,
        offset: u64,
        len: usize,
        iova: u64,
        fd: c_int,
        flags: u32,
    ) -> FabricResult<MemoryKeys> {
        let verb = "ibv_reg_dmabuf_mr";
        let Some(reg) = sys::optional().reg_dmabuf_mr else {
            return Err(self.error(
                verb,
                libc::EOPNOTSUPP,
                "this libibverbs has no ibv_reg_dmabuf_mr (IBVERBS_1.12, rdma-core 34+): DMA-BUF registration is unavailable",
            ));
        };
        if len == 0 || fd < 0 {
            return Err(self.error(
                verb,
                libc::EINVAL,
                format!("bad DMA-BUF fd {fd} or length {len}"),
            ));
        }
        sys::clear_errno();
        let access = c_int::try_from(flags).unwrap_or(0);
        // SAFETY: the PD is live; the kernel validates the fd, offset and length.
        let mr = unsafe { reg(self.pd(), offset, len, iova, fd, access) };
        self.adopt(mr, verb, || {
            format!("fd {fd} offset {offset:#x} len {len} iova {iova:#x}, access {flags:#x}")
        })
    }

    /// Records a fresh registration in the table, or turns a NULL one into an error.
    fn adopt(
        &self,
        mr: *mut ibv_mr,
        verb: &'static str,
        what: impl FnOnce() -> String,
    ) -> FabricResult<MemoryKeys> {
        if mr.is_null() {
            return Err(self.error(verb, sys::errno(), what()));
        }
        // SAFETY: a non-null result of a registration verb is a valid `ibv_mr`.
        let (lkey, rkey) = unsafe { ((*mr).lkey, (*mr).rkey) };
        let previous = self.mrs().insert(
            lkey,
            MrEntry {
                mr: mr as usize,
                rkey,
            },
        );
        if let Some(stale) = previous {
            // Only possible if the driver reused a key we still hold: keep the table honest.
            warn!(
                log::NET,
                "{}: lkey {lkey:#x} reused by the driver; dropping the stale entry {:#x}",
                self.label,
                stale.mr
            );
        }
        Ok(MemoryKeys { lkey, rkey })
    }

    /// Deregisters the registration with `keys`.
    pub(crate) fn deregister(&self, keys: MemoryKeys) -> FabricResult<()> {
        let verb = "ibv_dereg_mr";
        let entry = {
            let mut mrs = self.mrs();
            match mrs.get(&keys.lkey) {
                Some(e) if e.rkey == keys.rkey => mrs.remove(&keys.lkey),
                _ => None,
            }
        };
        let Some(entry) = entry else {
            let detail = format!(
                "no registration with lkey {:#x} rkey {:#x}",
                keys.lkey, keys.rkey
            );
            return Err(self.error(verb, libc::EINVAL, detail));
        };
        // SAFETY: the entry came from a successful registration on this PD and was just
        // removed from the table, so it is deregistered once.
        let rc = unsafe { ibv_dereg_mr(entry.mr as *mut ibv_mr) };
        if rc != 0 {
            // Still registered: put it back so that device teardown tries again.
            self.mrs().insert(keys.lkey, entry);
            return Err(self.error(verb, sys::rc_errno(rc), format!("lkey {:#x}", keys.lkey)));
        }
        Ok(())
    }
}
