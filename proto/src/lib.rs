//! The sans-IO protocol core: every rule of the MPIB wire protocol as pure, deterministic code.
//!
//! Why a separate core: the engine (`net`) does I/O against the fabric seam, and everything it
//! decides (how a buffer is split, which QP carries it, what the immediate says, when a receive
//! is complete, how many work requests fit) is a function of plain values. Keeping those
//! functions here, without `unsafe`, I/O, floats or per-transfer allocation, lets them be tested
//! exhaustively (unit and property tests) and read against docs/PROTOCOL.md one file at a time.

#![forbid(unsafe_code)]

pub mod agent_wire;
pub mod chain;
pub mod completion;
pub mod credits;
pub mod cts;
pub mod cursor;
pub mod failback;
pub mod failover;
pub mod hint;
pub mod imm;
pub mod island;
pub mod link_frame;
pub mod mode;
pub mod policy;
pub mod post_plan;
pub mod qp_layout;
pub mod rail;
pub mod rail_mask;
pub mod recv_slots;
pub mod send_slots;
pub mod signal;
pub mod split;
pub mod srq;
pub mod srq_shared;
pub mod tcp_wire;
pub mod watchdog;
pub mod wire;
pub mod work;
pub mod wr_id;
