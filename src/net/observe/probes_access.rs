//! Who may read and replace the probes files (docs/SECURITY.md, 'The plugin'). A probes file
//! tells which peers a job talks to and how fast; one that another user could replace would let
//! them forge the job's telemetry. So `MPIB_PROBES_DIR` is made private when the plugin creates
//! it, checked like the agent's paths when it exists, and each file is the job's user's only
//! (0600), or readable by one group (`MPIB_PROBES_GROUP`, 0640) for a collector that does not
//! run as root.

use std::fs::{DirBuilder, File, OpenOptions, Permissions};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use crate::trust::{check_shared_path, is_missing, Trusted};

/// Makes `dir` if it is missing (0700, or 0750 with `group` as its group), then checks it and the
/// directories above it.
///
/// # Errors
///
/// Why the directory cannot be made, or the path, owner and mode that are not trusted.
pub(crate) fn prepare_dir(dir: &Path, group: Option<u32>, trusted: &Trusted) -> Result<(), String> {
    if is_missing(dir) {
        create_private_dir(dir, group)?;
    }
    // Checked even when just made: another user may have made it first (then ours was a no-op).
    check_shared_path(dir, "MPIB_PROBES_DIR", trusted)
}

fn create_private_dir(dir: &Path, group: Option<u32>) -> Result<(), String> {
    let mode = if group.is_some() { 0o750 } else { 0o700 };
    let name = dir.display();
    DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(dir)
        .map_err(|e| format!("MPIB_PROBES_DIR {name}: cannot create: {e}"))?;
    let opened = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(dir)
        .map_err(|e| format!("MPIB_PROBES_DIR {name}: cannot open: {e}"))?;
    let meta = opened
        .metadata()
        .map_err(|e| format!("MPIB_PROBES_DIR {name}: cannot inspect: {e}"))?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    if meta.uid() != unsafe { libc::geteuid() } {
        // Made by someone else meanwhile: not ours to change; the check that follows names it.
        return Ok(());
    }
    // The umask may have removed bits of `mode`, and the group is ours until set.
    restrict(&opened, mode, group).map_err(|e| format!("MPIB_PROBES_DIR {name}: {e}"))
}

/// Gives the probes file at `path` (just created 0600) to `group`, readable by it (0640).
///
/// # Errors
///
/// The path, the gid and the failed call (not being a member of the group, for one).
pub(crate) fn share_file(path: &Path, group: u32) -> Result<(), String> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .and_then(|file| restrict(&file, 0o640, Some(group)).map(|()| file));
    match file {
        Ok(_) => Ok(()),
        Err(e) => Err(format!(
            "{}: cannot give it to MPIB_PROBES_GROUP (gid {group}) mode 0640: {e}",
            path.display()
        )),
    }
}

/// Sets the group first and the mode last: the object never becomes readable by a group it was
/// not meant for.
fn restrict(file: &File, mode: u32, group: Option<u32>) -> std::io::Result<()> {
    if let Some(gid) = group {
        std::os::unix::fs::fchown(file, None, Some(gid))
            .map_err(|e| std::io::Error::new(e.kind(), format!("fchown to gid {gid}: {e}")))?;
    }
    file.set_permissions(Permissions::from_mode(mode))
        .map_err(|e| std::io::Error::new(e.kind(), format!("fchmod {mode:04o}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn mode_of(path: &Path) -> u32 {
        fs::metadata(path).unwrap().mode() & 0o7777
    }

    #[test]
    fn a_missing_directory_is_made_private_whatever_the_umask() {
        let base = mpib_driver::temp_dir("mpib-probes-access").unwrap();
        let dir = base.join("probes");
        prepare_dir(&dir, None, &Trusted::new(&[])).unwrap();
        assert_eq!(mode_of(&dir), 0o700);
        let grouped = base.join("grouped");
        // SAFETY: getegid has no preconditions.
        let gid = unsafe { libc::getegid() };
        prepare_dir(&grouped, Some(gid), &Trusted::new(&[])).unwrap();
        assert_eq!(mode_of(&grouped), 0o750);
        let file = grouped.join("f.probes");
        fs::write(&file, b"").unwrap();
        share_file(&file, gid).unwrap();
        assert_eq!(mode_of(&file), 0o640);
        fs::remove_dir_all(&base).unwrap();
    }
}
