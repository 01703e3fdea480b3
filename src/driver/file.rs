//! A file-format input through the engine: one batch that ends at its end, scanned
//! in windows of a map, resolved beside the scan once it is long enough, and
//! resolved at once at the end, while the sink copies the file beside the stages.

use super::{conclude, with_facts};
use crate::engine::dating::{Dating, RecordingStart};
use crate::engine::{Ahead, Context, Counter, Cuts, Engine, Metadata};
use crate::format::header::FEAT_BUILD_ID;
use crate::format::walk::Chunk;
use crate::input::{DataFile, PerfInput, WINDOW_BYTES};
use crate::report::Report;
use crate::resolve::Hits;
use crate::resolve::unwind::UnwindTables;
use crate::sink::{Batch, Begin, Sink};
use crate::{Error, Result};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// A data section up to this size (less what the sink maps beside the stages, see
/// [`Sink::mapped_beside`]) is scanned in one window, kept mapped for the resolve
/// (`Spread::keep`): filling the page tables of dwarf-med's 127 MB twice took a
/// quarter of an in-place run. The map is resident memory, so larger files are
/// mapped a window at a time by each stage, and resolved beside the scan from
/// [`crate::options::DEFAULT_RESOLVE_AHEAD`] on; with the model and the unwind
/// tables the peak stays under 256 MB.
pub const KEEP_BYTES: u64 = 192 << 20;

/// Runs a file-format input through the engine into `sink`: one batch.
pub fn run_file(cx: Context<'_>, input: &PerfInput, sink: &mut dyn Sink) -> Result<Report> {
    let opts = cx.opts;
    let e = input.header.endian;
    let table = input
        .header
        .has_feature(FEAT_BUILD_ID)
        .then(|| input.feature(FEAT_BUILD_ID))
        .flatten();
    let meta = Metadata::read(e, |bit| input.feature(bit), table.as_deref());
    let dating = match input.mtime_ns {
        Some(mtime_ns) => Dating::Ended { mtime_ns },
        None => Dating::Fixed(RecordingStart::Unknown(
            "the input has no modification time to date it by".into(),
        )),
    };
    let mut engine = Engine::for_file(cx, &input.header_path, e, input.attrs.clone(), meta, dating);
    let stop = Arc::new(AtomicBool::new(false));
    sink.begin(&Begin::File(input), &stop)?;
    let r = (|| {
        let total = input.data_bytes();
        let keep = KEEP_BYTES.saturating_sub(sink.mapped_beside());
        let chunks = scan_file(cx, input, &mut engine, &stop, total, keep)?;
        let counter = Counter::new(opts, "resolve", total);
        let new = engine.resolve(&input.data_files, &chunks, true, &stop, &|n| counter.add(n));
        // Unmapping a kept window is the kernel clearing a page-table entry per page
        // (1.3 ms for dwarf-med's 127 MB): done beside the sink's writes and syncs.
        let kept: Vec<_> = input
            .data_files
            .iter()
            .filter_map(DataFile::take_kept)
            .collect();
        // A thread that cannot start drops them here instead (the closure goes with it).
        let unmap = (!kept.is_empty())
            .then(|| std::thread::Builder::new().spawn(move || drop(kept)).ok())
            .flatten();
        let new = new?;
        let r = with_facts(&engine, |facts| {
            sink.batch(&Batch::File { input, new: &new }, facts)
                .and_then(|()| sink.finish(facts))
        });
        // Joined before the run ends, so a batch's next input starts with it unmapped.
        if let Some(h) = unmap {
            let _ = h.join();
        }
        r
    })();
    conclude(engine, r, sink, &stop, cx)
}

/// A batch resolved ahead of the scan: its settings, its chunks, and what resolving
/// them gave (with the unwind tables, handed from batch to batch).
struct AheadDone {
    ahead: Ahead,
    chunks: Vec<Chunk>,
    hits: Result<Hits>,
    /// The newest sample time the batch met.
    newest: Option<u64>,
    took: std::time::Duration,
    /// Handed to the next batch, then to the last resolve.
    tables: Option<UnwindTables>,
}

/// Scans a file into the engine and returns the chunks left to resolve.
///
/// The scan is one thread's work, so the pool resolves behind it (with one data file
/// and [`Options::resolve_ahead`](crate::options::Options::resolve_ahead)): each time the scan has gone that far and the
/// pool is free, the records perf's round rule says are complete (those before the
/// second-to-last FINISHED_ROUND) are resolved against the model so far, as a stream
/// would be. Once the scan has ended, [`Engine::ahead_holds`] checks the rule held
/// and the settings were the whole recording's; if not, everything is resolved again
/// at the end, so the result never depends on it.
///
/// A single data file of at most `keep_max` bytes is scanned as one window that stays
/// mapped for the resolve (see [`KEEP_BYTES`]); the caller releases it.
fn scan_file(
    cx: Context<'_>,
    input: &PerfInput,
    engine: &mut Engine<'_>,
    stop: &Arc<AtomicBool>,
    total: u64,
    keep_max: u64,
) -> Result<Vec<Chunk>> {
    let opts = cx.opts;
    let ahead_every = match (opts.resolve_ahead, input.data_files.len()) {
        (Some(n), 1) => Some(n.max(1)),
        _ => None,
    };
    let mut chunks = Vec::new();
    let mut done = 0;
    let busy = AtomicBool::new(false);
    let finished: std::sync::Mutex<Vec<AheadDone>> = std::sync::Mutex::new(Vec::new());
    let mut tables = Some(UnwindTables::default());
    let attrs = engine.attrs().to_vec();
    let e = engine.endian();
    let files = &input.data_files;
    let scanned = cx.pool.in_place_scope(|scope| -> Result<()> {
        for (fi, df) in files.iter().enumerate() {
            let (start, end) = (df.range.offset, df.range.offset + df.range.size);
            let mut cuts = Cuts::new(fi, (start, engine.next_seq()));
            // The pool maps the scan's windows only when it has nothing else to do:
            // behind a batch resolved ahead, the scan would wait for it (a file shorter
            // than the distance between batches has none).
            let size = end - start;
            let keep = files.len() == 1 && size <= keep_max;
            let spread = crate::input::Spread {
                file: df,
                pool: ahead_every.is_none_or(|n| size <= n).then_some(cx.pool),
                keep,
            };
            let window = if keep { size } else { WINDOW_BYTES };
            let mut from = start;
            let mut last_ahead = start;
            loop {
                let pause = |at: u64| {
                    ahead_every.is_some_and(|n| at - last_ahead >= n)
                        && !busy.load(Ordering::Acquire)
                };
                let paused = engine.scan_until(
                    &spread,
                    from..end,
                    window,
                    &mut cuts,
                    stop,
                    &|at| opts.progress("scan", done + at - start, total),
                    &pause,
                )?;
                let Some(at) = paused else { break };
                from = at.0;
                last_ahead = at.0;
                // The round rule, with no limit on what waits: a file holds it all.
                let upto = cuts.rounds.safe_end(cuts.base(), 0, usize::MAX, false);
                if upto.0 <= cuts.base().0 {
                    continue;
                }
                let Some(ahead) = engine.ahead() else {
                    continue;
                };
                // The previous batch is done (pause waits for it): its tables come back.
                let mut t = match tables.take() {
                    Some(t) => t,
                    None => match finished
                        .lock()
                        .ok()
                        .and_then(|mut f| f.last_mut()?.tables.take())
                    {
                        Some(t) => t,
                        None => continue,
                    },
                };
                let batch = cuts.take(upto);
                t.grow(&ahead.model);
                t.set_proof(ahead.allow_local, ahead.start.clone());
                busy.store(true, Ordering::Release);
                let (attrs, finished, busy) = (&attrs, &finished, &busy);
                scope.spawn(move |_| {
                    let t0 = std::time::Instant::now();
                    let mut resolver =
                        crate::resolve::Resolver::new(&ahead.model, attrs, ahead.time_mode, e);
                    if let Some(cfg) = ahead.unwind {
                        resolver = resolver.with_unwinding(cfg, &t);
                    }
                    let hits = resolver.run(files, &batch, &|_| {}, stop);
                    drop(resolver);
                    if let Ok(mut f) = finished.lock() {
                        f.push(AheadDone {
                            newest: hits.as_ref().ok().and_then(|h| h.max_time),
                            ahead,
                            chunks: batch,
                            hits,
                            took: t0.elapsed(),
                            tables: Some(t),
                        });
                    }
                    busy.store(false, Ordering::Release);
                });
            }
            chunks.extend(cuts.take((end, engine.next_seq())));
            done += end - start;
        }
        Ok(())
    });
    let mut finished = finished
        .into_inner()
        .map_err(|_| Error::Internal("a batch resolved ahead panicked".into()))?;
    scanned?;
    if finished.is_empty() {
        return Ok(chunks);
    }
    // The first error of a batch, in file order, is the run's (as when resolved at the end).
    let mut hits = Hits::default();
    for f in &mut finished {
        match std::mem::replace(&mut f.hits, Ok(Default::default())) {
            Ok(h) => hits.merge(h),
            Err(err) => return Err(err),
        }
    }
    let tables = finished.iter_mut().rev().find_map(|f| f.tables.take());
    let done: Vec<_> = finished.iter().map(|f| (&f.ahead, f.newest)).collect();
    let took: std::time::Duration = finished.iter().map(|f| f.took).sum();
    engine.add_time("resolve (beside the scan)", took);
    match tables {
        Some(t) if engine.ahead_holds(&done, &t) => {
            engine.add_prior(hits, t, done.len() as u64);
            Ok(chunks)
        }
        _ => {
            engine.ahead_redone();
            // Resolved again whole, with tables proven under the final settings.
            let mut all: Vec<_> = finished.into_iter().flat_map(|f| f.chunks).collect();
            all.extend(chunks);
            Ok(all)
        }
    }
}
