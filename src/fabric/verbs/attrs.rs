//! Pure translations between verbs values and the seam's types: port speed (NCCL's width and
//! lane-rate tables), port states, MTUs, work completions and async event types. No FFI calls:
//! everything here is unit-tested on machines without RDMA.

use crate::fabric::{AsyncEvent, Completion, CompletionOpcode, CompletionStatus, LinkLayer};

/// `IBV_LINK_LAYER_INFINIBAND` (an anonymous enum in `verbs.h`, absent from rdma-sys).
pub(crate) const LINK_LAYER_INFINIBAND: u8 = 1;
/// `IBV_LINK_LAYER_ETHERNET`.
pub(crate) const LINK_LAYER_ETHERNET: u8 = 2;
/// `IBV_PORT_ACTIVE`.
pub(crate) const PORT_ACTIVE: u32 = 4;
/// `IBV_WC_WITH_IMM` in `ibv_wc.wc_flags`.
pub(crate) const WC_WITH_IMM: u32 = 1 << 1;

/// Lanes per `ibv_port_attr.active_width` bit, in NCCL's order (`ncclIbWidth`): 1x, 4x, 8x,
/// 12x, 2x; the last entry also answers for an unknown width.
const WIDTHS: [u32; 5] = [1, 4, 8, 12, 2];
/// Mbps per lane per `ibv_port_attr.active_speed` bit (`ncclIbSpeed`): SDR, DDR, QDR, FDR10,
/// FDR, EDR, HDR, NDR, XDR; the last entry also answers for an unknown speed.
const LANE_MBPS: [u32; 9] = [
    2_500, 5_000, 10_000, 10_000, 14_000, 25_000, 50_000, 100_000, 200_000,
];

/// NCCL's `firstBitSet(val, max)`: index of the lowest set bit, capped at `max`.
fn first_bit_set(value: u32, max: usize) -> usize {
    (0..max).find(|bit| value & (1 << bit) != 0).unwrap_or(max)
}

/// Number of lanes for an `active_width` value (as NCCL computes it).
pub(crate) fn width_lanes(active_width: u8) -> u32 {
    WIDTHS[first_bit_set(u32::from(active_width), WIDTHS.len() - 1)]
}

/// Per-lane rate in Mbps for an `active_speed` value (as NCCL computes it).
pub(crate) fn lane_mbps(active_speed: u8) -> u32 {
    LANE_MBPS[first_bit_set(u32::from(active_speed), LANE_MBPS.len() - 1)]
}

/// Port speed in Mbps: lanes x lane rate.
pub(crate) fn speed_mbps(active_width: u8, active_speed: u8) -> u32 {
    width_lanes(active_width).saturating_mul(lane_mbps(active_speed))
}

/// Name of an `ibv_port_state` value, as `ibv_port_state_str` prints it.
pub(crate) fn port_state_name(state: u32) -> &'static str {
    match state {
        0 => "NOP",
        1 => "DOWN",
        2 => "INIT",
        3 => "ARMED",
        4 => "ACTIVE",
        5 => "ACTIVE_DEFER",
        _ => "unknown",
    }
}

/// The seam's link layer for a `ibv_port_attr.link_layer` value. Unspecified (0) is
/// InfiniBand, as `verbs.h` defines it; anything else unknown is refused.
pub(crate) fn link_layer(value: u8) -> Option<LinkLayer> {
    match value {
        0 | LINK_LAYER_INFINIBAND => Some(LinkLayer::InfiniBand),
        LINK_LAYER_ETHERNET => Some(LinkLayer::Ethernet),
        _ => None,
    }
}

/// Bytes of an `ibv_mtu` value (0 when the value is not an MTU).
pub(crate) fn mtu_bytes(mtu: u8) -> u32 {
    match mtu {
        1..=5 => 128 << mtu,
        _ => 0,
    }
}

/// The seam's status for an `ibv_wc_status` value.
pub(crate) fn completion_status(status: u32) -> CompletionStatus {
    match status {
        0 => CompletionStatus::Success,
        4 => CompletionStatus::LocalProtection,
        5 => CompletionStatus::Flushed,
        10 => CompletionStatus::RemoteAccess,
        12 => CompletionStatus::RetryExceeded,
        13 => CompletionStatus::ReceiverNotReady,
        other => CompletionStatus::Other(other),
    }
}

/// The seam's opcode for an `ibv_wc_opcode` value. Receive-side opcodes have bit 7 set
/// (`IBV_WC_RECV`); an opcode MPIB never uses is reported by its side. On error completions
/// the opcode is undefined, as in verbs.
pub(crate) fn completion_opcode(opcode: u32) -> CompletionOpcode {
    match opcode {
        2 => CompletionOpcode::RdmaRead,
        code if code & 0x80 != 0 => CompletionOpcode::RecvRdmaWithImm,
        _ => CompletionOpcode::RdmaWrite,
    }
}

/// The fields of an `ibv_wc` that MPIB reads, copied out of the CQ.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RawCompletion {
    /// `wr_id`.
    pub wr_id: u64,
    /// `status` (`ibv_wc_status`).
    pub status: u32,
    /// `opcode` (`ibv_wc_opcode`).
    pub opcode: u32,
    /// `vendor_err`.
    pub vendor_err: u32,
    /// `byte_len`.
    pub byte_len: u32,
    /// `imm_data` (network byte order), valid when `wc_flags` has `IBV_WC_WITH_IMM`.
    pub imm_data: u32,
    /// `qp_num`.
    pub qp_num: u32,
    /// `wc_flags`.
    pub wc_flags: u32,
}

/// The seam's completion for a raw one; the immediate is passed on unchanged (network order).
pub(crate) fn completion(raw: &RawCompletion) -> Completion {
    Completion {
        wr_id: raw.wr_id,
        status: completion_status(raw.status),
        opcode: completion_opcode(raw.opcode),
        byte_len: raw.byte_len,
        imm: if raw.wc_flags & WC_WITH_IMM != 0 {
            raw.imm_data
        } else {
            0
        },
        qp_num: raw.qp_num,
        vendor_err: raw.vendor_err,
    }
}

/// What to do with an async event read from a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EventAction {
    /// Report it to the engine.
    Report(AsyncEvent),
    /// Log it at INFO and read the next one (informational, or about another port).
    Skip,
    /// Log it at WARN and read the next one: serious, but the seam has no variant for it.
    Warn,
}

/// Classifies an `ibv_event_type` value. `event_port` is the port a port event is about,
/// `port` the port this device uses, `qp_num` the QP of a QP event.
pub(crate) fn classify_event(
    event_type: u32,
    event_port: u32,
    port: u8,
    qp_num: u32,
) -> EventAction {
    let ours = event_port == u32::from(port);
    match event_type {
        0 => EventAction::Report(AsyncEvent::CqError),
        1..=3 => EventAction::Report(AsyncEvent::QpFatal { qp_num }),
        8 => EventAction::Report(AsyncEvent::DeviceFatal),
        9 if ours => EventAction::Report(AsyncEvent::PortActive),
        10 if ours => EventAction::Report(AsyncEvent::PortDown),
        14 | 19 => EventAction::Warn,
        15 => EventAction::Report(AsyncEvent::SrqLimit),
        _ => EventAction::Skip,
    }
}

/// Name of an `ibv_event_type` value, as `ibv_event_type_str` prints it.
pub(crate) fn event_name(event_type: u32) -> &'static str {
    const NAMES: [&str; 20] = [
        "CQ error",
        "local work queue catastrophic error",
        "invalid request local work queue error",
        "local access violation work queue error",
        "communication established",
        "send queue drained",
        "path migrated",
        "path migration request error",
        "local catastrophic error",
        "port active",
        "port error",
        "LID change",
        "P_Key change",
        "SM change",
        "SRQ catastrophic error",
        "SRQ limit reached",
        "last WQE reached",
        "client reregistration",
        "GID table change",
        "WQ fatal",
    ];
    usize::try_from(event_type)
        .ok()
        .and_then(|i| NAMES.get(i).copied())
        .unwrap_or("unknown event")
}
