//! Execution: the inputs processed, small ones side by side and large ones one at a
//! time with every thread, under one memo of DSO build IDs.

use super::dest::{Dest, conflicts, output_path, remove_stale_temps};
use super::discover::Input;
use super::fingerprint::fingerprint;
use super::marker::{marker_path, up_to_date, write_marker};
use super::result::{FileResult, Status, Summary};
use crate::engine::Handles;
use crate::error::Error;
use crate::options::Options;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

/// Options of a batch.
#[derive(Clone, Debug)]
pub struct BatchOptions {
    /// Per-file options (their `jobs` and `progress` are set by the batch).
    pub engine: Options,
    /// Where outputs go.
    pub dest: Dest,
    /// Worker threads in all (default: all cores).
    pub jobs: Option<usize>,
    /// Redo outputs that are up to date.
    pub force: bool,
    /// Inputs smaller than this run side by side, one thread each; larger ones one at
    /// a time with every thread (see docs/unwinding.md for the measurement).
    pub concurrent_below: u64,
}

/// Default [`BatchOptions::concurrent_below`]: 64 MiB.
pub const CONCURRENT_BELOW: u64 = 64 << 20;

/// The batch's view of one input's error: its message, naming the input when the
/// error does not already.
fn describe(input: &Path, e: &Error) -> String {
    let m = e.to_string();
    let name = input.display().to_string();
    if m.contains(&name) {
        m
    } else {
        format!("{name}: {m}")
    }
}

fn process(
    input: &Input,
    opts: &BatchOptions,
    fp: &str,
    pool: &rayon::ThreadPool,
    handles: &Handles,
) -> FileResult {
    let t = Instant::now();
    let output = output_path(&opts.dest, input);
    let marker = marker_path(&opts.dest, input);
    let mut res = FileResult::failed(input, &opts.dest, None);
    if let Some(p) = &input.problem {
        res.error = Some(format!("{}: {p}", input.path.display()));
        return res;
    }
    if !opts.force && up_to_date(&marker, &input.path, &output, fp) {
        res.status = Status::Skipped;
        res.skipped = Some("up to date".into());
        res.seconds = t.elapsed().as_secs_f64();
        return res;
    }
    let engine = Options {
        progress: None,
        ..opts.engine.clone()
    };
    let cx = crate::engine::Context {
        opts: &engine,
        pool,
        handles,
        host: crate::engine::Host::Consult,
    };
    let in_place = opts.dest == Dest::InPlace;
    let r = (|| {
        if let Some(d) = output.parent()
            && !d.as_os_str().is_empty()
            && !in_place
        {
            std::fs::create_dir_all(d).map_err(|e| Error::Output {
                path: output.clone(),
                source: e,
            })?;
        }
        remove_stale_temps(&output);
        // A panic in one input must not end the batch; the library is meant never to
        // panic, so this only turns a bug into that input's error line.
        let report = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            if in_place {
                crate::driver::run_in_place_in(cx, &input.path)
            } else {
                crate::driver::run_in(cx, &input.path, &output)
            }
        }))
        .map_err(|p| {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Error::unsupported(format!("internal error (panic): {what}"))
        })??;
        Ok::<_, Error>(report)
    })();
    match r {
        Ok(rep) => {
            res.status = Status::Ok;
            res.report = rep;
            // The output is right without its marker; only the next run will redo it.
            if let Err(e) = write_marker(&marker, &input.path, &output, fp) {
                res.warning = Some(format!(
                    "{}: the output is written but a rerun will redo it: cannot write its marker: {e}",
                    input.path.display()
                ));
            }
        }
        Err(e) => res.error = Some(describe(&input.path, &e)),
    }
    res.seconds = t.elapsed().as_secs_f64();
    res
}

/// Processes `inputs` (already sharded) and calls `done` once per input, from the
/// worker that finished it. Small inputs run side by side, one worker thread each (the
/// faster way on few cores: per-file stages of small recordings are too short to share
/// well); inputs of [`BatchOptions::concurrent_below`] bytes or more run one at a time
/// with every thread. One memo serves all of them.
pub fn run(inputs: &[Input], opts: &BatchOptions, done: &(dyn Fn(&FileResult) + Sync)) -> Summary {
    let t = Instant::now();
    let jobs = opts
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    let fp = fingerprint(&opts.engine);
    // One pool with every thread for large inputs; small ones run side by side, one
    // pool of one thread per worker, each kept for all the worker's inputs.
    let pool = match (Options {
        jobs: Some(jobs),
        ..Options::default()
    })
    .pool()
    {
        Ok(p) => p,
        Err(e) => return all_failed(inputs, opts, done, e, t),
    };
    // Every input's run proves through the one memo and fills the one store.
    let handles = match Handles::open(&opts.engine) {
        Ok(h) => h,
        Err(e) => return all_failed(inputs, opts, done, e, t),
    };
    let bad = conflicts(inputs, &opts.dest);
    let summary = std::sync::Mutex::new(Summary {
        inputs: inputs.len(),
        bytes: inputs.iter().map(|i| i.bytes).sum(),
        jobs,
        ..Summary::default()
    });
    let finish = |r: FileResult| {
        tally(&summary, &r);
        done(&r);
    };
    let (big, small): (Vec<usize>, Vec<usize>) = (0..inputs.len())
        .filter(|n| !bad.contains_key(n))
        .partition(|&n| inputs[n].bytes >= opts.concurrent_below);
    for (&n, why) in &bad {
        finish(FileResult::failed(
            &inputs[n],
            &opts.dest,
            Some(format!("{}: {why}", inputs[n].path.display())),
        ));
    }
    for n in big {
        finish(process(&inputs[n], opts, &fp, &pool, &handles));
    }
    let batch = Batch {
        inputs,
        opts,
        fp: &fp,
        handles: &handles,
    };
    side_by_side(&small, jobs, batch, &pool, &finish);
    let mut s = summary.into_inner().unwrap_or_default();
    s.memo = handles.memo.stats();
    s.seconds = t.elapsed().as_secs_f64();
    s
}

/// The summary of a batch whose every input failed with `e` (no pool could be
/// made, a symbol store that cannot be), each reported to `done`; `t` is when the
/// batch started.
fn all_failed(
    inputs: &[Input],
    opts: &BatchOptions,
    done: &(dyn Fn(&FileResult) + Sync),
    e: impl std::fmt::Display,
    t: Instant,
) -> Summary {
    let mut s = Summary {
        inputs: inputs.len(),
        failed: inputs.len(),
        ..Summary::default()
    };
    for i in inputs {
        done(&FileResult::failed(
            i,
            &opts.dest,
            Some(format!("{}: {e}", i.path.display())),
        ));
    }
    s.seconds = t.elapsed().as_secs_f64();
    s
}

/// Counts a finished input's result `r` into `summary`.
fn tally(summary: &std::sync::Mutex<Summary>, r: &FileResult) {
    if let Ok(mut s) = summary.lock() {
        match r.status {
            Status::Ok => s.ok += 1,
            Status::Failed => s.failed += 1,
            Status::Skipped => s.skipped += 1,
        }
        if let Some(t) = &r.report.store {
            s.store
                .get_or_insert_with(|| crate::buildid::store::StoreTotals {
                    dir: t.dir.clone(),
                    ..Default::default()
                })
                .merge(t);
        }
    }
}

/// What [`process`] reads of a batch besides an input and a pool.
struct Batch<'a> {
    inputs: &'a [Input],
    opts: &'a BatchOptions,
    fp: &'a str,
    handles: &'a Handles,
}

/// Runs the inputs numbered `small` side by side on at most `jobs` plain threads
/// taking the next input from a counter (not the pool's own workers, which would
/// steal more inputs onto their stacks while they wait). `pool` serves a worker that
/// has no pool of its own.
fn side_by_side(
    small: &[usize],
    jobs: usize,
    batch: Batch<'_>,
    pool: &rayon::ThreadPool,
    finish: &(dyn Fn(FileResult) + Sync),
) {
    let Batch {
        inputs,
        opts,
        fp,
        handles,
    } = batch;
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..jobs.min(small.len()) {
            s.spawn(|| {
                // Each worker keeps one single-thread pool for all its inputs: small
                // recordings' stages are too short to share two threads well.
                let own = Options {
                    jobs: Some(1),
                    ..Options::default()
                }
                .pool();
                let pool = own.as_ref().unwrap_or(pool);
                while let Some(&n) = small.get(next.fetch_add(1, Ordering::Relaxed)) {
                    finish(process(&inputs[n], opts, fp, pool, handles));
                }
            });
        }
    });
}
