//! Host-runnable unit tests of the verbs backend: the pure translations, GID selection, WR
//! building and the no-device paths. The device tests live in `tests/verbs_device.rs`.

use super::attrs::{self, EventAction, RawCompletion};
use super::endpoint::PortAddress;
use super::gid::{self, GidEntry, GidType};
use super::memory::access_flags;
use super::qp::{rtr_attr, rts_attr, Remote, SendChain, MAX_CHAIN};
use super::queues::{link_receives, RECV_BATCH};
use super::{parse_spec, sys, VerbsFabric};
use crate::fabric::{
    Access, AsyncEvent, CompletionOpcode, CompletionStatus, Fabric, LinkLayer, QpSettings, Rail,
    SendOpcode, Sge, WorkRequest,
};
use crate::params::Settings;
use rdma_sys::{ibv_access_flags as af, ibv_recv_wr, ibv_send_flags, ibv_wr_opcode};

#[test]
fn speed_is_width_times_lane_rate_as_in_nccl() {
    // active_width: 1 = 1x, 2 = 4x, 4 = 8x, 8 = 12x, 16 = 2x.
    assert_eq!(attrs::speed_mbps(2, 32), 100_000, "4x EDR");
    assert_eq!(attrs::speed_mbps(2, 64), 200_000, "4x HDR");
    assert_eq!(attrs::speed_mbps(2, 128), 400_000, "4x NDR");
    assert_eq!(attrs::speed_mbps(1, 1), 2_500, "1x SDR");
    assert_eq!(attrs::speed_mbps(16, 128), 200_000, "2x NDR");
    assert_eq!(attrs::speed_mbps(8, 4), 120_000, "12x QDR");
    assert_eq!(attrs::speed_mbps(4, 8), 80_000, "8x FDR10");
    assert_eq!(attrs::speed_mbps(1, 16), 14_000, "1x FDR");
    assert_eq!(attrs::speed_mbps(1, 2), 5_000, "1x DDR");
    // NCCL's firstBitSet caps at the last entry: unknown values take the last column.
    assert_eq!(attrs::width_lanes(0), 2);
    assert_eq!(attrs::lane_mbps(0), 200_000);
    // The lowest set bit decides.
    assert_eq!(attrs::width_lanes(2 | 8), 4);
}

#[test]
fn port_names_mtus_and_link_layers() {
    assert_eq!(attrs::port_state_name(4), "ACTIVE");
    assert_eq!(attrs::port_state_name(1), "DOWN");
    assert_eq!(attrs::port_state_name(99), "unknown");
    assert_eq!(attrs::mtu_bytes(1), 256);
    assert_eq!(attrs::mtu_bytes(5), 4096);
    assert_eq!(attrs::mtu_bytes(0), 0);
    assert_eq!(attrs::link_layer(1), Some(LinkLayer::InfiniBand));
    assert_eq!(attrs::link_layer(0), Some(LinkLayer::InfiniBand));
    assert_eq!(attrs::link_layer(2), Some(LinkLayer::Ethernet));
    assert_eq!(attrs::link_layer(3), None);
}

#[test]
fn wc_status_maps_to_the_seam_and_back() {
    for code in 0..32u32 {
        assert_eq!(attrs::completion_status(code).code(), code, "status {code}");
    }
    assert_eq!(attrs::completion_status(0), CompletionStatus::Success);
    assert_eq!(
        attrs::completion_status(4),
        CompletionStatus::LocalProtection
    );
    assert_eq!(attrs::completion_status(5), CompletionStatus::Flushed);
    assert_eq!(attrs::completion_status(10), CompletionStatus::RemoteAccess);
    assert_eq!(
        attrs::completion_status(12),
        CompletionStatus::RetryExceeded
    );
    assert_eq!(
        attrs::completion_status(13),
        CompletionStatus::ReceiverNotReady
    );
    assert_eq!(attrs::completion_status(9), CompletionStatus::Other(9));
}

#[test]
fn wc_opcodes_and_immediates() {
    assert_eq!(attrs::completion_opcode(1), CompletionOpcode::RdmaWrite);
    assert_eq!(attrs::completion_opcode(2), CompletionOpcode::RdmaRead);
    assert_eq!(
        attrs::completion_opcode(129),
        CompletionOpcode::RecvRdmaWithImm
    );
    let raw = RawCompletion {
        wr_id: 7,
        status: 0,
        opcode: 129,
        vendor_err: 3,
        byte_len: 4096,
        imm_data: 0x1234_5678,
        qp_num: 0x11,
        wc_flags: attrs::WC_WITH_IMM,
    };
    let c = attrs::completion(&raw);
    assert_eq!(
        (c.wr_id, c.byte_len, c.imm, c.qp_num, c.vendor_err),
        (7, 4096, 0x1234_5678, 0x11, 3)
    );
    assert_eq!(c.opcode, CompletionOpcode::RecvRdmaWithImm);
    // Without IBV_WC_WITH_IMM the union holds no immediate.
    let c = attrs::completion(&RawCompletion { wc_flags: 0, ..raw });
    assert_eq!(c.imm, 0);
}

#[test]
fn async_events_are_classified() {
    let report = |e| EventAction::Report(e);
    assert_eq!(
        attrs::classify_event(10, 1, 1, 0),
        report(AsyncEvent::PortDown)
    );
    assert_eq!(
        attrs::classify_event(9, 1, 1, 0),
        report(AsyncEvent::PortActive)
    );
    assert_eq!(
        attrs::classify_event(10, 2, 1, 0),
        EventAction::Skip,
        "another port"
    );
    assert_eq!(
        attrs::classify_event(8, 0, 1, 0),
        report(AsyncEvent::DeviceFatal)
    );
    for kind in 1..=3 {
        assert_eq!(
            attrs::classify_event(kind, 0, 1, 42),
            report(AsyncEvent::QpFatal { qp_num: 42 })
        );
    }
    assert_eq!(
        attrs::classify_event(0, 0, 1, 0),
        report(AsyncEvent::CqError)
    );
    assert_eq!(
        attrs::classify_event(15, 0, 1, 0),
        report(AsyncEvent::SrqLimit)
    );
    assert_eq!(attrs::classify_event(14, 0, 1, 0), EventAction::Warn);
    assert_eq!(
        attrs::classify_event(18, 1, 1, 0),
        EventAction::Skip,
        "GID change"
    );
    assert_eq!(
        attrs::classify_event(4, 0, 1, 0),
        EventAction::Skip,
        "comm established"
    );
    assert_eq!(
        attrs::classify_event(1000, 0, 1, 0),
        EventAction::Skip,
        "unknown"
    );
    assert_eq!(attrs::event_name(10), "port error");
    assert_eq!(attrs::event_name(1000), "unknown event");
}

fn mapped(a: u8, b: u8, c: u8, d: u8) -> [u8; 16] {
    let mut gid = [0u8; 16];
    gid[10] = 0xff;
    gid[11] = 0xff;
    gid[12..].copy_from_slice(&[a, b, c, d]);
    gid
}

fn link_local(last: u8) -> [u8; 16] {
    let mut gid = [0u8; 16];
    gid[0] = 0xfe;
    gid[1] = 0x80;
    gid[15] = last;
    gid
}

fn entry(index: u32, gid: [u8; 16], gid_type: Option<GidType>, netdev: &str) -> GidEntry {
    GidEntry {
        index,
        gid,
        gid_type,
        netdev: Some(netdev.to_string()),
    }
}

#[test]
fn gid_predicates_and_types() {
    assert!(gid::is_ipv4_mapped(&mapped(10, 100, 0, 1)));
    assert!(!gid::is_ipv4_mapped(&link_local(1)));
    assert!(gid::is_valid(&mapped(10, 100, 0, 1)));
    assert!(!gid::is_valid(&link_local(1)), "link-local");
    assert!(!gid::is_valid(&[0; 16]), "not configured");
    let mut global = [0u8; 16];
    global[0] = 0x20;
    global[1] = 0x01;
    global[15] = 1;
    assert!(gid::is_valid(&global) && !gid::is_ipv4_mapped(&global));
    assert_eq!(gid::parse_gid_type("RoCE v2\n"), Some(GidType::RoceV2));
    assert_eq!(gid::parse_gid_type("IB/RoCE v1\n"), Some(GidType::RoceV1));
    assert_eq!(gid::parse_gid_type("garbage"), None);
    assert_eq!(gid::format_gid(&mapped(10, 100, 0, 1)), "::ffff:10.100.0.1");
}

#[test]
fn gid_selection_prefers_ipv4_roce_v2_like_nccl() {
    use GidType::{RoceV1, RoceV2};
    // Soft-RoCE: link-local at 0, the IPv4 RoCE v2 GID at 1.
    let rxe = [
        entry(0, link_local(1), Some(RoceV2), "veth_a0"),
        entry(1, mapped(10, 100, 0, 1), Some(RoceV2), "veth_a0"),
    ];
    assert_eq!(gid::select(&rxe, Some("veth_a0")), Some(1));
    // ConnectX: v1 and v2 of each address; the IPv4 v2 one wins.
    let cx = [
        entry(0, link_local(2), Some(RoceV1), "eth0"),
        entry(1, link_local(2), Some(RoceV2), "eth0"),
        entry(2, mapped(10, 0, 0, 1), Some(RoceV1), "eth0"),
        entry(3, mapped(10, 0, 0, 1), Some(RoceV2), "eth0"),
    ];
    assert_eq!(gid::select(&cx, Some("eth0")), Some(3));
    assert_eq!(gid::select(&cx, None), Some(3), "own netdev unknown");
    // A VLAN interface's address comes first in the table; the port's own interface wins.
    let vlan = [
        entry(0, link_local(3), Some(RoceV2), "eth0"),
        entry(3, mapped(192, 168, 1, 1), Some(RoceV2), "eth0.100"),
        entry(5, mapped(10, 0, 0, 1), Some(RoceV2), "eth0"),
    ];
    assert_eq!(gid::select(&vlan, Some("eth0")), Some(5));
    // ... but NCCL's order comes first: an IPv4 v2 GID on another netdev beats an IPv6 one.
    let mut global = link_local(9);
    global[0] = 0x20;
    global[1] = 0x01;
    let v6 = [
        entry(2, global, Some(RoceV2), "eth0"),
        entry(4, mapped(10, 0, 0, 2), Some(RoceV2), "eth0.5"),
    ];
    assert_eq!(gid::select(&v6, Some("eth0")), Some(4));
    // Equal candidates: the lowest index, as NCCL's upward scan keeps the first.
    let twins = [
        entry(7, mapped(10, 0, 0, 7), Some(RoceV2), "eth0"),
        entry(6, mapped(10, 0, 0, 6), Some(RoceV2), "eth0"),
    ];
    assert_eq!(gid::select(&twins, Some("eth0")), Some(6));
    // Types unreadable (containers: EINVAL): the IPv4 GID is still chosen.
    let unknown = [
        entry(0, link_local(4), None, "eth0"),
        entry(1, mapped(10, 0, 0, 3), None, "eth0"),
    ];
    assert_eq!(gid::select(&unknown, Some("eth0")), Some(1));
    // Only IPv6 global: usable.
    assert_eq!(
        gid::select(&[entry(2, global, Some(RoceV2), "eth0")], None),
        Some(2)
    );
}

#[test]
fn gid_selection_fails_without_a_usable_gid() {
    assert_eq!(gid::select(&[], None), None);
    let only_link_local = [
        entry(0, link_local(1), Some(GidType::RoceV2), "eth0"),
        entry(1, [0; 16], None, "eth0"),
    ];
    assert_eq!(gid::select(&only_link_local, Some("eth0")), None);
}

fn request(wr_id: u64, opcode: SendOpcode, sge: Option<Sge>, signaled: bool) -> WorkRequest {
    WorkRequest {
        wr_id,
        opcode,
        sge,
        remote_addr: 0x1000 + wr_id,
        rkey: 0x40 + wr_id as u32,
        signaled,
        inline: false,
    }
}

#[test]
fn send_chains_are_built_linked_and_bounded() {
    let sge = Sge {
        addr: 0xdead_0000,
        length: 512,
        lkey: 0x99,
    };
    let chain = [
        request(1, SendOpcode::Write, Some(sge), false),
        request(2, SendOpcode::WriteWithImm { imm: 0x0102_0304 }, None, true),
        WorkRequest {
            inline: true,
            ..request(3, SendOpcode::Read, Some(Sge { length: 1, ..sge }), true)
        },
    ];
    let mut wrs = SendChain::new();
    let head = wrs.fill(&chain).unwrap();
    assert_eq!(head, wrs.wrs.as_mut_ptr());
    let base = wrs.wrs.as_ptr();
    let (w0, w1, w2) = (&wrs.wrs[0], &wrs.wrs[1], &wrs.wrs[2]);
    assert_eq!((w0.wr_id, w1.wr_id, w2.wr_id), (1, 2, 3));
    assert_eq!(w0.next as *const _, base.wrapping_add(1));
    assert_eq!(w1.next as *const _, base.wrapping_add(2));
    assert!(w2.next.is_null());
    assert_eq!(
        (w0.opcode, w1.opcode, w2.opcode),
        (
            ibv_wr_opcode::IBV_WR_RDMA_WRITE,
            ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM,
            ibv_wr_opcode::IBV_WR_RDMA_READ
        )
    );
    assert_eq!(w0.send_flags, 0);
    assert_eq!(w1.send_flags, ibv_send_flags::IBV_SEND_SIGNALED.0);
    assert_eq!(
        w2.send_flags,
        (ibv_send_flags::IBV_SEND_SIGNALED | ibv_send_flags::IBV_SEND_INLINE).0
    );
    assert_eq!((w0.num_sge, w1.num_sge, w2.num_sge), (1, 0, 1));
    assert!(w1.sg_list.is_null());
    assert_eq!(w0.sg_list as *const _, wrs.sges.as_ptr());
    assert_eq!(w2.sg_list as *const _, wrs.sges.as_ptr().wrapping_add(2));
    assert_eq!(
        (wrs.sges[0].addr, wrs.sges[0].length, wrs.sges[0].lkey),
        (0xdead_0000, 512, 0x99)
    );
    assert_eq!(wrs.sges[2].length, 1);
    // SAFETY: (test) reading the union fields the builder wrote.
    unsafe {
        assert_eq!(
            w1.imm_data_invalidated_rkey_union.imm_data, 0x0102_0304,
            "stored as given"
        );
        assert_eq!((w0.wr.rdma.remote_addr, w0.wr.rdma.rkey), (0x1001, 0x41));
        assert_eq!((w2.wr.rdma.remote_addr, w2.wr.rdma.rkey), (0x1003, 0x43));
    }
    assert_eq!(wrs.index_of(base.wrapping_add(1)), Some(1));
    assert_eq!(wrs.index_of(std::ptr::null()), None);
}

#[test]
fn send_chains_accept_sixteen_and_refuse_more() {
    let chain = vec![request(1, SendOpcode::Write, None, false); MAX_CHAIN];
    let mut wrs = SendChain::new();
    assert!(wrs.fill(&chain).is_ok());
    assert!(wrs.wrs[MAX_CHAIN - 1].next.is_null());
    let long = vec![request(1, SendOpcode::Write, None, false); MAX_CHAIN + 1];
    let err = SendChain::new().fill(&long).unwrap_err();
    assert!(err.contains("17"), "{err}");
}

#[test]
fn receive_batches_are_zero_sge_lists() {
    let empty = ibv_recv_wr {
        wr_id: 0,
        next: std::ptr::null_mut(),
        sg_list: std::ptr::null_mut(),
        num_sge: 0,
    };
    let mut wrs = [empty; RECV_BATCH];
    let head = link_receives(&mut wrs, 5, 77);
    assert_eq!(head, wrs.as_mut_ptr());
    for (i, wr) in wrs.iter().take(5).enumerate() {
        assert_eq!((wr.wr_id, wr.num_sge), (77, 0));
        assert!(wr.sg_list.is_null());
        if i < 4 {
            assert_eq!(wr.next as *const _, wrs.as_ptr().wrapping_add(i + 1));
        } else {
            assert!(wr.next.is_null());
        }
    }
}

#[test]
fn rtr_and_rts_attributes_follow_nccl() {
    let remote = Remote {
        qp_num: 0x1234,
        address: PortAddress {
            lid: 7,
            gid: mapped(10, 100, 0, 2),
            gid_index: 0,
            mtu: 5,
            link_layer: LinkLayer::Ethernet,
        },
        path_mtu: 5,
    };
    let settings = QpSettings {
        traffic_class: 106,
        service_level: 3,
        ..QpSettings::default()
    };
    let roce = rtr_attr(&remote, &settings, 1, LinkLayer::Ethernet, 1);
    assert_eq!(
        (roce.qp_state, roce.path_mtu, roce.dest_qp_num, roce.rq_psn),
        (2, 5, 0x1234, 0)
    );
    assert_eq!((roce.max_dest_rd_atomic, roce.min_rnr_timer), (1, 12));
    let ah = roce.ah_attr;
    assert_eq!((ah.is_global, ah.port_num, ah.sl), (1, 1, 3));
    assert_eq!(
        (ah.grh.sgid_index, ah.grh.hop_limit, ah.grh.traffic_class),
        (1, 255, 106)
    );
    // SAFETY: (test) the raw view of the GID union.
    assert_eq!(unsafe { ah.grh.dgid.raw }, remote.address.gid);
    let ib = rtr_attr(&remote, &settings, 2, LinkLayer::InfiniBand, 0);
    assert_eq!(
        (ib.ah_attr.is_global, ib.ah_attr.dlid, ib.ah_attr.port_num),
        (0, 7, 2)
    );
    let rts = rts_attr(&QpSettings {
        timeout: 14,
        retry_count: 3,
        ..QpSettings::default()
    });
    assert_eq!(
        (
            rts.qp_state,
            rts.timeout,
            rts.retry_cnt,
            rts.rnr_retry,
            rts.sq_psn,
            rts.max_rd_atomic
        ),
        (3, 14, 3, 7, 0, 1)
    );
}

#[test]
fn access_flags_apply_relaxed_ordering_only_when_asked_and_allowed() {
    let all = af::IBV_ACCESS_LOCAL_WRITE
        | af::IBV_ACCESS_REMOTE_WRITE
        | af::IBV_ACCESS_REMOTE_READ
        | af::IBV_ACCESS_REMOTE_ATOMIC;
    assert_eq!(access_flags(Access::DATA, true), (all.0, false));
    assert_eq!(access_flags(Access::CONTROL, true), (all.0, false));
    let relaxed = Access {
        relaxed_ordering: true,
        ..Access::DATA
    };
    assert_eq!(
        access_flags(relaxed, true),
        ((all | af::IBV_ACCESS_RELAXED_ORDERING).0, true)
    );
    assert_eq!(
        access_flags(relaxed, false),
        (all.0, false),
        "setting 0 or no iova2"
    );
    assert_eq!(
        access_flags(Access::LOCAL, true),
        (af::IBV_ACCESS_LOCAL_WRITE.0, false)
    );
}

#[test]
fn specs_name_a_device_and_an_optional_port() {
    assert_eq!(parse_spec("mlx5_0").unwrap(), ("mlx5_0", 1));
    assert_eq!(parse_spec("mlx5_0:2").unwrap(), ("mlx5_0", 2));
    assert_eq!(parse_spec(" rxe_a0 ").unwrap(), ("rxe_a0", 1));
    for bad in ["mlx5_0:0", "mlx5_0:x", "mlx5_0:256", "", ":1"] {
        let e = parse_spec(bad).unwrap_err();
        assert_eq!(
            (e.verb, e.errno),
            ("ibv_open_device", libc::EINVAL),
            "{bad}"
        );
    }
}

fn default_settings() -> Settings {
    Settings::from_lookup(|_| None).unwrap()
}

#[test]
fn a_missing_device_is_an_error_listing_what_exists() {
    let fabric = VerbsFabric::new(&default_settings()).unwrap();
    assert_eq!(fabric.name(), "verbs");
    let names = fabric.device_names();
    let e = fabric
        .open("mpib_no_such_device:1", Rail::ScaleOut)
        .map(|_| ())
        .unwrap_err();
    assert!(
        e.verb == "ibv_open_device" || e.verb == "ibv_get_device_list",
        "{e}"
    );
    if names.is_empty() {
        assert!(e.detail.contains("available devices: none"), "{e}");
    } else {
        for name in &names {
            assert!(e.detail.contains(name.as_str()), "{e}");
        }
    }
    assert!(e.to_string().contains("mpib_no_such_device"), "{e}");
}

#[test]
fn optional_verbs_are_found_at_run_time() {
    // Debian 12 ships rdma-core 44: IBVERBS_1.8 and 1.12 exist, ibv_query_port_speed does not.
    let support = VerbsFabric::symbol_support();
    assert!(support.reg_mr_iova2, "{support:?}");
    assert!(support.reg_dmabuf_mr, "{support:?}");
    assert_eq!(support, sys::symbol_support(), "cached");
    // Only a boolean on a host without NVIDIA drivers; must not panic.
    let _ = super::gdr_supported();
    assert_eq!(super::memory::GDR_PATHS.len(), 3);
}

#[test]
fn relaxed_ordering_setting_is_validated() {
    let settings = Settings {
        relaxed_ordering: 3,
        ..default_settings()
    };
    assert!(VerbsFabric::new(&settings).is_err());
}

#[test]
fn return_codes_become_errnos() {
    assert_eq!(sys::rc_errno(libc::ENOMEM), libc::ENOMEM);
    assert_eq!(sys::rc_errno(-libc::ENOMEM), libc::ENOMEM);
}

#[test]
fn async_event_layout_matches_verbs() {
    use std::mem::{align_of, size_of};
    assert_eq!(
        size_of::<super::events::RawAsyncEvent>(),
        size_of::<rdma_sys::ibv_async_event>()
    );
    assert_eq!(
        align_of::<super::events::RawAsyncEvent>(),
        align_of::<rdma_sys::ibv_async_event>()
    );
}
