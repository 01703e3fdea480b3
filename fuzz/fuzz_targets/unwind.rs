//! The unwinder's input: registers and a user-stack copy from the fuzzer, unwound with
//! real CFI (the fuzz binary itself and the libc it maps, taken from
//! /proc/self/maps) in both architectures' register sets, with the frame cap and
//! budget of a normal run.
#![no_main]

use libfuzzer_sys::fuzz_target;

// The body lives in the library (src/testing/fuzz.rs), beside what it reaches.
fuzz_target!(|data: &[u8]| pdinject::testing::fuzz::unwind(data));
