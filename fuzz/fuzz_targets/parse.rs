//! Bytes → the engine alone (`driver::validate_bytes`: scan, model, resolve, identify
//! from the input itself), file or stream format. Must never panic, whatever the bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The engine alone, sample bodies decoded, nothing outside the input read.
    let _ = pdinject::testing::driver::validate_bytes(data);
});
