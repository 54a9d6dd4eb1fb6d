//! Walking the Grafana dashboard JSON (`dashboards/mpib.json`) for the dashboard lint
//! (`tests/dashboards.rs`): panels (rows' children included), template variables, datasources,
//! and the PromQL of every panel target and query variable.

use serde_json::Value;

/// The PromQL inside a Grafana Prometheus variable query: `label_values(expr, label)` gives
/// `expr`, `label_values(label)` gives nothing; `query_result(expr)` gives `expr`.
pub fn variable_promql(query: &str) -> Option<String> {
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

pub fn load_dashboard() -> Value {
    let path = crate::root().join("dashboards/mpib.json");
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

/// Every panel, rows' collapsed children included.
pub fn all_panels(dash: &Value) -> Vec<&Value> {
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

pub fn variables(dash: &Value) -> &Vec<Value> {
    dash["templating"]["list"]
        .as_array()
        .expect("templating.list is an array")
}

pub fn variable_query(var: &Value) -> String {
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

pub fn uses_datasource_variable(ds: &Value) -> bool {
    let uid = match ds {
        Value::String(s) => s.as_str(),
        Value::Object(o) => o.get("uid").and_then(Value::as_str).unwrap_or_default(),
        _ => "",
    };
    uid == "${datasource}" || uid == "$datasource"
}

/// (where, PromQL) of every panel target and every query variable.
pub fn dashboard_queries(dash: &Value) -> Vec<(String, String)> {
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
