//! The seam's addressing: a device's opaque endpoint, which only the fabric that made it reads
//! (src/fabric/mod.rs `RemoteQp`, docs/ARCHITECTURE.md "The fabric seam").

/// Bytes of an [`Endpoint`].
pub const ENDPOINT_BYTES: usize = crate::proto::wire::RAIL_ENDPOINT_BYTES;

/// How a peer reaches one rail's queue pairs, opaque to the engine: the handshake carries it,
/// and the fabric that made it decodes the peer's in [`QueuePair::connect`] and
/// [`RailDevice::resolve_peer`] (verbs: LID, GID, GID index, MTU and link layer; tcp: address
/// and listening port; loopback: the device's GID). The first byte names the fabric, so a peer
/// running another `MPIB_FABRIC` gets an error saying so rather than a misread address.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Endpoint(pub [u8; ENDPOINT_BYTES]);

impl Endpoint {
    /// An endpoint of fabric `tag` with `body` (at most
    /// `ENDPOINT_BYTES - 1` bytes; the rest is zero).
    pub fn new(tag: FabricKind, body: &[u8]) -> Endpoint {
        let mut bytes = [0u8; ENDPOINT_BYTES];
        bytes[0] = tag as u8;
        let len = body.len().min(ENDPOINT_BYTES - 1);
        bytes[1..=len].copy_from_slice(&body[..len]);
        Endpoint(bytes)
    }

    /// The body, when the endpoint is `tag`'s; otherwise what the peer runs, for the error.
    pub fn body(&self, tag: FabricKind) -> Result<&[u8; ENDPOINT_BYTES - 1], String> {
        if self.0[0] == tag as u8 {
            Ok(self.0[1..].try_into().unwrap_or(&[0; ENDPOINT_BYTES - 1]))
        } else {
            Err(format!(
                "the peer's endpoint is of the {} fabric, this rail is {} (MPIB_FABRIC differs?)",
                FabricKind::name_of(self.0[0]),
                tag.name()
            ))
        }
    }
}

pub use mpib_params::FabricKind;
