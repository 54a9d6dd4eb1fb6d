//! The plugin's threads (the tcp fabric's rail threads, the housekeeper), started with
//! `pthread_create` rather than `std::thread`.
//!
//! Why: `std::thread::spawn` runs the spawn hooks in the *calling* thread (Rust 1.85 on), which
//! initialises a thread-local with a destructor there. glibc counts a thread-local destructor
//! against the library that registered it and will not unmap that library on `dlclose` while
//! the count is non-zero, so a rail opened from NCCL's thread would pin the plugin until that
//! thread exits (found with a breakpoint on `__cxa_thread_atexit_impl`; tests/lifecycle.rs checks
//! the image is unmapped after every round). A thread started here registers nothing in its
//! caller; whatever the thread itself registers runs when it exits, before `join` returns.

use std::ffi::{c_void, CString};
use std::io;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// The body a thread runs.
type Body = Box<dyn FnOnce() + Send + 'static>;

/// A running native thread; [`join`](NativeThread::join) waits for it.
#[derive(Debug)]
pub(crate) struct NativeThread {
    handle: libc::pthread_t,
}

impl NativeThread {
    /// Starts `body` on a new thread named `name` (at most 15 bytes are kept, as Linux allows).
    pub(crate) fn spawn(name: &str, body: impl FnOnce() + Send + 'static) -> io::Result<Self> {
        let body: Box<Body> = Box::new(Box::new(body));
        let argument = Box::into_raw(body).cast::<c_void>();
        let mut handle: libc::pthread_t = 0;
        // SAFETY: `start` is a valid thread entry, `argument` a leaked `Box<Body>` that `start`
        // takes back exactly once; default attributes.
        let rc = unsafe { libc::pthread_create(&mut handle, std::ptr::null(), start, argument) };
        if rc != 0 {
            // SAFETY: the thread was not created, so `argument` is still ours.
            drop(unsafe { Box::from_raw(argument.cast::<Body>()) });
            return Err(io::Error::from_raw_os_error(rc));
        }
        let short: String = name.chars().filter(|c| *c != '\0').take(15).collect();
        if let Ok(name) = CString::new(short) {
            // SAFETY: `handle` is a live thread and `name` a NUL-terminated string of <= 16
            // bytes; a failure only leaves the thread unnamed.
            unsafe { libc::pthread_setname_np(handle, name.as_ptr()) };
        }
        Ok(NativeThread { handle })
    }

    /// Waits for the thread to end (its body returned or panicked).
    pub(crate) fn join(self) {
        // SAFETY: `handle` is a joinable thread this value owns, joined once (by value).
        unsafe { libc::pthread_join(self.handle, std::ptr::null_mut()) };
    }
}

extern "C" fn start(argument: *mut c_void) -> *mut c_void {
    // SAFETY: `spawn` passes a leaked `Box<Body>` and this is its only taker.
    let body = unsafe { Box::from_raw(argument.cast::<Body>()) };
    // A panic must not unwind across the C frame: the thread just ends (the rail's QPs then
    // see no progress and time out, as with a dead NIC).
    let _ = catch_unwind(AssertUnwindSafe(move || (*body)()));
    std::ptr::null_mut()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    #[test]
    fn a_thread_runs_its_body_and_is_joined_even_when_it_panics() {
        let ran = Arc::new(AtomicU32::new(0));
        let seen = Arc::clone(&ran);
        NativeThread::spawn("mpib-test-thread-name-too-long", move || {
            seen.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap()
        .join();
        assert_eq!(ran.load(Ordering::SeqCst), 1);
        NativeThread::spawn("mpib-panics", || panic!("inside a native thread"))
            .unwrap()
            .join();
    }
}
