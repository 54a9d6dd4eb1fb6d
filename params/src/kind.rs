//! The fabric a process runs (`MPIB_FABRIC`).

/// Which backend serves the fabric seam (`MPIB_FABRIC`); its code is also the first byte of
/// the endpoints it makes (never reused).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum FabricKind {
    /// Real libibverbs.
    Verbs = 1,
    /// The in-process loopback model.
    Loopback = 2,
    /// RC over TCP connections.
    Tcp = 3,
}

impl FabricKind {
    /// Every fabric.
    pub const ALL: [FabricKind; 3] = [FabricKind::Verbs, FabricKind::Loopback, FabricKind::Tcp];

    /// The fabric's `MPIB_FABRIC` name.
    pub fn name(self) -> &'static str {
        match self {
            FabricKind::Verbs => "verbs",
            FabricKind::Loopback => "loopback",
            FabricKind::Tcp => "tcp",
        }
    }

    /// The fabric named `name`.
    pub fn from_name(name: &str) -> Option<FabricKind> {
        Self::ALL.into_iter().find(|kind| kind.name() == name)
    }

    /// The fabric whose code is `code`, by name, or "unknown (N)".
    pub fn name_of(code: u8) -> String {
        Self::ALL
            .into_iter()
            .find(|kind| *kind as u8 == code)
            .map_or_else(|| format!("unknown ({code})"), |kind| kind.name().into())
    }
}
