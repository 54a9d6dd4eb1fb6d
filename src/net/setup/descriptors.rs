//! File descriptors: a process keeps one control connection per peer process, direction and
//! path, shared by all its connections there and carrying their handshakes after the first
//! (`crate::net::observe::link`), and one listening socket per fused device while a listen comm
//! is open (`crate::net::setup::listener`); the host's own sockets and files come on top.
//! Many systems start processes with a soft `RLIMIT_NOFILE` of 1,024 under a hard limit far above it; as Go's
//! runtime does, the plugin raises the soft limit to the hard one when it opens, and says so.
//! Running out anyway is reported as that, naming the limit and how to raise it, rather than as
//! a bare "Too many open files".

use std::io;

use crate::error::Error;
use crate::log;

/// The soft and hard `RLIMIT_NOFILE`, or `None` if the kernel would not say.
fn limits() -> Option<(u64, u64)> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid out-parameter.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    (rc == 0).then_some((limit.rlim_cur, limit.rlim_max))
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (once, at the plugin's first open); an
/// INFO line when it did, a WARN when the kernel refused (nothing else changes).
pub(crate) fn raise_soft_limit() {
    let Some((soft, hard)) = limits() else {
        return;
    };
    if soft >= hard {
        return;
    }
    let raised = libc::rlimit {
        rlim_cur: hard,
        rlim_max: hard,
    };
    // SAFETY: a valid rlimit; raising the soft limit up to the hard one needs no privilege.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
        info!(
            log::INIT,
            "raised this process's soft RLIMIT_NOFILE from {soft} to its hard limit {hard}: MPIB keeps a control connection per peer process and a listening socket per device"
        );
    } else {
        warn!(
            log::INIT,
            "could not raise the soft RLIMIT_NOFILE from {soft} to {hard}: {}",
            io::Error::last_os_error()
        );
    }
}

/// The error for a failed socket call `what`: out of descriptors is said as such, with the
/// limit and how to raise it.
pub(crate) fn socket_error(what: &str, error: &io::Error) -> Error {
    match error.raw_os_error() {
        Some(libc::EMFILE) => {
            let (soft, hard) = limits().unwrap_or((0, 0));
            Error::system(format!(
                "{what}: {error}: this process is out of file descriptors (RLIMIT_NOFILE soft \
                 {soft}, hard {hard}); MPIB holds a control connection per peer process and a \
                 listening socket per device: raise the limit (`ulimit -n`, LimitNOFILE= in a \
                 systemd unit, or the container's nofile ulimit)"
            ))
        }
        Some(libc::ENFILE) => Error::system(format!(
            "{what}: {error}: the system is out of file descriptors (fs.file-max)"
        )),
        _ => Error::system(format!("{what}: {error}")),
    }
}

#[cfg(test)]
mod tests {
    use super::socket_error;

    #[test]
    fn running_out_of_descriptors_names_the_limit() {
        let text = socket_error(
            "accept on 10.0.0.1:4000",
            &std::io::Error::from_raw_os_error(libc::EMFILE),
        )
        .to_string();
        assert!(text.contains("accept on 10.0.0.1:4000"), "{text}");
        assert!(
            text.contains("RLIMIT_NOFILE soft") && text.contains("ulimit -n"),
            "{text}"
        );
        let system = socket_error("socket", &std::io::Error::from_raw_os_error(libc::ENFILE));
        assert!(system.to_string().contains("fs.file-max"));
        let other = socket_error("socket", &std::io::Error::from_raw_os_error(libc::EACCES));
        assert!(!other.to_string().contains("RLIMIT_NOFILE"));
    }
}
