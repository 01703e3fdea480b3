//! An attr derived from the first 32 bytes, the rest decoded as a SAMPLE record in
//! both byte orders, and every decoded callchain walked.
#![no_main]

use libfuzzer_sys::fuzz_target;

// The body lives in the library (src/testing/fuzz.rs), beside what it reaches.
fuzz_target!(|data: &[u8]| pdinject::testing::fuzz::sample(data));
