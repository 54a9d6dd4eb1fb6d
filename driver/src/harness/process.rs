//! The processes a case starts: each with its output in a log file, a deadline after which it is
//! killed (nothing may hang), and an exit that says how it ended.

use std::fs::File;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::stopping;

/// How a process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// It exited with this status.
    Code(i32),
    /// A signal ended it (9: the case killed it).
    Signal(i32),
    /// It outlived its deadline and was killed.
    TimedOut,
    /// The harness was interrupted and killed it.
    Interrupted,
    /// It could not be started.
    NotStarted,
}

impl Exit {
    /// Exited with status 0.
    pub fn success(self) -> bool {
        self == Exit::Code(0)
    }
}

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Exit::Code(code) => write!(f, "exit {code}"),
            Exit::Signal(signal) => write!(f, "signal {signal}"),
            Exit::TimedOut => write!(f, "timed out"),
            Exit::Interrupted => write!(f, "interrupted"),
            Exit::NotStarted => write!(f, "not started"),
        }
    }
}

/// A started process (or the reason it could not start, in its log).
#[derive(Debug)]
pub struct Process {
    child: Option<Child>,
    deadline: Instant,
    exit: Option<Exit>,
    /// Where its stdout and stderr go.
    pub log: PathBuf,
}

impl Process {
    /// Starts `command` in a process group of its own, with stdin empty and stdout and stderr
    /// into `log`, to be killed (with anything it started) after `limit`. A failure to start is
    /// written to the log and ends as [`Exit::NotStarted`].
    pub fn start(mut command: Command, log: &Path, limit: Duration) -> Process {
        command.process_group(0);
        let started = File::create(log).and_then(|file| {
            let err = file.try_clone()?;
            command
                .stdin(Stdio::null())
                .stdout(file)
                .stderr(err)
                .spawn()
        });
        let (child, exit) = match started {
            Ok(child) => (Some(child), None),
            Err(error) => {
                let message = format!("FAILED to start {:?}: {error}\n", command.get_program());
                let _ = std::fs::write(log, message);
                (None, Some(Exit::NotStarted))
            }
        };
        Process {
            child,
            deadline: Instant::now() + limit,
            exit,
            log: log.to_path_buf(),
        }
    }

    /// Its process id (the program itself: `ip netns exec` and `env` exec, they do not fork).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether it still runs; kills it at its deadline or when the harness is stopping.
    pub fn running(&mut self) -> bool {
        if self.exit.is_some() {
            return false;
        }
        let Some(child) = self.child.as_mut() else {
            return false;
        };
        match child.try_wait() {
            Ok(Some(status)) => {
                self.exit = Some(match (status.code(), status.signal()) {
                    (Some(code), _) => Exit::Code(code),
                    (None, Some(signal)) => Exit::Signal(signal),
                    (None, None) => Exit::Code(-1),
                });
                false
            }
            Ok(None) if stopping() => self.end(Exit::Interrupted),
            Ok(None) if Instant::now() >= self.deadline => self.end(Exit::TimedOut),
            Ok(None) => true,
            Err(_) => self.end(Exit::Code(-1)),
        }
    }

    fn end(&mut self, how: Exit) -> bool {
        self.kill();
        if let Some(child) = self.child.as_mut() {
            let _ = child.wait();
        }
        self.exit = Some(how);
        false
    }

    /// SIGKILLs it and its process group now (a case's victim); its exit then reads
    /// [`Exit::Signal`] 9.
    pub fn kill(&mut self) {
        if let Some(child) = self.child.as_mut() {
            if let Ok(group) = i32::try_from(child.id()) {
                // SAFETY: kill(2) on the group this child leads (process_group(0) at start); the
                // child is not reaped yet, so the id is still ours.
                unsafe { libc::kill(-group, libc::SIGKILL) };
            }
            let _ = child.kill();
        }
    }

    /// Stops it with SIGKILL unless it has already ended (a peer that failed leaves it waiting).
    pub fn stop(&mut self) {
        if self.running() {
            self.end(Exit::Signal(libc::SIGKILL));
        }
    }

    /// Waits until it ends (or its deadline).
    pub fn wait(&mut self) -> Exit {
        while self.running() {
            std::thread::sleep(Duration::from_millis(20));
        }
        self.exit.unwrap_or(Exit::NotStarted)
    }

    /// How it ended, once it has.
    pub fn exit(&self) -> Option<Exit> {
        self.exit
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Waits for every process; once one has failed, the others get `grace` to end on their own
/// (they should see the failure) before they are stopped. Returns their exits in order.
pub fn reap(processes: &mut [&mut Process], grace: Duration) -> Vec<Exit> {
    let mut failed_at: Option<Instant> = None;
    loop {
        let mut any_running = false;
        for process in processes.iter_mut() {
            if process.running() {
                any_running = true;
            } else if failed_at.is_none() && !process.exit().is_some_and(Exit::success) {
                failed_at = Some(Instant::now());
            }
        }
        if !any_running {
            break;
        }
        if failed_at.is_some_and(|at| at.elapsed() >= grace) {
            processes.iter_mut().for_each(|process| process.stop());
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    processes
        .iter()
        .map(|process| process.exit().unwrap_or(Exit::NotStarted))
        .collect()
}

/// Waits (at most `limit`) until `ready` holds or one of `processes` has ended.
pub fn wait_until(
    processes: &mut [&mut Process],
    limit: Duration,
    mut ready: impl FnMut() -> bool,
) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end && !stopping() {
        if ready() {
            return true;
        }
        if processes.iter_mut().any(|process| !process.running()) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shell(script: &str, log: &Path, limit: Duration) -> Process {
        let mut command = Command::new("sh");
        command.args(["-c", script]);
        Process::start(command, log, limit)
    }

    #[test]
    fn a_peer_that_fails_stops_the_other_after_the_grace() {
        let dir = crate::temp_dir("harness-process").unwrap();
        let mut failing = shell(
            "echo gone; exit 3",
            &dir.join("a.log"),
            Duration::from_secs(30),
        );
        let mut waiting = shell("sleep 30", &dir.join("b.log"), Duration::from_secs(30));
        let begun = Instant::now();
        let exits = reap(
            &mut [&mut failing, &mut waiting],
            Duration::from_millis(200),
        );
        assert_eq!(exits, vec![Exit::Code(3), Exit::Signal(libc::SIGKILL)]);
        assert!(begun.elapsed() < Duration::from_secs(10));
        assert_eq!(
            std::fs::read_to_string(dir.join("a.log")).unwrap(),
            "gone\n"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_process_past_its_deadline_is_killed_and_says_so() {
        let dir = crate::temp_dir("harness-process").unwrap();
        let mut slow = shell("sleep 30", &dir.join("a.log"), Duration::from_millis(100));
        assert_eq!(slow.wait(), Exit::TimedOut);
        let missing = Process::start(
            Command::new("/nonexistent/program"),
            &dir.join("b.log"),
            Duration::from_secs(1),
        );
        assert_eq!(missing.exit(), Some(Exit::NotStarted));
        assert!(std::fs::read_to_string(dir.join("b.log"))
            .unwrap()
            .contains("FAILED to start"));
        std::fs::remove_dir_all(dir).unwrap();
    }
}
