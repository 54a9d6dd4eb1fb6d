//! Async events, read without blocking (the device's async fd is non-blocking) and without a
//! thread: the engine asks with `next_async_event` when it wants to know.

use super::library::{ibv_ack_async_event, ibv_get_async_event};
use rdma_sys::{ibv_async_event, ibv_async_event_element_t};

use super::attrs::{self, EventAction};
use super::device::DeviceInner;
use crate::fabric::AsyncEvent;
use crate::log;

/// `struct ibv_async_event` with the event type read as a plain integer: rdma-sys makes it a
/// Rust enum, and a kernel newer than the bindings could hand over a value outside it.
#[repr(C)]
pub(crate) struct RawAsyncEvent {
    /// The `element` union (a CQ, QP, SRQ or WQ pointer, or the port number).
    element: ibv_async_event_element_t,
    /// `enum ibv_event_type`.
    event_type: u32,
}

/// `IBV_EVENT_QP_LAST_WQE_REACHED`.
const LAST_WQE_REACHED: u32 = 16;

/// Events read and acknowledged per call at most, so a flood cannot keep the caller here.
const MAX_SKIPPED: usize = 64;

/// Reads the next event that matters to the engine; informational ones are logged and skipped.
/// `None` when no event is pending.
pub(crate) fn next_async_event(device: &DeviceInner) -> Option<AsyncEvent> {
    for _ in 0..MAX_SKIPPED {
        let mut event = RawAsyncEvent {
            element: ibv_async_event_element_t {
                cq: std::ptr::null_mut(),
            },
            event_type: 0,
        };
        // SAFETY: the context is live and its async fd non-blocking (EAGAIN when empty);
        // `RawAsyncEvent` has the layout of `struct ibv_async_event` (a pointer-sized union,
        // then a 32-bit enum).
        let rc = unsafe {
            ibv_get_async_event(
                device.context(),
                (&mut event as *mut RawAsyncEvent).cast::<ibv_async_event>(),
            )
        };
        if rc != 0 {
            return None;
        }
        let kind = event.event_type;
        // SAFETY: every bit pattern is a valid raw pointer; for QP events the element is the
        // QP, alive until the event is acked.
        let qp = ((1..=3).contains(&kind) || kind == LAST_WQE_REACHED)
            .then_some(unsafe { event.element.qp });
        let qp_num = match qp {
            // SAFETY: as above: a live QP until the ack below.
            Some(qp) if !qp.is_null() => unsafe { (*qp).qp_num },
            _ => 0,
        };
        // SAFETY: port events (PORT_ACTIVE .. SM_CHANGE, CLIENT_REREGISTER, GID_CHANGE) carry
        // the port number in the union; others are not read as one.
        let event_port =
            matches!(kind, 9..=13 | 17 | 18).then(|| unsafe { event.element.port_num });
        let event_port = event_port.and_then(|p| u32::try_from(p).ok()).unwrap_or(0);
        // SAFETY: `event` was filled by ibv_get_async_event and is acked exactly once.
        unsafe {
            ibv_ack_async_event((&mut event as *mut RawAsyncEvent).cast::<ibv_async_event>())
        };
        if kind == LAST_WQE_REACHED {
            // A QP of a shared receive queue in the error state takes no more of its receives:
            // what a failover's `quiesced` waits for (src/fabric/verbs/qp.rs).
            device.last_wqe().insert(qp_num);
            continue;
        }
        match attrs::classify_event(kind, event_port, device.port, qp_num) {
            EventAction::Report(reported) => {
                let name = attrs::event_name(kind);
                if matches!(reported, AsyncEvent::PortActive | AsyncEvent::SrqLimit) {
                    info!(log::NET, "{}: async event: {name} ({kind})", device.label);
                } else {
                    warn!(
                        log::NET,
                        "{}: async event: {name} ({kind}){}",
                        device.label,
                        qp_suffix(qp_num)
                    );
                }
                return Some(reported);
            }
            EventAction::Warn => {
                warn!(
                    log::NET,
                    "{}: async event: {} ({kind}), not reported to the engine",
                    device.label,
                    attrs::event_name(kind)
                );
            }
            EventAction::Skip => {
                info!(
                    log::NET,
                    "{}: async event: {} ({kind}, port {event_port}), ignored",
                    device.label,
                    attrs::event_name(kind)
                );
            }
        }
    }
    None
}

fn qp_suffix(qp_num: u32) -> String {
    if qp_num == 0 {
        String::new()
    } else {
        format!(" on QP {qp_num}")
    }
}
