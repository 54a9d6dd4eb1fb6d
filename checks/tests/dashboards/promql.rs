//! PromQL scanning for the dashboard lint (`tests/dashboards.rs`): the metric names an
//! expression selects and the label names its matchers use. A lexical scan, not a parser.

use std::collections::{BTreeMap, BTreeSet};

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
pub fn metric_names(expr: &str) -> BTreeSet<String> {
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
pub fn selectors(expr: &str) -> BTreeMap<String, BTreeSet<String>> {
    let chars: Vec<char> = expr.chars().collect();
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '"' | '\'' | '`' => skip_string(&chars, &mut i),
            '{' => skip_group(&chars, &mut i, '{', '}'),
            '[' => skip_group(&chars, &mut i, '[', ']'),
            '#' => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            '$' => {
                i += 1;
                if chars.get(i) == Some(&'{') {
                    skip_group(&chars, &mut i, '{', '}');
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
                identifier(&chars, &mut i, &mut out);
            }
            _ => i += 1,
        }
    }
    out
}

/// The identifier starting at `chars[*i]`: a label list (`by (...)`) is skipped; a function,
/// aggregator or keyword is left out; anything else is a metric name, recorded in `out` with
/// the label names of its matchers (`{...}`), if any. Leaves `*i` past what it consumed.
fn identifier(chars: &[char], i: &mut usize, out: &mut BTreeMap<String, BTreeSet<String>>) {
    let start = *i;
    while *i < chars.len()
        && (chars[*i].is_ascii_alphanumeric() || chars[*i] == '_' || chars[*i] == ':')
    {
        *i += 1;
    }
    let word: String = chars[start..*i].iter().collect();
    let mut j = *i;
    while j < chars.len() && chars[j].is_whitespace() {
        j += 1;
    }
    let next = chars.get(j).copied();
    if LABEL_LISTS.contains(&word.as_str()) {
        if next == Some('(') {
            *i = j;
            skip_group(chars, i, '(', ')');
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
            *i = j;
            skip_group(chars, i, '{', '}');
            let body: String = chars[open + 1..(*i).saturating_sub(1)].iter().collect();
            labels.extend(matcher_labels(&body));
        }
    }
}

/// Skips the quoted string starting at `chars[*i]` (backslash escapes, except in backquotes).
fn skip_string(chars: &[char], i: &mut usize) {
    let quote = chars[*i];
    *i += 1;
    while *i < chars.len() && chars[*i] != quote {
        if chars[*i] == '\\' && quote != '`' {
            *i += 1;
        }
        *i += 1;
    }
    *i += 1;
}

/// Skips the `open`...`close` group starting at `chars[*i]` (nested groups and strings in it).
fn skip_group(chars: &[char], i: &mut usize, open: char, close: char) {
    let mut depth = 0;
    while *i < chars.len() {
        match chars[*i] {
            '"' | '\'' | '`' => {
                skip_string(chars, i);
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
}
