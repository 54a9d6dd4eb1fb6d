//! Deterministic byte patterns: every message gets its own seed, so a byte that lands in the wrong
//! message, at the wrong offset, or from an earlier iteration is caught.

/// Receive buffers (and the gaps between them) are filled with this before a transfer.
pub const POISON: u8 = 0xA5;

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(GOLDEN);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn word(seed: u64, index: usize) -> [u8; 8] {
    splitmix64(seed ^ (index as u64).wrapping_mul(GOLDEN)).to_le_bytes()
}

/// A seed for message `index` of iteration `iteration` of the case `case`.
pub fn seed(case: u64, iteration: u64, index: u64) -> u64 {
    let base = splitmix64(splitmix64(case ^ 0x4D50_4942) ^ iteration.wrapping_mul(GOLDEN));
    base ^ index.wrapping_mul(0xD6E8_FEB8_6659_FD93)
}

/// A seed for a case named by text.
pub fn case_id(name: &str) -> u64 {
    name.bytes().fold(0xCBF2_9CE4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01B3)
    })
}

/// Fills `buf` with the pattern of `seed`.
pub fn fill(buf: &mut [u8], seed: u64) {
    let mut chunks = buf.chunks_exact_mut(8);
    let mut index = 0;
    for chunk in &mut chunks {
        chunk.copy_from_slice(&word(seed, index));
        index += 1;
    }
    let tail = chunks.into_remainder();
    let len = tail.len();
    tail.copy_from_slice(&word(seed, index)[..len]);
}

/// The offset of the first byte of `buf` that differs from the pattern of `seed`, with the
/// expected and found values.
pub fn first_mismatch(buf: &[u8], seed: u64) -> Option<(usize, u8, u8)> {
    let mut chunks = buf.chunks_exact(8);
    let mut index = 0;
    for chunk in &mut chunks {
        let expected = word(seed, index);
        if chunk != expected {
            let (i, (e, f)) = expected
                .iter()
                .zip(chunk)
                .enumerate()
                .find(|(_, (e, f))| e != f)?;
            return Some((index * 8 + i, *e, *f));
        }
        index += 1;
    }
    let tail = chunks.remainder();
    let expected = word(seed, index);
    let (i, (e, f)) = expected
        .iter()
        .zip(tail)
        .enumerate()
        .find(|(_, (e, f))| e != f)?;
    Some((index * 8 + i, *e, *f))
}

/// The offset of the first byte of `buf` that is not [`POISON`].
pub fn first_unpoisoned(buf: &[u8]) -> Option<usize> {
    buf.iter().position(|b| *b != POISON)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_then_check_and_detect() {
        for len in [0usize, 1, 7, 8, 9, 127, 128, 4097] {
            let mut buf = vec![0u8; len];
            fill(&mut buf, 42);
            assert_eq!(first_mismatch(&buf, 42), None, "len {len}");
            if len > 0 {
                buf[len - 1] ^= 1;
                assert_eq!(first_mismatch(&buf, 42).map(|m| m.0), Some(len - 1));
            }
        }
        let (mut a, mut b) = (vec![0u8; 64], vec![0u8; 64]);
        fill(&mut a, seed(1, 0, 0));
        fill(&mut b, seed(1, 1, 0));
        assert_ne!(a, b, "iterations differ");
        fill(&mut b, seed(1, 0, 1));
        assert_ne!(a, b, "messages differ");
        assert_ne!(case_id("a"), case_id("b"));
    }
}
