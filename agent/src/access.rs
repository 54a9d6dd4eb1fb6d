//! Who may register (docs/SECURITY.md, "The agent"): the connecting process's uid and gid, as
//! the kernel gives them with `SO_PEERCRED`, against `--allowed-uids` and `--allowed-gids`.
//!
//! The default (neither set) lets every local user register: a node-wide agent run by root
//! serves every job on the node. With either set, a client is served when its uid is in the
//! uid list or its gid in the gid list. The gid is the one `SO_PEERCRED` reports, the process's
//! effective gid when it connected; supplementary groups are not consulted, since they can only
//! be read from `/proc` after the fact, where the pid may already name another process.
//!
//! Names are resolved with `getent` (NSS: local files, LDAP, ...), at start and at each reload
//! for the configuration file's lists.

use std::collections::BTreeSet;

/// The allowed users and groups; `None` for both = anyone.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Access {
    /// Allowed uids.
    pub uids: Option<BTreeSet<u32>>,
    /// Allowed gids.
    pub gids: Option<BTreeSet<u32>>,
}

impl Access {
    /// Whether a client running as `uid` and `gid` may register.
    pub fn allows(&self, uid: u32, gid: u32) -> bool {
        if self.uids.is_none() && self.gids.is_none() {
            return true;
        }
        let listed =
            |ids: &Option<BTreeSet<u32>>, id| ids.as_ref().is_some_and(|s| s.contains(&id));
        listed(&self.uids, uid) || listed(&self.gids, gid)
    }
}

pub use mpib_params::users::Kind;
use mpib_params::users::Lookup;

/// A comma-separated list of numeric ids or names (NSS), in the syntax every MPIB program reads
/// such a list with (`mpib_params::users`).
///
/// # Errors
///
/// An empty entry, or a name NSS does not know; the message names it.
pub fn parse_ids(value: &str, kind: Kind) -> Result<BTreeSet<u32>, String> {
    mpib_params::users::parse_ids(value, kind, Lookup::Getent)
}

pub use mpib_node::trust::user_label;

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn lists_and_the_rule() {
        assert_eq!(
            parse_ids("root, 7", Kind::Users).unwrap(),
            BTreeSet::from([0, 7])
        );
        assert_eq!(
            parse_ids("root", Kind::Groups).unwrap(),
            BTreeSet::from([0])
        );
        let e = parse_ids("0,nobody-mpib-x", Kind::Users).unwrap_err();
        assert!(e.contains("no user named \"nobody-mpib-x\""), "{e}");
        let e = parse_ids("5,", Kind::Groups).unwrap_err();
        assert!(e.contains("empty entry") && e.contains("group"), "{e}");
        assert_eq!(user_label(0), "uid 0 (root)");

        assert!(Access::default().allows(1000, 1000));
        let uids = Access {
            uids: Some(BTreeSet::from([0])),
            gids: None,
        };
        assert!(uids.allows(0, 5) && !uids.allows(1000, 0));
        let both = Access {
            uids: Some(BTreeSet::from([0])),
            gids: Some(BTreeSet::from([50])),
        };
        assert!(both.allows(1000, 50) && both.allows(0, 1) && !both.allows(1000, 1));
    }
}
