//! Which probes files are shown: the collector's checks, file by file, without its side effects
//! (`mpib-top` never deletes a file and never writes one).
//!
//! A file is mapped once it passes `mpib_node::trust::check_file` (type, mode, owner) and
//! `check_writer` (its pid runs as its owner); it is shown while its writer runs and has not
//! closed it. A refused file is listed with its reason, as the collector counts it in
//! `mpib_probes_skipped_total{reason}`; one whose writer is gone is simply not there.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};

use mpib_node::files::{self, Identity, Loaded};
use mpib_node::trust::{self, FileCheck, WriterCheck};
use mpib_probes::ProbesReader;

use crate::frame::Skipped;

/// A file being shown.
pub struct Mapped {
    /// The file as it was checked.
    pub identity: Identity,
    /// Its reader.
    pub reader: ProbesReader,
    /// The uid its writer runs as.
    pub uid: u32,
}

/// The outcome of one look at the directory.
#[derive(Default)]
pub struct Listing {
    /// Paths of the files to show this time (keys of [`Scanner::mapped`]).
    pub shown: Vec<PathBuf>,
    /// Files not shown, with why.
    pub skipped: Vec<Skipped>,
    /// Why the directory could not be read.
    pub error: Option<String>,
}

/// The files of one directory, mapped across samples.
pub struct Scanner {
    dir: PathBuf,
    allowed: Option<BTreeSet<u32>>,
    /// Mapped files by path.
    pub mapped: BTreeMap<PathBuf, Mapped>,
    /// Files refused, and files of writers not running: looked at again only once the file
    /// changes (as the collector does), or once the pid a file names runs again.
    passed_over: BTreeMap<PathBuf, (Identity, Option<Skipped>)>,
}

impl Scanner {
    /// A scanner of `dir`, showing files of `allowed` owners only when set.
    pub fn new(dir: PathBuf, allowed: Option<BTreeSet<u32>>) -> Scanner {
        Scanner {
            dir,
            allowed,
            mapped: BTreeMap::new(),
            passed_over: BTreeMap::new(),
        }
    }

    /// Looks at the directory: maps new files, drops those that went, closed or changed.
    pub fn scan(&mut self) -> Listing {
        let mut listing = Listing::default();
        let paths = match files::list(&self.dir) {
            Ok(paths) => paths,
            Err(e) => {
                listing.error = Some(match e.kind() {
                    io::ErrorKind::NotFound => {
                        "it does not exist (no job has written probes yet?)".into()
                    }
                    _ => e.to_string(),
                });
                self.mapped.clear();
                self.passed_over.clear();
                return listing;
            }
        };
        self.mapped.retain(|path, _| paths.contains(path));
        self.passed_over.retain(|path, _| paths.contains(path));
        for path in paths {
            let now = Identity::of(&path).ok();
            let kept = self
                .mapped
                .get(&path)
                .is_some_and(|m| now.is_some_and(|now| now.unchanged(&m.identity)));
            if !kept && !self.map(&path, now, &mut listing) {
                continue;
            }
            let Some(mapped) = self.mapped.get(&path) else {
                continue;
            };
            let listed = self.listed(mapped.identity.uid);
            let gone = !listed && !files::pid_alive(mapped.reader.info().pid);
            if mapped.reader.closed_ns() != 0 || gone {
                // Its process is gone or closed it: not a process of this node any more.
                self.mapped.remove(&path);
                continue;
            }
            listing.shown.push(path);
        }
        self.supersede(&mut listing.shown);
        listing
    }

    /// Maps the file at `path` afresh; `false` when it is not shown (listed in `listing` when
    /// refused).
    fn map(&mut self, path: &Path, now: Option<Identity>, listing: &mut Listing) -> bool {
        self.mapped.remove(path);
        if let Some(skipped) = self.still_passed_over(path, now) {
            listing.skipped.extend(skipped);
            return false;
        }
        let outcome = self.open(path);
        let passed_over = match &outcome {
            Ok(Some(_)) => None,
            Ok(None) => Some(None),
            Err(skipped) => Some(Some(skipped.clone())),
        };
        match (passed_over, now) {
            (Some(skipped), Some(identity)) => {
                self.passed_over
                    .insert(path.to_path_buf(), (identity, skipped));
            }
            _ => {
                self.passed_over.remove(path);
            }
        }
        match outcome {
            Ok(Some(mapped)) => {
                self.mapped.insert(path.to_path_buf(), mapped);
                true
            }
            Ok(None) => false,
            Err(skipped) => {
                listing.skipped.push(skipped);
                false
            }
        }
    }

    /// `Some` (what to list, if anything) while a file passed over is unchanged and, for one
    /// not shown because its writer did not run, the pid its name gives still does not run.
    fn still_passed_over(&self, path: &Path, now: Option<Identity>) -> Option<Option<Skipped>> {
        let (identity, skipped) = self.passed_over.get(path)?;
        let unchanged = now.is_some_and(|now| now.unchanged(identity));
        let revived = skipped.is_none()
            && files::parse_name(path).is_some_and(|(pid, _)| files::pid_alive(pid));
        (unchanged && !revived).then(|| skipped.clone())
    }

    fn listed(&self, uid: u32) -> bool {
        self.allowed
            .as_ref()
            .is_some_and(|uids| uids.contains(&uid))
    }

    /// Drops a file found shrunk while it was read.
    pub fn drop_faulted(&mut self, path: &Path) -> Skipped {
        self.mapped.remove(path);
        skipped(path, "truncated", "it shrank while being read".into())
    }

    /// A restarted writer (same host and pid) shows its newest file only.
    fn supersede(&self, shown: &mut Vec<PathBuf>) {
        let mut newest: BTreeMap<(String, u32), (u64, PathBuf)> = BTreeMap::new();
        for path in shown.iter() {
            let Some(m) = self.mapped.get(path) else {
                continue;
            };
            let info = m.reader.info();
            let key = (info.host.clone(), info.pid);
            if newest
                .get(&key)
                .map_or(true, |(start, _)| *start < info.start_ns)
            {
                newest.insert(key, (info.start_ns, path.clone()));
            }
        }
        let keep: BTreeSet<PathBuf> = newest.into_values().map(|(_, p)| p).collect();
        shown.retain(|p| keep.contains(p));
    }

    /// `Ok(None)`: nothing to show (gone, not readable by this user, not yet published, or its
    /// writer is not running).
    fn open(&self, path: &Path) -> Result<Option<Mapped>, Skipped> {
        let Ok(identity) = Identity::of(path) else {
            return Ok(None);
        };
        let (stat, file) = match trust::check_file(path, self.allowed.as_ref()) {
            Ok(FileCheck::Passed(stat, file)) => (stat, file),
            Ok(FileCheck::Untrusted(_, why)) => return Err(skipped(path, "untrusted", why)),
            // Another user's file this user may not read is not a process it can see.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::PermissionDenied
                ) =>
            {
                return Ok(None)
            }
            Err(e) => return Err(skipped(path, "untrusted", format!("cannot open it: {e}"))),
        };
        let reader = match files::load(&file, path, "this mpib-top") {
            Ok(Loaded::Ready(reader)) => reader,
            Ok(Loaded::NotYet) => return Ok(None),
            Ok(Loaded::Refused(reason, detail)) => return Err(skipped(path, reason, detail)),
            Err(e) => return Err(skipped(path, "corrupt", format!("cannot map it: {e}"))),
        };
        let pid = reader.info().pid;
        let uid = match trust::check_writer(path, &stat, pid) {
            WriterCheck::Trusted => trust::process_uid(pid).unwrap_or(stat.uid),
            // As the collector: an owner the operator listed is trusted without its process
            // (a view in another PID namespace sees no writer, or another process of that pid).
            WriterCheck::OtherUser(_) | WriterCheck::Dead if self.listed(stat.uid) => stat.uid,
            WriterCheck::Dead => return Ok(None),
            WriterCheck::OtherUser(why) | WriterCheck::Untrusted(why) => {
                return Err(skipped(path, "untrusted", why))
            }
        };
        if !trust::still_same(path, &identity, &stat) {
            return Ok(None);
        }
        Ok(Some(Mapped {
            identity,
            reader,
            uid,
        }))
    }
}

fn skipped(path: &Path, reason: &'static str, detail: String) -> Skipped {
    Skipped {
        path: path.display().to_string(),
        reason,
        detail,
    }
}
