//! ELF images, raw note streams and BUILD_ID feature tables.
#![no_main]

use libfuzzer_sys::fuzz_target;

// The body lives in the library (src/testing/fuzz.rs), beside what it reaches.
fuzz_target!(|data: &[u8]| pdinject::testing::fuzz::notes(data));
