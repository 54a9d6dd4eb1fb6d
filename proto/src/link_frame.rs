//! What a control link carries between two processes (docs/PROTOCOL.md §1): **notices** about
//! the comms that ride it, and the **handshakes** of later connections between the same two
//! processes, each under an identifier the connector drew, so that a connection made after the
//! first costs no TCP connection of its own (issue 32).
//!
//! Two pure pieces, for the engine (src/net/observe/link.rs) to drive:
//! * the frame codec: [`encode_notice`], [`encode_handshake`], [`decode`];
//! * [`Inbox`], one per link end: which handshakes this end expects messages for, at most one
//!   message held for each, and what a frame from the peer does ([`Filed`]). Everything that
//!   arrives is bounded here (a frame's length, the handshakes open at once, one message per
//!   handshake), so a peer, however wrong, fills nothing without limit.
//!
//! A link has a connector end (the process that connected it) and an acceptor end; handshakes
//! on it always go from the connector end to the acceptor end, so which frames are legal
//! depends only on the [`End`].

use std::collections::HashMap;

/// First bytes of a notice; then the kind (u8), the comm's name (u64), a u16 length and that
/// much UTF-8.
pub const NOTICE_MAGIC: [u8; 8] = *b"MPIBNTC1";
/// Bytes before a notice's text.
pub const NOTICE_HEADER: usize = 8 + 1 + 8 + 2;
/// Longest notice text (a longer one is cut at a character boundary).
pub const NOTICE_TEXT_MAX: usize = 512;
/// First bytes of a handshake frame; then the step (u8), the handshake (u64), the listen id
/// (u64, 0 but in [`Step::Open`]), a u16 length and that many bytes of payload.
pub const HANDSHAKE_MAGIC: [u8; 8] = *b"MPIBHSK1";
/// Bytes before a handshake frame's payload.
pub const HANDSHAKE_HEADER: usize = 8 + 1 + 8 + 8 + 2;
/// Longest handshake payload: the largest handshake message (the 276-byte request) and a
/// reason of [`NOTICE_TEXT_MAX`] both fit.
pub const HANDSHAKE_PAYLOAD_MAX: usize = 512;
/// Handshakes one link end holds open at once; an open past it is refused.
pub const HANDSHAKES_MAX: usize = 4096;

// Every handshake message fits a frame whole (`encode_handshake` cuts nothing of them).
const _: () = assert!(crate::wire::CONNECT_REQUEST_LEN <= HANDSHAKE_PAYLOAD_MAX);
const _: () = assert!(crate::wire::CONNECT_REPLY_LEN <= HANDSHAKE_PAYLOAD_MAX);

/// What a notice says about the comm it names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoticeKind {
    /// The peer's comm failed; the text says why.
    Failed = 1,
    /// The peer closed its comm.
    Closed = 2,
}

/// A handshake frame's place in its handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Connector → acceptor: a new handshake for the listen comm named, with the request.
    Open = 1,
    /// Connector → acceptor: a later message of the handshake (the ready marker).
    ToAcceptor = 2,
    /// Acceptor → connector: the reply, then the link answer.
    ToConnector = 3,
    /// Either way: the sender gave the handshake up; the payload says why.
    Abandoned = 4,
}

/// Which end of a link this is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// This process connected the link: its handshakes go out on it.
    Connector,
    /// The peer connected it: the peer's handshakes come in on it.
    Acceptor,
}

/// One frame, borrowed from the input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Frame<'a> {
    /// About the comm `comm` of the receiving side.
    Notice {
        /// What the notice says of the comm.
        kind: NoticeKind,
        /// The receiving side's comm it is about.
        comm: u64,
        /// The sender's words (its error's text).
        text: &'a [u8],
    },
    /// Part of handshake `handshake`.
    Handshake {
        /// Its place in the handshake.
        step: Step,
        /// The handshake's id, the connector end's choice.
        handshake: u64,
        /// The listen comm it is for ([`Step::Open`] only; 0 otherwise).
        listen: u64,
        /// The handshake message (or, in [`Step::Abandoned`], why).
        payload: &'a [u8],
    },
}

/// What the start of an input holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decoded<'a> {
    /// A frame, and how many bytes it took.
    Frame(Frame<'a>, usize),
    /// Not all of the next frame yet.
    Incomplete,
    /// Bytes no frame starts with: the link carries something else, and ends.
    Invalid(String),
}

/// Appends a notice; the text is cut to [`NOTICE_TEXT_MAX`] bytes at a character boundary.
pub fn encode_notice(out: &mut Vec<u8>, kind: NoticeKind, comm: u64, text: &str) {
    let text = cut(text, NOTICE_TEXT_MAX);
    out.extend_from_slice(&NOTICE_MAGIC);
    out.push(kind as u8);
    out.extend_from_slice(&comm.to_le_bytes());
    out.extend_from_slice(&(text.len() as u16).to_le_bytes());
    out.extend_from_slice(text.as_bytes());
}

/// Bytes a notice with `text` takes (what [`encode_notice`] appends).
pub fn notice_len(text: &str) -> usize {
    NOTICE_HEADER + cut(text, NOTICE_TEXT_MAX).len()
}

/// Appends a handshake frame; a payload past [`HANDSHAKE_PAYLOAD_MAX`] is cut (only a reason can
/// be that long, and it is cut at a character boundary by [`abandon_reason`]).
pub fn encode_handshake(
    out: &mut Vec<u8>,
    step: Step,
    handshake: u64,
    listen: u64,
    payload: &[u8],
) {
    let payload = &payload[..payload.len().min(HANDSHAKE_PAYLOAD_MAX)];
    out.extend_from_slice(&HANDSHAKE_MAGIC);
    out.push(step as u8);
    out.extend_from_slice(&handshake.to_le_bytes());
    out.extend_from_slice(&listen.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u16).to_le_bytes());
    out.extend_from_slice(payload);
}

/// A reason for [`Step::Abandoned`], cut to fit a payload.
pub fn abandon_reason(text: &str) -> &[u8] {
    cut(text, HANDSHAKE_PAYLOAD_MAX).as_bytes()
}

fn cut(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(word)
}

fn u16_at(bytes: &[u8], at: usize) -> usize {
    usize::from(u16::from_le_bytes([bytes[at], bytes[at + 1]]))
}

/// Reads the frame at the start of `input`.
pub fn decode(input: &[u8]) -> Decoded<'_> {
    let Some(magic) = input.get(..8) else {
        return prefix_check(input);
    };
    if magic == NOTICE_MAGIC {
        let Some(header) = input.get(..NOTICE_HEADER) else {
            return Decoded::Incomplete;
        };
        let kind = match header[8] {
            1 => NoticeKind::Failed,
            2 => NoticeKind::Closed,
            other => return Decoded::Invalid(format!("a notice of unknown kind {other}")),
        };
        let length = u16_at(header, 17);
        if length > NOTICE_TEXT_MAX {
            return Decoded::Invalid(format!("a notice of {length} bytes of text"));
        }
        let Some(text) = input.get(NOTICE_HEADER..NOTICE_HEADER + length) else {
            return Decoded::Incomplete;
        };
        let comm = u64_at(header, 9);
        return Decoded::Frame(Frame::Notice { kind, comm, text }, NOTICE_HEADER + length);
    }
    if magic == HANDSHAKE_MAGIC {
        let Some(header) = input.get(..HANDSHAKE_HEADER) else {
            return Decoded::Incomplete;
        };
        let step = match header[8] {
            1 => Step::Open,
            2 => Step::ToAcceptor,
            3 => Step::ToConnector,
            4 => Step::Abandoned,
            other => return Decoded::Invalid(format!("a handshake frame of unknown step {other}")),
        };
        let length = u16_at(header, 25);
        if length > HANDSHAKE_PAYLOAD_MAX {
            return Decoded::Invalid(format!("a handshake frame of {length} bytes"));
        }
        let Some(payload) = input.get(HANDSHAKE_HEADER..HANDSHAKE_HEADER + length) else {
            return Decoded::Incomplete;
        };
        let frame = Frame::Handshake {
            step,
            handshake: u64_at(header, 9),
            listen: u64_at(header, 17),
            payload,
        };
        return Decoded::Frame(frame, HANDSHAKE_HEADER + length);
    }
    Decoded::Invalid(format!(
        "bytes that are no frame (first bytes {magic:02x?})"
    ))
}

/// Fewer than 8 bytes: incomplete while they can still start a magic.
fn prefix_check(input: &[u8]) -> Decoded<'_> {
    let starts = |magic: &[u8; 8]| magic.starts_with(input);
    if starts(&NOTICE_MAGIC) || starts(&HANDSHAKE_MAGIC) {
        Decoded::Incomplete
    } else {
        Decoded::Invalid(format!(
            "bytes that are no frame (first bytes {input:02x?})"
        ))
    }
}

/// A handshake's message slot at this end.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Slot {
    Waiting,
    /// A message not taken yet, and the peer's abandoning if it came after it (the message is
    /// taken first: a refusal reply says more than the abandon that follows it).
    Holding(Vec<u8>, Option<String>),
    Abandoned(String),
}

/// What a handshake frame from the peer does at this end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Filed {
    /// A message (or the peer's abandoning) is kept for the handshake; [`Inbox::take`] has it.
    Kept,
    /// A new handshake for listen comm `listen` (acceptor end): the engine routes it, then calls
    /// [`Inbox::expect`] if a listen comm takes it, or answers with [`Step::Abandoned`].
    Opened {
        /// The handshake's id.
        handshake: u64,
        /// The listen comm it names.
        listen: u64,
        /// The connector's request.
        request: Vec<u8>,
    },
    /// Refused: answer the peer's handshake with [`Step::Abandoned`] and this reason.
    Refused {
        /// The handshake's id.
        handshake: u64,
        /// Why, for the peer.
        reason: String,
    },
    /// Nothing to do: a late message for a handshake this end gave up (or never had).
    Ignored,
    /// A frame this end's peer never sends: the link ends with this reason.
    Violation(String),
}

/// One link end's handshakes in flight.
#[derive(Clone, Debug)]
pub struct Inbox {
    end: End,
    slots: HashMap<u64, Slot>,
}

impl Inbox {
    /// An empty inbox for a link's `end`.
    pub fn new(end: End) -> Inbox {
        Inbox {
            end,
            slots: HashMap::new(),
        }
    }

    /// Handshakes open at this end.
    pub fn open(&self) -> usize {
        self.slots.len()
    }

    /// Whether a handshake can be opened (this end has fewer than [`HANDSHAKES_MAX`]).
    pub fn has_room(&self) -> bool {
        self.slots.len() < HANDSHAKES_MAX
    }

    /// Expects messages for `handshake` from now on. False if it was already expected or the
    /// inbox is full.
    pub fn expect(&mut self, handshake: u64) -> bool {
        if !self.has_room() || self.slots.contains_key(&handshake) {
            return false;
        }
        self.slots.insert(handshake, Slot::Waiting);
        true
    }

    /// Stops expecting `handshake` (done or given up); what it held is dropped.
    pub fn forget(&mut self, handshake: u64) {
        self.slots.remove(&handshake);
    }

    /// The message held for `handshake`, `Some(Err(reason))` if the peer gave it up, `None`
    /// while nothing came.
    pub fn take(&mut self, handshake: u64) -> Option<Result<Vec<u8>, String>> {
        let slot = self.slots.get_mut(&handshake)?;
        match std::mem::replace(slot, Slot::Waiting) {
            Slot::Waiting => None,
            Slot::Holding(message, then) => {
                if let Some(reason) = then {
                    *slot = Slot::Abandoned(reason);
                }
                Some(Ok(message))
            }
            Slot::Abandoned(reason) => {
                *slot = Slot::Abandoned(reason.clone());
                Some(Err(reason))
            }
        }
    }

    /// Files a handshake frame from the peer.
    pub fn file(&mut self, step: Step, handshake: u64, listen: u64, payload: &[u8]) -> Filed {
        let legal = match self.end {
            End::Connector => matches!(step, Step::ToConnector | Step::Abandoned),
            End::Acceptor => matches!(step, Step::Open | Step::ToAcceptor | Step::Abandoned),
        };
        if !legal {
            return Filed::Violation(format!(
                "carried a {step:?} frame to its {:?} end",
                self.end
            ));
        }
        if step == Step::Open {
            return self.open_frame(handshake, listen, payload);
        }
        let Some(slot) = self.slots.get_mut(&handshake) else {
            return Filed::Ignored;
        };
        match (step, &mut *slot) {
            (_, Slot::Abandoned(_) | Slot::Holding(_, Some(_))) => Filed::Ignored,
            (Step::Abandoned, Slot::Holding(_, then)) => {
                *then = Some(String::from_utf8_lossy(payload).into_owned());
                Filed::Kept
            }
            (Step::Abandoned, Slot::Waiting) => {
                *slot = Slot::Abandoned(String::from_utf8_lossy(payload).into_owned());
                Filed::Kept
            }
            (_, Slot::Waiting) => {
                *slot = Slot::Holding(payload.to_vec(), None);
                Filed::Kept
            }
            (_, Slot::Holding(_, None)) => {
                // Each side sends its next message only after the other's: two at once is a
                // peer out of step. Its handshake ends; the link's other comms go on.
                let reason = "the peer sent two handshake messages without an answer".to_string();
                *slot = Slot::Abandoned(reason.clone());
                Filed::Refused { handshake, reason }
            }
        }
    }

    fn open_frame(&mut self, handshake: u64, listen: u64, payload: &[u8]) -> Filed {
        if handshake == 0 || self.slots.contains_key(&handshake) {
            // An identifier in use (or none): an answer under it would reach the handshake that
            // holds it, so nothing can refuse this one alone. A peer out of step: the link ends.
            return Filed::Violation(format!("opened handshake {handshake:#x} twice"));
        }
        if !self.has_room() {
            let reason = format!("{HANDSHAKES_MAX} handshakes are already open on this link");
            return Filed::Refused { handshake, reason };
        }
        Filed::Opened {
            handshake,
            listen,
            request: payload.to_vec(),
        }
    }
}

#[cfg(test)]
#[path = "link_frame_tests.rs"]
mod tests;
