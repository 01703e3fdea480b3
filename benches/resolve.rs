//! `driver::analyse`: the engine with no output (scan, model, resolve with DWARF
//! unwinding of `--call-graph dwarf` samples, identify) on one file, with unwinding
//! and without, with one worker thread and with every core (the pool is made per
//! run, well under a millisecond). Throughput is in samples, so
//! criterion's elements/s is the per-sample cost; the difference between the
//! `unwind` and `no-unwind` lines is what unwinding costs per sample.
//!
//! The file: `$PDI_BENCH_FILE`, else /tmp/pdinject-corpus/dwarf-med.data (made by
//! ../shared/tools/record-corpus.sh), else testdata/demo/demo.data; with none present
//! the bench prints a notice and measures nothing. Unwinding reads the recorded DSOs,
//! so a DWARF recording is only unwound on the machine that made it.
//! Run: `cargo bench --bench resolve` (add `-- --quick` for a short run).

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use pdinject::options::{Options, UnwindChoice};
use pdinject::testing::driver::analyse;
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
        PathBuf::from("/tmp/pdinject-corpus/dwarf-med.data"),
        Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/demo/demo.data"),
    ]
    .into_iter()
    .find(|p| p.exists())
}

fn open_and_resolve(path: &Path, opts: &Options) -> u64 {
    let r = analyse(path, opts).expect("analyse the bench file");
    black_box(&r.dsos);
    r.reading.samples
}

fn bench_resolve(c: &mut Criterion) {
    let Some(path) = bench_file() else {
        eprintln!(
            "resolve bench: no input (set PDI_BENCH_FILE, or provide \
             /tmp/pdinject-corpus/dwarf-med.data or testdata/demo/demo.data); nothing measured"
        );
        return;
    };
    let samples = match analyse(&path, &Options::default()) {
        Ok(r) => r.reading.samples,
        Err(e) => {
            eprintln!("resolve bench: {}: {e}; nothing measured", path.display());
            return;
        }
    };
    let name = path
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    eprintln!(
        "resolve bench: {} ({samples} samples), 1 and {cores} threads",
        path.display()
    );

    let mut g = c.benchmark_group(format!("resolve/{name}"));
    g.throughput(Throughput::Elements(samples.max(1)));
    g.sample_size(10);
    let mut threads = vec![1];
    if cores > 1 {
        threads.push(cores);
    }
    for n in threads {
        for (label, unwind) in [
            ("unwind", UnwindChoice::Auto),
            ("no-unwind", UnwindChoice::None),
        ] {
            let opts = Options {
                unwind: pdinject::options::Unwinding {
                    how: unwind,
                    ..Default::default()
                },
                jobs: Some(n),
                ..Options::default()
            };
            g.bench_function(format!("{label}/{n}-thread"), |b| {
                b.iter(|| open_and_resolve(&path, &opts))
            });
        }
    }
    g.finish();
}

criterion_group!(benches, bench_resolve);
criterion_main!(benches);
