//! Path classification: is the peer in the same scale-up island (docs/PROTOCOL.md §1)?
//!
//! Why from the control socket's address pair: both ends see the same two SOUT addresses (one as
//! local, one as remote), so each can classify independently and reach the same answer without
//! an extra round trip. That agreement is what lets both sides suppress SUP QPs for vanilla
//! inter-island connections and still create matching QP counts (docs/PROTOCOL.md §1–2). The
//! comparison is symmetric by construction.

use std::net::Ipv4Addr;

/// Where the peer sits relative to this host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathClass {
    /// Same island: the SUP fabric reaches the peer.
    IntraIsland,
    /// Different islands: only SOUT is routable (without an agent-managed relay).
    InterIsland,
}

impl PathClass {
    /// Wire code: 0 intra, 1 inter.
    pub const fn code(self) -> u8 {
        match self {
            PathClass::IntraIsland => 0,
            PathClass::InterIsland => 1,
        }
    }

    /// The class with wire code `code`, `None` for any other value.
    pub fn from_code(code: u8) -> Option<PathClass> {
        match code {
            0 => Some(PathClass::IntraIsland),
            1 => Some(PathClass::InterIsland),
            _ => None,
        }
    }

    /// Short label for logs: `intra` or `inter`.
    pub fn label(self) -> &'static str {
        match self {
            PathClass::IntraIsland => "intra",
            PathClass::InterIsland => "inter",
        }
    }
}

impl std::fmt::Display for PathClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

/// Network mask with the first `prefix_len` bits set; lengths above 32 behave as 32.
const fn prefix_mask(prefix_len: u8) -> u32 {
    if prefix_len == 0 {
        0
    } else if prefix_len >= 32 {
        u32::MAX
    } else {
        u32::MAX << (32 - prefix_len as u32)
    }
}

/// Same island iff the two addresses share their first `prefix_len` bits (`mpibIsSameIsland`).
/// Prefix 0 puts everything in one island; 32 requires equal addresses.
pub fn classify(local: Ipv4Addr, remote: Ipv4Addr, prefix_len: u8) -> PathClass {
    let mask = prefix_mask(prefix_len);
    if u32::from(local) & mask == u32::from(remote) & mask {
        PathClass::IntraIsland
    } else {
        PathClass::InterIsland
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn codes_roundtrip() {
        for class in [PathClass::IntraIsland, PathClass::InterIsland] {
            assert_eq!(PathClass::from_code(class.code()), Some(class));
        }
        assert_eq!(PathClass::from_code(2), None);
        assert_eq!(PathClass::IntraIsland.label(), "intra");
        assert_eq!(PathClass::InterIsland.to_string(), "inter");
    }

    #[test]
    fn slash_24() {
        let a = Ipv4Addr::new(10, 1, 2, 3);
        assert_eq!(
            classify(a, Ipv4Addr::new(10, 1, 2, 200), 24),
            PathClass::IntraIsland
        );
        assert_eq!(
            classify(a, Ipv4Addr::new(10, 1, 3, 3), 24),
            PathClass::InterIsland
        );
        assert_eq!(
            classify(a, Ipv4Addr::new(10, 1, 3, 3), 16),
            PathClass::IntraIsland
        );
    }

    #[test]
    fn prefix_extremes() {
        let a = Ipv4Addr::new(1, 2, 3, 4);
        let b = Ipv4Addr::new(200, 0, 0, 1);
        assert_eq!(classify(a, b, 0), PathClass::IntraIsland);
        assert_eq!(classify(a, b, 1), PathClass::InterIsland);
        assert_eq!(classify(a, a, 32), PathClass::IntraIsland);
        assert_eq!(
            classify(a, Ipv4Addr::new(1, 2, 3, 5), 32),
            PathClass::InterIsland
        );
        assert_eq!(
            classify(a, Ipv4Addr::new(1, 2, 3, 5), 255),
            PathClass::InterIsland
        );
    }

    proptest! {
        #[test]
        fn symmetric(a in any::<u32>(), b in any::<u32>(), prefix in 0u8..=40) {
            let (a, b) = (Ipv4Addr::from(a), Ipv4Addr::from(b));
            prop_assert_eq!(classify(a, b, prefix), classify(b, a, prefix));
        }

        #[test]
        fn full_prefix_means_equal(a in any::<u32>(), b in any::<u32>()) {
            let (a, b) = (Ipv4Addr::from(a), Ipv4Addr::from(b));
            prop_assert_eq!(classify(a, b, 32) == PathClass::IntraIsland, a == b);
            prop_assert_eq!(classify(a, a, 32), PathClass::IntraIsland);
        }

        #[test]
        fn longer_prefix_never_merges(a in any::<u32>(), b in any::<u32>(), prefix in 0u8..32) {
            let (a, b) = (Ipv4Addr::from(a), Ipv4Addr::from(b));
            if classify(a, b, prefix + 1) == PathClass::IntraIsland {
                prop_assert_eq!(classify(a, b, prefix), PathClass::IntraIsland);
            }
        }
    }
}
