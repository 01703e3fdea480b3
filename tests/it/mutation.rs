//! Deterministic mutation test: small real perf.data files are truncated, bit-flipped
//! and given corrupt record and header sizes, and every mutant goes through the whole
//! library pipeline (`pdinject::run`, in-process). Whatever the bytes, a run must not
//! panic (in any thread), must leave no output and no temp file behind when it fails,
//! and must never modify its input; when it succeeds its output must open again.
//!
//! Inputs: testdata/demo/demo.data, testdata/mutation/ (a `perf record -z` recording,
//! a big-endian one and the hostile structures of tests/it/hostile.rs) and ../shared/testdata/quipper files under 200 KB, piped ones
//! (pipe mode) included;
//! with neither present the test is ignored, saying so. Mutants come from a
//! fixed-seed xorshift PRNG, so every run tests the same mutants. `PDI_MUTATION_SCALE`
//! (a float, default 1) scales the number of random mutants per input.

use pdinject::{Options, run};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// xorshift64* with a fixed seed: deterministic, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

const MAX_INPUT: u64 = 200 * 1024;
const MAX_BOUNDARIES: usize = 2000;
const RANDOM_TRUNCATIONS: usize = 50;
const BIT_FLIPS: usize = 200;
const SIZE_CORRUPTED_RECORDS: usize = 12;
/// Whole-test budget: inputs beyond it are left out (with a notice), not failed.
const BUDGET: Duration = Duration::from_secs(45);
/// A single run longer than this is a hang: the test aborts naming the mutant.
const HANG: Duration = Duration::from_secs(20);

fn inputs() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut v = Vec::new();
    let demo = root.join("testdata/demo/demo.data");
    if demo.is_file() {
        v.push(demo);
    }
    // A compressed (-z) and a big-endian recording, shipped for this test.
    // And the hostile structures of tests/it/hostile.rs (fork chains, aliased
    // sections, damaged tables, long and control-character names, overlapping ids).
    for name in [
        "z-small.data",
        "be-small.data",
        "hostile-forks.data",
        "hostile-aliases.data",
        "hostile-names.data",
        "hostile-ids.data",
    ] {
        let p = root.join("testdata/mutation").join(name);
        if p.is_file() {
            v.push(p);
        }
    }
    let quipper = root.join("../shared/testdata/quipper");
    if let Ok(rd) = std::fs::read_dir(&quipper) {
        let mut q: Vec<(u64, PathBuf)> = rd
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("perf.data"))
            })
            .filter_map(|p| Some((std::fs::metadata(&p).ok()?.len(), p)))
            .filter(|(len, _)| *len > 0 && *len < MAX_INPUT)
            .collect();
        // Smallest first, so that the time budget drops the largest.
        q.sort();
        v.extend(q.into_iter().map(|(_, p)| p));
    }
    v
}

/// Big-endian files (magic "2ELIFREP") are read and patched in their own order.
fn is_be(b: &[u8]) -> bool {
    b.get(..8) == Some(b"2ELIFREP")
}

fn le16(b: &[u8], at: usize) -> Option<u16> {
    let v: [u8; 2] = b.get(at..at + 2)?.try_into().ok()?;
    Some(if is_be(b) {
        u16::from_be_bytes(v)
    } else {
        u16::from_le_bytes(v)
    })
}

fn le64(b: &[u8], at: usize) -> Option<u64> {
    let v: [u8; 8] = b.get(at..at + 8)?.try_into().ok()?;
    Some(if is_be(b) {
        u64::from_be_bytes(v)
    } else {
        u64::from_le_bytes(v)
    })
}

fn put64(b: &mut [u8], at: usize, v: u64) {
    let bytes = if is_be(b) {
        v.to_be_bytes()
    } else {
        v.to_le_bytes()
    };
    if let Some(s) = b.get_mut(at..at + 8) {
        s.copy_from_slice(&bytes);
    }
}

/// Offsets of the records of a perf.data (file mode: the data section at header
/// offsets 40/48; pipe mode: everything after the 16-byte header; record size is the
/// u16 at offset 6 of each record), then the end of the last whole record.
fn record_offsets(b: &[u8]) -> Vec<usize> {
    let mut v = Vec::new();
    if !(b.get(..8) == Some(b"PERFILE2") || is_be(b)) {
        return v;
    }
    let (off, size) = match le64(b, 8) {
        Some(16) => (16, b.len() as u64),
        Some(104) => match (le64(b, 40), le64(b, 48)) {
            (Some(off), Some(size)) => (off, size),
            _ => return v,
        },
        _ => return v,
    };
    let end = off.saturating_add(size).min(b.len() as u64) as usize;
    let mut at = off as usize;
    while at + 8 <= end {
        v.push(at);
        match le16(b, at + 6) {
            Some(s) if s >= 8 => at += s as usize,
            _ => return v,
        }
    }
    v.push(at.min(end));
    v
}

/// Picks at most `n` items spread evenly over `v` (all of them when fewer).
fn spread<T: Copy>(v: &[T], n: usize) -> Vec<T> {
    if v.len() <= n {
        return v.to_vec();
    }
    (0..n)
        .map(|i| v[i * (v.len() - 1) / (n - 1).max(1)])
        .collect()
}

fn mutants(orig: &[u8], rng: &mut Rng, scale: f64) -> Vec<(String, Vec<u8>)> {
    let scaled = |n: usize| ((n as f64 * scale).round() as usize).max(1);
    let mut out: Vec<(String, Vec<u8>)> = Vec::new();
    let len = orig.len();
    let recs = record_offsets(orig);

    // Truncation at record boundaries (and half-way into the next header); and the
    // same cut with the header made consistent (data size shortened, no features), as
    // a recording that stopped there would look: those must mostly succeed.
    let data_off = le64(orig, 40).unwrap_or(0) as usize;
    for &at in &spread(&recs, MAX_BOUNDARIES) {
        out.push((
            format!("truncate at record boundary {at:#x}"),
            orig[..at].to_vec(),
        ));
        if at >= data_off && at >= 104 {
            let mut m = orig[..at].to_vec();
            put64(&mut m, 48, (at - data_off) as u64);
            m[72..104].fill(0);
            out.push((
                format!("consistent truncation at record boundary {at:#x}"),
                m,
            ));
        }
        if at + 4 < len {
            out.push((
                format!("truncate at {:#x} (inside a record header)", at + 4),
                orig[..at + 4].to_vec(),
            ));
        }
    }
    // Truncation at random offsets, and at the header and feature-table edges.
    let mut cuts: Vec<usize> = (0..scaled(RANDOM_TRUNCATIONS))
        .map(|_| rng.below(len))
        .collect();
    cuts.extend([0, 7, 8, 16, 64, 103, 104, len.saturating_sub(1)]);
    if let (Some(off), Some(size)) = (le64(orig, 40), le64(orig, 48)) {
        let data_end = off.saturating_add(size) as usize;
        cuts.extend([data_end, data_end + 8, data_end + 16]);
    }
    cuts.sort();
    cuts.dedup();
    for at in cuts.into_iter().filter(|&c| c < len) {
        out.push((format!("truncate at {at:#x}"), orig[..at].to_vec()));
    }
    // Bit flips: half in the first 4 KiB (header, attrs, ids, first records), half
    // anywhere (records, feature sections).
    for i in 0..scaled(BIT_FLIPS) {
        let at = if i % 2 == 0 {
            rng.below(len.min(4096))
        } else {
            rng.below(len)
        };
        let bit = rng.below(8);
        let mut m = orig.to_vec();
        m[at] ^= 1 << bit;
        out.push((format!("flip bit {bit} of byte {at:#x}"), m));
    }
    // Corrupt record sizes: a few records spread over the data section.
    let body = &recs[..recs.len().saturating_sub(1)];
    for &at in &spread(body, SIZE_CORRUPTED_RECORDS) {
        for size in [0u16, 1, 7, 0xffff] {
            let mut m = orig.to_vec();
            let bytes = if is_be(orig) {
                size.to_be_bytes()
            } else {
                size.to_le_bytes()
            };
            m[at + 6..at + 8].copy_from_slice(&bytes);
            out.push((format!("record at {at:#x}: size {size:#x}"), m));
        }
    }
    // Corrupt header fields. Layout: magic 0, size 8, attr_size 16, attrs {24, 32},
    // data {40, 48}, event_types {56, 64}, features bitmap 72..104.
    if len >= 104 {
        let huge = [u64::MAX, u64::MAX / 2, 1 << 40, len as u64 + 1];
        let fields: &[(usize, &str, &[u64])] = &[
            (8, "header size", &[0, 8, 64, 103, 105, 4096, u64::MAX]),
            (
                16,
                "attr size",
                &[0, 1, 8, 16, 63, 64 + 15, 0x1_0000, u64::MAX],
            ),
            (24, "attrs offset", &huge),
            (32, "attrs size", &[0, 1, 7, u64::MAX, u64::MAX - 7]),
            (40, "data offset", &[0, 8, 103, u64::MAX, u64::MAX - 7]),
            (48, "data size", &[0, 1, 7, u64::MAX, 1 << 40, len as u64]),
            (56, "event types offset", &huge),
            (64, "event types size", &huge),
            (72, "features[0]", &[0, u64::MAX, 1 << 2, 1 << 63]),
            (80, "features[1]", &[u64::MAX]),
        ];
        for (at, what, values) in fields {
            for &v in *values {
                let mut m = orig.to_vec();
                put64(&mut m, *at, v);
                out.push((format!("header {what} = {v:#x}"), m));
            }
        }
        // The feature table right after the data section: huge offsets and sizes.
        if let (Some(off), Some(size)) = (le64(orig, 40), le64(orig, 48)) {
            let table = off.saturating_add(size) as usize;
            for (i, v) in [
                (0usize, u64::MAX),
                (8, u64::MAX),
                (8, 0),
                (16, 1 << 40),
                (24, u64::MAX - 8),
            ] {
                if table + i + 8 <= len {
                    let mut m = orig.to_vec();
                    put64(&mut m, table + i, v);
                    out.push((
                        format!("feature table word at {:#x} = {v:#x}", table + i),
                        m,
                    ));
                }
            }
        }
    }
    out
}

/// Panics seen in any thread since the last drain (the copy thread's panic becomes an
/// `Err` inside the library, so `catch_unwind` alone would miss it).
static PANICS: Mutex<Vec<String>> = Mutex::new(Vec::new());

type PanicHook = std::sync::Arc<dyn Fn(&std::panic::PanicHookInfo<'_>) + Send + Sync>;

/// Records panics of this test and of the threads it starts; panics of the other
/// tests of the binary (their threads are named after them) go to the default hook.
fn install_panic_hook(default: PanicHook) {
    std::panic::set_hook(Box::new(move |info| {
        let name = std::thread::current().name().map(str::to_string);
        if name
            .as_deref()
            .is_some_and(|n| n.contains("::") && !n.starts_with("mutation::"))
        {
            return default(info);
        }
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "<non-string payload>".into());
        let loc = info
            .location()
            .map(|l| format!("{}:{}:{}", l.file(), l.line(), l.column()))
            .unwrap_or_default();
        let thread = std::thread::current().name().unwrap_or("?").to_string();
        let mut p = PANICS.lock().unwrap_or_else(|e| e.into_inner());
        p.push(format!("panicked at {loc} in thread '{thread}': {msg}"));
    }));
}

fn scratch_dir() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    let mut b = tempfile::Builder::new();
    b.prefix("pdinject-mutation-");
    if shm.is_dir()
        && let Ok(d) = b.tempdir_in(shm)
    {
        return d;
    }
    b.tempdir().expect("create a scratch directory")
}

#[test]
fn mutants_never_panic_and_fail_cleanly() -> crate::common::Outcome {
    let inputs = inputs();
    if inputs.is_empty() {
        return crate::common::skip(
            "neither testdata/demo/demo.data nor ../shared/testdata/quipper is present",
        );
    }
    let scale: f64 = std::env::var("PDI_MUTATION_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|s: &f64| *s > 0.0)
        .unwrap_or(1.0);
    let default_hook: PanicHook = std::panic::take_hook().into();
    install_panic_hook(default_hook.clone());

    // Watchdog: a run that takes longer than HANG aborts the process, naming the mutant.
    static STARTED_MS: AtomicU64 = AtomicU64::new(0);
    static CURRENT: Mutex<String> = Mutex::new(String::new());
    let epoch = Instant::now();
    std::thread::spawn(move || {
        loop {
            std::thread::sleep(Duration::from_millis(500));
            let s = STARTED_MS.load(Ordering::Relaxed);
            if s != 0 && epoch.elapsed().as_millis() as u64 > s + HANG.as_millis() as u64 {
                let cur = CURRENT.lock().map(|c| c.clone()).unwrap_or_default();
                eprintln!("mutation: HANG (> {HANG:?}) on {cur}");
                std::process::abort();
            }
        }
    });

    let dir = scratch_dir();
    let in_path = dir.path().join("in.data");
    let out_path = dir.path().join("out.data");
    let opts = Options {
        jobs: Some(1),
        ..Default::default()
    };
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut failures: Vec<String> = Vec::new();
    let (mut total, mut ok, mut err) = (0usize, 0usize, 0usize);
    let mut used = 0usize;
    for input in &inputs {
        if epoch.elapsed() > BUDGET {
            eprintln!(
                "mutation: time budget ({BUDGET:?}) spent after {used} of {} inputs; the rest are left out",
                inputs.len()
            );
            break;
        }
        used += 1;
        let orig = std::fs::read(input).expect("read a test input");
        let name = input
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let ms = mutants(&orig, &mut rng, scale);
        for (what, bytes) in ms {
            total += 1;
            let label = format!("{name}: {what}");
            let _ = std::fs::remove_file(&out_path);
            std::fs::write(&in_path, &bytes).expect("write a mutant");
            *CURRENT.lock().unwrap() = label.clone();
            STARTED_MS.store(epoch.elapsed().as_millis() as u64 + 1, Ordering::Relaxed);
            let r = catch_unwind(AssertUnwindSafe(|| run(&in_path, &out_path, &opts)));
            STARTED_MS.store(0, Ordering::Relaxed);
            let panics: Vec<String> = std::mem::take(&mut *PANICS.lock().unwrap());
            let mut problems: Vec<String> = panics;
            match &r {
                Err(_) => {
                    if problems.is_empty() {
                        problems.push("panicked (no message captured)".into());
                    }
                }
                Ok(Err(e)) => {
                    err += 1;
                    if out_path.exists() {
                        problems.push(format!("failed ({e}) but the output exists"));
                    }
                }
                Ok(Ok(_)) => {
                    ok += 1;
                    let reopened = pdinject::validate(&out_path);
                    if let Err(e) = reopened {
                        problems.push(format!("succeeded but its output does not open: {e}"));
                    }
                }
            }
            match std::fs::read(&in_path) {
                Ok(after) if after == bytes => {}
                Ok(_) => problems.push("the input file was modified".into()),
                Err(e) => problems.push(format!("the input file cannot be read back: {e}")),
            }
            let leftovers: Vec<String> = std::fs::read_dir(dir.path())
                .map(|rd| {
                    rd.filter_map(|e| e.ok())
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .filter(|n| n != "in.data" && n != "out.data")
                        .collect()
                })
                .unwrap_or_default();
            if !leftovers.is_empty() {
                problems.push(format!("left temp files behind: {leftovers:?}"));
                for l in leftovers {
                    let _ = std::fs::remove_file(dir.path().join(l));
                }
            }
            if !problems.is_empty() {
                failures.push(format!("{label}: {}", problems.join("; ")));
            }
        }
    }
    std::panic::set_hook(Box::new(move |info| default_hook(info)));
    eprintln!(
        "mutation: {total} mutants of {used} inputs in {:.1?}: {ok} Ok, {err} Err, {} failures",
        epoch.elapsed(),
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "{} of {total} mutants failed:\n  {}",
        failures.len(),
        failures.join("\n  ")
    );
    Ok(())
}
