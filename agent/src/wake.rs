//! Waiting without spinning: `poll(2)` on a few descriptors, and a wake-up socket pair that
//! signal handlers, registrations and the stopping thread write a byte to.
//!
//! Why: an agent with no job used to spend about 6 % of a core polling its sockets every few
//! milliseconds and sampling probes files that did not exist (docs/AGENT.md, "Resting when
//! idle"). Each thread now sleeps in `poll` until one of its descriptors is ready or its next
//! deadline passes, and is woken through a [`Wake`] when something it waits for happens
//! elsewhere.

use std::io::{ErrorKind, Read, Write};
use std::os::unix::io::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// A wake-up channel: [`Wake::notify`] makes [`Wake::fd`] readable until [`Wake::drain`].
///
/// A socket pair rather than a pipe: std makes one without unsafe code, and signal-hook's
/// self-pipe handler writes to it with `send(MSG_DONTWAIT)`, which never blocks a handler.
#[derive(Debug)]
pub struct Wake {
    read: UnixStream,
    write: UnixStream,
}

impl Wake {
    /// A new channel, both ends non-blocking.
    pub fn new() -> std::io::Result<Wake> {
        let (read, write) = UnixStream::pair()?;
        read.set_nonblocking(true)?;
        write.set_nonblocking(true)?;
        Ok(Wake { read, write })
    }

    /// Wakes whoever polls [`Wake::fd`]. A full buffer already wakes them: the byte that did not
    /// fit is not needed.
    pub fn notify(&self) {
        let _ = (&self.write).write(&[1]);
    }

    /// Consumes the pending wake-ups, so that the next poll sleeps again.
    pub fn drain(&self) {
        let mut buffer = [0u8; 64];
        loop {
            match (&self.read).read(&mut buffer) {
                Ok(0) => return,
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
    }

    /// The end to poll for readability.
    pub fn fd(&self) -> RawFd {
        self.read.as_raw_fd()
    }

    /// A second handle on the writing end, for a signal handler to own
    /// (`signal_hook::low_level::pipe::register`).
    pub fn writer(&self) -> std::io::Result<UnixStream> {
        self.write.try_clone()
    }
}

/// A `pollfd` waiting for `events` on `fd`.
pub fn poll_entry(fd: RawFd, events: i16) -> libc::pollfd {
    libc::pollfd {
        fd,
        events,
        revents: 0,
    }
}

/// Waits until a descriptor of `entries` is ready or `deadline` passes (`None`: no deadline);
/// returns how many are ready (0 at the deadline). An interrupted wait returns 0, for the caller
/// to look at its flags and wait again.
pub fn poll(entries: &mut [libc::pollfd], deadline: Option<Instant>) -> std::io::Result<usize> {
    // ppoll(2) rather than poll(2): a timeout in nanoseconds, since the policy loop waits
    // 500 µs between samples and poll's milliseconds would halve its rate.
    let timeout = deadline.map(|deadline| {
        let left = deadline.saturating_duration_since(Instant::now());
        libc::timespec {
            tv_sec: libc::time_t::try_from(left.as_secs()).unwrap_or(libc::time_t::MAX),
            tv_nsec: left.subsec_nanos() as libc::c_long,
        }
    });
    let timeout_ptr = timeout
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `entries` is a valid, exclusively borrowed array of `entries.len()` pollfd
    // structures, and `timeout_ptr` null or a timespec that outlives the call, as ppoll(2)
    // requires; a null signal mask keeps the thread's.
    let ready = unsafe {
        libc::ppoll(
            entries.as_mut_ptr(),
            entries.len() as libc::nfds_t,
            timeout_ptr,
            std::ptr::null(),
        )
    };
    if ready < 0 {
        let error = std::io::Error::last_os_error();
        if error.kind() == ErrorKind::Interrupted {
            return Ok(0);
        }
        return Err(error);
    }
    Ok(ready as usize)
}

/// Sleeps until `deadline` or until `wake` is notified, whichever comes first; true when
/// notified (the wake-ups are left pending for the caller to drain).
pub fn sleep_until(wake: &Wake, deadline: Instant) -> bool {
    let mut entries = [poll_entry(wake.fd(), libc::POLLIN)];
    match poll(&mut entries, Some(deadline)) {
        Ok(ready) => ready > 0,
        Err(_) => {
            // ppoll(2) on one valid descriptor does not fail; should it, do not spin.
            let left = deadline.saturating_duration_since(Instant::now());
            std::thread::sleep(left.min(Duration::from_millis(100)));
            false
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A notification ends the wait before its deadline, and once drained the next wait sleeps
    /// until its deadline.
    #[test]
    fn a_notification_wakes_and_draining_rearms() {
        let wake = Wake::new().unwrap();
        wake.notify();
        wake.notify();
        let mut entries = [poll_entry(wake.fd(), libc::POLLIN)];
        let far = Instant::now() + Duration::from_secs(30);
        assert_eq!(poll(&mut entries, Some(far)).unwrap(), 1, "notified");
        wake.drain();
        let mut entries = [poll_entry(wake.fd(), libc::POLLIN)];
        let near = Instant::now() + Duration::from_millis(20);
        assert_eq!(poll(&mut entries, Some(near)).unwrap(), 0, "drained: waits");
        assert!(Instant::now() >= near, "woke before the deadline");
    }
}
