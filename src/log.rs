//! Logging through NCCL's logger.
//!
//! NCCL's `ncclDebugLogger_t` is C-variadic and treats its fifth argument as a printf format, so a
//! message is always formatted in Rust and passed as the argument of a constant `"%s"` format (a
//! `%` in a peer address or a device name can then never be read as a conversion). NCCL filters by
//! `NCCL_DEBUG` and `NCCL_DEBUG_SUBSYS` itself; MPIB additionally skips formatting INFO/TRACE
//! messages when `NCCL_DEBUG` does not ask for them, so disabled logging costs one load.

use std::ffi::{c_char, c_int, c_ulong, CString};
use std::fmt;
use std::sync::atomic::{AtomicPtr, AtomicU8, Ordering};

/// NCCL's logger: `void (*)(ncclDebugLogLevel, unsigned long, const char*, int, const char*, ...)`.
pub type LoggerFn = unsafe extern "C" fn(
    level: c_int,
    flags: c_ulong,
    file: *const c_char,
    line: c_int,
    fmt: *const c_char,
    ...
);

/// `ncclDebugLogLevel` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Level {
    /// NCCL_LOG_WARN.
    Warn = 2,
    /// NCCL_LOG_INFO.
    Info = 3,
    /// NCCL_LOG_TRACE.
    Trace = 5,
}

/// `NCCL_INIT` subsystem flag.
pub const INIT: u64 = 1;
/// `NCCL_NET` subsystem flag.
pub const NET: u64 = 16;
/// `NCCL_ENV` subsystem flag.
pub const ENV: u64 = 128;

static LOGGER: AtomicPtr<()> = AtomicPtr::new(std::ptr::null_mut());
/// Highest level worth formatting, from NCCL_DEBUG (0 = nothing, 2 = WARN, 3 = INFO, 5 = TRACE).
static THRESHOLD: AtomicU8 = AtomicU8::new(Level::Warn as u8);

/// Installs (or, with `None`, removes) NCCL's logger and reads `NCCL_DEBUG` for the threshold.
pub fn set_logger(logger: Option<LoggerFn>) {
    let raw = logger.map_or(std::ptr::null_mut(), |f| f as *mut ());
    LOGGER.store(raw, Ordering::Release);
    let threshold = match std::env::var("NCCL_DEBUG")
        .unwrap_or_default()
        .to_ascii_uppercase()
        .as_str()
    {
        "VERSION" | "NONE" => 1,
        "INFO" => Level::Info as u8,
        "TRACE" => Level::Trace as u8,
        _ => Level::Warn as u8,
    };
    THRESHOLD.store(threshold, Ordering::Relaxed);
}

/// Whether a message at `level` would be formatted.
pub fn enabled(level: Level) -> bool {
    level as u8 <= THRESHOLD.load(Ordering::Relaxed)
}

/// Emits one message; used through the `warn!`/`info!`/`trace!` macros.
pub fn emit(
    level: Level,
    subsystems: u64,
    file: &'static str,
    line: u32,
    args: fmt::Arguments<'_>,
) {
    if !enabled(level) {
        return;
    }
    let message = format!("MPIB: {args}");
    let raw = LOGGER.load(Ordering::Acquire);
    if raw.is_null() {
        // No logger (a harness's NULL): stderr, up to what NCCL_DEBUG asks (WARN by default).
        eprintln!("{message}");
        return;
    }
    // SAFETY: `raw` was stored from a `LoggerFn` by `set_logger`; fn pointers round-trip
    // through `*mut ()` unchanged.
    let logger: LoggerFn = unsafe { std::mem::transmute::<*mut (), LoggerFn>(raw) };
    let text = CString::new(message.replace('\0', " ")).unwrap_or_default();
    let file = CString::new(file).unwrap_or_default();
    // SAFETY: NCCL's logger accepts a printf format and its arguments; "%s" consumes exactly
    // one NUL-terminated string, which `text` is, alive for the call.
    unsafe {
        logger(
            level as c_int,
            subsystems as c_ulong,
            file.as_ptr(),
            line as c_int,
            c"%s".as_ptr(),
            text.as_ptr(),
        );
    }
}

/// Logs at WARN: `warn!(log::NET, "fmt", args...)`.
#[macro_export]
macro_rules! warn {
    ($subsys:expr, $($arg:tt)*) => {
        $crate::log::emit($crate::log::Level::Warn, $subsys, file!(), line!(), format_args!($($arg)*))
    };
}

/// Logs at INFO.
#[macro_export]
macro_rules! info {
    ($subsys:expr, $($arg:tt)*) => {
        $crate::log::emit($crate::log::Level::Info, $subsys, file!(), line!(), format_args!($($arg)*))
    };
}

/// Logs at TRACE.
#[macro_export]
macro_rules! trace {
    ($subsys:expr, $($arg:tt)*) => {
        $crate::log::emit($crate::log::Level::Trace, $subsys, file!(), line!(), format_args!($($arg)*))
    };
}

/// A WARN that strangers can cause, at most once per interval and with how many happened since
/// the last (a flood of bad connections must not flood the log: issue 34 saw 4,001 lines).
#[derive(Debug)]
pub(crate) struct Throttle {
    interval: std::time::Duration,
    count: u64,
    last: Option<std::time::Instant>,
}

impl Throttle {
    /// One WARN per `interval` at most.
    pub(crate) const fn new(interval: std::time::Duration) -> Throttle {
        Throttle {
            interval,
            count: 0,
            last: None,
        }
    }

    /// Counts one occurrence at `now`; `Some(count)` when a WARN is due, `count` being the
    /// occurrences since the last WARN, this one included.
    pub(crate) fn note(&mut self, now: std::time::Instant) -> Option<u64> {
        self.count += 1;
        let due = self
            .last
            .map_or(true, |last| now.duration_since(last) >= self.interval);
        if !due {
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.count))
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    #[test]
    fn a_throttle_warns_once_per_interval_with_the_count() {
        let mut throttle = super::Throttle::new(Duration::from_secs(10));
        let start = Instant::now();
        assert_eq!(throttle.note(start), Some(1));
        for second in 1..10 {
            assert_eq!(throttle.note(start + Duration::from_secs(second)), None);
        }
        assert_eq!(throttle.note(start + Duration::from_secs(10)), Some(10));
        assert_eq!(throttle.note(start + Duration::from_secs(11)), None);
    }
}
