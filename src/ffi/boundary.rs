//! The fence between NCCL and Rust, in the style of rustls-ffi.
//!
//! Every exported function body runs inside [`call`] (usually through the [`entry!`] macro):
//! * a panic is caught with [`std::panic::catch_unwind`], logged at WARN with the entry point's
//!   name and the panic message, and becomes `ncclInternalError` (3);
//! * an `Err(Error)` is logged at WARN as `"<entry point>: <message>"` and becomes its code;
//! * success is `ncclSuccess` (0).
//!
//! The helpers below turn raw arguments into checked Rust values: a NULL where a pointer is
//! required is `ncclInvalidArgument` (4) naming the parameter; C `int`s are range-checked.
//! Outputs go through [`Out`], which can only write, so `*request` (which NCCL may pre-set to
//! `(void*)1`) is never read. Bodies write outputs last, after every fallible step, so an error
//! or a panic leaves them untouched.

use std::any::Any;
use std::ffi::c_int;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::NonNull;

use crate::error::{Error, ErrorKind, Result};
use crate::log;

/// `ncclSuccess`.
pub const SUCCESS: c_int = 0;
/// `ncclInternalError`: what a caught panic becomes.
pub const INTERNAL_ERROR: c_int = 3;

/// Runs one entry point's body: catches panics, logs and converts errors, returns the
/// `ncclResult_t`.
pub fn call<F>(entry: &'static str, body: F) -> c_int
where
    F: FnOnce() -> Result<()>,
{
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => SUCCESS,
        Ok(Err(error)) => {
            crate::warn!(log::NET, "{entry}: {}", error.message);
            error.kind.code()
        }
        Err(payload) => {
            crate::warn!(
                log::NET,
                "{entry}: panicked: {}",
                panic_message(payload.as_ref())
            );
            drop_payload(payload);
            INTERNAL_ERROR
        }
    }
}

/// Runs an entry point body (an expression using raw pointers) inside [`call`].
///
/// `entry!("isend", common::isend(...))`: the body is evaluated in an `unsafe` block whose
/// obligations are the entry point's own (NCCL passes arguments as the ABI describes).
macro_rules! entry {
    ($name:literal, $body:expr) => {
        $crate::ffi::boundary::call($name, || {
            // SAFETY: forwarded from the enclosing `unsafe extern "C" fn`, whose contract is the
            // NCCL net ABI: every pointer is NULL or valid as that ABI describes, and handles are
            // ones this plugin returned and has not yet released.
            unsafe { $body }
        })
    };
}
pub(crate) use entry;

/// The text of a panic payload (`&str` or `String`; anything else is reported as opaque).
fn panic_message(payload: &(dyn Any + Send)) -> &str {
    if let Some(text) = payload.downcast_ref::<&'static str>() {
        text
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text
    } else {
        "non-string panic payload"
    }
}

/// Drops a panic payload without letting a panicking `Drop` unwind into C (it is leaked then).
fn drop_payload(payload: Box<dyn Any + Send>) {
    if let Err(inner) = catch_unwind(AssertUnwindSafe(move || drop(payload))) {
        std::mem::forget(inner);
    }
}

/// `ncclInvalidArgument`: "`<name>` is NULL".
pub fn null_argument(name: &str) -> Error {
    Error::invalid_argument(format!("{name} is NULL"))
}

/// An output pointer NCCL passed: it can only be written, never read.
pub struct Out<T>(NonNull<T>);

impl<T> Out<T> {
    /// A required output; NULL is `ncclInvalidArgument` naming `name`.
    ///
    /// # Safety
    /// `ptr` must be NULL or valid for a write of `T` until the entry point returns.
    pub unsafe fn required(ptr: *mut T, name: &str) -> Result<Out<T>> {
        NonNull::new(ptr)
            .map(Out)
            .ok_or_else(|| null_argument(name))
    }

    /// An optional output (NULL = the caller does not want it).
    ///
    /// # Safety
    /// As [`Out::required`].
    pub unsafe fn optional(ptr: *mut T) -> Option<Out<T>> {
        NonNull::new(ptr).map(Out)
    }

    /// Stores `value` (without reading or dropping the old contents).
    pub fn write(self, value: T) {
        // SAFETY: the constructor's contract: non-NULL and valid for a write of `T` for the
        // entry point's duration, which this value cannot outlive in practice.
        unsafe { self.0.as_ptr().write(value) }
    }
}

impl<T: Copy> Out<T> {
    /// Stores `values` into the first `values.len()` elements of the array `self` points to.
    ///
    /// # Safety
    /// The pointer must be valid for writes of `values.len()` elements.
    pub unsafe fn write_slice(self, values: &[T]) {
        // SAFETY: valid for `values.len()` writes (this function's contract); the source is a
        // Rust slice, which cannot overlap NCCL's array.
        unsafe { std::ptr::copy_nonoverlapping(values.as_ptr(), self.0.as_ptr(), values.len()) }
    }
}

/// A required input array of `len` elements.
///
/// # Safety
/// `ptr` must be NULL or valid for reads of `len` elements for `'a`.
pub unsafe fn input_slice<'a, T>(ptr: *const T, len: usize, name: &str) -> Result<&'a [T]> {
    let ptr = NonNull::new(ptr.cast_mut()).ok_or_else(|| null_argument(name))?;
    // SAFETY: non-NULL here and valid for `len` reads for `'a` (contract); NCCL's arrays are
    // naturally aligned.
    Ok(unsafe { std::slice::from_raw_parts(ptr.as_ptr(), len) })
}

/// An optional input array of `len` elements (NULL = absent).
///
/// # Safety
/// As [`input_slice`].
pub unsafe fn optional_slice<'a, T>(ptr: *const T, len: usize) -> Option<&'a [T]> {
    let ptr = NonNull::new(ptr.cast_mut())?;
    // SAFETY: non-NULL here and valid for `len` reads for `'a` (contract).
    Some(unsafe { std::slice::from_raw_parts(ptr.as_ptr(), len) })
}

/// A required input struct.
///
/// # Safety
/// `ptr` must be NULL or valid for reads of `T` for `'a`.
pub unsafe fn input<'a, T>(ptr: *const T, name: &str) -> Result<&'a T> {
    // SAFETY: `as_ref` handles NULL; otherwise `ptr` is valid for `'a` (contract).
    unsafe { ptr.as_ref() }.ok_or_else(|| null_argument(name))
}

/// A required in/out struct (e.g. the 128-byte listen handle, which `connect` may update).
///
/// # Safety
/// `ptr` must be NULL or valid for reads and writes of `T` for `'a`, with no other reference
/// to it during `'a`.
pub unsafe fn input_mut<'a, T>(ptr: *mut T, name: &str) -> Result<&'a mut T> {
    // SAFETY: `as_mut` handles NULL; otherwise valid and unaliased for `'a` (contract).
    unsafe { ptr.as_mut() }.ok_or_else(|| null_argument(name))
}

/// A size argument as NCCL passes it: `int` before ABI v9 (and always in `iflush`/`regMr` v7),
/// `size_t` after.
pub trait SizeArg: Copy + fmt::Display {
    /// The value as a byte count, or `None` if it is negative.
    fn to_size(self) -> Option<usize>;
}

impl SizeArg for c_int {
    fn to_size(self) -> Option<usize> {
        usize::try_from(self).ok()
    }
}

impl SizeArg for usize {
    fn to_size(self) -> Option<usize> {
        Some(self)
    }
}

/// Converts a size argument; a negative `int` is `ncclInvalidArgument` naming `name`.
pub fn size_arg<S: SizeArg>(value: S, name: &str) -> Result<usize> {
    value
        .to_size()
        .ok_or_else(|| Error::invalid_argument(format!("{name} is negative ({value})")))
}

/// Converts element `index` of a size array (named `name[index]` in the error).
pub fn size_at<S: SizeArg>(value: S, name: &str, index: usize) -> Result<usize> {
    value
        .to_size()
        .ok_or_else(|| Error::invalid_argument(format!("{name}[{index}] is negative ({value})")))
}

/// Checks a C `int` count against `1..=max`; anything else is `ncclInvalidArgument`.
pub fn count_arg(value: c_int, name: &str, max: usize) -> Result<usize> {
    match usize::try_from(value) {
        Ok(count) if (1..=max).contains(&count) => Ok(count),
        _ => Err(Error::new(
            ErrorKind::InvalidArgument,
            format!("{name} = {value} is out of range 1..={max}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn explode() -> i32 {
        panic!("boom")
    }

    #[test]
    fn success_is_zero() {
        assert_eq!(call("t", || Ok(())), SUCCESS);
    }

    #[test]
    fn panic_is_internal_error_and_writes_nothing() {
        let mut out = 7;
        let rc = call("t", || {
            let value = explode();
            out = value;
            Ok(())
        });
        assert_eq!(rc, INTERNAL_ERROR);
        assert_eq!(out, 7);
        let rc = call("t", || panic!("formatted {}", 1));
        assert_eq!(rc, 3);
        let rc = call("t", || std::panic::panic_any(42_u8));
        assert_eq!(rc, 3);
    }

    #[test]
    fn panic_messages_are_extracted() {
        let text: Box<dyn Any + Send> = Box::new("static");
        assert_eq!(panic_message(text.as_ref()), "static");
        let owned: Box<dyn Any + Send> = Box::new(String::from("owned"));
        assert_eq!(panic_message(owned.as_ref()), "owned");
        let other: Box<dyn Any + Send> = Box::new(1_u32);
        assert_eq!(panic_message(other.as_ref()), "non-string panic payload");
    }

    #[test]
    fn errors_become_their_code() {
        assert_eq!(call("t", || Err(Error::system("x"))), 2);
        assert_eq!(call("t", || Err(Error::internal("x"))), 3);
        assert_eq!(call("t", || Err(Error::invalid_argument("x"))), 4);
        assert_eq!(call("t", || Err(Error::invalid_usage("x"))), 5);
        assert_eq!(call("t", || Err(Error::remote("x"))), 6);
    }

    #[test]
    fn null_output_is_invalid_argument_naming_it() {
        // SAFETY: NULL is allowed by the contract.
        let err = unsafe { Out::<i32>::required(std::ptr::null_mut(), "request") }
            .err()
            .expect("NULL must be rejected");
        assert_eq!(err.kind, ErrorKind::InvalidArgument);
        assert_eq!(err.message, "request is NULL");
        let rc = call("isend", || {
            // SAFETY: NULL is allowed by the contract.
            unsafe { Out::<i32>::required(std::ptr::null_mut(), "request") }.map(drop)
        });
        assert_eq!(rc, 4);
    }

    #[test]
    fn outputs_write_without_reading() {
        let mut slot: *mut u8 = 1 as *mut u8;
        // SAFETY: `slot` is a live local.
        let out = unsafe { Out::required(&mut slot, "request") }.expect("non-NULL");
        out.write(std::ptr::null_mut());
        assert!(slot.is_null());
        let mut array = [0_i32; 4];
        // SAFETY: `array` holds 4 elements, 2 are written.
        unsafe {
            Out::required(array.as_mut_ptr(), "sizes")
                .expect("non-NULL")
                .write_slice(&[5, 6])
        };
        assert_eq!(array, [5, 6, 0, 0]);
    }

    #[test]
    fn inputs_check_null() {
        let values = [1_i32, 2, 3];
        // SAFETY: `values` holds 3 elements.
        let read = unsafe { input_slice(values.as_ptr(), 3, "tags") };
        assert_eq!(read, Ok(&values[..]));
        // SAFETY: NULL is allowed by the contract.
        let err = unsafe { input_slice::<i32>(std::ptr::null(), 3, "tags") }.unwrap_err();
        assert_eq!(err.message, "tags is NULL");
        // SAFETY: NULL is allowed by the contract.
        assert!(unsafe { optional_slice::<i32>(std::ptr::null(), 3) }.is_none());
        // SAFETY: NULL is allowed by the contract.
        let err = unsafe { input::<i32>(std::ptr::null(), "props") }.unwrap_err();
        assert_eq!(
            (err.kind, err.message.as_str()),
            (ErrorKind::InvalidArgument, "props is NULL")
        );
    }

    #[test]
    fn int_sizes_must_not_be_negative() {
        assert_eq!(size_arg(5_i32, "size"), Ok(5));
        assert_eq!(size_arg(0_i32, "size"), Ok(0));
        assert_eq!(size_arg(usize::MAX, "size"), Ok(usize::MAX));
        let err = size_arg(-1_i32, "size").unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidArgument);
        assert_eq!(err.message, "size is negative (-1)");
        let err = size_at(i32::MIN, "sizes", 3).unwrap_err();
        assert_eq!(err.message, format!("sizes[3] is negative ({})", i32::MIN));
        assert_eq!(call("isend", || size_arg(-7_i32, "size").map(drop)), 4);
    }

    #[test]
    fn counts_are_range_checked() {
        assert_eq!(count_arg(1, "n", 8), Ok(1));
        assert_eq!(count_arg(8, "n", 8), Ok(8));
        for bad in [0, -1, 9, i32::MAX, i32::MIN] {
            let err = count_arg(bad, "n", 8).unwrap_err();
            assert_eq!(err.kind, ErrorKind::InvalidArgument);
            assert_eq!(err.message, format!("n = {bad} is out of range 1..=8"));
        }
    }
}
