//! Finding and loading the built plugin the way NCCL does (`dlopen(RTLD_NOW | RTLD_LOCAL)`,
//! `dlsym("ncclNetPlugin_vN")`).

use std::ffi::{c_char, c_void, CStr};
use std::fmt;
use std::path::{Path, PathBuf};

use libloading::os::unix::Library;

use crate::error::{Error, Result};
use crate::net::Net;

/// File cargo builds (`[lib] name = "nccl_net_mpib"`, crate type cdylib).
pub const BUILT_NAME: &str = "libnccl_net_mpib.so";
/// Name NCCL looks for with `NCCL_NET_PLUGIN=mpib`.
pub const NCCL_NAME: &str = "libnccl-net-mpib.so";

/// Names the plugin gives its threads (src/net/observe/housekeeper.rs, src/fabric/tcp/mod.rs).
const PLUGIN_THREAD_PREFIXES: [&str; 2] = ["mpib-housekeep", "mpib-tcp-"];

/// The names of this process's threads that the plugin started and that still run: after
/// `dlclose` there must be none, or the next wake-up of one runs unmapped code.
pub fn running_plugin_threads() -> Vec<String> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    tasks
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .map(|name| name.trim().to_string())
        .filter(|name| PLUGIN_THREAD_PREFIXES.iter().any(|p| name.starts_with(p)))
        .collect()
}

/// The net ABI versions MPIB exports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Version {
    /// `ncclNetPlugin_v7` (NCCL 2.19).
    V7,
    /// `ncclNetPlugin_v8` (NCCL 2.20 – 2.23).
    V8,
    /// `ncclNetPlugin_v9` (NCCL 2.24 – 2.25).
    V9,
    /// `ncclNetPlugin_v10` (NCCL 2.26 – 2.27).
    V10,
    /// `ncclNetPlugin_v11` (NCCL 2.28 – 2.29).
    V11,
    /// `ncclNetPlugin_v12` (NCCL 2.30).
    V12,
}

impl Version {
    /// Every version, oldest first.
    pub const ALL: [Version; 6] = [
        Version::V7,
        Version::V8,
        Version::V9,
        Version::V10,
        Version::V11,
        Version::V12,
    ];

    /// The number (7 … 12).
    pub const fn number(self) -> u32 {
        match self {
            Version::V7 => 7,
            Version::V8 => 8,
            Version::V9 => 9,
            Version::V10 => 10,
            Version::V11 => 11,
            Version::V12 => 12,
        }
    }

    /// The exported symbol, NUL-terminated.
    pub const fn symbol(self) -> &'static [u8] {
        match self {
            Version::V7 => b"ncclNetPlugin_v7\0",
            Version::V8 => b"ncclNetPlugin_v8\0",
            Version::V9 => b"ncclNetPlugin_v9\0",
            Version::V10 => b"ncclNetPlugin_v10\0",
            Version::V11 => b"ncclNetPlugin_v11\0",
            Version::V12 => b"ncclNetPlugin_v12\0",
        }
    }

    /// The version numbered `number` (7 … 12), if the driver knows it.
    pub fn from_number(number: u32) -> Option<Version> {
        Version::ALL.into_iter().find(|v| v.number() == number)
    }

    /// `init` per communicator with a context and `finalize` (v11+), rather than once.
    pub const fn has_context(self) -> bool {
        matches!(self, Version::V11 | Version::V12)
    }

    /// `isend`/`irecv` sizes are `int` (v7, v8): NCCL refuses more than 1 GiB.
    pub const fn int_sizes(self) -> bool {
        matches!(self, Version::V7 | Version::V8)
    }

    /// Properties carry `forceFlush`, `vProps`, `maxP2pBytes`; the table has `makeVDevice`.
    pub const fn has_vdevice(self) -> bool {
        self.number() >= 9
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}", self.number())
    }
}

/// The loaded library. Dropping it `dlclose`s (the image is really unloaded only when no other
/// handle in the process keeps it open).
pub struct Plugin {
    lib: Library,
    path: PathBuf,
}

impl fmt::Debug for Plugin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Plugin").field("path", &self.path).finish()
    }
}

impl Plugin {
    /// `dlopen(path, RTLD_NOW | RTLD_LOCAL)`, exactly as NCCL does: every undefined symbol must
    /// resolve now.
    pub fn load(path: impl AsRef<Path>) -> Result<Plugin> {
        let path = path.as_ref().to_path_buf();
        // SAFETY: loading runs the library's initialisers; MPIB is a Rust cdylib without
        // constructors that assume anything about the host.
        let lib = unsafe { Library::open(Some(&path), libc::RTLD_NOW | libc::RTLD_LOCAL) }
            .map_err(|e| Error::Load(format!("dlopen({}): {e}", path.display())))?;
        Ok(Plugin { lib, path })
    }

    /// Where it was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The address of `ncclNetPlugin_vN`.
    pub fn table_address(&self, version: Version) -> Result<*const c_void> {
        // SAFETY: the symbol is looked up as an opaque address; nothing is called or read here.
        let symbol = unsafe { self.lib.get::<*const c_void>(version.symbol()) }.map_err(|e| {
            Error::Load(format!(
                "dlsym(ncclNetPlugin_{version}) in {}: {e}",
                self.path.display()
            ))
        })?;
        let address = symbol.into_raw() as *const c_void;
        if address.is_null() {
            return Err(Error::Load(format!(
                "ncclNetPlugin_{version} resolves to NULL"
            )));
        }
        Ok(address)
    }

    /// Whether the library exports `ncclNetPlugin_v<number>` (any number, drivable or not).
    pub fn exports_table(&self, number: u32) -> bool {
        let symbol = format!("ncclNetPlugin_v{number}\0");
        // SAFETY: looked up as an opaque address; nothing is called or read.
        unsafe { self.lib.get::<*const c_void>(symbol.as_bytes()) }.is_ok()
    }

    /// Every `ncclNetPlugin_vN` the library exports for N in [`SCANNED_TABLES`], oldest first,
    /// including versions this driver cannot drive (so an error can say what the library has).
    pub fn exported_tables(&self) -> Vec<u32> {
        SCANNED_TABLES.filter(|n| self.exports_table(*n)).collect()
    }

    /// Picks the table to drive: `wanted` (a version number, e.g. from `--abi`) or else the
    /// newest drivable one. The errors name the library's path and the symbol, and list what the
    /// library does export, because "dlsym failed" alone does not tell a user which plugin or
    /// NCCL generation they are holding.
    pub fn select_version(&self, wanted: Option<u32>) -> Result<Version> {
        let exported = self.exported_tables();
        let listed = || {
            let names: Vec<String> = exported
                .iter()
                .map(|n| format!("ncclNetPlugin_v{n}"))
                .collect();
            names.join(", ")
        };
        if let Some(number) = wanted {
            let version = Version::from_number(number).ok_or_else(|| unsupported(number))?;
            if exported.contains(&number) {
                return Ok(version);
            }
            return Err(Error::Load(if exported.is_empty() {
                not_a_plugin(&self.path)
            } else {
                format!(
                    "{} exports no ncclNetPlugin_v{number} (it has {})",
                    self.path.display(),
                    listed()
                )
            }));
        }
        let newest = exported.iter().rev().find_map(|n| Version::from_number(*n));
        match newest {
            Some(version) => Ok(version),
            None if exported.is_empty() => Err(Error::Load(not_a_plugin(&self.path))),
            None => Err(Error::Load(format!(
                "{} exports only {}, which this driver cannot drive (it drives \
                 ncclNetPlugin_v7 ... ncclNetPlugin_v12)",
                self.path.display(),
                listed()
            ))),
        }
    }

    /// The table's `name`, read straight after `dlsym`, before any `init` (as NCCL does).
    pub fn name(&self, version: Version) -> Result<String> {
        let table = self.table_address(version)?;
        // SAFETY: every table starts with `const char* name` (sheet §1.4); the address is the
        // exported static, valid while `self.lib` is loaded.
        let name = unsafe { *(table as *const *const c_char) };
        if name.is_null() {
            return Err(Error::Contract(format!(
                "ncclNetPlugin_{version}->name is NULL"
            )));
        }
        // SAFETY: NCCL requires a static NUL-terminated string here.
        let text = unsafe { CStr::from_ptr(name) };
        Ok(text.to_string_lossy().into_owned())
    }

    /// A version-neutral driver over `ncclNetPlugin_vN`.
    pub fn net(&self, version: Version) -> Result<Net<'_>> {
        let table = self.table_address(version)?;
        // SAFETY: `table` is the exported `ncclNet_vN_t` for exactly this `version`, and it lives
        // as long as `self`, which the returned `Net` borrows.
        Ok(unsafe { Net::from_table(version, table) })
    }
}

/// The table versions [`Plugin::exported_tables`] looks for: every NCCL net ABI so far and a
/// margin for newer ones.
pub const SCANNED_TABLES: std::ops::RangeInclusive<u32> = 1..=20;

fn unsupported(number: u32) -> Error {
    Error::Load(format!(
        "ncclNetPlugin_v{number}: this driver drives ncclNetPlugin_v7 ... ncclNetPlugin_v12 only"
    ))
}

fn not_a_plugin(path: &Path) -> String {
    format!(
        "{} is not an NCCL net plugin: it exports no ncclNetPlugin_v* symbol (looked for \
         ncclNetPlugin_v{} ... ncclNetPlugin_v{})",
        path.display(),
        SCANNED_TABLES.start(),
        SCANNED_TABLES.end()
    )
}

/// The profile the current executable was built with (`debug`, `release`, …), from its path
/// (`target/<profile>/deps/<test>` or `target/<profile>/<bin>`).
pub fn current_profile() -> String {
    let exe = std::env::current_exe().ok();
    let dir = exe.as_deref().and_then(Path::parent);
    let dir = match dir {
        Some(d)
            if d.file_name()
                .is_some_and(|n| n == "deps" || n == "examples") =>
        {
            d.parent()
        }
        other => other,
    };
    dir.and_then(Path::file_name)
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "debug".to_string())
}

/// The workspace root (the driver lives in `<root>/driver`).
pub fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

/// Finds `target/<profile>/libnccl_net_mpib.so` (from `CARGO_TARGET_DIR`, the running
/// executable's target dir, or the workspace's `target/`; the newer of the uplifted file and the
/// one in `deps/`), creates the NCCL name `libnccl-net-mpib.so` beside it as a symlink, and
/// returns the path of that symlink.
pub fn locate_built_plugin(profile: &str) -> Result<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(target) = std::env::var_os("CARGO_TARGET_DIR").filter(|v| !v.is_empty()) {
        let target = PathBuf::from(target);
        let target = if target.is_absolute() {
            target
        } else {
            workspace_root().join(target)
        };
        dirs.push(target.join(profile));
    }
    if let Ok(exe) = std::env::current_exe() {
        for ancestor in exe.ancestors().skip(1).take(3) {
            if ancestor.file_name().is_some_and(|n| n == profile) {
                dirs.push(ancestor.to_path_buf());
            }
        }
    }
    dirs.push(workspace_root().join("target").join(profile));
    let found = dirs.iter().find_map(|d| newest_build(d));
    let Some(built) = found else {
        let tried: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
        return Err(Error::Load(format!(
            "{BUILT_NAME} not found in [{}]; build it first with `cargo build{}` in {}",
            tried.join(", "),
            if profile == "release" {
                " --release"
            } else {
                ""
            },
            workspace_root().display()
        )));
    };
    nccl_named_link(&built)
}

/// The newer of `<dir>/libnccl_net_mpib.so` (uplifted by `cargo build`) and
/// `<dir>/deps/libnccl_net_mpib.so` (all that `cargo test` refreshes: it builds the library as a
/// dependency of the test targets and does not uplift it).
fn newest_build(dir: &Path) -> Option<PathBuf> {
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    [dir.join(BUILT_NAME), dir.join("deps").join(BUILT_NAME)]
        .into_iter()
        .filter_map(|p| modified(&p).map(|t| (t, p)))
        .max_by_key(|(t, _)| *t)
        .map(|(_, p)| p)
}

/// Creates (or refreshes) `libnccl-net-mpib.so -> libnccl_net_mpib.so` beside `built`, atomically
/// (parallel tests may race here), and returns the link's path.
pub fn nccl_named_link(built: &Path) -> Result<PathBuf> {
    let dir = built
        .parent()
        .ok_or_else(|| Error::Load(format!("{} has no parent", built.display())))?;
    let link = dir.join(NCCL_NAME);
    let target = built
        .file_name()
        .map(PathBuf::from)
        .unwrap_or_else(|| built.to_path_buf());
    if std::fs::read_link(&link).is_ok_and(|current| current == target) {
        return Ok(link);
    }
    let unique = format!(
        ".{NCCL_NAME}.{}.{:?}",
        std::process::id(),
        std::thread::current().id()
    );
    let temporary = dir.join(unique.replace(['(', ')'], ""));
    let _ = std::fs::remove_file(&temporary);
    std::os::unix::fs::symlink(&target, &temporary)
        .and_then(|()| std::fs::rename(&temporary, &link))
        .map_err(|e| Error::Load(format!("cannot create {}: {e}", link.display())))?;
    Ok(link)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_numbers_round_trip() {
        for v in Version::ALL {
            assert_eq!(Version::from_number(v.number()), Some(v));
        }
        assert_eq!(Version::from_number(6), None);
        assert_eq!(Version::from_number(13), None);
    }

    #[test]
    fn a_library_without_tables_is_named_as_not_a_plugin() {
        let libc = Plugin::load("libc.so.6").expect("libc.so.6 loads");
        assert!(libc.exported_tables().is_empty());
        for wanted in [None, Some(12)] {
            let message = libc.select_version(wanted).unwrap_err().to_string();
            assert!(message.contains("libc.so.6"), "{message}");
            assert!(
                message.contains("not an NCCL net plugin")
                    && message.contains("no ncclNetPlugin_v* symbol"),
                "{message}"
            );
        }
    }

    #[test]
    fn an_unknown_version_is_refused_by_name() {
        let libc = Plugin::load("libc.so.6").expect("libc.so.6 loads");
        let message = libc.select_version(Some(6)).unwrap_err().to_string();
        assert!(
            message.contains("ncclNetPlugin_v6") && message.contains("v7 ... ncclNetPlugin_v12"),
            "{message}"
        );
    }

    #[test]
    fn a_missing_library_names_its_path() {
        let message = Plugin::load("/nonexistent/libnccl-net-x.so")
            .unwrap_err()
            .to_string();
        assert!(
            message.contains("/nonexistent/libnccl-net-x.so"),
            "{message}"
        );
    }
}
