//! The cdylib must export exactly the six NCCL net tables and nothing else, and must not need
//! libibverbs to load.
//!
//! This test builds nothing itself. Cargo compiles the library target once with both its crate
//! types (`cdylib` and `rlib`) before linking integration tests, writing
//! `target/<profile>/deps/libnccl_net_mpib.so`; `cargo build` additionally copies it up to
//! `target/<profile>/libnccl_net_mpib.so` (the file `scripts/install` installs), but a bare
//! `cargo test` does not, and an old copy there can be stale. So the test reads the `deps/`
//! library (same compilation as the rlib it links) and falls back to the copied-up one. It lists
//! the dynamic symbols with `nm -D --defined-only`; a missing `nm` or library is a failure,
//! never a pass.
#![allow(clippy::unwrap_used, clippy::expect_used)] // A failed unwrap fails the test, with its message.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

const LIBRARY: &str = "libnccl_net_mpib.so";

const EXPECTED: [&str; 6] = [
    "ncclNetPlugin_v7",
    "ncclNetPlugin_v8",
    "ncclNetPlugin_v9",
    "ncclNetPlugin_v10",
    "ncclNetPlugin_v11",
    "ncclNetPlugin_v12",
];

/// The cdylib cargo built for this test run, derived from this test binary's location
/// (`target/<profile>/deps/exports-<hash>`): `deps/` first, then `target/<profile>/`.
fn cdylib_path() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe
        .parent()
        .expect("test binary lives in target/<profile>/deps");
    let profile_dir = deps
        .parent()
        .expect("test binary lives in target/<profile>/deps");
    let candidates = [deps.join(LIBRARY), profile_dir.join(LIBRARY)];
    match candidates.iter().find(|path| path.is_file()) {
        Some(path) => path.clone(),
        None => panic!(
            "{LIBRARY} not found in {} or {}",
            deps.display(),
            profile_dir.display()
        ),
    }
}

/// The names of the defined dynamic symbols, without version suffixes; absolute (`A`) entries,
/// which name version nodes rather than code or data, are skipped.
fn defined_dynamic_symbols(nm_output: &str) -> BTreeSet<String> {
    nm_output
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (kind, name) = match fields.as_slice() {
                [_address, kind, name] => (*kind, *name),
                [kind, name] => (*kind, *name),
                _ => return None,
            };
            if kind == "A" {
                return None;
            }
            Some(name.split('@').next().unwrap_or(name).to_string())
        })
        .collect()
}

#[test]
fn only_the_six_tables_are_exported() {
    let lib = cdylib_path();
    let output = match Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(&lib)
        .output()
    {
        Ok(output) => output,
        Err(e) => panic!(
            "cannot run `nm` (binutils) to check the exports of {}: {e}",
            lib.display()
        ),
    };
    assert!(
        output.status.success(),
        "nm -D --defined-only {} failed: {}",
        lib.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    let found = defined_dynamic_symbols(&String::from_utf8_lossy(&output.stdout));
    let expected: BTreeSet<String> = EXPECTED.iter().map(|s| s.to_string()).collect();
    assert_eq!(found, expected, "dynamic exports of {}", lib.display());
}

/// libibverbs is opened by the verbs fabric (src/fabric/verbs/library.rs), never linked: the
/// plugin must load where rdma-core is absent, so it may neither need the library nor import
/// one of its symbols (a call to an rdma-sys function would bring both back).
#[test]
fn libibverbs_is_neither_needed_nor_imported() {
    let lib = cdylib_path();
    let dynamic = Command::new("readelf").arg("-d").arg(&lib).output();
    let dynamic = dynamic.unwrap_or_else(|e| panic!("cannot run `readelf` (binutils): {e}"));
    let needed: Vec<String> = String::from_utf8_lossy(&dynamic.stdout)
        .lines()
        .filter(|line| line.contains("(NEEDED)"))
        .map(str::to_string)
        .collect();
    assert!(
        !needed.is_empty(),
        "readelf -d {} listed nothing",
        lib.display()
    );
    let verbs: Vec<&String> = needed
        .iter()
        .filter(|l| l.contains("ibverbs") || l.contains("libnl"))
        .collect();
    assert!(verbs.is_empty(), "{} needs {verbs:?}", lib.display());
    let imports = Command::new("nm")
        .args(["-D", "--undefined-only"])
        .arg(&lib)
        .output();
    let imports = imports.unwrap_or_else(|e| panic!("cannot run `nm` (binutils): {e}"));
    let text = String::from_utf8_lossy(&imports.stdout);
    let verbs: Vec<&str> = text.lines().filter(|line| line.contains(" ibv_")).collect();
    assert!(verbs.is_empty(), "{} imports {verbs:?}", lib.display());
}

#[test]
fn nm_lines_are_parsed() {
    let sample = "0000000000000000 A VERS_1.0\n\
                  00000000000a1b20 D ncclNetPlugin_v12@@VERS_1.0\n\
                  00000000000a1c00 R ncclNetPlugin_v7\n";
    let names = defined_dynamic_symbols(sample);
    let expected: BTreeSet<String> = ["ncclNetPlugin_v12", "ncclNetPlugin_v7"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(names, expected);
}
