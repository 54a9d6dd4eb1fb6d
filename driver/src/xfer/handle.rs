//! Shipping the listen handle through a file: written atomically, waited for under a deadline.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::abi::HANDLE_SIZE;
use crate::error::{Error, Result};

/// Writes a handle to `path` through a temporary file and a rename, so a reader never sees a
/// partial handle.
pub fn write_handle(path: &Path, handle: &[u8; HANDLE_SIZE]) -> Result<()> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "handle".into());
    let temporary = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    std::fs::write(&temporary, handle)
        .and_then(|()| std::fs::rename(&temporary, path))
        .map_err(|e| Error::Io(format!("write handle {}: {e}", path.display())))
}

/// Waits (bounded) until `path` holds a whole handle and returns it.
pub fn wait_for_handle(path: &Path, limit: Duration) -> Result<[u8; HANDLE_SIZE]> {
    wait_for_handle_while(path, limit, || Ok(()))
}

/// [`wait_for_handle`], giving up as soon as `alive` fails (e.g. the receiver process exited).
pub fn wait_for_handle_while(
    path: &Path,
    limit: Duration,
    mut alive: impl FnMut() -> Result<()>,
) -> Result<[u8; HANDLE_SIZE]> {
    let start = Instant::now();
    loop {
        match std::fs::read(path) {
            Ok(bytes) if bytes.len() == HANDLE_SIZE => {
                let mut handle = [0u8; HANDLE_SIZE];
                handle.copy_from_slice(&bytes);
                return Ok(handle);
            }
            Ok(bytes) => {
                return Err(Error::Io(format!(
                    "{}: {} bytes, expected a {HANDLE_SIZE}-byte handle",
                    path.display(),
                    bytes.len()
                )))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::Io(format!("read {}: {e}", path.display()))),
        }
        alive()?;
        if start.elapsed() > limit {
            return Err(Error::Timeout(format!(
                "no handle at {} after {limit:?} (did the receiver start and listen?)",
                path.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
