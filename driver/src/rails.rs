//! Which rail carried the bytes: a minimal reader of the plugin's own probes file (layout ABI 3.x,
//! `docs/PROBES_LAYOUT.md`), written independently of the `mpib-probes` crate like [`crate::abi`]
//! is of the plugin.
//!
//! The plugin keeps one file per process, `mpib-<pid>-<start_ns>.probes` under
//! `MPIB_PROBES_DIR` (default `/dev/shm/mpib`), until its last `finalize`. Its connection table
//! holds, per connection, the direction, the path class the plugin chose (intra- or
//! inter-island), the mode and the payload bytes per rail, on the sending side from the split and
//! on the receiving side from the completions. A test reads the slot of its connection before and
//! after a case and compares the difference with the split it expects.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

const MAGIC: &[u8; 8] = b"MPIBPROB";
const ABI_MAJOR: u32 = 3;
/// The header's region table (16-byte `{offset, len, stride, count}` entries) and the index of
/// the connection table in it.
const REGIONS_AT: usize = 72;
const REGION_CONNECTIONS: usize = 2;
const SLOT_LEN: u64 = 128;
const STATE_ACTIVE: u64 = 1;

/// A connection's direction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// A send comm.
    Send,
    /// A receive comm.
    Recv,
}

/// The path class the plugin chose for a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathClass {
    /// Same island: SUP queue pairs exist.
    Intra,
    /// Different islands: SOUT only.
    Inter,
}

impl PathClass {
    /// Parses `intra` or `inter`.
    pub fn parse(text: &str) -> Result<PathClass> {
        match text {
            "intra" => Ok(PathClass::Intra),
            "inter" => Ok(PathClass::Inter),
            other => Err(Error::Refused(format!(
                "path class {other:?}: expected `intra` or `inter`"
            ))),
        }
    }
}

/// One connection slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Connection {
    /// Index in the table.
    pub index: u64,
    /// Send or receive.
    pub direction: Direction,
    /// Intra- or inter-island.
    pub class: PathClass,
    /// Advanced mode (`MPIB_MODE=1`).
    pub advanced: bool,
    /// The fused device (NCCL's `dev`) the connection uses.
    pub device: u8,
    /// Payload bytes on (SOUT, SUP).
    pub rail_bytes: (u64, u64),
}

/// The probes file of this process.
#[derive(Debug)]
pub struct Probes {
    file: std::fs::File,
    path: PathBuf,
    /// Where the connection table starts and how many slots it has (from the region table).
    connections_at: u64,
    slots: u64,
}

fn u64_at(buf: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&buf[at..at + 8]);
    u64::from_ne_bytes(word)
}

impl Probes {
    /// Whether the plugin writes probes at all (`MPIB_PROBES=0` turns them off).
    pub fn enabled() -> bool {
        std::env::var("MPIB_PROBES").map_or(true, |v| v.trim() != "0")
    }

    /// The directory the plugin writes to.
    pub fn dir() -> PathBuf {
        std::env::var_os("MPIB_PROBES_DIR")
            .filter(|v| !v.is_empty())
            .map_or_else(|| PathBuf::from("/dev/shm/mpib"), PathBuf::from)
    }

    /// Opens this process's live probes file (the newest one not closed).
    pub fn open_own() -> Result<Probes> {
        let dir = Probes::dir();
        let prefix = format!("mpib-{}-", std::process::id());
        let entries = std::fs::read_dir(&dir)
            .map_err(|e| Error::Io(format!("probes dir {}: {e}", dir.display())))?;
        let mut best: Option<(u64, PathBuf)> = None;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(rest) = name.strip_prefix(&prefix) else {
                continue;
            };
            let Some(start) = rest
                .strip_suffix(".probes")
                .and_then(|s| s.parse::<u64>().ok())
            else {
                continue;
            };
            if best.as_ref().map_or(true, |(b, _)| start > *b) {
                best = Some((start, entry.path()));
            }
        }
        let (_, path) = best.ok_or_else(|| {
            Error::Io(format!(
                "no probes file {prefix}*.probes in {} (is MPIB_PROBES=0 set?)",
                dir.display()
            ))
        })?;
        Probes::open(&path)
    }

    /// Opens a probes file and checks its header.
    pub fn open(path: &Path) -> Result<Probes> {
        let file = std::fs::File::open(path)
            .map_err(|e| Error::Io(format!("open {}: {e}", path.display())))?;
        let mut probes = Probes {
            file,
            path: path.to_path_buf(),
            connections_at: 0,
            slots: 0,
        };
        let mut header = [0u8; REGIONS_AT + 16 * (REGION_CONNECTIONS + 1)];
        probes.read_at(&mut header, 0)?;
        if &header[..8] != MAGIC {
            return Err(Error::Contract(format!(
                "{}: not a probes file",
                path.display()
            )));
        }
        let abi = u32::from_ne_bytes([header[8], header[9], header[10], header[11]]);
        if abi >> 16 != ABI_MAJOR {
            return Err(Error::Contract(format!(
                "{}: probes ABI {}.{}, this reader knows {ABI_MAJOR}.x",
                path.display(),
                abi >> 16,
                abi & 0xffff
            )));
        }
        let entry = REGIONS_AT + 16 * REGION_CONNECTIONS;
        let word = |at: usize| {
            u32::from_ne_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]])
        };
        let (offset, stride, count) = (word(entry), word(entry + 8), word(entry + 12));
        if u64::from(stride) != SLOT_LEN || count == 0 {
            return Err(Error::Contract(format!(
                "{}: connection table stride {stride}, count {count}: not this reader's layout",
                path.display()
            )));
        }
        probes.connections_at = u64::from(offset);
        probes.slots = u64::from(count);
        Ok(probes)
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn read_at(&self, buf: &mut [u8], at: u64) -> Result<()> {
        self.file
            .read_exact_at(buf, at)
            .map_err(|e| Error::Io(format!("read {}: {e}", self.path.display())))
    }

    /// Every active connection.
    pub fn connections(&self) -> Result<Vec<Connection>> {
        let mut table = vec![0u8; (self.slots * SLOT_LEN) as usize];
        self.read_at(&mut table, self.connections_at)?;
        let mut out = Vec::new();
        for index in 0..self.slots {
            let slot = &table[(index * SLOT_LEN) as usize..((index + 1) * SLOT_LEN) as usize];
            if u64_at(slot, 0) & 0xffff_ffff != STATE_ACTIVE {
                continue;
            }
            out.push(Connection {
                index,
                direction: if slot[14] == 0 {
                    Direction::Send
                } else {
                    Direction::Recv
                },
                class: if slot[15] == 0 {
                    PathClass::Intra
                } else {
                    PathClass::Inter
                },
                advanced: slot[16] == 1,
                device: slot[17],
                rail_bytes: (u64_at(slot, 40), u64_at(slot, 48)),
            });
        }
        Ok(out)
    }

    /// The one active connection of `direction` (a process with several is ambiguous).
    pub fn only(&self, direction: Direction) -> Result<Connection> {
        let found: Vec<Connection> = self
            .connections()?
            .into_iter()
            .filter(|c| c.direction == direction)
            .collect();
        match found.as_slice() {
            [one] => Ok(*one),
            other => Err(Error::Contract(format!(
                "{}: expected exactly one active {direction:?} connection, found {}",
                self.path.display(),
                other.len()
            ))),
        }
    }

    /// The active connection at `index` (its bytes now).
    pub fn at(&self, index: u64) -> Result<Connection> {
        self.connections()?
            .into_iter()
            .find(|c| c.index == index)
            .ok_or_else(|| {
                Error::Contract(format!(
                    "{}: connection slot {index} is no longer active",
                    self.path.display()
                ))
            })
    }
}
