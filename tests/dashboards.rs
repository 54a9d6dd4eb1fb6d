//! Lint of `dashboards/` without a Grafana or Prometheus server: the dashboard's shape (stable
//! uid, `$datasource` everywhere, the template variables), every metric name its PromQL uses
//! and every metric name the alert rules use is in the collector's catalog (and every label a
//! selector matches on is one of that family's labels), and the rules pass `promtool check
//! rules` and their unit tests (`promtool test rules`).
//!
//! The catalog is read from `collector/src/catalog.rs` (the string literals starting with
//! `mpib_`, and the label constants of its `specs!` table), else from `docs/OBSERVABILITY.md`
//! (names only), else from the contract list below (names only).
//!
//! promtool comes from Debian's `prometheus` package (`scripts/test` installs it). The live
//! check against a real Prometheus scraping the collector is `dashboards/e2e/run.sh`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

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

struct Catalog {
    source: String,
    names: BTreeSet<String>,
    /// Label names per family, when the source says (collector/src/catalog.rs).
    labels: BTreeMap<String, BTreeSet<String>>,
}

impl Catalog {
    fn load() -> Catalog {
        let catalog_rs = root().join("collector/src/catalog.rs");
        let doc = root().join("docs/OBSERVABILITY.md");
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
            let labels = catalog_labels(&text);
            return Catalog {
                source: "collector/src/catalog.rs".into(),
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
            source: "the contract list in tests/dashboards.rs".into(),
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
    fn unknown_labels(&self, selectors: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
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
    fn has(&self, name: &str) -> bool {
        if self.names.contains(name) {
            return true;
        }
        ["_bucket", "_sum", "_count"].iter().any(|suffix| {
            name.strip_suffix(suffix)
                .is_some_and(|base| self.names.contains(base))
        })
    }
}

/// `{family: label names}` from the catalog's source: each `specs!` entry reads
/// `ID = "name", Kind, Unit, LABELS_CONST,` and each `const LABELS_CONST: &[&str] = &[...];`
/// lists the label names. Entries that do not parse are left out (no label check for them).
fn catalog_labels(src: &str) -> BTreeMap<String, BTreeSet<String>> {
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
    let mut out = BTreeMap::new();
    for (k, _) in src.match_indices("= \"mpib_") {
        let rest = &src[k + 3..];
        let Some(close) = rest.find('"') else {
            continue;
        };
        let name = &rest[..close];
        let fields: Vec<&str> = rest[close + 1..].splitn(5, ',').map(str::trim).collect();
        if let Some(labels) = fields.get(3).and_then(|ident| consts.get(*ident)) {
            out.insert(name.to_string(), labels.clone());
        }
    }
    out
}

fn is_metric_name(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// The contents of the `"..."` literals of a Rust source (plain strings; escapes kept raw).
fn string_literals(src: &str) -> Vec<String> {
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

const AGGREGATORS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
];
const KEYWORDS: &[&str] = &[
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "inf",
    "nan",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];
/// Keywords followed by a parenthesised label list that is not PromQL.
const LABEL_LISTS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// The metric names a PromQL expression selects: identifiers outside strings, label matchers
/// (`{...}`), ranges (`[...]`) and label lists (`by (...)`), that are not functions, aggregators
/// or keywords. Grafana variables (`$x`, `${x}`) are skipped.
fn metric_names(expr: &str) -> BTreeSet<String> {
    selectors(expr).into_keys().collect()
}

/// The label names of a matcher list (the text between `{` and `}`).
fn matcher_labels(body: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let chars: Vec<char> = body.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '"' | '\'' | '`' => {
                let quote = chars[i];
                i += 1;
                while i < chars.len() && chars[i] != quote {
                    if chars[i] == '\\' {
                        i += 1;
                    }
                    i += 1;
                }
                i += 1;
            }
            c if c.is_ascii_alphabetic() || c == '_' => {
                let start = i;
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                    i += 1;
                }
                let rest: String = chars[i..].iter().collect();
                let rest = rest.trim_start();
                if ["=~", "!=", "!~", "="]
                    .iter()
                    .any(|op| rest.starts_with(op))
                {
                    out.insert(chars[start..i].iter().collect());
                }
            }
            _ => i += 1,
        }
    }
    out
}

/// Every metric a PromQL expression selects, with the label names its matchers use.
fn selectors(expr: &str) -> BTreeMap<String, BTreeSet<String>> {
    let chars: Vec<char> = expr.chars().collect();
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut i = 0;
    let skip_string = |i: &mut usize| {
        let quote = chars[*i];
        *i += 1;
        while *i < chars.len() && chars[*i] != quote {
            if chars[*i] == '\\' && quote != '`' {
                *i += 1;
            }
            *i += 1;
        }
        *i += 1;
    };
    let skip_group = |i: &mut usize, open: char, close: char| {
        let mut depth = 0;
        while *i < chars.len() {
            match chars[*i] {
                '"' | '\'' | '`' => {
                    skip_string(i);
                    continue;
                }
                c if c == open => depth += 1,
                c if c == close => {
                    depth -= 1;
                    if depth == 0 {
                        *i += 1;
                        return;
                    }
                }
                _ => {}
            }
            *i += 1;
        }
    };
    while i < chars.len() {
        let c = chars[i];
        match c {
            '"' | '\'' | '`' => skip_string(&mut i),
            '{' => skip_group(&mut i, '{', '}'),
            '[' => skip_group(&mut i, '[', ']'),
            '#' => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            '$' => {
                i += 1;
                if chars.get(i) == Some(&'{') {
                    skip_group(&mut i, '{', '}');
                } else {
                    while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                        i += 1;
                    }
                }
            }
            c if c.is_ascii_digit()
                || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit)) =>
            {
                // Numbers and durations (0.99, 1e-3, 5m, 0x1f).
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                    i += 1;
                }
            }
            c if c.is_ascii_alphabetic() || c == '_' || c == ':' => {
                let start = i;
                while i < chars.len()
                    && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
                {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                let mut j = i;
                while j < chars.len() && chars[j].is_whitespace() {
                    j += 1;
                }
                let next = chars.get(j).copied();
                if LABEL_LISTS.contains(&word.as_str()) {
                    if next == Some('(') {
                        i = j;
                        skip_group(&mut i, '(', ')');
                    }
                } else if next == Some('(')
                    || AGGREGATORS.contains(&word.as_str())
                    || KEYWORDS.contains(&word.to_ascii_lowercase().as_str())
                {
                    // function call, aggregator, keyword
                } else {
                    let labels = out.entry(word).or_default();
                    if next == Some('{') {
                        let open = j;
                        i = j;
                        skip_group(&mut i, '{', '}');
                        let body: String = chars[open + 1..i.saturating_sub(1)].iter().collect();
                        labels.extend(matcher_labels(&body));
                    }
                }
            }
            _ => i += 1,
        }
    }
    out
}

/// The PromQL inside a Grafana Prometheus variable query: `label_values(expr, label)` gives
/// `expr`, `label_values(label)` gives nothing; `query_result(expr)` gives `expr`.
fn variable_promql(query: &str) -> Option<String> {
    let q = query.trim();
    if let Some(inner) = q
        .strip_prefix("label_values(")
        .and_then(|r| r.strip_suffix(')'))
    {
        // The last top-level comma separates the selector from the label.
        let mut depth = 0i32;
        let mut in_string = false;
        let mut split = None;
        for (k, ch) in inner.char_indices() {
            match ch {
                '"' => in_string = !in_string,
                '(' | '{' | '[' if !in_string => depth += 1,
                ')' | '}' | ']' if !in_string => depth -= 1,
                ',' if !in_string && depth == 0 => split = Some(k),
                _ => {}
            }
        }
        return split.map(|k| inner[..k].to_string());
    }
    if let Some(inner) = q
        .strip_prefix("query_result(")
        .and_then(|r| r.strip_suffix(')'))
    {
        return Some(inner.to_string());
    }
    if q.starts_with("label_names(") || q.starts_with("metrics(") {
        return None;
    }
    Some(q.to_string())
}

fn load_dashboard() -> Value {
    let path = root().join("dashboards/mpib.json");
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

/// Every panel, rows' collapsed children included.
fn all_panels(dash: &Value) -> Vec<&Value> {
    fn walk<'a>(panels: &'a Value, out: &mut Vec<&'a Value>) {
        for p in panels.as_array().into_iter().flatten() {
            out.push(p);
            if let Some(children) = p.get("panels") {
                walk(children, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(&dash["panels"], &mut out);
    out
}

fn variables(dash: &Value) -> &Vec<Value> {
    dash["templating"]["list"]
        .as_array()
        .expect("templating.list is an array")
}

fn variable_query(var: &Value) -> String {
    match &var["query"] {
        Value::String(s) => s.clone(),
        Value::Object(o) => o
            .get("query")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        _ => String::new(),
    }
}

fn uses_datasource_variable(ds: &Value) -> bool {
    let uid = match ds {
        Value::String(s) => s.as_str(),
        Value::Object(o) => o.get("uid").and_then(Value::as_str).unwrap_or_default(),
        _ => "",
    };
    uid == "${datasource}" || uid == "$datasource"
}

/// (where, PromQL) of every panel target and every query variable.
fn dashboard_queries(dash: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for panel in all_panels(dash) {
        let title = panel["title"].as_str().unwrap_or("?");
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap_or_default();
            let refid = target["refId"].as_str().unwrap_or("?");
            out.push((format!("panel {title:?} target {refid}"), expr.to_string()));
        }
    }
    for var in variables(dash) {
        if var["type"] == "query" {
            let name = var["name"].as_str().unwrap_or("?");
            if let Some(expr) = variable_promql(&variable_query(var)) {
                out.push((format!("variable ${name}"), expr));
            }
        }
    }
    out
}

#[test]
fn promql_metric_extraction() {
    let names = metric_names(
        "histogram_quantile(0.99, sum by (host, le) (rate(mpib_transfer_latency_seconds_bucket\
         {host=~\"$host\", rail=\"sup\"}[$__rate_interval]))) / on (pid) group_left \
         sum without (rail) (x:y:z) > bool 0.2 and up offset 5m",
    );
    let expected: BTreeSet<String> = ["mpib_transfer_latency_seconds_bucket", "x:y:z", "up"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(names, expected);
    assert_eq!(
        variable_promql("label_values(mpib_a_total{host=~\"$host\", x=\"a,b\"}, pid)").as_deref(),
        Some("mpib_a_total{host=~\"$host\", x=\"a,b\"}")
    );
    assert_eq!(variable_promql("label_values(pid)"), None);
    let selected = selectors("sum by (x) (rate(a_total{host=~\"$h\", rail!=\"a,b=c\"}[1m])) / b");
    assert_eq!(
        selected["a_total"],
        ["host", "rail"].iter().map(|s| s.to_string()).collect()
    );
    assert!(selected["b"].is_empty());
    let labels = catalog_labels(
        "const L: &[&str] = &[\"host\", \"pid\"];\n\
         specs! { A = \"mpib_a_total\", Counter, Count, L, \"help\"; }",
    );
    assert_eq!(
        labels["mpib_a_total"],
        ["host", "pid"].iter().map(|s| s.to_string()).collect()
    );
    let literals = string_literals("m(\"mpib_a_total\", '\"', \"x\\\"y\"); // \"mpib_no\"");
    assert_eq!(literals, vec!["mpib_a_total", "x\\\"y"]);
}

#[test]
fn dashboard_uid_and_variables() {
    let dash = load_dashboard();
    assert_eq!(dash["uid"], "mpib-overview", "the dashboard uid is stable");
    assert!(dash["title"].as_str().is_some_and(|t| !t.is_empty()));

    let vars = variables(&dash);
    let by_name: BTreeMap<&str, &Value> = vars
        .iter()
        .map(|v| (v["name"].as_str().unwrap_or_default(), v))
        .collect();
    let ds = by_name
        .get("datasource")
        .expect("a `datasource` template variable");
    assert_eq!(ds["type"], "datasource");
    assert_eq!(
        ds["query"], "prometheus",
        "$datasource picks a Prometheus datasource"
    );
    for name in ["host", "pid"] {
        let var = by_name
            .get(name)
            .unwrap_or_else(|| panic!("a `{name}` template variable"));
        assert_eq!(var["type"], "query", "${name} is a query variable");
        assert!(
            variable_query(var).starts_with("label_values("),
            "${name} uses label_values()"
        );
        assert!(
            uses_datasource_variable(&var["datasource"]),
            "${name} queries $datasource"
        );
    }
    for var in vars.iter().filter(|v| v["type"] == "query") {
        assert!(
            uses_datasource_variable(&var["datasource"]),
            "variable {} queries $datasource",
            var["name"]
        );
    }
}

#[test]
fn panels_use_the_datasource_variable() {
    let dash = load_dashboard();
    let mut ids = BTreeSet::new();
    let mut kinds = BTreeSet::new();
    let panels = all_panels(&dash);
    for panel in &panels {
        let title = panel["title"].as_str().unwrap_or("?");
        let id = panel["id"]
            .as_u64()
            .unwrap_or_else(|| panic!("panel {title:?} has an id"));
        assert!(ids.insert(id), "panel id {id} is unique");
        for key in ["h", "w", "x", "y"] {
            assert!(
                panel["gridPos"][key].is_u64(),
                "panel {title:?} gridPos.{key} is a number"
            );
        }
        let kind = panel["type"].as_str().unwrap_or_default();
        kinds.insert(kind.to_string());
        if kind == "row" {
            continue;
        }
        assert!(
            uses_datasource_variable(&panel["datasource"]),
            "panel {title:?} uses $datasource, not a fixed datasource: {}",
            panel["datasource"]
        );
        let targets = panel["targets"]
            .as_array()
            .unwrap_or_else(|| panic!("panel {title:?} has targets"));
        assert!(!targets.is_empty(), "panel {title:?} has targets");
        for target in targets {
            assert!(
                uses_datasource_variable(&target["datasource"]),
                "panel {title:?} target {} uses $datasource",
                target["refId"]
            );
            let expr = target["expr"].as_str().unwrap_or_default();
            assert!(
                !expr.trim().is_empty(),
                "panel {title:?} target has an expr"
            );
            if expr.contains("mpib_") && !expr.contains("$host") {
                panic!(
                    "panel {title:?} target {} ignores $host: {expr}",
                    target["refId"]
                );
            }
        }
    }
    for kind in ["timeseries", "heatmap", "table"] {
        assert!(kinds.contains(kind), "a {kind} panel");
    }
}

#[test]
fn latency_and_slow_transfer_panels() {
    let dash = load_dashboard();
    let panels = all_panels(&dash);
    // The latency heatmap reads the histogram buckets as a heatmap; p50/p99 are quantiles.
    let exprs: Vec<(String, &Value, &Value)> = panels
        .iter()
        .flat_map(|p| {
            p["targets"]
                .as_array()
                .into_iter()
                .flatten()
                .map(move |t| (p["type"].as_str().unwrap_or_default().to_string(), *p, t))
        })
        .collect();
    assert!(exprs.iter().any(|(kind, _, t)| kind == "heatmap"
        && t["format"] == "heatmap"
        && t["expr"].as_str().unwrap_or_default().contains("_bucket")));
    for q in ["histogram_quantile(0.5,", "histogram_quantile(0.99,"] {
        assert!(
            exprs
                .iter()
                .any(|(_, _, t)| t["expr"].as_str().unwrap_or_default().contains(q)),
            "a {q}...) query"
        );
    }
    // The slow-transfer table links to the traces.
    let slow_table = panels
        .iter()
        .find(|p| {
            p["type"] == "table"
                && p["targets"].as_array().into_iter().flatten().any(|t| {
                    t["expr"]
                        .as_str()
                        .unwrap_or_default()
                        .contains("mpib_slow_transfers_total")
                })
        })
        .expect("a slow-transfer table");
    let links = slow_table["fieldConfig"]["defaults"]["links"]
        .as_array()
        .expect("the slow-transfer table has data links");
    assert!(links.iter().any(|l| l["url"]
        .as_str()
        .is_some_and(|u| u.contains("/explore") && u.contains("${__data.fields.pid}"))));
}

#[test]
fn dashboard_metrics_are_in_the_catalog() {
    let catalog = Catalog::load();
    let dash = load_dashboard();
    let queries = dashboard_queries(&dash);
    assert!(queries.len() >= 20, "only {} queries", queries.len());
    let mut missing = Vec::new();
    let mut used = BTreeSet::new();
    for (place, expr) in &queries {
        let selected = selectors(expr);
        assert!(!selected.is_empty(), "{place}: no metric in {expr:?}");
        for name in selected.keys() {
            if !catalog.has(name) {
                missing.push(format!("{place}: {name}"));
            }
            used.insert(name.clone());
        }
        for label in catalog.unknown_labels(&selected) {
            missing.push(format!("{place}: label {label}"));
        }
    }
    assert!(
        missing.is_empty(),
        "metrics not in the catalog ({}):\n  {}",
        catalog.source,
        missing.join("\n  ")
    );
    eprintln!(
        "dashboard: {} queries, {} metric names, all in {} (label sets known for {} families)",
        queries.len(),
        used.len(),
        catalog.source,
        catalog.labels.len()
    );
}

/// `expr:` and `record:` values of a Prometheus rules file (block scalars included).
fn rule_exprs(yaml: &str) -> (Vec<(String, String)>, BTreeSet<String>) {
    let mut exprs = Vec::new();
    let mut records = BTreeSet::new();
    let mut current = String::from("?");
    let lines: Vec<&str> = yaml.lines().collect();
    let mut k = 0;
    while k < lines.len() {
        let line = lines[k];
        let trimmed = line.trim_start().trim_start_matches("- ");
        let indent = line.len() - line.trim_start().len();
        if let Some(name) = trimmed.strip_prefix("alert:") {
            current = name.trim().to_string();
        } else if let Some(name) = trimmed.strip_prefix("record:") {
            current = name.trim().to_string();
            records.insert(current.clone());
        } else if let Some(value) = trimmed.strip_prefix("expr:") {
            let value = value.trim();
            if value.starts_with('|') || value.starts_with('>') {
                let mut body = String::new();
                while k + 1 < lines.len() {
                    let next = lines[k + 1];
                    let next_indent = next.len() - next.trim_start().len();
                    if !next.trim().is_empty() && next_indent <= indent {
                        break;
                    }
                    body.push_str(next.trim());
                    body.push('\n');
                    k += 1;
                }
                exprs.push((current.clone(), body));
            } else {
                exprs.push((current.clone(), value.trim_matches('\'').to_string()));
            }
        }
        k += 1;
    }
    (exprs, records)
}

#[test]
fn alert_metrics_are_in_the_catalog() {
    let catalog = Catalog::load();
    let path = root().join("dashboards/alerts.yml");
    let text = std::fs::read_to_string(&path).expect("dashboards/alerts.yml");
    let (exprs, records) = rule_exprs(&text);
    for alert in [
        "MpibSrqLowWater",
        "MpibMaskMismatch",
        "MpibErrorCompletions",
        "MpibRailSplitFarFromHint",
        "MpibProtocolErrors",
        "MpibWriterStale",
    ] {
        assert!(
            exprs.iter().any(|(name, _)| name == alert),
            "alert {alert} is defined"
        );
    }
    assert!(!records.is_empty(), "a recording rule");
    let mut missing = Vec::new();
    for (rule, expr) in &exprs {
        let selected = selectors(expr);
        assert!(!selected.is_empty(), "rule {rule}: no metric in {expr:?}");
        for label in catalog.unknown_labels(&selected) {
            missing.push(format!("rule {rule}: label {label}"));
        }
        for name in selected.into_keys() {
            let known = if name.contains(':') {
                records.contains(&name)
            } else {
                catalog.has(&name)
            };
            if !known {
                missing.push(format!("rule {rule}: {name}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "rule metrics not in the catalog ({}) nor recorded:\n  {}",
        catalog.source,
        missing.join("\n  ")
    );
}

fn promtool(args: &[&str]) {
    let dir: &Path = &root();
    let output = Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run `promtool {}`: {e}\n\
                 promtool is in Debian's `prometheus` package: apt-get install -y prometheus \
                 (scripts/test installs it)",
                args.join(" ")
            )
        });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success(),
        "`promtool {}` failed ({}):\n{text}",
        args.join(" "),
        output.status
    );
    eprintln!("promtool {}:\n{text}", args.join(" "));
}

#[test]
fn promtool_checks_and_tests_the_rules() {
    promtool(&["check", "rules", "dashboards/alerts.yml"]);
    promtool(&["test", "rules", "dashboards/alerts_test.yml"]);
}
