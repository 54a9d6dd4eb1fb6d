//! The raw side of libibverbs: verbs that must be found at run time, and the `static inline`
//! data-path verbs of `verbs.h`, called through the provider's ops table exactly as the header
//! does (without the `unwrap` of rdma-sys's versions: a missing op is an error, not a panic).
//!
//! # Optional verbs
//! The required entry points are IBVERBS_1.1 ones ([`super::library`]), so the plugin runs with
//! any rdma-core. Newer verbs are looked up once, by name and symbol version, in the libibverbs
//! the fabric opened ([`optional`]): `ibv_reg_mr_iova2` (IBVERBS_1.8, relaxed ordering),
//! `ibv_reg_dmabuf_mr` (IBVERBS_1.12, DMA-BUF) and `ibv_query_port_speed` (rdma-core 57+, any
//! version), through the library's own handle: NCCL loads plugins `RTLD_LOCAL`, and the library
//! is not in the global scope either.

use std::ffi::{c_int, c_uint, c_void, CStr};
use std::sync::OnceLock;

use rdma_sys::{
    ibv_context, ibv_cq, ibv_mr, ibv_pd, ibv_qp, ibv_recv_wr, ibv_send_wr, ibv_srq, ibv_wc,
};

/// `ibv_reg_mr_iova2(pd, addr, length, iova, access)`.
pub(crate) type RegMrIova2 =
    unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, u64, c_uint) -> *mut ibv_mr;
/// `ibv_reg_dmabuf_mr(pd, offset, length, iova, fd, access)`.
pub(crate) type RegDmabufMr =
    unsafe extern "C" fn(*mut ibv_pd, u64, usize, u64, c_int, c_int) -> *mut ibv_mr;
/// `ibv_query_port_speed(context, port_num, &speed)`: speed in units of 100 Mb/s.
pub(crate) type QueryPortSpeed = unsafe extern "C" fn(*mut ibv_context, u32, *mut u64) -> c_int;

/// The optional verbs found in the loaded libibverbs.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct OptionalVerbs {
    /// `ibv_reg_mr_iova2`, IBVERBS_1.8.
    pub reg_mr_iova2: Option<RegMrIova2>,
    /// `ibv_reg_dmabuf_mr`, IBVERBS_1.12.
    pub reg_dmabuf_mr: Option<RegDmabufMr>,
    /// `ibv_query_port_speed`.
    pub query_port_speed: Option<QueryPortSpeed>,
}

/// Which optional libibverbs entry points this process has (for logs and the engine).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SymbolSupport {
    /// `ibv_reg_mr_iova2` (IBVERBS_1.8): relaxed-ordering registrations.
    pub reg_mr_iova2: bool,
    /// `ibv_reg_dmabuf_mr` (IBVERBS_1.12): DMA-BUF registrations.
    pub reg_dmabuf_mr: bool,
    /// `ibv_query_port_speed` (rdma-core 57+): the exact port speed.
    pub query_port_speed: bool,
}

static OPTIONAL: OnceLock<OptionalVerbs> = OnceLock::new();

/// The optional verbs, looked up at the first call after libibverbs was opened and cached for
/// the life of the image (none before: nothing is cached then).
pub(crate) fn optional() -> &'static OptionalVerbs {
    static NONE: OptionalVerbs = OptionalVerbs {
        reg_mr_iova2: None,
        reg_dmabuf_mr: None,
        query_port_speed: None,
    };
    let scope = super::library::handle();
    if scope.is_null() {
        return &NONE;
    }
    OPTIONAL.get_or_init(|| lookup_all(scope))
}

/// What [`optional`] found, as plain flags.
pub(crate) fn symbol_support() -> SymbolSupport {
    let verbs = optional();
    SymbolSupport {
        reg_mr_iova2: verbs.reg_mr_iova2.is_some(),
        reg_dmabuf_mr: verbs.reg_dmabuf_mr.is_some(),
        query_port_speed: verbs.query_port_speed.is_some(),
    }
}

fn lookup_all(scope: *mut c_void) -> OptionalVerbs {
    let find = |name: &CStr, version: Option<&CStr>| -> *mut c_void {
        // SAFETY: `scope` is the live handle of the loaded library; the strings are NUL-terminated.
        unsafe {
            match version {
                Some(v) => libc::dlvsym(scope, name.as_ptr(), v.as_ptr()),
                None => libc::dlsym(scope, name.as_ptr()),
            }
        }
    };
    let iova2 = find(c"ibv_reg_mr_iova2", Some(c"IBVERBS_1.8"));
    let dmabuf = find(c"ibv_reg_dmabuf_mr", Some(c"IBVERBS_1.12"));
    let speed = find(c"ibv_query_port_speed", None);
    // SAFETY: each pointer is either null (None) or the address of the libibverbs function of
    // that name and version, whose C prototype the target type spells out.
    unsafe {
        OptionalVerbs {
            reg_mr_iova2: (!iova2.is_null())
                .then(|| std::mem::transmute::<*mut c_void, RegMrIova2>(iova2)),
            reg_dmabuf_mr: (!dmabuf.is_null())
                .then(|| std::mem::transmute::<*mut c_void, RegDmabufMr>(dmabuf)),
            query_port_speed: (!speed.is_null())
                .then(|| std::mem::transmute::<*mut c_void, QueryPortSpeed>(speed)),
        }
    }
}

/// `ibv_post_send` as `verbs.h` inlines it; returns 0 or an errno value.
///
/// # Safety
/// `qp` must be a live QP; `wr` a valid, NULL-terminated WR list whose SGEs and buffers obey
/// the verbs rules; `bad` writable.
pub(crate) unsafe fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int {
    // SAFETY: the caller guarantees `qp` is live, so its context and ops table are readable.
    match unsafe { (*(*qp).context).ops.post_send } {
        // SAFETY: the provider's op, called with the arguments the caller vouched for.
        Some(op) => unsafe { op(qp, wr, bad) },
        None => libc::EOPNOTSUPP,
    }
}

/// `ibv_post_srq_recv` as `verbs.h` inlines it; returns 0 or an errno value.
///
/// # Safety
/// `srq` must be a live SRQ; `wr` a valid, NULL-terminated receive WR list; `bad` writable.
pub(crate) unsafe fn post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: the caller guarantees `srq` is live, so its context and ops table are readable.
    match unsafe { (*(*srq).context).ops.post_srq_recv } {
        // SAFETY: the provider's op, called with the arguments the caller vouched for.
        Some(op) => unsafe { op(srq, wr, bad) },
        None => libc::EOPNOTSUPP,
    }
}

/// `ibv_poll_cq` as `verbs.h` inlines it: the number of completions written (<= `n`), or a
/// negative value on error.
///
/// # Safety
/// `cq` must be a live CQ and `wc` valid for writing `n` entries.
pub(crate) unsafe fn poll_cq(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    // SAFETY: the caller guarantees `cq` is live, so its context and ops table are readable.
    match unsafe { (*(*cq).context).ops.poll_cq } {
        // SAFETY: the provider's op, called with the arguments the caller vouched for.
        Some(op) => unsafe { op(cq, n, wc) },
        None => -libc::EOPNOTSUPP,
    }
}

/// The calling thread's errno (0 when none is set).
pub(crate) fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Clears errno, so that a verb that fails without setting it is not blamed on an older error.
pub(crate) fn clear_errno() {
    // SAFETY: __errno_location returns the calling thread's errno slot, always writable.
    unsafe { *libc::__errno_location() = 0 };
}

/// The errno of a failed verb's return code: verbs return a positive errno, some providers a
/// negated one, and a few -1 with errno set.
pub(crate) fn rc_errno(rc: c_int) -> i32 {
    match rc {
        -1 => errno(),
        rc if rc < 0 => rc.saturating_neg(),
        rc => rc,
    }
}
