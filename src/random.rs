//! Numbers a stranger must not guess (listen ids, connection secrets, the tcp fabric's QP
//! numbers and keys: docs/SECURITY.md) and numbers processes must not share (the process number
//! of the control links), all drawn here.
//!
//! Why `getrandom(2)` straight, with no fallback for secrets: the kernel's generator is what
//! every other secret on the host comes from, and a guessable value would let whoever reaches a
//! port into a listen comm or a QP. A kernel without it fails the call that needed one, saying so;
//! only numbers that must merely differ fall back to [`clock_and_pid`].

use crate::error::{Error, Result};

/// A uniformly drawn 64-bit number, never 0 (0 means "none" in the handshakes).
pub(crate) fn draw() -> std::io::Result<u64> {
    let mut bytes = [0u8; 8];
    loop {
        // SAFETY: `bytes` is writable for its length.
        let got = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
        if got == 8 {
            let drawn = u64::from_le_bytes(bytes);
            if drawn != 0 {
                return Ok(drawn);
            }
            continue;
        }
        let error = std::io::Error::last_os_error();
        if error.kind() != std::io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
}

/// [`draw`], its failure an error naming `what`.
pub(crate) fn unguessable(what: &str) -> Result<u64> {
    draw().map_err(|error| Error::system(format!("{what}: getrandom: {error}")))
}

/// When there is no entropy: the clock and the pid, which still differ between processes of a
/// host (guessable at a stretch; never 0).
pub(crate) fn clock_and_pid() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    ((u64::from(std::process::id()) << 32) ^ nanos) | 1
}

#[cfg(test)]
mod tests {
    #[test]
    fn draws_differ_and_are_never_zero() {
        let draws: std::collections::HashSet<u64> = (0..64)
            .map(|_| super::unguessable("a test").unwrap())
            .collect();
        assert_eq!(draws.len(), 64);
        assert!(!draws.contains(&0));
    }
}
