#![no_main]
// The target's body and what it checks: mpib_fuzzing::tcp_wire (fuzzing/src).
libfuzzer_sys::fuzz_target!(|data: &[u8]| mpib_fuzzing::tcp_wire(data));
