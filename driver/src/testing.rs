//! Helpers for the root package's integration tests (one test binary = one process).

use std::sync::mpsc;
use std::sync::OnceLock;
use std::time::Duration;

use crate::error::Result;
use crate::plugin::Plugin;
use crate::proxy::Pair;
use crate::{env, Plan, Version};

/// Environment every test process of the suite starts with.
pub const LOOPBACK: &[(&str, &str)] = &[("MPIB_FABRIC", "loopback")];

/// Sets `vars` once for this process (the first caller wins; every test of a binary should pass
/// the same list) and returns the plugin, loaded once per process and never unloaded.
pub fn shared_plugin(vars: &[(&str, &str)]) -> &'static Plugin {
    static PLUGIN: OnceLock<Plugin> = OnceLock::new();
    env::set_process_defaults(vars);
    PLUGIN.get_or_init(|| match crate::load_built_plugin() {
        Ok(plugin) => plugin,
        Err(e) => panic!("{e}"),
    })
}

/// Runs `body` on its own thread and fails the test if it does not finish within `limit`: a
/// plugin call that blocks must not hang the suite. (The stuck thread is abandoned; the process
/// ends with the test binary.)
pub fn bounded<T: Send + 'static>(limit: Duration, body: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let name = std::thread::current().name().unwrap_or("test").to_string();
    std::thread::Builder::new()
        .name(format!("{name}-body"))
        .spawn(move || {
            let _ = tx.send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)));
        })
        .expect("spawn test body");
    match rx.recv_timeout(limit) {
        Ok(Ok(value)) => value,
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        Err(_) => panic!("`{name}` did not finish within {limit:?}: a plugin call blocked"),
    }
}

/// The sizes every version must move byte-exactly.
pub const BASIC_SIZES: [usize; 6] = [0, 1, 127, 128, 4097, (1 << 20) + 3];

/// 64 MiB, moved on the versions chosen to cover both size types (v8 `int`, v12 `size_t`).
pub const LARGE_SIZE: usize = 64 << 20;

/// Exchanges each size in turn (fresh pattern per size and iteration) and checks every byte.
pub fn exchange_sizes(
    pair: &mut Pair<'_, '_>,
    sizes: &[usize],
    case: &str,
    iterations: u64,
) -> Result<()> {
    let case = crate::pattern::case_id(case);
    for &size in sizes {
        for iteration in 0..iterations {
            pair.exchange(&Plan::single(size), case ^ size as u64, iteration)?;
        }
    }
    Ok(())
}

/// Grouped receives with `n = 1..=8` buffers (the shared conformance list, see
/// [`crate::cases::grouped_plans`]).
pub use crate::cases::grouped_plans;

/// A receive capacity like NCCL's: at least a 512 KiB buffer slot, else the next power of two.
pub fn slot_capacity(size: usize) -> usize {
    (size + 1).next_power_of_two().max(512 << 10)
}

/// Exchanges each size into a receive of `capacity(size)` bytes (NCCL posts its buffer slot size,
/// not the message size).
pub fn exchange_sizes_in_larger_receives(
    pair: &mut Pair<'_, '_>,
    sizes: &[usize],
    capacity: impl Fn(usize) -> usize + Copy,
    case: &str,
) -> Result<()> {
    let case = crate::pattern::case_id(case);
    for &size in sizes {
        pair.exchange(
            &Plan::single(size).with_capacities(capacity),
            case ^ size as u64,
            0,
        )?;
    }
    Ok(())
}

/// Runs every grouped plan once.
pub fn exchange_grouped(pair: &mut Pair<'_, '_>, case: &str) -> Result<()> {
    let case = crate::pattern::case_id(case);
    for (i, plan) in grouped_plans().iter().enumerate() {
        pair.exchange(plan, case ^ i as u64, 0)?;
    }
    Ok(())
}

/// 32 grouped receives of 8 buffers each, up to 256 sends in flight (the shared conformance
/// list, see [`crate::cases::many_outstanding_plan`]).
pub use crate::cases::many_outstanding_plan;

/// Parses `MPIB_DRIVER_VERSION` (set by the parent of a child test).
pub fn version_arg() -> Version {
    let text = std::env::var("MPIB_DRIVER_VERSION").unwrap_or_else(|_| "12".into());
    let number: u32 = text.trim().trim_start_matches('v').parse().unwrap_or(12);
    Version::ALL
        .into_iter()
        .find(|v| v.number() == number)
        .unwrap_or(Version::V12)
}
