//! The Prometheus text exposition format (version 0.0.4), written one way for both of the
//! node's endpoints: the collector's `/metrics` and the agent's.
//!
//! The rules are those of the format's specification: a family's `# HELP` and `# TYPE` lines
//! come once, before its samples; `\`, `"` and newline are escaped in label values, `\` and
//! newline in help text; non-finite values are written `NaN`, `+Inf` and `-Inf`.

use std::fmt::Write as _;

/// The `Content-Type` of a reply in this format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// How a family behaves: its `# TYPE` word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Monotonic.
    Counter,
    /// Goes up and down.
    Gauge,
    /// A classic histogram: cumulative `_bucket` samples with an `le` label, `_sum`, `_count`.
    Histogram,
}

impl Kind {
    /// The `# TYPE` word.
    pub const fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// A sample's value: a count written as an integer, or a float.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Number {
    /// Written in decimal, exactly.
    Integer(u64),
    /// Written as Rust's shortest round-trip form, or `NaN`, `+Inf`, `-Inf`.
    Float(f64),
}

/// A float as the format writes it (also an `le` bound).
pub fn float_text(value: f64) -> String {
    if value.is_nan() {
        "NaN".to_owned()
    } else if value.is_infinite() {
        if value > 0.0 { "+Inf" } else { "-Inf" }.to_owned()
    } else {
        format!("{value}")
    }
}

/// `value` escaped: backslash and newline, and the double quote when `quote` (a label value).
fn escape(value: &str, quote: bool) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' if quote => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// An exposition being written.
#[derive(Debug, Default)]
pub struct Text {
    out: String,
}

impl Text {
    /// An empty exposition.
    pub fn new() -> Text {
        Text::default()
    }

    /// Start family `name`: its `# HELP` and `# TYPE` lines.
    pub fn family(&mut self, name: &str, kind: Kind, help: &str) {
        let help = escape(help, false);
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {}", kind.as_str());
    }

    /// One sample of the family last started: `name` (with a histogram's `_bucket`, `_sum` or
    /// `_count` suffix, else empty), its `(name, value)` labels in order, and its value.
    pub fn sample<'a, L>(&mut self, name: &str, suffix: &str, labels: L, value: Number)
    where
        L: IntoIterator<Item = (&'a str, &'a str)>,
    {
        self.out.push_str(name);
        self.out.push_str(suffix);
        let mut first = true;
        for (label, label_value) in labels {
            self.out.push(if first { '{' } else { ',' });
            first = false;
            let _ = write!(self.out, "{label}=\"{}\"", escape(label_value, true));
        }
        if !first {
            self.out.push('}');
        }
        let _ = match value {
            Number::Integer(n) => writeln!(self.out, " {n}"),
            Number::Float(x) => writeln!(self.out, " {}", float_text(x)),
        };
    }

    /// The text written.
    pub fn finish(self) -> String {
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_samples_and_escapes() {
        let mut text = Text::new();
        text.family("mpib_x_total", Kind::Counter, "Bytes \\ sent\nper rail.");
        text.sample(
            "mpib_x_total",
            "",
            [("host", "a\"b\\c\nd"), ("rail", "sout")],
            Number::Integer(u64::MAX),
        );
        text.family("mpib_y", Kind::Gauge, "A gauge.");
        text.sample("mpib_y", "", [], Number::Float(0.5));
        text.sample("mpib_y", "", [("k", "v")], Number::Float(f64::NAN));
        text.sample("mpib_y", "", [("k", "w")], Number::Float(f64::INFINITY));
        text.sample("mpib_y", "", [("k", "z")], Number::Float(-f64::INFINITY));
        text.sample("mpib_y", "_count", [("k", "z")], Number::Float(3.0));
        let want = "# HELP mpib_x_total Bytes \\\\ sent\\nper rail.\n\
                    # TYPE mpib_x_total counter\n\
                    mpib_x_total{host=\"a\\\"b\\\\c\\nd\",rail=\"sout\"} 18446744073709551615\n\
                    # HELP mpib_y A gauge.\n\
                    # TYPE mpib_y gauge\n\
                    mpib_y 0.5\n\
                    mpib_y{k=\"v\"} NaN\n\
                    mpib_y{k=\"w\"} +Inf\n\
                    mpib_y{k=\"z\"} -Inf\n\
                    mpib_y_count{k=\"z\"} 3\n";
        assert_eq!(text.finish(), want);
    }

    #[test]
    fn floats_round_trip() {
        assert_eq!(float_text(0.0), "0");
        assert_eq!(float_text(1e-9), "0.000000001");
        assert_eq!(float_text(0.000_002_047), "0.000002047");
    }
}
