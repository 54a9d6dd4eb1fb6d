//! The bed: hosts made of network namespaces, each with two rails (SOUT `veth_X0` on
//! 10.100.0.0/24, SUP `veth_X1` on 10.100.1.0/24; host A is .1, B .2, ...), the tcp fabric
//! on them. Two hosts are cabled back to back (a veth pair per rail: a link taken down on one
//! end loses the carrier on the other, like a pulled cable); three or more hang off one switch
//! per rail (a bridge in the namespace `PREFIX_sw`, so a link down is seen by its own host
//! only). Rails are shaped with `tc tbf` on every end (this kernel has no netem). A third host,
//! the stranger (`PREFIX_x`), is linked to host B alone when a case asks for it. Namespaces
//! isolate neither files nor unix sockets, so handles, agent sockets, hints and probes live in
//! one scratch directory every host sees.

use std::cell::Cell;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::topology::{run_command, Cut, Host, Kind, Shared, Timing, Topology};
use super::Settings;

/// What the bed is built from.
#[derive(Clone, Debug)]
pub struct BedOptions {
    /// Names of its namespaces start with this and `_`.
    pub prefix: String,
    /// How many hosts (2 or more).
    pub hosts: usize,
    /// tbf rate of each rail (`1gbit`; empty: unshaped).
    pub rates: [String; 2],
    /// The rate of both rails during fault cases (`0`: unshaped).
    pub fault_rate: String,
    /// mpib-xfer's `--scale` for the plain pairs.
    pub scale: String,
    /// A process still running after this is killed.
    pub process_limit: Duration,
    /// The built binaries.
    pub bin: PathBuf,
    /// Settings over the bed's own, under each case's.
    pub every_case: Settings,
    /// The run's scratch directory (handles, sockets, probes, the plugin's link); none for a bed
    /// only built and shaped (`mpib-bed`).
    pub scratch: Option<PathBuf>,
}

/// A built bed; dropping it tears it down.
pub struct Bed {
    options: BedOptions,
    shared: Shared,
    stranger_built: Cell<bool>,
    /// Torn down when dropped (a bed left up for a script is not).
    owned: bool,
}

/// Host `index`'s letter: a, b, c, ...
fn letter(index: usize) -> char {
    (b'a' + index as u8) as char
}

fn ip(args: &[&str]) -> Result<(), String> {
    run_command("ip", args)
}

/// A veth pair: `name` in `namespace`, its peer `peer` in `peer_namespace` (created inside
/// them, so the names never exist in the caller's namespace).
fn veth(name: &str, namespace: &str, peer: &str, peer_namespace: &str) -> Result<(), String> {
    let words = [
        "link", "add", name, "netns", namespace, "type", "veth", "peer", "name", peer,
    ];
    let mut words = words.to_vec();
    words.extend(["netns", peer_namespace]);
    ip(&words)
}

/// Kills every process in the bed's namespaces (`PREFIX_a` to `PREFIX_h`, `PREFIX_sw`,
/// `PREFIX_x`) and deletes them (their veth ends, and so the pairs, go with them). Only those
/// names: another run's prefix may start with this one.
pub fn teardown(prefix: &str) {
    let ours: Vec<String> = (0..8)
        .map(|index| letter(index).to_string())
        .chain(["sw".to_string(), "x".to_string()])
        .map(|suffix| format!("{prefix}_{suffix}"))
        .collect();
    for name in ours {
        if !Path::new("/run/netns").join(&name).exists() {
            continue;
        }
        if let Ok(output) = Command::new("ip").args(["netns", "pids", &name]).output() {
            for pid in String::from_utf8_lossy(&output.stdout).split_whitespace() {
                if let Ok(pid) = pid.parse::<i32>() {
                    // SAFETY: kill(2) with a pid from `ip netns pids`; no memory is involved.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
        }
        let _ = ip(&["netns", "del", &name]);
    }
}

/// Takes `/tmp/PREFIX.lock`: two runs with one prefix would tear down each other's namespaces.
pub fn lock(prefix: &str) -> Result<File, String> {
    let path = format!("/tmp/{prefix}.lock");
    let file = File::create(&path).map_err(|e| format!("{path}: {e}"))?;
    // SAFETY: flock(2) on a descriptor this function owns.
    let held = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
    if held {
        Ok(file)
    } else {
        Err(format!(
            "another run holds {path} (set BED_PREFIX to run beside it)"
        ))
    }
}

/// The tbf burst for `rate`: 10 ms at the rate, at least 64 KiB (one GSO packet).
pub fn burst(rate: &str) -> Option<u64> {
    let lower = rate.to_ascii_lowercase();
    let digits: String = lower
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    let unit = match &lower[digits.len()..] {
        "kbit" => 1e3,
        "mbit" => 1e6,
        "gbit" => 1e9,
        "tbit" => 1e12,
        "bit" | "" => 1.0,
        _ => return None,
    };
    let bytes = digits.parse::<f64>().ok()? * unit / 8.0 / 100.0;
    Some((bytes as u64).max(65536))
}

impl Bed {
    fn namespace(&self, index: usize) -> String {
        format!("{}_{}", self.options.prefix, letter(index))
    }

    fn switch(&self) -> String {
        format!("{}_sw", self.options.prefix)
    }

    /// The bed's description (hosts, settings, timing) without touching the system.
    fn describe(options: BedOptions) -> Bed {
        let hosts = (0..options.hosts)
            .map(|index| {
                let l = letter(index);
                let n = index + 1;
                Host {
                    namespace: Some(format!("{}_{l}", options.prefix)),
                    settings: Settings::words(&format!(
                        "MPIB_HCA_SOUT=veth_{l}0 MPIB_HCA_SUP=veth_{l}1 MPIB_OOB_ADDR=10.100.0.{n}"
                    )),
                    wires: [format!("veth_{l}0"), format!("veth_{l}1")],
                    addresses: [format!("10.100.0.{n}"), format!("10.100.1.{n}")],
                }
            })
            .collect();
        // Probes on, private to the run, when it has a scratch directory (not `mpib-bed`).
        let base = match &options.scratch {
            Some(scratch) => Settings::words(&format!(
                "MPIB_FABRIC=tcp MPIB_PROBES=1 MPIB_PROBES_DIR={}",
                scratch.join("probes").display()
            )),
            None => Settings::words("MPIB_FABRIC=tcp"),
        };
        let timing = Timing {
            process_limit: options.process_limit,
            bounded_receiver_seconds: 6,
            data_seconds: 30,
            flap_cases: 8,
            failback_cases: 120,
            bystander_cases: 12,
            rank_sizes: &[
                "--min-size",
                "4",
                "--max-size",
                "8M",
                "--step-factor",
                "8",
                "--iters",
                "3",
            ],
        };
        let bin = options.bin.clone();
        let every_case = options.every_case.clone();
        let shared = Shared {
            kind: Kind::Bed,
            hosts,
            base,
            every_case,
            bin,
            timing,
        };
        Bed {
            options,
            shared,
            stranger_built: Cell::new(false),
            owned: true,
        }
    }

    /// A bed some earlier `mpib-bed up` built, to shape, cut or restore; dropping it leaves it up.
    pub fn attach(options: BedOptions) -> Bed {
        let mut bed = Bed::describe(options);
        bed.owned = false;
        bed
    }

    /// Leaves the bed up when this value goes (`mpib-bed up`; `mpib-bed down` removes it).
    pub fn leave(mut self) {
        self.owned = false;
    }

    /// Builds the bed (after removing a stale one of the same prefix) and checks every host
    /// reaches every other on both rails.
    pub fn build(options: BedOptions) -> Result<Bed, String> {
        if options.hosts < 2 || options.hosts > 8 {
            return Err(format!("a bed has 2 to 8 hosts, not {}", options.hosts));
        }
        teardown(&options.prefix);
        if let Some(scratch) = &options.scratch {
            let probes = scratch.join("probes");
            std::fs::create_dir_all(&probes).map_err(|e| format!("{}: {e}", probes.display()))?;
        }
        let bed = Bed::describe(options);
        bed.wire()?;
        bed.check_reachable()?;
        bed.normal_rates()?;
        Ok(bed)
    }

    fn wire(&self) -> Result<(), String> {
        for index in 0..self.shared.hosts.len() {
            ip(&["netns", "add", &self.namespace(index)])?;
            ip(&["-n", &self.namespace(index), "link", "set", "lo", "up"])?;
        }
        let switched = self.shared.hosts.len() > 2;
        if switched {
            ip(&["netns", "add", &self.switch()])?;
        }
        for rail in 0..2 {
            let bridge = format!("br{rail}");
            if switched {
                ip(&[
                    "-n",
                    &self.switch(),
                    "link",
                    "add",
                    &bridge,
                    "type",
                    "bridge",
                ])?;
                ip(&["-n", &self.switch(), "link", "set", &bridge, "up"])?;
            }
            for (index, host) in self.shared.hosts.iter().enumerate() {
                let namespace = self.namespace(index);
                let wire = &host.wires[rail];
                if switched {
                    let port = format!("{}{rail}", letter(index));
                    veth(wire, &namespace, &port, &self.switch())?;
                    let master = [
                        "-n",
                        &self.switch(),
                        "link",
                        "set",
                        &port,
                        "master",
                        &bridge,
                    ];
                    ip(&[&master[..], &["up"]].concat())?;
                } else if index == 0 {
                    veth(
                        wire,
                        &namespace,
                        &self.shared.hosts[1].wires[rail],
                        &self.namespace(1),
                    )?;
                }
                let address = format!("{}/24", host.addresses[rail]);
                ip(&["-n", &namespace, "addr", "add", &address, "dev", wire])?;
                ip(&["-n", &namespace, "link", "set", wire, "up"])?;
            }
        }
        Ok(())
    }

    /// Reachability per rail without ping: a connect to a closed port is refused only if the
    /// other host answered.
    fn check_reachable(&self) -> Result<(), String> {
        for rail in 0..2 {
            for (index, host) in self.shared.hosts.iter().enumerate().skip(1) {
                let target = format!("{}:9", host.addresses[rail]);
                let answer = self
                    .command(0, Path::new("python3"))
                    .args(["-c", &format!(
                        "import socket,sys\ns=socket.socket();s.settimeout(3)\ntry: s.connect(('{}',9))\nexcept ConnectionRefusedError: sys.exit(0)\nexcept Exception as e: print(e); sys.exit(1)",
                        host.addresses[rail]
                    )])
                    .output()
                    .map_err(|e| format!("python3: {e}"))?;
                if !answer.status.success() {
                    return Err(format!(
                        "rail {rail}: host A cannot reach {target} (host {}): {}",
                        letter(index).to_ascii_uppercase(),
                        String::from_utf8_lossy(&answer.stdout).trim()
                    ));
                }
            }
        }
        Ok(())
    }

    /// Shapes rail `rail` at `rate` on every end (both directions, like a wire); empty or `0`:
    /// unshaped.
    pub fn shape(&self, rail: usize, rate: &str) -> Result<(), String> {
        let shaped = !rate.is_empty() && rate != "0";
        let burst = if shaped {
            burst(rate)
                .ok_or_else(|| format!("rate {rate:?}: expected a number and kbit, mbit or gbit"))?
        } else {
            0
        };
        let mut ends: Vec<(String, String)> = (0..self.shared.hosts.len())
            .map(|index| {
                (
                    self.namespace(index),
                    self.shared.hosts[index].wires[rail].clone(),
                )
            })
            .collect();
        if self.shared.hosts.len() > 2 {
            ends.extend(
                (0..self.shared.hosts.len())
                    .map(|index| (self.switch(), format!("{}{rail}", letter(index)))),
            );
        }
        for (namespace, device) in ends {
            let _ = Command::new("tc")
                .args(["-n", &namespace, "qdisc", "del", "dev", &device, "root"])
                .output();
            if shaped {
                let burst = burst.to_string();
                run_command(
                    "tc",
                    &[
                        "-n", &namespace, "qdisc", "add", "dev", &device, "root", "tbf", "rate",
                        rate, "burst", &burst, "latency", "50ms",
                    ],
                )?;
            }
        }
        Ok(())
    }

    /// Undoes a cut of `rail` at host `host`'s end (the link up, a one-way cut's token bucket
    /// gone) and leaves that rail unshaped, the other as it is (`mpib-bed restore`).
    pub fn mend(&self, host: usize, rail: usize) -> Result<(), String> {
        let wire = &self.shared.hosts[host].wires[rail];
        ip(&["-n", &self.namespace(host), "link", "set", wire, "up"])?;
        self.shape(rail, "")
    }

    /// Builds the stranger once: `PREFIX_x`, `veth_x` 10.100.9.3/24 to `veth_bx` 10.100.9.2
    /// in host B, routed to B's rail addresses, which B answers on any of its links: a stranger
    /// who reaches the job's ports and nothing else (no view of the rails' traffic).
    fn build_stranger(&self) -> Result<String, String> {
        let stranger = format!("{}_x", self.options.prefix);
        if self.stranger_built.get() {
            return Ok(stranger);
        }
        let b = self.namespace(1);
        ip(&["netns", "add", &stranger])?;
        veth("veth_x", &stranger, "veth_bx", &b)?;
        ip(&[
            "-n",
            &stranger,
            "addr",
            "add",
            "10.100.9.3/24",
            "dev",
            "veth_x",
        ])?;
        ip(&["-n", &b, "addr", "add", "10.100.9.2/24", "dev", "veth_bx"])?;
        ip(&["-n", &stranger, "link", "set", "veth_x", "up"])?;
        ip(&["-n", &b, "link", "set", "veth_bx", "up"])?;
        ip(&["-n", &stranger, "link", "set", "lo", "up"])?;
        ip(&[
            "-n",
            &stranger,
            "route",
            "add",
            "10.100.0.0/23",
            "via",
            "10.100.9.2",
        ])?;
        self.stranger_built.set(true);
        Ok(stranger)
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        if self.owned {
            teardown(&self.options.prefix);
        }
    }
}

impl Topology for Bed {
    fn shared(&self) -> &Shared {
        &self.shared
    }
    fn xfer_arguments(&self) -> Vec<String> {
        [
            "--scale",
            &self.options.scale,
            "--handle-timeout",
            "20",
            "--connect-timeout",
            "20",
        ]
        .iter()
        .map(|word| word.to_string())
        .collect()
    }
    fn plugin(&self) -> PathBuf {
        // The plugin by its NCCL name, as NCCL loads it; cargo names it libnccl_net_mpib.so.
        let Some(scratch) = &self.options.scratch else {
            return self.options.bin.join("libnccl_net_mpib.so");
        };
        let lib = scratch.join("lib");
        let link = lib.join("libnccl-net-mpib.so");
        if !link.exists() {
            let _ = std::fs::create_dir_all(&lib);
            let _ = std::os::unix::fs::symlink(self.options.bin.join("libnccl_net_mpib.so"), &link);
        }
        link
    }
    fn cut(&self, host: usize, rail: usize, cut: Cut) -> Result<(), String> {
        let namespace = self.namespace(host);
        let wire = &self.shared.hosts[host].wires[rail];
        match cut {
            Cut::LinkDown => ip(&["-n", &namespace, "link", "set", wire, "down"]),
            // A token bucket too small for any packet: every packet this end sends is dropped
            // while the other end's still arrive and the carrier stays up.
            Cut::OneWay => run_command(
                "tc",
                &[
                    "-n", &namespace, "qdisc", "replace", "dev", wire, "root", "tbf", "rate",
                    "8bit", "burst", "16", "limit", "1",
                ],
            ),
            Cut::Impair(netem) => Err(format!("the bed's kernel has no netem ({netem})")),
        }
    }
    fn restore(&self, host: usize, rail: usize) -> Result<(), String> {
        self.mend(host, rail)?;
        // Both rails back at their usual shaping: what follows a cut runs at full speed.
        self.normal_rates()
    }
    fn fault_rates(&self) -> Result<(), String> {
        self.shape(0, &self.options.fault_rate)?;
        self.shape(1, &self.options.fault_rate)
    }
    fn normal_rates(&self) -> Result<(), String> {
        self.shape(0, &self.options.rates[0])?;
        self.shape(1, &self.options.rates[1])
    }
    fn stranger(&self, program: &Path) -> Result<Command, String> {
        let namespace = self.build_stranger()?;
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &namespace]).arg(program);
        Ok(command)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_burst_holds_ten_milliseconds_at_the_rate_and_one_gso_packet_at_least() {
        assert_eq!(burst("1gbit"), Some(1_250_000));
        assert_eq!(burst("200mbit"), Some(250_000));
        assert_eq!(burst("8bit"), Some(65536));
        assert_eq!(burst("1furlong"), None);
    }
}
