//! The sweep both sides run: the sizes, the SUP shares, the iteration counts and the buffer
//! layout. The sender decides it (from its flags) and ships it to the receiver as text, so the
//! receiver of a two-process run needs no repeated arguments and the two can never disagree on
//! which message comes next.

use std::fmt::Write as _;

/// Upper bound on the number of sizes in one sweep (a step factor of 1.0001 would make millions).
pub const MAX_SIZES: usize = 4096;
/// Without `--iters`, each row moves about this many bytes (at least [`MIN_AUTO_ITERS`], at most
/// [`MAX_AUTO_ITERS`] iterations): enough samples for a p99 on small messages, and large ones
/// still finish in about a second.
const AUTO_BYTES: u64 = 256 << 20;
const MIN_AUTO_ITERS: u64 = 20;
const MAX_AUTO_ITERS: u64 = 1000;
/// Buffers are laid out at this alignment (a page: what registration pins anyway).
const ALIGN: usize = 4096;
/// Most messages one pass may move (`iters × group`, and `warmup × group`): every message costs
/// about 40 bytes of bookkeeping, so a huge count from the flags or from the peer is refused
/// instead of aborting the process on allocation.
pub const MAX_PASS_MESSAGES: u64 = 1_000_000;
/// The largest window either side accepts.
pub const MAX_WINDOW: usize = 1024;
/// The wire protocol of the parameters (and of `link.rs`'s frames).
pub const PROTOCOL: &str = "mpib-perf/1";

/// What both sides agree on before the first message.
#[derive(Clone, Debug, PartialEq)]
pub struct Sweep {
    /// Message sizes, in order.
    pub sizes: Vec<usize>,
    /// One table block per entry: `Some(sup_bw)` (advanced mode, test agent) or `None` (the
    /// environment as given).
    pub splits: Vec<Option<u32>>,
    /// Timed iterations per row; `None`: chosen per size (see [`Sweep::iters_for`]).
    pub iters: Option<u64>,
    /// Untimed iterations before each row.
    pub warmup: u64,
    /// Requests in flight per direction.
    pub window: usize,
    /// Buffers per `irecv` (the sender does this many `isend`s per iteration).
    pub group: usize,
    /// Fill a pattern per message and check every byte on the receiver.
    pub verify: bool,
    /// Rows per size (a time series when > 1: watch a policy agent move the split).
    pub repeat: usize,
}

/// One row of the table: a size within a split block.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowSpec {
    /// Position in the sweep (both sides derive the message seeds from it).
    pub index: usize,
    /// The block's SUP share.
    pub split: Option<u32>,
    /// Bytes per message.
    pub size: usize,
    /// Timed iterations.
    pub iters: u64,
}

/// The sizes `min`, `min * factor`, … up to `max` (like nccl-tests: `max` is included only when
/// a step lands on it). A step always grows by at least one byte, and 0 is followed by 1. Stops
/// after [`MAX_SIZES`] + 1 sizes, so the caller can tell a sweep that is too long.
pub fn sizes(min: usize, max: usize, factor: f64) -> Vec<usize> {
    let mut out = Vec::new();
    let mut size = min;
    while size <= max && out.len() <= MAX_SIZES {
        out.push(size);
        let next = (size as f64 * factor).floor();
        let next = if next >= usize::MAX as f64 {
            usize::MAX
        } else {
            next as usize
        };
        size = next.max(size.saturating_add(1));
        if size == usize::MAX {
            break;
        }
    }
    out
}

fn align_up(value: usize) -> usize {
    value.div_ceil(ALIGN).saturating_mul(ALIGN)
}

impl Sweep {
    /// Timed iterations for `size`: `--iters`, or about [`AUTO_BYTES`] per row.
    pub fn iters_for(&self, size: usize) -> u64 {
        self.iters.unwrap_or_else(|| {
            let per_iteration = (size as u64).saturating_mul(self.group as u64).max(1);
            (AUTO_BYTES / per_iteration).clamp(MIN_AUTO_ITERS, MAX_AUTO_ITERS)
        })
    }

    /// Every row, block by block.
    pub fn rows(&self) -> Vec<RowSpec> {
        let mut rows = Vec::with_capacity(self.splits.len() * self.sizes.len());
        for &split in &self.splits {
            for &size in &self.sizes {
                for _ in 0..self.repeat.max(1) {
                    rows.push(RowSpec {
                        index: rows.len(),
                        split,
                        size,
                        iters: self.iters_for(size),
                    });
                }
            }
        }
        rows
    }

    /// Refuses counts whose bookkeeping would not fit ([`MAX_PASS_MESSAGES`]); the error names the
    /// count.
    pub fn check_counts(&self) -> Result<(), String> {
        let group = self.group as u64;
        for (name, count) in [("iters", self.iters.unwrap_or(0)), ("warmup", self.warmup)] {
            if count.saturating_mul(group) > MAX_PASS_MESSAGES {
                return Err(format!(
                    "{name} {count} with group {group}: more than {MAX_PASS_MESSAGES} messages in one pass"
                ));
            }
        }
        Ok(())
    }

    /// The largest size.
    pub fn max_size(&self) -> usize {
        self.sizes.iter().copied().max().unwrap_or(0)
    }

    /// Distance between two buffers.
    pub fn stride(&self) -> usize {
        align_up(self.max_size().max(1))
    }

    /// Receive slots: one per request in flight when verifying (each message keeps its bytes
    /// until checked), else one shared by all (bandwidth needs no distinct bytes; perftest
    /// does the same). Each slot holds `group` buffers.
    pub fn recv_slots(&self) -> usize {
        if self.verify {
            self.window
        } else {
            1
        }
    }

    /// Send slots (one buffer each), as [`Sweep::recv_slots`].
    pub fn send_slots(&self) -> usize {
        if self.verify {
            self.window
        } else {
            1
        }
    }

    /// Bytes of receive region.
    pub fn recv_len(&self) -> usize {
        self.recv_slots()
            .saturating_mul(self.group)
            .saturating_mul(self.stride())
    }

    /// Bytes of send region (grouped sends of one iteration use distinct buffers when verifying).
    pub fn send_len(&self) -> usize {
        let buffers = if self.verify {
            self.send_slots()
        } else {
            self.group
        };
        buffers.saturating_mul(self.stride())
    }

    /// The text the sender ships (`key=value` lines).
    pub fn encode(&self) -> String {
        let join = |items: Vec<String>| items.join(",");
        let splits = if self.splits == [None] {
            "env".to_string()
        } else {
            join(
                self.splits
                    .iter()
                    .map(|s| s.map_or_else(|| "env".into(), |v| v.to_string()))
                    .collect(),
            )
        };
        let mut text = String::new();
        let _ = writeln!(text, "protocol={PROTOCOL}");
        let _ = writeln!(
            text,
            "sizes={}",
            join(self.sizes.iter().map(|s| s.to_string()).collect())
        );
        let _ = writeln!(text, "splits={splits}");
        let iters = self.iters.map_or_else(|| "auto".into(), |n| n.to_string());
        let _ = writeln!(text, "iters={iters}");
        let _ = writeln!(text, "warmup={}", self.warmup);
        let _ = writeln!(text, "window={}", self.window);
        let _ = writeln!(text, "group={}", self.group);
        let _ = writeln!(text, "verify={}", u8::from(self.verify));
        let _ = writeln!(text, "repeat={}", self.repeat);
        text
    }

    /// Parses [`Sweep::encode`]'s text; errors name the field.
    pub fn decode(text: &str) -> Result<Sweep, String> {
        let fields = Fields::parse(text)?;
        let protocol = fields.get("protocol")?;
        if protocol != PROTOCOL {
            return Err(format!(
                "the peer speaks {protocol:?}, this mpib-perf speaks {PROTOCOL:?}"
            ));
        }
        let list = |name: &str| -> Result<Vec<String>, String> {
            Ok(fields.get(name)?.split(',').map(str::to_string).collect())
        };
        let sizes = list("sizes")?
            .iter()
            .map(|s| number::<usize>("sizes", s))
            .collect::<Result<Vec<_>, _>>()?;
        let splits = list("splits")?
            .iter()
            .map(|s| match s.as_str() {
                "env" => Ok(None),
                v => number::<u32>("splits", v).map(Some),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let iters = match fields.get("iters")? {
            "auto" => None,
            n => Some(number("iters", n)?),
        };
        let sweep = Sweep {
            sizes,
            splits,
            iters,
            warmup: number("warmup", fields.get("warmup")?)?,
            window: number("window", fields.get("window")?)?,
            group: number("group", fields.get("group")?)?,
            verify: fields.get("verify")? == "1",
            repeat: match fields.get("repeat") {
                Ok(n) => number("repeat", n)?,
                Err(_) => 1,
            },
        };
        if sweep.sizes.is_empty() || sweep.sizes.len() > MAX_SIZES || sweep.window == 0 {
            return Err("the peer sent an empty sweep or a zero window".into());
        }
        if !(1..=8).contains(&sweep.group) || sweep.splits.iter().flatten().any(|s| *s > 1024) {
            return Err("the peer sent a group outside 1..8 or a share over 1024".into());
        }
        if sweep.window > MAX_WINDOW {
            return Err(format!("the peer sent a window over {MAX_WINDOW}"));
        }
        sweep
            .check_counts()
            .map_err(|e| format!("the peer sent {e}"))?;
        Ok(sweep)
    }
}

fn number<T: std::str::FromStr>(field: &str, text: &str) -> Result<T, String> {
    text.trim()
        .parse()
        .map_err(|_| format!("field {field}: {text:?} is not a number"))
}

/// `key=value` lines.
pub struct Fields<'t> {
    pairs: Vec<(&'t str, &'t str)>,
}

impl<'t> Fields<'t> {
    /// Splits the lines; a line without `=` is an error.
    pub fn parse(text: &'t str) -> Result<Fields<'t>, String> {
        let mut pairs = Vec::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let (key, value) = line
                .split_once('=')
                .ok_or_else(|| format!("line {line:?} is not key=value"))?;
            pairs.push((key.trim(), value.trim()));
        }
        Ok(Fields { pairs })
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Result<&'t str, String> {
        self.pairs
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| *v)
            .ok_or_else(|| format!("field {key} is missing"))
    }

    /// The value of `key` as a number.
    pub fn number<T: std::str::FromStr>(&self, key: &str) -> Result<T, String> {
        number(key, self.get(key)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sweep() -> Sweep {
        Sweep {
            sizes: sizes(8, 1 << 20, 2.0),
            splits: vec![Some(0), Some(512), Some(1024)],
            iters: None,
            warmup: 5,
            window: 8,
            group: 2,
            verify: true,
            repeat: 1,
        }
    }

    #[test]
    fn sizes_follow_the_factor_and_stop_at_max() {
        assert_eq!(sizes(8, 64, 2.0), [8, 16, 32, 64]);
        assert_eq!(sizes(8, 100, 2.0), [8, 16, 32, 64]);
        assert_eq!(sizes(0, 4, 2.0), [0, 1, 2, 4]);
        assert_eq!(sizes(10, 13, 1.01), [10, 11, 12, 13]);
        assert_eq!(sizes(1000, 1000, 2.0), [1000]);
        assert_eq!(sizes(1, usize::MAX, 1.0000001).len(), MAX_SIZES + 1);
    }

    #[test]
    fn encode_decode_round_trip() {
        let s = sweep();
        assert_eq!(Sweep::decode(&s.encode()), Ok(s.clone()));
        let env = Sweep {
            splits: vec![None],
            iters: Some(7),
            verify: false,
            repeat: 1,
            ..s
        };
        assert_eq!(Sweep::decode(&env.encode()), Ok(env));
        let other = sweep().encode().replace(PROTOCOL, "mpib-perf/9");
        assert!(Sweep::decode(&other).unwrap_err().contains("mpib-perf/9"));
        let broken = sweep().encode().replace("window=8", "window=x");
        assert!(Sweep::decode(&broken).unwrap_err().contains("window"));
    }

    #[test]
    fn rows_and_layout() {
        let s = sweep();
        let rows = s.rows();
        assert_eq!(rows.len(), 3 * s.sizes.len());
        assert_eq!(rows[s.sizes.len()].split, Some(512));
        assert_eq!(rows.last().map(|r| r.index), Some(rows.len() - 1));
        assert_eq!(s.iters_for(8), 1000);
        assert_eq!(s.iters_for(1 << 20), 128);
        assert_eq!(s.iters_for(256 << 20), 20);
        assert_eq!(s.stride(), 1 << 20);
        assert_eq!((s.recv_len(), s.send_len()), (16 << 20, 8 << 20));
        let plain = Sweep {
            verify: false,
            repeat: 1,
            ..sweep()
        };
        assert_eq!((plain.recv_len(), plain.send_len()), (2 << 20, 2 << 20));
    }
}
