//! `--convert-callchain` output ([`crate::convert`]): the records as the resolve
//! converted them into its spill, in any output form, with the build-ID table (or,
//! with the MMAP2 flags, build-ID mapping records) of the run.
//!
//! * a file to a file: the header and what precedes the data copied, the spill
//!   written as the data (it shrinks), the feature tail written after it
//!   ([`crate::write::write_tail_at`]); the attrs are rewritten in the finished
//!   file by the caller ([`crate::convert::convert_file_attrs`]), as for every
//!   file output;
//! * a file to a stream: the stream sink's header records (HEADER_ATTR rewritten),
//!   then the spill;
//! * a stream to either: each batch's spill handed to the table or stream sink.
//!
//! Records that the MMAP2 forms rewrite ([`crate::sink::mmap2::plan`] decides
//! which) are laid over the spill as it is written, so one pass writes both.

use super::mmap2::{Splice, mapping_note, plan, read_record};
use super::stream::StreamSink;
use super::table::{TableSink, table_plan};
use super::{Batch, Begin, Facts, Sink};
use crate::convert::{Counts, Spill, convert_attr};
use crate::format::record::rt;
use crate::format::walk::frame;
use crate::input::PerfInput;
use crate::options::Form;
use crate::report::SinkReport;
use crate::write::{copy_prefix, write_tail_at};
use crate::{Error, Result};
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

/// Where the converted records go.
enum Inner<'w> {
    /// A file-format output of a file input, written here.
    File { out: PathBuf },
    /// A file-format output of a stream.
    Table(TableSink),
    /// A stream.
    Stream(StreamSink<'w>),
}

/// The conversion sink.
pub(crate) struct ConvertSink<'w> {
    inner: Inner<'w>,
    /// The table alone, or build-ID mapping records too (`--mmap2-buildids`,
    /// `--mmap2-buildid-all`).
    form: Form,
    counts: Counts,
    converted_maps: u64,
    grown_maps: u64,
    report: SinkReport,
}

fn refuse(what: &str) -> Error {
    Error::unsupported(format!("--convert-callchain: {what}"))
}

impl<'w> ConvertSink<'w> {
    /// A file-format output at `out`.
    pub(crate) fn file(out: &Path, form: Form) -> Self {
        Self::with(
            Inner::File {
                out: out.to_path_buf(),
            },
            form,
        )
    }

    /// A stream output through `stream`.
    pub(crate) fn stream(stream: StreamSink<'w>, form: Form) -> Self {
        Self::with(Inner::Stream(stream), form)
    }

    fn with(inner: Inner<'w>, form: Form) -> Self {
        ConvertSink {
            inner,
            form,
            counts: Counts::default(),
            converted_maps: 0,
            grown_maps: 0,
            report: SinkReport::default(),
        }
    }

    fn count_maps(&mut self, sp: &[Splice]) {
        self.converted_maps += sp.len() as u64;
        self.grown_maps += sp.iter().filter(|s| s.grows() > 0).count() as u64;
    }

    /// The MMAP2 plan for a file input's records (its one data file).
    fn file_splices(&mut self, input: &PerfInput, facts: &Facts<'_>) -> Vec<Splice> {
        if self.form != Form::Mmap2 {
            return Vec::new();
        }
        let mut sp = plan(facts, facts.mapping_records, true, true, &mut |f, o| {
            read_record(input, f, o)
        });
        sp.retain(|s| s.file == 0);
        self.count_maps(&sp);
        sp
    }

    /// A file input, converted into a file output.
    fn file_to_file(&mut self, input: &PerfInput, facts: &Facts<'_>, out: &Path) -> Result<()> {
        let spill = spill_of(facts)?;
        let splices = self.file_splices(input, facts);
        let t = Instant::now();
        let plan_t = table_plan(input, facts);
        self.report.ids_new = plan_t.ids_new;
        self.report.ids_lost = plan_t.ids_lost;
        self.report.notes.extend(plan_t.note);
        let h = &input.header;
        let df = &input.data_files[0];
        let (from, to) = (df.range.offset, df.range.offset + df.range.size);
        copy_prefix(&input.header_path, out, from, &AtomicBool::new(false))?;
        let io = |e| Error::io(out, e);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(out)
            .map_err(io)?;
        f.seek(SeekFrom::Start(from)).map_err(io)?;
        let mut w = BufWriter::with_capacity(1 << 20, f);
        let mut size = 0u64;
        let mut emit = |b: &[u8]| {
            size += b.len() as u64;
            w.write_all(b).map_err(io)
        };
        self.counts = spill.emit((from, to), &replacements(&splices), &mut emit)?;
        w.flush().map_err(io)?;
        drop(w);
        self.report.timings.insert("convert", t.elapsed());
        let t = Instant::now();
        write_tail_at(input, out, plan_t.payload.as_deref(), from + size)
            .map_err(|e| e.in_file(&input.header_path))?;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(out)
            .map_err(io)?;
        std::os::unix::fs::FileExt::write_all_at(&f, &h.endian.put_u64(size), 48).map_err(io)?;
        self.report.timings.insert("write-tail", t.elapsed());
        Ok(())
    }

    /// A file input, converted into a stream.
    fn file_to_stream(
        &mut self,
        input: &PerfInput,
        batch: &Batch<'_>,
        facts: &Facts<'_>,
    ) -> Result<()> {
        let Batch::File { new, .. } = batch else {
            return Err(Error::Internal("conversion: not a file batch".into()));
        };
        let spill = spill_of(facts)?;
        let splices = self.file_splices(input, facts);
        let e = input.header.endian;
        let Inner::Stream(s) = &mut self.inner else {
            return Err(Error::Internal("conversion: no stream sink".into()));
        };
        let mut head = s.file_head(input, new, facts)?;
        convert_attr_records(&mut head, e)?;
        s.write_raw(&head)?;
        let df = &input.data_files[0];
        let range = (df.range.offset, df.range.offset + df.range.size);
        let t = Instant::now();
        self.counts = spill.emit(range, &replacements(&splices), &mut |b| s.write_raw(b))?;
        self.report.timings.insert("convert", t.elapsed());
        Ok(())
    }

    /// Bytes of a stream, as the resolve converted them, handed on.
    fn stream_bytes(
        &mut self,
        bytes: &[u8],
        offset: u64,
        batch: &Batch<'_>,
        facts: &Facts<'_>,
    ) -> Result<()> {
        let Batch::Bytes { new, .. } = batch else {
            return Err(Error::Internal("conversion: not a stream batch".into()));
        };
        let e = facts.endian;
        let end = offset + bytes.len() as u64;
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
        let mut out = Vec::new();
        let t = Instant::now();
        match facts.spill {
            Some(spill) => {
                let counts = spill.emit((offset, end), &replacements(&sp), &mut |b| {
                    out.extend_from_slice(b);
                    Ok(())
                })?;
                self.counts.merge(&counts);
            }
            // Nothing resolved yet (no event declared): only HEADER_ATTR records can
            // need rewriting, and there are none.
            None => out.extend_from_slice(bytes),
        }
        *self.report.timings.entry("convert").or_default() += t.elapsed();
        let b = Batch::Bytes {
            bytes: &out,
            offset,
            new,
        };
        match &mut self.inner {
            Inner::Table(t) => t.batch(&b, facts),
            Inner::Stream(s) => {
                // Samples shrank: the records the scan marked moved.
                s.set_moved(true);
                s.batch(&b, facts)
            }
            Inner::File { .. } => Err(Error::Internal(
                "conversion: stream bytes for a file output of a file".into(),
            )),
        }
    }
}

/// The spill the resolve converted into.
fn spill_of<'f>(facts: &Facts<'f>) -> Result<&'f Spill> {
    facts
        .spill
        .ok_or_else(|| Error::Internal("conversion: nothing resolved".into()))
}

/// The records `splices` replace (one data file), as the spill lays them over.
fn replacements(splices: &[Splice]) -> Vec<crate::convert::spill::Replaced<'_>> {
    splices
        .iter()
        .map(|s| (s.offset, s.old_len, s.new.as_slice()))
        .collect()
}

/// Rewrites the attrs of the HEADER_ATTR records among `recs` (whole records).
fn convert_attr_records(recs: &mut [u8], e: crate::format::Endian) -> Result<()> {
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

impl Sink for ConvertSink<'_> {
    fn spill_dir(&self) -> Option<PathBuf> {
        Some(match &self.inner {
            Inner::File { out } => out
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
            if input.is_dir || input.data_files.len() > 1 {
                return Err(refuse(
                    "a perf record --threads directory is not converted; record without --threads",
                )
                .in_file(&input.path));
            }
            if !TableSink::can_write_table(input) {
                return Err(refuse(
                    "the input has no feature bitmap (pre-2010 header) or no records",
                )
                .in_file(&input.header_path));
            }
        }
        if let (Inner::File { out }, Begin::Stream { .. }) = (&self.inner, begin) {
            self.inner = Inner::Table(TableSink::new(out, None));
        }
        match &mut self.inner {
            Inner::File { .. } => Ok(()),
            Inner::Table(t) => t.begin(begin, stop),
            Inner::Stream(s) => s.begin(begin, stop),
        }
    }

    fn batch(&mut self, batch: &Batch<'_>, facts: &Facts<'_>) -> Result<()> {
        if facts.compressed_records > 0 {
            return Err(refuse(
                "compressed records (perf record -z) are not converted; decompress the recording first (perf inject -i IN -o OUT)",
            )
            .in_file(facts.name));
        }
        match batch {
            Batch::File { input, .. } => match &self.inner {
                Inner::File { out } => {
                    let out = out.clone();
                    self.file_to_file(input, facts, &out)
                }
                Inner::Stream(_) => self.file_to_stream(input, batch, facts),
                Inner::Table(_) => Err(Error::Internal(
                    "conversion: a file batch for a stream's table".into(),
                )),
            },
            Batch::Bytes { bytes, offset, .. } => self.stream_bytes(bytes, *offset, batch, facts),
        }
    }

    fn finish(&mut self, facts: &Facts<'_>) -> Result<SinkReport> {
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
        r.convert = Some(self.counts.clone());
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
