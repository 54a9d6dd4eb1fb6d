//! Docs that stand alone: every repository path and document that a comment or a doc cites
//! exists in the repository, and nothing cites the design notes the project started from (they
//! are not part of it). A dangling reference fails here, named by file, line and reference.
//!
//! Scanned: every text file of the repository (`*.rs`, `*.md`, `*.sh`, `*.toml`, `*.yml`,
//! `*.yaml`, `*.c`, `*.h`, `*.py`, and scripts with a `#!` line), except build output
//! (`target/`), the fuzzer's inputs and outputs (`fuzz/corpus/`, `fuzz/regressions/`,
//! `fuzz/artifacts/`, ...) and `.git/`. Checked:
//!
//! * paths that start at a top-level directory (`docs/PROTOCOL.md`, `scripts/rig/suite.sh`,
//!   `proto/src/imm.rs`, ...), resolved from the repository root, the citing file's crate (so
//!   `src/lib.rs` inside `probes/` is `probes/src/lib.rs`) or the citing file's directory, with
//!   or without `.rs` (`benches/transfer`); a placeholder component (`<target>`, `*`, `{name}`,
//!   `$X`, `...`) ends the path and what comes before it must exist. Paths into the directories
//!   tools create ([`GENERATED`]) need not exist, and [`ELSEWHERE`] lists the few that name
//!   another project's file;
//! * bare document names (`PROBES_LAYOUT.md`), found at the root, in `docs/` or beside the file;
//! * the section a document citation names right after the name, if it names one: `§4` must be a
//!   numbered heading of the document, and quoted words (`, 'Threads and state'`) must be in it;
//! * relative Markdown links (`[text](PROTOCOL.md)`), from the linking file's directory;
//! * a citation of an outside design note by number (the word `seed` and a three-digit number
//!   starting with 0) or a path into the workspace's shared folder outside the repository.
#![allow(clippy::unwrap_used, clippy::expect_used)] // A failed unwrap fails the test, with its message.

use std::io::Read;
use std::path::{Path, PathBuf};

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

/// Extensions of the text files scanned.
const EXTENSIONS: &[&str] = &["rs", "md", "sh", "toml", "yml", "yaml", "c", "h", "py"];

/// Directories never scanned, relative to the root, besides [`GENERATED`] and every directory
/// named `target`: git's, and the fuzzer's committed binary inputs.
const SKIPPED: &[&str] = &[".git", "fuzz/corpus", "fuzz/regressions"];

/// Directories that tools create (cargo-fuzz's crash inputs, coverage and build): not scanned,
/// and a path into one is accepted without existing, since a fresh checkout has none.
const GENERATED: &[&str] = &["fuzz/artifacts", "fuzz/coverage", "fuzz/target"];

/// First components of the repository-relative paths that are checked.
const TOP_LEVEL: &[&str] = &[
    "docs",
    "scripts",
    "dashboards",
    "packaging",
    "src",
    "tests",
    "include",
    "benches",
    "agent",
    "collector",
    "driver",
    "probes",
    "proto",
    "fuzz",
    "fuzzing",
    "params",
    "node",
    "checks",
    "top",
    "testkit",
];

/// Paths of the same shape that name another project's file, cited as such.
const ELSEWHERE: &[&str] = &[
    // The Linux kernel's script, whose method scripts/rxe-vm/ uses to extract vmlinux.
    "scripts/extract-vmlinux",
];

/// A reference that does not resolve.
#[derive(Debug, PartialEq, Eq)]
struct Dangling {
    /// `file:line`, the file relative to the root.
    at: String,
    reference: String,
    why: &'static str,
}

impl std::fmt::Display for Dangling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {} ({})", self.at, self.reference, self.why)
    }
}

/// Every scanned file, relative to the root, sorted.
fn text_files(root: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(dir) = stack.pop() {
        let entries = std::fs::read_dir(root.join(&dir)).expect("the repository is readable");
        for entry in entries.flatten() {
            let relative = dir.join(entry.file_name());
            let kind = entry.file_type().expect("a directory entry has a type");
            if kind.is_dir() {
                let skipped = entry.file_name() == "target"
                    || SKIPPED
                        .iter()
                        .chain(GENERATED)
                        .any(|s| relative == Path::new(s));
                if !skipped {
                    stack.push(relative);
                }
            } else if kind.is_file() && is_text_file(&root.join(&relative)) {
                files.push(relative);
            }
        }
    }
    files.sort();
    files
}

fn is_text_file(path: &Path) -> bool {
    match path.extension().and_then(|e| e.to_str()) {
        Some(extension) => EXTENSIONS.contains(&extension),
        None => {
            let mut head = [0u8; 2];
            let read = std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut head));
            read.is_ok() && head == *b"#!"
        }
    }
}

/// The directory of the crate that holds `file` (relative to the root): the nearest ancestor
/// with a `Cargo.toml`.
fn crate_dir(root: &Path, file: &Path) -> PathBuf {
    let mut dir = file.parent();
    while let Some(candidate) = dir {
        if root.join(candidate).join("Cargo.toml").is_file() {
            return candidate.to_path_buf();
        }
        dir = candidate.parent();
    }
    PathBuf::new()
}

/// Whether `path` lies in one of the [`GENERATED`] directories.
fn is_generated(path: &str) -> bool {
    GENERATED.iter().any(|dir| {
        path.strip_prefix(dir)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    })
}

fn is_path_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "_-./*<>{}$".contains(c)
}

/// Characters that cannot precede the start of a path (it would be the middle of another).
fn continues_a_word(c: char) -> bool {
    c.is_ascii_alphanumeric() || "_-./$}~".contains(c)
}

/// The part of `path` before its first placeholder component, without trailing dots or slashes.
fn literal_prefix(path: &str) -> &str {
    let path = path.trim_end_matches(['.', '/']);
    let mut end = 0;
    for component in path.split('/') {
        let placeholder = component.is_empty()
            || component.chars().all(|c| c == '.')
            || component.contains(['*', '<', '>', '{', '}', '$']);
        if placeholder {
            break;
        }
        end += component.len() + 1;
    }
    path[..end.saturating_sub(1).min(path.len())].trim_end_matches(['.', '/'])
}

/// Repository paths cited on `line`: each a maximal run of path characters that starts at a
/// top-level directory name followed by `/`, not in the middle of a longer path or word.
fn cited_paths(line: &str) -> Vec<(usize, &str)> {
    let mut found = Vec::new();
    for top in TOP_LEVEL {
        let needle = format!("{top}/");
        for (start, _) in line.match_indices(&needle) {
            if line[..start]
                .chars()
                .next_back()
                .is_some_and(continues_a_word)
            {
                continue;
            }
            let rest = &line[start..];
            let end = rest.find(|c| !is_path_char(c)).unwrap_or(rest.len());
            found.push((start, &rest[..end]));
        }
    }
    found
}

/// Bare document names on `line`, like `PROTOCOL.md`.
fn document_names(line: &str) -> Vec<(usize, &str)> {
    let mut found = Vec::new();
    for (end, _) in line.match_indices(".md") {
        let head = &line[..end];
        let start = head
            .rfind(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
            .map_or(0, |i| i + 1);
        let after = line[end + 3..].chars().next();
        let name_ok = start < end && head[start..].starts_with(|c: char| c.is_ascii_uppercase());
        let bounded = !head[..start]
            .chars()
            .next_back()
            .is_some_and(continues_a_word)
            && !after.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        if name_ok && bounded {
            found.push((start, &line[start..end + 3]));
        }
    }
    found
}

/// Relative Markdown link targets on `line`, without their `#anchor`.
fn markdown_links(line: &str) -> Vec<&str> {
    let mut found = Vec::new();
    for (start, _) in line.match_indices("](") {
        let rest = &line[start + 2..];
        let Some(end) = rest.find(')') else { continue };
        let target = rest[..end].trim().trim_matches(['<', '>']);
        let target = target.split('#').next().unwrap_or_default();
        let external = target.contains("://") || target.starts_with("mailto:");
        if !target.is_empty() && !external {
            found.push(target);
        }
    }
    found
}

/// Whether `line` cites an outside design note by number: `seed`, optional `s`, spaces or
/// backticks, then three digits starting with 0.
fn cites_design_note(line: &str) -> bool {
    let lower = line.to_ascii_lowercase();
    lower.match_indices("seed").any(|(start, word)| {
        let rest = lower[start + word.len()..].trim_start_matches('s');
        let digits = rest.trim_start_matches([' ', '\t', '`']);
        let spaced = digits.len() < rest.len();
        let number = digits.as_bytes();
        spaced
            && number.len() >= 3
            && number[0] == b'0'
            && number[..3].iter().all(u8::is_ascii_digit)
    })
}

/// The part of a document that a citation names right after the document's name.
#[derive(Debug, PartialEq, Eq)]
enum Section<'a> {
    /// `§3.2` (of `§3.2–3.3`): a heading numbered so.
    Number(&'a str),
    /// `, 'Threads and state'` or `, "Writer lanes"`: words the document holds.
    Words(&'a str),
}

/// The section cited by the text that follows a document's name, if any.
fn cited_section(after: &str) -> Option<Section<'_>> {
    let after = after.strip_prefix('`').unwrap_or(after);
    if let Some(rest) = after.strip_prefix(" §") {
        let end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number = rest[..end].trim_end_matches('.');
        return (!number.is_empty()).then_some(Section::Number(number));
    }
    let rest = after.strip_prefix(", ")?;
    let quote = rest.chars().next().filter(|c| *c == '\'' || *c == '"')?;
    let rest = &rest[1..];
    let end = rest.find(quote)?;
    Some(Section::Words(&rest[..end]))
}

/// Whether the document `text` has the cited `section`.
fn has_section(text: &str, section: &Section<'_>) -> bool {
    match section {
        Section::Words(words) => text.contains(words),
        Section::Number(number) => text.lines().any(|line| {
            let title = line.trim_start_matches('#');
            title.len() < line.len()
                && title
                    .trim_start()
                    .strip_prefix(number)
                    .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with(". "))
        }),
    }
}

/// Every dangling reference of one file's `text`; `file` is relative to `root`.
fn check_text(root: &Path, file: &Path, text: &str) -> Vec<Dangling> {
    let here = file.parent().unwrap_or(Path::new(""));
    let bases = [PathBuf::new(), crate_dir(root, file), here.to_path_buf()];
    // The file `path` names, from the root, the crate, the file's directory or `extra`.
    let resolve = |path: &str, extra: &[&str]| {
        let dirs = bases.iter().map(PathBuf::as_path);
        dirs.chain(extra.iter().map(Path::new)).find_map(|dir| {
            let dir = root.join(dir);
            [dir.join(path), dir.join(format!("{path}.rs"))]
                .into_iter()
                .find(|candidate| candidate.exists())
        })
    };
    let shared = ["..", "shared"].join("/");
    let is_markdown = file.extension().is_some_and(|e| e == "md");
    let mut dangling = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let mut report = |reference: &str, why| {
            dangling.push(Dangling {
                at: format!("{}:{}", file.display(), index + 1),
                reference: reference.to_string(),
                why,
            })
        };
        let mut documents = Vec::new();
        for (start, path) in cited_paths(line) {
            let literal = literal_prefix(path);
            match resolve(literal, &[]) {
                Some(found) => documents.push((start + path.len(), path, found)),
                None if ELSEWHERE.contains(&literal) || is_generated(literal) => {}
                None => report(path.trim_end_matches('.'), "no such path in the repository"),
            }
        }
        for (start, name) in document_names(line) {
            match resolve(name, &["docs"]) {
                Some(found) => documents.push((start + name.len(), name, found)),
                None => report(name, "no such document"),
            }
        }
        for (end, name, found) in documents.into_iter().filter(|d| d.1.ends_with(".md")) {
            let Some(section) = cited_section(&line[end..]) else {
                continue;
            };
            let document = std::fs::read_to_string(&found).unwrap_or_default();
            if !has_section(&document, &section) {
                let cited = match section {
                    Section::Number(number) => format!("{name} §{number}"),
                    Section::Words(words) => format!("{name}, '{words}'"),
                };
                report(&cited, "no such section in it");
            }
        }
        for target in markdown_links(line).into_iter().filter(|_| is_markdown) {
            if !root.join(here).join(literal_prefix(target)).exists() {
                report(target, "broken link");
            }
        }
        if cites_design_note(line) {
            report(
                line.trim(),
                "cites a design note that is not in the repository",
            );
        }
        if line.contains(&shared) {
            report(line.trim(), "points outside the repository");
        }
    }
    dangling
}

#[test]
fn every_reference_resolves_inside_the_repository() {
    let root = Path::new(ROOT);
    let files = text_files(root);
    assert!(
        files.iter().any(|f| f == Path::new("docs/PROTOCOL.md")),
        "the scan must see docs/"
    );
    let mut dangling = Vec::new();
    for file in &files {
        let Ok(text) = std::fs::read_to_string(root.join(file)) else {
            continue;
        };
        dangling.extend(check_text(root, file, &text));
    }
    let list: Vec<String> = dangling.iter().map(ToString::to_string).collect();
    assert!(
        list.is_empty(),
        "{} dangling reference(s) in {} files scanned:\n{}",
        list.len(),
        files.len(),
        list.join("\n")
    );
}

#[test]
fn the_scan_flags_what_it_should() {
    let root = Path::new(ROOT);
    let file = Path::new("collector/src/main.rs");
    // The dangling references are assembled at run time, so that this file, scanned like any
    // other, cites none of them.
    let text = [
        format!(
            "// docs/PROTOCOL.md, scripts/rig/suite.sh, src/{}.rs, PROBES_LAYOUT.md",
            "main"
        ),
        "// fuzz/corpus/<target>/, proto/src/*.rs, benches/transfer, /usr/src/x, fuzz/coverage/x"
            .to_string(),
        format!("// docs/{}.md", "NOT_THERE"),
        format!("// see {}.md", "NOT_THERE_EITHER"),
        format!("// as the {} 001 notes say", "seed"),
        format!("// ../{}/notes.txt", "shared"),
        "// docs/PROTOCOL.md §4, `docs/NCCL_NET_ABI.md` §3.2–3.3, AGENT.md, 'What it does'".into(),
        format!(
            "// docs/PROTOCOL.md §{}, AGENT.md, {q}Not a heading{q}",
            12,
            q = '\''
        ),
    ]
    .join("\n");
    let found: Vec<(String, String)> = check_text(root, file, &text)
        .into_iter()
        .map(|d| (d.at, d.reference))
        .collect();
    let at = |line: usize| format!("collector/src/main.rs:{line}");
    assert_eq!(
        found,
        [
            (at(3), format!("docs/{}.md", "NOT_THERE")),
            (at(4), format!("{}.md", "NOT_THERE_EITHER")),
            (at(5), format!("// as the {} 001 notes say", "seed")),
            (at(6), format!("// ../{}/notes.txt", "shared")),
            (at(8), format!("docs/PROTOCOL.md §{}", 12)),
            (at(8), format!("AGENT.md, {q}Not a heading{q}", q = '\'')),
        ]
    );
}
