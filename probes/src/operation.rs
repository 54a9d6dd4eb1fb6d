//! What NCCL says about the operations a connection carries, through `setNetAttr` (net ABI
//! v11 and later): the function (a collective or point-to-point call), the algorithm and the
//! protocol as bit masks, and how many peers and flows per peer it moves data with at once.
//!
//! NCCL calls `setNetAttr` on a communicator's context before a transfer whose attributes
//! differ from the last ones it set (`setXferNetAttrs` in NCCL's `transport/net.cc`), with one
//! function bit and, for a collective, one algorithm and one protocol bit; for point-to-point
//! calls the algorithm and protocol are left as they were (NCCL: "algo/proto are undefined for
//! p2p"), so they are not shown for them. At setup it sets the communicator's range (several
//! function bits, `-1` where undefined).
//!
//! One word holds it all, so that a reader never sees one field of one call with another of the
//! next (docs/PROBES_LAYOUT.md, "Connection slot" and "Event ring"):
//!
//! | bits | field | undefined |
//! |---|---|---|
//! | 0-15 | function mask (NCCL's `ncclFunc_t` bits) | `0xffff` |
//! | 16-23 | algorithm mask (`NCCL_ALGO_*` bits) | `0xff` |
//! | 24-31 | protocol mask (`NCCL_PROTO_*` bits) | `0xff` |
//! | 32-47 | concurrent peers | `0xffff` |
//! | 48-63 | flows per peer | `0xffff` |
//!
//! The whole word 0 means NCCL said nothing (ABI v7-v10, or no `setNetAttr` yet).

/// NCCL's functions, by bit (`ncclFunc_t`, NCCL 2.28's `nccl_common.h`).
pub const FUNCTION_NAMES: [&str; 15] = [
    "Broadcast",
    "Reduce",
    "AllGather",
    "ReduceScatter",
    "AllReduce",
    "SendRecv",
    "Send",
    "Recv",
    "AlltoAll",
    "Scatter",
    "Gather",
    "AllGatherV",
    "PutSignal",
    "Signal",
    "WaitSignal",
];

/// Functions below this bit are collectives with an algorithm and a protocol
/// (`NCCL_NUM_FUNCTIONS`).
const COLLECTIVE_FUNCTIONS: u32 = 5;

/// NCCL's algorithms, by bit (`NCCL_ALGO_*` in NCCL's tuner interface).
pub const ALGORITHM_NAMES: [&str; 7] = [
    "Tree",
    "Ring",
    "CollNetDirect",
    "CollNetChain",
    "NVLS",
    "NVLSTree",
    "PAT",
];

/// NCCL's protocols, by bit (`NCCL_PROTO_*`).
pub const PROTOCOL_NAMES: [&str; 3] = ["LL", "LL128", "Simple"];

/// NCCL's "undefined" for a mask (`NCCL_NET_ATTR_UNDEF` as `uint32_t`).
pub const UNDEFINED_MASK: u32 = u32::MAX;

/// What NCCL said about the operations of one direction of a connection.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Operation {
    /// Bit mask over NCCL's functions ([`FUNCTION_NAMES`]); [`UNDEFINED_MASK`] undefined; 0
    /// with everything else: nothing said.
    pub functions: u32,
    /// Bit mask over NCCL's algorithms ([`ALGORITHM_NAMES`]); [`UNDEFINED_MASK`] undefined.
    pub algorithms: u32,
    /// Bit mask over NCCL's protocols ([`PROTOCOL_NAMES`]); [`UNDEFINED_MASK`] undefined.
    pub protocols: u32,
    /// Peers the communicator moves data with at once in this direction; negative undefined.
    pub peers: i32,
    /// Flows (channels) per peer; negative undefined.
    pub flows_per_peer: i32,
}

/// A field of an [`Operation`] the word could not hold as NCCL gave it (it holds "undefined"
/// instead): a bit past the field (a newer NCCL's function, algorithm or protocol), or every
/// bit of the field, which the word keeps for NCCL's undefined.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unrecorded {
    /// A function bit past the 16 the word has.
    Functions(u32),
    /// An algorithm bit past the 8 the word has.
    Algorithms(u32),
    /// A protocol bit past the 8 the word has.
    Protocols(u32),
}

fn mask_field(mask: u32, width: u32) -> Result<u64, u32> {
    let all = (1u64 << width) - 1;
    match mask {
        UNDEFINED_MASK => Ok(all),
        mask if u64::from(mask) < all => Ok(u64::from(mask)),
        mask => Err(mask),
    }
}

fn count_field(count: i32) -> u64 {
    // 0xffff is "undefined"; a count past it is held as 0xfffe ("65,534 or more").
    u64::try_from(count).map_or(0xffff, |c| c.min(0xfffe))
}

impl Operation {
    /// Whether NCCL said anything.
    pub fn is_known(&self) -> bool {
        *self != Operation::default()
    }

    /// The word for the probes file, and the fields it holds as "undefined" because they do
    /// not fit (a newer NCCL's function, algorithm or protocol): the caller reports those.
    pub fn encode(&self) -> (u64, Vec<Unrecorded>) {
        if !self.is_known() {
            return (0, Vec::new());
        }
        let mut unrecorded = Vec::new();
        let mut field = |mask, width, why: fn(u32) -> Unrecorded| {
            mask_field(mask, width).unwrap_or_else(|mask| {
                unrecorded.push(why(mask));
                (1u64 << width) - 1
            })
        };
        let functions = field(self.functions, 16, Unrecorded::Functions);
        let algorithms = field(self.algorithms, 8, Unrecorded::Algorithms);
        let protocols = field(self.protocols, 8, Unrecorded::Protocols);
        let word = functions
            | (algorithms << 16)
            | (protocols << 24)
            | (count_field(self.peers) << 32)
            | (count_field(self.flows_per_peer) << 48);
        (word, unrecorded)
    }

    /// The operation a word holds (0: nothing said).
    pub fn decode(word: u64) -> Operation {
        if word == 0 {
            return Operation::default();
        }
        let mask = |value: u64, width: u32| {
            if value == (1u64 << width) - 1 {
                UNDEFINED_MASK
            } else {
                value as u32
            }
        };
        let count = |value: u64| if value == 0xffff { -1 } else { value as i32 };
        Operation {
            functions: mask(word & 0xffff, 16),
            algorithms: mask((word >> 16) & 0xff, 8),
            protocols: mask((word >> 24) & 0xff, 8),
            peers: count((word >> 32) & 0xffff),
            flows_per_peer: count(word >> 48),
        }
    }

    /// Whether it names only point-to-point functions, whose algorithm and protocol NCCL leaves
    /// undefined.
    fn point_to_point(&self) -> bool {
        self.functions != UNDEFINED_MASK && self.functions & ((1 << COLLECTIVE_FUNCTIONS) - 1) == 0
    }

    /// The function names, joined by `|` (`AllReduce`, `Send|Recv`); `undefined`, or `none`
    /// when nothing was said.
    pub fn function_label(&self) -> String {
        if !self.is_known() {
            return "none".into();
        }
        names(self.functions, &FUNCTION_NAMES)
    }

    /// The algorithm names (`Ring`); `-` for point-to-point functions.
    pub fn algorithm_label(&self) -> String {
        match (self.is_known(), self.point_to_point()) {
            (false, _) => "none".into(),
            (true, true) => "-".into(),
            (true, false) => names(self.algorithms, &ALGORITHM_NAMES),
        }
    }

    /// The protocol names (`Simple`); `-` for point-to-point functions.
    pub fn protocol_label(&self) -> String {
        match (self.is_known(), self.point_to_point()) {
            (false, _) => "none".into(),
            (true, true) => "-".into(),
            (true, false) => names(self.protocols, &PROTOCOL_NAMES),
        }
    }

    /// The function, and for a collective its algorithm and protocol: `AllReduce Ring
    /// Simple`, `Send`; `none` when nothing was said.
    pub fn name(&self) -> String {
        if !self.is_known() {
            return "none".into();
        }
        let function = self.function_label();
        if self.point_to_point() {
            function
        } else {
            let (algorithm, protocol) = (self.algorithm_label(), self.protocol_label());
            format!("{function} {algorithm} {protocol}")
        }
    }

    /// One line: `AllReduce Ring Simple, 2 peers x 4 flows` (`-` for what is undefined), or
    /// `none`.
    pub fn describe(&self) -> String {
        if !self.is_known() {
            return "none".into();
        }
        let count = |n: i32| u32::try_from(n).map_or_else(|_| "-".to_string(), |n| n.to_string());
        let (peers, flows) = (count(self.peers), count(self.flows_per_peer));
        format!("{}, {peers} peers x {flows} flows", self.name())
    }
}

/// The names of `mask`'s bits, `|`-joined; `bitN` for a bit past the table, `undefined` for
/// NCCL's undefined.
fn names(mask: u32, table: &[&str]) -> String {
    if mask == UNDEFINED_MASK {
        return "undefined".into();
    }
    let named: Vec<String> = (0..32)
        .filter(|bit| mask & (1 << bit) != 0)
        .map(|bit| {
            table
                .get(bit)
                .map_or_else(|| format!("bit{bit}"), |n| (*n).to_owned())
        })
        .collect();
    if named.is_empty() {
        "none".into()
    } else {
        named.join("|")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn operation(functions: u32, algorithms: u32, protocols: u32) -> Operation {
        Operation {
            functions,
            algorithms,
            protocols,
            peers: 2,
            flows_per_peer: 4,
        }
    }

    #[test]
    fn a_word_holds_what_nccl_said_and_names_it() {
        let all_reduce = operation(1 << 4, 1 << 1, 1 << 2);
        let (word, unrecorded) = all_reduce.encode();
        assert!(unrecorded.is_empty());
        assert_eq!(Operation::decode(word), all_reduce);
        assert_eq!(
            all_reduce.describe(),
            "AllReduce Ring Simple, 2 peers x 4 flows"
        );
        // Point-to-point: NCCL leaves the last collective's algorithm and protocol in place.
        let send = operation(1 << 6, 1 << 1, 1 << 2);
        assert_eq!(
            (send.algorithm_label(), send.describe()),
            ("-".to_string(), "Send, 2 peers x 4 flows".to_string())
        );
        // Setup's range: several functions, undefined algorithm and protocol and peers.
        let range = Operation {
            functions: (1 << 5) | (1 << 6) | (1 << 7),
            algorithms: UNDEFINED_MASK,
            protocols: UNDEFINED_MASK,
            peers: -1,
            flows_per_peer: 70_000,
        };
        let decoded = Operation::decode(range.encode().0);
        assert_eq!(decoded.function_label(), "SendRecv|Send|Recv");
        assert_eq!((decoded.peers, decoded.flows_per_peer), (-1, 0xfffe));
        let collectives = Operation {
            functions: UNDEFINED_MASK,
            ..range
        };
        assert_eq!(
            Operation::decode(collectives.encode().0).algorithm_label(),
            "undefined"
        );
        // Nothing said.
        assert_eq!(Operation::default().encode().0, 0);
        assert_eq!(Operation::decode(0).describe(), "none");
    }

    #[test]
    fn bits_past_the_word_are_held_as_undefined_and_reported() {
        let newer = operation(1 << 20, 1 << 9, 1 << 2);
        let (word, unrecorded) = newer.encode();
        assert_eq!(
            unrecorded,
            [
                Unrecorded::Functions(1 << 20),
                Unrecorded::Algorithms(1 << 9)
            ]
        );
        let decoded = Operation::decode(word);
        assert_eq!(
            (decoded.functions, decoded.algorithms),
            (UNDEFINED_MASK, UNDEFINED_MASK)
        );
        assert_eq!(decoded.protocols, 1 << 2);
        assert_eq!(names(1 << 17, &FUNCTION_NAMES), "bit17");
    }
}
