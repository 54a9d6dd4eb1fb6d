//! A second local user for the trust tests (docs/SECURITY.md): another user of the same node who
//! squats a shared path, registers with the agent or drops a file, as a real one could.
//!
//! The user is created once per machine with `useradd --system` (no home, no login shell) and
//! kept: creating and removing it per test would race between tests that run in parallel.
//! Commands run as it through `setpriv` (util-linux), with its uid, its gid and no other groups.
//! Creating a user needs root: [`other_user`] says so as an error, and the caller decides (the
//! test command runs as root, so there the tests run).

use std::process::Command;

/// The name of the second user.
pub const OTHER_USER: &str = "mpib-other";

/// A local user that is not the one running the tests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OtherUser {
    /// Its name ([`OTHER_USER`]).
    pub name: String,
    /// Its uid.
    pub uid: u32,
    /// Its primary gid.
    pub gid: u32,
}

impl OtherUser {
    /// `program` run as this user (uid, gid, no supplementary groups).
    pub fn command(&self, program: &str) -> Command {
        let mut command = Command::new("setpriv");
        command
            .arg(format!("--reuid={}", self.uid))
            .arg(format!("--regid={}", self.gid))
            .arg("--clear-groups")
            .arg("--")
            .arg(program);
        command
    }

    /// Run `program args` as this user; its stdout, or an error with its status and stderr.
    pub fn run(&self, program: &str, args: &[&str]) -> Result<String, String> {
        let output = self
            .command(program)
            .args(args)
            .output()
            .map_err(|e| format!("setpriv {program}: {e}"))?;
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            Err(format!(
                "{program} {args:?} as {}: {}: {}",
                self.name,
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ))
        }
    }
}

/// The second user, created if it does not exist yet.
///
/// # Errors
///
/// This process is not root (creating a user needs it), or `useradd` / `id` failed; the text
/// says which.
pub fn other_user() -> Result<OtherUser, String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    if euid != 0 {
        return Err(format!(
            "a second local user is created only as root (this runs as uid {euid})"
        ));
    }
    if lookup().is_err() {
        let created = Command::new("useradd")
            .args([
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
            ])
            .arg(OTHER_USER)
            .output()
            .map_err(|e| format!("useradd: {e} (Debian package passwd)"))?;
        // Status 9: created meanwhile by a test running in parallel.
        if !created.status.success() && created.status.code() != Some(9) {
            return Err(format!(
                "useradd {OTHER_USER}: {}: {}",
                created.status,
                String::from_utf8_lossy(&created.stderr).trim()
            ));
        }
    }
    lookup()
}

/// The second user for a test, or `None` after printing `SKIPPED: <why>` when it cannot be had
/// (not root): the one place the trust tests decide to skip.
pub fn other_user_or_skip() -> Option<OtherUser> {
    match other_user() {
        Ok(user) => Some(user),
        Err(why) => {
            eprintln!("SKIPPED: {why}");
            None
        }
    }
}

fn lookup() -> Result<OtherUser, String> {
    let id = |flag: &str| -> Result<u32, String> {
        let output = Command::new("id")
            .arg(flag)
            .arg(OTHER_USER)
            .output()
            .map_err(|e| format!("id: {e}"))?;
        let text = String::from_utf8_lossy(&output.stdout);
        text.trim()
            .parse()
            .map_err(|_| format!("id {flag} {OTHER_USER}: no such user"))
    };
    Ok(OtherUser {
        name: OTHER_USER.to_owned(),
        uid: id("-u")?,
        gid: id("-g")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_run_as_the_other_user() {
        let Some(user) = other_user_or_skip() else {
            return;
        };
        assert_ne!(user.uid, 0);
        let uid = user.run("id", &["-u"]).expect("id as the other user");
        assert_eq!(uid.trim(), user.uid.to_string());
        let groups = user.run("id", &["-G"]).expect("id -G");
        assert_eq!(groups.trim(), user.gid.to_string(), "no other groups");
    }
}
