//! Removing the files of writers that are gone (the reaping rows of the table in the parent
//! module's documentation).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tracing::{info, warn};

use super::Collector;
use crate::files::{self, Identity};

impl Collector {
    pub(super) fn reap(&mut self, path: &Path, pid: u32, why: &str) {
        match fs::remove_file(path) {
            Ok(()) => {
                self.reaped += 1;
                // Every reaped file was listed by this scan: report what is left.
                self.files_found = self.files_found.saturating_sub(1);
                info!(
                    "reaped probes file {} of writer pid {pid}: {why}",
                    path.display()
                );
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                if self.quiet.insert(path.to_path_buf()) {
                    warn!("cannot remove stale probes file {}: {e}", path.display());
                }
            }
        }
    }

    /// Reap a file the reader cannot use when the pid in its name is gone and it has not
    /// changed for `stale_after`.
    pub(super) fn reap_unreadable(&mut self, path: &Path, identity: &Identity, why: &str) {
        let Some((pid, _)) = files::parse_name(path) else {
            return;
        };
        if !files::pid_alive(pid) && identity.age() > self.config.stale_after {
            self.reap(path, pid, why);
        }
    }

    pub(super) fn reap_finished(&mut self, now_ns: u64) {
        let stale = self.config.stale_after;
        let mut dead = Vec::new();
        for (path, f) in &self.finished {
            let age = Duration::from_nanos(now_ns.saturating_sub(f.reader.heartbeat_ns()));
            let pid = f.reader.info().pid;
            let is_dead = if f.superseded {
                age > stale
            } else {
                !files::pid_alive(pid) && (f.reader.closed_ns() != 0 || age > stale)
            };
            let same = Identity::of(path).is_ok_and(|id| id.same_file(&f.identity));
            if is_dead && same {
                dead.push((path.clone(), pid));
            }
        }
        for (path, pid) in dead {
            self.finished.remove(&path);
            self.reap(&path, pid, "writer is gone");
        }
    }

    pub(super) fn reap_refused(&mut self) {
        let entries: Vec<(PathBuf, Identity)> = self
            .refused
            .iter()
            .map(|(p, id)| (p.clone(), *id))
            .collect();
        for (path, identity) in entries {
            match Identity::of(&path) {
                Ok(now) if now.unchanged(&identity) => {
                    self.reap_unreadable(&path, &now, "refused file of a dead writer");
                }
                _ => {
                    // Changed or gone: look at it afresh next scan.
                    self.refused.remove(&path);
                }
            }
        }
    }
}
