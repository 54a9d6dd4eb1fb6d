//! The metric catalog the dashboards and alert rules are checked against: the collector's
//! families (`mpib_collector::catalog::families`, the probes files' declared values included)
//! and the agent's (`mpib_agent::catalog::CATALOG`), with their label names, read from the crates
//! themselves.

use std::collections::{BTreeMap, BTreeSet};

pub struct Catalog {
    /// Where the names come from, for messages.
    pub source: String,
    /// Label names per family.
    pub labels: BTreeMap<String, BTreeSet<String>>,
}

fn names(labels: &[&str]) -> BTreeSet<String> {
    labels.iter().map(|label| label.to_string()).collect()
}

impl Catalog {
    /// The collector's families and the agent's.
    pub fn load() -> Catalog {
        let mut labels = BTreeMap::new();
        for family in mpib_collector::catalog::families() {
            labels.insert(family.name.clone(), names(family.labels));
        }
        for spec in mpib_agent::catalog::CATALOG {
            labels.insert(spec.name.to_string(), names(spec.labels));
        }
        Catalog {
            source: "mpib_collector::catalog::families() and mpib_agent::catalog::CATALOG".into(),
            labels,
        }
    }

    /// The family a sample name belongs to (a histogram's `_bucket`, `_sum` or `_count` too) and
    /// the labels its samples carry (`_bucket` adds `le`).
    fn labels_of(&self, name: &str) -> Option<BTreeSet<String>> {
        if let Some(labels) = self.labels.get(name) {
            return Some(labels.clone());
        }
        let (base, suffix) = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix).map(|base| (base, *suffix)))?;
        let mut labels = self.labels.get(base)?.clone();
        if suffix == "_bucket" {
            labels.insert("le".into());
        }
        Some(labels)
    }

    /// Label names `selectors` match on that their family does not carry.
    pub fn unknown_labels(&self, selectors: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
        let mut out = Vec::new();
        for (name, used) in selectors {
            if let Some(known) = self.labels_of(name) {
                for label in used.difference(&known) {
                    out.push(format!("{name}{{{label}}} (has {known:?})"));
                }
            }
        }
        out
    }

    /// A name MPIB exports: a family, or a histogram's `_bucket`/`_sum`/`_count`.
    pub fn has(&self, name: &str) -> bool {
        self.labels_of(name).is_some()
    }
}
