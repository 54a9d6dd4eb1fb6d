#![no_main]
// The target's body and what it checks: mpib_fuzzing::link_frames (fuzzing/src).
libfuzzer_sys::fuzz_target!(|data: &[u8]| mpib_fuzzing::link_frames(data));
