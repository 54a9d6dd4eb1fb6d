//! The table (nccl-tests/perftest style), JSON lines and CSV, plus the progress line.
//!
//! Human text (the header, notes) goes to stdout with the table and to stderr with `--json` or
//! `--csv`, so that stdout then holds only machine data: with `--json` one object per row per
//! line, with `--csv` a column line then one line per row. Both carry the same fields:
//!
//! `sup_bw` (the block's SUP share, null/empty without `--sup-bw`), `size` (bytes per message),
//! `count` (timed iterations), `group`, `window`, `bytes` (payload moved in the timed pass),
//! `time_us`, `gbps` (bytes / time / 1e9), `mmsg_s` (messages per µs), `p50_us` and `p99_us`
//! (isend post to completion, sender), `recv_p50_us` and `recv_p99_us` (irecv post to
//! completion, receiver), `sout_bytes` and `sup_bytes` (what each rail carried, from MPIB's
//! probes file; null/empty for other plugins or `MPIB_PROBES=0`), `sup_share` (SUP bytes / total
//! in parts per 1024) and `verified` (every byte checked).

use std::cell::RefCell;
use std::io::Write;
use std::time::Duration;

use crate::args::Format;
use crate::sweep::RowSpec;

/// One measured row.
#[derive(Clone, Debug)]
pub struct Row {
    pub split: Option<u32>,
    pub size: usize,
    pub iters: u64,
    pub group: usize,
    pub window: usize,
    pub bytes: u64,
    pub elapsed: Duration,
    pub send_p50: Duration,
    pub send_p99: Duration,
    pub recv_p50: Duration,
    pub recv_p99: Duration,
    /// (SOUT, SUP) bytes.
    pub rails: Option<(u64, u64)>,
    pub verified: bool,
    /// End of the timed pass, since the first row started.
    pub at: Duration,
    /// The same moment on the wall clock, since the Unix epoch: rows of several processes
    /// line up on it (each process's `at` counts from its own first row).
    pub unix: Duration,
}

impl Row {
    fn seconds(&self) -> f64 {
        self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Bytes per second / 1e9.
    pub fn gbps(&self) -> f64 {
        self.bytes as f64 / self.seconds() / 1e9
    }

    /// Messages per second / 1e6.
    pub fn mmsg(&self) -> f64 {
        (self.iters as f64 * self.group as f64) / self.seconds() / 1e6
    }

    /// SUP bytes / total, in parts per 1024 (`None` without rail numbers or bytes).
    pub fn sup_share(&self) -> Option<f64> {
        let (sout, sup) = self.rails?;
        let total = sout + sup;
        (total > 0).then(|| sup as f64 * 1024.0 / total as f64)
    }
}

/// A field value for JSON and CSV.
enum Value {
    Int(u64),
    Float(f64, usize),
    Null,
    Bool(bool),
}

fn us(d: Duration) -> Value {
    Value::Float(d.as_secs_f64() * 1e6, 3)
}

fn fields(row: &Row) -> Vec<(&'static str, Value)> {
    let opt = |v: Option<u64>| v.map_or(Value::Null, Value::Int);
    vec![
        ("sup_bw", opt(row.split.map(u64::from))),
        ("size", Value::Int(row.size as u64)),
        ("count", Value::Int(row.iters)),
        ("group", Value::Int(row.group as u64)),
        ("window", Value::Int(row.window as u64)),
        ("bytes", Value::Int(row.bytes)),
        ("time_us", us(row.elapsed)),
        ("gbps", Value::Float(row.gbps(), 6)),
        ("mmsg_s", Value::Float(row.mmsg(), 6)),
        ("p50_us", us(row.send_p50)),
        ("p99_us", us(row.send_p99)),
        ("recv_p50_us", us(row.recv_p50)),
        ("recv_p99_us", us(row.recv_p99)),
        ("sout_bytes", opt(row.rails.map(|r| r.0))),
        ("sup_bytes", opt(row.rails.map(|r| r.1))),
        (
            "sup_share",
            row.sup_share().map_or(Value::Null, |s| Value::Float(s, 1)),
        ),
        ("verified", Value::Bool(row.verified)),
        ("at_ms", Value::Float(row.at.as_secs_f64() * 1e3, 1)),
        ("unix_ms", Value::Float(row.unix.as_secs_f64() * 1e3, 1)),
    ]
}

fn render(value: &Value, null: &str) -> String {
    match value {
        Value::Int(v) => v.to_string(),
        Value::Float(v, places) => format!("{v:.places$}"),
        Value::Null => null.to_string(),
        Value::Bool(b) => b.to_string(),
    }
}

/// The JSON line of a row.
pub fn json(row: &Row) -> String {
    let body: Vec<String> = fields(row)
        .iter()
        .map(|(k, v)| format!("\"{k}\":{}", render(v, "null")))
        .collect();
    format!("{{{}}}", body.join(","))
}

/// The CSV column line.
pub fn csv_header() -> String {
    let names: Vec<&str> = fields(&Row::empty()).iter().map(|(k, _)| *k).collect();
    names.join(",")
}

/// The CSV line of a row.
pub fn csv(row: &Row) -> String {
    let values: Vec<String> = fields(row).iter().map(|(_, v)| render(v, "")).collect();
    values.join(",")
}

impl Row {
    fn empty() -> Row {
        Row {
            split: None,
            size: 0,
            iters: 0,
            group: 1,
            window: 1,
            bytes: 0,
            elapsed: Duration::ZERO,
            send_p50: Duration::ZERO,
            send_p99: Duration::ZERO,
            recv_p50: Duration::ZERO,
            recv_p99: Duration::ZERO,
            rails: None,
            verified: false,
            at: Duration::ZERO,
            unix: Duration::ZERO,
        }
    }
}

const COLUMNS: &str =
    "#          size    count       GB/s     Mmsg/s    p50 us    p99 us       SOUT bytes        SUP bytes  SUP/1024";

fn table_line(row: &Row) -> String {
    let rail = |v: Option<u64>| v.map_or_else(|| "-".to_string(), |v| v.to_string());
    let share = row
        .sup_share()
        .map_or_else(|| "-".to_string(), |s| format!("{s:.0}"));
    format!(
        "{:>15} {:>8} {:>10.3} {:>10.4} {:>9.2} {:>9.2} {:>16} {:>16} {:>9}",
        row.size,
        row.iters,
        row.gbps(),
        row.mmsg(),
        row.send_p50.as_secs_f64() * 1e6,
        row.send_p99.as_secs_f64() * 1e6,
        rail(row.rails.map(|r| r.0)),
        rail(row.rails.map(|r| r.1)),
        share
    )
}

/// Writes rows and notes in the chosen format, with a progress line on a terminal. Output
/// errors never panic (`println!` would, e.g. on a closed pipe): the first one on stdout is kept,
/// ends the sweep ([`Printer::row`] fails) and is reported by [`Printer::broken`].
pub struct Printer {
    format: Format,
    progress: bool,
    block: Option<Option<u32>>,
    broken: RefCell<Option<String>>,
}

/// Whether stderr is a terminal (then, and only then, a progress line is drawn).
fn stderr_is_terminal() -> bool {
    // SAFETY: isatty only inspects the descriptor.
    unsafe { libc::isatty(2) == 1 }
}

/// Writes to stderr, ignoring failures (there is nowhere left to report them).
pub fn to_stderr(text: &str) {
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(text.as_bytes()).and_then(|()| err.flush());
}

impl Printer {
    /// A printer for `format`.
    pub fn new(format: Format) -> Printer {
        Printer {
            format,
            progress: stderr_is_terminal(),
            block: None,
            broken: RefCell::new(None),
        }
    }

    /// The first failed write to stdout, if any.
    pub fn broken(&self) -> Option<String> {
        self.broken.borrow().clone()
    }

    fn out(&self, text: &str) -> Result<(), String> {
        if let Some(e) = self.broken() {
            return Err(e);
        }
        let mut out = std::io::stdout().lock();
        let written = out.write_all(text.as_bytes()).and_then(|()| out.flush());
        written.map_err(|e| {
            let message = format!("writing to stdout: {e}");
            *self.broken.borrow_mut() = Some(message.clone());
            message
        })
    }

    /// Human text: stdout with the table, stderr with machine formats.
    pub fn note(&self, text: &str) {
        self.clear_progress();
        if self.format == Format::Table {
            let _ = self.out(&format!("{text}\n"));
        } else {
            to_stderr(&format!("{text}\n"));
        }
    }

    /// The header lines (each prefixed with `# ` in the table), then the CSV column line.
    pub fn header(&self, lines: &[String]) {
        for line in lines {
            self.note(&format!("# {line}"));
        }
        if self.format == Format::Csv {
            let _ = self.out(&format!("{}\n", csv_header()));
        }
    }

    /// Shows which row runs now (stderr, terminal only).
    pub fn progress(&self, spec: &RowSpec, total: usize) {
        if self.progress {
            let split = spec
                .split
                .map_or_else(String::new, |s| format!("sup_bw {s}, "));
            to_stderr(&format!(
                "\r\x1b[K[{}/{total}] {split}size {} x {} iterations",
                spec.index + 1,
                spec.size,
                spec.iters
            ));
        }
    }

    fn clear_progress(&self) {
        if self.progress {
            to_stderr("\r\x1b[K");
        }
    }

    /// One row (with a block heading in the table when the split changes); fails once stdout
    /// is gone, to end the sweep.
    pub fn row(&mut self, row: &Row) -> Result<(), String> {
        self.clear_progress();
        let mut text = String::new();
        match self.format {
            Format::Table => {
                if self.block != Some(row.split) {
                    let heading = match row.split {
                        Some(s) => format!("sup_bw {s} (advanced mode: the test agent's share)"),
                        None => "the plugin's environment as given".to_string(),
                    };
                    if self.block.is_some() {
                        text.push('\n');
                    }
                    text += &format!("# {heading}\n{COLUMNS}\n");
                    self.block = Some(row.split);
                }
                text += &table_line(row);
            }
            Format::Json => text += &json(row),
            Format::Csv => text += &csv(row),
        }
        text.push('\n');
        self.out(&text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_and_csv_carry_the_same_fields() {
        let row = Row {
            split: Some(512),
            size: 1 << 20,
            iters: 10,
            bytes: 10 << 20,
            elapsed: Duration::from_millis(1),
            rails: Some((5 << 20, 5 << 20)),
            verified: true,
            ..Row::empty()
        };
        let line = json(&row);
        assert!(
            line.starts_with("{\"sup_bw\":512,\"size\":1048576,"),
            "{line}"
        );
        assert!(line.contains("\"gbps\":10.485760,"), "{line}");
        assert!(
            line.contains("\"sup_share\":512.0,\"verified\":true,\"at_ms\":0.0,\"unix_ms\":0.0}"),
            "{line}"
        );
        let header = csv_header();
        assert_eq!(header.split(',').count(), csv(&row).split(',').count());
        let none = Row {
            rails: None,
            split: None,
            ..row
        };
        assert!(json(&none).contains("\"sup_bw\":null"));
        assert!(csv(&none).starts_with(",1048576,"));
        assert_eq!(table_line(&none).split_whitespace().nth(6), Some("-"));
    }
}
