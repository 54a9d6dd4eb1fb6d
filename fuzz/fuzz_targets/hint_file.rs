#![no_main]
// The target's body and what it checks: mpib_fuzzing::hint_file (fuzzing/src).
libfuzzer_sys::fuzz_target!(|data: &[u8]| mpib_fuzzing::hint_file(data));
