//! What the benches share: their command-line arguments, the median of their rounds and the
//! bytes pinned for the NIC.

// Each bench uses part of it.
#![allow(dead_code)]

/// The median of `values` (the upper middle for an even count).
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// The number after `name` on the command line (`--rounds 7`), or `default`.
pub fn argument(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Bytes this process has pinned for a NIC (`VmPin` in /proc/self/status: registrations on
/// verbs; 0 on the software fabrics or if unreadable).
pub fn pinned_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let line = status
                .lines()
                .find(|l| l.starts_with("VmPin:"))?
                .to_string();
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .unwrap_or(0)
        * 1024
}
