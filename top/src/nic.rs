//! The NICs' own counters: each rail's retransmissions, summed over the counters the agent sums
//! (`mpib_agent::measure::RETRANSMISSION_COUNTERS`), read through the collector's sysfs reader.

use std::path::Path;

use mpib_agent::measure::RETRANSMISSION_COUNTERS;
use mpib_probes::FileInfo;

/// Per NIC slot of `info`: the NIC's retransmission total, `None` for a NIC without any of the
/// counters (the loopback fabric, a NIC whose driver has no `hw_counters`).
pub fn retransmissions(sysfs_root: &Path, info: &FileInfo) -> Vec<Option<u64>> {
    info.rails
        .iter()
        .map(|rail| {
            let counters =
                mpib_collector::sysfs::read_port_counters(sysfs_root, &rail.device, rail.port);
            let mut found = false;
            let mut total = 0u64;
            for (name, value) in counters {
                if RETRANSMISSION_COUNTERS.contains(&name.as_str()) {
                    found = true;
                    total = total.wrapping_add(value);
                }
            }
            found.then_some(total)
        })
        .collect()
}
