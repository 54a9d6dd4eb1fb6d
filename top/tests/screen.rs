//! The live screen in a real terminal: `mpib-top` runs in a tmux session watching two loopback
//! jobs, a slow one and a fast one; keys are sent with `send-keys` and the screen is read with
//! `capture-pane`. Sorting, filtering and resizing must change what the screen shows, and `q`
//! must end it. tmux is required (the test command installs it).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{eventually, perf, probes_file, temp_dir, Running};

/// A tmux server of this test's own, killed on drop.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn start(width: u16, command: &str) -> Tmux {
        let tmux = Tmux {
            socket: format!("mpib-top-test-{}", std::process::id()),
        };
        let size = [width.to_string(), "50".to_string()];
        let out = tmux.run(&[
            "new-session",
            "-d",
            "-s",
            "top",
            "-x",
            &size[0],
            "-y",
            &size[1],
            command,
        ]);
        assert!(
            out.status.success(),
            "tmux new-session: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        tmux
    }

    fn run(&self, args: &[&str]) -> std::process::Output {
        Command::new("tmux")
            .args(["-L", &self.socket, "-f", "/dev/null"])
            .args(args)
            .output()
            .expect("tmux is needed for this test (apt-get install tmux; scripts/test installs it)")
    }

    fn screen(&self) -> String {
        String::from_utf8_lossy(&self.run(&["capture-pane", "-p", "-t", "top"]).stdout).into_owned()
    }

    fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "top"];
        args.extend_from_slice(keys);
        assert!(self.run(&args).status.success());
    }

    /// Waits until the screen satisfies `check`; the screen when it does.
    fn until(&self, what: &str, check: impl Fn(&str) -> bool) -> String {
        let mut last = String::new();
        let ok = eventually(Duration::from_secs(15), || {
            last = self.screen();
            check(&last)
        });
        assert!(ok, "the screen never showed {what}:\n{last}");
        last
    }

    fn alive(&self) -> bool {
        self.run(&["has-session", "-t", "top"]).status.success()
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]);
    }
}

/// The pids in the order their first rows appear in the RAILS table.
fn rail_order(screen: &str, pids: &[u32]) -> Vec<u32> {
    let rails: Vec<&str> = screen
        .lines()
        .skip_while(|l| !l.starts_with("RAILS"))
        .take_while(|l| !l.starts_with("CONNECTIONS") && !l.starts_with("VALUES"))
        .collect();
    rails
        .iter()
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .filter(|pid| pids.contains(pid))
        .collect()
}

/// Two jobs whose pids run opposite to their rates: the slow one has the lower pid, so sorting
/// by rate and by pid give different orders.
fn jobs(dir: &Path) -> (Running, Running) {
    let slow = perf(dir, "sout=20MB/s,sup=20MB/s,latency=5us", false, "slow");
    for _ in 0..5 {
        let fast = perf(dir, "sout=200MB/s,sup=400MB/s,latency=5us", false, "fast");
        if fast.pid() > slow.pid() {
            return (slow, fast);
        }
    }
    panic!("no fast job got a pid above the slow one's (pids wrapped five times?)");
}

#[test]
fn sorting_filtering_and_resizing_change_the_screen() {
    let dir = temp_dir("screen");
    let (slow, fast) = jobs(&dir);
    probes_file(&dir, slow.pid());
    probes_file(&dir, fast.pid());
    let top = format!(
        "{} --probes-dir {} --hint-path {} --agent-control off --interval 0.3",
        env!("CARGO_BIN_EXE_mpib-top"),
        dir.join("probes").display(),
        dir.join("hints").display()
    );
    let tmux = Tmux::start(160, &top);
    let pids = [slow.pid(), fast.pid()];

    // Sorted by rate at first: the fast job above the slow one.
    let screen = tmux.until("both jobs moving", |s| {
        rail_order(s, &pids).len() == 2 && s.contains("MB/s") && !s.contains("interval 0.0 s")
    });
    assert!(screen.contains("sort rate"), "{screen}");
    assert_eq!(
        rail_order(&screen, &pids),
        [fast.pid(), slow.pid()],
        "{screen}"
    );
    // By pid: the slow job (the lower pid) first.
    tmux.keys(&["i"]);
    let screen = tmux.until("the pid sort", |s| s.contains("sort pid"));
    assert_eq!(
        rail_order(&screen, &pids),
        [slow.pid(), fast.pid()],
        "{screen}"
    );
    tmux.keys(&["r"]);
    tmux.until("the rate sort", |s| {
        s.contains("sort rate") && rail_order(s, &pids) == [fast.pid(), slow.pid()]
    });

    // Filtering by process: only the slow job stays.
    tmux.keys(&["f"]);
    tmux.keys(&[&slow.pid().to_string(), "Enter"]);
    let screen = tmux.until("the process filter", |s| {
        s.contains(&format!("filter \"{}\"", slow.pid()))
    });
    assert_eq!(rail_order(&screen, &pids), [slow.pid()], "{screen}");
    assert!(screen.contains("1 processes"), "{screen}");

    // Filtering by peer: one connection of the fast job, by its port.
    let doc = common::top_json(&dir, &["--interval", "0.1", "--agent-control", "off"]);
    let fast_process = common::process(&doc, fast.pid()).unwrap();
    let peer = fast_process["connections"][0]["peer"]
        .as_str()
        .unwrap()
        .to_string();
    let port = peer.rsplit(':').next().unwrap().to_string();
    tmux.keys(&["f", "Escape"]);
    tmux.until("no filter", |s| {
        !s.contains("filter \"") && rail_order(s, &pids).len() == 2
    });
    tmux.keys(&["/"]);
    tmux.keys(&[&format!(":{port}"), "Enter"]);
    let screen = tmux.until("the peer filter", |s| {
        s.contains(&format!("filter \":{port}\""))
    });
    let connections: Vec<&str> = screen
        .lines()
        .skip_while(|l| !l.starts_with("CONNECTIONS"))
        .skip(2)
        .take_while(|l| !l.trim().is_empty())
        .collect();
    assert_eq!(connections.len(), 1, "{screen}");
    assert!(connections[0].contains(&peer), "{screen}");
    assert_eq!(rail_order(&screen, &pids), [fast.pid()], "{screen}");
    // Each key's effect is waited for before the next key or resize: once, in CI, the filter
    // was still being edited when `h` came (typed into it), and the help never showed.
    tmux.keys(&["f"]);
    tmux.until("the filter prompt", |s| {
        s.contains("(Enter applies, Esc clears)")
    });
    tmux.keys(&["Escape"]);
    tmux.until("no filter", |s| {
        !s.contains("filter \"") && rail_order(s, &pids).len() == 2
    });

    // Narrow: the rails table drops its detail columns; wide again: they are back.
    tmux.run(&["resize-window", "-t", "top", "-x", "90"]);
    let screen = tmux.until("the narrow layout", |s| {
        s.lines()
            .any(|l| l.starts_with("PID") && l.contains("DEVICE") && !l.contains("USER"))
    });
    assert!(screen.lines().all(|l| l.chars().count() <= 90), "{screen}");
    tmux.run(&["resize-window", "-t", "top", "-x", "160"]);
    tmux.until("the wide layout", |s| {
        s.lines()
            .any(|l| l.starts_with("PID") && l.contains("USER") && l.contains("RETX/s"))
    });

    // Help, then quit.
    tmux.keys(&["h"]);
    tmux.until("the help", |s| s.contains("mpib-top help"));
    tmux.keys(&["x"]);
    tmux.until("the help closed", |s| !s.contains("mpib-top help"));
    tmux.keys(&["q"]);
    assert!(
        eventually(Duration::from_secs(5), || !tmux.alive()),
        "q did not end mpib-top"
    );
}
