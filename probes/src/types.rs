//! Plain values that cross the file: descriptions, connection attributes and slow-transfer
//! events, with their encodings.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::layout::{EVENT_WORDS, MAX_RAILS, NAME_LEN};
use crate::operation::Operation;

/// ns since the Unix epoch (CLOCK_REALTIME, read through the vDSO: no syscall), 0 if the
/// clock is before the epoch. Every timestamp in the probes file uses this clock.
#[inline]
pub fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// Static description of one rail (the collector's `device` and `port` labels, matching
/// node_exporter's `node_infiniband_*{device, port}`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RailInfo {
    /// Verbs device name, such as `mlx5_0` (at most 64 bytes are kept).
    pub device: String,
    /// Port number on that device (1-based, as in sysfs).
    pub port: u32,
    /// Link speed in Mbps as the device reports it; 0 when unknown.
    pub speed_mbps: u32,
}

/// One fused device (NCCL's net device): its name and the NIC slots of its SOUT and SUP NICs.
/// Two devices may share a NIC slot (a SUP NIC serving two SOUT NICs): its counters are one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceEntry {
    /// The name NCCL sees (`mlx5_0+mlx5_1`; at most 64 bytes are kept).
    pub name: String,
    /// NIC slots (indices into the rails) of its SOUT and SUP NICs.
    pub nics: [usize; MAX_RAILS],
}

impl DeviceEntry {
    /// The one device of a writer that describes only its rails: SOUT slot 0, SUP slot 1 (or
    /// slot 0 again with a single rail), named after both.
    pub fn of_rails(rails: &[RailInfo]) -> DeviceEntry {
        let sup = usize::from(rails.len() > 1);
        let name = |slot: usize| rails.get(slot).map_or("", |r| r.device.as_str());
        DeviceEntry {
            name: format!("{}+{}", name(0), name(sup)),
            nics: [0, sup],
        }
    }
}

/// What the writer puts in the header when it creates a probes file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriterInfo {
    /// Writer process id.
    pub pid: u32,
    /// Writer start time, ns since the Unix epoch (with `pid`, tells a restart apart).
    pub start_ns: u64,
    /// Host name (at most 64 bytes are kept).
    pub host: String,
    /// NIC slots, 1 to [`crate::MAX_NICS`]: every NIC the writer opened, each once.
    pub rails: Vec<RailInfo>,
    /// Fused devices, 1 to [`crate::MAX_DEVICES`], each naming its two NIC slots; a NIC slot
    /// is SUP when it is some device's SUP NIC and SOUT otherwise.
    pub devices: Vec<DeviceEntry>,
    /// The slow-transfer threshold in ns (`MPIB_SLOW_US`), for the collector to report.
    pub slow_threshold_ns: u64,
    /// 1-in-N sampling of transfers into the event ring (0 = off), for the collector to report.
    pub sample_one_in: u32,
}

impl WriterInfo {
    /// This process: its pid, `now_ns()` as start time, the kernel's host name, and `rails`
    /// (as one device: [`DeviceEntry::of_rails`]). Threshold and sampling start at 0; set the
    /// fields afterwards.
    pub fn for_this_process(rails: Vec<RailInfo>) -> WriterInfo {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_default();
        WriterInfo {
            pid: std::process::id(),
            start_ns: now_ns(),
            host,
            devices: vec![DeviceEntry::of_rails(&rails)],
            rails,
            slow_threshold_ns: 0,
            sample_one_in: 0,
        }
    }
}

/// Encode `name` into a NUL-padded fixed field, cut at a UTF-8 boundary if too long.
pub(crate) fn encode_name(name: &str) -> [u8; NAME_LEN] {
    let mut out = [0u8; NAME_LEN];
    let mut end = name.len().min(NAME_LEN);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    out[..end].copy_from_slice(&name.as_bytes()[..end]);
    out
}

/// Decode a NUL-padded fixed field (lossy on invalid UTF-8).
pub(crate) fn decode_name(field: &[u8; NAME_LEN]) -> String {
    let end = field.iter().position(|b| *b == 0).unwrap_or(NAME_LEN);
    String::from_utf8_lossy(&field[..end]).into_owned()
}

macro_rules! code_enum {
    (
        $(#[$doc:meta])*
        $name:ident { $($(#[$vdoc:meta])* $variant:ident = $code:literal),+ $(,)? }
    ) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vdoc])* $variant,)+
            /// A code this version does not know (written by a newer minor version).
            Unknown(u8),
        }

        impl $name {
            /// The byte stored in the file.
            pub const fn code(self) -> u8 {
                match self {
                    $($name::$variant => $code,)+
                    $name::Unknown(code) => code,
                }
            }

            /// The value stored as `code`.
            pub const fn from_code(code: u8) -> $name {
                match code {
                    $($code => $name::$variant,)+
                    other => $name::Unknown(other),
                }
            }
        }
    };
}

code_enum! {
    /// Which side of the connection this process is.
    Direction {
        /// This process sends.
        Send = 0,
        /// This process receives.
        Recv = 1,
    }
}

code_enum! {
    /// Where the peer sits (same codes as the plugin's `PathClass::code`).
    PathClass {
        /// Same scale-up island: SUP reaches the peer.
        IntraIsland = 0,
        /// Different islands: SOUT only.
        InterIsland = 1,
    }
}

code_enum! {
    /// The split policy of the connection.
    Mode {
        /// Path isolation decides the rail.
        Vanilla = 0,
        /// The agent's hint decides the split.
        Advanced = 1,
    }
}

/// The kind of an event record; a newtype so records of kinds added by a later minor version
/// are kept (and can be skipped) instead of failing to decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EventKind(pub u16);

impl EventKind {
    /// A transfer slower than the threshold (`MPIB_SLOW_US`).
    pub const SLOW: EventKind = EventKind(1);
    /// A transfer taken by 1-in-N sampling.
    pub const SAMPLED: EventKind = EventKind(2);
    /// A connection end's failover of a rail (`crate::FailoverEvent`; 3.3 on).
    pub const FAILOVER: EventKind = EventKind(3);
}

/// `conn_index` of an event that belongs to no tracked connection.
pub const NO_CONNECTION: u32 = u32::MAX;

/// Attributes of a connection, given when its slot is claimed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionInfo {
    /// Peer address (the control socket's IPv4 address and port).
    pub peer: SocketAddrV4,
    /// Send or receive side.
    pub direction: Direction,
    /// Intra- or inter-island.
    pub path_class: PathClass,
    /// Vanilla or advanced.
    pub mode: Mode,
    /// Slot of the agent's hint table this connection reads (advanced mode).
    pub hint_slot: u32,
    /// The fused device it uses, an index into the header's devices.
    pub device: u8,
}

/// One slow (or sampled) transfer, as the plugin records it and the collector reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlowTransfer {
    /// Why it was recorded.
    pub kind: EventKind,
    /// Send or receive side.
    pub direction: Direction,
    /// Active rail mask (bit 0 = SOUT, bit 1 = SUP).
    pub rail_mask: u8,
    /// Connection table index (`ConnectionProbe::index`), or [`NO_CONNECTION`].
    pub conn_index: u32,
    /// Transfer size in bytes.
    pub size: u64,
    /// Per rail: when the first work request was posted, ns since the Unix epoch (0 = unused).
    pub post_ns: [u64; MAX_RAILS],
    /// Per rail: when the last completion was polled, ns since the Unix epoch (0 = unused).
    pub done_ns: [u64; MAX_RAILS],
    /// Per rail: bytes carried (the split).
    pub rail_bytes: [u64; MAX_RAILS],
    /// SUP share in parts per 1024 used for the split.
    pub sup_bw: u32,
    /// Request slot (FIFO slot) of the transfer.
    pub slot: u32,
    /// Queue pair number per rail (0 = unused).
    pub qp_num: [u32; MAX_RAILS],
    /// Peer address.
    pub peer: SocketAddrV4,
    /// The fused device the connection uses, an index into the header's devices (3.0 on).
    pub device: u8,
    /// What NCCL said about the operation it served (`setNetAttr`; nothing before 3.2).
    pub operation: Operation,
}

impl SlowTransfer {
    /// The 15 payload words of an event record (layout in `docs/PROBES_LAYOUT.md`).
    #[inline]
    pub(crate) fn encode(&self) -> [u64; EVENT_WORDS] {
        let mut w = [0u64; EVENT_WORDS];
        w[0] = u64::from(self.kind.0)
            | (u64::from(self.direction.code()) << 16)
            | (u64::from(self.rail_mask) << 24)
            | (u64::from(self.conn_index) << 32);
        w[1] = self.size;
        w[2..4].copy_from_slice(&self.post_ns);
        w[4..6].copy_from_slice(&self.done_ns);
        w[6..8].copy_from_slice(&self.rail_bytes);
        w[8] = u64::from(self.sup_bw) | (u64::from(self.slot) << 32);
        w[9] = u64::from(self.qp_num[0]) | (u64::from(self.qp_num[1]) << 32);
        w[10] = u64::from(u32::from(*self.peer.ip()))
            | (u64::from(self.peer.port()) << 32)
            | (u64::from(self.device) << 48);
        // The writer encodes (and reports what does not fit) when NCCL sets the attributes;
        // a transfer carries the word, so nothing is lost here.
        w[11] = self.operation.encode().0;
        w
    }

    /// The transfer held in payload words `w` (inverse of `encode`; the truncating casts
    /// unpack the fields packed there).
    pub(crate) fn decode(w: &[u64; EVENT_WORDS]) -> SlowTransfer {
        SlowTransfer {
            kind: EventKind(w[0] as u16),
            direction: Direction::from_code((w[0] >> 16) as u8),
            rail_mask: (w[0] >> 24) as u8,
            conn_index: (w[0] >> 32) as u32,
            size: w[1],
            post_ns: [w[2], w[3]],
            done_ns: [w[4], w[5]],
            rail_bytes: [w[6], w[7]],
            sup_bw: w[8] as u32,
            slot: (w[8] >> 32) as u32,
            qp_num: [w[9] as u32, (w[9] >> 32) as u32],
            peer: SocketAddrV4::new(Ipv4Addr::from(w[10] as u32), (w[10] >> 32) as u16),
            device: (w[10] >> 48) as u8,
            operation: Operation::decode(w[11]),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub(crate) mod tests {
    use super::*;

    /// A transfer with every field distinct and non-trivial.
    pub(crate) fn sample_transfer(i: u32) -> SlowTransfer {
        SlowTransfer {
            kind: EventKind::SLOW,
            direction: Direction::Recv,
            rail_mask: 3,
            conn_index: i,
            size: 1 << 20,
            post_ns: [10, 11],
            done_ns: [20, u64::MAX],
            rail_bytes: [700 << 10, 324 << 10],
            sup_bw: 324,
            slot: 7,
            qp_num: [0x00ab_cdef, 0x0012_3456],
            peer: SocketAddrV4::new(Ipv4Addr::new(10, 1, 2, 3), 40_000),
            device: 5,
            operation: Operation {
                functions: 1 << 4,
                algorithms: 1 << 1,
                protocols: 1 << 2,
                peers: 2,
                flows_per_peer: 8,
            },
        }
    }

    #[test]
    fn slow_transfer_round_trips() {
        let t = sample_transfer(5);
        assert_eq!(SlowTransfer::decode(&t.encode()), t);
        let t = SlowTransfer {
            kind: EventKind(0xffff),
            direction: Direction::Unknown(9),
            conn_index: NO_CONNECTION,
            ..t
        };
        assert_eq!(SlowTransfer::decode(&t.encode()), t);
    }

    #[test]
    fn codes_round_trip_and_keep_unknowns() {
        for code in 0..=255u8 {
            assert_eq!(Direction::from_code(code).code(), code);
            assert_eq!(PathClass::from_code(code).code(), code);
            assert_eq!(Mode::from_code(code).code(), code);
        }
        assert_eq!(PathClass::from_code(1), PathClass::InterIsland);
        assert_eq!(Mode::from_code(2), Mode::Unknown(2));
    }

    #[test]
    fn names_are_cut_at_char_boundary() {
        let long = "é".repeat(40); // 80 bytes
        assert_eq!(decode_name(&encode_name(&long)), "é".repeat(32));
        assert_eq!(decode_name(&encode_name("mlx5_0")), "mlx5_0");
    }
}
