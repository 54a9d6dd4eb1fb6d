//! Numbers as the screen shows them; `-` for a value not known yet (the first sample has no
//! rates).

/// Bytes per second: `1.23 GB/s`, `456.7 MB/s`, `12.3 kB/s`, `512 B/s`.
pub fn rate(value: Option<f64>) -> String {
    match value {
        None => "-".into(),
        Some(v) if v >= 1e9 => format!("{:.2} GB/s", v / 1e9),
        Some(v) if v >= 1e6 => format!("{:.1} MB/s", v / 1e6),
        Some(v) if v >= 1e3 => format!("{:.1} kB/s", v / 1e3),
        Some(v) => format!("{v:.0} B/s"),
    }
}

/// A count per second: `12.3k`, `45`, `0.5`.
pub fn per_second(value: Option<f64>) -> String {
    match value {
        None => "-".into(),
        Some(v) if v >= 1e6 => format!("{:.1}M", v / 1e6),
        Some(v) if v >= 1e4 => format!("{:.1}k", v / 1e3),
        Some(v) if v >= 10.0 || v == 0.0 => format!("{v:.0}"),
        Some(v) => format!("{v:.1}"),
    }
}

/// Parts per 1024, or `-`.
pub fn ppk(value: Option<u32>) -> String {
    value.map_or("-".into(), |v| v.to_string())
}

/// A size: `4 MiB`, `64 KiB`, `512 B`.
pub fn bytes(value: u64) -> String {
    match value {
        v if v >= 1 << 30 && v % (1 << 30) == 0 => format!("{} GiB", v >> 30),
        v if v >= 1 << 20 => format!("{:.0} MiB", v as f64 / f64::from(1u32 << 20)),
        v if v >= 1 << 10 => format!("{:.0} KiB", v as f64 / 1024.0),
        v => format!("{v} B"),
    }
}

/// A duration: `42s`, `5m03s`, `2h05m`, `3d04h`.
pub fn age(seconds: f64) -> String {
    let s = seconds.max(0.0) as u64;
    match s {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m{:02}s", s / 60, s % 60),
        s if s < 86_400 => format!("{}h{:02}m", s / 3600, s / 60 % 60),
        s => format!("{}d{:02}h", s / 86_400, s / 3600 % 24),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_as_an_operator_expects() {
        assert_eq!(rate(None), "-");
        assert_eq!(rate(Some(5.87e9)), "5.87 GB/s");
        assert_eq!(rate(Some(200e6)), "200.0 MB/s");
        assert_eq!(rate(Some(0.0)), "0 B/s");
        assert_eq!(per_second(Some(12_345.0)), "12.3k");
        assert_eq!(per_second(Some(0.5)), "0.5");
        assert_eq!(bytes(4 << 20), "4 MiB");
        assert_eq!(bytes(64 << 10), "64 KiB");
        assert_eq!(age(7541.0), "2h05m");
        assert_eq!(age(303.0), "5m03s");
    }
}
