//! Which probes files the collector trusts (docs/SECURITY.md, "The collector").
//!
//! Anyone who can write the probes directory can drop a file there, and the collector would
//! export it as a real job's series. So, like OpenSSH's StrictModes, a file is exported only
//! when:
//!
//! - it is a regular file, opened with `O_NOFOLLOW` (a symlink swapped in after the listing is
//!   refused, not followed);
//! - neither its group nor others may write it (else anyone in them could rewrite a job's
//!   numbers);
//! - its owner is in `--allowed-uids`, when that is set;
//! - its owner is root or the user the process it claims runs as (its header's `writer_pid`,
//!   which must also be the pid in its name): a file another user made that claims someone
//!   else's job is a forgery. A writer whose pid is not running cannot be checked, so its file
//!   is not exported (it is still reaped as before).
//!
//! User and group names are resolved with `getent` (so LDAP and other NSS users work) rather
//! than libc's `getpwnam_r`: this crate has no `unsafe` code.

use std::collections::BTreeSet;
use std::fs::{self, Metadata, OpenOptions};
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use mpib_params::users::{parse_ids, Kind, Lookup};

use crate::files::{self, Identity};

/// Who owns a file and its mode, as the trust checks saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stat {
    /// Owner.
    pub uid: u32,
    /// Permission bits (and the setuid, setgid and sticky bits).
    pub mode: u32,
    /// Device.
    pub dev: u64,
    /// Inode.
    pub ino: u64,
}

impl Stat {
    fn of(meta: &Metadata) -> Stat {
        Stat {
            uid: meta.uid(),
            mode: meta.mode() & 0o7777,
            dev: meta.dev(),
            ino: meta.ino(),
        }
    }
}

/// The outcome of the checks on the file itself.
#[derive(Debug)]
pub enum FileCheck {
    /// Nothing wrong with the file itself; its writer is checked once its header is read. The
    /// file as opened and checked: the reader maps this descriptor, never the path again.
    Passed(Stat, fs::File),
    /// Not exported, for this reason.
    Untrusted(Stat, String),
}

/// The checks that need only the file: type, mode and owner (against `allowed`, when set).
///
/// # Errors
///
/// The file cannot be opened or `stat`ed (for example it is gone).
pub fn check_file(path: &Path, allowed: Option<&BTreeSet<u32>>) -> io::Result<FileCheck> {
    // O_NONBLOCK: a FIFO swapped in after the listing must not block the scan in open(2).
    let opened = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path);
    let file = match opened {
        Ok(file) => file,
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            let stat = Stat::of(&fs::symlink_metadata(path)?);
            let reason = "it is a symbolic link (probes files are opened with O_NOFOLLOW)";
            return Ok(FileCheck::Untrusted(stat, reason.to_owned()));
        }
        Err(e) => return Err(e),
    };
    let meta = file.metadata()?;
    let stat = Stat::of(&meta);
    let reason = if !meta.file_type().is_file() {
        "it is not a regular file".to_owned()
    } else if stat.mode & 0o022 != 0 {
        "its group or others may write it (a probes file must be writable by its owner only)"
            .to_owned()
    } else if allowed.is_some_and(|uids| !uids.contains(&stat.uid)) {
        format!(
            "its owner {} is not in --allowed-uids (MPIB_COLLECTOR_ALLOWED_UIDS)",
            user_label(stat.uid)
        )
    } else {
        return Ok(FileCheck::Passed(stat, file));
    };
    Ok(FileCheck::Untrusted(stat, reason))
}

/// The outcome of the check of a file against the process it claims.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WriterCheck {
    /// The file's owner is root or the process's user.
    Trusted,
    /// The pid is not running: nothing to check the owner against.
    Dead,
    /// The process runs as another user than the file's owner (a forgery, or, for a collector
    /// in its own PID namespace, an unrelated process with the same number).
    OtherUser(String),
    /// Not exported, for this reason.
    Untrusted(String),
}

/// Checks the file at `path`, owned as `stat` says, against the process `pid` its header
/// claims.
pub fn check_writer(path: &Path, stat: &Stat, pid: u32) -> WriterCheck {
    if let Some((named, _)) = files::parse_name(path).filter(|(named, _)| *named != pid) {
        return WriterCheck::Untrusted(format!(
            "its name claims pid {named} but its header claims pid {pid}"
        ));
    }
    let uid = match process_uid(pid) {
        Ok(uid) => uid,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return WriterCheck::Dead,
        Err(e) => {
            return WriterCheck::Untrusted(format!(
                "the owner of its writer pid {pid} cannot be read from /proc/{pid}: {e}"
            ))
        }
    };
    if stat.uid == 0 || stat.uid == uid {
        return WriterCheck::Trusted;
    }
    WriterCheck::OtherUser(format!(
        "it claims pid {pid}, which runs as {}: only that user or root may write its probes \
         file (a forgery claiming another user's job?)",
        user_label(uid)
    ))
}

/// Whether `path` is still the file `stat` describes, and was when `identity` was taken: the
/// reader maps the checked descriptor, but the collector follows the file by its path from then
/// on, so a file renamed over it meanwhile is left for the next scan to look at afresh.
pub fn still_same(path: &Path, identity: &Identity, stat: &Stat) -> bool {
    let same = |id: &Identity| id.dev == stat.dev && id.ino == stat.ino;
    same(identity) && Identity::of(path).is_ok_and(|now| same(&now))
}

/// The user process `pid` runs as: the owner of `/proc/<pid>` (its effective uid). `NotFound`
/// when there is no such process (pid 0 never counts as one).
pub fn process_uid(pid: u32) -> io::Result<u32> {
    if pid == 0 {
        return Err(io::ErrorKind::NotFound.into());
    }
    fs::metadata(Path::new("/proc").join(pid.to_string())).map(|meta| meta.uid())
}

/// `uid 1001 (alice)`, or `uid 1001 (no user name)`.
pub fn user_label(uid: u32) -> String {
    match user_name(uid) {
        Some(name) => format!("uid {uid} ({name})"),
        None => format!("uid {uid} (no user name)"),
    }
}

/// The name of `uid` (NSS, `getent passwd`).
pub fn user_name(uid: u32) -> Option<String> {
    Lookup::Getent.name(Kind::Users, uid)
}

/// A comma-separated list of uids or user names (NSS), as a set of uids: the syntax every MPIB
/// program reads such a list with (`mpib_params::users`).
///
/// # Errors
///
/// An empty list or entry, or a name no user has; the message names it.
pub fn parse_uids(value: &str) -> Result<BTreeSet<u32>, String> {
    parse_ids(value, Kind::Users, Lookup::Getent)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn uid_lists_take_numbers_and_names() {
        assert_eq!(parse_uids("0, 1001").unwrap(), BTreeSet::from([0, 1001]));
        assert_eq!(parse_uids("root").unwrap(), BTreeSet::from([0]));
        let e = parse_uids("root,no-such-user-mpib").unwrap_err();
        assert!(e.contains("no user named \"no-such-user-mpib\""), "{e}");
        let e = parse_uids("0,").unwrap_err();
        assert!(e.contains("empty entry"), "{e}");
        assert_eq!(user_label(0), "uid 0 (root)");
    }

    #[test]
    fn file_checks() {
        let dir = std::env::temp_dir().join(format!("mpib-trust-unit-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("a.probes");
        fs::write(&path, b"x").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        let FileCheck::Passed(stat, _) = check_file(&path, None).unwrap() else {
            panic!("refused")
        };
        assert_eq!(stat.mode, 0o644);
        let others = BTreeSet::from([stat.uid.wrapping_add(1)]);
        let check = check_file(&path, Some(&others)).unwrap();
        assert!(matches!(check, FileCheck::Untrusted(_, ref r) if r.contains("--allowed-uids")));
        fs::set_permissions(&path, fs::Permissions::from_mode(0o664)).unwrap();
        let check = check_file(&path, None).unwrap();
        assert!(matches!(check, FileCheck::Untrusted(_, ref r) if r.contains("group or others")));
        let link = dir.join("b.probes");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        let check = check_file(&link, None).unwrap();
        assert!(matches!(check, FileCheck::Untrusted(_, ref r) if r.contains("symbolic link")));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn writer_checks() {
        let me = std::process::id();
        let own = Stat {
            uid: process_uid(me).unwrap(),
            mode: 0o644,
            dev: 0,
            ino: 0,
        };
        let named = Path::new(&format!("/x/mpib-{me}-1.probes")).to_path_buf();
        assert_eq!(check_writer(&named, &own, me), WriterCheck::Trusted);
        assert_eq!(
            check_writer(Path::new("/x/other.probes"), &own, 999_999_999),
            WriterCheck::Dead
        );
        let forged = Stat { uid: 4242, ..own };
        if own.uid != 4242 {
            let check = check_writer(&named, &forged, me);
            assert!(matches!(check, WriterCheck::OtherUser(ref r) if r.contains("forgery")));
        }
        let check = check_writer(&named, &own, me + 1);
        assert!(matches!(check, WriterCheck::Untrusted(ref r) if r.contains("its name claims")));
    }
}
