//! `mpib-agent run`: open the hint file, bind the sockets, serve, and run the policy every
//! interval until SIGTERM or SIGINT; SIGHUP reloads the configuration file.

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use arc_swap::ArcSwap;

use crate::config::{Paths, Policies};
use crate::measure::{pid_alive, start_ticks, Measurer, SAMPLE_EVERY};
use crate::policy::PolicyKind;
use crate::server::Shared;
use crate::shm::{create_private_dir, HintFile, Opened};
use crate::slots::Process;
use crate::state::State;
use crate::wake::{sleep_until, Wake};
use crate::{control, http, log, server};

/// Everything `run` needs.
#[derive(Clone, Debug)]
pub struct Options {
    /// Where things are.
    pub paths: Paths,
    /// The configuration file, if any.
    pub config_path: Option<PathBuf>,
    /// `--policy`: overrides the file's default policy (kept across reloads).
    pub policy: Option<PolicyKind>,
    /// `--interval-ms`: overrides the file's interval (kept across reloads).
    pub interval_ms: Option<u64>,
    /// `--allowed-uids` or `MPIB_AGENT_ALLOWED_UIDS`: overrides the file's `allowed_uids`.
    pub allowed_uids: Option<BTreeSet<u32>>,
    /// `--allowed-gids` or `MPIB_AGENT_ALLOWED_GIDS`: overrides the file's `allowed_gids`.
    pub allowed_gids: Option<BTreeSet<u32>>,
    /// `--max-flows-per-process` or `MPIB_AGENT_MAX_FLOWS_PER_PROCESS`: overrides the file's
    /// `max_flows_per_process`.
    pub max_flows_per_process: Option<usize>,
    /// `--max-flows-per-user` or `MPIB_AGENT_MAX_FLOWS_PER_USER`: overrides the file's
    /// `max_flows_per_user`.
    pub max_flows_per_user: Option<usize>,
}

impl Options {
    /// The configuration: the file (or the defaults) with the flags applied.
    pub fn load_policies(&self) -> Result<Policies, String> {
        let mut policies = match &self.config_path {
            Some(path) => Policies::load(path)?,
            None => Policies::default(),
        };
        if let Some(policy) = self.policy {
            policies.default = policy;
        }
        if let Some(ms) = self.interval_ms {
            policies.interval_ms = ms;
        }
        if let Some(uids) = &self.allowed_uids {
            policies.access.uids = Some(uids.clone());
        }
        if let Some(gids) = &self.allowed_gids {
            policies.access.gids = Some(gids.clone());
        }
        if let Some(limit) = self.max_flows_per_process {
            policies.max_flows_per_process = limit;
        }
        if let Some(limit) = self.max_flows_per_user {
            policies.max_flows_per_user = limit;
        }
        Ok(policies)
    }
}

/// Runs the agent until a stop signal. Errors name what could not be set up.
pub fn run(options: &Options) -> Result<(), String> {
    let policies = options.load_policies()?;
    let paths = &options.paths;
    let (hints, opened) = HintFile::open(&paths.hint_path)?;
    let how = match opened {
        Opened::Created => "created",
        Opened::Reused => "reused (entries kept)",
        Opened::Repaired => "repaired (it was truncated or not a hint file)",
    };
    log::info(&format!("hint file {}: {how}", paths.hint_path.display()));
    let registration = bind_unix(&paths.socket_path, 0o666)?;
    let control_socket = bind_unix(&paths.control_path, 0o600)?;
    let metrics_listener = match paths.metrics_listen {
        Some(address) => Some(
            std::net::TcpListener::bind(address)
                .map_err(|e| format!("metrics endpoint {address}: cannot listen: {e}"))?,
        ),
        None => None,
    };
    let state = State::new(hints, &policies);
    if state.slots.used() > 0 {
        log::info(&format!(
            "took back {} flow(s) from the hint file; running jobs keep their slots",
            state.slots.used()
        ));
    }
    let wake = |what: &str| Wake::new().map_err(|e| format!("cannot make the {what}: {e}"));
    let shared = Shared {
        state: Arc::new(Mutex::new(state)),
        policies: Arc::new(ArcSwap::from_pointee(policies)),
        stop: Arc::new(AtomicBool::new(false)),
        stopping: Arc::new(wake("stop channel")?),
        policy_wake: Arc::new(wake("policy loop's wake-up channel")?),
    };
    let reload = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        // The flag first: signal-hook runs a signal's actions in order, so the policy loop,
        // woken by the second, finds it set.
        signal_hook::flag::register(signal, Arc::clone(&shared.stop))
            .map_err(|e| format!("cannot handle signal {signal}: {e}"))?;
        let writer = shared
            .policy_wake
            .writer()
            .map_err(|e| format!("cannot handle signal {signal}: {e}"))?;
        signal_hook::low_level::pipe::register(signal, writer)
            .map_err(|e| format!("cannot handle signal {signal}: {e}"))?;
    }
    signal_hook::flag::register(signal_hook::consts::SIGHUP, Arc::clone(&reload))
        .map_err(|e| format!("cannot handle SIGHUP: {e}"))?;
    let describe = format!(
        "hint file {}, socket {}, probes {}, metrics {}",
        paths.hint_path.display(),
        paths.socket_path.display(),
        paths.probes_dir.display(),
        paths
            .metrics_listen
            .map_or("off".to_string(), |a| format!("http://{a}/metrics"))
    );
    log::info(&format!("serving: {describe}"));
    let mut threads = Vec::new();
    let s = shared.clone();
    threads.push(spawn("mpib-agent-reg", move || {
        server::serve(registration, s)
    })?);
    let s = shared.clone();
    threads.push(spawn("mpib-agent-ctl", move || {
        control::serve(control_socket, s, describe)
    })?);
    if let Some(listener) = metrics_listener {
        let (s, host) = (shared.clone(), host_name());
        threads.push(spawn("mpib-agent-http", move || {
            http::serve(listener, s, host)
        })?);
    }
    policy_loop(options, &shared, &reload);
    shared.stop.store(true, Ordering::Relaxed);
    shared.stopping.notify();
    for thread in threads {
        let _ = thread.join();
    }
    for path in [&paths.socket_path, &paths.control_path] {
        let _ = std::fs::remove_file(path);
    }
    log::info("stopped; the hint file stays for running jobs");
    Ok(())
}

fn spawn(
    name: &str,
    body: impl FnOnce() + Send + 'static,
) -> Result<std::thread::JoinHandle<()>, String> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(body)
        .map_err(|e| format!("cannot start thread {name}: {e}"))
}

/// Measures and decides every interval until stop.
fn policy_loop(options: &Options, shared: &Shared, reload: &AtomicBool) {
    let paths = &options.paths;
    let mut measurer = Measurer::new(&paths.probes_dir, &paths.sysfs);
    let mut last = Instant::now();
    while !shared.stop.load(Ordering::Relaxed) {
        let interval_end = last + shared.policies.load().interval();
        wait_for_interval(shared, &mut measurer, interval_end);
        if shared.stop.load(Ordering::Relaxed) {
            return;
        }
        if reload.swap(false, Ordering::Relaxed) {
            reload_policies(options, shared);
        }
        let interval_ns = last.elapsed().as_nanos() as u64;
        last = Instant::now();
        let users = shared.lock().slots.users();
        let (measured, in_use) = measurer.measure(interval_ns, &users);
        let policies = shared.policies.load();
        // /proc is read without the lock: registrations never wait on it.
        let processes = shared.lock().slots.processes();
        let gone: Vec<Process> = processes
            .into_iter()
            .filter(|p| !process_alive(*p))
            .collect();
        let mut state = shared.lock();
        state.probes_files = measurer.files;
        let (dropped, freed) = state.slots.reclaim_exited(&gone);
        for slot in freed {
            state.release(slot);
        }
        state.reclaimed("process_exited", dropped);
        // Unreadable probes files hide connections: then no slot is known to be unused.
        state.in_use = (measurer.unreadable == 0).then_some(in_use);
        if state.hints.damaged() {
            repair_hints(&mut state);
        }
        let notable = state.tick(&measured, &policies, interval_ns);
        drop(state);
        for line in notable {
            log::info(&line);
        }
        if dropped > 0 {
            log::info(&format!(
                "{dropped} connection(s) of {} exited process(es) reclaimed",
                gone.len()
            ));
        }
    }
}

/// Waits for the interval's end, sampling the flows' parts in flight meanwhile (their busy time,
/// measure.rs) only while [`sampling_wanted`]; a registration or a stop signal wakes it early.
fn wait_for_interval(shared: &Shared, measurer: &mut Measurer, interval_end: Instant) {
    let flows = shared.lock().slots.used();
    let mut sampling = sampling_wanted(flows, measurer.files);
    while !shared.stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if now >= interval_end {
            return;
        }
        if sleep_until(&shared.policy_wake, next_wake(now, interval_end, sampling)) {
            shared.policy_wake.drain();
            // A new flow may have come: sample from now on if it is one to sample.
            let flows = shared.lock().slots.used();
            sampling = sampling_wanted(flows, measurer.files);
        }
        if sampling {
            measurer.sample();
        }
    }
}

/// Whether to sample the probes files between measurements: only while a flow is registered
/// and a live probes file could hold its connections. An agent with no job (or only jobs in
/// vanilla mode, which never register) then wakes once per interval, not 2,000 times a second.
pub fn sampling_wanted(flows: usize, live_probes_files: usize) -> bool {
    flows > 0 && live_probes_files > 0
}

/// When the policy loop wakes next: for the next sample while sampling, else at the interval's
/// end.
pub fn next_wake(now: Instant, interval_end: Instant, sampling: bool) -> Instant {
    if sampling {
        (now + SAMPLE_EVERY).min(interval_end)
    } else {
        interval_end
    }
}

/// Another process shrank, removed or replaced the hint file: open it again (repairing or
/// recreating it) and write the flows back, so new connections map a whole file. A failure is
/// logged once until it changes (tried again every interval).
fn repair_hints(state: &mut State) {
    static LAST_ERROR: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);
    let path = state.hints.path().to_path_buf();
    let mut last = LAST_ERROR
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    match state.repair_hints() {
        Ok(opened) => {
            *last = None;
            log::warn(&format!(
                "hint file {}: another process shrank, removed or replaced it; {opened:?} and its \
                 flows written back (running connections that read it move their bytes on SOUT)",
                path.display()
            ));
        }
        Err(e) => {
            if last.as_deref() != Some(e.as_str()) {
                log::warn(&format!(
                    "hint file {}: another process shrank, removed or replaced it, and it cannot \
                     be opened again: {e}",
                    path.display()
                ));
                *last = Some(e);
            }
        }
    }
}

fn reload_policies(options: &Options, shared: &Shared) {
    match options.load_policies() {
        Ok(policies) => {
            let old = shared.policies.load();
            let start_only = (
                &policies.metrics_listen,
                &policies.control_path,
                &policies.sysfs,
            );
            if start_only != (&old.metrics_listen, &old.control_path, &old.sysfs) {
                log::warn(
                    "metrics_listen, control_path and sysfs are read at start only: \
                     restart mpib-agent to apply their change",
                );
            }
            log::info(&format!(
                "configuration reloaded: default policy {}, {} rule(s), interval {} ms",
                policies.default.name(),
                policies.rules.len(),
                policies.interval_ms
            ));
            shared.policies.store(Arc::new(policies));
            shared.lock().reloaded(true);
        }
        Err(e) => {
            log::error(&format!(
                "reload refused, the previous configuration stays: {e}"
            ));
            shared.lock().reloaded(false);
        }
    }
}

/// Alive and the same process (a pid reused by a later process does not count).
fn process_alive(process: Process) -> bool {
    if !pid_alive(process.pid) {
        return false;
    }
    let now = start_ticks(process.pid);
    process.start_ticks == 0 || now == 0 || now == process.start_ticks
}

/// Binds a Unix socket at `path` with `mode`; a stale socket file (nobody accepting) is
/// replaced, a live one means another agent runs there.
fn bind_unix(path: &Path, mode: u32) -> Result<UnixListener, String> {
    let name = path.display();
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        create_private_dir(parent)?;
    }
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::FileTypeExt;
        if !meta.file_type().is_socket() {
            return Err(format!(
                "{name}: exists and is not a socket; not touching it"
            ));
        }
        if UnixStream::connect(path).is_ok() {
            return Err(format!(
                "{name}: another agent is serving there (use another MPIB_AGENT_TAG or stop it)"
            ));
        }
        std::fs::remove_file(path)
            .map_err(|e| format!("{name}: cannot remove stale socket: {e}"))?;
    }
    let listener = UnixListener::bind(path).map_err(|e| format!("{name}: cannot bind: {e}"))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| format!("{name}: cannot set mode {mode:o}: {e}"))?;
    Ok(listener)
}

/// The kernel's host name, for the metrics' `host` label.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// With no flow, or no probes file to read, the loop sleeps until the interval's end; with
    /// both, it wakes for each sample, never past the interval's end.
    #[test]
    fn the_loop_samples_only_while_flows_and_probes_files_exist() {
        let now = Instant::now();
        let end = now + Duration::from_millis(100);
        for (flows, files) in [(0, 0), (0, 3), (5, 0)] {
            let sampling = sampling_wanted(flows, files);
            assert!(!sampling, "{flows} flows, {files} files");
            assert_eq!(next_wake(now, end, sampling), end);
        }
        assert!(sampling_wanted(1, 1));
        assert_eq!(next_wake(now, end, true), now + SAMPLE_EVERY);
        let near_end = end - Duration::from_micros(100);
        assert_eq!(next_wake(near_end, end, true), end);
    }
}
