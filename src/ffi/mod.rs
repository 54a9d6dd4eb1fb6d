//! The C ABI: exported NCCL net tables (filled in by the FFI work).
