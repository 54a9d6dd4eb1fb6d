//! `ncclNetProperties_v7_t` ... `_v12_t` and their construction from [`net::Properties`].

use std::ffi::{c_char, c_int};

use super::{
    assert_layout, NetVDeviceProps, NetVDevicePropsV12, NetVDevicePropsV9, NET_DEVICE_HOST,
    NET_DEVICE_INVALID_VERSION,
};
use crate::net::Properties;

/// Builds a versioned properties struct from the version-neutral one.
pub trait FromProperties {
    /// Copies the fields this ABI version has.
    fn from_properties(props: &Properties) -> Self;
}

/// `ncclNetProperties_v7_t` (56 bytes): v8 without `regIsGlobal`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NetPropertiesV7 {
    /// `name`.
    pub name: *const c_char,
    /// `pciPath`.
    pub pci_path: *const c_char,
    /// `guid`.
    pub guid: u64,
    /// `ptrSupport` (`NCCL_PTR_*` bits).
    pub ptr_support: c_int,
    /// `speed` (Mbps).
    pub speed: c_int,
    /// `port`.
    pub port: c_int,
    /// `latency` (µs).
    pub latency: f32,
    /// `maxComms`.
    pub max_comms: c_int,
    /// `maxRecvs`.
    pub max_recvs: c_int,
    /// `netDeviceType`.
    pub net_device_type: c_int,
    /// `netDeviceVersion`.
    pub net_device_version: c_int,
}

assert_layout!(NetPropertiesV7, size = 56, {
    name @ 0, pci_path @ 8, guid @ 16, ptr_support @ 24, speed @ 28, port @ 32, latency @ 36,
    max_comms @ 40, max_recvs @ 44, net_device_type @ 48, net_device_version @ 52,
});

/// `ncclNetProperties_v8_t` (64 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NetPropertiesV8 {
    /// `name`.
    pub name: *const c_char,
    /// `pciPath`.
    pub pci_path: *const c_char,
    /// `guid`.
    pub guid: u64,
    /// `ptrSupport` (`NCCL_PTR_*` bits).
    pub ptr_support: c_int,
    /// `regIsGlobal`.
    pub reg_is_global: c_int,
    /// `speed` (Mbps).
    pub speed: c_int,
    /// `port`.
    pub port: c_int,
    /// `latency` (µs).
    pub latency: f32,
    /// `maxComms`.
    pub max_comms: c_int,
    /// `maxRecvs`.
    pub max_recvs: c_int,
    /// `netDeviceType`.
    pub net_device_type: c_int,
    /// `netDeviceVersion`.
    pub net_device_version: c_int,
}

assert_layout!(NetPropertiesV8, size = 64, {
    name @ 0, pci_path @ 8, guid @ 16, ptr_support @ 24, reg_is_global @ 28, speed @ 32,
    port @ 36, latency @ 40, max_comms @ 44, max_recvs @ 48, net_device_type @ 52,
    net_device_version @ 56,
});

/// `ncclNetProperties_v9_t` (104 bytes); v10 is identical.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NetPropertiesV9 {
    /// `name`.
    pub name: *const c_char,
    /// `pciPath`.
    pub pci_path: *const c_char,
    /// `guid`.
    pub guid: u64,
    /// `ptrSupport` (`NCCL_PTR_*` bits).
    pub ptr_support: c_int,
    /// `regIsGlobal`.
    pub reg_is_global: c_int,
    /// `forceFlush`.
    pub force_flush: c_int,
    /// `speed` (Mbps).
    pub speed: c_int,
    /// `port`.
    pub port: c_int,
    /// `latency` (µs).
    pub latency: f32,
    /// `maxComms`.
    pub max_comms: c_int,
    /// `maxRecvs`.
    pub max_recvs: c_int,
    /// `netDeviceType`.
    pub net_device_type: c_int,
    /// `netDeviceVersion`.
    pub net_device_version: c_int,
    /// `vProps` (4 devices).
    pub v_props: NetVDevicePropsV9,
    /// `maxP2pBytes`.
    pub max_p2p_bytes: usize,
    /// `maxCollBytes`.
    pub max_coll_bytes: usize,
}

/// `ncclNetProperties_v10_t`: the same layout as v9.
pub type NetPropertiesV10 = NetPropertiesV9;

assert_layout!(NetPropertiesV9, size = 104, {
    name @ 0, pci_path @ 8, guid @ 16, ptr_support @ 24, reg_is_global @ 28, force_flush @ 32,
    speed @ 36, port @ 40, latency @ 44, max_comms @ 48, max_recvs @ 52, net_device_type @ 56,
    net_device_version @ 60, v_props @ 64, max_p2p_bytes @ 88, max_coll_bytes @ 96,
});

/// `ncclNetProperties_v11_t` (112 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NetPropertiesV11 {
    /// `name`.
    pub name: *const c_char,
    /// `pciPath`.
    pub pci_path: *const c_char,
    /// `guid`.
    pub guid: u64,
    /// `ptrSupport` (`NCCL_PTR_*` bits).
    pub ptr_support: c_int,
    /// `regIsGlobal`.
    pub reg_is_global: c_int,
    /// `forceFlush`.
    pub force_flush: c_int,
    /// `speed` (Mbps).
    pub speed: c_int,
    /// `port`.
    pub port: c_int,
    /// `latency` (µs).
    pub latency: f32,
    /// `maxComms`.
    pub max_comms: c_int,
    /// `maxRecvs`.
    pub max_recvs: c_int,
    /// `netDeviceType`.
    pub net_device_type: c_int,
    /// `netDeviceVersion`.
    pub net_device_version: c_int,
    /// `vProps` (4 devices).
    pub v_props: NetVDevicePropsV9,
    /// `maxP2pBytes`.
    pub max_p2p_bytes: usize,
    /// `maxCollBytes`.
    pub max_coll_bytes: usize,
    /// `maxMultiRequestSize`.
    pub max_multi_request_size: c_int,
}

assert_layout!(NetPropertiesV11, size = 112, {
    name @ 0, pci_path @ 8, guid @ 16, ptr_support @ 24, reg_is_global @ 28, force_flush @ 32,
    speed @ 36, port @ 40, latency @ 44, max_comms @ 48, max_recvs @ 52, net_device_type @ 56,
    net_device_version @ 60, v_props @ 64, max_p2p_bytes @ 88, max_coll_bytes @ 96,
    max_multi_request_size @ 104,
});

/// `ncclNetProperties_v12_t` (128 bytes): `vProps` holds 8 devices, so later fields move.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NetPropertiesV12 {
    /// `name`.
    pub name: *const c_char,
    /// `pciPath`.
    pub pci_path: *const c_char,
    /// `guid`.
    pub guid: u64,
    /// `ptrSupport` (`NCCL_PTR_*` bits).
    pub ptr_support: c_int,
    /// `regIsGlobal`.
    pub reg_is_global: c_int,
    /// `forceFlush`.
    pub force_flush: c_int,
    /// `speed` (Mbps).
    pub speed: c_int,
    /// `port`.
    pub port: c_int,
    /// `latency` (µs).
    pub latency: f32,
    /// `maxComms`.
    pub max_comms: c_int,
    /// `maxRecvs`.
    pub max_recvs: c_int,
    /// `netDeviceType`.
    pub net_device_type: c_int,
    /// `netDeviceVersion`.
    pub net_device_version: c_int,
    /// `vProps` (8 devices).
    pub v_props: NetVDevicePropsV12,
    /// `maxP2pBytes`.
    pub max_p2p_bytes: usize,
    /// `maxCollBytes`.
    pub max_coll_bytes: usize,
    /// `maxMultiRequestSize`.
    pub max_multi_request_size: c_int,
    /// `railId` (-1 = undefined).
    pub rail_id: i16,
    /// `planeId` (-1 = undefined).
    pub plane_id: i16,
}

assert_layout!(NetPropertiesV12, size = 128, {
    name @ 0, pci_path @ 8, guid @ 16, ptr_support @ 24, reg_is_global @ 28, force_flush @ 32,
    speed @ 36, port @ 40, latency @ 44, max_comms @ 48, max_recvs @ 52, net_device_type @ 56,
    net_device_version @ 60, v_props @ 64, max_p2p_bytes @ 104, max_coll_bytes @ 112,
    max_multi_request_size @ 120, rail_id @ 124, plane_id @ 126,
});

/// `vProps` from the fused device's member list, truncated to what the version's array holds.
fn v_props<const N: usize>(props: &Properties) -> NetVDeviceProps<N> {
    let mut out = NetVDeviceProps {
        ndevs: 0,
        devs: [0; N],
    };
    let wanted = usize::try_from(props.vdev_count).unwrap_or(0);
    for (slot, &dev) in out
        .devs
        .iter_mut()
        .zip(props.vdev_devices.iter())
        .take(wanted)
    {
        *slot = dev;
        out.ndevs += 1;
    }
    out
}

impl FromProperties for NetPropertiesV7 {
    fn from_properties(p: &Properties) -> Self {
        NetPropertiesV7 {
            name: p.name,
            pci_path: p.pci_path,
            guid: p.guid,
            ptr_support: p.ptr_support,
            speed: p.speed,
            port: p.port,
            latency: p.latency,
            max_comms: p.max_comms,
            max_recvs: p.max_recvs,
            net_device_type: NET_DEVICE_HOST,
            net_device_version: NET_DEVICE_INVALID_VERSION,
        }
    }
}

impl FromProperties for NetPropertiesV8 {
    fn from_properties(p: &Properties) -> Self {
        let v7 = NetPropertiesV7::from_properties(p);
        NetPropertiesV8 {
            name: v7.name,
            pci_path: v7.pci_path,
            guid: v7.guid,
            ptr_support: v7.ptr_support,
            reg_is_global: p.reg_is_global,
            speed: v7.speed,
            port: v7.port,
            latency: v7.latency,
            max_comms: v7.max_comms,
            max_recvs: v7.max_recvs,
            net_device_type: v7.net_device_type,
            net_device_version: v7.net_device_version,
        }
    }
}

impl FromProperties for NetPropertiesV9 {
    fn from_properties(p: &Properties) -> Self {
        let v8 = NetPropertiesV8::from_properties(p);
        NetPropertiesV9 {
            name: v8.name,
            pci_path: v8.pci_path,
            guid: v8.guid,
            ptr_support: v8.ptr_support,
            reg_is_global: v8.reg_is_global,
            force_flush: p.force_flush,
            speed: v8.speed,
            port: v8.port,
            latency: v8.latency,
            max_comms: v8.max_comms,
            max_recvs: v8.max_recvs,
            net_device_type: v8.net_device_type,
            net_device_version: v8.net_device_version,
            v_props: v_props(p),
            max_p2p_bytes: p.max_p2p_bytes,
            max_coll_bytes: p.max_coll_bytes,
        }
    }
}

impl FromProperties for NetPropertiesV11 {
    fn from_properties(p: &Properties) -> Self {
        let v9 = NetPropertiesV9::from_properties(p);
        NetPropertiesV11 {
            name: v9.name,
            pci_path: v9.pci_path,
            guid: v9.guid,
            ptr_support: v9.ptr_support,
            reg_is_global: v9.reg_is_global,
            force_flush: v9.force_flush,
            speed: v9.speed,
            port: v9.port,
            latency: v9.latency,
            max_comms: v9.max_comms,
            max_recvs: v9.max_recvs,
            net_device_type: v9.net_device_type,
            net_device_version: v9.net_device_version,
            v_props: v9.v_props,
            max_p2p_bytes: v9.max_p2p_bytes,
            max_coll_bytes: v9.max_coll_bytes,
            max_multi_request_size: p.max_multi_request_size,
        }
    }
}

impl FromProperties for NetPropertiesV12 {
    fn from_properties(p: &Properties) -> Self {
        let v11 = NetPropertiesV11::from_properties(p);
        NetPropertiesV12 {
            name: v11.name,
            pci_path: v11.pci_path,
            guid: v11.guid,
            ptr_support: v11.ptr_support,
            reg_is_global: v11.reg_is_global,
            force_flush: v11.force_flush,
            speed: v11.speed,
            port: v11.port,
            latency: v11.latency,
            max_comms: v11.max_comms,
            max_recvs: v11.max_recvs,
            net_device_type: v11.net_device_type,
            net_device_version: v11.net_device_version,
            v_props: v_props(p),
            max_p2p_bytes: v11.max_p2p_bytes,
            max_coll_bytes: v11.max_coll_bytes,
            max_multi_request_size: v11.max_multi_request_size,
            rail_id: p.rail_id,
            plane_id: p.plane_id,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Properties {
        Properties {
            name: c"mlx5_0+mlx5_1".as_ptr(),
            pci_path: std::ptr::null(),
            guid: 0x1122,
            ptr_support: 0x3,
            reg_is_global: 1,
            force_flush: 0,
            speed: 800_000,
            port: 1,
            latency: 2.5,
            max_comms: 65536,
            max_recvs: 8,
            vdev_count: 2,
            vdev_devices: [0, 1],
            max_p2p_bytes: 1 << 30,
            max_coll_bytes: 1 << 29,
            max_multi_request_size: 8,
            rail_id: 3,
            plane_id: -1,
        }
    }

    #[test]
    fn v12_copies_every_field() {
        let p = NetPropertiesV12::from_properties(&sample());
        assert_eq!(p.guid, 0x1122);
        assert_eq!(p.reg_is_global, 1);
        assert_eq!(p.speed, 800_000);
        assert_eq!(p.max_recvs, 8);
        assert_eq!(p.net_device_type, NET_DEVICE_HOST);
        assert_eq!(
            p.v_props,
            NetVDeviceProps {
                ndevs: 2,
                devs: [0, 1, 0, 0, 0, 0, 0, 0]
            }
        );
        assert_eq!(p.max_p2p_bytes, 1 << 30);
        assert_eq!(p.max_multi_request_size, 8);
        assert_eq!((p.rail_id, p.plane_id), (3, -1));
    }

    #[test]
    fn v9_and_v7_take_their_subsets() {
        let p9 = NetPropertiesV9::from_properties(&sample());
        assert_eq!(
            p9.v_props,
            NetVDeviceProps {
                ndevs: 2,
                devs: [0, 1, 0, 0]
            }
        );
        assert_eq!(p9.max_coll_bytes, 1 << 29);
        let p7 = NetPropertiesV7::from_properties(&sample());
        assert_eq!((p7.ptr_support, p7.port, p7.max_comms), (0x3, 1, 65536));
    }

    #[test]
    fn v_props_ignores_a_bad_count() {
        let mut p = sample();
        p.vdev_count = -1;
        assert_eq!(v_props::<4>(&p).ndevs, 0);
        p.vdev_count = 7;
        assert_eq!(v_props::<4>(&p).ndevs, 2);
    }
}
