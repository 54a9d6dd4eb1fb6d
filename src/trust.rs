//! Who may own the paths the plugin shares with other processes of the node (docs/SECURITY.md,
//! 'The plugin'): the agent's socket and hint file (advanced mode) and the probes directory.
//!
//! The rule is OpenSSH's StrictModes. Whoever can write a shared file, or replace it through its
//! directory, can steer the job (hints, registrations) or forge its telemetry; so the file and
//! every directory above it must be owned by a trusted user (root, this process's effective uid,
//! or one listed in `MPIB_TRUSTED_UIDS` for an agent run as a dedicated user) and writable by
//! nobody else. A world-writable directory passes only when it is sticky and owned by root
//! (`/tmp`, `/dev/shm`): there nobody can remove or rename another user's entry.
//!
//! Only cheap metadata syscalls (lstat, realpath) and reads of `/etc/passwd` and `/etc/group` are
//! made: never NSS (which may ask a directory server), so no call blocks.

use std::fs::{self, Metadata};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

pub(crate) use mpib_params::users::user_name;

/// Write permission for the group or others.
const WRITABLE_BY_OTHERS: u32 = 0o022;
/// The sticky bit: in such a directory only an entry's owner may remove or rename it.
const STICKY: u32 = 0o1000;

/// The uids whose files and directories the plugin uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Trusted {
    euid: u32,
    extra: Vec<u32>,
}

impl Trusted {
    /// Root, this process's effective uid and `extra` (`MPIB_TRUSTED_UIDS`).
    pub(crate) fn new(extra: &[u32]) -> Trusted {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let euid = unsafe { libc::geteuid() };
        Trusted {
            euid,
            extra: extra.to_vec(),
        }
    }

    /// Whether `uid` may own a shared path.
    pub(crate) fn contains(&self, uid: u32) -> bool {
        uid == 0 || uid == self.euid || self.extra.contains(&uid)
    }

    /// The trusted owners in words, for messages.
    pub(crate) fn describe(&self) -> String {
        let mut text = String::from("root");
        if self.euid != 0 {
            text += &match user_name(self.euid) {
                Some(name) => format!(", uid {} ({name}, this process)", self.euid),
                None => format!(", uid {} (this process)", self.euid),
            };
        }
        if self.extra.is_empty() {
            text += " or a uid of MPIB_TRUSTED_UIDS (unset)";
        } else {
            let list: Vec<String> = self.extra.iter().map(u32::to_string).collect();
            text += &format!(" or MPIB_TRUSTED_UIDS ({})", list.join(","));
        }
        text
    }
}

/// Checks that `path` and every directory above it may be trusted (see the module doc); `what`
/// names the path in the error (`MPIB_HINT_PATH`, ...).
///
/// The object itself must not be a symbolic link; a regular file must not be writable by group
/// or others; a socket's mode is not checked (connecting needs write permission, so an agent
/// serving other users' jobs makes it 0666; who may replace it is decided by its directory).
/// Directories above it are checked along the path as given (a symbolic link on the way must
/// belong to a trusted user) and along its real path.
///
/// # Errors
///
/// The path that failed, its owner (uid and name) and mode in octal, and what was expected; or
/// why it could not be inspected (a missing path included).
pub(crate) fn check_shared_path(path: &Path, what: &str, trusted: &Trusted) -> Result<(), String> {
    let object = std::path::absolute(path)
        .map_err(|e| format!("{what} {}: cannot resolve: {e}", path.display()))?;
    let lstat = |p: &Path| {
        fs::symlink_metadata(p).map_err(|e| {
            format!(
                "{what} {}: cannot inspect {}: {e}",
                object.display(),
                p.display()
            )
        })
    };
    let meta = lstat(&object)?;
    check_object(&object, &meta, what, trusted)?;
    let Some(parent) = object.parent() else {
        return Ok(());
    };
    for dir in parent.ancestors() {
        let meta = lstat(dir)?;
        if meta.file_type().is_symlink() {
            // A link's own mode means nothing; who may replace it is decided by the directory
            // holding it, checked next.
            if !trusted.contains(meta.uid()) {
                let expected = format!("a link owned by {}", trusted.describe());
                return Err(refusal(what, &object, dir, &meta, &expected));
            }
        } else {
            check_directory(what, &object, dir, &meta, trusted)?;
        }
    }
    let real = fs::canonicalize(parent).map_err(|e| {
        format!(
            "{what} {}: cannot resolve {}: {e}",
            object.display(),
            parent.display()
        )
    })?;
    if real != parent {
        for dir in real.ancestors() {
            check_directory(what, &object, dir, &lstat(dir)?, trusted)?;
        }
    }
    Ok(())
}

fn check_object(
    object: &Path,
    meta: &Metadata,
    what: &str,
    trusted: &Trusted,
) -> Result<(), String> {
    let kind = meta.file_type();
    if kind.is_symlink() {
        let target = fs::read_link(object).map_or_else(|_| "?".into(), |t| t.display().to_string());
        let expected = format!("not a symbolic link (it points to {target})");
        return Err(refusal(what, object, object, meta, &expected));
    }
    if kind.is_dir() {
        return check_directory(what, object, object, meta, trusted);
    }
    let owner_ok = trusted.contains(meta.uid());
    let mode_ok = kind.is_socket() || meta.mode() & WRITABLE_BY_OTHERS == 0;
    if owner_ok && mode_ok {
        return Ok(());
    }
    let expected = if kind.is_socket() {
        format!("owner {}", trusted.describe())
    } else {
        format!(
            "owner {}, not writable by group or others",
            trusted.describe()
        )
    };
    Err(refusal(what, object, object, meta, &expected))
}

fn check_directory(
    what: &str,
    object: &Path,
    dir: &Path,
    meta: &Metadata,
    trusted: &Trusted,
) -> Result<(), String> {
    let mode = meta.mode();
    let shared_sticky = mode & STICKY != 0 && meta.uid() == 0;
    if trusted.contains(meta.uid()) && (mode & WRITABLE_BY_OTHERS == 0 || shared_sticky) {
        return Ok(());
    }
    let expected = format!(
        "owner {}, not writable by group or others unless sticky and owned by root (as /tmp)",
        trusted.describe()
    );
    Err(refusal(what, object, dir, meta, &expected))
}

/// `MPIB_X /a/b/c: directory /a/b is owned by uid 999 (name), mode 0755; expected ...`.
fn refusal(what: &str, object: &Path, failed: &Path, meta: &Metadata, expected: &str) -> String {
    let place = if failed == object {
        format!("{what} {}", object.display())
    } else {
        format!(
            "{what} {}: directory {}",
            object.display(),
            failed.display()
        )
    };
    format!(
        "{place} is owned by uid {}{}, mode {:04o}; expected {expected}",
        meta.uid(),
        name_suffix(meta.uid()),
        meta.mode() & 0o7777
    )
}

/// " (name)" of `uid` from /etc/passwd, or "" when it has none there.
fn name_suffix(uid: u32) -> String {
    user_name(uid).map_or_else(String::new, |name| format!(" ({name})"))
}

/// Whether `path` does not exist (nothing to trust yet: the caller reports it as before).
pub(crate) fn is_missing(path: &Path) -> bool {
    matches!(fs::symlink_metadata(path), Err(e) if e.kind() == std::io::ErrorKind::NotFound)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mpib_params::users::{parse_group, parse_uids};
    use std::os::unix::fs::{symlink, PermissionsExt};

    use mpib_driver::other_user::{other_user_or_skip, OtherUser};

    /// A fresh directory of ours, mode 0700, under the system temp dir.
    fn private_dir(name: &str) -> std::path::PathBuf {
        let dir = mpib_driver::temp_dir(&format!("mpib-trust-{name}")).unwrap();
        chmod(&dir, 0o700);
        dir
    }

    fn chmod(path: &Path, mode: u32) {
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
    }

    fn chown(path: &Path, user: &OtherUser) {
        std::os::unix::fs::chown(path, Some(user.uid), Some(user.gid)).unwrap();
    }

    fn file(dir: &Path, name: &str, mode: u32) -> std::path::PathBuf {
        let path = dir.join(name);
        fs::write(&path, b"x").unwrap();
        chmod(&path, mode);
        path
    }

    fn ours() -> Trusted {
        Trusted::new(&[])
    }

    #[test]
    fn our_private_file_in_our_private_dir_passes() {
        let dir = private_dir("ok");
        let path = file(&dir, "hints", 0o644);
        check_shared_path(&path, "MPIB_HINT_PATH", &ours()).unwrap();
        check_shared_path(&dir, "MPIB_PROBES_DIR", &ours()).unwrap();
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_file_writable_by_group_or_others_is_refused_with_its_mode() {
        let dir = private_dir("mode");
        for mode in [0o664, 0o646, 0o666] {
            let path = file(&dir, "hints", mode);
            let e = check_shared_path(&path, "MPIB_HINT_PATH", &ours()).unwrap_err();
            let expected = format!("MPIB_HINT_PATH {} is owned by uid", path.display());
            assert!(e.starts_with(&expected), "{e}");
            assert!(e.contains(&format!("mode {mode:04o}")), "{e}");
            assert!(e.contains("not writable by group or others"), "{e}");
        }
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_directory_writable_by_others_passes_only_sticky_and_owned_by_root() {
        let dir = private_dir("sticky");
        let inner = dir.join("mpib");
        fs::create_dir(&inner).unwrap();
        let path = file(&inner, "hints", 0o600);
        chmod(&inner, 0o777);
        let e = check_shared_path(&path, "MPIB_HINT_PATH", &ours()).unwrap_err();
        assert!(
            e.contains(&format!("directory {} is owned", inner.display())),
            "{e}"
        );
        assert!(e.contains("mode 0777"), "{e}");
        chmod(&inner, 0o1777);
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        assert_eq!(check_shared_path(&path, "x", &ours()).is_ok(), root);
        chmod(&inner, 0o1733);
        assert_eq!(check_shared_path(&inner, "x", &ours()).is_ok(), root);
        if let Some(user) = other_user_or_skip() {
            chown(&inner, &user);
            let e = check_shared_path(&inner, "MPIB_PROBES_DIR", &ours()).unwrap_err();
            let name = format!("uid {} (mpib-other), mode 1733", user.uid);
            assert!(e.contains(&name), "{e}");
        }
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_directory_owned_by_another_user_is_refused_naming_the_owner() {
        let Some(user) = other_user_or_skip() else {
            return;
        };
        // A base like /tmp: sticky, owned by root (this test runs as root), open to everyone.
        let dir = private_dir("squat");
        chmod(&dir, 0o1777);
        let squatted = dir.join("mpib");
        user.run("mkdir", &["-m", "0755", squatted.to_str().unwrap()])
            .unwrap();
        let socket = squatted.join("agent.sock");
        fs::write(&socket, b"").unwrap();
        chmod(&socket, 0o600);
        let e = check_shared_path(&socket, "MPIB_AGENT_SOCKET", &ours()).unwrap_err();
        let expected = format!(
            "MPIB_AGENT_SOCKET {}: directory {} is owned by uid {} (mpib-other), mode 0755; \
             expected owner root",
            socket.display(),
            squatted.display(),
            user.uid
        );
        assert!(e.starts_with(&expected), "{e}");
        // Trusted explicitly (an agent running as a dedicated user): accepted.
        check_shared_path(&socket, "x", &Trusted::new(&[user.uid])).unwrap();
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_file_owned_by_another_user_is_refused() {
        let Some(user) = other_user_or_skip() else {
            return;
        };
        let dir = private_dir("owner");
        let path = file(&dir, "hints", 0o644);
        chown(&path, &user);
        let e = check_shared_path(&path, "MPIB_HINT_PATH", &ours()).unwrap_err();
        assert!(
            e.contains(&format!("uid {} (mpib-other), mode 0644", user.uid)),
            "{e}"
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn symbolic_links_are_refused_as_the_object_and_checked_on_the_way() {
        let dir = private_dir("link");
        let real = dir.join("real");
        fs::create_dir(&real).unwrap();
        let target = file(&real, "hints", 0o600);
        let link = dir.join("hints");
        symlink(&target, &link).unwrap();
        let e = check_shared_path(&link, "MPIB_HINT_PATH", &ours()).unwrap_err();
        assert!(e.contains("not a symbolic link"), "{e}");
        // A link of ours to a directory of ours: the real path is checked too.
        let via = dir.join("via");
        symlink(&real, &via).unwrap();
        check_shared_path(&via.join("hints"), "x", &ours()).unwrap();
        chmod(&real, 0o777);
        let e = check_shared_path(&via.join("hints"), "x", &ours()).unwrap_err();
        assert!(
            e.contains(&format!("directory {} is owned", real.display())),
            "{e}"
        );
        chmod(&real, 0o700);
        if let Some(user) = other_user_or_skip() {
            let theirs = dir.join("theirs");
            // A link on the way that another user owns could be pointed elsewhere by them.
            symlink(&real, &theirs).unwrap();
            std::os::unix::fs::lchown(&theirs, Some(user.uid), None).unwrap();
            let e = check_shared_path(&theirs.join("hints"), "x", &ours()).unwrap_err();
            assert!(e.contains("expected a link owned by root"), "{e}");
        }
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_socket_is_checked_for_its_owner_not_its_mode() {
        let dir = private_dir("socket");
        let path = dir.join("agent.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        chmod(&path, 0o666);
        check_shared_path(&path, "MPIB_AGENT_SOCKET", &ours()).unwrap();
        if let Some(user) = other_user_or_skip() {
            chown(&path, &user);
            let e = check_shared_path(&path, "MPIB_AGENT_SOCKET", &ours()).unwrap_err();
            assert!(e.contains("(mpib-other), mode 0666"), "{e}");
        }
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_missing_path_is_an_error_and_reported_as_missing() {
        let dir = private_dir("missing");
        let path = dir.join("nothing");
        assert!(is_missing(&path) && !is_missing(&dir));
        let e = check_shared_path(&path, "MPIB_HINT_PATH", &ours()).unwrap_err();
        assert!(e.contains("cannot inspect"), "{e}");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn uids_and_groups_parse_as_numbers_or_names() {
        assert_eq!(parse_uids("0, 12, 7").unwrap(), vec![0, 7, 12]);
        // The syntax every MPIB program reads an id list with: an empty entry is an error.
        let e = parse_uids("0, 12,,7").unwrap_err();
        assert!(e.contains("empty entry"), "{e}");
        assert_eq!(parse_uids("root").unwrap(), vec![0]);
        let e = parse_uids("0,no-such-user-mpib").unwrap_err();
        assert!(
            e.contains("no user named \"no-such-user-mpib\" (/etc/passwd"),
            "{e}"
        );
        assert_eq!(parse_group("root").unwrap(), 0);
        assert_eq!(parse_group("4321").unwrap(), 4321);
        let e = parse_group("no-such-group-mpib").unwrap_err();
        assert!(
            e.contains("no group named \"no-such-group-mpib\" (/etc/group"),
            "{e}"
        );
        if let Some(user) = other_user_or_skip() {
            assert_eq!(parse_uids("mpib-other").unwrap(), vec![user.uid]);
            assert_eq!(user_name(user.uid).as_deref(), Some("mpib-other"));
        }
    }

    #[test]
    fn the_trusted_owners_are_root_this_process_and_the_list() {
        let trusted = Trusted::new(&[4242]);
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        assert!(trusted.contains(0) && trusted.contains(euid) && trusted.contains(4242));
        assert!(!trusted.contains(4243));
        assert!(trusted.describe().ends_with("MPIB_TRUSTED_UIDS (4242)"));
    }
}
