//! What a case's processes said: the lines `mpib-xfer` and `mpib-ranks` print (one `ok` line per
//! case passed, `FAILED` with the reason, the slowest calls at the end, the plugin's WARNs),
//! read back after the processes ended so that a verdict names what each side saw.

use std::path::Path;

/// One process's log, read whole (lossy: a log is text, a stray byte must not hide the rest).
#[derive(Clone, Debug, Default)]
pub struct Log {
    text: String,
}

/// A slowest call as `mpib-xfer` reports it: "slowest connection call: accept 41.2 ms (...)".
#[derive(Clone, Debug, PartialEq)]
pub struct Slowest {
    /// The call's name.
    pub call: String,
    /// How long it took.
    pub milliseconds: f64,
}

impl Log {
    /// Reads `path`; a missing log reads as empty (the process never started, said elsewhere).
    pub fn read(path: &Path) -> Log {
        let bytes = std::fs::read(path).unwrap_or_default();
        Log {
            text: String::from_utf8_lossy(&bytes).into_owned(),
        }
    }

    /// A log from text (tests).
    pub fn from_text(text: &str) -> Log {
        Log {
            text: text.to_string(),
        }
    }

    /// Every line.
    pub fn text_lines(&self) -> impl Iterator<Item = &str> {
        self.text.lines()
    }

    /// The lines containing `needle`.
    pub fn lines_with<'a>(&'a self, needle: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.text.lines().filter(move |line| line.contains(needle))
    }

    /// How many lines contain `needle`.
    pub fn count(&self, needle: &str) -> usize {
        self.lines_with(needle).count()
    }

    /// Whether a line contains `needle`.
    pub fn has(&self, needle: &str) -> bool {
        self.lines_with(needle).next().is_some()
    }

    /// Whether a line contains `first` and, after it, `then`.
    pub fn has_in_order(&self, first: &str, then: &str) -> bool {
        self.text.lines().any(|line| {
            line.find(first)
                .is_some_and(|at| line[at + first.len()..].contains(then))
        })
    }

    /// Cases the process passed (`: ok ` lines).
    pub fn cases_passed(&self) -> usize {
        self.count(": ok ")
    }

    /// The first `FAILED` line, which says why a process failed.
    pub fn failure(&self) -> Option<&str> {
        self.lines_with("FAILED").next()
    }

    /// The first "returned ncclSomethingError" a process logged: the error the plugin gave.
    pub fn nccl_error(&self) -> Option<String> {
        self.text.lines().find_map(|line| {
            let at = line.find("returned nccl")?;
            let word: String = line[at + "returned ".len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric())
                .collect();
            word.ends_with("Error").then(|| format!("returned {word}"))
        })
    }

    /// The slowest call of a kind (`label`: "slowest call", "slowest connection call", "slowest
    /// data call").
    pub fn slowest(&self, label: &str) -> Option<Slowest> {
        let needle = format!(": {label}: ");
        self.lines_with(&needle)
            .filter_map(|line| {
                let rest = &line[line.find(&needle)? + needle.len()..];
                let mut words = rest.split_whitespace();
                let call = words.next()?.to_string();
                let milliseconds = words.next()?.parse().ok()?;
                Some(Slowest { call, milliseconds })
            })
            .max_by(|a, b| a.milliseconds.total_cmp(&b.milliseconds))
    }

    /// The bytes per rail that the `ok` lines report: (cases, SOUT bytes, SUP bytes).
    pub fn rails(&self) -> (usize, u64, u64) {
        let (mut cases, mut sout, mut sup) = (0, 0u64, 0u64);
        for line in self
            .lines_with(": ok ")
            .filter(|l| l.contains("rails SOUT"))
        {
            cases += 1;
            let words: Vec<&str> = line.split_whitespace().collect();
            for pair in words.windows(2) {
                let value = pair[1].parse::<u64>().unwrap_or(0);
                match pair[0] {
                    "SOUT" => sout += value,
                    "SUP" => sup += value,
                    _ => {}
                }
            }
        }
        (cases, sout, sup)
    }

    /// "N case(s), rails SOUT x B / SUP y B", or "no case".
    pub fn rails_summary(&self) -> String {
        match self.rails() {
            (0, _, _) => "no case".to_string(),
            (cases, sout, sup) => format!("{cases} case(s), rails SOUT {sout} B / SUP {sup} B"),
        }
    }

    /// The last `count` lines.
    pub fn tail(&self, count: usize) -> Vec<&str> {
        let lines: Vec<&str> = self.text.lines().collect();
        lines[lines.len().saturating_sub(count)..].to_vec()
    }
}

/// The slowest of `label` over several processes' logs, with the process it came from.
pub fn slowest_of(label: &str, logs: &[(&str, &Log)]) -> Option<(Slowest, String)> {
    logs.iter()
        .filter_map(|(who, log)| log.slowest(label).map(|s| (s, who.to_string())))
        .max_by(|a, b| a.0.milliseconds.total_cmp(&b.0.milliseconds))
}

/// "accept 41.2 ms (host B)", or "none".
pub fn describe_slowest(slowest: &Option<(Slowest, String)>) -> String {
    match slowest {
        Some((s, who)) => format!("{} {} ms ({who})", s.call, s.milliseconds),
        None => "none".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SENDER: &str = "\
mpib-xfer[send v12]: ok sizes: 12 transfers, rails SOUT 100 B SUP 28 B
mpib-xfer[send v12]: ok sizes: 12 transfers, rails SOUT 1 B SUP 2 B
mpib-xfer[send v12]: isend returned ncclRemoteError: the sup rail (veth_a1) QP 7
mpib-xfer[send v12]: slowest connection call: accept 41.2 ms (of 1 accept calls)
mpib-xfer[send v12]: slowest connection call: close 3.5 ms (of 2 close calls)
mpib-xfer[send v12]: FAILED split-512: isend
";

    #[test]
    fn reads_what_mpib_xfer_reports() {
        let log = Log::from_text(SENDER);
        assert_eq!(log.cases_passed(), 2);
        assert_eq!(log.rails(), (2, 101, 30));
        assert_eq!(
            log.nccl_error().as_deref(),
            Some("returned ncclRemoteError")
        );
        let slowest = log.slowest("slowest connection call").unwrap();
        assert_eq!(
            (slowest.call.as_str(), slowest.milliseconds),
            ("accept", 41.2)
        );
        assert!(log.failure().unwrap().contains("split-512"));
        assert!(log.has_in_order("sup rail", "QP"));
        assert!(!log.has_in_order("QP", "sup rail"));
    }

    #[test]
    fn the_slowest_of_several_names_its_process() {
        let (a, b) = (Log::from_text(SENDER), Log::default());
        let found = slowest_of("slowest connection call", &[("host B", &b), ("host A", &a)]);
        assert_eq!(describe_slowest(&found), "accept 41.2 ms (host A)");
        assert_eq!(describe_slowest(&None), "none");
    }
}
