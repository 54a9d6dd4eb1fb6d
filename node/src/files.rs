//! Probes files on disk: listing, names, identity and writer liveness.

use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use mpib_probes::{version_string, Corruption, LoadState, ProbesReader};

/// Suffix of probes files.
pub const SUFFIX: &str = ".probes";

/// What tells one file apart from a replacement at the same path, and a file that changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Identity {
    /// Device.
    pub dev: u64,
    /// Inode.
    pub ino: u64,
    /// Length in bytes.
    pub len: u64,
    /// Modification time, ns since the Unix epoch (as far as the file system keeps it).
    pub mtime_ns: i128,
    /// Owner.
    pub uid: u32,
    /// Permission bits.
    pub mode: u32,
}

impl Identity {
    /// The identity of `path` now.
    ///
    /// # Errors
    ///
    /// `stat` failed (for example the file is gone).
    pub fn of(path: &Path) -> io::Result<Identity> {
        let meta = fs::metadata(path)?;
        Ok(Identity {
            dev: meta.dev(),
            ino: meta.ino(),
            len: meta.len(),
            mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
            uid: meta.uid(),
            mode: meta.mode() & 0o7777,
        })
    }

    /// Same file (device and inode), whatever its length and time.
    pub fn same_file(&self, other: &Identity) -> bool {
        self.dev == other.dev && self.ino == other.ino
    }

    /// The same file, as long, with the same owner and mode: a refused file is looked at afresh
    /// when any of these changes (a `chmod go-w` or a `chown` may make it trusted).
    pub fn unchanged(&self, other: &Identity) -> bool {
        self.same_file(other)
            && self.len == other.len
            && self.uid == other.uid
            && self.mode == other.mode
    }

    /// Time since the last modification (zero if it is in the future).
    pub fn age(&self) -> Duration {
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i128);
        let ns = (now - self.mtime_ns).max(0);
        Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
    }
}

/// The `*.probes` regular files in `dir`, sorted; `NotFound` if `dir` does not exist.
///
/// # Errors
///
/// Reading the directory failed.
pub fn list(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir)? {
        let Ok(entry) = entry else { continue };
        let is_file = entry.file_type().is_ok_and(|t| t.is_file());
        let name = entry.file_name();
        if is_file && name.to_string_lossy().ends_with(SUFFIX) {
            out.push(entry.path());
        }
    }
    out.sort();
    Ok(out)
}

/// `(pid, start_ns)` from a name `mpib-<pid>-<start_ns>.probes`.
pub fn parse_name(path: &Path) -> Option<(u32, u64)> {
    let name = path.file_name()?.to_str()?;
    let stem = name.strip_prefix("mpib-")?.strip_suffix(SUFFIX)?;
    let (pid, start) = stem.split_once('-')?;
    Some((pid.parse().ok()?, start.parse().ok()?))
}

/// Whether process `pid` exists: `/proc/<pid>` is there. This answers what `kill(pid, 0)`
/// answers (ESRCH = gone, EPERM = alive) without a signal call, and pid 0 never counts as
/// alive. An error other than "not found" counts as alive, so nothing is reaped by mistake.
pub fn pid_alive(pid: u32) -> bool {
    if pid == 0 {
        return false;
    }
    match fs::metadata(Path::new("/proc").join(pid.to_string())) {
        Ok(_) => true,
        Err(e) => e.kind() != io::ErrorKind::NotFound,
    }
}

/// A probes file as a tool found it, once the trust checks let it be mapped.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // Returned once per file opened, and moved out at once.
pub enum Loaded {
    /// Published and of this major version: read it.
    Ready(ProbesReader),
    /// Its writer has not published it yet: look again later.
    NotYet,
    /// Not to be read: the reason it is counted under (`version`, `corrupt` or `truncated`,
    /// as the collector's `mpib_probes_skipped_total{reason}`) and what is wrong.
    Refused(&'static str, String),
}

/// Maps the checked `file` (at `path`) and says whether it can be read; `reader` is the program
/// for the version message ("this collector").
///
/// # Errors
///
/// The mapping failed.
pub fn load(file: &fs::File, path: &Path, reader: &str) -> io::Result<Loaded> {
    Ok(match ProbesReader::open_file(file, path)? {
        LoadState::Ready(probes) => Loaded::Ready(probes),
        LoadState::AwaitVersion => Loaded::NotYet,
        LoadState::Incompatible { found, expected } => Loaded::Refused(
            "version",
            format!(
                "it has ABI version {}, {reader} reads {} (the major must match)",
                version_string(found),
                version_string(expected)
            ),
        ),
        LoadState::Corrupt(corruption) => {
            let reason = match corruption {
                Corruption::Truncated { .. } => "truncated",
                _ => "corrupt",
            };
            Loaded::Refused(reason, corruption.to_string())
        }
    })
}

/// How long a writer whose pid is not running here stays live on its heartbeat alone, unless a
/// tool is told otherwise (the collector's `--stale-after`): a job in another PID namespace has
/// a pid this node's `/proc` does not show, and its plugin beats the heartbeat every second.
pub const STALE_AFTER: Duration = Duration::from_secs(30);

/// Where a probes file's writer is in its life, as the collector and the agent judge it
/// (`mpib-top` shows a process only while its pid runs, or its owner is listed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriterState {
    /// Still writing: its pid runs here, or its heartbeat is recent.
    Running,
    /// It set `closed_ns` (a clean shutdown).
    Closed,
    /// Its pid is not running here and its heartbeat is older than the tool's stale-after.
    Gone,
}

/// The state of the writer of `reader`'s file at `now_ns`, its heartbeat judged against
/// `stale_after`.
pub fn writer_state(reader: &ProbesReader, now_ns: u64, stale_after: Duration) -> WriterState {
    if reader.closed_ns() != 0 {
        return WriterState::Closed;
    }
    let age = Duration::from_nanos(now_ns.saturating_sub(reader.heartbeat_ns()));
    if age > stale_after && !pid_alive(reader.info().pid) {
        WriterState::Gone
    } else {
        WriterState::Running
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn names_and_liveness() {
        let p = Path::new("/x/mpib-42-1700000000000000000.probes");
        assert_eq!(parse_name(p), Some((42, 1_700_000_000_000_000_000)));
        assert_eq!(parse_name(Path::new("/x/mpib-42.probes")), None);
        assert_eq!(parse_name(Path::new("/x/other-1-2.probes")), None);
        assert!(pid_alive(std::process::id()));
        assert!(!pid_alive(0));
        assert!(!pid_alive(999_999_999));
    }

    #[test]
    fn a_writer_runs_until_it_closes_or_its_pid_is_gone_and_its_heartbeat_stale() {
        use mpib_probes::{LoadState, ProbesFile, RailInfo, WriterInfo};

        let dir = std::env::temp_dir().join(format!("mpib-writer-state-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let state = |writer: &WriterInfo, heartbeat_ns: u64, close: bool| {
            let file = ProbesFile::create(&dir, writer).unwrap();
            file.heartbeat(heartbeat_ns);
            let path = file.path().unwrap().to_path_buf();
            let LoadState::Ready(reader) = ProbesReader::open(&path).unwrap() else {
                panic!("not ready");
            };
            if close {
                file.remove().unwrap();
            }
            writer_state(&reader, 100 * SECOND, STALE_AFTER)
        };
        const SECOND: u64 = 1_000_000_000;
        let rail = RailInfo {
            device: "mlx5_0".into(),
            port: 1,
            speed_mbps: 100_000,
        };
        let mine = WriterInfo::for_this_process(vec![rail]);
        let dead = WriterInfo {
            pid: 999_999_999,
            ..mine.clone()
        };
        assert_eq!(state(&mine, 0, false), WriterState::Running);
        assert_eq!(state(&mine, 99 * SECOND, true), WriterState::Closed);
        // A pid not visible here: live on a fresh heartbeat (another PID namespace) only.
        assert_eq!(state(&dead, 71 * SECOND, false), WriterState::Running);
        assert_eq!(state(&dead, 69 * SECOND, false), WriterState::Gone);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn lists_only_probes_files() {
        let dir = std::env::temp_dir().join(format!("mpib-files-unit-{}", std::process::id()));
        fs::create_dir_all(dir.join("sub.probes")).unwrap();
        fs::write(dir.join("b.probes"), b"").unwrap();
        fs::write(dir.join("a.probes"), b"").unwrap();
        fs::write(dir.join("c.txt"), b"").unwrap();
        let names: Vec<_> = list(&dir)
            .unwrap()
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["a.probes", "b.probes"]);
        let id = Identity::of(&dir.join("a.probes")).unwrap();
        assert!(id.same_file(&Identity::of(&dir.join("a.probes")).unwrap()));
        assert!(id.age() < Duration::from_secs(60));
        fs::remove_dir_all(&dir).unwrap();
        assert_eq!(list(&dir).unwrap_err().kind(), io::ErrorKind::NotFound);
    }
}
