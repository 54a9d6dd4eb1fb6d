//! Converting each version's properties struct into the neutral [`Props`].

use std::ptr;

use super::{c_string, Props};
use crate::abi::*;
use crate::plugin::Version;

fn vprops(ndevs: i32, devs: &[i32]) -> Option<(i32, Vec<i32>)> {
    let n = usize::try_from(ndevs).unwrap_or(0).min(devs.len());
    Some((ndevs, devs[..n].to_vec()))
}

/// Builds [`Props`] from any properties struct (the shared fields have the same names).
macro_rules! props {
    ($p:expr, $reg:expr, $flush:expr, $vprops:expr, $p2p:expr, $coll:expr, $multi:expr,
     $rail:expr, $plane:expr) => {{
        let p = $p;
        Props {
            name: c_string(p.name).unwrap_or_default(),
            pci_path: c_string(p.pci_path),
            guid: p.guid,
            ptr_support: p.ptr_support,
            reg_is_global: $reg,
            force_flush: $flush,
            speed: p.speed,
            port: p.port,
            latency: p.latency,
            max_comms: p.max_comms,
            max_recvs: p.max_recvs,
            net_device_type: p.net_device_type,
            net_device_version: p.net_device_version,
            vprops: $vprops,
            max_p2p_bytes: $p2p,
            max_coll_bytes: $coll,
            max_multi_request_size: $multi,
            rail_id: $rail,
            plane_id: $plane,
        }
    }};
}

/// Reads a properties struct of `version` at `base` into [`Props`].
///
/// # Safety
/// `base` points at an initialised properties struct of that version.
pub(super) unsafe fn props_from(version: Version, base: *const u8) -> Props {
    // SAFETY: (all arms) the caller guarantees the struct type; unaligned reads avoid any
    // alignment assumption.
    unsafe {
        match version {
            Version::V7 => {
                let p = ptr::read_unaligned(base.cast::<PropertiesV7>());
                props!(p, None, None, None, None, None, None, None, None)
            }
            Version::V8 => {
                let p = ptr::read_unaligned(base.cast::<PropertiesV8>());
                props!(
                    p,
                    Some(p.reg_is_global),
                    None,
                    None,
                    None,
                    None,
                    None,
                    None,
                    None
                )
            }
            Version::V9 | Version::V10 => {
                let p = ptr::read_unaligned(base.cast::<PropertiesV9>());
                props!(
                    p,
                    Some(p.reg_is_global),
                    Some(p.force_flush),
                    vprops(p.vprops.ndevs, &p.vprops.devs),
                    Some(p.max_p2p_bytes),
                    Some(p.max_coll_bytes),
                    None,
                    None,
                    None
                )
            }
            Version::V11 => {
                let p = ptr::read_unaligned(base.cast::<PropertiesV11>());
                props!(
                    p,
                    Some(p.reg_is_global),
                    Some(p.force_flush),
                    vprops(p.vprops.ndevs, &p.vprops.devs),
                    Some(p.max_p2p_bytes),
                    Some(p.max_coll_bytes),
                    Some(p.max_multi_request_size),
                    None,
                    None
                )
            }
            Version::V12 => {
                let p = ptr::read_unaligned(base.cast::<PropertiesV12>());
                props!(
                    p,
                    Some(p.reg_is_global),
                    Some(p.force_flush),
                    vprops(p.vprops.ndevs, &p.vprops.devs),
                    Some(p.max_p2p_bytes),
                    Some(p.max_coll_bytes),
                    Some(p.max_multi_request_size),
                    Some(p.rail_id),
                    Some(p.plane_id)
                )
            }
        }
    }
}
