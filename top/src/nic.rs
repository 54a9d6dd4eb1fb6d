//! The NICs' own counters: each rail's retransmissions, the sum the agent measures too
//! (`mpib_node::sysfs::retransmissions`).

use std::path::Path;

use mpib_probes::FileInfo;

/// Per NIC slot of `info`: the NIC's retransmission total, `None` for a NIC without any of the
/// counters (the loopback fabric, a NIC whose driver has no `hw_counters`).
pub fn retransmissions(sysfs_root: &Path, info: &FileInfo) -> Vec<Option<u64>> {
    info.rails
        .iter()
        .map(|rail| mpib_node::sysfs::retransmissions(sysfs_root, &rail.device, rail.port))
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use mpib_probes::{DeviceEntry, RailInfo};

    #[test]
    fn a_nics_retransmissions_are_the_sum_of_the_counters_it_has() {
        let root = std::env::temp_dir().join(format!("mpib-top-nic-{}", std::process::id()));
        let hw = root.join("class/infiniband/rxe_a/ports/1/hw_counters");
        std::fs::create_dir_all(&hw).unwrap();
        std::fs::write(hw.join("completer_retry_err"), "5\n").unwrap();
        std::fs::write(hw.join("out_of_sequence"), "7\n").unwrap();
        std::fs::write(hw.join("rcvd_pkts"), "1000\n").unwrap();
        let rails: Vec<RailInfo> = ["rxe_a", "lo0"]
            .iter()
            .map(|nic| RailInfo {
                device: (*nic).into(),
                port: 1,
                speed_mbps: 0,
            })
            .collect();
        let info = FileInfo {
            abi_version: mpib_probes::ABI_VERSION,
            pid: 1,
            start_ns: 0,
            host: "h".into(),
            devices: vec![DeviceEntry::of_rails(&rails)],
            rail_kinds: vec![0, 1],
            rails,
            slow_threshold_ns: 0,
            sample_one_in: 0,
        };
        // The loopback NIC has no counters at all: unknown, not zero.
        assert_eq!(retransmissions(&root, &info), [Some(12), None]);
        std::fs::remove_dir_all(&root).unwrap();
    }
}
