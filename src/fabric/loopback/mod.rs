//! In-process loopback fabric.
