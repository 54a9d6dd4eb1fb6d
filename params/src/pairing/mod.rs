//! Which NICs MPIB fuses into which NCCL devices.
//!
//! `MPIB_HCA_SOUT` and `MPIB_HCA_SUP` are comma-separated lists: the SOUT NICs and the SUP NICs
//! are paired in order, and when there are fewer SUP NICs than SOUT NICs (8 SOUT + 4 SUP) each
//! SUP NIC serves as many consecutive SOUT NICs as the counts' ratio. `MPIB_HCA_SUP=auto` (or
//! `auto:NIC,NIC,...` to name the candidates) pairs each SOUT NIC with the nearest SUP NIC on the
//! PCI tree instead ([`locality`]). One NIC each is what a single-pair node writes, and means
//! exactly what it always did.
//!
//! Why several devices: NCCL gives each GPU the net devices nearest to it, by their `pciPath`;
//! with one device every GPU of an 8-GPU node sends through one NIC pair (docs/NCCL_NET_ABI.md
//! §1.7). Device order is the SOUT NICs' PCI order, so device `k` is the same NIC position on
//! every host of a homogeneous cluster.
//!
//! Everything here is pure: the lists come in as text, NIC locations as values.

pub mod locality;

#[cfg(test)]
mod tests;

/// Most NICs one process opens (SOUT and SUP together): the probes file's NIC slots.
pub const MAX_NICS: usize = 16;

/// Where the SUP NICs come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SupChoice {
    /// Named, paired with the SOUT NICs in order.
    Listed(Vec<String>),
    /// `auto`: the nearest by PCI distance; among the named NICs, or (`None`) among every NIC
    /// the fabric has that is not a SOUT NIC.
    Auto(Option<Vec<String>>),
}

/// The parsed `MPIB_HCA_SOUT` and `MPIB_HCA_SUP`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NicLists {
    /// SOUT NIC specs (`name` or `name:port`, or the tcp fabric's forms), in the order given.
    pub sout: Vec<String>,
    /// The SUP NICs.
    pub sup: SupChoice,
}

/// A list that cannot be used: the variable, and what is wrong, naming the item.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListError {
    /// `MPIB_HCA_SOUT` or `MPIB_HCA_SUP`.
    pub variable: &'static str,
    /// What is wrong.
    pub why: String,
}

const SOUT_VAR: &str = "MPIB_HCA_SOUT";
const SUP_VAR: &str = "MPIB_HCA_SUP";

/// Parses both lists and checks them against each other: no empty item, no NIC twice (in one
/// list or across both), at most [`MAX_NICS`], and a SUP count that divides the SOUT count.
/// Empty lists stay empty (opening reports a variable that is not set).
pub fn parse_lists(sout: &str, sup: &str) -> Result<NicLists, ListError> {
    let sout_items = split(sout, SOUT_VAR)?;
    let sup_text = sup.trim();
    let sup_choice = if sup_text == "auto" {
        SupChoice::Auto(None)
    } else if let Some(candidates) = sup_text.strip_prefix("auto:") {
        SupChoice::Auto(Some(split(candidates, SUP_VAR)?))
    } else {
        SupChoice::Listed(split(sup, SUP_VAR)?)
    };
    let sup_items: &[String] = match &sup_choice {
        SupChoice::Listed(items) | SupChoice::Auto(Some(items)) => items,
        SupChoice::Auto(None) => &[],
    };
    for (index, item) in sout_items.iter().enumerate() {
        if sout_items[..index].contains(item) {
            return Err(twice(SOUT_VAR, item, "MPIB_HCA_SOUT"));
        }
        if sup_items.contains(item) {
            return Err(twice(SUP_VAR, item, "MPIB_HCA_SOUT and MPIB_HCA_SUP"));
        }
    }
    for (index, item) in sup_items.iter().enumerate() {
        if sup_items[..index].contains(item) {
            return Err(twice(SUP_VAR, item, "MPIB_HCA_SUP"));
        }
    }
    if sout_items.len() + sup_items.len() > MAX_NICS {
        return Err(ListError {
            variable: SOUT_VAR,
            why: format!(
                "at most {MAX_NICS} NICs in all, not {} SOUT and {} SUP NICs",
                sout_items.len(),
                sup_items.len()
            ),
        });
    }
    if let SupChoice::Listed(sup_items) = &sup_choice {
        if !sout_items.is_empty() && !sup_items.is_empty() {
            sup_in_order(sout_items.len(), sup_items.len())?;
        }
    }
    Ok(NicLists {
        sout: sout_items,
        sup: sup_choice,
    })
}

/// The SUP NIC (index into the SUP list) of each SOUT NIC when both are listed: in order, each
/// SUP NIC serving `sout / sup` consecutive SOUT NICs.
pub fn sup_in_order(sout_count: usize, sup_count: usize) -> Result<Vec<usize>, ListError> {
    if sup_count == 0 || sout_count % sup_count != 0 {
        return Err(ListError {
            variable: SUP_VAR,
            why: format!(
                "a SUP count that divides the SOUT count, not {sout_count} SOUT NIC(s) and \
                 {sup_count} SUP NIC(s) (each SUP NIC serves as many SOUT NICs as the next); or \
                 `auto` to pair by PCI distance"
            ),
        });
    }
    let group = sout_count / sup_count;
    Ok((0..sout_count).map(|sout| sout / group).collect())
}

fn split(text: &str, variable: &'static str) -> Result<Vec<String>, ListError> {
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    text.split(',')
        .enumerate()
        .map(|(position, item)| {
            let item = item.trim();
            if item.is_empty() {
                return Err(ListError {
                    variable,
                    why: format!("comma-separated NICs, but item {} is empty", position + 1),
                });
            }
            Ok(item.to_string())
        })
        .collect()
}

fn twice(variable: &'static str, item: &str, lists: &str) -> ListError {
    ListError {
        variable,
        why: format!("each NIC named once, but {item} appears twice in {lists}"),
    }
}

/// The order of the fused devices: the SOUT NICs by PCI bus id, those without one after them in
/// the order listed (`bus_ids[i]` is SOUT NIC `i`'s). Returns SOUT indices, device by device.
pub fn device_order(bus_ids: &[Option<&str>]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..bus_ids.len()).collect();
    // Stable: ties (no bus id) keep the listed order. Bus ids are fixed-width hex
    // (`dddd:bb:dd.f`), so text order is bus order.
    order.sort_by(|&a, &b| match (bus_ids[a], bus_ids[b]) {
        (Some(x), Some(y)) => x.cmp(y),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => std::cmp::Ordering::Equal,
    });
    order
}
