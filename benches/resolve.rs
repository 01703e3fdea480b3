//! `PerfInput::open` + `inject::resolve_only` (scan, model, resolve) on one file, on
//! a one-thread rayon pool and on a pool with every core.
//!
//! The file: `$PDI_BENCH_FILE`, else testdata/demo/demo.data, else
//! /tmp/pdinject-corpus/fp-med.data; with none present the bench prints a notice and
//! measures nothing. Run: `cargo bench --bench resolve` (add `-- --quick` for a short run).

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use pdinject::inject::resolve_only;
use pdinject::input::PerfInput;
use std::hint::black_box;
use std::path::{Path, PathBuf};

fn bench_file() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("PDI_BENCH_FILE") {
        let p = PathBuf::from(p);
        if p.exists() {
            return Some(p);
        }
        eprintln!(
            "resolve bench: PDI_BENCH_FILE={} does not exist",
            p.display()
        );
        return None;
    }
    [
        Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/demo/demo.data"),
        PathBuf::from("/tmp/pdinject-corpus/fp-med.data"),
    ]
    .into_iter()
    .find(|p| p.exists())
}

fn open_and_resolve(path: &Path) -> usize {
    let input = PerfInput::open(path).expect("open the bench file");
    let hits = resolve_only(&input).expect("resolve the bench file");
    black_box(&hits);
    input.data_files.len()
}

fn resolve(c: &mut Criterion) {
    let Some(path) = bench_file() else {
        eprintln!(
            "resolve bench: no input (set PDI_BENCH_FILE, or provide testdata/demo/demo.data \
             or /tmp/pdinject-corpus/fp-med.data); nothing measured"
        );
        return;
    };
    let input = match PerfInput::open(&path) {
        Ok(i) => i,
        Err(e) => {
            eprintln!("resolve bench: {}: {e}; nothing measured", path.display());
            return;
        }
    };
    let bytes = input.data_bytes();
    drop(input);
    let name = path
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    eprintln!(
        "resolve bench: {} ({bytes} bytes of records), 1 and {cores} threads",
        path.display()
    );

    let mut g = c.benchmark_group(format!("resolve/{name}"));
    g.throughput(Throughput::Bytes(bytes));
    if bytes > 32 << 20 {
        g.sample_size(10);
    }
    let mut threads = vec![1];
    if cores > 1 {
        threads.push(cores);
    }
    for n in threads {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build()
            .expect("build a rayon pool");
        g.bench_function(format!("{n}-thread"), |b| {
            b.iter(|| pool.install(|| open_and_resolve(&path)))
        });
    }
    g.finish();
}

criterion_group!(benches, resolve);
criterion_main!(benches);
