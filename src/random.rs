//! Numbers a stranger must not guess: listen ids, connection secrets (docs/SECURITY.md).
//!
//! Why `getrandom(2)` straight, with no fallback: the kernel's generator is what every other
//! secret on the host comes from, and a guessable value here would let whoever reaches a port
//! into a listen comm or a QP. A kernel without it fails the call that needed one, saying so.

use crate::error::{Error, Result};

/// A uniformly drawn 64-bit number, never 0 (0 means "none" in the handshakes); `what` names
/// it in the error.
pub(crate) fn unguessable(what: &str) -> Result<u64> {
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
            return Err(Error::system(format!("{what}: getrandom: {error}")));
        }
    }
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
