//! GID selection for RoCE ports, the way NCCL's `ncclIbGetGidIndex` does it with its defaults
//! (`NCCL_IB_ADDR_FAMILY=AF_INET`, `NCCL_IB_ROCE_VERSION_NUM=2`), plus one tie-break of MPIB's
//! own: among equally good GIDs, the one of the port's own network interface wins.
//!
//! The choice is a pure function over the GID table ([`select`]); reading the table (one
//! `ibv_query_gid` per entry, the type and netdev from sysfs) is separate ([`read_table`]).

use std::ffi::c_int;

use super::library::ibv_query_gid;
use rdma_sys::{ibv_context, ibv_gid};

/// The RoCE version of a GID table entry, from `.../gid_attrs/types/<index>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GidType {
    /// `IB/RoCE v1`.
    RoceV1,
    /// `RoCE v2`.
    RoceV2,
}

/// One populated entry of a port's GID table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct GidEntry {
    /// Table index.
    pub index: u32,
    /// The GID.
    pub gid: [u8; 16],
    /// Its RoCE version, when sysfs says (containers may refuse with EINVAL).
    pub gid_type: Option<GidType>,
    /// The network interface it belongs to (`.../gid_attrs/ndevs/<index>`), when known.
    pub netdev: Option<String>,
}

/// Parses the content of a `gid_attrs/types/<index>` file.
pub(crate) fn parse_gid_type(text: &str) -> Option<GidType> {
    match text.trim() {
        "RoCE v2" => Some(GidType::RoceV2),
        "IB/RoCE v1" | "RoCE v1" => Some(GidType::RoceV1),
        _ => None,
    }
}

/// Whether the GID is an IPv4-mapped address (`::ffff:a.b.c.d`).
pub(crate) fn is_ipv4_mapped(gid: &[u8; 16]) -> bool {
    gid[..10].iter().all(|b| *b == 0) && gid[10] == 0xff && gid[11] == 0xff
}

/// Whether the GID is usable at all: configured (not all zero) and not link-local (`fe80::/64`,
/// NCCL's `linkLocalGid`).
pub(crate) fn is_valid(gid: &[u8; 16]) -> bool {
    let configured = gid.iter().any(|b| *b != 0);
    let link_local = gid[..2] == [0xfe, 0x80] && gid[2..8].iter().all(|b| *b == 0);
    configured && !link_local
}

/// How good an entry is; larger is better. NCCL's order first (address family IPv4, then RoCE
/// v2), then whether it belongs to the port's own interface.
fn rank(entry: &GidEntry, own_netdev: Option<&str>) -> (bool, bool, bool) {
    let own = match (own_netdev, entry.netdev.as_deref()) {
        (Some(own), Some(netdev)) => own == netdev,
        _ => false,
    };
    (
        is_ipv4_mapped(&entry.gid),
        entry.gid_type == Some(GidType::RoceV2),
        own,
    )
}

/// Picks the GID index for a RoCE port: the best valid entry by [`rank`], the lowest index
/// among equals (NCCL scans upwards and only switches to a strictly better one). `own_netdev`
/// is the port's own interface (the netdev of GID 0, which every RoCE port has).
/// `None` when the table has no valid GID.
pub(crate) fn select(entries: &[GidEntry], own_netdev: Option<&str>) -> Option<u32> {
    let mut best: Option<&GidEntry> = None;
    for entry in entries.iter().filter(|e| is_valid(&e.gid)) {
        let better = match best {
            None => true,
            Some(b) => {
                let (new, old) = (rank(entry, own_netdev), rank(b, own_netdev));
                new > old || (new == old && entry.index < b.index)
            }
        };
        if better {
            best = Some(entry);
        }
    }
    best.map(|e| e.index)
}

/// Formats a GID the way `ibv_devinfo` does for IPv4-mapped ones, else as IPv6.
pub(crate) fn format_gid(gid: &[u8; 16]) -> String {
    std::net::Ipv6Addr::from(*gid).to_string()
}

/// Reads a sysfs attribute of a port's GID table (`types` or `ndevs`).
pub(crate) fn read_attr(device: &str, port: u8, attr: &str, index: u32) -> Option<String> {
    let path = format!("/sys/class/infiniband/{device}/ports/{port}/gid_attrs/{attr}/{index}");
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// Queries one GID; `None` when the verb fails (an index the table cannot answer).
///
/// # Safety
/// `context` must be a live device context.
pub(crate) unsafe fn query_gid(
    context: *mut ibv_context,
    port: u8,
    index: u32,
) -> Option<[u8; 16]> {
    let mut gid = ibv_gid { raw: [0; 16] };
    let index = c_int::try_from(index).ok()?;
    // SAFETY: the caller guarantees `context`; `gid` is a valid out-parameter.
    let rc = unsafe { ibv_query_gid(context, port, index, &mut gid) };
    // SAFETY: every bit pattern is a valid `[u8; 16]`, the union's raw view.
    (rc == 0).then_some(unsafe { gid.raw })
}

/// The populated entries of a port's GID table (empty ones are skipped), with their types and
/// netdevs from sysfs, and the port's own netdev (that of index 0).
///
/// # Safety
/// `context` must be a live device context of `device`.
pub(crate) unsafe fn read_table(
    context: *mut ibv_context,
    device: &str,
    port: u8,
    table_len: u32,
) -> (Vec<GidEntry>, Option<String>) {
    let mut entries = Vec::new();
    for index in 0..table_len {
        // SAFETY: forwarded from the caller.
        let Some(gid) = (unsafe { query_gid(context, port, index) }) else {
            continue;
        };
        if !gid.iter().any(|b| *b != 0) {
            continue;
        }
        let gid_type = read_attr(device, port, "types", index).and_then(|t| parse_gid_type(&t));
        let netdev = read_attr(device, port, "ndevs", index);
        entries.push(GidEntry {
            index,
            gid,
            gid_type,
            netdev,
        });
    }
    (entries, read_attr(device, port, "ndevs", 0))
}
