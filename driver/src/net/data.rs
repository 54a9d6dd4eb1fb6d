//! Connection setup, memory registration and the data path of [`Net`].

use std::ffi::{c_int, c_void};
use std::ptr::{self, NonNull};

use super::{
    DataComm, ListenComm, MemHandle, Net, NetCtx, RecvBuf, RecvComm, Request, SendComm, Table,
};
use crate::abi::*;
use crate::error::{Error, Result};

impl Net<'_> {
    /// `listen` with caller-chosen pointers (any may be NULL).
    ///
    /// # Safety
    /// `handle` is NULL or 128 writable bytes; `out` is NULL or writable.
    pub unsafe fn listen_raw(
        &self,
        ctx: &NetCtx,
        dev: i32,
        handle: *mut c_void,
        out: *mut *mut c_void,
    ) -> Result<NcclResult> {
        let c = ctx.as_ptr();
        self.timed("listen", || {
            // SAFETY: (all arms) table validity as in `common_slot!`; pointers per the caller.
            Ok(unsafe {
                match self.table {
                    Table::V7(t) => self.need((*t).listen, "listen")?(dev, handle, out),
                    Table::V8(t) => self.need((*t).listen, "listen")?(dev, handle, out),
                    Table::V9(t) => self.need((*t).listen, "listen")?(dev, handle, out),
                    Table::V10(t) => self.need((*t).listen, "listen")?(dev, handle, out),
                    Table::V11(t) => self.need((*t).listen, "listen")?(c, dev, handle, out),
                    Table::V12(t) => self.need((*t).listen, "listen")?(c, dev, handle, out),
                }
            })
        })
    }

    /// `listen`: fills the 128-byte handle to ship to the connecting side.
    pub fn listen(
        &self,
        ctx: &NetCtx,
        dev: i32,
        handle: &mut [u8; HANDLE_SIZE],
    ) -> Result<ListenComm> {
        let mut out: *mut c_void = ptr::null_mut();
        // SAFETY: `handle` is 128 bytes, `out` a valid pointer.
        let code = unsafe { self.listen_raw(ctx, dev, handle.as_mut_ptr().cast(), &mut out) }?;
        self.check(code, "listen", || format!("dev {dev}"))?;
        NonNull::new(out).map(ListenComm).ok_or_else(|| {
            Error::Contract(format!(
                "{} listen succeeded with a NULL listenComm",
                self.version
            ))
        })
    }

    /// `connect`: non-blocking; `Ok(None)` means "call again with the same handle". The device
    /// handle argument points at a NULL pointer, as NCCL's proxy passes for HOST plugins.
    pub fn connect(
        &self,
        ctx: &NetCtx,
        dev: i32,
        handle: &mut [u8; HANDLE_SIZE],
    ) -> Result<Option<SendComm>> {
        let mut out: *mut c_void = ptr::null_mut();
        let mut dh: *mut DeviceHandle = ptr::null_mut();
        let h: *mut c_void = handle.as_mut_ptr().cast();
        let cfg: *mut CommConfig = (&*self.connect_config as *const CommConfig).cast_mut();
        let c = ctx.as_ptr();
        let code = self.timed("connect", || -> Result<NcclResult> {
            // SAFETY: (all arms) table validity as in `common_slot!`; every pointer is valid.
            Ok(unsafe {
                match self.table {
                    Table::V7(t) => self.need((*t).connect, "connect")?(dev, h, &mut out, &mut dh),
                    Table::V8(t) => self.need((*t).connect, "connect")?(dev, h, &mut out, &mut dh),
                    Table::V9(t) => self.need((*t).connect, "connect")?(dev, h, &mut out, &mut dh),
                    Table::V10(t) => {
                        self.need((*t).connect, "connect")?(dev, cfg, h, &mut out, &mut dh)
                    }
                    Table::V11(t) => {
                        self.need((*t).connect, "connect")?(c, dev, h, &mut out, &mut dh)
                    }
                    Table::V12(t) => {
                        self.need((*t).connect, "connect")?(c, dev, h, &mut out, &mut dh)
                    }
                }
            })
        })?;
        self.check(code, "connect", || format!("dev {dev}"))?;
        Ok(NonNull::new(out).map(SendComm))
    }

    /// `accept`: non-blocking; `Ok(None)` means "call again".
    pub fn accept(&self, listen: &ListenComm) -> Result<Option<RecvComm>> {
        let f = self.need(common_slot!(self, accept), "accept")?;
        let mut out: *mut c_void = ptr::null_mut();
        let mut dh: *mut DeviceHandle = ptr::null_mut();
        // SAFETY: `listen` came from this plugin's `listen` and is not closed (closing consumes
        // it); the out pointers are valid.
        let code = self.timed("accept", || unsafe {
            f(listen.as_ptr(), &mut out, &mut dh)
        });
        self.check(code, "accept", String::new)?;
        Ok(NonNull::new(out).map(RecvComm))
    }

    /// `closeListen`.
    pub fn close_listen(&self, comm: ListenComm) -> Result<()> {
        let f = self.need(common_slot!(self, close_listen), "closeListen")?;
        // SAFETY: a live listen comm, consumed here.
        let code = self.timed("closeListen", || unsafe { f(comm.as_ptr()) });
        self.check(code, "closeListen", String::new)
    }

    /// `closeSend`.
    pub fn close_send(&self, comm: SendComm) -> Result<()> {
        let f = self.need(common_slot!(self, close_send), "closeSend")?;
        // SAFETY: a live send comm, consumed here.
        let code = self.timed("closeSend", || unsafe { f(comm.as_ptr()) });
        self.check(code, "closeSend", String::new)
    }

    /// `closeRecv`.
    pub fn close_recv(&self, comm: RecvComm) -> Result<()> {
        let f = self.need(common_slot!(self, close_recv), "closeRecv")?;
        // SAFETY: a live receive comm, consumed here.
        let code = self.timed("closeRecv", || unsafe { f(comm.as_ptr()) });
        self.check(code, "closeRecv", String::new)
    }

    /// `regMr(comm, data, size, type)`; v7 passes the size as `int`.
    ///
    /// # Safety
    /// `[data, data + size)` is memory of `ptr_type` that stays allocated until `dereg_mr`.
    pub unsafe fn reg_mr(
        &self,
        comm: &impl DataComm,
        data: *mut c_void,
        size: usize,
        ptr_type: i32,
    ) -> Result<MemHandle> {
        let mut out: *mut c_void = ptr::null_mut();
        let c = comm.comm_ptr();
        let o: *mut *mut c_void = &mut out;
        let code = self.timed("regMr", || -> Result<NcclResult> {
            // SAFETY: (all arms) table validity as in `common_slot!`; memory per the caller.
            Ok(unsafe {
                match self.table {
                    Table::V7(t) => {
                        let size = c_int::try_from(size).map_err(|_| {
                            Error::Refused(format!("v7 regMr of {size} bytes does not fit an int"))
                        })?;
                        self.need((*t).reg_mr, "regMr")?(c, data, size, ptr_type, o)
                    }
                    Table::V8(t) => self.need((*t).reg_mr, "regMr")?(c, data, size, ptr_type, o),
                    Table::V9(t) => self.need((*t).reg_mr, "regMr")?(c, data, size, ptr_type, o),
                    Table::V10(t) => self.need((*t).reg_mr, "regMr")?(c, data, size, ptr_type, o),
                    Table::V11(t) => self.need((*t).reg_mr, "regMr")?(c, data, size, ptr_type, o),
                    Table::V12(t) => self.need((*t).reg_mr, "regMr")?(c, data, size, ptr_type, o),
                }
            })
        })?;
        self.check(code, "regMr", || {
            format!("{size} bytes at {data:p}, type {ptr_type}")
        })?;
        Ok(MemHandle(out))
    }

    /// `deregMr`.
    pub fn dereg_mr(&self, comm: &impl DataComm, mhandle: MemHandle) -> Result<()> {
        let f = self.need(common_slot!(self, dereg_mr), "deregMr")?;
        // SAFETY: `mhandle` came from `regMr` on this comm and is consumed here.
        let code = self.timed("deregMr", || unsafe {
            f(comm.comm_ptr(), mhandle.as_ptr())
        });
        self.check(code, "deregMr", String::new)
    }

    /// `isend` with raw pointers (the request pointer may be NULL), `phandle = NULL`.
    ///
    /// # Safety
    /// `comm` is a live send comm; `data`/`mhandle` a registered buffer of `size` bytes that stays
    /// valid until the request completes; `request` is NULL or writable.
    pub unsafe fn isend_raw(
        &self,
        comm: *mut c_void,
        data: *mut c_void,
        size: usize,
        tag: i32,
        mhandle: *mut c_void,
        request: *mut *mut c_void,
    ) -> Result<NcclResult> {
        let (c, d, m, r, null) = (comm, data, mhandle, request, ptr::null_mut());
        self.timed("isend", || {
            // SAFETY: (all arms) table validity as in `common_slot!`; pointers per the caller.
            Ok(unsafe {
                match self.table {
                    Table::V7(t) => {
                        let n = self.int_size(size, "isend")?;
                        self.need((*t).isend, "isend")?(c, d, n, tag, m, r)
                    }
                    Table::V8(t) => {
                        let n = self.int_size(size, "isend")?;
                        self.need((*t).isend, "isend")?(c, d, n, tag, m, r)
                    }
                    Table::V9(t) => self.need((*t).isend, "isend")?(c, d, size, tag, m, r),
                    Table::V10(t) => self.need((*t).isend, "isend")?(c, d, size, tag, m, null, r),
                    Table::V11(t) => self.need((*t).isend, "isend")?(c, d, size, tag, m, null, r),
                    Table::V12(t) => self.need((*t).isend, "isend")?(c, d, size, tag, m, null, r),
                }
            })
        })
    }

    /// `isend`: `Ok(None)` means "try again later".
    ///
    /// # Safety
    /// As [`Net::isend_raw`].
    pub unsafe fn isend(
        &self,
        comm: &SendComm,
        data: *mut c_void,
        size: usize,
        tag: i32,
        mhandle: &MemHandle,
    ) -> Result<Option<Request>> {
        let mut request: *mut c_void = ptr::null_mut();
        let (c, m) = (comm.as_ptr(), mhandle.as_ptr());
        // SAFETY: forwarded contract; `request` is writable.
        let code = unsafe { self.isend_raw(c, data, size, tag, m, &mut request) }?;
        self.check(code, "isend", || format!("size {size}, tag {tag}"))?;
        Ok(NonNull::new(request).map(Request))
    }

    /// `irecv` of `bufs.len()` grouped buffers with a raw request pointer (may be NULL; NCCL may
    /// pre-set `*request` to `(void*)1`), `phandles = NULL`.
    ///
    /// # Safety
    /// `comm` is a live receive comm; every buffer is registered, of its capacity, and valid
    /// until the request completes; `request` is NULL or writable.
    pub unsafe fn irecv_raw(
        &self,
        comm: *mut c_void,
        bufs: &[RecvBuf],
        request: *mut *mut c_void,
    ) -> Result<NcclResult> {
        let n =
            c_int::try_from(bufs.len()).map_err(|_| Error::Refused("too many buffers".into()))?;
        let mut data: Vec<*mut c_void> = bufs.iter().map(|b| b.data).collect();
        let mut tags: Vec<c_int> = bufs.iter().map(|b| b.tag).collect();
        let mut mhandles: Vec<*mut c_void> = bufs.iter().map(|b| b.mhandle).collect();
        let mut sizes: Vec<usize> = bufs.iter().map(|b| b.size).collect();
        let mut int_sizes = Vec::with_capacity(bufs.len());
        if self.version.int_sizes() {
            for b in bufs {
                int_sizes.push(self.int_size(b.size, "irecv")?);
            }
        }
        let (c, d, t, m) = (
            comm,
            data.as_mut_ptr(),
            tags.as_mut_ptr(),
            mhandles.as_mut_ptr(),
        );
        let (s, si, r, null) = (
            sizes.as_mut_ptr(),
            int_sizes.as_mut_ptr(),
            request,
            ptr::null_mut(),
        );
        self.timed("irecv", || {
            // SAFETY: (all arms) table validity as in `common_slot!`; the arrays hold `n` entries and
            // outlive the call; buffers per the caller.
            Ok(unsafe {
                match self.table {
                    Table::V7(x) => self.need((*x).irecv, "irecv")?(c, n, d, si, t, m, r),
                    Table::V8(x) => self.need((*x).irecv, "irecv")?(c, n, d, si, t, m, r),
                    Table::V9(x) => self.need((*x).irecv, "irecv")?(c, n, d, s, t, m, r),
                    Table::V10(x) => self.need((*x).irecv, "irecv")?(c, n, d, s, t, m, null, r),
                    Table::V11(x) => self.need((*x).irecv, "irecv")?(c, n, d, s, t, m, null, r),
                    Table::V12(x) => self.need((*x).irecv, "irecv")?(c, n, d, s, t, m, null, r),
                }
            })
        })
    }

    /// `irecv` with `*request` pre-set to `preset` (NULL, or `(void*)1` like NCCL's LL path).
    /// `Ok(None)` means "try again later"; a plugin that leaves a non-NULL preset untouched breaks
    /// the contract ("never treat `*request` as input").
    ///
    /// # Safety
    /// As [`Net::irecv_raw`].
    pub unsafe fn irecv_preset(
        &self,
        comm: &RecvComm,
        bufs: &[RecvBuf],
        preset: *mut c_void,
    ) -> Result<Option<Request>> {
        let mut request = preset;
        // SAFETY: forwarded contract; `request` is writable.
        let code = unsafe { self.irecv_raw(comm.as_ptr(), bufs, &mut request) }?;
        self.check(code, "irecv", || format!("n {}", bufs.len()))?;
        if !preset.is_null() && request == preset {
            return Err(Error::Contract(format!(
                "{} irecv left *request == {preset:p} (the pre-set value) instead of writing a \
                 request or NULL",
                self.version
            )));
        }
        Ok(NonNull::new(request).map(Request))
    }

    /// `irecv`: `Ok(None)` means "try again later".
    ///
    /// # Safety
    /// As [`Net::irecv_raw`].
    pub unsafe fn irecv(&self, comm: &RecvComm, bufs: &[RecvBuf]) -> Result<Option<Request>> {
        // SAFETY: forwarded contract.
        unsafe { self.irecv_preset(comm, bufs, ptr::null_mut()) }
    }

    /// `iflush(recvComm, n, data, int sizes, mhandles, &request)`: `Ok(None)` = nothing to wait
    /// for.
    ///
    /// # Safety
    /// As [`Net::irecv_raw`] (the buffers were received into).
    pub unsafe fn iflush(&self, comm: &RecvComm, bufs: &[RecvBuf]) -> Result<Option<Request>> {
        let f = self.need(common_slot!(self, iflush), "iflush")?;
        let n =
            c_int::try_from(bufs.len()).map_err(|_| Error::Refused("too many buffers".into()))?;
        let mut data: Vec<*mut c_void> = bufs.iter().map(|b| b.data).collect();
        let mut sizes: Vec<c_int> = bufs
            .iter()
            .map(|b| c_int::try_from(b.size).unwrap_or(c_int::MAX))
            .collect();
        let mut mhandles: Vec<*mut c_void> = bufs.iter().map(|b| b.mhandle).collect();
        let mut request: *mut c_void = ptr::null_mut();
        let (d, s, m) = (data.as_mut_ptr(), sizes.as_mut_ptr(), mhandles.as_mut_ptr());
        // SAFETY: arrays of `n` entries outlive the call; the comm and buffers per the caller.
        let code = self.timed("iflush", || unsafe {
            f(comm.as_ptr(), n, d, s, m, &mut request)
        });
        self.check(code, "iflush", || format!("n {n}"))?;
        Ok(NonNull::new(request).map(Request))
    }

    /// `test(request, done, sizes)` with raw pointers.
    ///
    /// # Safety
    /// `request` is NULL or an outstanding request; `done`/`sizes` are NULL or writable
    /// (`sizes` for as many ints as the request has buffers).
    pub unsafe fn test_raw(
        &self,
        request: *mut c_void,
        done: *mut c_int,
        sizes: *mut c_int,
    ) -> Result<NcclResult> {
        let f = self.need(common_slot!(self, test), "test")?;
        // SAFETY: forwarded contract.
        Ok(self.timed("test", || unsafe { f(request, done, sizes) }))
    }

    /// `test`: `Ok(true)` when done (the request is then dead). `sizes` receives one entry per
    /// buffer (receives: pass at least `n`; NCCL passes 64), or NULL when `None`.
    pub fn test(&self, request: &Request, sizes: Option<&mut [i32]>) -> Result<bool> {
        let mut done: c_int = 0;
        let sizes_ptr = sizes.map_or(ptr::null_mut(), |s| s.as_mut_ptr());
        // SAFETY: requests are only created from plugin outputs and the callers stop testing a
        // request once it reported done; `sizes` is a live slice or NULL.
        let code = unsafe { self.test_raw(request.as_ptr(), &mut done, sizes_ptr) }?;
        self.check(code, "test", || format!("request {:p}", request.as_ptr()))?;
        Ok(done != 0)
    }
}
