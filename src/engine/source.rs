//! How batches reach the engine: a file-format input is one batch that ends at its
//! end (scanned in windows of a map, then resolved at once, while the sink copies
//! beside), a stream is many (whole records read into a batch, resolved up to where
//! the round rule allows, the rest carried to the next batch).

use super::dating::{Dating, RecordingStart};
use super::{Context, Counter, Cuts, Engine, Host, Metadata};
use crate::format::Endian;
use crate::format::header::{FEAT_BUILD_ID, PIPE_HEADER_SIZE, Section, pipe_header};
use crate::format::record::{RecordHeader, rt};
use crate::format::walk::{Chunk, Windows, frame};
use crate::input::{Backing, DataFile, PerfInput};
use crate::options::Options;
use crate::report::Report;
use crate::resolve::Hits;
use crate::resolve::unwind::UnwindTables;
use crate::sink::{Batch, Begin, Sink};
use crate::{Error, Result};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Window of a data file mapped at once by the scan.
pub const WINDOW_BYTES: u64 = 64 << 20;
/// A data section up to this size (less what the sink maps beside the stages, see
/// [`Sink::mapped_beside`]) is scanned in one window, kept mapped for the resolve
/// (`Spread::keep`): filling the page tables of dwarf-med's 127 MB twice took a
/// quarter of an in-place run. The map is resident memory, so larger files are
/// mapped a window at a time by each stage, and resolved beside the scan from
/// [`crate::options::DEFAULT_RESOLVE_AHEAD`] on; with the model and the unwind
/// tables the peak stays under 256 MB.
pub const KEEP_BYTES: u64 = 192 << 20;
/// Bytes of new records that make a stream batch.
pub const BATCH_BYTES: usize = 64 << 20;
/// Bytes read from a stream at a time.
const READ_BLOCK: u64 = 4 << 20;

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
        let r = sink
            .batch(&Batch::File { input, new: &new }, &engine)
            .and_then(|()| sink.finish(&engine));
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
    ahead: super::Ahead,
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
/// and [`Options::resolve_ahead`]): each time the scan has gone that far and the
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
    let mut tables = Some(UnwindTables::new(opts.memo.clone()));
    let attrs = engine.attrs().to_vec();
    let e = engine.endian();
    let files = &input.data_files;
    let scanned = cx.pool.in_place_scope(|scope| -> Result<()> {
        for (fi, df) in files.iter().enumerate() {
            let (start, end) = (df.range.offset, df.range.offset + df.range.size);
            let mut cuts = Cuts::new(fi, (start, engine.walker.seq));
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
            chunks.extend(cuts.take((end, engine.walker.seq)));
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

/// The report of a run whose batches ended in `r`. On an error, work beside the
/// stages is stopped; when it failed first (a full disk), its error explains why the
/// stages stopped.
fn conclude(
    engine: Engine<'_>,
    r: Result<crate::sink::SinkReport>,
    sink: &mut dyn Sink,
    stop: &AtomicBool,
    cx: Context<'_>,
) -> Result<Report> {
    match r {
        Ok(sr) => Ok(engine.finish(sr, cx.pool.current_num_threads())),
        Err(err) => {
            stop.store(true, Ordering::Relaxed);
            match (sink.abort(), err) {
                (Some(first), Error::Stopped) => Err(first),
                (_, err) => Err(err),
            }
        }
    }
}

/// A stream's bytes in memory, from stream offset `base`.
struct Mem<'b> {
    bytes: &'b [u8],
    base: u64,
}

impl<'b> Windows for Mem<'b> {
    type Window = &'b [u8];
    fn window(&self, offset: u64, len: u64) -> Result<&'b [u8]> {
        offset
            .checked_sub(self.base)
            .and_then(|a| usize::try_from(a).ok())
            .and_then(|a| {
                self.bytes
                    .get(a..a.checked_add(usize::try_from(len).ok()?)?)
            })
            .ok_or_else(|| Error::format(offset, "window outside the batch"))
    }
}

/// A stream being read: the bytes not yet written and where they stand.
struct Pending {
    /// Bytes read and not yet written, starting at stream offset `base`.
    bytes: Vec<u8>,
    base: u64,
    /// Bytes of `bytes` already scanned.
    scanned: usize,
    /// Bytes of `bytes` that hold whole records (the rest is a record arriving).
    parsed: usize,
}

/// How a stream is read.
pub struct StreamInput<'r> {
    /// The input's name in messages.
    pub name: PathBuf,
    /// Its bytes.
    pub reader: &'r mut dyn Read,
    /// Its size, when known (a regular file), for progress.
    pub total: Option<u64>,
    /// When it was recorded.
    pub dating: Dating,
    /// Bytes of new records that make a batch.
    pub batch: usize,
}

/// Runs a stream (`perf record -o -`) through the engine into `sink`, batch by batch.
/// Memory holds one batch, what the round rule carries to the next (at most two
/// batches) and the model; what it carries and keeps has a budget
/// ([`crate::limits::StreamKept`], `--stream-memory`).
pub fn run_stream(cx: Context<'_>, input: StreamInput<'_>, sink: &mut dyn Sink) -> Result<Report> {
    let StreamInput {
        name,
        reader,
        total,
        dating,
        batch,
    } = input;
    let batch = batch.max(1);
    let mut head = [0u8; PIPE_HEADER_SIZE as usize];
    let got = read_full(reader, &mut head).map_err(|e| Error::io(&name, e))?;
    let e = header_endian(&head[..got], &name)?;
    let mut engine = Engine::for_stream(cx, &name, e, dating);
    let stop = Arc::new(AtomicBool::new(false));
    sink.begin(
        &Begin::Stream {
            header: &head,
            endian: e,
        },
        &stop,
    )?;
    let mut s = Pending {
        bytes: Vec::new(),
        base: PIPE_HEADER_SIZE,
        scanned: 0,
        parsed: 0,
    };
    let mut cuts = Cuts::new(0, (PIPE_HEADER_SIZE, 0));
    let r = (|| {
        loop {
            let eof = fill(&mut s, reader, batch, e, &name)?;
            let from = s.base + s.scanned as u64;
            let end = s.base + s.parsed as u64;
            let mem = Mem {
                bytes: &s.bytes,
                base: s.base,
            };
            engine.scan(&mem, from..end, u64::MAX, &mut cuts, &stop, &|_| {})?;
            s.scanned = s.parsed;
            if eof {
                // The end of the stream ends every record: all of it is safe.
                cuts.rounds.clean((end, engine.walker.seq), false);
            }
            flush(&mut engine, &mut s, &mut cuts, sink, eof, batch, total)?;
            if eof {
                return sink.finish(&engine);
            }
        }
    })();
    conclude(engine, r, sink, &stop, cx)
}

/// The byte order a pipe header announces, or the error that names the input.
fn header_endian(head: &[u8], name: &Path) -> Result<Endian> {
    pipe_header(head).ok_or_else(|| {
        Error::format(
            0,
            "not a pipe-format perf.data (perf record -o -); give a file-format perf.data by path",
        )
        .in_file(name)
    })
}

fn read_full(r: &mut dyn Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Most bytes a stream may hold unwritten: what waits for the next round, or a
/// compressed frame that has not ended. Beyond it the round rule gives way (the
/// batch is resolved up to its last clean point) or, with no clean point at all,
/// the stream is refused.
fn carry_limit(batch: usize) -> usize {
    // Never less than a few of the largest records (64 KiB) plus their payloads.
    (2 * batch).max(1 << 20)
}

/// Reads until a batch of whole records is ready; true at the end of the stream.
fn fill(s: &mut Pending, r: &mut dyn Read, batch: usize, e: Endian, name: &Path) -> Result<bool> {
    loop {
        // Frame the whole records read so far.
        loop {
            let at = s.base + s.parsed as u64;
            let Some(fr) = frame(&s.bytes[s.parsed..], e, at).map_err(|err| err.in_file(name))?
            else {
                break;
            };
            // A record is held whole until written: one larger than a stream may
            // hold is refused rather than read into memory.
            if fr.total() > carry_limit(batch) as u64 {
                return Err(Error::format(
                    at,
                    format!(
                        "record of type {} takes {} bytes, more than pipe mode holds ({} bytes); save the stream and give it by path",
                        fr.header.kind,
                        fr.total(),
                        carry_limit(batch)
                    ),
                )
                .in_file(name));
            }
            if ((s.bytes.len() - s.parsed) as u64) < fr.total() {
                break;
            }
            s.parsed += fr.total() as usize;
        }
        if s.parsed - s.scanned >= batch {
            return Ok(false);
        }
        // Straight into the batch's spare capacity: no intermediate buffer, no zeroing.
        s.bytes.reserve_exact(READ_BLOCK as usize);
        let got = (&mut *r)
            .take(READ_BLOCK)
            .read_to_end(&mut s.bytes)
            .map_err(|err| Error::io(name, err))?;
        if got == 0 {
            if s.parsed < s.bytes.len() {
                let at = s.base + s.parsed as u64;
                let what = match RecordHeader::parse(&s.bytes[s.parsed..], e) {
                    Some(h) => format!(
                        "the stream ends inside a record of type {} and size {}",
                        h.kind, h.size
                    ),
                    None => "the stream ends inside a record header".into(),
                };
                return Err(Error::format(at, what).in_file(name));
            }
            return Ok(true);
        }
    }
}

/// Resolves what the round rule allows, identifies the DSOs hit for the first time,
/// and hands the sink the final bytes with those decisions; keeps the rest.
fn flush(
    engine: &mut Engine<'_>,
    s: &mut Pending,
    cuts: &mut Cuts,
    sink: &mut dyn Sink,
    eof: bool,
    batch: usize,
    total: Option<u64>,
) -> Result<()> {
    let mut upto = cuts
        .rounds
        .safe_end(cuts.base(), s.bytes.len(), carry_limit(batch), eof);
    // Limits policy: records carried to the next batch count in the stream's budget
    // (`--stream-memory`) with what it keeps; past it the round rule gives way, as
    // past two batches: resolving frees them, where the rest can only grow.
    let end = s.base + s.bytes.len() as u64;
    if end.saturating_sub(upto.0) > engine.stream_room() {
        upto = upto.max(cuts.rounds.newest_clean());
    }
    engine.note_carried(end.saturating_sub(upto.0.max(s.base)));
    if upto.0 <= s.base {
        if s.bytes.len() > carry_limit(batch) {
            return Err(Error::format(
                s.base,
                format!(
                    "compressed data runs for more than {} MB without reaching a record boundary",
                    carry_limit(batch) >> 20
                ),
            )
            .in_file(&engine.name));
        }
        return Ok(());
    }
    let chunks = cuts.take(upto);
    let n = (upto.0 - s.base) as usize;
    // The resolve workers share the batch through an Arc; it comes back after.
    let data = Arc::new(std::mem::take(&mut s.bytes));
    let files = [DataFile::new(
        engine.name.clone(),
        Backing::Mem(data.clone(), s.base),
        Section {
            offset: s.base,
            size: data.len() as u64,
        },
    )];
    let new = engine.resolve(&files, &chunks, eof, &AtomicBool::new(false), &|_| {});
    drop(files);
    s.bytes = Arc::try_unwrap(data).unwrap_or_else(|a| a.as_ref().clone());
    let new = new?;
    sink.batch(
        &Batch::Bytes {
            bytes: &s.bytes[..n],
            offset: s.base,
            new: &new,
        },
        engine,
    )?;
    s.bytes.drain(..n);
    engine.forget_mappings_before(upto.0);
    if let Some(total) = total {
        engine.opts.progress("stream", upto.0, total);
    }
    s.base = upto.0;
    s.scanned -= n;
    s.parsed -= n;
    Ok(())
}

/// The start of a saved stream's recording, from a first pass over a map of the file
/// (record headers and times only): CLOCK_DATA, else its mtime minus the span of its
/// times. `first` is where the stream starts in the file (stdin may have been read).
pub fn date_saved_stream(
    opts: &Options,
    pool: &rayon::ThreadPool,
    name: &Path,
    file: &std::fs::File,
    first: u64,
) -> Result<RecordingStart> {
    use std::os::unix::fs::MetadataExt;
    let meta = file.metadata().map_err(|e| Error::io(name, e))?;
    let mtime_ns = meta.mtime() as i128 * 1_000_000_000 + meta.mtime_nsec() as i128;
    let mut head = [0u8; PIPE_HEADER_SIZE as usize];
    std::os::unix::fs::FileExt::read_exact_at(file, &mut head, first).map_err(|_| {
        Error::format(first, "not a pipe-format perf.data (too short)").in_file(name)
    })?;
    let e = header_endian(&head, name)?;
    let cx = Context {
        opts,
        pool,
        host: Host::Closed,
    };
    let mut engine = Engine::for_stream(cx, name, e, Dating::Ended { mtime_ns });
    let start = first + PIPE_HEADER_SIZE;
    let len = meta.len().max(start);
    let df = DataFile::new(
        name.to_path_buf(),
        Backing::File(file.try_clone().map_err(|e| Error::io(name, e))?),
        Section {
            offset: start,
            size: len - start,
        },
    );
    let mut cuts = Cuts::new(0, (start, 0));
    engine.scan(
        &df,
        start..len,
        WINDOW_BYTES,
        &mut cuts,
        &AtomicBool::new(false),
        &|_| {},
    )?;
    Ok(engine.start())
}

/// Whether `head` (the first bytes of an input) is a pipe-format header.
pub fn is_stream_header(head: &[u8]) -> bool {
    pipe_header(head).is_some()
}

/// The record types a stream carries that a file keeps in its header instead.
pub fn is_header_record(kind: u32) -> bool {
    matches!(
        kind,
        rt::HEADER_ATTR
            | rt::HEADER_EVENT_TYPE
            | rt::HEADER_TRACING_DATA
            | rt::HEADER_BUILD_ID
            | rt::HEADER_FEATURE
    )
}
