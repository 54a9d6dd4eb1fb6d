//! The only place that converts between NCCL's `void*` handles and Rust objects, in the style
//! of rustls-ffi's `Castable`.
//!
//! * Comms and memory registrations are `Box`es: [`box_to_ptr`] gives NCCL the pointer of
//!   `Box::into_raw`, [`try_ref`]/[`try_mut`] borrow it back, [`box_from_ptr`] reclaims it on
//!   close/deregister. [`comm_ref`] hands a send-or-receive comm pointer to
//!   [`CommRef::from_raw`], which relies on exactly this encoding.
//! * The v11+ per-communicator context is an `Arc<Context>`: [`arc_to_ptr`] gives NCCL one
//!   strong reference (`Arc::into_raw`), [`clone_arc`] takes another for a call,
//!   [`arc_from_ptr`] takes NCCL's reference back in `finalize`.
//! * Requests are owned by `net`; they cross as the `NonNull<Request>` it returned.
//!
//! A NULL handle is `ncclInvalidArgument` naming the parameter.

use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::Arc;

use super::boundary::null_argument;
use crate::error::Result;
use crate::net::{CommRef, Context, ListenComm, MemoryHandle, RecvComm, Request, SendComm};

/// A Rust type that crosses the C boundary as a `void*`, and how it is owned there.
pub trait Castable {
    /// [`OwnershipBox`] or [`OwnershipArc`].
    type Ownership;
}

/// NCCL holds the only pointer to a `Box<T>` and gives it back exactly once to release it.
pub struct OwnershipBox;
/// NCCL holds one strong reference of an `Arc<T>`.
pub struct OwnershipArc;

impl Castable for ListenComm {
    type Ownership = OwnershipBox;
}
impl Castable for SendComm {
    type Ownership = OwnershipBox;
}
impl Castable for RecvComm {
    type Ownership = OwnershipBox;
}
impl Castable for MemoryHandle {
    type Ownership = OwnershipBox;
}
impl Castable for Context {
    type Ownership = OwnershipArc;
}

/// Gives a boxed object to NCCL.
pub fn box_to_ptr<T: Castable<Ownership = OwnershipBox>>(value: Box<T>) -> *mut c_void {
    Box::into_raw(value).cast()
}

/// Gives an optional boxed object to NCCL (`None` = NULL, e.g. "connect again").
pub fn option_box_to_ptr<T: Castable<Ownership = OwnershipBox>>(
    value: Option<Box<T>>,
) -> *mut c_void {
    value.map_or(std::ptr::null_mut(), box_to_ptr)
}

/// Borrows a boxed object NCCL passed back.
///
/// # Safety
/// `ptr` must be NULL or come from [`box_to_ptr`] for this `T` and not yet be reclaimed; the
/// object must outlive `'a`, and nothing may mutate it meanwhile.
pub unsafe fn try_ref<'a, T: Castable<Ownership = OwnershipBox>>(
    ptr: *mut c_void,
    name: &str,
) -> Result<&'a T> {
    // SAFETY: NULL is handled by `as_ref`; otherwise the pointer is a live `Box<T>` (contract).
    unsafe { ptr.cast::<T>().as_ref() }.ok_or_else(|| null_argument(name))
}

/// Borrows an optional boxed object (NULL = `None`).
///
/// # Safety
/// As [`try_ref`].
pub unsafe fn optional_ref<'a, T: Castable<Ownership = OwnershipBox>>(
    ptr: *mut c_void,
) -> Option<&'a T> {
    // SAFETY: as `try_ref`.
    unsafe { ptr.cast::<T>().as_ref() }
}

/// Mutably borrows a boxed object NCCL passed back.
///
/// # Safety
/// As [`try_ref`], and no other reference to the object may exist during `'a`.
pub unsafe fn try_mut<'a, T: Castable<Ownership = OwnershipBox>>(
    ptr: *mut c_void,
    name: &str,
) -> Result<&'a mut T> {
    // SAFETY: NULL is handled by `as_mut`; otherwise a live, unaliased `Box<T>` (contract).
    unsafe { ptr.cast::<T>().as_mut() }.ok_or_else(|| null_argument(name))
}

/// Takes a boxed object back from NCCL (close, deregister).
///
/// # Safety
/// `ptr` must be NULL or come from [`box_to_ptr`] for this `T`, and NCCL must not use it again.
pub unsafe fn box_from_ptr<T: Castable<Ownership = OwnershipBox>>(
    ptr: *mut c_void,
    name: &str,
) -> Result<Box<T>> {
    let ptr = NonNull::new(ptr.cast::<T>()).ok_or_else(|| null_argument(name))?;
    // SAFETY: the pointer came from `Box::into_raw` and ownership returns exactly once
    // (contract).
    Ok(unsafe { Box::from_raw(ptr.as_ptr()) })
}

/// Gives NCCL one strong reference to a shared object.
pub fn arc_to_ptr<T: Castable<Ownership = OwnershipArc>>(value: Arc<T>) -> *mut c_void {
    Arc::into_raw(value).cast_mut().cast()
}

/// Takes an extra strong reference to an object NCCL holds, for the duration of a call.
///
/// # Safety
/// `ptr` must be NULL or come from [`arc_to_ptr`] for this `T`, with NCCL's reference still held.
pub unsafe fn clone_arc<T: Castable<Ownership = OwnershipArc>>(
    ptr: *mut c_void,
    name: &str,
) -> Result<Arc<T>> {
    let ptr: *const T = NonNull::new(ptr)
        .ok_or_else(|| null_argument(name))?
        .as_ptr()
        .cast();
    // SAFETY: `ptr` is from `Arc::into_raw` and NCCL's strong reference keeps it alive, so the
    // count may be incremented and the new reference adopted by `from_raw`.
    unsafe {
        Arc::increment_strong_count(ptr);
        Ok(Arc::from_raw(ptr))
    }
}

/// Takes NCCL's strong reference back (`finalize`).
///
/// # Safety
/// As [`clone_arc`], and NCCL must not use the pointer again.
pub unsafe fn arc_from_ptr<T: Castable<Ownership = OwnershipArc>>(
    ptr: *mut c_void,
    name: &str,
) -> Result<Arc<T>> {
    let ptr: *const T = NonNull::new(ptr)
        .ok_or_else(|| null_argument(name))?
        .as_ptr()
        .cast();
    // SAFETY: `ptr` is from `Arc::into_raw`; NCCL's reference is adopted exactly once.
    Ok(unsafe { Arc::from_raw(ptr) })
}

/// A request for NCCL (`None` = NULL, i.e. "try again later" or "nothing to wait for").
pub fn request_to_ptr(request: Option<NonNull<Request>>) -> *mut c_void {
    request.map_or(std::ptr::null_mut(), |r| r.as_ptr().cast())
}

/// A request NCCL passed back (never dereferenced here; `net::test` validates it).
pub fn request_from_ptr(ptr: *mut c_void, name: &str) -> Result<NonNull<Request>> {
    NonNull::new(ptr.cast::<Request>()).ok_or_else(|| null_argument(name))
}

/// A send-or-receive comm NCCL passed to `regMr`/`regMrDmaBuf`/`deregMr`.
///
/// # Safety
/// `ptr` must be NULL or come from [`box_to_ptr`] for a [`SendComm`] or a [`RecvComm`], not
/// yet closed, and outliving `'a`.
pub unsafe fn comm_ref<'a>(ptr: *mut c_void, name: &str) -> Result<CommRef<'a>> {
    let ptr = NonNull::new(ptr).ok_or_else(|| null_argument(name))?;
    // SAFETY: forwarded contract; `from_raw` decodes the `Box::into_raw` encoding used above.
    unsafe { CommRef::from_raw(ptr) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[derive(Debug, PartialEq)]
    struct Boxed(u32);
    impl Castable for Boxed {
        type Ownership = OwnershipBox;
    }
    struct Shared(u32);
    impl Castable for Shared {
        type Ownership = OwnershipArc;
    }

    #[test]
    fn boxes_round_trip() {
        let ptr = box_to_ptr(Box::new(Boxed(7)));
        // SAFETY: `ptr` is a live Box<Boxed>.
        unsafe {
            assert_eq!(try_ref::<Boxed>(ptr, "comm").map(|b| b.0), Ok(7));
            try_mut::<Boxed>(ptr, "comm").expect("non-NULL").0 = 8;
            assert_eq!(optional_ref::<Boxed>(ptr).map(|b| b.0), Some(8));
            assert_eq!(box_from_ptr::<Boxed>(ptr, "comm"), Ok(Box::new(Boxed(8))));
        }
        assert!(option_box_to_ptr::<Boxed>(None).is_null());
    }

    #[test]
    fn null_handles_are_invalid_arguments() {
        let null = std::ptr::null_mut();
        // SAFETY: NULL is allowed by every contract here.
        unsafe {
            let err = try_ref::<Boxed>(null, "sendComm").unwrap_err();
            assert_eq!(
                (err.kind, err.message.as_str()),
                (ErrorKind::InvalidArgument, "sendComm is NULL")
            );
            assert!(box_from_ptr::<Boxed>(null, "recvComm").is_err());
            assert!(optional_ref::<Boxed>(null).is_none());
            assert!(clone_arc::<Shared>(null, "ctx").is_err());
            assert_eq!(
                arc_from_ptr::<Shared>(null, "ctx").err().map(|e| e.message),
                Some("ctx is NULL".into())
            );
            assert_eq!(
                comm_ref(null, "comm").err().map(|e| e.kind),
                Some(ErrorKind::InvalidArgument)
            );
        }
        assert!(request_from_ptr(null, "request").is_err());
        assert!(request_to_ptr(None).is_null());
    }

    #[test]
    fn arcs_count_references() {
        let shared = Arc::new(Shared(3));
        let ptr = arc_to_ptr(Arc::clone(&shared));
        assert_eq!(Arc::strong_count(&shared), 2);
        // SAFETY: `ptr` holds one strong reference until `arc_from_ptr`.
        unsafe {
            let extra = clone_arc::<Shared>(ptr, "ctx").expect("non-NULL");
            assert_eq!((extra.0, Arc::strong_count(&shared)), (3, 3));
            drop(extra);
            let back = arc_from_ptr::<Shared>(ptr, "ctx").expect("non-NULL");
            assert!(Arc::ptr_eq(&back, &shared));
        }
        assert_eq!(Arc::strong_count(&shared), 1);
    }
}
