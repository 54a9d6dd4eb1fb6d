//! Completion queues and shared receive queues. Polling and posting receives use fixed-size
//! stack arrays: the data path never allocates.

use std::any::Any;
use std::ffi::c_int;
use std::mem::MaybeUninit;
use std::sync::Arc;

use super::library::{ibv_create_cq, ibv_create_srq, ibv_destroy_cq, ibv_destroy_srq};
use rdma_sys::{ibv_cq, ibv_recv_wr, ibv_srq, ibv_srq_attr, ibv_srq_init_attr, ibv_wc};

use super::attrs::{self, RawCompletion};
use super::device::DeviceInner;
use super::{sys, teardown_failed};
use crate::fabric::{Completion, CompletionQueue, FabricResult, SharedReceiveQueue};

/// Work completions read per `poll_cq` call.
pub(crate) const POLL_BATCH: usize = 16;
/// Receive WRs linked per `post_srq_recv` call.
pub(crate) const RECV_BATCH: usize = 16;

/// A CQ, destroyed on drop after every QP using it (QPs hold an `Arc` on it).
pub(crate) struct CqInner {
    pub(crate) cq: *mut ibv_cq,
    /// The device, released after the CQ is destroyed.
    pub(crate) device: Arc<DeviceInner>,
}

// SAFETY: the CQ pointer is only passed to thread-safe verbs; polling needs `&mut VerbsCq`.
unsafe impl Send for CqInner {}
// SAFETY: shared references only keep the CQ alive (QPs) or destroy it once (drop).
unsafe impl Sync for CqInner {}

impl Drop for CqInner {
    fn drop(&mut self) {
        // SAFETY: `cq` came from ibv_create_cq; no QP uses it any more (they hold Arcs).
        let rc = unsafe { ibv_destroy_cq(self.cq) };
        if rc != 0 {
            teardown_failed("ibv_destroy_cq", &self.device.label, rc);
        }
    }
}

/// A completion queue of the verbs backend.
pub struct VerbsCq {
    pub(crate) inner: Arc<CqInner>,
}

impl VerbsCq {
    /// Creates a CQ of at least `depth` entries.
    pub(crate) fn create(device: &Arc<DeviceInner>, depth: u32) -> FabricResult<VerbsCq> {
        let verb = "ibv_create_cq";
        let cqe = c_int::try_from(depth)
            .ok()
            .filter(|d| *d > 0)
            .ok_or_else(|| {
                device.error(
                    verb,
                    libc::EINVAL,
                    format!("depth {depth} outside 1..={}", c_int::MAX),
                )
            })?;
        sys::clear_errno();
        // SAFETY: the context is live; no completion channel, vector 0.
        let cq = unsafe {
            ibv_create_cq(
                device.context(),
                cqe,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        if cq.is_null() {
            return Err(device.error(verb, sys::errno(), format!("depth {depth}")));
        }
        Ok(VerbsCq {
            inner: Arc::new(CqInner {
                cq,
                device: Arc::clone(device),
            }),
        })
    }
}

/// Copies what MPIB reads out of a work completion.
pub(crate) fn raw_completion(wc: &ibv_wc) -> RawCompletion {
    RawCompletion {
        wr_id: wc.wr_id,
        status: wc.status,
        opcode: wc.opcode,
        vendor_err: wc.vendor_err,
        byte_len: wc.byte_len,
        // SAFETY: the union is two views of one u32; either is a valid u32.
        imm_data: unsafe { wc.imm_data_invalidated_rkey_union.imm_data },
        qp_num: wc.qp_num,
        wc_flags: wc.wc_flags,
    }
}

impl CompletionQueue for VerbsCq {
    fn poll(&mut self, out: &mut [Completion]) -> FabricResult<usize> {
        let mut wcs: [MaybeUninit<ibv_wc>; POLL_BATCH] =
            [const { MaybeUninit::uninit() }; POLL_BATCH];
        let mut done = 0;
        while done < out.len() {
            let want = (out.len() - done).min(POLL_BATCH);
            // SAFETY: the CQ is live (we hold it); `wcs` has room for `want` <= POLL_BATCH
            // entries, and `MaybeUninit<ibv_wc>` has the layout of `ibv_wc`.
            let n = unsafe { sys::poll_cq(self.inner.cq, want as c_int, wcs.as_mut_ptr().cast()) };
            if n < 0 {
                let dev = &self.inner.device;
                return Err(dev.error(
                    "ibv_poll_cq",
                    sys::rc_errno(n),
                    format!("after {done} completions"),
                ));
            }
            let n = (n as usize).min(want);
            for (slot, wc) in out[done..done + n].iter_mut().zip(&wcs[..n]) {
                // SAFETY: poll_cq wrote the first `n` entries.
                *slot = attrs::completion(&raw_completion(unsafe { wc.assume_init_ref() }));
            }
            done += n;
            if n < want {
                break;
            }
        }
        Ok(done)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// An SRQ, destroyed on drop after every QP using it.
pub(crate) struct SrqInner {
    pub(crate) srq: *mut ibv_srq,
    pub(crate) device: Arc<DeviceInner>,
}

// SAFETY: the SRQ pointer is only passed to thread-safe verbs.
unsafe impl Send for SrqInner {}
// SAFETY: shared references keep the SRQ alive (QPs), post receives on it (ibv_post_srq_recv is
// thread-safe: the providers lock the SRQ, as libibverbs documents for every post verb) or
// destroy it once (drop).
unsafe impl Sync for SrqInner {}

impl Drop for SrqInner {
    fn drop(&mut self) {
        // SAFETY: `srq` came from ibv_create_srq; no QP uses it any more (they hold Arcs).
        let rc = unsafe { ibv_destroy_srq(self.srq) };
        if rc != 0 {
            teardown_failed("ibv_destroy_srq", &self.device.label, rc);
        }
    }
}

/// A shared receive queue of zero-SGE receives.
pub struct VerbsSrq {
    pub(crate) inner: Arc<SrqInner>,
}

impl VerbsSrq {
    /// Creates an SRQ holding up to `depth` receives (one SGE each at most; MPIB posts none).
    pub(crate) fn create(device: &Arc<DeviceInner>, depth: u32) -> FabricResult<VerbsSrq> {
        let verb = "ibv_create_srq";
        if depth == 0 {
            return Err(device.error(verb, libc::EINVAL, "depth 0"));
        }
        let mut init = ibv_srq_init_attr {
            srq_context: std::ptr::null_mut(),
            attr: ibv_srq_attr {
                max_wr: depth,
                max_sge: 1,
                srq_limit: 0,
            },
        };
        sys::clear_errno();
        // SAFETY: the PD is live; `init` is a valid in/out parameter.
        let srq = unsafe { ibv_create_srq(device.pd(), &mut init) };
        if srq.is_null() {
            return Err(device.error(verb, sys::errno(), format!("depth {depth}")));
        }
        Ok(VerbsSrq {
            inner: Arc::new(SrqInner {
                srq,
                device: Arc::clone(device),
            }),
        })
    }
}

/// Fills `wrs[..n]` with zero-SGE receives carrying `wr_id`, linked in order; returns the head.
pub(crate) fn link_receives(
    wrs: &mut [ibv_recv_wr; RECV_BATCH],
    n: usize,
    wr_id: u64,
) -> *mut ibv_recv_wr {
    let n = n.min(RECV_BATCH);
    let base = wrs.as_mut_ptr();
    for i in 0..n {
        let next = if i + 1 < n {
            // SAFETY: i + 1 < n <= RECV_BATCH: inside the array.
            unsafe { base.add(i + 1) }
        } else {
            std::ptr::null_mut()
        };
        // SAFETY: i < n <= RECV_BATCH: inside the array; written through `base` so that the
        // `next` pointers derived from it stay valid.
        unsafe {
            *base.add(i) = ibv_recv_wr {
                wr_id,
                next,
                sg_list: std::ptr::null_mut(),
                num_sge: 0,
            }
        };
    }
    base
}

impl SharedReceiveQueue for VerbsSrq {
    fn post_receives(&self, count: u32, wr_id: u64) -> FabricResult<()> {
        let empty = ibv_recv_wr {
            wr_id: 0,
            next: std::ptr::null_mut(),
            sg_list: std::ptr::null_mut(),
            num_sge: 0,
        };
        let mut wrs = [empty; RECV_BATCH];
        let mut posted = 0u32;
        while posted < count {
            let n = ((count - posted) as usize).min(RECV_BATCH);
            let head = link_receives(&mut wrs, n, wr_id);
            let mut bad: *mut ibv_recv_wr = std::ptr::null_mut();
            // SAFETY: the SRQ is live; `wrs[..n]` is a NULL-terminated list with no SGEs.
            let rc = unsafe { sys::post_srq_recv(self.inner.srq, head, &mut bad) };
            if rc != 0 {
                let failed = if bad.is_null() {
                    0
                } else {
                    (bad as usize - head as usize) / std::mem::size_of::<ibv_recv_wr>()
                };
                let detail = format!("posted {} of {count} receives", posted as usize + failed);
                return Err(self.inner.device.error(
                    "ibv_post_srq_recv",
                    sys::rc_errno(rc),
                    detail,
                ));
            }
            posted += n as u32;
        }
        Ok(())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
