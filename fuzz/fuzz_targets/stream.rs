//! Pipe mode from memory to memory: `pipe::process` over arbitrary bytes as if they
//! came down a pipe. It must return (an error or a report), never panic or hang, and
//! on success its output must begin with the input's pipe header.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pdinject::Options;

fuzz_target!(|data: &[u8]| {
    let opts = Options {
        jobs: Some(1),
        ..Options::default()
    };
    let mut out = Vec::new();
    if pdinject::testing::driver::stream_in_batches(&mut &data[..], &mut out, &opts, 1 << 20)
        .is_ok()
    {
        assert!(
            out.len() >= 16 && out[..16] == data[..16],
            "a successful run must copy the pipe header"
        );
    }
});
