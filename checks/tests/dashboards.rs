//! Lint of `dashboards/` without a Grafana or Prometheus server: the dashboard's shape (stable
//! uid, `$datasource` everywhere, the template variables), every metric name its PromQL uses
//! and every metric name the alert rules use is in the collector's or the policy agent's
//! catalog (and every label a selector matches on is one of that family's labels), and the
//! rules pass `promtool check rules` and their unit tests (`promtool test rules`).
//!
//! The catalog is the crates' own: `mpib_collector::catalog::families()` (the probes files'
//! declared values included) and `mpib_agent::catalog::CATALOG`, names and labels.
//!
//! promtool comes from Debian's `prometheus` package (`scripts/test` installs it). The live
//! check against a real Prometheus scraping the collector is `dashboards/e2e/run.sh`.
//!
//! The helpers live under `dashboards/`: `catalog.rs` (the catalog), `promql.rs` (metric and
//! label extraction), `grafana.rs` (the dashboard JSON) and `rules.rs` (the rules file and
//! promtool).
#![allow(clippy::unwrap_used, clippy::expect_used)] // A failed unwrap fails the test, with its message.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use serde_json::Value;

#[path = "dashboards/catalog.rs"]
mod catalog;
#[path = "dashboards/grafana.rs"]
mod grafana;
#[path = "dashboards/promql.rs"]
mod promql;
#[path = "dashboards/rules.rs"]
mod rules;

use catalog::Catalog;
use grafana::{
    all_panels, dashboard_queries, load_dashboard, uses_datasource_variable, variable_promql,
    variable_query, variables,
};
use promql::{metric_names, selectors};
use rules::{promtool, rule_exprs};

/// The repository (this crate is `checks/` in it).
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
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
        "MpibRailFailedOver",
        "MpibRailSplitFarFromHint",
        "MpibProtocolErrors",
        "MpibWriterStale",
        "MpibAgentSlotsShort",
        "MpibAgentSlotsExhausted",
        "MpibAgentTelemetryStale",
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

#[test]
fn promtool_checks_and_tests_the_rules() {
    promtool(&["check", "rules", "dashboards/alerts.yml"]);
    promtool(&["test", "rules", "dashboards/alerts_test.yml"]);
}
