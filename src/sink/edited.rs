//! Outputs whose data differs from the input's: `--convert-callchain` (the records
//! as the resolve converted them into its spill) and `--jit` (the input's records
//! with the JIT's mapping records spliced in by time, its marker and the anonymous
//! maps after it dropped, compressed data written expanded), in any output form,
//! with the build-ID table (or, with the MMAP2 flags, build-ID mapping records) of
//! the run. One walk over the records writes them all ([`Editor`]):
//!
//! * a file to a file: the header and what precedes the data copied, the data
//!   written edited, the feature tail written after it
//!   ([`crate::write::write_tail_at`]); a conversion's attrs are rewritten in the
//!   finished file by the caller ([`crate::convert::rewrite_file_attrs`]), as for
//!   every file output;
//! * a file to a stream: the stream sink's header records (HEADER_ATTR rewritten),
//!   then the data edited;
//! * a stream to either: each batch edited and handed to the table or stream sink.

use super::mmap2::{Splice, mapping_note, plan, read_record};
use super::stream::StreamSink;
use super::table::{TableSink, table_plan};
use super::{Batch, Begin, Facts, Sink};
use crate::convert::{Counts, convert_attr};
use crate::error::{Error, Result};
use crate::format::Endian;
use crate::format::record::rt;
use crate::format::sample::Times;
use crate::format::walk::{InMemory, Rec, Walker, Windows, frame};
use crate::input::PerfInput;
use crate::jit::Insert;
use crate::options::{Callchains, Form};
use crate::report::SinkReport;
use crate::write::copy_prefix;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

/// Where the edited records go.
enum Inner<'w> {
    /// A file-format output of a file input, written here (and its `data.N` files
    /// into `dir`, for a directory).
    File { out: PathBuf, dir: Option<PathBuf> },
    /// A file-format output of a stream.
    Table(TableSink),
    /// A stream.
    Stream(StreamSink<'w>),
}

/// The sink of outputs whose data is edited.
pub(crate) struct EditedSink<'w> {
    inner: Inner<'w>,
    /// The table alone, or build-ID mapping records too (`--mmap2-buildids`,
    /// `--mmap2-buildid-all`).
    form: Form,
    callchains: Callchains,
    counts: Counts,
    converted_maps: u64,
    grown_maps: u64,
    /// A stream's walker, which goes on from batch to batch (compressed data is one
    /// zstd stream across them).
    walker: Option<Walker>,
    /// A stream's editor state: the JIT records of dumps whose marker was met.
    released: BinaryHeap<Reverse<(u64, usize)>>,
    /// Where a stream's bytes so far end.
    end: u64,
    /// What `--aslr` removed, by reason.
    dropped: crate::aslr::Dropped,
    report: SinkReport,
}

fn refuse(what: &str) -> Error {
    Error::unsupported(format!("--convert-callchain: {what}"))
}

impl<'w> EditedSink<'w> {
    /// A file-format output at `out` (and the `data.N` files of a directory in
    /// `dir`).
    pub(crate) fn file(out: &Path, dir: Option<&Path>, form: Form, callchains: Callchains) -> Self {
        Self::with(
            Inner::File {
                out: out.to_path_buf(),
                dir: dir.map(Path::to_path_buf),
            },
            form,
            callchains,
        )
    }

    /// A stream output through `stream`.
    pub(crate) fn stream(stream: StreamSink<'w>, form: Form, callchains: Callchains) -> Self {
        Self::with(Inner::Stream(stream), form, callchains)
    }

    fn with(inner: Inner<'w>, form: Form, callchains: Callchains) -> Self {
        EditedSink {
            inner,
            form,
            callchains,
            counts: Counts::default(),
            converted_maps: 0,
            grown_maps: 0,
            walker: None,
            released: BinaryHeap::new(),
            end: 0,
            dropped: crate::aslr::Dropped::new(),
            report: SinkReport::default(),
        }
    }

    fn converts(&self) -> bool {
        self.callchains == Callchains::Converted
    }

    fn count_maps(&mut self, sp: &[Splice]) {
        self.converted_maps += sp.len() as u64;
        self.grown_maps += sp.iter().filter(|s| s.grows() > 0).count() as u64;
    }

    /// The MMAP2 plan for a file input's records.
    fn file_splices(&mut self, input: &PerfInput, facts: &Facts<'_>) -> Vec<Splice> {
        if self.form != Form::Mmap2 {
            return Vec::new();
        }
        let mut sp = plan(facts, facts.mapping_records, true, true, &mut |f, o| {
            read_record(input, f, o)
        });
        // Records of data.N files keep their size (as the MMAP2 sink writes them).
        sp.retain(|s| s.file == 0 || s.grows() == 0);
        self.count_maps(&sp);
        sp
    }

    /// Data file `i` of a file input, edited, to `emit`; returns its new size.
    fn file_data(
        &mut self,
        input: &PerfInput,
        i: usize,
        facts: &Facts<'_>,
        replaced: &HashMap<u64, &[u8]>,
        emit: &mut dyn FnMut(&[u8]) -> Result<()>,
    ) -> Result<()> {
        let df = &input.data_files[i];
        let (from, to) = (df.range.offset, df.range.offset + df.range.size);
        let converts = self.converts();
        let mut ed = Editor::new(
            facts,
            replaced,
            input.data_files.len() == 1,
            i == 0,
            converts,
        );
        match (self.converts(), facts.stages.spill) {
            (true, Some(spill)) => {
                self.counts = spill.take((from, to), &mut |part, seq| {
                    let mem = InMemory {
                        bytes: part,
                        base: 0,
                    };
                    let mut w = Walker::new(facts.endian, seq);
                    ed.walk(&mut w, &mem, 0, part.len() as u64, emit)
                })?;
            }
            (true, None) => return Err(Error::Internal("conversion: nothing resolved".into())),
            (false, _) => {
                let mut w =
                    Walker::new(facts.endian, facts.first_seqs.get(i).copied().unwrap_or(0));
                ed.walk(&mut w, df, from, to, emit)
                    .map_err(|e| e.in_file(&df.path))?;
            }
        }
        ed.finish(emit)?;
        merge_dropped(&mut self.dropped, &ed.dropped);
        Ok(())
    }

    /// A file input into a file output.
    fn file_to_file(
        &mut self,
        input: &PerfInput,
        facts: &Facts<'_>,
        out: &Path,
        dir: Option<&Path>,
    ) -> Result<()> {
        let splices = self.file_splices(input, facts);
        let t = Instant::now();
        let plan_t = table_plan(input, facts);
        self.report.ids_new = plan_t.ids_new;
        self.report.ids_lost = plan_t.ids_lost;
        self.report.notes.extend(plan_t.note);
        let h = &input.header;
        let from = input.data_files[0].range.offset;
        copy_prefix(&input.header_path, out, from, &AtomicBool::new(false))?;
        let io = |e| Error::io(out, e);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(out)
            .map_err(io)?;
        f.seek(SeekFrom::Start(from)).map_err(io)?;
        let mut w = BufWriter::with_capacity(1 << 20, f);
        let mut size = 0u64;
        let replaced = by_seq(&splices, 0);
        self.file_data(input, 0, facts, &replaced, &mut |b: &[u8]| {
            size += b.len() as u64;
            w.write_all(b).map_err(io)
        })?;
        w.flush().map_err(io)?;
        drop(w);
        for i in 1..input.data_files.len() {
            self.data_n(input, i, facts, &splices, dir)?;
        }
        self.report.timings.insert("write-data", t.elapsed());
        let t = Instant::now();
        let shape = match facts.stages.layout {
            Some(_) => crate::write::TailShape::Edited(crate::aslr::shared_feature),
            None => crate::write::TailShape::AsInput,
        };
        crate::write::write_tail_shaped(input, out, plan_t.payload.as_deref(), from + size, shape)
            .map_err(|e| e.in_file(&input.header_path))?;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(out)
            .map_err(io)?;
        std::os::unix::fs::FileExt::write_all_at(&f, &h.endian.put_u64(size), 48).map_err(io)?;
        self.report.timings.insert("write-tail", t.elapsed());
        Ok(())
    }

    /// A directory's data file `i` (`data.N`), edited, into the output directory.
    fn data_n(
        &mut self,
        input: &PerfInput,
        i: usize,
        facts: &Facts<'_>,
        splices: &[Splice],
        dir: Option<&Path>,
    ) -> Result<()> {
        let df = &input.data_files[i];
        let (Some(dir), Some(name)) = (dir, df.path.file_name()) else {
            return Ok(());
        };
        let path = dir.join(name);
        let io = |e| Error::io(&path, e);
        let mut w = BufWriter::with_capacity(1 << 20, std::fs::File::create(&path).map_err(io)?);
        let replaced = by_seq(splices, i);
        self.file_data(input, i, facts, &replaced, &mut |b: &[u8]| {
            w.write_all(b).map_err(io)
        })?;
        w.flush().map_err(io)
    }

    /// A file input into a stream.
    fn file_to_stream(
        &mut self,
        input: &PerfInput,
        batch: &Batch<'_>,
        facts: &Facts<'_>,
    ) -> Result<()> {
        let Batch::File { new, .. } = batch else {
            return Err(Error::Internal("edited output: not a file batch".into()));
        };
        let splices = self.file_splices(input, facts);
        let e = input.header.endian;
        let converts = self.converts();
        let mut s = match std::mem::replace(
            &mut self.inner,
            Inner::File {
                out: PathBuf::new(),
                dir: None,
            },
        ) {
            Inner::Stream(s) => s,
            other => {
                self.inner = other;
                return Err(Error::Internal("edited output: no stream sink".into()));
            }
        };
        let r = (|| {
            let mut head = s.file_head(input, new, facts)?;
            if converts {
                convert_attr_records(&mut head, e)?;
            }
            if facts.stages.layout.is_some() {
                head = crate::aslr::shared_head(&head, e, &mut self.dropped)?;
            }
            s.write_raw(&head)?;
            let t = Instant::now();
            for i in 0..input.data_files.len() {
                let replaced = by_seq(&splices, i);
                self.file_data(input, i, facts, &replaced, &mut |b: &[u8]| s.write_raw(b))?;
            }
            self.report.timings.insert("write-data", t.elapsed());
            Ok(())
        })();
        self.inner = Inner::Stream(s);
        r
    }

    /// Bytes of a stream, edited, handed on.
    fn stream_bytes(
        &mut self,
        bytes: &[u8],
        offset: u64,
        batch: &Batch<'_>,
        facts: &Facts<'_>,
    ) -> Result<()> {
        let Batch::Bytes { new, .. } = batch else {
            return Err(Error::Internal("edited output: not a stream batch".into()));
        };
        let e = facts.endian;
        let end = offset + bytes.len() as u64;
        self.end = end;
        let sp = if self.form == Form::Mmap2 {
            let recs = facts.mapping_records;
            let a = recs.partition_point(|m| m.offset < offset);
            let b = recs.partition_point(|m| m.offset < end);
            plan(facts, &recs[a..b], false, true, &mut |_, o| {
                let i = usize::try_from(o - offset).ok()?;
                let fr = frame(bytes.get(i..)?, e, o).ok()??;
                bytes.get(i..i + fr.size()).map(<[u8]>::to_vec)
            })
        } else {
            Vec::new()
        };
        self.count_maps(&sp);
        let replaced = by_seq(&sp, 0);
        let mut out = Vec::new();
        let t = Instant::now();
        let mut emit = |b: &[u8]| {
            out.extend_from_slice(b);
            Ok(())
        };
        let mut ed = Editor::new(facts, &replaced, true, true, self.converts());
        ed.released = std::mem::take(&mut self.released);
        match (self.converts(), facts.stages.spill) {
            (true, Some(spill)) => {
                let counts = spill.take((offset, end), &mut |part, seq| {
                    let mem = InMemory {
                        bytes: part,
                        base: 0,
                    };
                    let mut w = Walker::new(e, seq);
                    ed.walk(&mut w, &mem, 0, part.len() as u64, &mut emit)
                })?;
                self.counts.merge(&counts);
            }
            // Nothing resolved yet (no event declared): only HEADER_ATTR records can
            // need rewriting, and there are none.
            (true, None) => emit(bytes)?,
            (false, _) => {
                let w = self.walker.get_or_insert_with(|| Walker::new(e, 0));
                let mem = InMemory {
                    bytes,
                    base: offset,
                };
                ed.walk(w, &mem, offset, end, &mut emit)?;
            }
        }
        self.released = std::mem::take(&mut ed.released);
        merge_dropped(&mut self.dropped, &ed.dropped);
        *self.report.timings.entry("write-data").or_default() += t.elapsed();
        let b = Batch::Bytes {
            bytes: &out,
            offset,
            new,
        };
        match &mut self.inner {
            Inner::Table(t) => t.batch(&b, facts),
            Inner::Stream(s) => {
                // Records moved: the stream sink finds its own.
                s.set_moved(true);
                s.batch(&b, facts)
            }
            Inner::File { .. } => Err(Error::Internal(
                "edited output: stream bytes for a file output of a file".into(),
            )),
        }
    }
}

/// Adds `more` to `into`.
fn merge_dropped(into: &mut crate::aslr::Dropped, more: &crate::aslr::Dropped) {
    for (&why, &n) in more {
        *into.entry(why).or_default() += n;
    }
}

/// The records `splices` replace in data file `file`, by record number.
fn by_seq(splices: &[Splice], file: usize) -> HashMap<u64, &[u8]> {
    splices
        .iter()
        .filter(|s| s.file == file)
        .map(|s| (s.seq, s.new.as_slice()))
        .collect()
}

/// Rewrites the attrs of the HEADER_ATTR records among `recs` (whole records).
fn convert_attr_records(recs: &mut [u8], e: Endian) -> Result<()> {
    let mut at = 0usize;
    while at < recs.len() {
        let Some(fr) = frame(&recs[at..], e, at as u64)? else {
            break;
        };
        let n = fr.total() as usize;
        if fr.header.kind == rt::HEADER_ATTR {
            let size = match e.u32(&recs[at..], 12) {
                Some(0) | None => 64,
                Some(s) => s as usize,
            };
            let end = (8 + size).min(n);
            convert_attr(&mut recs[at + 8..at + end], e);
        }
        crate::convert::convert_header_feature(&mut recs[at..at + n], e);
        at += n.max(8);
    }
    Ok(())
}

/// One walk over a data section's records, writing them edited: records replaced
/// (build-ID mapping records) or dropped (a JIT's marker and the anonymous maps
/// after it), compressed data expanded when JIT records go between its records, and
/// the JIT records spliced in: each waits for its dump's marker and goes before the
/// first record after it whose time is not earlier (perf flushes its queue at each
/// FINISHED_ROUND up to the time of the round before, so a record placed so is as
/// well ordered as the recording's own; docs/jit.md).
pub(crate) struct Editor<'a> {
    times: Times,
    replaced: &'a HashMap<u64, &'a [u8]>,
    drops: Option<&'a HashSet<u64>>,
    inserts: &'a [Insert],
    /// The inserts of each marker, by the marker's record number.
    by_marker: HashMap<u64, Vec<usize>>,
    /// Inserts whose marker was met, by time then index.
    released: BinaryHeap<Reverse<(u64, usize)>>,
    /// A directory's files have no order between them (perf sorts their records by
    /// time when it reads them, and `--threads` writes no rounds): the inserts go
    /// after the records of the header file's data.
    gated: bool,
    /// Whether this data file takes the inserts.
    takes: bool,
    expand: bool,
    /// A stream's FINISHED_ROUND records go (see [`crate::jit::Splices::at_end`]).
    drop_rounds: bool,
    /// `--aslr`: every record written moves to the layout, or goes.
    remap: Option<crate::aslr::Remapper<'a>>,
    /// What the remap removed, by reason.
    dropped: crate::aslr::Dropped,
    /// The remap's output buffer, kept from record to record.
    scratch: Vec<u8>,
}

impl<'a> Editor<'a> {
    fn new(
        facts: &Facts<'a>,
        replaced: &'a HashMap<u64, &'a [u8]>,
        gated: bool,
        takes: bool,
        converted: bool,
    ) -> Self {
        let remap = facts.stages.layout.map(|l| {
            // The records the remap sees are the conversion's, of its attrs.
            let attrs: Vec<crate::format::attr::Attr> = match converted {
                true => facts.attrs.iter().map(crate::convert::converted).collect(),
                false => facts.attrs.to_vec(),
            };
            crate::aslr::Remapper::new(l, &attrs, &[], facts.endian, facts.time_mode)
        });
        let (inserts, drops, at_end): (&[Insert], _, _) = match facts.stages.splices {
            // A stream's inserts go at its end (EditedSink::finish).
            Some(s) if s.at_end => (&[], Some(&s.drops), true),
            Some(s) => (&s.inserts, Some(&s.drops), false),
            None => (&[], None, false),
        };
        let mut by_marker: HashMap<u64, Vec<usize>> = HashMap::new();
        let mut released = BinaryHeap::new();
        for (i, x) in inserts.iter().enumerate() {
            if gated {
                by_marker.entry(x.marker).or_default().push(i);
            } else if takes {
                released.push(Reverse((x.time, i)));
            }
        }
        Editor {
            times: Times::new(facts.attrs, facts.endian),
            replaced,
            drops,
            inserts: if takes { inserts } else { &[] },
            by_marker,
            released,
            gated,
            takes,
            // Compressed data holds addresses too: the remap opens it.
            expand: !inserts.is_empty() || at_end || remap.is_some(),
            drop_rounds: at_end,
            remap,
            dropped: crate::aslr::Dropped::new(),
            scratch: Vec::new(),
        }
    }

    /// Walks `[from, to)` of `src` with `w`, writing to `emit`.
    fn walk<W: Windows + ?Sized>(
        &mut self,
        w: &mut Walker,
        src: &W,
        from: u64,
        to: u64,
        emit: &mut dyn FnMut(&[u8]) -> Result<()>,
    ) -> Result<()> {
        let window = (to - from).clamp(1, crate::limits::MAX_RESOLVE_WINDOW);
        // The bytes between a record's end and the next record are its out-of-band
        // payload (AUXTRACE): copied after it, before the next record.
        let pending = std::cell::Cell::new((0u64, 0u64));
        let last_end = std::cell::Cell::new(0u64);
        let copy = |emit: &mut dyn FnMut(&[u8]) -> Result<()>| -> Result<()> {
            let (at, len) = pending.take();
            if len > 0 {
                emit(&src.window(at, len)?)?;
            }
            Ok(())
        };
        w.walk(
            src,
            from,
            to,
            window,
            &mut |r| {
                copy(emit)?;
                if !r.inner {
                    last_end.set(r.offset + r.bytes.len() as u64);
                }
                if let Some(e) = self.remap.as_ref().map(|m| m.endian())
                    && r.header.kind == rt::HEADER_TRACING_DATA
                    && !r.inner
                {
                    // The tracing data is the record's payload, after it: read whole
                    // and written without the kernel's addresses, or not at all.
                    let end = r.offset + r.bytes.len() as u64;
                    let size = u64::from(e.u32(r.bytes, 8).unwrap_or(0));
                    let mut full = r.bytes.to_vec();
                    full.extend_from_slice(&src.window(end, size)?);
                    last_end.set(end + size);
                    let mut out = Vec::with_capacity(full.len());
                    return match crate::aslr::remap::tracing_data(&full, e, &mut out) {
                        crate::aslr::remap::Verdict::Drop(why) => {
                            *self.dropped.entry(why).or_default() += 1;
                            Ok(())
                        }
                        _ => emit(&out),
                    };
                }
                self.record(r, emit)
            },
            &mut |_, next| {
                let end = last_end.get();
                if next > end {
                    pending.set((end, next - end));
                }
                Ok(())
            },
        )?;
        copy(emit)
    }

    /// One record.
    fn record(&mut self, r: &Rec<'_>, emit: &mut dyn FnMut(&[u8]) -> Result<()>) -> Result<()> {
        let kind = r.header.kind;
        if self.drops.is_some_and(|d| d.contains(&r.seq)) {
            if let Some(list) = self.by_marker.remove(&r.seq) {
                for i in list {
                    self.released.push(Reverse((self.inserts[i].time, i)));
                }
            }
            return Ok(());
        }
        // Compressed data is written expanded (its records, not the COMPRESSED ones)
        // or as it was (the COMPRESSED records, not the records inside them).
        let compressed = matches!(kind, rt::COMPRESSED | rt::COMPRESSED2);
        if (self.expand && !r.inner && compressed) || (!self.expand && r.inner) {
            return Ok(());
        }
        if self.drop_rounds && kind == rt::FINISHED_ROUND {
            return Ok(());
        }
        if self.gated
            && !self.released.is_empty()
            && let Some(t) = self.times.of(kind, r.bytes)
        {
            while let Some(&Reverse((it, i))) = self.released.peek() {
                if it > t {
                    break;
                }
                self.released.pop();
                self.insert(i, emit)?;
            }
        }
        let replaced = self.replaced.get(&r.seq).copied();
        let Some(remap) = &self.remap else {
            return emit(replaced.unwrap_or(r.bytes));
        };
        let time = (kind == rt::SAMPLE)
            .then(|| self.times.of(kind, r.bytes))
            .flatten();
        // One buffer for every record (a fresh one each was a tenth of `--aslr`'s time).
        let mut out = std::mem::take(&mut self.scratch);
        out.clear();
        let r = match remap.record(r.bytes, r.seq, time, &mut out) {
            Err(why) => {
                *self.dropped.entry(why).or_default() += 1;
                Ok(())
            }
            // A record in build-ID form takes the remapped start and pgoff.
            Ok(()) => match replaced {
                Some(new) if out.len() >= 40 && new.len() >= 40 => {
                    let mut new = new.to_vec();
                    new[16..24].copy_from_slice(&out[16..24]);
                    new[32..40].copy_from_slice(&out[32..40]);
                    emit(&new)
                }
                _ => emit(&out),
            },
        };
        self.scratch = out;
        r
    }

    /// Insert `i` (a JIT's mapping record), moved to the layout with the code it maps.
    fn insert(&self, i: usize, emit: &mut dyn FnMut(&[u8]) -> Result<()>) -> Result<()> {
        let b = &self.inserts[i].bytes;
        let Some(remap) = &self.remap else {
            return emit(b);
        };
        let e = self.times.endian();
        let (Some(pid), Some(start)) = (e.u32(b, 8), e.u64(b, 16)) else {
            return emit(b);
        };
        let mut b = b.clone();
        let moved = remap.jit_start(pid, start, self.inserts[i].time);
        b[16..24].copy_from_slice(&e.put_u64(moved));
        emit(&b)
    }

    /// The inserts still waiting, at the end of the data.
    fn finish(&mut self, emit: &mut dyn FnMut(&[u8]) -> Result<()>) -> Result<()> {
        if !self.takes {
            return Ok(());
        }
        while let Some(Reverse((_, i))) = self.released.pop() {
            self.insert(i, emit)?;
        }
        Ok(())
    }
}

impl Sink for EditedSink<'_> {
    fn spill_dir(&self) -> Option<PathBuf> {
        if !self.converts() {
            return None;
        }
        Some(match &self.inner {
            Inner::File { out, .. } => out
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
                .unwrap_or(Path::new("."))
                .to_path_buf(),
            // A file input into a stream: the spill has no output directory to go
            // beside (a stream's own batches spill into memory).
            Inner::Stream(_) | Inner::Table(_) => std::env::temp_dir(),
        })
    }

    fn begin(&mut self, begin: &Begin<'_>, stop: &Arc<AtomicBool>) -> Result<()> {
        if let Begin::File(input) = begin {
            if self.converts() && (input.is_dir || input.data_files.len() > 1) {
                return Err(refuse(
                    "a perf record --threads directory is not converted; record without --threads",
                )
                .in_file(&input.path));
            }
            if !TableSink::can_write_table(input) {
                return Err(Error::unsupported(
                    "the input has no feature bitmap (pre-2010 header) or no records: its data cannot be rewritten",
                )
                .in_file(&input.header_path));
            }
        }
        if let (Inner::File { out, dir }, Begin::Stream { .. }) = (&self.inner, begin) {
            self.inner = Inner::Table(TableSink::new(out, dir.as_deref()));
        }
        match &mut self.inner {
            Inner::File { .. } => Ok(()),
            Inner::Table(t) => t.begin(begin, stop),
            Inner::Stream(s) => s.begin(begin, stop),
        }
    }

    fn batch(&mut self, batch: &Batch<'_>, facts: &Facts<'_>) -> Result<()> {
        if self.converts() && facts.compressed_records > 0 {
            return Err(refuse(
                "compressed records (perf record -z) are not converted; decompress the recording first (perf inject -i IN -o OUT)",
            )
            .in_file(facts.name));
        }
        match batch {
            Batch::File { input, .. } => match &self.inner {
                Inner::File { out, dir } => {
                    let (out, dir) = (out.clone(), dir.clone());
                    self.file_to_file(input, facts, &out, dir.as_deref())
                }
                Inner::Stream(_) => self.file_to_stream(input, batch, facts),
                Inner::Table(_) => Err(Error::Internal(
                    "edited output: a file batch for a stream's table".into(),
                )),
            },
            Batch::Bytes { bytes, offset, .. } => self.stream_bytes(bytes, *offset, batch, facts),
        }
    }

    fn finish(&mut self, facts: &Facts<'_>) -> Result<SinkReport> {
        // A stream's JIT records, at its end.
        if let Some(s) = facts
            .stages
            .splices
            .filter(|s| s.at_end && !s.inserts.is_empty())
        {
            let bytes: Vec<u8> = s
                .inserts
                .iter()
                .flat_map(|i| i.bytes.iter().copied())
                .collect();
            let b = Batch::Bytes {
                bytes: &bytes,
                offset: self.end,
                new: &[],
            };
            match &mut self.inner {
                Inner::Table(t) => t.batch(&b, facts)?,
                Inner::Stream(st) => {
                    st.set_moved(true);
                    st.batch(&b, facts)?
                }
                Inner::File { .. } => {}
            }
        }
        let mut r = match &mut self.inner {
            Inner::File { .. } => std::mem::take(&mut self.report),
            Inner::Table(t) => t.finish(facts)?,
            Inner::Stream(s) => s.finish(facts)?,
        };
        for (k, v) in std::mem::take(&mut self.report.timings) {
            r.timings.insert(k, v);
        }
        if self.form == Form::Mmap2 {
            r.notes
                .push(mapping_note(self.converted_maps, self.grown_maps));
        }
        if self.converts() {
            r.convert = Some(self.counts.clone());
        }
        if facts.stages.layout.is_some() {
            r.aslr = Some(self.dropped.clone());
        }
        Ok(r)
    }

    fn abort(&mut self) -> Option<Error> {
        match &mut self.inner {
            Inner::Table(t) => t.abort(),
            Inner::Stream(s) => s.abort(),
            Inner::File { .. } => None,
        }
    }
}
