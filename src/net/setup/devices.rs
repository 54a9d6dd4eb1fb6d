//! The fused devices MPIB exposes to NCCL: one per SOUT NIC, each with its SUP NIC
//! (`crate::pairing` decides which). Every NIC is opened once, as its rail, even when it serves
//! several devices: a SUP NIC shared by two pairs is one device handle, one set of async events
//! and one wire, so everything that counts a NIC's capacity sees it once.

use std::ffi::CString;
use std::net::Ipv4Addr;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::fabric::{Fabric, Rail, RailDevice};
use crate::log;
use crate::pairing::locality::{pair_by_locality, Located, Nearness, PciLocation};
use crate::pairing::{device_order, sup_in_order, SupChoice};
use crate::params::Settings;

use crate::net::data::registrations::RegistrationCache;
use crate::net::observe::health::DeviceHealth;
use crate::net::setup::budget::NicBudget;
use crate::net::setup::receives::SharedReceives;
use crate::net::setup::resources::Devices;

/// One opened NIC.
pub(crate) struct Nic {
    /// The device handle.
    pub device: Arc<dyn RailDevice>,
    /// The rail it serves.
    pub rail: Rail,
    /// Its published async events.
    pub health: Arc<DeviceHealth>,
    /// Its limits and what this process's connections hold of them.
    pub budget: Arc<NicBudget>,
    /// The receive queues its receive connections share.
    pub receives: Arc<SharedReceives>,
    /// The MRs its `regMr` handles share, one per page range.
    pub registrations: Arc<RegistrationCache>,
}

/// One fused NCCL device: a SOUT NIC and its SUP NIC.
pub(crate) struct FusedDevice {
    /// NCCL's device index.
    pub index: usize,
    /// SOUT, SUP.
    pub devices: Devices,
    /// The two NICs' published async events.
    pub health: [Arc<DeviceHealth>; 2],
    /// The two NICs' limits and use (a shared SUP NIC's is one budget).
    pub budgets: [Arc<NicBudget>; 2],
    /// The two NICs' shared receive queues (a shared SUP NIC's serve every device on it).
    pub receives: [Arc<SharedReceives>; 2],
    /// The two NICs' `regMr` registrations (a shared SUP NIC's shared by every device on it).
    pub registrations: [Arc<RegistrationCache>; 2],
    /// The two NICs' indices among the opened NICs (their probes slots).
    pub nic_slots: [usize; 2],
    /// The fabric's default address for the control connection (`Fabric::control_address`).
    pub control_address: Option<Ipv4Addr>,
    /// Devices sharing this one's SUP NIC, itself included (1 when it has its own).
    pub sup_sharers: u32,
    /// `"<sout>+<sup>"`.
    pub name: CString,
    /// The SOUT NIC's PCI path.
    pub pci_path: Option<CString>,
}

impl FusedDevice {
    /// The name as text.
    pub(crate) fn label(&self) -> String {
        self.name.to_string_lossy().into_owned()
    }
}

/// Every opened NIC and the devices made of them, in NCCL's device order.
pub(crate) struct Fused {
    /// SOUT NICs first, in list order, then the SUP NICs that serve a device.
    pub nics: Vec<Nic>,
    /// The devices.
    pub devices: Vec<Arc<FusedDevice>>,
}

/// Opens the NICs `settings` names and fuses them into devices.
pub(crate) fn open(fabric: &Arc<dyn Fabric>, settings: &Settings) -> Result<Fused> {
    let lists = &settings.nics;
    let open_nic = |spec: &str, variable: &str, rail: Rail| -> Result<Arc<dyn RailDevice>> {
        fabric.open(spec, rail).map_err(|e| {
            Error::invalid_usage(format!(
                "{variable}={spec:?}: {e} (available: {:?})",
                fabric.device_names()
            ))
        })
    };
    if lists.sout.is_empty() {
        return Err(not_set("MPIB_HCA_SOUT", Rail::ScaleOut, fabric.as_ref()));
    }
    let sout = lists
        .sout
        .iter()
        .map(|spec| open_nic(spec, "MPIB_HCA_SOUT", Rail::ScaleOut))
        .collect::<Result<Vec<_>>>()?;
    let (sup, sup_of, nearness) = match &lists.sup {
        SupChoice::Listed(specs) if specs.is_empty() => {
            return Err(not_set("MPIB_HCA_SUP", Rail::ScaleUp, fabric.as_ref()))
        }
        SupChoice::Listed(specs) => {
            let sup = specs
                .iter()
                .map(|spec| open_nic(spec, "MPIB_HCA_SUP", Rail::ScaleUp))
                .collect::<Result<Vec<_>>>()?;
            let sup_of = sup_in_order(sout.len(), sup.len())
                .map_err(|e| Error::invalid_usage(format!("{}: {}", e.variable, e.why)))?;
            (sup, sup_of, None)
        }
        SupChoice::Auto(candidates) => auto_pairs(fabric, &sout, candidates.as_deref())?,
    };
    check_distinct(sout.iter().chain(&sup))?;
    Ok(fuse(
        fabric.as_ref(),
        sout,
        sup,
        &sup_of,
        nearness.as_deref(),
    ))
}

/// One NIC port written two ways (`loop0` and `loop0:1`) would be opened twice. (The tcp
/// fabric's rails may share an interface with an address each: the address tells them apart.)
fn check_distinct<'a>(nics: impl Iterator<Item = &'a Arc<dyn RailDevice>>) -> Result<()> {
    let mut seen: Vec<(&str, u8, std::net::IpAddr)> = Vec::new();
    for nic in nics {
        let info = nic.info();
        let key = (info.name.as_str(), info.port, info.address);
        if seen.contains(&key) {
            return Err(Error::invalid_usage(format!(
                "MPIB_HCA_SOUT/MPIB_HCA_SUP name {} port {} twice: each NIC may serve once",
                key.0, key.1
            )));
        }
        seen.push(key);
    }
    Ok(())
}

fn not_set(variable: &str, rail: Rail, fabric: &dyn Fabric) -> Error {
    Error::invalid_usage(format!(
        "{variable} is not set: name the {rail} rail's NIC(s) (available: {:?})",
        fabric.device_names()
    ))
}

type AutoPairing = (Vec<Arc<dyn RailDevice>>, Vec<usize>, Option<Vec<Nearness>>);

/// `MPIB_HCA_SUP=auto`: opens the candidates (the named ones, or every NIC of the fabric that is
/// not a SOUT NIC, skipping those that do not open) and pairs by PCI distance.
fn auto_pairs(
    fabric: &Arc<dyn Fabric>,
    sout: &[Arc<dyn RailDevice>],
    named: Option<&[String]>,
) -> Result<AutoPairing> {
    let mut candidates = Vec::new();
    match named {
        Some(specs) => {
            for spec in specs {
                let device = fabric.open(spec, Rail::ScaleUp).map_err(|e| {
                    Error::invalid_usage(format!("MPIB_HCA_SUP=auto candidate {spec:?}: {e}"))
                })?;
                candidates.push(device);
            }
        }
        None => {
            let taken: Vec<&str> = sout.iter().map(|d| d.info().name.as_str()).collect();
            for name in fabric.device_names() {
                if taken.contains(&name.as_str()) {
                    continue;
                }
                match fabric.open(&name, Rail::ScaleUp) {
                    Ok(device) => candidates.push(device),
                    Err(e) => info!(log::INIT, "MPIB_HCA_SUP=auto: {name} is no candidate: {e}"),
                }
            }
        }
    }
    let located = |devices: &[Arc<dyn RailDevice>]| -> Vec<Located> {
        devices
            .iter()
            .map(|d| Located {
                name: d.info().name.clone(),
                location: d.info().pci_path.as_deref().and_then(PciLocation::read),
            })
            .collect()
    };
    let pairs =
        pair_by_locality(&located(sout), &located(&candidates)).map_err(Error::invalid_usage)?;
    // Only the chosen candidates stay open.
    let mut kept: Vec<Arc<dyn RailDevice>> = Vec::new();
    let mut sup_of = Vec::with_capacity(pairs.len());
    for pair in &pairs {
        let chosen = &candidates[pair.sup];
        let slot = kept
            .iter()
            .position(|d| Arc::ptr_eq(d, chosen))
            .unwrap_or_else(|| {
                kept.push(Arc::clone(chosen));
                kept.len() - 1
            });
        sup_of.push(slot);
    }
    Ok((
        kept,
        sup_of,
        Some(pairs.iter().map(|p| p.nearness).collect()),
    ))
}

/// Builds the devices in the SOUT NICs' PCI order and logs one line per device.
fn fuse(
    fabric: &dyn Fabric,
    sout: Vec<Arc<dyn RailDevice>>,
    sup: Vec<Arc<dyn RailDevice>>,
    sup_of: &[usize],
    nearness: Option<&[Nearness]>,
) -> Fused {
    let sout_count = sout.len();
    let nics: Vec<Nic> = sout
        .into_iter()
        .map(|device| (device, Rail::ScaleOut))
        .chain(sup.into_iter().map(|device| (device, Rail::ScaleUp)))
        .map(|(device, rail)| {
            let budget = Arc::new(NicBudget::new(device.info(), rail));
            Nic {
                receives: Arc::new(SharedReceives::new(
                    Arc::clone(&device),
                    Arc::clone(&budget),
                    rail,
                )),
                registrations: Arc::new(RegistrationCache::new(
                    Arc::clone(&device),
                    Arc::clone(&budget),
                )),
                budget,
                device,
                rail,
                health: Arc::default(),
            }
        })
        .collect();
    let bus_ids: Vec<Option<String>> = nics[..sout_count]
        .iter()
        .map(|nic| {
            let path = nic.device.info().pci_path.as_deref()?;
            PciLocation::parse(path, None).map(|l| l.bus_id().to_string())
        })
        .collect();
    let bus_refs: Vec<Option<&str>> = bus_ids.iter().map(Option::as_deref).collect();
    let devices = device_order(&bus_refs)
        .into_iter()
        .enumerate()
        .map(|(index, sout_index)| {
            let slots = [sout_index, sout_count + sup_of[sout_index]];
            let sharers = sup_of.iter().filter(|&&s| s == sup_of[sout_index]).count();
            let how = nearness.map(|n| n[sout_index]);
            Arc::new(fused_device(fabric, &nics, index, slots, sharers, how))
        })
        .collect();
    Fused { nics, devices }
}

fn fused_device(
    fabric: &dyn Fabric,
    nics: &[Nic],
    index: usize,
    slots: [usize; 2],
    sharers: usize,
    nearness: Option<Nearness>,
) -> FusedDevice {
    let [sout, sup] = slots.map(|slot| &nics[slot]);
    let name = format!("{}+{}", sout.device.info().name, sup.device.info().name);
    let pci_path = sout.device.info().pci_path.clone();
    if pci_path.is_none() && fabric.places_by_pci() {
        warn!(
            log::INIT,
            "{} ({}) has no PCI path (Soft-RoCE or a virtual function?): NCCL will place device {index} ({name}) without PCI topology",
            sout.device.info().name,
            Rail::ScaleOut
        );
    }
    let shared = if sharers > 1 {
        format!(", its SUP NIC shared by {sharers} devices")
    } else {
        String::new()
    };
    match nearness {
        Some(how) if how.through_cpu() => warn!(
            log::INIT,
            "device {index} {name}: paired by PCI distance, {} (NVIDIA/nccl#2310: splitting a GPU's traffic between a near and a far NIC can be slower than the near NIC alone){shared}",
            how.describe()
        ),
        Some(how) => info!(
            log::INIT,
            "device {index} {name}: paired by PCI distance, {}{shared}",
            how.describe()
        ),
        None => info!(
            log::INIT,
            "device {index} {name}: paired as listed{shared}"
        ),
    }
    FusedDevice {
        index,
        devices: [Arc::clone(&sout.device), Arc::clone(&sup.device)],
        health: [Arc::clone(&sout.health), Arc::clone(&sup.health)],
        budgets: [Arc::clone(&sout.budget), Arc::clone(&sup.budget)],
        receives: [Arc::clone(&sout.receives), Arc::clone(&sup.receives)],
        registrations: [
            Arc::clone(&sout.registrations),
            Arc::clone(&sup.registrations),
        ],
        nic_slots: slots,
        control_address: fabric.control_address(sout.device.as_ref()),
        sup_sharers: u32::try_from(sharers).unwrap_or(1),
        // Device names come from the fabric (verbs names, interface names): no NUL inside.
        name: CString::new(name).unwrap_or_default(),
        pci_path: pci_path.and_then(|p| CString::new(p).ok()),
    }
}
