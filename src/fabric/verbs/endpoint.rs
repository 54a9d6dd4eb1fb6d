//! A verbs rail's endpoint: what a peer's queue pair needs to reach this port (the LID on
//! InfiniBand, the GID and its table index on RoCE, the path MTU), in the seam's opaque
//! [`Endpoint`] (src/fabric/mod.rs). Only this fabric reads it.
//!
//! Body layout (after the fabric tag): `mtu u8 | link_layer u8 | gid_index u8 | lid u16 (LE) |
//! gid [u8; 16]`, the rest zero.

use std::net::{IpAddr, Ipv6Addr};

use super::attrs;
use crate::fabric::{Endpoint, FabricKind, LinkLayer};

/// The address of one verbs port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortAddress {
    /// Local identifier (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// The GID this rail uses (RoCE v2 IPv4-mapped on Ethernet).
    pub gid: [u8; 16],
    /// GID table index of `gid`.
    pub gid_index: u8,
    /// Active MTU as the verbs enum value (1 = 256 ... 5 = 4096).
    pub mtu: u8,
    /// Link layer of the port.
    pub link_layer: LinkLayer,
}

impl PortAddress {
    /// The endpoint peers are given.
    pub(crate) fn endpoint(&self) -> Endpoint {
        let mut body = [0u8; 21];
        body[0] = self.mtu;
        body[1] = match self.link_layer {
            LinkLayer::InfiniBand => attrs::LINK_LAYER_INFINIBAND,
            LinkLayer::Ethernet => attrs::LINK_LAYER_ETHERNET,
        };
        body[2] = self.gid_index;
        body[3..5].copy_from_slice(&self.lid.to_le_bytes());
        body[5..21].copy_from_slice(&self.gid);
        Endpoint::new(FabricKind::Verbs, &body)
    }

    /// A peer's address from its endpoint, or why it is not a verbs port's.
    pub fn decode(endpoint: &Endpoint) -> Result<PortAddress, String> {
        let body = endpoint.body(FabricKind::Verbs)?;
        let mtu = body[0];
        if attrs::mtu_bytes(mtu) == 0 {
            return Err(format!("path MTU enum {mtu} is not 1 (256) ..= 5 (4096)"));
        }
        let link_layer = attrs::link_layer(body[1])
            .ok_or_else(|| format!("link layer {} is neither 1 (IB) nor 2 (Ethernet)", body[1]))?;
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&body[5..21]);
        Ok(PortAddress {
            lid: u16::from_le_bytes([body[3], body[4]]),
            gid,
            gid_index: body[2],
            mtu,
            link_layer,
        })
    }

    /// The port's IP address: the IPv4 address of a RoCE v2 IPv4-mapped GID, else the GID as an
    /// IPv6 address (`::` for a port without one).
    pub fn ip(&self) -> IpAddr {
        Ipv6Addr::from(self.gid).to_canonical()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_round_trip_and_name_what_is_wrong() {
        let gid = std::net::Ipv4Addr::new(10, 0, 0, 7)
            .to_ipv6_mapped()
            .octets();
        let address = PortAddress {
            lid: 0x1234,
            gid,
            gid_index: 3,
            mtu: 5,
            link_layer: LinkLayer::Ethernet,
        };
        assert_eq!(PortAddress::decode(&address.endpoint()), Ok(address));
        assert_eq!(address.ip(), IpAddr::from([10, 0, 0, 7]));
        let mut bad = address.endpoint();
        bad.0[1] = 6;
        assert!(PortAddress::decode(&bad)
            .unwrap_err()
            .contains("MTU enum 6"));
        let mut bad = address.endpoint();
        bad.0[2] = 3;
        assert!(PortAddress::decode(&bad)
            .unwrap_err()
            .contains("link layer 3"));
        let tcp = Endpoint::new(FabricKind::Tcp, &[127, 0, 0, 1, 0, 80]);
        let error = PortAddress::decode(&tcp).unwrap_err();
        assert!(
            error.contains("tcp fabric") && error.contains("verbs"),
            "{error}"
        );
    }
}
