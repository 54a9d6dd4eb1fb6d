//! The README's configuration table lists every `MPIB_*` variable of `params/src/params.rs`, with the
//! same defaults, and nothing else: the two cannot drift.
#![allow(clippy::unwrap_used, clippy::expect_used)] // A failed unwrap fails the test, with its message.

use std::collections::BTreeMap;

use mpib_params::params::PARAMS;

fn readme_table() -> BTreeMap<String, String> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
        .expect("README.md is readable");
    let mut rows = BTreeMap::new();
    for line in readme.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.len() < 4 || !cells[1].starts_with("`MPIB_") {
            continue;
        }
        let name = cells[1].trim_matches('`').to_string();
        let default = cells[2].trim_matches('`').to_string();
        assert!(
            rows.insert(name.clone(), default).is_none(),
            "{name} appears twice in the README"
        );
    }
    rows
}

#[test]
fn readme_documents_every_variable_with_its_default() {
    let documented = readme_table();
    let declared: BTreeMap<String, String> = PARAMS
        .iter()
        .map(|p| (p.name.to_string(), p.default.to_string()))
        .collect();
    assert_eq!(
        documented, declared,
        "README table vs params/src/params.rs PARAMS"
    );
}

#[test]
fn every_variable_read_in_the_source_is_declared() {
    let mut names = std::collections::BTreeSet::new();
    // The plugin's sources and its settings crate's.
    let repository = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut stack = vec![repository.join("src"), repository.join("params/src")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("src is readable").flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).expect("source is readable");
                for (index, _) in text.match_indices("\"MPIB_") {
                    let name: String = text[index + 1..]
                        .chars()
                        .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                        .collect();
                    names.insert(name);
                }
            }
        }
    }
    for name in names {
        assert!(
            PARAMS.iter().any(|p| p.name == name),
            "{name} is used in src/ but not declared in PARAMS"
        );
    }
}
