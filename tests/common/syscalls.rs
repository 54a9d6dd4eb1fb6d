//! Seeing every system call one thread makes: a seccomp filter on that thread sends each call to
//! a supervisor thread (`SECCOMP_RET_USER_NOTIF`), which lets it proceed unchanged
//! (`SECCOMP_USER_NOTIF_FLAG_CONTINUE`) and, while counting is on, records its number.
//!
//! The filter stays on the thread until it exits (a filter cannot be removed), so the calls it
//! makes after the window still make the round trip, uncounted. A contended lock shows as a
//! `futex` call; an uncontended one makes none (a test that wants locks seen contends them).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex};

/// The calls recorded while counting, by number.
pub struct SyscallWatch {
    counting: Arc<AtomicBool>,
    seen: Arc<Mutex<Vec<i32>>>,
}

impl SyscallWatch {
    /// Starts recording (an atomic store: no call of its own).
    pub fn start(&self) {
        self.counting.store(true, Ordering::SeqCst);
    }

    /// Stops recording and returns what was recorded.
    pub fn stop(&self) -> Vec<i32> {
        self.counting.store(false, Ordering::SeqCst);
        std::mem::take(&mut *self.seen.lock().unwrap())
    }
}

/// Names of the calls a data path might make, for messages.
pub fn name(number: i32) -> &'static str {
    match i64::from(number) {
        libc::SYS_read => "read",
        libc::SYS_write => "write",
        libc::SYS_futex => "futex (a contended lock)",
        libc::SYS_mmap => "mmap",
        libc::SYS_munmap => "munmap",
        libc::SYS_brk => "brk",
        libc::SYS_sched_yield => "sched_yield",
        libc::SYS_newfstatat => "newfstatat",
        libc::SYS_statx => "statx",
        libc::SYS_recvfrom => "recvfrom",
        libc::SYS_sendto => "sendto",
        libc::SYS_ioctl => "ioctl",
        libc::SYS_clock_gettime => "clock_gettime",
        libc::SYS_gettid => "gettid",
        _ => "other",
    }
}

/// Puts the calling thread under watch; its calls proceed as before.
pub fn watch_this_thread() -> io::Result<SyscallWatch> {
    let counting = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Vec::new()));
    // The supervisor starts first (a thread made after the filter would inherit it) and waits
    // for the listener in an atomic: once the filter is on, every call of this thread, a wake-up
    // included, needs the supervisor's answer, so handing it over may make none.
    let listener_fd = Arc::new(AtomicI32::new(-1));
    let (flag, record, fd) = (
        Arc::clone(&counting),
        Arc::clone(&seen),
        Arc::clone(&listener_fd),
    );
    std::thread::Builder::new()
        .name("syscall-watch".into())
        .spawn(move || {
            let raw = loop {
                match fd.load(Ordering::SeqCst) {
                    -1 => std::thread::sleep(std::time::Duration::from_millis(1)),
                    -2 => return, // the filter could not be installed
                    raw => break raw,
                }
            };
            // SAFETY: the watched thread handed over this listener and keeps no copy.
            let listener = unsafe { OwnedFd::from_raw_fd(raw) };
            supervise(&listener, &flag, &record);
        })?;
    match install_filter() {
        Ok(listener) => listener_fd.store(listener.into_raw_fd(), Ordering::SeqCst),
        Err(e) => {
            listener_fd.store(-2, Ordering::SeqCst);
            return Err(e);
        }
    }
    Ok(SyscallWatch { counting, seen })
}

/// Every call of this thread (x86-64) is reported; calls of another ABI are allowed.
fn install_filter() -> io::Result<OwnedFd> {
    const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
    let filter = [
        // A = seccomp_data.arch
        libc::sock_filter {
            code: (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16,
            jt: 0,
            jf: 0,
            k: 4,
        },
        libc::sock_filter {
            code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
            jt: 1,
            jf: 0,
            k: AUDIT_ARCH_X86_64,
        },
        libc::sock_filter {
            code: (libc::BPF_RET | libc::BPF_K) as u16,
            jt: 0,
            jf: 0,
            k: libc::SECCOMP_RET_ALLOW,
        },
        libc::sock_filter {
            code: (libc::BPF_RET | libc::BPF_K) as u16,
            jt: 0,
            jf: 0,
            k: libc::SECCOMP_RET_USER_NOTIF,
        },
    ];
    let program = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_ptr().cast_mut(),
    };
    // SAFETY: plain prctl and seccomp calls with valid arguments; `program` outlives the call
    // (the kernel copies it).
    unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            libc::SECCOMP_FILTER_FLAG_NEW_LISTENER,
            &program as *const libc::sock_fprog,
        );
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(OwnedFd::from_raw_fd(fd as i32))
    }
}

/// Answers every report with "proceed" until the watched thread is gone.
fn supervise(listener: &OwnedFd, counting: &AtomicBool, seen: &Mutex<Vec<i32>>) {
    loop {
        let mut poll = libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let ready = unsafe { libc::poll(&mut poll, 1, 1000) };
        if ready < 0 || poll.revents & (libc::POLLHUP | libc::POLLERR) != 0 {
            return; // the watched thread exited
        }
        if ready == 0 || poll.revents & libc::POLLIN == 0 {
            continue;
        }
        // SAFETY: a zeroed seccomp_notif is the documented input of NOTIF_RECV.
        let mut notice: libc::seccomp_notif = unsafe { std::mem::zeroed() };
        // SAFETY: `notice` is a writable seccomp_notif.
        if unsafe {
            libc::ioctl(
                listener.as_raw_fd(),
                libc::SECCOMP_IOCTL_NOTIF_RECV,
                &mut notice,
            )
        } != 0
        {
            continue; // the call was interrupted, or the thread died meanwhile
        }
        if counting.load(Ordering::SeqCst) {
            seen.lock().unwrap().push(notice.data.nr);
        }
        let mut response = libc::seccomp_notif_resp {
            id: notice.id,
            val: 0,
            error: 0,
            flags: libc::SECCOMP_USER_NOTIF_FLAG_CONTINUE as u32,
        };
        // SAFETY: `response` is a valid seccomp_notif_resp; a failure means the call is gone.
        unsafe {
            libc::ioctl(
                listener.as_raw_fd(),
                libc::SECCOMP_IOCTL_NOTIF_SEND,
                &mut response,
            )
        };
    }
}
