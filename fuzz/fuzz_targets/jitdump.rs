//! A jitdump file (a JIT's own output, read by `--jit`) from the fuzzer's bytes: the
//! header, every record, the line entries of DEBUG_INFO records. Invariant: no panic,
//! every record's bytes within the input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pdinject::testing::format::{Reader, Record, lines};

fuzz_target!(|data: &[u8]| {
    let Ok(mut r) = Reader::new(data) else {
        return;
    };
    let swapped = r.swapped();
    // A dump's records are bounded by its size; the cap only guards the fuzzer's time.
    for _ in 0..10_000 {
        let Ok(Some(e)) = r.next_entry() else {
            break;
        };
        assert!(e.offset <= data.len() as u64);
        match e.record {
            Record::Load(l) => assert!(l.code.len() <= data.len()),
            Record::Debug { count, raw, .. } => {
                assert!(raw.len() <= data.len());
                for l in lines(raw, count, swapped) {
                    assert!(l.name.is_none_or(|n| n.len() <= raw.len()));
                }
            }
            Record::Unwinding(u) => assert!(u.data.len() <= data.len()),
            Record::Move(_) | Record::Close | Record::Unknown(_) => {}
        }
    }
});
