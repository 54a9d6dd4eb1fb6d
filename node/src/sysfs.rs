//! The NICs' own counters from sysfs, for the rails' `device`/`port`:
//! `<root>/class/infiniband/<device>/ports/<port>/counters/*` and `.../hw_counters/*`.
//!
//! `port_xmit_data` and `port_rcv_data` count 4-byte words (InfiniBand PortCounters); they are
//! multiplied by 4 and exported as `port_xmit_data_bytes` / `port_rcv_data_bytes`. Every other
//! file that holds one unsigned integer is exported under its own name. A name present in both
//! directories is taken from `counters/`. Missing directories yield nothing (no RDMA here).

use std::fs;
use std::path::{Path, PathBuf};

/// The variable every MPIB program reads the sysfs root (`/sys`) from: the plugin (PCI paths),
/// the collector and `mpib-top` (NIC counters), the agent (retransmissions).
pub const SYSFS_VARIABLE: &str = "MPIB_SYSFS";
/// The sysfs root when nothing names one.
pub const DEFAULT_SYSFS: &str = "/sys";

/// Refuses the names the sysfs root had before it had one everywhere: `MPIB_SYSFS_ROOT` (the
/// collector and `mpib-top`) and `--sysfs-root` (those two, and the agent's, which named
/// `/sys/class/infiniband`). The message names the one to use.
pub fn refuse_old_name(name: &str) -> Result<(), String> {
    match name {
        "MPIB_SYSFS_ROOT" => Err(format!(
            "MPIB_SYSFS_ROOT is gone: {SYSFS_VARIABLE} names the sysfs root ({DEFAULT_SYSFS}) for \
             every MPIB program"
        )),
        "--sysfs-root" => Err(format!(
            "--sysfs-root is gone: --sysfs DIR names the sysfs root ({DEFAULT_SYSFS}), as \
             {SYSFS_VARIABLE} does (the agent's named /sys/class/infiniband)"
        )),
        _ => Ok(()),
    }
}

/// Counters in 4-byte words, with the name they are exported under once in bytes.
const WORD_COUNTERS: [(&str, &str); 2] = [
    ("port_xmit_data", "port_xmit_data_bytes"),
    ("port_rcv_data", "port_rcv_data_bytes"),
];

/// Whether `device` is a plain directory name (it comes from a probes file: never let it
/// walk out of the sysfs tree).
fn safe_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains('/') && !name.contains('\0')
}

/// The port directory of `device`/`port` under `root`, if the names are safe.
pub fn port_dir(root: &Path, device: &str, port: u32) -> Option<PathBuf> {
    safe_name(device).then(|| {
        root.join("class/infiniband")
            .join(device)
            .join("ports")
            .join(port.to_string())
    })
}

/// `(counter name, value)` for one port, sorted by name; empty when sysfs has no such port.
pub fn read_port_counters(root: &Path, device: &str, port: u32) -> Vec<(String, u64)> {
    let Some(dir) = port_dir(root, device, port) else {
        return Vec::new();
    };
    let mut out: Vec<(String, u64)> = Vec::new();
    for sub in ["counters", "hw_counters"] {
        let Ok(entries) = fs::read_dir(dir.join(sub)) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            let Some(value) = read_value(&entry.path()) else {
                continue;
            };
            let (name, value) = match WORD_COUNTERS.iter().find(|(raw, _)| *raw == name) {
                Some((_, bytes)) => ((*bytes).to_owned(), value.saturating_mul(4)),
                None => (name, value),
            };
            if !out.iter().any(|(seen, _)| *seen == name) {
                out.push((name, value));
            }
        }
    }
    out.sort();
    out
}

fn read_value(path: &Path) -> Option<u64> {
    let text = fs::read_to_string(path).ok()?;
    text.trim().parse().ok()
}

/// When this host booted, ns since the Unix epoch (`btime` in `/proc/stat`): the start of the
/// NICs' counters, which count from boot (or from a driver reload, which nothing records).
pub fn boot_time_ns() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find_map(|l| l.strip_prefix("btime "))?;
    line.trim().parse::<u64>().ok()?.checked_mul(1_000_000_000)
}

/// NIC counters (sysfs `hw_counters`) that count retransmissions or their causes, summed. rxe,
/// mlx5 and others name them differently; the ones a device lacks are skipped.
pub const RETRANSMISSION_COUNTERS: &[&str] = &[
    "completer_retry_err",
    "retry_exceeded_err",
    "local_ack_timeout_err",
    "packet_seq_err",
    "out_of_sequence",
    "rnr_nak_retry_err",
];

/// The port's retransmission total: [`RETRANSMISSION_COUNTERS`] summed over those it has; `None`
/// for a port without any (the loopback fabric, a driver without `hw_counters`). The agent's
/// measurements and `mpib-top` read this one sum.
pub fn retransmissions(root: &Path, device: &str, port: u32) -> Option<u64> {
    // Only these files: on some drivers each counter read is a firmware query, and the agent
    // reads them every interval.
    let dir = port_dir(root, device, port)?.join("hw_counters");
    let mut found = false;
    let mut total = 0u64;
    for name in RETRANSMISSION_COUNTERS {
        if let Some(value) = read_value(&dir.join(name)) {
            found = true;
            total = total.saturating_add(value);
        }
    }
    found.then_some(total)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn boot_time_is_in_the_past() {
        let boot = boot_time_ns().unwrap();
        assert!(boot > 1_500_000_000 * 1_000_000_000 && boot < mpib_probes::now_ns());
    }

    #[test]
    fn reads_both_directories_and_converts_words() {
        let root = std::env::temp_dir().join(format!("mpib-sysfs-unit-{}", std::process::id()));
        let port = root.join("class/infiniband/mlx5_0/ports/1");
        fs::create_dir_all(port.join("counters")).unwrap();
        fs::create_dir_all(port.join("hw_counters")).unwrap();
        fs::write(port.join("counters/port_xmit_data"), "100\n").unwrap();
        fs::write(port.join("counters/symbol_error"), "2\n").unwrap();
        fs::write(port.join("counters/garbage"), "n/a\n").unwrap();
        fs::write(port.join("hw_counters/out_of_buffer"), "7\n").unwrap();
        fs::write(port.join("hw_counters/symbol_error"), "99\n").unwrap();
        let got = read_port_counters(&root, "mlx5_0", 1);
        let want = [
            ("out_of_buffer".to_owned(), 7),
            ("port_xmit_data_bytes".to_owned(), 400),
            ("symbol_error".to_owned(), 2),
        ];
        assert_eq!(got, want);
        assert!(read_port_counters(&root, "mlx5_0", 2).is_empty());
        assert!(read_port_counters(&root, "../../etc", 1).is_empty());
        assert!(port_dir(&root, "a/b", 1).is_none());
        fs::remove_dir_all(&root).unwrap();
    }
}
