//! The sans-IO protocol core.
#![forbid(unsafe_code)]
