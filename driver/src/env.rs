//! Process environment changes, serialised with every plugin `init` the driver makes.
//!
//! The plugin snapshots `MPIB_*` at `init`, and it is a separate image with its own copy of std,
//! so std's internal env lock does not protect its `getenv` against our `setenv`. The driver
//! therefore takes [`lock`] around every `init` and every change it makes, and tests change the
//! environment only through here.

use std::ffi::OsString;
use std::sync::{Mutex, MutexGuard, Once};

static ENV_LOCK: Mutex<()> = Mutex::new(());

/// Holds the driver's environment lock.
pub struct EnvLock {
    _guard: MutexGuard<'static, ()>,
}

/// Takes the environment lock (poisoning from a panicking test is ignored).
pub fn lock() -> EnvLock {
    EnvLock {
        _guard: ENV_LOCK
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()),
    }
}

/// Previous values of the variables [`apply`] changed.
pub type Saved = Vec<(String, Option<OsString>)>;

/// Sets (`Some`) or removes (`None`) each variable; returns what to [`restore`].
pub fn apply(_lock: &EnvLock, vars: &[(&str, Option<&str>)]) -> Saved {
    let mut saved = Vec::with_capacity(vars.len());
    for (name, value) in vars {
        saved.push((name.to_string(), std::env::var_os(name)));
        match value {
            Some(v) => std::env::set_var(name, v),
            None => std::env::remove_var(name),
        }
    }
    saved
}

/// Undoes [`apply`], last change first.
pub fn restore(_lock: &EnvLock, saved: Saved) {
    for (name, value) in saved.into_iter().rev() {
        match value {
            Some(v) => std::env::set_var(&name, v),
            None => std::env::remove_var(&name),
        }
    }
}

/// Sets variables for the rest of the process, once: the first caller's `vars` win. Call it at
/// the start of every test of a binary (with the same `vars`) so that all of them see them.
pub fn set_process_defaults(vars: &[(&str, &str)]) {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let lock = lock();
        let vars: Vec<(&str, Option<&str>)> = vars.iter().map(|(k, v)| (*k, Some(*v))).collect();
        let _ = apply(&lock, &vars);
    });
}

/// `MPIB_FABRIC` as set, or `loopback` when unset.
pub fn fabric_or_loopback() -> String {
    std::env::var("MPIB_FABRIC")
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "loopback".into())
}
