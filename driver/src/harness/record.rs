//! One record per case: printed as `PASS name: detail` / `FAIL name: why` (with the last lines
//! of each process's log on a failure) and appended to `results.jsonl` in the run's log
//! directory, one JSON object per line, for whatever reads results after the run.

use std::fmt::Write as _;
use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};

use super::logs::Log;

/// A case's outcome.
#[derive(Clone, Debug)]
pub struct Record {
    /// The case's name.
    pub case: String,
    /// Whether it passed.
    pub passed: bool,
    /// What it measured, or why it failed.
    pub detail: String,
    /// How long it ran.
    pub seconds: f64,
    /// Its log directory.
    pub logs: PathBuf,
    /// Logs to show the tail of on a failure: (who, path).
    pub show: Vec<(String, PathBuf)>,
}

/// The run's records: counts, the JSON lines file and the plain `results` file.
pub struct Results {
    topology: String,
    json: Option<File>,
    text: Option<File>,
    /// Cases passed.
    pub passed: usize,
    /// Cases failed.
    pub failed: usize,
}

/// `text` as a JSON string literal.
pub fn json_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

impl Record {
    /// The record as one JSON object.
    pub fn to_json(&self, topology: &str) -> String {
        format!(
            "{{\"topology\":{},\"case\":{},\"verdict\":\"{}\",\"seconds\":{:.1},\"detail\":{},\"logs\":{}}}",
            json_string(topology),
            json_string(&self.case),
            if self.passed { "pass" } else { "fail" },
            self.seconds,
            json_string(&self.detail),
            json_string(&self.logs.display().to_string()),
        )
    }
}

impl Results {
    /// Records go to `work/results.jsonl` and `work/results` (both started empty).
    pub fn new(topology: &str, work: &Path) -> Results {
        let open = |name: &str| {
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(work.join(name))
                .ok()
        };
        Results {
            topology: topology.to_string(),
            json: open("results.jsonl"),
            text: open("results"),
            passed: 0,
            failed: 0,
        }
    }

    /// Prints and stores one record.
    pub fn add(&mut self, record: &Record) {
        let verdict = if record.passed { "PASS" } else { "FAIL" };
        let line = format!("{verdict} {}: {}", record.case, record.detail);
        println!("{line}");
        if !record.passed {
            for (who, path) in &record.show {
                println!("  --- {who} (last 15 lines of {})", path.display());
                for tail in Log::read(path).tail(15) {
                    println!("  | {tail}");
                }
            }
        }
        if let Some(file) = self.text.as_mut() {
            let _ = writeln!(file, "{line}");
        }
        if let Some(file) = self.json.as_mut() {
            let _ = writeln!(file, "{}", record.to_json(&self.topology));
        }
        if record.passed {
            self.passed += 1;
        } else {
            self.failed += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_json_objects_with_escaped_text() {
        let record = Record {
            case: "v12 \"quoted\"".into(),
            passed: false,
            detail: "line\nnext\u{1}".into(),
            seconds: 1.26,
            logs: PathBuf::from("/tmp/x"),
            show: Vec::new(),
        };
        assert_eq!(
            record.to_json("bed"),
            r#"{"topology":"bed","case":"v12 \"quoted\"","verdict":"fail","seconds":1.3,"detail":"line\nnext\u0001","logs":"/tmp/x"}"#
        );
    }
}
