//! One memory registration per NIC per page range, shared by every `regMr` that asks for it.
//!
//! NCCL registers the same memory through many comms: the p2p buffer pool a peer's connections
//! share, and each user buffer once for every connection that uses it (docs/NCCL_NET_ABI.md
//! "Registration"). Without sharing, each of those calls pinned the pages again and took
//! another MR from both NICs, so a 64 MiB buffer registered through 1,024 comms held 2,048 MRs.
//! As NCCL's own net_ib transport does with its MR cache (`ncclIbMrCache`), a registration is
//! keyed by its page range — the start rounded down and the end rounded up to the system page,
//! what `ibv_reg_mr` pins anyway — and counted: the NIC's MR is made by the first handle that
//! asks and released with the last. Each new MR is taken from the NIC's budget (`max_mr`,
//! src/net/setup/budget.rs), so the budget counts the MRs really held, not the handles.
//!
//! DMA-BUF registrations are keyed by their exact range and kept apart from host ones: their
//! offset into the buffer cannot be rounded with the address.
//!
//! The map's lock is held across the fabric's register and deregister calls (as net_ib holds its
//! device lock), so two comms registering the same pages at once make one MR; the fabric's
//! calls never come back into this cache.

use std::collections::hash_map::Entry::Occupied;
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use mpib_probes::declared::{
    RailCounter, MEMORY_DEREGISTRATIONS, MEMORY_REGISTRATIONS, MEMORY_REGISTRATIONS_SHARED,
};

use crate::error::{Error, Result};
use crate::fabric::{FabricResult, MemoryKeys, RailDevice};
use crate::log;
use crate::net::observe::telemetry::Telemetry;
use crate::net::setup::budget::{Hold, NicBudget};

/// What a registration covers, the key of the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct PageRange {
    /// First byte (page-aligned for host memory).
    pub start: u64,
    /// Bytes from `start` (whole pages for host memory).
    pub len: u64,
    /// Registered through DMA-BUF (keyed exactly, never shared with a host registration).
    pub dmabuf: bool,
}

impl PageRange {
    /// The pages holding `[addr, addr + len)`. An empty, NULL or wrapping range has no pages:
    /// it is kept exactly as given, so the fabric answers it as it would without the cache.
    pub(crate) fn host(addr: u64, len: usize, page: u64) -> PageRange {
        let exact = PageRange {
            start: addr,
            len: len as u64,
            dmabuf: false,
        };
        if len == 0 || addr == 0 {
            return exact;
        }
        let end = addr
            .checked_add(len as u64)
            .and_then(|end| end.checked_next_multiple_of(page));
        let Some(end) = end else {
            return exact;
        };
        let start = addr - addr % page;
        PageRange {
            start,
            len: end - start,
            dmabuf: false,
        }
    }

    /// A DMA-BUF range, exactly as given.
    pub(crate) fn dmabuf(addr: u64, len: usize) -> PageRange {
        PageRange {
            start: addr,
            len: len as u64,
            dmabuf: true,
        }
    }
}

/// One MR on the NIC and the handles that share it.
struct Entry {
    keys: MemoryKeys,
    references: u64,
    /// The NIC's `max_mr` share, given back with the MR.
    _hold: Hold,
    /// The duplicated DMA-BUF descriptor, kept while the MR lives.
    _dmabuf: Option<OwnedFd>,
}

/// One NIC's registrations.
pub(crate) struct RegistrationCache {
    device: Arc<dyn RailDevice>,
    budget: Arc<NicBudget>,
    entries: Mutex<HashMap<PageRange, Entry>>,
    /// The probes file and this NIC's slot in it, set once the file is open (the NICs are
    /// opened before it; src/net/setup/plugin.rs).
    probes: OnceLock<(Arc<Telemetry>, usize)>,
}

impl RegistrationCache {
    /// An empty cache of `device`'s registrations, each taken from `budget`.
    pub(crate) fn new(device: Arc<dyn RailDevice>, budget: Arc<NicBudget>) -> RegistrationCache {
        RegistrationCache {
            device,
            budget,
            entries: Mutex::new(HashMap::new()),
            probes: OnceLock::new(),
        }
    }

    /// Counts what this cache does in `telemetry`, as the NIC at `nic_slot` (once; later calls
    /// are ignored).
    pub(crate) fn observe(&self, telemetry: Arc<Telemetry>, nic_slot: usize) {
        let _ = self.probes.set((telemetry, nic_slot));
    }

    fn count(&self, counter: RailCounter) {
        if let Some((telemetry, slot)) = self.probes.get() {
            telemetry.nic(*slot).inc(counter);
        }
    }

    fn entries(&self) -> MutexGuard<'_, HashMap<PageRange, Entry>> {
        // A panic while holding the lock leaves every entry whole (inserted or removed at once).
        self.entries
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// MRs this NIC holds for `regMr` handles.
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.entries().len()
    }

    /// The keys of `range`'s MR: another reference to the one held, or a new one made by
    /// `register` (given the device) and taken from the budget. `dmabuf` is kept with a new MR.
    pub(crate) fn acquire(
        &self,
        range: PageRange,
        dmabuf: Option<OwnedFd>,
        register: impl FnOnce(&dyn RailDevice) -> FabricResult<MemoryKeys>,
    ) -> Result<MemoryKeys> {
        let mut entries = self.entries();
        if let Some(entry) = entries.get_mut(&range) {
            entry.references += 1;
            self.count(MEMORY_REGISTRATIONS_SHARED);
            return Ok(entry.keys);
        }
        let hold = self.budget.take_registration()?;
        let keys = register(self.device.as_ref())?;
        entries.insert(
            range,
            Entry {
                keys,
                references: 1,
                _hold: hold,
                _dmabuf: dmabuf,
            },
        );
        self.count(MEMORY_REGISTRATIONS);
        Ok(keys)
    }

    /// Drops one reference to `range`'s MR, releasing it on the NIC with the last.
    pub(crate) fn release(&self, range: PageRange) -> Result<()> {
        let mut entries = self.entries();
        let Occupied(mut slot) = entries.entry(range) else {
            return Err(Error::internal(format!(
                "deregMr: no registration of [{:#x}, +{}) on {}",
                range.start,
                range.len,
                self.device.info().name
            )));
        };
        slot.get_mut().references -= 1;
        if slot.get().references > 0 {
            return Ok(());
        }
        // Removed even if the NIC refuses: the keys are not handed out again either way. The
        // entry (its DMA-BUF descriptor and its share of `max_mr`) goes only after the NIC let
        // go of the MR, so the budget never counts an MR the NIC still holds as free.
        let entry = slot.remove();
        self.count(MEMORY_DEREGISTRATIONS);
        let released = self.device.deregister(entry.keys);
        drop(entry);
        released.map_err(Error::from)
    }
}

impl Drop for RegistrationCache {
    fn drop(&mut self) {
        // Handles NCCL never deregistered: their MRs go with the NIC.
        let entries = std::mem::take(&mut *self.entries());
        for (range, entry) in entries {
            if let Err(e) = self.device.deregister(entry.keys) {
                warn!(
                    log::NET,
                    "teardown: registration [{:#x}, +{}): {e}", range.start, range.len
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: u64 = 4096;

    #[test]
    fn a_host_range_is_widened_to_whole_pages() {
        let range = PageRange::host(0x1_0010, 100, PAGE);
        assert_eq!((range.start, range.len), (0x1_0000, PAGE));
        let range = PageRange::host(0x1_0000, 4097, PAGE);
        assert_eq!((range.start, range.len), (0x1_0000, 2 * PAGE));
        let range = PageRange::host(0x1_0fff, 2, PAGE);
        assert_eq!((range.start, range.len), (0x1_0000, 2 * PAGE));
    }

    #[test]
    fn empty_null_and_wrapping_ranges_are_kept_as_given() {
        for (addr, len) in [
            (0x1000, 0),
            (0, 64),
            (u64::MAX - 10, 64),
            (u64::MAX - 10, 5),
        ] {
            let range = PageRange::host(addr, len, PAGE);
            assert_eq!((range.start, range.len), (addr, len as u64));
        }
    }

    #[test]
    fn a_dmabuf_range_is_kept_exact_and_apart() {
        let dmabuf = PageRange::dmabuf(0x1_0010, 100);
        assert_eq!((dmabuf.start, dmabuf.len), (0x1_0010, 100));
        assert_ne!(dmabuf, PageRange::host(0x1_0010, 100, PAGE));
    }
}
