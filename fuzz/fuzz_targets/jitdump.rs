//! A jitdump file (a JIT's own output, read by `--jit`) from the fuzzer's bytes: the
//! header, every record, the line entries of DEBUG_INFO records. Invariant: no panic,
//! every record's bytes within the input.
#![no_main]

use libfuzzer_sys::fuzz_target;

// The body lives in the library (src/testing/fuzz.rs), beside what it reaches.
fuzz_target!(|data: &[u8]| pdinject::testing::fuzz::jitdump(data));
