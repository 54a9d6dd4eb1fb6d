//! Users and groups named in settings (`MPIB_TRUSTED_UIDS`, `MPIB_PROBES_GROUP`): numbers, or
//! names looked up in /etc/passwd and /etc/group as the plugin reads them (no NSS: the plugin
//! runs inside the job and must not load NSS modules).

use std::fs;

/// The name of `uid` in /etc/passwd.
pub fn user_name(uid: u32) -> Option<String> {
    database_entries("/etc/passwd")
        .into_iter()
        .find(|(_, id)| *id == uid)
        .map(|(name, _)| name)
}

/// `MPIB_TRUSTED_UIDS`: comma-separated uids or user names of /etc/passwd.
///
/// # Errors
///
/// What was expected, naming the item that is neither.
pub fn parse_uids(text: &str) -> Result<Vec<u32>, String> {
    let users = database_entries("/etc/passwd");
    text.split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .map(|item| resolve(item, &users, "user", "/etc/passwd"))
        .collect()
}

/// `MPIB_PROBES_GROUP`: a gid or a group name of /etc/group.
///
/// # Errors
///
/// What was expected, naming the group that was not found.
pub fn parse_group(text: &str) -> Result<u32, String> {
    resolve(
        text.trim(),
        &database_entries("/etc/group"),
        "group",
        "/etc/group",
    )
}

fn resolve(item: &str, entries: &[(String, u32)], kind: &str, file: &str) -> Result<u32, String> {
    if let Ok(id) = item.parse::<u32>() {
        return Ok(id);
    }
    entries
        .iter()
        .find(|(name, _)| name == item)
        .map(|(_, id)| *id)
        .ok_or_else(|| format!("a number or a {kind} name of {file} (no {kind} `{item}` there)"))
}

/// `(name, id)` of each line of a passwd or group file (`name:x:id:...`); none if unreadable.
fn database_entries(path: &str) -> Vec<(String, u32)> {
    let text = fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split(':');
            let name = fields.next()?;
            let id = fields.nth(1)?.parse().ok()?;
            Some((name.to_owned(), id))
        })
        .collect()
}
