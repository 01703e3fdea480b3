//! File-format output: a perf.data with the BUILD_ID table.
//!
//! From a file-format input, everything before the end of the data section is copied
//! verbatim beside the stages (kernel side: direct I/O, copy_file_range) and the
//! feature tail is rebuilt with BUILD_ID merged in ([`crate::write::write_tail`]).
//! From a stream, the records become the data section as they are resolved; the
//! records a file keeps in its header instead (HEADER_ATTR, HEADER_FEATURE,
//! HEADER_TRACING_DATA, HEADER_BUILD_ID) become the attrs section and the features,
//! the stream's build-ID records entries of the table.

use super::{Batch, Begin, Facts, Sink, SinkReport};
use crate::engine::Decision;
use crate::error::{Error, Result};
use crate::format::Endian;
use crate::format::buildid::{encode_table_entry, retain_entries};
use crate::format::header::{FEAT_BUILD_ID, FILE_HEADER_SIZE};
use crate::format::record::rt;
use crate::format::walk::frame;
use crate::input::PerfInput;
use crate::write::{copy_prefix, write_tail};
use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// `sizeof(struct perf_event_attr)` in perf 6.1 (PERF_ATTR_SIZE_VER8).
const PERF_ATTR_SIZE_6_1: usize = 128;

/// Feature bit of TRACING_DATA (tracepoint formats).
const FEAT_TRACING_DATA: u32 = 1;

/// Writes a file-format perf.data at `out` (the header file; data.N files of a
/// directory input go into `dir`).
pub(crate) struct TableSink {
    out: PathBuf,
    dir: Option<PathBuf>,
    state: State,
    report: SinkReport,
}

enum State {
    Idle,
    /// A file input: the copy runs beside the stages.
    Copy {
        copier: Option<JoinHandle<Result<Duration>>>,
        stop: Arc<AtomicBool>,
    },
    /// A stream input: its records are the data section.
    Stream(Box<FromStream>),
}

struct FromStream {
    w: BufWriter<File>,
    e: Endian,
    data_size: u64,
    /// TRACING_DATA payloads of the stream.
    tracing: Vec<u8>,
    /// The stream's HEADER_BUILD_ID records, as table entries.
    entries: Vec<u8>,
    /// HEADER_BUILD_ID records left out of the table: perf reads a table entry's name
    /// into a PATH_MAX buffer unchecked (perf 6.1 aborts, "stack smashing detected"),
    /// while a stream's record is read whole.
    too_long: u64,
}

impl TableSink {
    /// A sink writing the header file `out` (and a directory input's data.N files
    /// into `dir`).
    pub(crate) fn new(out: &Path, dir: Option<&Path>) -> Self {
        TableSink {
            out: out.to_path_buf(),
            dir: dir.map(Path::to_path_buf),
            state: State::Idle,
            report: SinkReport::default(),
        }
    }

    fn io(&self, e: std::io::Error) -> Error {
        Error::io(&self.out, e)
    }

    /// A table entry can be added: a feature bitmap (104-byte header) and a non-empty
    /// data section (perf reads a data size of 0 as "to the end of the file", which
    /// would swallow a feature table written after it).
    pub(crate) fn can_write_table(input: &PerfInput) -> bool {
        input.header.header_size == FILE_HEADER_SIZE && input.header.data.size > 0
    }

    fn finish_copy(&mut self, input: &PerfInput, facts: &Facts<'_>) -> Result<()> {
        let State::Copy { copier, .. } = &mut self.state else {
            return Err(Error::Internal("table sink: no copy under way".into()));
        };
        let t_copy = copier
            .take()
            .ok_or_else(|| Error::Internal("table sink: copy joined twice".into()))?
            .join()
            .map_err(|_| Error::Internal("the copy thread panicked".into()))??;
        self.report.timings.insert("copy", t_copy);
        let plan = table_plan(input, facts);
        self.report.ids_new = plan.ids_new;
        self.report.ids_lost = plan.ids_lost;
        self.report.notes.extend(plan.note);
        if !plan.write {
            return Ok(());
        }
        let payload = plan.payload;
        let t = Instant::now();
        write_tail(input, &self.out, payload.as_deref())
            .map_err(|e| e.in_file(&input.header_path))?;
        self.report.timings.insert("write-tail", t.elapsed());
        Ok(())
    }
}

/// What the BUILD_ID section of a file-format output of a file input becomes (shared
/// by every sink that writes one: [`TableSink`], the MMAP2 sink, in-place runs).
pub(crate) struct TablePlan {
    /// A feature tail can be written at all (see [`TableSink::can_write_table`]).
    pub write: bool,
    /// The new BUILD_ID payload: the input's entries verbatim, then the new ones;
    /// `None` when the section does not change.
    pub payload: Option<Vec<u8>>,
    /// Entries pdinject adds.
    pub ids_new: usize,
    /// IDs decided that no table can hold.
    pub ids_lost: usize,
    /// What the user should know.
    pub note: Option<String>,
}

/// The BUILD_ID section for `input` after the engine's decisions.
pub(crate) fn table_plan(input: &PerfInput, facts: &Facts<'_>) -> TablePlan {
    table_plan_where(input, facts, &|_, _| true)
}

/// [`table_plan`] with new entries only for the decisions `keep` takes (by their
/// index in [`Engine::decisions`]); the input's entries stay whatever `keep` says.
pub(crate) fn table_plan_where(
    input: &PerfInput,
    facts: &Facts<'_>,
    keep: &dyn Fn(usize, &Decision) -> bool,
) -> TablePlan {
    let mut entries = Vec::new();
    let mut added = 0;
    for (i, d) in facts.decisions().enumerate() {
        if let Some(id) = d.id_for_table().filter(|_| keep(i, d)) {
            encode_table_entry(
                &mut entries,
                input.header.endian,
                d.cpumode(),
                &id,
                d.group.name.as_bytes(),
            );
            added += usize::from(!d.came_from_input());
        }
    }
    let old = input
        .header
        .has_feature(FEAT_BUILD_ID)
        .then(|| input.feature(FEAT_BUILD_ID))
        .flatten();
    let table = old
        .as_deref()
        .map(|p| crate::format::buildid::parse_build_id_table(p, input.header.endian));
    let legacy = table.as_ref().is_some_and(|t| t.legacy);
    let damaged = table.as_ref().filter(|t| t.malformed).map(|t| t.valid_len);
    // The input's entries whose claim is contradicted are not passed on.
    let passes = |t: &crate::format::buildid::TableEntry| facts.passes_on(t);
    let dropped = match (&old, legacy) {
        (Some(p), false) => retain_entries(p, input.header.endian, &passes).1,
        _ => 0,
    };
    let mut note = None;
    if !TableSink::can_write_table(input) {
        if added > 0 {
            note = Some(
                    "the input has no feature bitmap (pre-2010 header) or no records: no build-ID table can be added"
                        .into(),
                );
        }
        return TablePlan {
            write: false,
            payload: None,
            ids_new: 0,
            ids_lost: added,
            note,
        };
    }
    // The BUILD_ID section is rewritten only when it changes or did not exist.
    let payload = if legacy || (entries.is_empty() && old.is_some() && dropped == 0) {
        if damaged.is_some() {
            note = Some(
                "the input's build-ID table ends in a damaged entry; it is copied as it is".into(),
            );
        }
        None
    } else {
        let mut p = old.unwrap_or_default();
        // perf reads on from a damaged entry's size and would never see entries
        // appended after it: the damaged tail is dropped.
        if let Some(valid) = damaged.filter(|&v| p.len() > v) {
            note = Some(format!(
                "the damaged last {} bytes of the input's build-ID table were dropped so that perf reads the new entries",
                p.len() - valid
            ));
            p.truncate(valid);
        }
        if dropped > 0 {
            p = retain_entries(&p, input.header.endian, &passes).0;
            let why = dropped_note(dropped);
            note = Some(match note {
                Some(n) => format!("{n}; {why}"),
                None => why,
            });
        }
        p.extend_from_slice(&entries);
        Some(p)
    };
    let ids_new = if payload.is_some() { added } else { 0 };
    TablePlan {
        write: true,
        payload,
        ids_new,
        ids_lost: 0,
        note,
    }
}

/// What the summary says about the input's entries left out.
pub(crate) fn dropped_note(n: usize) -> String {
    format!(
        "{n} build-ID entr{} of the input left out: the input claims the ID for another file too, or this boot's notes contradict it (see conflicting-claim/corrected)",
        if n == 1 { "y" } else { "ies" }
    )
}

impl Sink for TableSink {
    fn mapped_beside(&self) -> u64 {
        match self.state {
            State::Copy { .. } => crate::write::COPY_STEP,
            _ => 0,
        }
    }

    fn begin(&mut self, begin: &Begin<'_>, stop: &Arc<AtomicBool>) -> Result<()> {
        match begin {
            Begin::File(input) => {
                let copy_len = if Self::can_write_table(input) {
                    input.header.feature_table_offset()
                } else {
                    input.file_len
                };
                let src = input.header_path.clone();
                let out = self.out.clone();
                let parts: Vec<(PathBuf, PathBuf, u64)> = input
                    .data_files
                    .iter()
                    .skip(1)
                    .filter_map(|df| {
                        let dir = self.dir.as_ref()?;
                        Some((
                            df.path.clone(),
                            dir.join(df.path.file_name()?),
                            df.range.size,
                        ))
                    })
                    .collect();
                let flag = stop.clone();
                let copier = std::thread::spawn(move || {
                    let t = Instant::now();
                    let r = copy_prefix(&src, &out, copy_len, &flag).and_then(|()| {
                        parts
                            .iter()
                            .try_for_each(|(s, d, n)| copy_prefix(s, d, *n, &flag))
                    });
                    if r.is_err() {
                        // Stop the stages at their next chunk: the run has failed.
                        flag.store(true, Ordering::Relaxed);
                    }
                    r.map(|()| t.elapsed())
                });
                self.state = State::Copy {
                    copier: Some(copier),
                    stop: stop.clone(),
                };
            }
            Begin::Stream { endian, .. } => {
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .truncate(true)
                    .open(&self.out)
                    .map_err(|e| self.io(e))?;
                // The header is written last, when the sections are known.
                f.write_all(&[0u8; FILE_HEADER_SIZE as usize])
                    .map_err(|e| self.io(e))?;
                self.state = State::Stream(Box::new(FromStream {
                    w: BufWriter::with_capacity(1 << 20, f),
                    e: *endian,
                    data_size: 0,
                    tracing: Vec::new(),
                    entries: Vec::new(),
                    too_long: 0,
                }));
            }
        }
        Ok(())
    }

    fn batch(&mut self, batch: &Batch<'_>, facts: &Facts<'_>) -> Result<()> {
        match batch {
            Batch::File { input, .. } => self.finish_copy(input, facts),
            Batch::Bytes { bytes, offset, .. } => {
                let out = self.out.clone();
                let State::Stream(s) = &mut self.state else {
                    return Err(Error::Internal("table sink: bytes without a stream".into()));
                };
                s.records(bytes, *offset, facts).map_err(|e| match e {
                    Error::Io { source, .. } => Error::io(&out, source),
                    other => other,
                })
            }
        }
    }

    fn finish(&mut self, facts: &Facts<'_>) -> Result<SinkReport> {
        if let State::Stream(s) = std::mem::replace(&mut self.state, State::Idle) {
            let t = Instant::now();
            let mut s = *s;
            self.report.ids_new =
                s.write_header_sections(facts, &self.out, &mut self.report.notes)?;
            self.report.timings.insert("write-tail", t.elapsed());
        }
        Ok(std::mem::take(&mut self.report))
    }

    fn abort(&mut self) -> Option<Error> {
        if let State::Copy { copier, stop } = &mut self.state {
            stop.store(true, Ordering::Relaxed);
            if let Some(Ok(Err(e))) = copier.take().map(JoinHandle::join) {
                return Some(e);
            }
        }
        None
    }
}

impl FromStream {
    /// Appends a stream's records to the data section, keeping back the records a
    /// file holds in its header (counted in the stream's budget, `--stream-memory`).
    fn records(&mut self, bytes: &[u8], offset: u64, facts: &Facts<'_>) -> Result<()> {
        let e = self.e;
        let io = |err| Error::io("", err);
        let mut at = 0usize;
        let mut run = 0usize;
        while at < bytes.len() {
            let fr = frame(&bytes[at..], e, offset + at as u64)?.ok_or_else(|| {
                Error::Internal("table sink: a batch ends inside a record".into())
            })?;
            let next = at + fr.total() as usize;
            let kind = fr.header.kind;
            if is_header_record(kind) {
                self.w.write_all(&bytes[run..at]).map_err(io)?;
                self.data_size += (at - run) as u64;
                run = next;
                let rec = &bytes[at..next];
                match kind {
                    rt::HEADER_TRACING_DATA => self.tracing.extend_from_slice(&rec[fr.size()..]),
                    rt::HEADER_BUILD_ID
                        if fr.size() < 36 || fr.size() - 36 > crate::limits::PATH_MAX =>
                    {
                        self.too_long += 1
                    }
                    rt::HEADER_BUILD_ID => {
                        // The same bytes as a table entry, whose type field is 0.
                        let start = self.entries.len();
                        self.entries.extend_from_slice(&rec[..fr.size()]);
                        self.entries[start..start + 4].copy_from_slice(&e.put_u32(0));
                    }
                    _ => {}
                }
                if matches!(kind, rt::HEADER_TRACING_DATA | rt::HEADER_BUILD_ID) {
                    let kept = (self.tracing.len() + self.entries.len()) as u64;
                    facts.check_output_kept(kept, offset + at as u64)?;
                }
            }
            at = next;
        }
        self.w.write_all(&bytes[run..]).map_err(io)?;
        self.data_size += (bytes.len() - run) as u64;
        Ok(())
    }

    /// Writes the features, ids and attrs after the data, then the header; returns
    /// how many table entries pdinject added.
    fn write_header_sections(
        &mut self,
        facts: &Facts<'_>,
        out: &Path,
        notes: &mut Vec<String>,
    ) -> Result<usize> {
        let e = self.e;
        let io = |err| Error::io(out, err);
        if facts.attrs.is_empty() {
            return Err(Error::format(
                16,
                "the stream declares no events (no HEADER_ATTR record): a perf.data file needs them",
            )
            .in_file(facts.name));
        }
        if self.data_size == 0 {
            // perf reads a data size of 0 as "to the end of the file": one
            // FINISHED_ROUND keeps the features out of the data.
            let mut r = Vec::new();
            r.extend_from_slice(&e.put_u32(rt::FINISHED_ROUND));
            r.extend_from_slice(&e.put_u16(0));
            r.extend_from_slice(&e.put_u16(8));
            self.w.write_all(&r).map_err(io)?;
            self.data_size = 8;
        }
        let added = self.final_table(facts, notes);
        let (pos, bitmap) = self.write_features(facts, out)?;
        let (attrs_at, attr_len) = self.write_attrs(facts, out, pos)?;
        let attr_size = attr_len as u64 + 16;
        let mut h = Vec::with_capacity(FILE_HEADER_SIZE as usize);
        h.extend_from_slice(match e {
            Endian::Little => b"PERFILE2",
            Endian::Big => b"2ELIFREP",
        });
        for v in [
            FILE_HEADER_SIZE,
            attr_size,
            attrs_at,
            attr_size * facts.attrs.len() as u64,
            FILE_HEADER_SIZE,
            self.data_size,
            0,
            0,
        ] {
            h.extend_from_slice(&e.put_u64(v));
        }
        for w in bitmap {
            h.extend_from_slice(&e.put_u64(w));
        }
        self.w.flush().map_err(io)?;
        let f = self.w.get_mut();
        f.seek(SeekFrom::Start(0)).map_err(io)?;
        f.write_all(&h).map_err(io)?;
        Ok(added)
    }

    /// The table as written: the stream's entries but those whose claim is
    /// contradicted, then an entry for each decided ID the stream did not carry;
    /// returns how many entries were added.
    fn final_table(&mut self, facts: &Facts<'_>, notes: &mut Vec<String>) -> usize {
        let e = self.e;
        if self.too_long > 0 {
            notes.push(format!(
                "{} HEADER_BUILD_ID record(s) of the stream left out of the table: their names are longer than perf reads in a table (PATH_MAX)",
                self.too_long
            ));
        }
        let (kept, dropped) = retain_entries(&self.entries, e, &|t| facts.passes_on(t));
        if dropped > 0 {
            self.entries = kept;
            notes.push(dropped_note(dropped));
        }
        let mut added = 0;
        for d in facts.decisions() {
            if let Some(id) = d.id_for_table()
                && !d.came_from_input()
            {
                encode_table_entry(
                    &mut self.entries,
                    e,
                    d.cpumode(),
                    &id,
                    d.group.name.as_bytes(),
                );
                added += 1;
            }
        }
        added
    }

    /// Writes the feature section table and the features after the data; returns
    /// the offset after them and the header's feature bitmap.
    fn write_features(&mut self, facts: &Facts<'_>, out: &Path) -> Result<(u64, [u64; 4])> {
        let e = self.e;
        let io = |err| Error::io(out, err);
        let mut features: Vec<(u32, &[u8])> = facts
            .stream_features
            .iter()
            .filter(|(bit, _)| ![FEAT_BUILD_ID, FEAT_TRACING_DATA].contains(bit))
            .map(|(b, p)| (*b, p.as_slice()))
            .collect();
        if !self.tracing.is_empty() {
            features.push((FEAT_TRACING_DATA, &self.tracing));
        }
        if !self.entries.is_empty() {
            features.push((FEAT_BUILD_ID, &self.entries));
        }
        features.sort_by_key(|f| f.0);
        let data_end = FILE_HEADER_SIZE + self.data_size;
        let mut pos = data_end + 16 * features.len() as u64;
        let mut bitmap = [0u64; 4];
        for (bit, p) in &features {
            bitmap[(*bit / 64) as usize] |= 1 << (bit % 64);
            self.w.write_all(&e.put_u64(pos)).map_err(io)?;
            self.w.write_all(&e.put_u64(p.len() as u64)).map_err(io)?;
            pos += p.len() as u64;
        }
        for (_, p) in &features {
            self.w.write_all(p).map_err(io)?;
        }
        Ok((pos, bitmap))
    }

    /// Writes the ids at `pos`, then the attrs section; returns where the attrs
    /// section starts and the size every attr is written at.
    fn write_attrs(&mut self, facts: &Facts<'_>, out: &Path, mut pos: u64) -> Result<(u64, usize)> {
        let e = self.e;
        let io = |err| Error::io(out, err);
        let attrs = facts.attrs;
        let bodies = facts.attr_records;
        // Every attr at one size, then its ids section. That size is the largest
        // attr's, except that zeros past perf 6.1's 128 bytes (perf 6.8+ sends
        // 136-byte attrs whose config3 is usually 0) are dropped: perf 6.1 refuses a
        // file whose attrs are larger than it knows.
        let own = |a: &crate::format::attr::Attr, body: &[u8]| {
            let n = (if a.size == 0 { 64 } else { a.size } as usize).min(body.len());
            if n > PERF_ATTR_SIZE_6_1 && body[PERF_ATTR_SIZE_6_1..n].iter().all(|&b| b == 0) {
                (n, PERF_ATTR_SIZE_6_1)
            } else {
                (n, n)
            }
        };
        let attr_len = attrs
            .iter()
            .zip(bodies)
            .map(|(a, b)| own(a, b).1)
            .max()
            .unwrap_or(64);
        let mut ids_at = Vec::with_capacity(attrs.len());
        for (a, body) in attrs.iter().zip(bodies) {
            let ids = &body[own(a, body).0..];
            self.w.write_all(ids).map_err(io)?;
            ids_at.push((pos, ids.len() as u64));
            pos += ids.len() as u64;
        }
        let attrs_at = pos;
        for ((a, body), (off, len)) in attrs.iter().zip(bodies).zip(&ids_at) {
            let mut attr = body[..own(a, body).1].to_vec();
            attr.resize(attr_len, 0);
            // attr.size says how many bytes of the struct are meaningful.
            attr[4..8].copy_from_slice(&e.put_u32(attr_len as u32));
            self.w.write_all(&attr).map_err(io)?;
            self.w.write_all(&e.put_u64(*off)).map_err(io)?;
            self.w.write_all(&e.put_u64(*len)).map_err(io)?;
        }
        Ok((attrs_at, attr_len))
    }
}

/// The record types a stream carries that a file keeps in its header instead.
fn is_header_record(kind: u32) -> bool {
    matches!(
        kind,
        rt::HEADER_ATTR
            | rt::HEADER_EVENT_TYPE
            | rt::HEADER_TRACING_DATA
            | rt::HEADER_BUILD_ID
            | rt::HEADER_FEATURE
    )
}
