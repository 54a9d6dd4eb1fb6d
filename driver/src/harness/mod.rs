//! The one harness for every topology (`mpib-harness`): the cross-process cases of the plugin
//! (rank pairs, faults, flaps, failbacks, killed processes, strangers, collectives over several
//! ranks) defined once in [`catalog`], each run over a topology given as a parameter:
//!
//! * [`topology::Loopback`]: one host, no network; collectives with every rank in one process.
//! * [`bed::Bed`]: network namespaces over veth pairs running the tcp fabric, any number of
//!   hosts (two cabled back to back, three or more through one switch per rail), rails shaped
//!   with `tc tbf`, links cut, cut one way, flapped, processes killed.
//! * [`rig::Rig`]: inside the Soft-RoCE VM (real rxe verbs NICs, `netem` on their wires).
//!
//! Every case ends in one [`record::Record`] (`results.jsonl` beside the logs), judged from the
//! exit statuses and what the processes' logs say ([`logs`]), never from timing alone.

pub mod bed;
pub mod catalog;
pub mod collective;
pub mod faults;
pub mod logs;
pub mod pair;
pub mod process;
pub mod record;
pub mod rig;
pub mod rig_cases;
pub mod run;
pub mod topology;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Set by SIGINT or SIGTERM: the running case's processes are killed, no further case starts,
/// and the topology is torn down on the way out.
static STOPPING: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOPPING.store(true, Ordering::SeqCst);
}

/// Routes SIGINT and SIGTERM to [`stopping`] (the harness's own teardown runs instead of dying
/// with namespaces and processes left behind).
pub fn catch_signals() {
    let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, handler);
        libc::signal(libc::SIGTERM, handler);
    }
}

/// True once SIGINT or SIGTERM arrived.
pub fn stopping() -> bool {
    STOPPING.load(Ordering::SeqCst)
}

/// Sleeps `duration`, waking early when the harness is stopping.
pub fn pause(duration: Duration) {
    let end = std::time::Instant::now() + duration;
    while !stopping() {
        let now = std::time::Instant::now();
        if now >= end {
            return;
        }
        std::thread::sleep((end - now).min(Duration::from_millis(20)));
    }
}

/// `MPIB_*` settings of a process, in layers: a later layer's value wins, and `None` unsets a
/// variable an earlier layer set (the rig's "default retries" cases unset its retry count).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Settings(BTreeMap<String, Option<String>>);

impl Settings {
    /// Settings from `K=V` words; a bare `K` (no `=`) unsets K.
    pub fn words(text: &str) -> Settings {
        let mut settings = Settings::default();
        for word in text.split_whitespace() {
            match word.split_once('=') {
                Some((key, value)) => settings.set(key, value),
                None => settings.unset(word),
            }
        }
        settings
    }

    /// Sets `key` to `value`.
    pub fn set(&mut self, key: &str, value: &str) {
        self.0.insert(key.to_string(), Some(value.to_string()));
    }

    /// Unsets `key` (a layer below may have set it).
    pub fn unset(&mut self, key: &str) {
        self.0.insert(key.to_string(), None);
    }

    /// These settings with `over`'s on top.
    pub fn with(&self, over: &Settings) -> Settings {
        let mut merged = self.clone();
        merged.0.extend(over.0.clone());
        merged
    }

    /// The value `key` ends with, if any.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.as_deref())
    }

    /// Applies them to a command whose environment was already cleared of `MPIB_*`.
    pub fn apply(&self, command: &mut std::process::Command) {
        for (key, value) in &self.0 {
            match value {
                Some(value) => command.env(key, value),
                None => command.env_remove(key),
            };
        }
    }
}

/// A file name for a case: its name with everything but `[A-Za-z0-9=_.-]` as `_`.
pub fn slug(name: &str) -> String {
    let text: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "=_.-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    text.trim_end_matches('_').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn later_layers_win_and_a_bare_word_unsets() {
        let base = Settings::words("MPIB_FABRIC=verbs MPIB_IB_RETRY_CNT=6");
        let case = Settings::words("MPIB_IB_RETRY_CNT MPIB_MODE=1");
        let merged = base.with(&case);
        assert_eq!(merged.get("MPIB_FABRIC"), Some("verbs"));
        assert_eq!(merged.get("MPIB_IB_RETRY_CNT"), None);
        assert_eq!(merged.get("MPIB_MODE"), Some("1"));
    }

    #[test]
    fn slugs_keep_only_file_name_characters() {
        assert_eq!(slug("v12 flap: SUP (veth_a1)"), "v12_flap__SUP__veth_a1");
    }
}
