//! A file-format input through the engine: one batch that ends at its end, scanned
//! in windows of a map, resolved beside the scan once it is long enough, and
//! resolved at once at the end, while the sink copies the file beside the stages.

use super::dating::{Dating, RecordingStart};
use super::{Beside, Consumer, Context, Counter, Cuts, Ending, Engine, Metadata, Point};
use crate::error::Result;
use crate::format::header::FEAT_BUILD_ID;
use crate::format::walk::Chunk;
use crate::input::{DataFile, PerfInput, WINDOW_BYTES};
use crate::report::{Report, SinkReport};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

/// A data section up to this size (less what the sink maps beside the stages, see
/// [`Consumer::mapped_beside`]) is scanned in one window, kept mapped for the resolve
/// (`Spread::keep`): filling the page tables of dwarf-med's 127 MB twice took a
/// quarter of an in-place run. The map is resident memory, so larger files are
/// mapped a window at a time by each stage, and resolved beside the scan from
/// [`crate::options::DEFAULT_RESOLVE_AHEAD`] on; with the model and the unwind
/// tables the peak stays under 256 MB.
pub(crate) const KEEP_BYTES: u64 = 192 << 20;

/// Runs a file-format input through the engine into `out`: one batch.
pub(crate) fn process_file(
    cx: Context<'_>,
    input: &PerfInput,
    out: &mut dyn Consumer,
) -> Result<Report> {
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
    // --convert-callchain into a file: the resolve converts as it goes (one data file,
    // the others are refused by the sink).
    if input.data_files.len() == 1
        && let Some(dir) = out.spill_dir()
    {
        engine.convert_into(Arc::new(crate::convert::Spill::new_in(&dir)?));
    }
    let stop = Arc::new(AtomicBool::new(false));
    out.start_file(input, &stop)?;
    let r = engine.whole_file(input, out, &stop);
    engine.conclude(r, out, &stop)
}

impl Engine<'_> {
    /// The one batch of a file: scanned, resolved, and handed to `out` with the end.
    fn whole_file(
        &mut self,
        input: &PerfInput,
        out: &mut dyn Consumer,
        stop: &Arc<AtomicBool>,
    ) -> Result<SinkReport> {
        let total = input.data_bytes();
        let keep = KEEP_BYTES.saturating_sub(out.mapped_beside());
        let chunks = self.scan_file(input, stop, total, keep)?;
        let counter = Counter::new(self.cx.opts, "resolve", total);
        let new = self.resolve(&input.data_files, &chunks, Ending::Ended, stop, &|n| {
            counter.add(n)
        });
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
        let r = out
            .file_batch(self, input, &new)
            .and_then(|()| out.finish(self));
        // Joined before the run ends, so a batch's next input starts with it unmapped.
        if let Some(h) = unmap {
            let _ = h.join();
        }
        r
    }

    /// Scans a file into the engine and returns the chunks left to resolve, resolving
    /// batches beside the scan as [`Beside`] says (a file of one data file, with
    /// [`Memory::resolve_ahead`](crate::options::Memory::resolve_ahead)).
    ///
    /// A single data file of at most `keep_max` bytes is scanned as one window that stays
    /// mapped for the resolve (see [`KEEP_BYTES`]); the caller releases it.
    fn scan_file(
        &mut self,
        input: &PerfInput,
        stop: &Arc<AtomicBool>,
        total: u64,
        keep_max: u64,
    ) -> Result<Vec<Chunk>> {
        let (opts, pool) = (self.cx.opts, self.cx.pool);
        let mut chunks = Vec::new();
        let mut done = 0;
        let files = &input.data_files;
        let beside = Beside::new(self, files, opts.memory.resolve_ahead, stop);
        let scanned = pool.in_place_scope(|scope| -> Result<()> {
            for (fi, df) in files.iter().enumerate() {
                self.begin_file();
                let (start, end) = (df.range.offset, df.range.offset + df.range.size);
                let mut cuts = Cuts::new(fi, Point::new(start, self.next_seq()));
                // The pool maps the scan's windows only when it has nothing else to do:
                // behind a batch resolved ahead, the scan would wait for it (a file shorter
                // than the distance between batches has none).
                let size = end - start;
                let keep = files.len() == 1 && size <= keep_max;
                let spread = crate::input::Spread {
                    file: df,
                    pool: (!beside.in_batches(size)).then_some(pool),
                    keep,
                };
                let window = if keep { size } else { WINDOW_BYTES };
                let mut from = start;
                loop {
                    let last = from;
                    let paused = self.scan_until(
                        &spread,
                        from..end,
                        window,
                        &mut cuts,
                        stop,
                        &|at| opts.progress("scan", done + at - start, total),
                        &|at| beside.due(at, last),
                    )?;
                    let Some(at) = paused else { break };
                    from = at.offset;
                    beside.spawn(scope, self, &mut cuts);
                }
                chunks.extend(cuts.take(Point::new(end, self.next_seq())));
                done += end - start;
            }
            Ok(())
        });
        beside.conclude(self, scanned, chunks)
    }
}
