//! The `--fabric verbs` path: the sender (host A, with the test agent) in this process, the
//! receiver (host B) in a child process running this binary again with `--role recv`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mpib_driver::plugin::current_profile;
use mpib_driver::{locate_built_plugin, Agent, Plan, Plugin, Version};

use super::{human, Args, SIZES, SUP_BW};

/// The rig's hosts: (SOUT device, SUP device, control address) for A (sender) and B (receiver).
const RIG_A: (&str, &str, &str) = ("rxe_a0", "rxe_a1", "10.100.0.1");
const RIG_B: (&str, &str, &str) = ("rxe_b0", "rxe_b1", "10.100.0.2");

/// One case per row: `size` bytes, `iterations` times, at `sup_bw`.
fn demo_cases(args: &Args) -> Vec<mpib_driver::cases::Case> {
    let mut cases = Vec::new();
    for sup_bw in SUP_BW {
        for size in SIZES.into_iter().filter(|s| *s <= args.max_size) {
            let mut case = mpib_driver::cases::Case::new(&format!("size {size} sup_bw {sup_bw}"));
            case.sup_bw = Some(sup_bw);
            case.push(Plan::single(size), args.iterations);
            cases.push(case);
        }
    }
    cases
}

fn host_env(host: (&str, &str, &str)) -> Vec<(String, String)> {
    vec![
        ("MPIB_HCA_SOUT".into(), host.0.into()),
        ("MPIB_HCA_SUP".into(), host.1.into()),
        ("MPIB_OOB_ADDR".into(), host.2.into()),
    ]
}

fn set_env(vars: &[(String, String)]) {
    let lock = mpib_driver::env::lock();
    let vars: Vec<(&str, Option<&str>)> = vars
        .iter()
        .map(|(k, v)| (k.as_str(), Some(v.as_str())))
        .collect();
    let _ = mpib_driver::env::apply(&lock, &vars);
}

fn plugin_path(args: &Args) -> Result<PathBuf, String> {
    match &args.plugin {
        Some(path) => Ok(path.clone()),
        None => locate_built_plugin(&current_profile()).map_err(|e| e.to_string()),
    }
}

const VERBS_OPTIONS: mpib_driver::xfer::SideOptions = mpib_driver::xfer::SideOptions {
    dev: 0,
    env: Vec::new(),
    connect_deadline: Duration::from_secs(90),
    data_deadline: Duration::from_secs(300),
};

fn checks() -> mpib_driver::xfer::Checks {
    mpib_driver::xfer::Checks {
        class: None,
        rails: mpib_driver::rails::Probes::enabled(),
    }
}

/// The receiving process of the verbs path: same rows, same order, every byte checked.
pub(super) fn run_receiver(args: &Args, handle: &Path) -> Result<(), String> {
    let path = plugin_path(args)?;
    let plugin = Plugin::load(&path).map_err(|e| e.to_string())?;
    let net = plugin.net(Version::V12).map_err(|e| e.to_string())?;
    let listener = mpib_driver::xfer::Listener::new(&net, &VERBS_OPTIONS)
        .map_err(|e| format!("receiver init/listen: {e}"))?;
    listener.publish(handle).map_err(|e| e.to_string())?;
    let mut receiver = listener.accept().map_err(|e| format!("receiver: {e}"))?;
    mpib_driver::xfer::walk(&mut receiver, &demo_cases(args), None, checks(), |_| {})
        .map_err(|e| format!("receiver: {e}"))?;
    receiver.close().map_err(|e| format!("receiver close: {e}"))
}

struct Peer {
    child: Child,
    dir: PathBuf,
}

impl Peer {
    /// Waits (bounded) for the receiver to exit and says how it did.
    fn finish(mut self, limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Ok(None) => {
                    return Err(format!(
                        "the receiver process did not exit within {limit:?}"
                    ))
                }
                Err(e) => return Err(format!("waiting for the receiver: {e}")),
            }
        };
        if status.success() {
            Ok(())
        } else {
            Err(format!(
                "the receiver process failed ({status}); its message is above"
            ))
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Starts this binary again as the receiving process, with `peer` added to its environment;
/// returns it and the handle file it will write.
fn spawn_receiver(
    args: &Args,
    plugin: &Path,
    peer: &[(String, String)],
) -> Result<(Peer, PathBuf), String> {
    let dir = mpib_driver::temp_dir("mpib-demo").map_err(|e| e.to_string())?;
    let handle = dir.join("handle");
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let mut command = Command::new(exe);
    command
        .args(["--role", "recv", "--fabric", "verbs", "--handle-file"])
        .arg(&handle)
        .args(["--iterations", &args.iterations.to_string()])
        .args(["--max-size", &args.max_size.to_string()])
        .arg("--plugin")
        .arg(plugin)
        .stdin(Stdio::null());
    for (k, v) in peer {
        command.env(k, v);
    }
    match command.spawn() {
        Ok(child) => Ok((Peer { child, dir }, handle)),
        Err(e) => {
            let _ = std::fs::remove_dir_all(&dir);
            Err(format!("start the receiver process: {e}"))
        }
    }
}

/// One row of the verbs table (a blank line between SUP shares).
fn print_row(
    args: &Args,
    cases: &[mpib_driver::cases::Case],
    r: &mpib_driver::xfer::CaseResult,
    last_bw: &mut Option<Option<u32>>,
) {
    // Every result is of a case the walk took from `cases`.
    let Some(case) = cases.iter().find(|c| c.name == r.name) else {
        return;
    };
    if last_bw.is_some_and(|bw| bw != case.sup_bw) {
        println!();
    }
    *last_bw = Some(case.sup_bw);
    let size = case.steps[0].plan.sends[0].size;
    let per_iter = r.busy / args.iterations as u32;
    let gbps = r.bytes as f64 / r.busy.as_secs_f64().max(1e-9) / 1e9;
    // Per message: the case moved the same message `iterations` times.
    let (sout, sup) = match r.rail_bytes {
        Some((sout, sup)) => (
            (sout / args.iterations).to_string(),
            (sup / args.iterations).to_string(),
        ),
        None => ("(probes off)".into(), "-".into()),
    };
    println!(
        "{:>16} {:>7} {:>9.1} us {:>9.3}   {:>20} {:>14}",
        human(size),
        case.sup_bw.unwrap_or(0),
        per_iter.as_secs_f64() * 1e6,
        gbps,
        sout,
        sup
    );
}

/// Sender in this process (host A, test agent), receiver in a child process (host B).
pub(super) fn run_verbs(args: &Args) -> Result<(), String> {
    let rig =
        std::env::var_os("MPIB_HCA_SOUT").is_none() && std::env::var_os("MPIB_HCA_SUP").is_none();
    let agent = Agent::start_in_temp().map_err(|e| format!("test agent: {e}"))?;
    let mut common = vec![("MPIB_FABRIC".to_string(), "verbs".to_string())];
    common.extend(agent.env().into_iter().map(|(k, v)| (k.to_string(), v)));
    let mut mine = common.clone();
    let mut peer = common;
    if rig {
        mine.extend(host_env(RIG_A));
        peer.extend(host_env(RIG_B));
    }
    peer.extend(args.peer_env.iter().cloned());
    set_env(&mine);
    let path = plugin_path(args)?;
    let (mut peer_process, handle) = spawn_receiver(args, &path, &peer)?;
    let plugin = Plugin::load(&path).map_err(|e| e.to_string())?;
    let net = plugin.net(Version::V12).map_err(|e| e.to_string())?;
    let handle =
        mpib_driver::xfer::wait_for_handle_while(&handle, Duration::from_secs(120), || {
            match peer_process.child.try_wait() {
                Ok(Some(status)) => Err(mpib_driver::Error::Io(format!(
                "the receiver process exited ({status}) before it listened; its message is above"
            ))),
                _ => Ok(()),
            }
        })
        .map_err(|e| format!("receiver process: {e}"))?;
    let mut sender = mpib_driver::xfer::Sender::connect(&net, &VERBS_OPTIONS, &handle)
        .map_err(|e| format!("rank pair setup (init, connect/accept across processes): {e}"))?;
    let props = net.get_properties(0).map_err(|e| e.to_string())?;
    let registrations = agent
        .wait_for_registrations(1, Duration::from_secs(20))
        .map_err(|e| format!("the plugin did not register with the agent: {e}"))?;
    let show = |vars: &[(String, String)]| {
        vars.iter()
            .filter(|(k, _)| k.starts_with("MPIB_HCA") || k == "MPIB_OOB_ADDR")
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    println!(
        "MPIB demo: {} (ncclNetPlugin_v12 \"{}\"), device \"{}\" {} Mbps, MPIB_FABRIC=verbs, \
         two processes: sender [{}] and receiver [{}]{}, advanced mode ({} hint slot(s)), {} \
         iteration(s) per row",
        path.display(),
        net.name(),
        props.name,
        props.speed,
        show(&mine),
        show(&peer),
        if rig {
            " (the rxe rig's hosts A and B)"
        } else {
            ""
        },
        registrations.len(),
        args.iterations
    );
    println!();
    println!(
        "{:>16} {:>7} {:>12} {:>9}   {:>20} {:>14}",
        "size", "sup_bw", "time/iter", "GB/s", "measured: SOUT bytes", "SUP bytes"
    );
    let cases = demo_cases(args);
    let checks = checks();
    let mut last_bw = None;
    let results = mpib_driver::xfer::walk(&mut sender, &cases, Some(&agent), checks, |r| {
        print_row(args, &cases, r, &mut last_bw)
    })
    .map_err(|e| format!("sender: {e}"))?;
    sender.close().map_err(|e| format!("close: {e}"))?;
    peer_process.finish(Duration::from_secs(60))?;
    let transfers: u64 = results.iter().map(|r| r.transfers).sum();
    let bytes: u64 = results.iter().map(|r| r.bytes).sum();
    println!();
    println!(
        "all {transfers} transfers verified byte for byte by the receiving process ({:.1} MiB \
         moved); each row's rail bytes matched the split rule",
        bytes as f64 / f64::from(1u32 << 20)
    );
    drop(agent);
    Ok(())
}
