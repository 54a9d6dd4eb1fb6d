//! Page checks shared by the fabrics that execute RDMA operations in software.
//!
//! `ibv_reg_mr` pins the pages and fails with EFAULT on unmapped memory; a fabric that copies
//! bytes itself (loopback, tcp) checks the same at registration, so a bogus registration is an
//! error there instead of a segfault when a peer's write lands.

/// The system's page size (4096 where it cannot be read).
pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
        .unwrap_or(4096)
        .max(1)
}

/// Whether every page of `[addr, addr + len)` is mapped in this process. `ibv_reg_mr` pins the
/// pages and fails with EFAULT on unmapped memory; checking here keeps a bogus registration
/// from turning into a segfault at execution time. `mincore` has no side effects on the pages.
pub(crate) fn mapped(addr: u64, len: u64) -> bool {
    let page = page_size() as u64;
    let Some(end) = addr.checked_add(len) else {
        return false;
    };
    let mut start = addr - addr % page;
    // One status byte per page; probe in chunks so no allocation depends on the length.
    let mut status = [0u8; 512];
    while start < end {
        let chunk = (end - start).min(page * status.len() as u64);
        let Ok(chunk_len) = usize::try_from(chunk) else {
            return false;
        };
        // SAFETY: mincore only reads the page tables of the range and writes at most
        // ceil(chunk / page) <= status.len() bytes into `status`; `start` is page-aligned.
        let rc =
            unsafe { libc::mincore(start as *mut libc::c_void, chunk_len, status.as_mut_ptr()) };
        if rc != 0 {
            return false;
        }
        start += chunk;
    }
    true
}

/// The checks `ibv_reg_mr` makes of a range before pinning it: non-empty, non-null, not wrapping
/// (EINVAL), and mapped (EFAULT). `Err` carries the errno and the detail.
pub(crate) fn check_registration(addr: u64, len: usize) -> Result<u64, (i32, String)> {
    let len64 = len as u64;
    if len == 0 || addr == 0 || addr.checked_add(len64).is_none() {
        return Err((libc::EINVAL, format!("bad range {addr:#x}+{len}")));
    }
    if !mapped(addr, len64) {
        return Err((
            libc::EFAULT,
            format!("range {addr:#x}+{len} is not mapped memory"),
        ));
    }
    Ok(len64)
}

/// A queue depth in `1..=max`, or why not.
pub(crate) fn check_depth(depth: u32, max: u32) -> Result<u32, String> {
    if depth == 0 || depth > max {
        Err(format!("depth {depth} outside 1..={max}"))
    } else {
        Ok(depth)
    }
}
