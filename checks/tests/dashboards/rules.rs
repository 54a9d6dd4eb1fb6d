//! The Prometheus rules file (`dashboards/alerts.yml`) for the dashboard lint
//! (`tests/dashboards.rs`): its `expr:`/`record:` values, and running `promtool` on it.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

/// `expr:` and `record:` values of a Prometheus rules file (block scalars included).
pub fn rule_exprs(yaml: &str) -> (Vec<(String, String)>, BTreeSet<String>) {
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

pub fn promtool(args: &[&str]) {
    let dir: &Path = &crate::root();
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
