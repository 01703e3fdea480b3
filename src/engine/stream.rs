//! A stream (`perf record -o -`) through the engine: many batches, each read whole
//! records at a time, resolved up to where the round rule ([`super::rounds`])
//! allows and handed to the sink (through the driver's [`Consumer`]), the rest
//! carried to the next batch; and the first pass that dates a stream saved to a file.

use super::dating::{Dating, RecordingStart};
use super::rounds::Follows;
use super::{Consumer, Context, Cuts, Ending, Engine, Host, Point};
use crate::error::{Error, Result};
use crate::format::Endian;
use crate::format::header::{PIPE_HEADER_SIZE, Section, pipe_header};
use crate::format::record::RecordHeader;
use crate::format::walk::{InMemory, frame};
use crate::input::{Backing, DataFile, WINDOW_BYTES};
use crate::report::{Report, SinkReport};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

/// Bytes of new records that make a stream batch.
pub(crate) const BATCH_BYTES: usize = 64 << 20;
/// Bytes read from a stream at a time.
const READ_BLOCK: u64 = 4 << 20;

/// A stream being read: the bytes not yet written and where they stand.
struct Pending {
    /// Bytes read and not yet written, starting at stream offset `base`.
    bytes: Vec<u8>,
    base: u64,
    /// Bytes of `bytes` already scanned.
    scanned: usize,
    /// Bytes of `bytes` that hold whole records (the rest is a record arriving).
    parsed: usize,
    /// live capture hook (issue 32): a live stream is read as it comes (what one
    /// read gives), through this buffer, so that each record is seen on arrival.
    scratch: Vec<u8>,
}

/// What a live stream's read takes at most (a pipe holds 64 KiB by default).
const LIVE_READ: usize = 1 << 20;

/// live capture hook (issue 32): what the capture of a live stream may write.
fn live_config(cx: Context<'_>) -> crate::live::LiveConfig {
    crate::live::LiveConfig {
        cache: cx.opts.cache.clone(),
        store: cx.handles.store.clone(),
        byte_budget: cx.opts.live.budget,
        ..Default::default()
    }
}

/// How a stream is read.
pub(crate) struct StreamInput<'r> {
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

/// Where a stream's batches are read from, and how (a [`StreamInput`] less its
/// dating, which its engine took).
struct Reading<'r, 'n> {
    reader: &'r mut dyn Read,
    name: &'n Path,
    e: Endian,
    /// Bytes of new records that make a batch.
    batch: usize,
    /// The stream's size, when known, for progress.
    total: Option<u64>,
}

/// Runs a stream (`perf record -o -`) through the engine into `out`, batch by batch.
/// Memory holds one batch, what the round rule carries to the next (at most two
/// batches) and the model; what it carries and keeps has a budget
/// ([`crate::limits::StreamKept`], `--stream-memory`).
pub(crate) fn process_stream(
    cx: Context<'_>,
    input: StreamInput<'_>,
    out: &mut dyn Consumer,
) -> Result<Report> {
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
    // live capture hook (issue 32): a stream read while it is recorded (not a
    // regular file) has its mappings captured as they arrive (`--live`).
    let live = (matches!(dating, Dating::Live { .. }) && cx.host == Host::Consult)
        .then(|| crate::live::LiveStream::new(cx.opts.live.choice, e, live_config(cx)))
        .flatten();
    let mut engine = Engine::for_stream(cx, &name, e, dating);
    // --convert-callchain: each batch is converted by its resolve into memory, and
    // taken by the sink before the next.
    if cx.opts.callchains == crate::options::Callchains::Converted {
        engine.convert_into(Arc::new(crate::convert::Spill::in_memory()));
    }
    let reads_live = live.is_some();
    engine.set_live(live);
    let stop = Arc::new(AtomicBool::new(false));
    out.start_stream(&head, e, &stop)?;
    let mut s = Pending {
        bytes: Vec::new(),
        base: PIPE_HEADER_SIZE,
        scanned: 0,
        parsed: 0,
        scratch: if reads_live {
            vec![0; LIVE_READ]
        } else {
            Vec::new()
        },
    };
    let read = Reading {
        reader,
        name: &name,
        e,
        batch,
        total,
    };
    let r = engine.stream_batches(read, &mut s, out, &stop);
    engine.conclude(r, out, &stop)
}

impl Engine<'_> {
    /// The batches of a stream, read from `read` into `s` until its end, each
    /// handed to `out`, then the end.
    fn stream_batches(
        &mut self,
        read: Reading<'_, '_>,
        s: &mut Pending,
        out: &mut dyn Consumer,
        stop: &AtomicBool,
    ) -> Result<SinkReport> {
        let Reading {
            reader,
            name,
            e,
            batch,
            total,
        } = read;
        let mut cuts = Cuts::new(0, Point::new(PIPE_HEADER_SIZE, 0));
        loop {
            let eof = fill(s, reader, batch, e, name, self.live_mut())?;
            let from = s.base + s.scanned as u64;
            let end = s.base + s.parsed as u64;
            let mem = InMemory {
                bytes: &s.bytes,
                base: s.base,
            };
            self.scan(&mem, from..end, u64::MAX, &mut cuts, stop, &|_| {})?;
            s.scanned = s.parsed;
            if eof {
                // The end of the stream ends every record: all of it is safe.
                cuts.rounds
                    .clean(Point::new(end, self.next_seq()), Follows::Record);
            }
            self.flush(s, &mut cuts, out, eof, batch, total)?;
            if eof {
                return out.finish(self);
            }
        }
    }

    /// Resolves what the round rule allows, identifies the DSOs hit for the first time,
    /// and hands `out` the final bytes with those decisions; keeps the rest.
    fn flush(
        &mut self,
        s: &mut Pending,
        cuts: &mut Cuts,
        out: &mut dyn Consumer,
        eof: bool,
        batch: usize,
        total: Option<u64>,
    ) -> Result<()> {
        let ending = if eof {
            Ending::Ended
        } else {
            Ending::MoreToCome
        };
        let mut upto = cuts
            .rounds
            .safe_end(cuts.base(), s.bytes.len(), carry_limit(batch), ending);
        // Limits policy: records carried to the next batch count in the stream's budget
        // (`--stream-memory`) with what it keeps; past it the round rule gives way, as
        // past two batches: resolving frees them, where the rest can only grow.
        let end = s.base + s.bytes.len() as u64;
        if end.saturating_sub(upto.offset) > self.stream_room() {
            upto = upto.max(cuts.rounds.newest_clean());
        }
        self.note_carried(end.saturating_sub(upto.offset.max(s.base)));
        if upto.offset <= s.base {
            if eof && self.edits_data() {
                // The stream ended on a batch already written: its end still decides
                // (--jit chooses its records at the end of the input).
                self.resolve(&[], &[], ending, &AtomicBool::new(false), &|_| {})?;
            }
            if s.bytes.len() > carry_limit(batch) {
                return Err(Error::format(
                    s.base,
                    format!(
                        "compressed data runs for more than {} MB without reaching a record boundary",
                        carry_limit(batch) >> 20
                    ),
                )
                .in_file(self.name()));
            }
            return Ok(());
        }
        let chunks = cuts.take(upto);
        let n = (upto.offset - s.base) as usize;
        // The resolve workers share the batch through an Arc; it comes back after.
        let data = Arc::new(std::mem::take(&mut s.bytes));
        let files = [DataFile::new(
            self.name().to_path_buf(),
            Backing::Mem(data.clone(), s.base),
            Section {
                offset: s.base,
                size: data.len() as u64,
            },
        )];
        let new = self.resolve(&files, &chunks, ending, &AtomicBool::new(false), &|_| {});
        drop(files);
        s.bytes = Arc::try_unwrap(data).unwrap_or_else(|a| a.as_ref().clone());
        let new = new?;
        out.bytes_batch(self, &s.bytes[..n], s.base, &new)?;
        s.bytes.drain(..n);
        self.forget_mappings_before(upto.offset);
        if let Some(total) = total {
            self.opts().progress("stream", upto.offset, total);
        }
        s.base = upto.offset;
        s.scanned -= n;
        s.parsed -= n;
        Ok(())
    }
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

/// One read of what is there (at least a byte, unless at the end).
fn read_some(r: &mut dyn Read, buf: &mut [u8]) -> std::io::Result<usize> {
    loop {
        match r.read(buf) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            r => return r,
        }
    }
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
/// A live capture sees each record as soon as it is whole.
fn fill(
    s: &mut Pending,
    r: &mut dyn Read,
    batch: usize,
    e: Endian,
    name: &Path,
    mut live: Option<&mut crate::live::LiveStream>,
) -> Result<bool> {
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
            // live capture hook (issue 32): the record, as it arrives.
            if let Some(l) = live.as_deref_mut() {
                l.record(&s.bytes[s.parsed..s.parsed + fr.header.size as usize]);
            }
            s.parsed += fr.total() as usize;
        }
        if s.parsed - s.scanned >= batch {
            return Ok(false);
        }
        let got = if live.is_some() {
            // live capture hook (issue 32): what the pipe holds now, not 4 MB.
            read_some(r, &mut s.scratch).map_err(|err| Error::io(name, err))?
        } else {
            0
        };
        if got > 0 {
            s.bytes.extend_from_slice(&s.scratch[..got]);
            continue;
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

/// The start of a saved stream's recording, from a first pass over a map of the file
/// (record headers and times only): CLOCK_DATA, else its mtime minus the span of its
/// times. `first` is where the stream starts in the file (stdin may have been read).
pub(crate) fn date_saved_stream(
    cx: Context<'_>,
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
        host: Host::Closed,
        ..cx
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
    let mut cuts = Cuts::new(0, Point::new(start, 0));
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
