//! Users and groups named in settings: one syntax for every MPIB program (a comma-separated list
//! of numeric ids or names; an empty entry is an error naming the list), with the lookup of
//! names as a parameter. The plugin looks names up in /etc/passwd and /etc/group itself
//! ([`Lookup::Files`]: it runs inside the job and must not load NSS modules); the node-side
//! tools ask NSS through `getent` ([`Lookup::Getent`]: local files, LDAP, ...).

use std::collections::BTreeSet;
use std::fs;
use std::process::Command;

/// Which names a list holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Users (passwd).
    Users,
    /// Groups (group).
    Groups,
}

impl Kind {
    fn database(self) -> &'static str {
        match self {
            Kind::Users => "passwd",
            Kind::Groups => "group",
        }
    }

    fn noun(self) -> &'static str {
        match self {
            Kind::Users => "user",
            Kind::Groups => "group",
        }
    }
}

/// Where names are looked up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// /etc/passwd and /etc/group, read directly (the plugin).
    Files,
    /// `getent passwd|group NAME` (NSS; the node-side tools).
    Getent,
}

impl Lookup {
    /// The id of `name`, if the database knows it.
    fn id(self, kind: Kind, name: &str) -> Option<u32> {
        match self {
            Lookup::Files => database_entries(kind)
                .into_iter()
                .find(|(entry, _)| entry == name)
                .map(|(_, id)| id),
            Lookup::Getent => getent(kind, name)?.get(2)?.parse().ok(),
        }
    }

    /// The name of `id`, if the database knows it.
    pub fn name(self, kind: Kind, id: u32) -> Option<String> {
        match self {
            Lookup::Files => database_entries(kind)
                .into_iter()
                .find(|(_, entry)| *entry == id)
                .map(|(name, _)| name),
            Lookup::Getent => getent(kind, &id.to_string())?.into_iter().next(),
        }
    }

    fn source(self, kind: Kind) -> String {
        match self {
            Lookup::Files => format!("/etc/{}", kind.database()),
            Lookup::Getent => format!("getent {}", kind.database()),
        }
    }
}

/// A comma-separated list of numeric ids or names, as a set of ids.
///
/// # Errors
///
/// An empty list or entry, or a name `lookup` does not know; the message names it.
pub fn parse_ids(value: &str, kind: Kind, lookup: Lookup) -> Result<BTreeSet<u32>, String> {
    let noun = kind.noun();
    let mut ids = BTreeSet::new();
    for entry in value.split(',').map(str::trim) {
        if entry.is_empty() {
            return Err(format!(
                "{value:?} has an empty entry (expected {noun} ids or names, comma-separated)"
            ));
        }
        ids.insert(parse_id(entry, kind, lookup)?);
    }
    Ok(ids)
}

/// One numeric id or name.
///
/// # Errors
///
/// A name `lookup` does not know; the message names it and where it was looked for.
pub fn parse_id(entry: &str, kind: Kind, lookup: Lookup) -> Result<u32, String> {
    let entry = entry.trim();
    if let Ok(id) = entry.parse::<u32>() {
        return Ok(id);
    }
    let noun = kind.noun();
    lookup.id(kind, entry).ok_or_else(|| {
        format!(
            "no {noun} named {entry:?} ({} {entry})",
            lookup.source(kind)
        )
    })
}

/// The plugin's `MPIB_TRUSTED_UIDS`: uids or user names of /etc/passwd.
///
/// # Errors
///
/// As [`parse_ids`].
pub fn parse_uids(text: &str) -> Result<Vec<u32>, String> {
    parse_ids(text, Kind::Users, Lookup::Files).map(|ids| ids.into_iter().collect())
}

/// The plugin's `MPIB_PROBES_GROUP`: a gid or a group name of /etc/group.
///
/// # Errors
///
/// As [`parse_id`].
pub fn parse_group(text: &str) -> Result<u32, String> {
    parse_id(text, Kind::Groups, Lookup::Files)
}

/// The name of `uid` in /etc/passwd (the plugin's messages).
pub fn user_name(uid: u32) -> Option<String> {
    Lookup::Files.name(Kind::Users, uid)
}

/// `(name, id)` of each line of /etc/passwd or /etc/group (`name:x:id:...`); none if unreadable.
fn database_entries(kind: Kind) -> Vec<(String, u32)> {
    let text = fs::read_to_string(format!("/etc/{}", kind.database())).unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split(':');
            let name = fields.next()?;
            let id = fields.nth(1)?.parse().ok()?;
            Some((name.to_owned(), id))
        })
        .collect()
}

/// The fields of `getent DATABASE KEY`'s first line; `None` when unknown or `getent` cannot run.
fn getent(kind: Kind, key: &str) -> Option<Vec<String>> {
    let output = Command::new("getent")
        .arg(kind.database())
        .arg(key)
        .output()
        .ok()?;
    if !output.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let fields: Vec<String> = text.lines().next()?.split(':').map(str::to_owned).collect();
    (fields.len() >= 3).then_some(fields)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_syntax_whichever_lookup() {
        for lookup in [Lookup::Files, Lookup::Getent] {
            let ids = parse_ids("0, root,12", Kind::Users, lookup);
            assert_eq!(ids, Ok(BTreeSet::from([0, 12])), "{lookup:?}");
            let empty = parse_ids("0,,12", Kind::Users, lookup).unwrap_err();
            assert!(empty.contains("empty entry"), "{lookup:?}: {empty}");
            let unknown = parse_ids("no-such-user-mpib", Kind::Users, lookup).unwrap_err();
            assert!(
                unknown.contains("no user named \"no-such-user-mpib\""),
                "{unknown}"
            );
            assert_eq!(parse_id("root", Kind::Groups, lookup), Ok(0), "{lookup:?}");
            assert_eq!(
                lookup.name(Kind::Users, 0).as_deref(),
                Some("root"),
                "{lookup:?}"
            );
        }
        assert!(parse_ids("", Kind::Groups, Lookup::Files).is_err());
    }
}
