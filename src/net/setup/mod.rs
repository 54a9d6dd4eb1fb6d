//! Bringing connections up: the process's NICs and fused devices (`plugin`, `devices`), `listen`/`connect`/`accept` and
//! their handshake, the listening socket a device's listen comms share (`listener`), the handshakes let run at once
//! towards one (`admission`), what a handshake travels on (`channel`), the peer's control address (`oob`) and rail addresses (`resolve`), the
//! comm-level description both ends agree on (`comm`), the queue pairs and completion queues
//! a connection owns (`resources`), what it takes of each NIC's limits (`budget`) and the
//! receive queues receive connections share per NIC (`receives`).

pub(crate) mod accept;
pub(crate) mod admission;
pub(crate) mod budget;
pub(crate) mod channel;
pub(crate) mod comm;
pub(crate) mod connect;
pub(crate) mod descriptors;
pub(crate) mod devices;
pub(crate) mod listener;
pub(crate) mod oob;
pub(crate) mod plugin;
pub(crate) mod receives;
pub(crate) mod resolve;
pub(crate) mod resources;
