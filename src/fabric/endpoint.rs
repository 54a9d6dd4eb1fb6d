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
    /// An endpoint of the fabric named `tag` (a [`FabricTag`]) with `body` (at most
    /// `ENDPOINT_BYTES - 1` bytes; the rest is zero).
    pub fn new(tag: FabricTag, body: &[u8]) -> Endpoint {
        let mut bytes = [0u8; ENDPOINT_BYTES];
        bytes[0] = tag as u8;
        let len = body.len().min(ENDPOINT_BYTES - 1);
        bytes[1..=len].copy_from_slice(&body[..len]);
        Endpoint(bytes)
    }

    /// The body, when the endpoint is `tag`'s; otherwise what the peer runs, for the error.
    pub fn body(&self, tag: FabricTag) -> Result<&[u8; ENDPOINT_BYTES - 1], String> {
        if self.0[0] == tag as u8 {
            Ok(self.0[1..].try_into().unwrap_or(&[0; ENDPOINT_BYTES - 1]))
        } else {
            Err(format!(
                "the peer's endpoint is of the {} fabric, this rail is {} (MPIB_FABRIC differs?)",
                FabricTag::name_of(self.0[0]),
                tag.name()
            ))
        }
    }
}

/// The first byte of an [`Endpoint`]: which fabric encoded it. Never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum FabricTag {
    /// `verbs`.
    Verbs = 1,
    /// `loopback`.
    Loopback = 2,
    /// `tcp`.
    Tcp = 3,
}

impl FabricTag {
    /// The fabric's `MPIB_FABRIC` name.
    pub fn name(self) -> &'static str {
        match self {
            FabricTag::Verbs => "verbs",
            FabricTag::Loopback => "loopback",
            FabricTag::Tcp => "tcp",
        }
    }

    fn name_of(code: u8) -> String {
        [FabricTag::Verbs, FabricTag::Loopback, FabricTag::Tcp]
            .into_iter()
            .find(|tag| *tag as u8 == code)
            .map_or_else(|| format!("unknown ({code})"), |tag| tag.name().into())
    }
}
