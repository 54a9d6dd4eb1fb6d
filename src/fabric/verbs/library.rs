//! libibverbs, opened when the verbs fabric starts rather than linked: the plugin then loads and
//! runs the tcp and loopback fabrics on a machine without rdma-core, and `MPIB_FABRIC=verbs`
//! there fails `init` with an error that names the library and its package. NCCL opens
//! libibverbs the same way and for the same reason (nccl/src/misc/ibvsymbols.cc: `dlopen` of
//! "libibverbs.so.1", then every entry point by name and symbol version).
//!
//! Every entry point the fabric calls is resolved once, at [`load`], with `dlvsym` at
//! IBVERBS_1.1 (the version every rdma-core since 2016 exports; its IBVERBS_1.0 twins are the
//! old compat ABI). A missing one fails the load, naming it. The functions below keep the
//! libibverbs names and contracts, so the fabric's call sites read as the verbs they are; before
//! a successful [`load`] (which no caller can reach, since no device exists then) they fail as
//! the verb would with `ENOSYS`, never a panic.
//!
//! rdma-sys stays for the types. Its function declarations must not be called: a call would
//! make libibverbs a load-time dependency again (tests/exports.rs checks the plugin imports no
//! `ibv_` symbol).

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

use rdma_sys::{
    _compat_ibv_port_attr, ibv_async_event, ibv_comp_channel, ibv_context, ibv_cq, ibv_device,
    ibv_device_attr, ibv_gid, ibv_mr, ibv_pd, ibv_port_attr, ibv_qp, ibv_qp_attr, ibv_qp_init_attr,
    ibv_srq, ibv_srq_init_attr, verbs_context,
};

/// The library's file name (its soname since rdma-core 1.0).
pub(crate) const LIBRARY: &str = "libibverbs.so.1";
/// Where it comes from, for the error a user sees.
const PACKAGE: &str =
    "install rdma-core's libibverbs (Debian and Ubuntu: libibverbs1; RHEL and Fedora: libibverbs)";
/// The symbol version of every required entry point.
const VERSION: &CStr = c"IBVERBS_1.1";

/// Declares the required entry points once: the table's fields, their resolution and the
/// wrappers the fabric calls.
macro_rules! entry_points {
    ($( $name:ident ( $($arg:ident : $ty:ty),* ) -> $ret:ty, failed $failed:expr; )*) => {
        /// The resolved entry points of the loaded libibverbs.
        #[allow(clippy::struct_field_names)]
        pub(crate) struct Verbs {
            /// The `dlopen` handle (never closed: the process keeps the library).
            handle: *mut c_void,
            $( $name: unsafe extern "C" fn($($ty),*) -> $ret, )*
        }

        impl Verbs {
            fn resolve(handle: *mut c_void) -> Result<Verbs, String> {
                Ok(Verbs {
                    handle,
                    $( $name: {
                        let name = concat!(stringify!($name), "\0");
                        let address = find(handle, name)?;
                        // SAFETY: `address` is libibverbs' function of this name at IBVERBS_1.1,
                        // whose C prototype is the field's type (rdma-sys's bindings of verbs.h).
                        unsafe {
                            std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($ty),*) -> $ret>(
                                address,
                            )
                        }
                    }, )*
                })
            }
        }

        $(
            #[doc = concat!("`", stringify!($name), "` of the loaded libibverbs.")]
            ///
            /// # Safety
            /// The verb's own contract (verbs.h).
            pub(crate) unsafe fn $name($($arg: $ty),*) -> $ret {
                match loaded() {
                    // SAFETY: the caller keeps the verb's contract.
                    Some(verbs) => unsafe { (verbs.$name)($($arg),*) },
                    None => {
                        set_errno(libc::ENOSYS);
                        $failed
                    }
                }
            }
        )*
    };
}

entry_points! {
    ibv_get_device_list(count: *mut c_int) -> *mut *mut ibv_device, failed std::ptr::null_mut();
    ibv_free_device_list(list: *mut *mut ibv_device) -> (), failed ();
    ibv_get_device_name(device: *mut ibv_device) -> *const c_char, failed std::ptr::null();
    ibv_open_device(device: *mut ibv_device) -> *mut ibv_context, failed std::ptr::null_mut();
    ibv_close_device(context: *mut ibv_context) -> c_int, failed libc::ENOSYS;
    ibv_query_device(context: *mut ibv_context, attr: *mut ibv_device_attr) -> c_int,
        failed libc::ENOSYS;
    ibv_query_port(context: *mut ibv_context, port: u8, attr: *mut _compat_ibv_port_attr) -> c_int,
        failed libc::ENOSYS;
    ibv_query_gid(context: *mut ibv_context, port: u8, index: c_int, gid: *mut ibv_gid) -> c_int,
        failed libc::ENOSYS;
    ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd, failed std::ptr::null_mut();
    ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int, failed libc::ENOSYS;
    ibv_reg_mr(pd: *mut ibv_pd, address: *mut c_void, length: usize, access: c_int) -> *mut ibv_mr,
        failed std::ptr::null_mut();
    ibv_dereg_mr(mr: *mut ibv_mr) -> c_int, failed libc::ENOSYS;
    ibv_create_cq(
        context: *mut ibv_context,
        entries: c_int,
        cq_context: *mut c_void,
        channel: *mut ibv_comp_channel,
        vector: c_int
    ) -> *mut ibv_cq, failed std::ptr::null_mut();
    ibv_destroy_cq(cq: *mut ibv_cq) -> c_int, failed libc::ENOSYS;
    ibv_create_srq(pd: *mut ibv_pd, attr: *mut ibv_srq_init_attr) -> *mut ibv_srq,
        failed std::ptr::null_mut();
    ibv_destroy_srq(srq: *mut ibv_srq) -> c_int, failed libc::ENOSYS;
    ibv_create_qp(pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> *mut ibv_qp,
        failed std::ptr::null_mut();
    ibv_modify_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, mask: c_int) -> c_int,
        failed libc::ENOSYS;
    ibv_destroy_qp(qp: *mut ibv_qp) -> c_int, failed libc::ENOSYS;
    ibv_get_async_event(context: *mut ibv_context, event: *mut ibv_async_event) -> c_int,
        failed libc::ENOSYS;
    ibv_ack_async_event(event: *mut ibv_async_event) -> (), failed ();
}

// SAFETY: the table holds a library handle and function addresses, immutable once resolved and
// valid for the life of the process (the library is never closed); libibverbs' entry points
// may be called from any thread.
unsafe impl Send for Verbs {}
// SAFETY: as above: shared reads of immutable addresses.
unsafe impl Sync for Verbs {}

static LOADED: OnceLock<Result<Verbs, String>> = OnceLock::new();

fn set_errno(value: c_int) {
    // SAFETY: __errno_location returns the calling thread's errno slot, always writable.
    unsafe { *libc::__errno_location() = value };
}

/// The last `dlerror()` text, or "unknown error".
fn dl_error() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the next dl* call on
    // this thread; it is copied at once.
    let text = unsafe { libc::dlerror() };
    if text.is_null() {
        "unknown error".to_string()
    } else {
        // SAFETY: non-null and NUL-terminated, as above.
        unsafe { CStr::from_ptr(text) }
            .to_string_lossy()
            .into_owned()
    }
}

/// `name` (NUL-terminated) at IBVERBS_1.1 in the library `handle`.
fn find(handle: *mut c_void, name: &str) -> Result<*mut c_void, String> {
    // SAFETY: `handle` is a live dlopen handle; both strings are NUL-terminated.
    let address = unsafe { libc::dlvsym(handle, name.as_ptr().cast(), VERSION.as_ptr()) };
    if address.is_null() {
        let name = name.trim_end_matches('\0');
        return Err(format!(
            "{LIBRARY} has no {name}@IBVERBS_1.1 ({}): rdma-core older than 2016, or not libibverbs",
            dl_error()
        ));
    }
    Ok(address)
}

fn open() -> Result<Verbs, String> {
    let file = format!("{LIBRARY}\0");
    // SAFETY: a NUL-terminated file name; RTLD_NOW resolves the library's own dependencies now.
    let handle = unsafe { libc::dlopen(file.as_ptr().cast(), libc::RTLD_NOW) };
    if handle.is_null() {
        return Err(format!(
            "MPIB_FABRIC=verbs needs {LIBRARY}, which cannot be loaded ({}): {PACKAGE}, or choose \
             MPIB_FABRIC=tcp",
            dl_error()
        ));
    }
    Verbs::resolve(handle).inspect_err(|_| {
        // SAFETY: `handle` came from dlopen above and nothing resolved from it is kept.
        unsafe { libc::dlclose(handle) };
    })
}

/// Opens libibverbs and resolves every entry point, once per process; later calls return the
/// first outcome.
///
/// # Errors
/// The library cannot be loaded (the message names it and its package), or lacks an entry point.
pub(crate) fn load() -> Result<(), String> {
    LOADED
        .get_or_init(open)
        .as_ref()
        .map(|_| ())
        .map_err(Clone::clone)
}

fn loaded() -> Option<&'static Verbs> {
    LOADED.get().and_then(|outcome| outcome.as_ref().ok())
}

/// The handle of the loaded library, where the optional entry points are looked up (null before
/// a successful [`load`]).
pub(crate) fn handle() -> *mut c_void {
    loaded().map_or(std::ptr::null_mut(), |verbs| verbs.handle)
}

/// `ibv_query_port` as verbs.h inlines it: the provider's extended op with the full structure
/// when the context has one, else the IBVERBS_1.1 entry point with the older, shorter layout
/// (`attr` zeroed first, so the fields it does not write read 0).
///
/// # Safety
/// `context` must be a live context.
pub(crate) unsafe fn query_port(
    context: *mut ibv_context,
    port: u8,
    attr: &mut ibv_port_attr,
) -> c_int {
    // SAFETY: the caller guarantees `context` is live.
    if let Some(op) = unsafe { extended_query_port(context) } {
        let size = std::mem::size_of::<ibv_port_attr>();
        // SAFETY: the provider's op with a full-size out-parameter.
        return unsafe { op(context, port, attr, size) };
    }
    // SAFETY: all-zero is a valid `ibv_port_attr` (integers only).
    *attr = unsafe { std::mem::zeroed() };
    let compat = (attr as *mut ibv_port_attr).cast::<_compat_ibv_port_attr>();
    // SAFETY: the compat layout is a prefix of `ibv_port_attr`; `context` is live.
    unsafe { ibv_query_port(context, port, compat) }
}

type QueryPortOp = unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr, usize) -> c_int;

/// The context's `query_port` op when it is a `verbs_context` large enough to have one
/// (verbs.h `verbs_get_ctx_op`).
///
/// # Safety
/// `context` must be a live context.
unsafe fn extended_query_port(context: *mut ibv_context) -> Option<QueryPortOp> {
    // verbs.h: `abi_compat == __VERBS_ABI_IS_EXTENDED`, that is `(void *)UINTPTR_MAX`.
    // SAFETY: the caller guarantees `context` is live.
    if unsafe { (*context).abi_compat } as usize != usize::MAX {
        return None;
    }
    // A verbs_context ends with the ibv_context it extends (verbs.h `verbs_get_ctx`).
    let offset = std::mem::offset_of!(verbs_context, context);
    let extended = context
        .cast::<u8>()
        .wrapping_sub(offset)
        .cast::<verbs_context>();
    let needed =
        std::mem::size_of::<verbs_context>() - std::mem::offset_of!(verbs_context, query_port);
    // SAFETY: `abi_compat` says this context is the last field of a live verbs_context, whose
    // `sz` tells how much of it the library filled in.
    unsafe {
        if (*extended).sz < needed {
            return None;
        }
        (*extended).query_port
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    unsafe extern "C" fn fake_query_port(
        _: *mut ibv_context,
        _: u8,
        _: *mut ibv_port_attr,
        _: usize,
    ) -> c_int {
        0
    }

    /// A `verbs_context` as a provider lays it out: the extended ops, `sz`, then the
    /// `ibv_context` whose `abi_compat` says so.
    #[test]
    fn the_extended_op_is_found_only_in_an_extended_context_that_has_it() {
        // SAFETY: all-zero is a valid verbs_context (integers, nullable pointers, None ops).
        let mut extended: Box<verbs_context> = Box::new(unsafe { std::mem::zeroed() });
        extended.sz = std::mem::size_of::<verbs_context>();
        extended.query_port = Some(fake_query_port);
        extended.context.abi_compat = usize::MAX as *mut c_void;
        let context = std::ptr::addr_of_mut!(extended.context);
        // SAFETY: `context` points into the live box.
        assert!(unsafe { extended_query_port(context) }.is_some());
        extended.sz = std::mem::size_of::<verbs_context>()
            - std::mem::offset_of!(verbs_context, query_port)
            - 1;
        // SAFETY: as above.
        let small = unsafe { extended_query_port(context) };
        assert!(small.is_none(), "too small to hold the op");
        extended.sz = std::mem::size_of::<verbs_context>();
        extended.context.abi_compat = std::ptr::null_mut();
        // SAFETY: as above.
        let plain = unsafe { extended_query_port(context) };
        assert!(plain.is_none(), "not an extended context");
    }
}
