//! Bytes → `PerfInput::from_bytes` → `resolve_only` (scan, model, resolve) on a
//! one-thread rayon pool. Must never panic, whatever the bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::Path;
use std::sync::OnceLock;

fn pool() -> &'static rayon::ThreadPool {
    static POOL: OnceLock<rayon::ThreadPool> = OnceLock::new();
    POOL.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .expect("one-thread rayon pool")
    })
}

fuzz_target!(|data: &[u8]| {
    if let Ok(input) = pdinject::input::PerfInput::from_bytes(Path::new("fuzz"), data.to_vec()) {
        let _ = pool().install(|| pdinject::inject::resolve_only(&input));
    }
});
