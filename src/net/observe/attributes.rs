//! What NCCL says about a communicator's operations through `setNetAttr` (net ABI v11 and
//! later), kept per context and read by every comm made with it.
//!
//! NCCL calls `setNetAttr` on the proxy's context before a transfer whose attributes differ
//! from the last ones it set (`setXferNetAttrs` in NCCL's `transport/net.cc`): the function (one
//! bit of `ncclFunc_t`), the algorithm and protocol (one bit each, for collectives), and per
//! direction the peers it moves data with at once and the flows (channels) per peer. A comm
//! reads the context's word for its direction when NCCL posts a transfer on it
//! ([`NetAttributes::word`]): the connection's slot in the probes file shows it
//! (`mpib-top`, the collector's `mpib_connections_by_operation`) and a slow transfer carries it
//! (its span says which kind of collective it served). The word's layout is the probes crate's
//! (`mpib_probes::operation`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use mpib_probes::operation::Unrecorded;
use mpib_probes::Operation;

use crate::log;

/// `setNetAttr`'s values, whatever the ABI version's struct.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetAttributeValues {
    /// Bit mask over NCCL's functions (`u32::MAX` undefined).
    pub functions: u32,
    /// Bit mask over NCCL's algorithms (`u32::MAX` undefined).
    pub algorithms: u32,
    /// Bit mask over NCCL's protocols (`u32::MAX` undefined).
    pub protocols: u32,
    /// Send side: concurrent peers and flows per peer (NCCL's maxima; -1 undefined).
    pub send: [i32; 2],
    /// Receive side: the same.
    pub recv: [i32; 2],
}

/// The current attributes of one context, as probes words per direction (0: nothing said).
#[derive(Debug, Default)]
pub(crate) struct NetAttributes {
    send: AtomicU64,
    recv: AtomicU64,
}

/// Whether a value this plugin could not record was already reported at WARN.
static WARNED: AtomicBool = AtomicBool::new(false);

impl NetAttributes {
    /// Keeps what NCCL said. Bits the probes word cannot hold (a newer NCCL's function,
    /// algorithm or protocol) are held as "undefined" and reported: the first time at WARN, then
    /// at TRACE (NCCL says it before every change of operation).
    pub(crate) fn set(&self, values: &NetAttributeValues) {
        for (cell, [peers, flows]) in [(&self.send, values.send), (&self.recv, values.recv)] {
            let operation = Operation {
                functions: values.functions,
                algorithms: values.algorithms,
                protocols: values.protocols,
                peers,
                flows_per_peer: flows,
            };
            let (word, unrecorded) = operation.encode();
            if !unrecorded.is_empty() {
                report(&unrecorded);
            }
            // One writer per call, any number of readers; each reads one whole word.
            cell.store(word, Ordering::Relaxed);
        }
    }

    /// The word for a comm of this direction (`send`: a send comm).
    #[inline]
    pub(crate) fn word(&self, send: bool) -> u64 {
        let cell = if send { &self.send } else { &self.recv };
        cell.load(Ordering::Relaxed)
    }
}

#[cold]
fn report(unrecorded: &[Unrecorded]) {
    let what: Vec<String> = unrecorded
        .iter()
        .map(|u| match u {
            Unrecorded::Functions(mask) => format!("function mask {mask:#x}"),
            Unrecorded::Algorithms(mask) => format!("algorithm mask {mask:#x}"),
            Unrecorded::Protocols(mask) => format!("protocol mask {mask:#x}"),
        })
        .collect();
    let message = format!(
        "setNetAttr: {} does not fit the probes word (a bit past its field, from a newer NCCL, or \
         every bit of it, which the word keeps for undefined); recorded as undefined",
        what.join(", ")
    );
    if WARNED.swap(true, Ordering::Relaxed) {
        trace!(log::NET, "{message}");
    } else {
        warn!(log::NET, "{message} (again: TRACE)");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_direction_keeps_its_peers_and_flows() {
        let attributes = NetAttributes::default();
        assert_eq!((attributes.word(true), attributes.word(false)), (0, 0));
        attributes.set(&NetAttributeValues {
            functions: 1 << 4,
            algorithms: 1 << 1,
            protocols: 1 << 2,
            send: [2, 8],
            recv: [-1, -1],
        });
        let send = Operation::decode(attributes.word(true));
        let recv = Operation::decode(attributes.word(false));
        assert_eq!(send.describe(), "AllReduce Ring Simple, 2 peers x 8 flows");
        assert_eq!(recv.describe(), "AllReduce Ring Simple, - peers x - flows");
    }
}
