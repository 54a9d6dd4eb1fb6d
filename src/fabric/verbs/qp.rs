//! RC queue pairs: creation on a CQ (and SRQ), INIT -> RTR -> RTS, and posting WR chains built
//! on the stack.

use std::ffi::c_int;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::library::{ibv_create_qp, ibv_destroy_qp, ibv_modify_qp};
use rdma_sys::{
    ibv_access_flags, ibv_qp, ibv_qp_attr, ibv_qp_attr_mask, ibv_qp_cap, ibv_qp_init_attr,
    ibv_qp_state, ibv_qp_type, ibv_send_flags, ibv_send_wr, ibv_sge, ibv_wr_opcode,
};

use super::device::DeviceInner;
use super::endpoint::PortAddress;
use super::queues::{CqInner, SrqInner, VerbsCq, VerbsSrq};
use super::{fabric_error, gid, sys, teardown_failed};
use crate::fabric::{
    CompletionQueue, FabricError, FabricResult, LinkLayer, QpCapabilities, QpSettings, QueuePair,
    RemoteQp, SendOpcode, SharedReceiveQueue, WorkRequest,
};

/// Longest chain `post_send` accepts (MPIB's chains are at most 9 WRs).
pub(crate) const MAX_CHAIN: usize = 16;

/// An RC queue pair. Holds its CQ, SRQ and device, so they outlive it.
pub struct VerbsQp {
    qp: *mut ibv_qp,
    qp_num: u32,
    port: u8,
    /// The local port's address (link layer, GID index, active MTU).
    local: PortAddress,
    device: Arc<DeviceInner>,
    _cq: Arc<CqInner>,
    _srq: Option<Arc<SrqInner>>,
    /// Since when the QP is in error at `QueuePair::fail`'s request, and whether it has
    /// quiesced since.
    failed: Option<(Instant, bool)>,
}

// SAFETY: the QP pointer is only passed to thread-safe verbs; posting needs `&mut self`.
unsafe impl Send for VerbsQp {}

/// How long a failover waits for a QP's last-WQE-reached event at most (the housekeeping thread
/// reads events every 10 ms; a NIC raises it as soon as the QP stops taking receives).
const LAST_WQE_WAIT: Duration = Duration::from_millis(500);

impl Drop for VerbsQp {
    fn drop(&mut self) {
        self.device.last_wqe().remove(&self.qp_num);
        // SAFETY: `qp` came from ibv_create_qp and is destroyed once; the CQ/SRQ/device it uses
        // are released only after this (fields drop after `drop`).
        let rc = unsafe { ibv_destroy_qp(self.qp) };
        if rc != 0 {
            let what = format!("{} QP {}", self.device.label, self.qp_num);
            teardown_failed("ibv_destroy_qp", &what, rc);
        }
    }
}

impl VerbsQp {
    /// Creates an RC QP on `device` whose completions go to `cq` and receives come from `srq`.
    pub(crate) fn create(
        device: &Arc<DeviceInner>,
        local: &PortAddress,
        cq: &dyn CompletionQueue,
        srq: Option<&dyn SharedReceiveQueue>,
        caps: QpCapabilities,
    ) -> FabricResult<VerbsQp> {
        let verb = "ibv_create_qp";
        let einval = |detail: &str| device.error(verb, libc::EINVAL, detail);
        let cq = cq
            .as_any()
            .downcast_ref::<VerbsCq>()
            .ok_or_else(|| einval("the CQ was not created by the verbs fabric"))?;
        let srq = match srq {
            None => None,
            Some(s) => Some(
                s.as_any()
                    .downcast_ref::<VerbsSrq>()
                    .ok_or_else(|| einval("the SRQ was not created by the verbs fabric"))?,
            ),
        };
        let same = |other: &Arc<DeviceInner>| Arc::ptr_eq(other, device);
        if !same(&cq.inner.device) || srq.is_some_and(|s| !same(&s.inner.device)) {
            return Err(einval("the CQ and SRQ must be created on the QP's device"));
        }
        let mut init = ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: cq.inner.cq,
            recv_cq: cq.inner.cq,
            srq: srq.map_or(std::ptr::null_mut(), |s| s.inner.srq),
            cap: ibv_qp_cap {
                max_send_wr: caps.max_send_wr,
                max_recv_wr: 0,
                max_send_sge: 1,
                max_recv_sge: 0,
                max_inline_data: caps.max_inline,
            },
            qp_type: ibv_qp_type::IBV_QPT_RC,
            sq_sig_all: 0,
        };
        sys::clear_errno();
        // SAFETY: the PD, CQ and SRQ are live (we hold them); `init` is a valid in/out parameter.
        let qp = unsafe { ibv_create_qp(device.pd(), &mut init) };
        if qp.is_null() {
            let detail = format!(
                "max_send_wr {} max_inline {} srq {}",
                caps.max_send_wr,
                caps.max_inline,
                srq.is_some()
            );
            return Err(device.error(verb, sys::errno(), detail));
        }
        Ok(VerbsQp {
            qp,
            // SAFETY: a non-null `ibv_qp` from ibv_create_qp.
            qp_num: unsafe { (*qp).qp_num },
            port: device.port,
            local: *local,
            device: Arc::clone(device),
            _cq: Arc::clone(&cq.inner),
            _srq: srq.map(|s| Arc::clone(&s.inner)),
            failed: None,
        })
    }

    /// An error about this QP.
    fn error(&self, verb: &'static str, errno: i32, detail: impl Into<String>) -> FabricError {
        fabric_error(verb, &self.device.label, Some(self.qp_num), errno, detail)
    }

    /// `ibv_modify_qp` with `mask`, mapping a failure to an error naming `verb`.
    fn modify(
        &self,
        verb: &'static str,
        attr: &mut ibv_qp_attr,
        mask: ibv_qp_attr_mask,
        remote: &Remote,
    ) -> FabricResult<()> {
        sys::clear_errno();
        // SAFETY: the QP is live; `attr` is valid for the fields `mask` names.
        let rc = unsafe { ibv_modify_qp(self.qp, attr, mask.0 as c_int) };
        if rc != 0 {
            let detail = format!(
                "remote QP {} lid {} gid {} path mtu {}, local port {} gid index {}",
                remote.qp_num,
                remote.address.lid,
                gid::format_gid(&remote.address.gid),
                remote.path_mtu,
                self.port,
                self.local.gid_index
            );
            return Err(self.error(verb, sys::rc_errno(rc), detail));
        }
        Ok(())
    }
}

/// A peer's QP as this fabric reads it: its number, its port's address and the path MTU both
/// ports support.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Remote {
    pub qp_num: u32,
    pub address: PortAddress,
    pub path_mtu: u8,
}

/// The RTR attributes against `remote` (pure, so tests can check them).
pub(crate) fn rtr_attr(
    remote: &Remote,
    settings: &QpSettings,
    port: u8,
    link_layer: LinkLayer,
    gid_index: u8,
) -> ibv_qp_attr {
    // SAFETY: all-zero is a valid `ibv_qp_attr` (integers, and unions of integer arrays).
    let mut attr: ibv_qp_attr = unsafe { std::mem::zeroed() };
    attr.qp_state = ibv_qp_state::IBV_QPS_RTR;
    attr.path_mtu = u32::from(remote.path_mtu);
    attr.dest_qp_num = remote.qp_num;
    attr.rq_psn = 0;
    attr.max_dest_rd_atomic = 1;
    attr.min_rnr_timer = settings.min_rnr_timer;
    attr.ah_attr.port_num = port;
    attr.ah_attr.sl = settings.service_level;
    match link_layer {
        LinkLayer::InfiniBand => {
            attr.ah_attr.is_global = 0;
            attr.ah_attr.dlid = remote.address.lid;
        }
        LinkLayer::Ethernet => {
            attr.ah_attr.is_global = 1;
            attr.ah_attr.grh.dgid.raw = remote.address.gid;
            attr.ah_attr.grh.sgid_index = gid_index;
            attr.ah_attr.grh.hop_limit = 255;
            attr.ah_attr.grh.traffic_class = settings.traffic_class;
        }
    }
    attr
}

/// The RTS attributes (pure).
pub(crate) fn rts_attr(settings: &QpSettings) -> ibv_qp_attr {
    // SAFETY: all-zero is a valid `ibv_qp_attr`.
    let mut attr: ibv_qp_attr = unsafe { std::mem::zeroed() };
    attr.qp_state = ibv_qp_state::IBV_QPS_RTS;
    attr.timeout = settings.timeout;
    attr.retry_cnt = settings.retry_count;
    attr.rnr_retry = settings.rnr_retry;
    attr.sq_psn = 0;
    attr.max_rd_atomic = 1;
    attr
}

impl QueuePair for VerbsQp {
    fn qp_num(&self) -> u32 {
        self.qp_num
    }

    fn connect(&mut self, remote: &RemoteQp, settings: &QpSettings) -> FabricResult<()> {
        let address = PortAddress::decode(&remote.endpoint).map_err(|detail| {
            let detail = format!("remote QP {}: {detail}", remote.qp_num);
            self.error("ibv_modify_qp(RTR)", libc::EINVAL, detail)
        })?;
        let remote = &Remote {
            qp_num: remote.qp_num,
            address,
            // The path MTU is what both ports support (as net_ib takes the minimum).
            path_mtu: address.mtu.min(self.local.mtu),
        };
        if super::attrs::mtu_bytes(remote.path_mtu) == 0 {
            let detail = format!(
                "path MTU enum {} (local port {}) is not 1 (256) ..= 5 (4096)",
                remote.path_mtu, self.local.mtu
            );
            return Err(self.error("ibv_modify_qp(RTR)", libc::EINVAL, detail));
        }
        use ibv_qp_attr_mask as m;
        // SAFETY: all-zero is a valid `ibv_qp_attr`.
        let mut init: ibv_qp_attr = unsafe { std::mem::zeroed() };
        init.qp_state = ibv_qp_state::IBV_QPS_INIT;
        init.pkey_index = 0;
        init.port_num = self.port;
        init.qp_access_flags = (ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
            | ibv_access_flags::IBV_ACCESS_REMOTE_READ
            | ibv_access_flags::IBV_ACCESS_LOCAL_WRITE)
            .0;
        let mask = m::IBV_QP_STATE | m::IBV_QP_PKEY_INDEX | m::IBV_QP_PORT | m::IBV_QP_ACCESS_FLAGS;
        self.modify("ibv_modify_qp(INIT)", &mut init, mask, remote)?;
        let mut rtr = rtr_attr(
            remote,
            settings,
            self.port,
            self.local.link_layer,
            self.local.gid_index,
        );
        let mask = m::IBV_QP_STATE
            | m::IBV_QP_AV
            | m::IBV_QP_PATH_MTU
            | m::IBV_QP_DEST_QPN
            | m::IBV_QP_RQ_PSN
            | m::IBV_QP_MAX_DEST_RD_ATOMIC
            | m::IBV_QP_MIN_RNR_TIMER;
        self.modify("ibv_modify_qp(RTR)", &mut rtr, mask, remote)?;
        let mut rts = rts_attr(settings);
        let mask = m::IBV_QP_STATE
            | m::IBV_QP_TIMEOUT
            | m::IBV_QP_RETRY_CNT
            | m::IBV_QP_RNR_RETRY
            | m::IBV_QP_SQ_PSN
            | m::IBV_QP_MAX_QP_RD_ATOMIC;
        self.modify("ibv_modify_qp(RTS)", &mut rts, mask, remote)
    }

    unsafe fn post_send(&mut self, chain: &[WorkRequest]) -> FabricResult<()> {
        if chain.is_empty() {
            return Ok(());
        }
        let mut wrs = SendChain::new();
        let head = wrs
            .fill(chain)
            .map_err(|detail| self.error("ibv_post_send", libc::EINVAL, detail))?;
        let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
        // SAFETY: the QP is live; `head` is a NULL-terminated list inside `wrs`, which is not
        // moved until the call returns; the caller keeps the SGE and remote ranges registered.
        let rc = unsafe { sys::post_send(self.qp, head, &mut bad) };
        if rc != 0 {
            let index = wrs.index_of(bad);
            let detail = match index {
                Some(i) => format!(
                    "WR {i} of {} ({:?}, {} bytes) refused",
                    chain.len(),
                    chain[i].opcode,
                    chain[i].length()
                ),
                None => format!("chain of {} refused", chain.len()),
            };
            return Err(self.error("ibv_post_send", sys::rc_errno(rc), detail));
        }
        Ok(())
    }

    fn fail(&mut self) -> FabricResult<()> {
        // SAFETY: all-zero is a valid `ibv_qp_attr`; only the state is read.
        let mut attr: ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = ibv_qp_state::IBV_QPS_ERR;
        sys::clear_errno();
        // SAFETY: the QP is live; `attr` is valid for the state field the mask names.
        let rc = unsafe {
            ibv_modify_qp(
                self.qp,
                &mut attr,
                ibv_qp_attr_mask::IBV_QP_STATE.0 as c_int,
            )
        };
        if rc != 0 {
            return Err(self.error(
                "ibv_modify_qp(ERR)",
                sys::rc_errno(rc),
                "moving the QP to the error state for a failover",
            ));
        }
        self.failed.get_or_insert((Instant::now(), false));
        Ok(())
    }

    /// A QP without a shared receive queue places nothing more once the modify returned, and
    /// flushes its sends. One that takes receives from a shared queue may still be finishing one
    /// it took: the HCA says when it has with `IBV_EVENT_QP_LAST_WQE_REACHED` (read by the
    /// housekeeping thread: src/fabric/verbs/events.rs), after which every completion of such a
    /// receive is in the CQ. A device that never says so is waited for `LAST_WQE_WAIT` at most,
    /// once (a late completion then fails the connection as an IMM on a failed rail; it never
    /// lands unseen: docs/PROTOCOL.md §10).
    fn quiesced(&mut self) -> FabricResult<bool> {
        let Some((since, done)) = self.failed else {
            return Ok(false);
        };
        if done || self._srq.is_none() || self.device.last_wqe().remove(&self.qp_num) {
            self.failed = Some((since, true));
            return Ok(true);
        }
        if since.elapsed() < LAST_WQE_WAIT {
            return Ok(false);
        }
        warn!(
            crate::log::NET,
            "{} QP {}: no last-WQE-reached event {} ms after it was moved to the error state; going on",
            self.device.label,
            self.qp_num,
            LAST_WQE_WAIT.as_millis()
        );
        self.failed = Some((since, true));
        Ok(true)
    }
}

/// A chain of send WRs and their SGEs, laid out on the stack. The list is self-referential
/// once filled: it must not move between [`SendChain::fill`] and the post.
pub(crate) struct SendChain {
    pub(crate) wrs: [ibv_send_wr; MAX_CHAIN],
    pub(crate) sges: [ibv_sge; MAX_CHAIN],
}

impl SendChain {
    /// An all-zero chain.
    pub(crate) fn new() -> SendChain {
        SendChain {
            // SAFETY: all-zero is a valid `ibv_send_wr` (integers, NULL pointers, unions of them).
            wrs: unsafe { std::mem::zeroed() },
            sges: [ibv_sge {
                addr: 0,
                length: 0,
                lkey: 0,
            }; MAX_CHAIN],
        }
    }

    /// Fills the first `chain.len()` WRs and links them; returns the head. The error is the
    /// detail text (an over-long chain).
    pub(crate) fn fill(&mut self, chain: &[WorkRequest]) -> Result<*mut ibv_send_wr, String> {
        if chain.len() > MAX_CHAIN {
            return Err(format!("chain of {} WRs exceeds {MAX_CHAIN}", chain.len()));
        }
        let wr_base = self.wrs.as_mut_ptr();
        let sge_base = self.sges.as_mut_ptr();
        for (i, request) in chain.iter().enumerate() {
            let (opcode, imm) = match request.opcode {
                SendOpcode::Write => (ibv_wr_opcode::IBV_WR_RDMA_WRITE, 0),
                SendOpcode::WriteWithImm { imm } => {
                    (ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM, imm)
                }
                SendOpcode::Read => (ibv_wr_opcode::IBV_WR_RDMA_READ, 0),
            };
            let mut flags = 0;
            if request.signaled {
                flags |= ibv_send_flags::IBV_SEND_SIGNALED.0;
            }
            if request.inline {
                flags |= ibv_send_flags::IBV_SEND_INLINE.0;
            }
            let (sg_list, num_sge) = match request.sge {
                Some(sge) => {
                    // SAFETY: i < chain.len() <= MAX_CHAIN: inside `sges`. Writing through the
                    // base pointer keeps the pointers stored in the list valid.
                    let slot = unsafe { sge_base.add(i) };
                    // SAFETY: `slot` is in bounds and points to an initialised `ibv_sge`.
                    unsafe {
                        *slot = ibv_sge {
                            addr: sge.addr,
                            length: sge.length,
                            lkey: sge.lkey,
                        }
                    };
                    (slot, 1)
                }
                None => (std::ptr::null_mut(), 0),
            };
            let next = if i + 1 < chain.len() {
                // SAFETY: i + 1 < chain.len() <= MAX_CHAIN: inside `wrs`.
                unsafe { wr_base.add(i + 1) }
            } else {
                std::ptr::null_mut()
            };
            // SAFETY: i < MAX_CHAIN: inside `wrs`; derived from the base pointer (see above).
            let wr = unsafe { &mut *wr_base.add(i) };
            wr.wr_id = request.wr_id;
            wr.next = next;
            wr.sg_list = sg_list;
            wr.num_sge = num_sge;
            wr.opcode = opcode;
            wr.send_flags = flags;
            wr.imm_data_invalidated_rkey_union.imm_data = imm;
            wr.wr.rdma.remote_addr = request.remote_addr;
            wr.wr.rdma.rkey = request.rkey;
        }
        Ok(wr_base)
    }

    /// Position of `wr` in the chain (the `bad_wr` of a failed post).
    pub(crate) fn index_of(&self, wr: *const ibv_send_wr) -> Option<usize> {
        self.wrs.iter().position(|w| std::ptr::eq(w, wr))
    }
}
