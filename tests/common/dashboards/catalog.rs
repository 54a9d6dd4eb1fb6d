//! The metric catalog, for the dashboard lint (`tests/dashboards.rs`): the metric names and, per
//! family, the label names. The collector's are read from `collector/src/catalog.rs` and the
//! values the probes files declare from `probes/src/declared.rs`, else from
//! `docs/OBSERVABILITY.md` (names only), else from the contract list below (names only); the
//! policy agent's (`mpib_agent_*`) are merged in from `agent/src/catalog.rs`, names and labels.

use std::collections::{BTreeMap, BTreeSet};

/// The metric catalog as agreed with the collector, used only until the collector's own
/// catalog (or docs/OBSERVABILITY.md) exists.
const CONTRACT: &[&str] = &[
    "mpib_rail_tx_bytes_total",
    "mpib_rail_rx_bytes_total",
    "mpib_rail_work_requests_total",
    "mpib_rail_send_completions_total",
    "mpib_rail_recv_completions_total",
    "mpib_rail_error_completions_total",
    "mpib_srq_refills_total",
    "mpib_srq_low_water_hits_total",
    "mpib_mask_mismatches_total",
    "mpib_protocol_errors_total",
    "mpib_cts_posted_total",
    "mpib_cts_signaled_total",
    "mpib_slow_transfers_total",
    "mpib_events_dropped_total",
    "mpib_probes_skipped_total",
    "mpib_probes_reaped_total",
    "mpib_nic_counter_total",
    "mpib_srq_depth",
    "mpib_srq_low_water",
    "mpib_srq_high_water",
    "mpib_writer_heartbeat_age_seconds",
    "mpib_probes_files",
    "mpib_transfer_latency_seconds",
    "mpib_transfers_total",
    "mpib_connection_bytes_total",
    "mpib_connection_info",
    "mpib_connection_hint_sup_ratio",
];

pub struct Catalog {
    pub source: String,
    names: BTreeSet<String>,
    /// Label names per family, when the source says (collector/src/catalog.rs).
    pub labels: BTreeMap<String, BTreeSet<String>>,
}

impl Catalog {
    /// The collector's catalog, plus the agent's families when `agent/src/catalog.rs` exists.
    /// A name in neither is unknown.
    pub fn load() -> Catalog {
        let mut catalog = Catalog::load_collector();
        catalog.merge_agent();
        catalog
    }

    /// Merges the agent's families (string literals starting with `mpib_agent_`, and the label
    /// constants of its `specs!` table) from `agent/src/catalog.rs`, if that file exists.
    fn merge_agent(&mut self) {
        let agent_rs = crate::root().join("agent/src/catalog.rs");
        let Ok(text) = std::fs::read_to_string(&agent_rs) else {
            return;
        };
        let names = string_literals(&text)
            .into_iter()
            .filter(|s| s.starts_with("mpib_agent_") && is_metric_name(s))
            .collect::<BTreeSet<_>>();
        assert!(
            !names.is_empty(),
            "{} has no \"mpib_agent_...\" string literal",
            agent_rs.display()
        );
        for (name, labels) in catalog_labels(&text) {
            if names.contains(&name) {
                self.labels.insert(name, labels);
            }
        }
        self.names.extend(names);
        self.source = format!("{} and agent/src/catalog.rs", self.source);
    }

    fn load_collector() -> Catalog {
        let catalog_rs = crate::root().join("collector/src/catalog.rs");
        let doc = crate::root().join("docs/OBSERVABILITY.md");
        if let Ok(text) = std::fs::read_to_string(&catalog_rs) {
            let names = string_literals(&text)
                .into_iter()
                .filter(|s| s.starts_with("mpib_") && is_metric_name(s))
                .collect::<BTreeSet<_>>();
            assert!(
                !names.is_empty(),
                "{} has no \"mpib_...\" string literal",
                catalog_rs.display()
            );
            let mut labels = catalog_labels(&text);
            let mut names = names;
            let declared_rs = crate::root().join("probes/src/declared.rs");
            if let Ok(declared) = std::fs::read_to_string(&declared_rs) {
                let found = declared_labels(&declared, &text);
                names.extend(found.keys().cloned());
                labels.extend(found);
            }
            return Catalog {
                source: "collector/src/catalog.rs and probes/src/declared.rs".into(),
                names,
                labels,
            };
        }
        if let Ok(text) = std::fs::read_to_string(&doc) {
            let names = words(&text)
                .into_iter()
                .filter(|w| w.starts_with("mpib_"))
                .collect::<BTreeSet<_>>();
            if !names.is_empty() {
                return Catalog {
                    source: "docs/OBSERVABILITY.md".into(),
                    names,
                    labels: BTreeMap::new(),
                };
            }
        }
        Catalog {
            source: "the contract list in tests/common/dashboards/catalog.rs".into(),
            names: CONTRACT.iter().map(|s| s.to_string()).collect(),
            labels: BTreeMap::new(),
        }
    }

    /// The family a sample name belongs to, and the labels its samples carry (a histogram's
    /// `_bucket` adds `le`), if the catalog says.
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

    /// A name the collector exports: a catalog name, or a histogram's `_bucket`/`_sum`/`_count`.
    pub fn has(&self, name: &str) -> bool {
        if self.names.contains(name) {
            return true;
        }
        ["_bucket", "_sum", "_count"].iter().any(|suffix| {
            name.strip_suffix(suffix)
                .is_some_and(|base| self.names.contains(base))
        })
    }
}

/// `{family: label names}` from a catalog's source: each `specs!` entry reads
/// `ID = "name", Kind, Unit, LABELS_CONST,` (the collector's) or `ID = "name", Kind,
/// LABELS_CONST,` (the agent's, no unit), and each `[pub] const LABELS_CONST: &[&str] = &[...];`
/// lists the label names. Entries that do not parse are left out (no label check for them).
pub fn catalog_labels(src: &str) -> BTreeMap<String, BTreeSet<String>> {
    let consts = label_consts(src);
    let mut out = BTreeMap::new();
    for (k, _) in src.match_indices("= \"mpib_") {
        let rest = &src[k + 3..];
        let Some(close) = rest.find('"') else {
            continue;
        };
        let name = &rest[..close];
        let fields: Vec<&str> = rest[close + 1..].splitn(5, ',').map(str::trim).collect();
        // fields[0] is empty (the comma right after the name), fields[1] the kind; the label
        // constant is the next field (agent) or the one after the unit (collector).
        if let Some(labels) = fields
            .iter()
            .skip(2)
            .take(2)
            .find_map(|ident| consts.get(*ident))
        {
            out.insert(name.to_string(), labels.clone());
        }
    }
    out
}

/// `{family: label names}` of the values `probes/src/declared.rs` declares: each `declare!`
/// entry reads `ID: RailCounter|RailGauge|ProcessCounter = slot, ..., "name", "help";`, and the
/// collector exports rail values with its `RAIL_LABELS` and process values with its
/// `PROCESS_LABELS` (both read from `catalog_src`).
pub fn declared_labels(
    declared_src: &str,
    catalog_src: &str,
) -> BTreeMap<String, BTreeSet<String>> {
    let consts = label_consts(catalog_src);
    let mut out = BTreeMap::new();
    let Some(start) = declared_src.find("declare! {") else {
        return out;
    };
    for entry in declared_src[start..].split(';') {
        let scope = if entry.contains(": RailCounter =") || entry.contains(": RailGauge =") {
            "RAIL_LABELS"
        } else if entry.contains(": ProcessCounter =") {
            "PROCESS_LABELS"
        } else {
            continue;
        };
        let name = string_literals(entry)
            .into_iter()
            .find(|s| s.starts_with("mpib_") && is_metric_name(s));
        if let (Some(name), Some(labels)) = (name, consts.get(scope)) {
            out.insert(name, labels.clone());
        }
    }
    out
}

/// The `[pub] const NAME: &[&str] = &[...];` label lists of a catalog source.
fn label_consts(src: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut consts: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (k, _) in src.match_indices("const ") {
        let rest = &src[k + "const ".len()..];
        let Some((ident, tail)) = rest.split_once(':') else {
            continue;
        };
        let tail = tail.trim_start();
        if !tail.starts_with("&[&str]") && !tail.starts_with("&[&'static str]") {
            continue;
        }
        let Some(end) = tail.find("];") else {
            continue;
        };
        let body = &tail[..end];
        let Some(open) = body.find("= &[") else {
            continue;
        };
        consts.insert(
            ident.trim().to_string(),
            string_literals(&body[open..]).into_iter().collect(),
        );
    }
    consts
}

fn is_metric_name(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// The contents of the `"..."` literals of a Rust source (plain strings; escapes kept raw).
pub fn string_literals(src: &str) -> Vec<String> {
    let mut out = Vec::new();
    let bytes = src.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'/' if bytes.get(i + 1) == Some(&b'/') => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
            }
            b'\'' => {
                // A char literal ('"') or a lifetime: skip a quoted char if there is one.
                if bytes.get(i + 2) == Some(&b'\'') {
                    i += 3;
                    continue;
                }
                if bytes.get(i + 1) == Some(&b'\\') && bytes.get(i + 3) == Some(&b'\'') {
                    i += 4;
                    continue;
                }
                i += 1;
            }
            b'"' => {
                let start = i + 1;
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    if bytes[i] == b'\\' {
                        i += 1;
                    }
                    i += 1;
                }
                out.push(src[start..i.min(src.len())].to_string());
                i += 1;
            }
            _ => i += 1,
        }
    }
    out
}

fn words(text: &str) -> Vec<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
        .map(str::to_string)
        .collect()
}
