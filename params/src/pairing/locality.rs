//! `MPIB_HCA_SUP=auto`: each SOUT NIC paired with the nearest SUP NIC on the PCI tree.
//!
//! Nearness, closest first: under one PCIe switch (or functions of one device), under one root
//! port, under one host bridge, then only on one NUMA node through the CPU. Never across NUMA
//! nodes: two NICs that meet only in the CPU interconnect would split a GPU's traffic between a
//! near NIC and a far one, the NVIDIA/nccl#2310 case (one PIX and one PHB NIC striped evenly fell
//! to 70 Gb/s per NIC against 400 Gb/s for the PIX NIC alone). A pair that meets only at the host
//! bridge is allowed but warned about for that reason.
//!
//! A canonical sysfs PCI path names every bridge from the root complex down:
//! `/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:08.0/0000:05:00.0` is the function
//! `0000:05:00.0` under root port `0000:00:01.0` of host bridge `pci0000:00`, behind a switch
//! (upstream port `0000:01:00.0`, downstream port `0000:02:08.0`). Its `numa_node` file says the
//! node (-1: unknown).

use std::path::Path;

/// Where a NIC sits on the PCI tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PciLocation {
    /// Host bridge (`pci0000:00`).
    pub host_bridge: String,
    /// Bus ids from the root port down to the NIC's function (last).
    pub chain: Vec<String>,
    /// NUMA node, `None` when the kernel does not know it.
    pub numa_node: Option<u32>,
}

impl PciLocation {
    /// Parses a canonical sysfs PCI path; `None` for one that does not name a PCI function.
    pub fn parse(path: &str, numa_node: Option<u32>) -> Option<PciLocation> {
        let (_, below) = path.split_once("/devices/")?;
        let mut parts = below.split('/');
        let host_bridge = parts.next().filter(|p| p.starts_with("pci"))?.to_string();
        let chain: Vec<String> = parts
            .take_while(|part| is_bus_id(part))
            .map(str::to_string)
            .collect();
        if chain.is_empty() {
            return None;
        }
        Some(PciLocation {
            host_bridge,
            chain,
            numa_node,
        })
    }

    /// Reads the location of the PCI function at `path` (its `numa_node` file beside it).
    pub fn read(path: &str) -> Option<PciLocation> {
        let numa_node = std::fs::read_to_string(Path::new(path).join("numa_node"))
            .ok()
            .and_then(|text| text.trim().parse::<i64>().ok())
            .and_then(|node| u32::try_from(node).ok());
        PciLocation::parse(path, numa_node)
    }

    /// The NIC's own bus id.
    pub fn bus_id(&self) -> &str {
        self.chain.last().map_or("", String::as_str)
    }
}

/// `dddd:bb:dd.f`, hex.
fn is_bus_id(text: &str) -> bool {
    let bytes = text.as_bytes();
    bytes.len() == 12
        && bytes[4] == b':'
        && bytes[7] == b':'
        && bytes[10] == b'.'
        && bytes
            .iter()
            .enumerate()
            .all(|(i, b)| matches!(i, 4 | 7 | 10) || b.is_ascii_hexdigit())
}

/// How near two NICs are, closest first (the derived order ranks them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Nearness {
    /// Behind one PCIe switch, or functions of one device.
    SameSwitch,
    /// Under one root port.
    SameRootPort,
    /// Under one host bridge only: traffic crosses the CPU's root complex.
    HostBridge,
    /// Different host bridges of one NUMA node.
    SameNumaNode,
    /// Different host bridges, a NUMA node unknown on at least one side.
    NumaUnknown,
    /// Different NUMA nodes: never paired.
    OtherNumaNode,
}

impl Nearness {
    /// How MPIB says it in its log.
    pub fn describe(self) -> &'static str {
        match self {
            Nearness::SameSwitch => "behind one PCIe switch",
            Nearness::SameRootPort => "under one root port",
            Nearness::HostBridge => "meeting only at the host bridge",
            Nearness::SameNumaNode => "on one NUMA node through the CPU",
            Nearness::NumaUnknown => "through the CPU, NUMA node unknown",
            Nearness::OtherNumaNode => "on different NUMA nodes",
        }
    }

    /// Whether the pair crosses the CPU (NCCL's PHB or worse), which MPIB warns about.
    pub fn through_cpu(self) -> bool {
        self >= Nearness::HostBridge
    }
}

/// How near `a` and `b` are, and how many bridges their paths share (more = nearer).
pub fn nearness(a: &PciLocation, b: &PciLocation) -> (Nearness, usize) {
    if a.host_bridge != b.host_bridge {
        let kind = match (a.numa_node, b.numa_node) {
            (Some(x), Some(y)) if x == y => Nearness::SameNumaNode,
            (Some(_), Some(_)) => Nearness::OtherNumaNode,
            _ => Nearness::NumaUnknown,
        };
        return (kind, 0);
    }
    let shared = a
        .chain
        .iter()
        .zip(&b.chain)
        .take_while(|(x, y)| x == y)
        .count();
    let same_device = |x: &str, y: &str| x.len() == 12 && y.len() == 12 && x[..10] == y[..10];
    let kind = match shared {
        0 => Nearness::HostBridge,
        _ if same_device(a.bus_id(), b.bus_id()) => Nearness::SameSwitch,
        1 => Nearness::SameRootPort,
        _ => Nearness::SameSwitch,
    };
    (kind, shared)
}

/// A NIC as auto pairing sees it.
#[derive(Clone, Debug)]
pub struct Located {
    /// Its name, for messages.
    pub name: String,
    /// Its PCI location, when it has one.
    pub location: Option<PciLocation>,
}

/// The pairing of one SOUT NIC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AutoPair {
    /// Index of the chosen SUP NIC among the candidates.
    pub sup: usize,
    /// How near it is.
    pub nearness: Nearness,
}

/// Pairs each SOUT NIC with the nearest SUP candidate: nearest class first, then the most shared
/// bridges, then the candidate serving the fewest SOUT NICs so far, then the lowest bus id.
/// SOUT NICs are taken in bus order, so the result is the same whatever the list order.
/// Fails naming the SOUT NIC that has no location or no candidate on its NUMA node.
pub fn pair_by_locality(sout: &[Located], sup: &[Located]) -> Result<Vec<AutoPair>, String> {
    let sout_locations = sout
        .iter()
        .map(|nic| {
            nic.location.as_ref().ok_or_else(|| {
                format!(
                    "MPIB_HCA_SUP=auto: SOUT NIC {} has no PCI path (Soft-RoCE or a virtual \
                     function?); list the SUP NICs explicitly",
                    nic.name
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let placed: Vec<(usize, &PciLocation)> = sup
        .iter()
        .enumerate()
        .filter_map(|(index, nic)| nic.location.as_ref().map(|l| (index, l)))
        .collect();
    if placed.is_empty() {
        return Err(format!(
            "MPIB_HCA_SUP=auto: no SUP candidate has a PCI path (candidates: {:?})",
            sup.iter().map(|n| n.name.as_str()).collect::<Vec<_>>()
        ));
    }
    let bus_ids: Vec<Option<&str>> = sout_locations.iter().map(|l| Some(l.bus_id())).collect();
    let mut served = vec![0usize; sup.len()];
    let mut pairs = vec![None; sout.len()];
    for sout_index in super::device_order(&bus_ids) {
        let location = sout_locations[sout_index];
        let best = placed
            .iter()
            .map(|&(index, candidate)| {
                let (kind, shared) = nearness(location, candidate);
                (
                    kind,
                    std::cmp::Reverse(shared),
                    served[index],
                    candidate.bus_id(),
                    index,
                )
            })
            .filter(|(kind, ..)| *kind != Nearness::OtherNumaNode)
            .min();
        let Some((nearness, _, _, _, index)) = best else {
            return Err(format!(
                "MPIB_HCA_SUP=auto: no SUP candidate shares NUMA node {} with SOUT NIC {} \
                 (candidates: {}); MPIB never pairs across NUMA nodes",
                location
                    .numa_node
                    .map_or("?".to_string(), |n| n.to_string()),
                sout[sout_index].name,
                describe_candidates(sup)
            ));
        };
        served[index] += 1;
        pairs[sout_index] = Some(AutoPair {
            sup: index,
            nearness,
        });
    }
    Ok(pairs.into_iter().flatten().collect())
}

fn describe_candidates(sup: &[Located]) -> String {
    sup.iter()
        .map(|nic| match &nic.location {
            Some(l) => format!(
                "{} {} node {}",
                nic.name,
                l.bus_id(),
                l.numa_node.map_or("?".to_string(), |n| n.to_string())
            ),
            None => format!("{} without PCI path", nic.name),
        })
        .collect::<Vec<_>>()
        .join(", ")
}
