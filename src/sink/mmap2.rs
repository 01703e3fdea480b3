//! Build-ID MMAP2 output (`--mmap2-buildid-all`, `--mmap2-buildids`): the mapping
//! records of DSOs whose ID is decided are written in build-ID form
//! (`PERF_RECORD_MISC_MMAP_BUILD_ID`, perf-format.md §3.2), so the file names each
//! mapped object by its ID and no longer depends on a path-keyed table or on the
//! files staying put. The table is written as well (every sink that writes a file
//! writes it: MMAP records left as they are, and readers that look only at the
//! table, still find the IDs).
//!
//! What is converted: MMAP2 records in the classic form and MMAP records of user
//! files, when their DSO's decision has an ID that names every mapping of the path
//! (no ambiguity, no later file, no two identities among the path's records). An MMAP2 keeps its size (the union of device/inode and
//! build-ID fields is 24 bytes either way); an MMAP grows by 32 bytes into an MMAP2.
//! Records already in build-ID form, the vdso (not file-backed: the kernel writes it
//! in the classic form too), MMAP records of the kernel and modules (as perf 6.12
//! leaves them; their IDs are in the table), anonymous memory, and DSOs that are
//! stale, ambiguous, missing, unreadable or of another host stay byte for byte as
//! they were.
//!
//! Records inside COMPRESSED data are left as they are and their IDs go into the
//! table: perf keeps one zstd frame open for the whole recording, so changing one
//! record means recompressing all compressed data after it, and a rewritten
//! compressed stream could not be checked byte for byte against the input.
//!
//! Where the records are: the engine lists every mapping record outside compressed
//! data with its DSO ([`Engine::mapping_records`]) during its one pass; the sink
//! reads only those records again (a few bytes each), never the data.

// The sinks that edit a file (`edited`, `inplace`) take the splice with the plan
// that makes it.
pub(crate) use super::splice::Splice;
use super::splice::splice_into;
use super::stream::StreamSink;
use super::table::{TableSink, table_plan};
use super::{Batch, Begin, Facts, Sink, SinkReport};
use crate::buildid::inode_conflict;
use crate::engine::{Decision, MappingRecord};
use crate::error::{Error, Result};
use crate::format::buildid::BuildId;
use crate::format::header::FileHeader;
use crate::format::record::{
    FileIdent, MMAP_TO_MMAP2, RecordHeader, encode_build_id_mmap2, parse_mmap, rt,
};
use crate::input::PerfInput;
use crate::model::{DsoId, DsoKind};
use crate::write::clone::{Piece, write_pieces};
use crate::write::{copy_prefix, write_tail};
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

/// The ID a DSO's mapping records may carry: decided, for every mapping of the path
/// (no ambiguity note, no later file), and file-backed.
fn record_id(d: &Decision) -> Option<BuildId> {
    if d.outcome.detail().is_some() || d.later_file || d.group.kind == DsoKind::Vdso {
        return None;
    }
    d.outcome.build_id()
}

/// Decides which mapping records become build-ID MMAP2 records. `read(file, offset)`
/// gives a record's bytes (None when it cannot be read: left alone). `whole` is true
/// when every mapping record of the input is listed (a file), so a path whose records
/// disagree about the file behind it is refused here too; `grow` whether an MMAP may
/// become a longer MMAP2.
pub(crate) fn plan(
    facts: &Facts<'_>,
    records: &[MappingRecord],
    whole: bool,
    grow: bool,
    read: &mut dyn FnMut(usize, u64) -> Option<Vec<u8>>,
) -> Vec<Splice> {
    let (ids, by_file) = record_ids(facts);
    if ids.is_empty() && by_file.is_empty() {
        return Vec::new();
    }
    let found = read_mappings(facts, records, &ids, &by_file, read);
    let refused = if whole {
        refused_groups(&found, &ids)
    } else {
        Vec::new()
    };
    let mut out = Vec::new();
    for (m, rec, ident) in found {
        // live capture hook (issue 32): the captured file's own ID.
        let live =
            by_file
                .get(&m.dso)
                .and_then(|&(g, k)| match facts.stages.live?.lookup(&ident)? {
                    crate::live::LiveAnswer::Proven { build_id, .. } => Some((g, build_id, k)),
                    crate::live::LiveAnswer::Unproven(_) => None,
                });
        let Some((g, id, kernel_space)) = ids.get(&m.dso).copied().or(live) else {
            continue;
        };
        if refused.contains(&g) || matches!(ident, FileIdent::BuildId(_)) {
            continue;
        }
        let Some(h) = RecordHeader::parse(&rec, facts.endian) else {
            continue;
        };
        // An MMAP of the kernel or a module stays as it is, its ID in the table (as
        // perf 6.12's and 7.3's --mmap2-buildid-all leave it): samply takes the
        // kernel's maps from MMAP records and drops MMAP2 records without
        // PROT_EXEC, so a kernel map in build-ID MMAP2 form (prot 0, what
        // `perf record --buildid-mmap` writes) would lose the kernel from its
        // libraries (samply#734 is the same for modules).
        if h.kind == rt::MMAP && (!grow || kernel_space) {
            continue;
        }
        if let Some(new) = encode_build_id_mmap2(&rec, facts.endian, &id, kernel_space) {
            out.push(Splice {
                file: m.file,
                offset: m.offset,
                seq: m.seq,
                old_len: rec.len() as u64,
                new,
            });
        }
    }
    out.sort_by_key(|s| (s.file, s.offset));
    out
}

/// The decided IDs by DSO: the decision's index, its ID, and whether it is of
/// kernel space.
type Ids = HashMap<DsoId, (usize, BuildId, bool)>;

/// The DSOs whose records may carry an ID: those with one ID for the path
/// ([`record_id`]), and (live capture) user DSOs without, whose files may each have
/// their own (the decision's index, and false: not of kernel space).
fn record_ids(facts: &Facts<'_>) -> (Ids, HashMap<DsoId, (usize, bool)>) {
    let mut ids: Ids = HashMap::new();
    for (i, d) in facts.decisions().enumerate() {
        if let Some(id) = record_id(d) {
            for &dso in &d.group.dsos {
                ids.insert(dso, (i, id, d.group.kind.is_kernel_space()));
            }
        }
    }
    // live capture hook (issue 32): a path mapped from several files has no one ID,
    // but each file captured while mapped has its own, which its records carry.
    let mut by_file: HashMap<DsoId, (usize, bool)> = HashMap::new();
    if facts.stages.live.is_some() {
        for (i, d) in facts.decisions().enumerate() {
            if record_id(d).is_none() && d.group.kind == DsoKind::User {
                for &dso in &d.group.dsos {
                    by_file.insert(dso, (i, false));
                }
            }
        }
    }
    (ids, by_file)
}

/// The mapping records of the DSOs in `ids` or `by_file` that can be read and
/// parsed, with their bytes and the file identity they carry.
fn read_mappings(
    facts: &Facts<'_>,
    records: &[MappingRecord],
    ids: &Ids,
    by_file: &HashMap<DsoId, (usize, bool)>,
    read: &mut dyn FnMut(usize, u64) -> Option<Vec<u8>>,
) -> Vec<(MappingRecord, Vec<u8>, FileIdent)> {
    let e = facts.endian;
    let mut found = Vec::new();
    for m in records {
        if !ids.contains_key(&m.dso) && !by_file.contains_key(&m.dso) {
            continue;
        }
        let Some(rec) = read(m.file, m.offset) else {
            continue;
        };
        let Some(h) = RecordHeader::parse(&rec, e) else {
            continue;
        };
        let Some(ident) = parse_mmap(&h, &rec, rec.len(), e).map(|p| p.ident) else {
            continue;
        };
        found.push((*m, rec, ident));
    }
    found
}

/// The decisions (by index) whose records name different files: two inodes, two
/// IDs, an ID other than the decided one.
fn refused_groups(found: &[(MappingRecord, Vec<u8>, FileIdent)], ids: &Ids) -> Vec<usize> {
    // Such a path gets no record rewritten: the table's path-keyed entry is what perf
    // had anyway, but a record names one mapping and must be exact.
    let mut refused: Vec<usize> = Vec::new();
    let mut by_group: HashMap<usize, Vec<FileIdent>> = HashMap::new();
    for (m, _, ident) in found {
        // Kernel-space maps carry no file identity (perf fills the device
        // fields of a synthesized kernel map with whatever it has).
        if let Some((g, _, false)) = ids.get(&m.dso) {
            by_group.entry(*g).or_default().push(*ident);
        }
    }
    for (g, mut idents) in by_group {
        // One identity per distinct file: a library mapped by thousands of
        // processes is compared once, not pairwise per record.
        idents.sort_unstable_by_key(|i| format!("{i:?}"));
        idents.dedup();
        let decided = ids.values().find(|v| v.0 == g).map(|v| v.1);
        let clash = idents.iter().enumerate().any(|(i, a)| {
            matches!(a, FileIdent::BuildId(b) if Some(*b) != decided)
                || idents[i + 1..].iter().any(|b| inode_conflict(a, b))
        });
        if clash {
            refused.push(g);
        }
    }
    refused
}

/// For each decision (in [`Engine::decisions`] order): whether every mapping record
/// of its DSOs carries its ID once `splices` are written (converted by them, or in
/// build-ID form with that ID already), so that perf needs no table entry for it.
/// False for a DSO without a listed mapping record, for the vdso (never converted),
/// and for every DSO when the input has compressed data (records inside it are not
/// listed, and stay as they are).
pub(crate) fn carried_by_records(
    facts: &Facts<'_>,
    splices: &[Splice],
    read: &mut dyn FnMut(usize, u64) -> Option<Vec<u8>>,
) -> Vec<bool> {
    let e = facts.endian;
    let n = facts.decisions().count();
    if facts.compressed_records > 0 {
        return vec![false; n];
    }
    let mut of_dso: HashMap<DsoId, (usize, BuildId)> = HashMap::new();
    for (i, d) in facts.decisions().enumerate() {
        if let Some(id) = record_id(d) {
            for &dso in &d.group.dsos {
                of_dso.insert(dso, (i, id));
            }
        }
    }
    let converted: std::collections::HashSet<(usize, u64)> =
        splices.iter().map(|s| (s.file, s.offset)).collect();
    // None: no record seen yet.
    let mut carried: Vec<Option<bool>> = vec![None; n];
    for m in facts.mapping_records {
        let Some(&(i, id)) = of_dso.get(&m.dso) else {
            continue;
        };
        if carried[i] == Some(false) {
            continue;
        }
        let ok = converted.contains(&(m.file, m.offset))
            || read(m.file, m.offset).is_some_and(|rec| {
                RecordHeader::parse(&rec, e)
                    .and_then(|h| parse_mmap(&h, &rec, rec.len(), e))
                    .is_some_and(|p| p.ident == FileIdent::BuildId(id))
            });
        carried[i] = Some(ok);
    }
    carried.into_iter().map(|c| c == Some(true)).collect()
}

/// Reads the whole record at `offset` of a file input's data file `file`.
pub(crate) fn read_record(input: &PerfInput, file: usize, offset: u64) -> Option<Vec<u8>> {
    let df = input.data_files.get(file)?;
    let head = df.read_at(offset, 8).ok()?;
    let h = RecordHeader::parse(&head, input.header.endian)?;
    if offset + h.size as u64 > df.range.offset + df.range.size {
        return None;
    }
    df.read_at(offset, h.size as u64).ok()
}

/// Where a record of data file `file` is written in a file-format output.
fn part_path(input: &PerfInput, out: &Path, dir: Option<&Path>, file: usize) -> Option<PathBuf> {
    if file == 0 {
        return Some(out.to_path_buf());
    }
    let name = input.data_files.get(file)?.path.file_name()?;
    Some(dir?.join(name))
}

/// The output the MMAP2 sink wraps.
enum Inner<'w> {
    /// A file-format output of a file input: written by this sink (copy, tail, records).
    File { out: PathBuf, dir: Option<PathBuf> },
    /// A file-format output of a stream: the table sink, fed converted bytes.
    Table(TableSink),
    /// A stream: the stream sink, fed converted bytes.
    Stream(StreamSink<'w>),
}

/// The build-ID MMAP2 sink: converts mapping records, and writes the table too.
pub(crate) struct Mmap2Sink<'w> {
    inner: Inner<'w>,
    converted: u64,
    grown: u64,
    report: SinkReport,
}

impl<'w> Mmap2Sink<'w> {
    /// A file-format output at `out` (a directory input's data.N files into `dir`).
    pub(crate) fn file(out: &Path, dir: Option<&Path>) -> Self {
        Self::with(Inner::File {
            out: out.to_path_buf(),
            dir: dir.map(Path::to_path_buf),
        })
    }

    /// A stream output through `stream`.
    pub(crate) fn stream(stream: StreamSink<'w>) -> Self {
        Self::with(Inner::Stream(stream))
    }

    fn with(inner: Inner<'w>) -> Self {
        Mmap2Sink {
            inner,
            converted: 0,
            grown: 0,
            report: SinkReport::default(),
        }
    }

    fn count(&mut self, splices: &[Splice]) {
        self.converted += splices.len() as u64;
        self.grown += splices.iter().filter(|s| s.grows() > 0).count() as u64;
    }

    /// A file input to a file output: the bytes before the first record that grows
    /// are copied as they are (reflink, copy_file_range or direct I/O), the feature
    /// tail is written after the (grown) data, the rest of the data is copied from
    /// the input around the converted records, and same-size records are patched in.
    fn write_file(
        &mut self,
        input: &PerfInput,
        facts: &Facts<'_>,
        out: &Path,
        dir: Option<&Path>,
    ) -> Result<()> {
        let t = Instant::now();
        let plan_t = table_plan(input, facts);
        let can_grow = plan_t.write && !input.header.data_size_repaired;
        let mut splices = plan(facts, facts.mapping_records, true, can_grow, &mut |f, o| {
            // Records of data.N files keep their size: no header there to grow.
            read_record(input, f, o)
        });
        splices.retain(|s| s.file == 0 || s.grows() == 0);
        self.count(&splices);
        self.report.ids_new = plan_t.ids_new;
        self.report.ids_lost = plan_t.ids_lost;
        self.report.notes.extend(plan_t.note);
        let cancel = AtomicBool::new(false);
        // With a tail to write, the data from the first converted record on is
        // written by this sink (shifted where records grew); before it, and without
        // a tail (the whole file copied), the plain copy.
        let data_end = input.header.feature_table_offset();
        let rewrite_from = splices
            .iter()
            .find(|s| s.file == 0)
            .map(|s| s.offset)
            .filter(|_| plan_t.write);
        let copy_len = match (plan_t.write, rewrite_from) {
            (false, _) => input.file_len,
            (true, None) => data_end,
            (true, Some(g)) => g,
        };
        copy_prefix(&input.header_path, out, copy_len, &cancel)?;
        for (i, df) in input.data_files.iter().enumerate().skip(1) {
            if let Some(dst) = part_path(input, out, dir, i) {
                copy_prefix(&df.path, &dst, df.range.size, &cancel)?;
            }
        }
        self.report.timings.insert("copy", t.elapsed());
        let t = Instant::now();
        if plan_t.write {
            write_tail(input, out, plan_t.payload.as_deref())
                .map_err(|e| e.in_file(&input.header_path))?;
        }
        if rewrite_from.is_some() {
            let zero: Vec<Splice> = splices.iter().filter(|s| s.file == 0).cloned().collect();
            rewrite_data(input, out, &zero)?;
        }
        // Records the rewrite did not write (data.N files; a file without a tail):
        // patched where they are, all of the same size.
        let mut files: HashMap<usize, File> = HashMap::new();
        for s in &splices {
            if (s.file == 0 && rewrite_from.is_some()) || s.grows() > 0 {
                continue;
            }
            let Some(path) = part_path(input, out, dir, s.file) else {
                continue;
            };
            let f = match files.entry(s.file) {
                std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
                std::collections::hash_map::Entry::Vacant(v) => v.insert(
                    std::fs::OpenOptions::new()
                        .write(true)
                        .open(&path)
                        .map_err(|e| Error::io(&path, e))?,
                ),
            };
            f.write_all_at(&s.new, s.offset)
                .map_err(|e| Error::io(&path, e))?;
        }
        self.report.timings.insert("write-tail", t.elapsed());
        Ok(())
    }
}

/// Writes the data section of `out` from the first converted record on: the input's
/// records around the converted ones, each later byte shifted by what the records
/// before it grew (one sequential pass, direct I/O, rather than a copy then a
/// read-modify-write of each record's page). When records grew, the feature tail
/// (already written by `write_tail` at the input's data end) moves after the grown
/// data and every offset that pointed past the data follows: the header's data size
/// and attrs offset, the feature table, and ids sections the tail holds.
fn rewrite_data(input: &PerfInput, out: &Path, splices: &[Splice]) -> Result<()> {
    let io = |e| Error::io(out, e);
    let h = &input.header;
    let e = h.endian;
    let data_end = h.feature_table_offset();
    let grown: u64 = splices.iter().map(Splice::grows).sum();
    // Read before the data overwrites where it lies; written after.
    let moved = if grown > 0 {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(out)
            .map_err(io)?;
        // The tail as write_tail left it, then moved.
        let len = f.metadata().map_err(io)?.len();
        let mut tail = vec![0u8; (len - data_end) as usize];
        f.read_exact_at(&mut tail, data_end).map_err(io)?;
        let mut head = vec![0u8; h.header_size as usize];
        f.read_exact_at(&mut head, 0).map_err(io)?;
        let oh = FileHeader::parse(&head, len).map_err(|e| e.in_file(out))?;
        let mut attrs_at = None;
        let nfeat = oh.feature_bits().count();
        for i in 0..nfeat {
            let at = 16 * i;
            if let Some(off) = e.u64(&tail, at)
                && off >= data_end
            {
                tail[at..at + 8].copy_from_slice(&e.put_u64(off + grown));
            }
        }
        let attr_len = (oh.attr_size as usize).saturating_sub(16);
        let patch_attr = |entry: &mut [u8]| {
            if let Some(ids) = e.u64(entry, attr_len)
                && ids >= data_end
            {
                entry[attr_len..attr_len + 8].copy_from_slice(&e.put_u64(ids + grown));
            }
        };
        if oh.attrs.offset >= data_end {
            let a = (oh.attrs.offset - data_end) as usize;
            let n = oh.attrs.size as usize;
            if let Some(attrs) = tail.get_mut(a..a + n) {
                attrs
                    .chunks_exact_mut(oh.attr_size as usize)
                    .for_each(patch_attr);
            }
            head[24..32].copy_from_slice(&e.put_u64(oh.attrs.offset + grown));
        } else {
            let mut attrs = vec![0u8; oh.attrs.size as usize];
            f.read_exact_at(&mut attrs, oh.attrs.offset).map_err(io)?;
            attrs
                .chunks_exact_mut(oh.attr_size as usize)
                .for_each(patch_attr);
            attrs_at = Some((oh.attrs.offset, attrs));
        }
        Some((tail, head, attrs_at))
    } else {
        None
    };
    // The data from the first grown record on: the input's bytes around the
    // converted records, written shifted.
    let src = File::open(&input.header_path).map_err(|e| Error::io(&input.header_path, e))?;
    let first = splices.first().map_or(data_end, |s| s.offset);
    let mut pieces = Vec::with_capacity(2 * splices.len() + 1);
    let mut from = first;
    for s in splices.iter().filter(|s| s.offset >= first) {
        pieces.push(Piece::Src {
            at: from,
            len: s.offset - from,
        });
        pieces.push(Piece::Bytes(&s.new));
        from = s.offset + s.old_len;
    }
    pieces.push(Piece::Src {
        at: from,
        len: data_end - from,
    });
    write_pieces((&src, &input.header_path), out, first, &pieces)?;
    if let Some((tail, mut head, attrs_at)) = moved {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(out)
            .map_err(io)?;
        if let Some((at, attrs)) = attrs_at {
            f.write_all_at(&attrs, at).map_err(io)?;
        }
        f.write_all_at(&tail, data_end + grown).map_err(io)?;
        head[48..56].copy_from_slice(&e.put_u64(h.data.size + grown));
        f.write_all_at(&head, 0).map_err(io)?;
    }
    Ok(())
}

impl Sink for Mmap2Sink<'_> {
    fn begin(&mut self, begin: &Begin<'_>, stop: &Arc<AtomicBool>) -> Result<()> {
        if let (Inner::File { out, dir }, Begin::Stream { .. }) = (&self.inner, begin) {
            // A stream to a file: the table sink writes the records it is given.
            self.inner = Inner::Table(TableSink::new(out, dir.as_deref()));
        }
        match &mut self.inner {
            // A file to a file: nothing runs beside the stages, since what is copied
            // depends on where the first record that grows is.
            Inner::File { .. } => Ok(()),
            Inner::Table(t) => t.begin(begin, stop),
            Inner::Stream(s) => s.begin(begin, stop),
        }
    }

    fn mapped_beside(&self) -> u64 {
        match &self.inner {
            Inner::Table(t) => t.mapped_beside(),
            Inner::Stream(s) => s.mapped_beside(),
            Inner::File { .. } => 0,
        }
    }

    fn batch(&mut self, batch: &Batch<'_>, facts: &Facts<'_>) -> Result<()> {
        match batch {
            Batch::File { input, new } => match &mut self.inner {
                Inner::File { out, dir } => {
                    let (out, dir) = (out.clone(), dir.clone());
                    self.write_file(input, facts, &out, dir.as_deref())
                }
                Inner::Stream(s) => {
                    // The stream's data section is the header file's records only.
                    let mut sp = plan(facts, facts.mapping_records, true, true, &mut |f, o| {
                        read_record(input, f, o)
                    });
                    sp.retain(|s| s.file == 0);
                    self.converted += sp.len() as u64;
                    self.grown += sp.iter().filter(|s| s.grows() > 0).count() as u64;
                    s.set_splices(sp);
                    s.batch(batch, facts)
                }
                Inner::Table(t) => t.batch(&Batch::File { input, new }, facts),
            },
            Batch::Bytes { bytes, offset, new } => {
                let end = offset + bytes.len() as u64;
                let recs = facts.mapping_records;
                let a = recs.partition_point(|m| m.offset < *offset);
                let b = recs.partition_point(|m| m.offset < end);
                let sp = plan(facts, &recs[a..b], false, true, &mut |_, o| {
                    let i = usize::try_from(o - offset).ok()?;
                    let fr =
                        crate::format::walk::frame(bytes.get(i..)?, facts.endian, o).ok()??;
                    bytes.get(i..i + fr.size()).map(<[u8]>::to_vec)
                });
                self.count(&sp);
                let mut conv;
                let bytes: &[u8] = if sp.is_empty() {
                    bytes
                } else {
                    conv = Vec::with_capacity(bytes.len() + MMAP_TO_MMAP2 * sp.len());
                    splice_into(&mut conv, *offset, bytes, &sp);
                    &conv
                };
                let b = Batch::Bytes {
                    bytes,
                    offset: *offset,
                    new,
                };
                match &mut self.inner {
                    Inner::Table(t) => t.batch(&b, facts),
                    Inner::Stream(s) => {
                        // An MMAP grown into an MMAP2 moves the records after it.
                        s.set_moved(sp.iter().any(|x| x.grows() > 0));
                        s.batch(&b, facts)
                    }
                    Inner::File { .. } => Err(Error::Internal(
                        "mmap2 sink: stream bytes for a file input".into(),
                    )),
                }
            }
        }
    }

    fn finish(&mut self, facts: &Facts<'_>) -> Result<SinkReport> {
        let mut r = match &mut self.inner {
            Inner::File { .. } => std::mem::take(&mut self.report),
            Inner::Table(t) => t.finish(facts)?,
            Inner::Stream(s) => s.finish(facts)?,
        };
        r.notes.push(mapping_note(self.converted, self.grown));
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

/// The summary line of a run that writes build-ID MMAP2 records.
pub(crate) fn mapping_note(converted: u64, grown: u64) -> String {
    if grown > 0 {
        format!(
            "{converted} mapping records written in build-ID form ({grown} MMAP records grew into MMAP2)"
        )
    } else {
        format!("{converted} mapping records written in build-ID form")
    }
}
