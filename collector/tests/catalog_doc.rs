//! `docs/OBSERVABILITY.md` lists exactly the exported families: the table between the
//! `catalog` markers is `catalog::markdown_table()`, generated from the probes crate's
//! declarations and the collector's catalog. `MPIB_BLESS=1` rewrites it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

const BEGIN: &str = "<!-- catalog:begin (generated from probes/src/declared.rs and collector/src/catalog.rs; MPIB_BLESS=1 cargo test -p mpib-collector --test catalog_doc) -->\n";
const END: &str = "<!-- catalog:end -->";

#[test]
fn observability_doc_lists_exactly_the_catalog() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/OBSERVABILITY.md");
    let doc = std::fs::read_to_string(&path).unwrap();
    let start = doc.find(BEGIN).expect("begin marker") + BEGIN.len();
    let end = doc[start..].find(END).expect("end marker") + start;
    let want = mpib_collector::catalog::markdown_table();
    if std::env::var_os("MPIB_BLESS").is_some() {
        let blessed = format!("{}{want}{}", &doc[..start], &doc[end..]);
        std::fs::write(&path, blessed).unwrap();
        return;
    }
    assert_eq!(
        &doc[start..end],
        want,
        "docs/OBSERVABILITY.md is stale: run with MPIB_BLESS=1"
    );
    // Every table row in the whole document that names a metric names a catalog family, and
    // every family has exactly one row.
    let mut rows: Vec<&str> = doc
        .lines()
        .filter_map(|l| l.strip_prefix("| `mpib_"))
        .filter_map(|rest| rest.split('`').next())
        .collect();
    rows.sort_unstable();
    let families = mpib_collector::catalog::families();
    let mut names: Vec<&str> = families
        .iter()
        .map(|f| f.name.strip_prefix("mpib_").unwrap())
        .collect();
    names.sort_unstable();
    assert_eq!(rows, names);
}
