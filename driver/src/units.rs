//! Units the drivers' command lines take.

/// A byte count: digits with an optional K, M or G (powers of 1024; `KiB`, `k`, `KB` also read
/// as 1024). `None` for anything else or an overflow.
pub fn parse_bytes(text: &str) -> Option<usize> {
    let trimmed = text.trim();
    let digits_end = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (digits, suffix) = trimmed.split_at(digits_end);
    let shift = match suffix.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        _ => return None,
    };
    let value: usize = digits.parse().ok()?;
    value.checked_mul(1 << shift)
}

#[cfg(test)]
mod tests {
    #[test]
    fn byte_counts_take_binary_suffixes() {
        assert_eq!(super::parse_bytes("8"), Some(8));
        assert_eq!(super::parse_bytes("64K"), Some(64 << 10));
        assert_eq!(super::parse_bytes("256mib"), Some(256 << 20));
        assert_eq!(super::parse_bytes("1G"), Some(1 << 30));
        assert_eq!(super::parse_bytes("1T"), None);
        assert_eq!(super::parse_bytes("M"), None);
        assert_eq!(super::parse_bytes("99999999999999999999G"), None);
    }
}
