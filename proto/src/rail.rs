//! The two rails of a fused device.

use std::fmt;

/// Which physical NIC of the fused device a resource belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Rail {
    /// The scale-out NIC: routable everywhere, carries the control socket.
    ScaleOut = 0,
    /// The scale-up NIC: extra bandwidth inside an island.
    ScaleUp = 1,
}

impl Rail {
    /// Both rails, in index order.
    pub const ALL: [Rail; 2] = [Rail::ScaleOut, Rail::ScaleUp];

    /// Index of the rail (0 = SOUT, 1 = SUP); also its bit position in an active mask.
    #[inline]
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The other rail of the fused device.
    #[inline]
    pub const fn other(self) -> Rail {
        match self {
            Rail::ScaleOut => Rail::ScaleUp,
            Rail::ScaleUp => Rail::ScaleOut,
        }
    }

    /// The rail with the given index.
    #[inline]
    pub const fn from_index(index: usize) -> Option<Rail> {
        match index {
            0 => Some(Rail::ScaleOut),
            1 => Some(Rail::ScaleUp),
            _ => None,
        }
    }

    /// Short lower-case label used in logs and metrics (`sout`, `sup`).
    #[inline]
    pub const fn label(self) -> &'static str {
        match self {
            Rail::ScaleOut => "sout",
            Rail::ScaleUp => "sup",
        }
    }
}

impl fmt::Display for Rail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}
