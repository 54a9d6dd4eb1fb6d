//! The rig: inside the Soft-RoCE VM (scripts/rxe-vm), two hosts that share the guest's network
//! stack but not their NICs: host A's rails are rxe_a0 (SOUT) and rxe_a1 (SUP) over veth_a0 and
//! veth_a1 (10.100.0.1, 10.100.1.1), host B's rxe_b0 and rxe_b1 over veth_b0 and veth_b1, the
//! verbs fabric on them. A wire is cut or impaired with `netem` on host A's veth (the guest's
//! kernel has it), so only A's packets are lost and no port event fires: the QPs' retries find
//! it. Every case starts with empty neighbour tables, like the first connection after a boot.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::topology::{run_command, Cut, Host, Kind, Shared, Timing, Topology};
use super::Settings;

/// The rig's topology.
pub struct Rig {
    shared: Shared,
}

impl Rig {
    /// The rig over the binaries in `bin`, processes killed after `process_limit`.
    pub fn new(bin: &Path, process_limit: Duration, every_case: &Settings) -> Rig {
        let host = |l: char, n: u32| Host {
            namespace: None,
            settings: Settings::words(&format!(
                "MPIB_HCA_SOUT=rxe_{l}0 MPIB_HCA_SUP=rxe_{l}1 MPIB_OOB_ADDR=10.100.0.{n}"
            )),
            wires: [format!("veth_{l}0"), format!("veth_{l}1")],
            addresses: [format!("10.100.0.{n}"), format!("10.100.1.{n}")],
        };
        let _ = std::fs::create_dir_all("/tmp/rig/probes");
        let shared = Shared {
            kind: Kind::Rig,
            hosts: vec![host('a', 1), host('b', 2)],
            // retry_cnt 6: rxe treats 7 as "retry forever", so a broken wire would hang.
            base: Settings::words(
                "MPIB_FABRIC=verbs MPIB_IB_RETRY_CNT=6 MPIB_PROBES=1 MPIB_PROBES_DIR=/tmp/rig/probes",
            ),
            every_case: every_case.clone(),
            bin: bin.to_path_buf(),
            timing: Timing {
                process_limit,
                bounded_receiver_seconds: 20,
                data_seconds: 60,
                flap_cases: 6,
                failback_cases: 30,
                bystander_cases: 30,
                rank_sizes: &["--min-size", "4K", "--max-size", "4M", "--step-factor", "32", "--iters", "2"],
            },
        };
        Rig { shared }
    }
}

/// The NICs' own counters, `rxe_a0.name` to value (hw_counters of every rxe device).
pub fn nic_counters() -> BTreeMap<String, u64> {
    let mut counters = BTreeMap::new();
    let Ok(devices) = std::fs::read_dir("/sys/class/infiniband") else {
        return counters;
    };
    for device in devices.flatten() {
        let name = device.file_name().to_string_lossy().into_owned();
        let Ok(files) = std::fs::read_dir(device.path().join("ports/1/hw_counters")) else {
            continue;
        };
        for file in files.flatten() {
            if let Some(value) = std::fs::read_to_string(file.path())
                .ok()
                .and_then(|t| t.trim().parse().ok())
            {
                counters.insert(
                    format!("{name}.{}", file.file_name().to_string_lossy()),
                    value,
                );
            }
        }
    }
    counters
}

/// The retry, sequence and error counters that grew ("rxe_b1.out_of_seq_request+3"), or "none
/// grew".
pub fn counters_grown(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> String {
    let watched = |name: &str| {
        ["retry", "seq", "duplicate", "rnr", "drop"]
            .iter()
            .any(|w| name.contains(w))
            || name.ends_with("_err")
    };
    let grown: Vec<String> = after
        .iter()
        .filter(|(name, _)| watched(name))
        .filter_map(|(name, value)| {
            let grew = value.saturating_sub(*before.get(name).unwrap_or(&0));
            (grew > 0).then(|| format!("{name}+{grew}"))
        })
        .collect();
    if grown.is_empty() {
        "none grew".to_string()
    } else {
        grown.join(" ")
    }
}

impl Topology for Rig {
    fn shared(&self) -> &Shared {
        &self.shared
    }
    fn plugin(&self) -> PathBuf {
        self.shared.bin.join("libnccl-net-mpib.so")
    }
    fn cut(&self, host: usize, rail: usize, cut: Cut) -> Result<(), String> {
        let wire = &self.shared.hosts[host].wires[rail];
        let netem = match cut {
            Cut::OneWay => "loss 100%",
            Cut::Impair(netem) => netem,
            Cut::LinkDown => return Err("the rig cuts wires with netem, not links".into()),
        };
        let mut words = vec!["qdisc", "replace", "dev", wire.as_str(), "root", "netem"];
        words.extend(netem.split_whitespace());
        run_command("tc", &words)
    }
    fn restore(&self, host: usize, rail: usize) -> Result<(), String> {
        let wire = &self.shared.hosts[host].wires[rail];
        let output = Command::new("tc")
            .args(["qdisc", "del", "dev", wire, "root"])
            .output();
        match output {
            Ok(o) if o.status.success() => Ok(()),
            // Nothing to delete: already as it was.
            Ok(o) if String::from_utf8_lossy(&o.stderr).contains("No such file") => Ok(()),
            Ok(o) => Err(format!(
                "tc qdisc del dev {wire} root: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            )),
            Err(e) => Err(format!("tc: {e}")),
        }
    }
    fn before_case(&self) {
        // The handshake must resolve the peers' MACs across calls, never inside ibv_modify_qp,
        // whose ARP wait would take about a second (the connection-call limit catches it).
        let _ = Command::new("ip").args(["neigh", "flush", "all"]).output();
    }
    fn collector(&self) -> Option<PathBuf> {
        Some(self.shared.bin.join("mpib-collector"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_retry_sequence_and_error_counters_that_grew_are_named() {
        let before = BTreeMap::from([
            ("rxe_a0.rcvd_seq_err".to_string(), 1),
            ("rxe_a0.sent_pkts".to_string(), 5),
        ]);
        let after = BTreeMap::from([
            ("rxe_a0.rcvd_seq_err".to_string(), 4),
            ("rxe_a0.sent_pkts".to_string(), 50),
            ("rxe_b1.rnr_nak_retry_err".to_string(), 0),
        ]);
        assert_eq!(counters_grown(&before, &after), "rxe_a0.rcvd_seq_err+3");
        assert_eq!(counters_grown(&after, &after), "none grew");
    }
}
