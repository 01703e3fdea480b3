//! Stream output (`perf record -o -` format): every input record passed through,
//! and a HEADER_BUILD_ID record (modern form) for each new ID placed before the
//! batch's first record that may hold a sample, so perf knows the ID before any
//! sample needs it. From a file-format input the header becomes records first:
//! HEADER_ATTR for each event, HEADER_FEATURE for each feature a record can hold,
//! HEADER_TRACING_DATA, and the input's table as HEADER_BUILD_ID records.

use super::splice::{Splice, splice_into};
use super::{Batch, Begin, Facts, Sink, SinkReport};
use crate::engine::Decision;
use crate::error::{Error, Result};
use crate::format::Endian;
use crate::format::attr_compat;
use crate::format::buildid::{BuildId, TableEntry, encode_table_entry, parse_build_id_entry};
use crate::format::header::{FEAT_BUILD_ID, encode_pipe_header};
use crate::format::record::{FeatureRecord, rt};
use crate::format::walk::first_sampleish;
use crate::input::PerfInput;
use crate::options::AttrsFor;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

/// Feature bit of TRACING_DATA (tracepoint formats).
const FEAT_TRACING_DATA: u32 = 1;

/// Writes a stream to any writer.
pub(crate) struct StreamSink<'w> {
    w: Box<dyn Write + 'w>,
    out: PathBuf,
    e: Endian,
    report: SinkReport,
    /// Records of a file input's data replaced on the way (build-ID MMAP2 sink).
    splices: Vec<Splice>,
    /// What [`StreamSink::pass_on`] repaired so far.
    fixes: Fixes,
    /// The records of the batch being written are not at the offsets the engine's
    /// scan saw them at (the build-ID MMAP2 sink grew MMAP records into MMAP2s before
    /// them): [`StreamSink::pass_on`] finds them by a walk instead.
    moved: bool,
    /// `--attrs-for`: the size HEADER_ATTR records' attrs are cut to.
    attrs_for: AttrsFor,
    /// The largest attr size cut (for the summary).
    attrs_cut: Option<usize>,
    /// The stream's attrs [`StreamSink::check_attrs`] has checked (each once).
    attrs_checked: usize,
    /// The stream header, written with the first records: a run refused at its
    /// first batch (an attr that cannot be cut) leaves no byte on the output.
    pending: Option<Vec<u8>>,
}

/// Records of a passed-on stream rewritten so that every perf reads the output.
#[derive(Debug, Default)]
struct Fixes {
    /// HEADER_BUILD_ID records padded to a multiple of 8 bytes (perf 6.1's
    /// `inject -b` writes 36 + round_up(len + 1, 64)).
    build_ids: u64,
    /// End-of-features markers left out, by feature ID (see [`is_end_marker`]).
    end_markers: std::collections::BTreeSet<u64>,
    /// Other records whose size is not a multiple of 8, passed on as they are: what
    /// follows their bytes is not known to be padding, so no repair is lossless.
    unaligned: u64,
    /// HEADER_BUILD_ID records left out: their claim is contradicted
    /// ([`Engine::passes_on`]).
    contradicted: usize,
}

impl<'w> StreamSink<'w> {
    /// A sink writing to `w`; `out` names it in messages.
    pub(crate) fn new(w: Box<dyn Write + 'w>, out: &Path) -> Self {
        StreamSink {
            w,
            out: out.to_path_buf(),
            e: Endian::Little,
            report: SinkReport::default(),
            splices: Vec::new(),
            fixes: Fixes::default(),
            moved: false,
            attrs_for: AttrsFor::Verbatim,
            attrs_cut: None,
            attrs_checked: 0,
            pending: None,
        }
    }

    /// Writes every attr at `to`'s size (`--attrs-for`); refuses an attr whose cut
    /// bytes are not zero.
    pub(crate) fn set_attrs_for(&mut self, to: AttrsFor) {
        self.attrs_for = to;
    }

    /// Checks, before a stream batch writes anything, that every attr seen so far
    /// can be cut to the `--attrs-for` size (each attr once).
    fn check_attrs(&mut self, facts: &Facts<'_>) -> Result<()> {
        let bodies = facts.attr_records;
        if self.attrs_for == AttrsFor::Verbatim || bodies.len() <= self.attrs_checked {
            return Ok(());
        }
        let names = facts
            .stream_features
            .get(&attr_compat::FEAT_EVENT_DESC)
            .map(|p| attr_compat::parse_event_desc(p, self.e))
            .unwrap_or_default();
        for (i, body) in bodies.iter().enumerate().skip(self.attrs_checked) {
            let size = attr_compat::own_size(body, self.e).min(body.len());
            let attr = &body[..size];
            let event = || attr_compat::describe(i, names.get(i).map(String::as_str), attr, self.e);
            attr_compat::shrink(attr, self.e, self.attrs_for, &event)
                .map_err(|e| e.in_file(facts.name))?;
        }
        self.attrs_checked = bodies.len();
        Ok(())
    }

    /// Whether the records of the next batches moved from where the engine's scan saw
    /// them (see [`StreamSink::pass_on`]).
    pub(crate) fn set_moved(&mut self, moved: bool) {
        self.moved = moved;
    }

    /// Records of a file input's data section to replace as it is written (sorted).
    pub(crate) fn set_splices(&mut self, splices: Vec<Splice>) {
        self.splices = splices;
    }

    fn write(&mut self, b: &[u8]) -> Result<()> {
        if let Some(h) = self.pending.take() {
            self.w.write_all(&h).map_err(|e| Error::io(&self.out, e))?;
        }
        self.w.write_all(b).map_err(|e| Error::io(&self.out, e))
    }

    /// Writes whole records of the input stream, leaving out the input's
    /// HEADER_BUILD_ID records whose claim the input contradicts itself, and
    /// repairing what one perf refuses or warns about in streams another wrote: a
    /// HEADER_BUILD_ID record whose size is not a multiple of 8 (perf 7.3 aborts;
    /// padded with zeros after its NUL-terminated name, and the record has no
    /// sample-id trailer, so nothing moves), the end-of-features marker (left out,
    /// see [`is_end_marker`]) and, with `--attrs-for`, HEADER_ATTR records. Runs of
    /// records that need nothing are written as they are; only the records the
    /// engine's scan marked are looked at (all record headers only when records
    /// moved, see [`StreamSink::set_moved`]).
    fn pass_on(&mut self, bytes: &[u8], offset: u64, facts: &Facts<'_>) -> Result<()> {
        let e = self.e;
        let mut clean_from = 0usize;
        let end = offset + bytes.len() as u64;
        // Only the records the engine's scan marked can need anything; where records
        // moved (MMAP grown into MMAP2 before them), they are found by a walk.
        let positions: Vec<usize> = if self.moved {
            user_record_positions(bytes, e)
        } else {
            facts
                .user_records_in(offset, end)
                .iter()
                .filter_map(|&m| usize::try_from(m - offset).ok())
                .collect()
        };
        for at in positions {
            if at < clean_from || at >= bytes.len() {
                continue;
            }
            let mark = offset + at as u64;
            // The engine framed these bytes already; a record that does not frame
            // here ends the walk and the rest is written as it is.
            let Ok(Some(f)) = crate::format::walk::frame(&bytes[at..], e, mark) else {
                break;
            };
            let size = f.size();
            let Some(total) = usize::try_from(f.total())
                .ok()
                .filter(|t| at + t <= bytes.len())
            else {
                break;
            };
            let rec = &bytes[at..at + size];
            if f.header.kind == rt::HEADER_BUILD_ID
                && let Some(b) = parse_build_id_entry(&f.header, rec)
                && !facts.passes_on(&TableEntry {
                    cpumode: b.cpumode,
                    build_id: b.build_id,
                    filename: String::from_utf8_lossy(b.filename).into_owned(),
                })
            {
                // A contradicted claim is not passed on (the decided ID, if any,
                // is sent as a record of pdinject's own).
                self.write(&bytes[clean_from..at])?;
                clean_from = at + total;
                self.fixes.contradicted += 1;
                continue;
            }
            let fixed: Option<Vec<u8>> = match f.header.kind {
                rt::HEADER_ATTR if self.attrs_for != AttrsFor::Verbatim => {
                    // check_attrs has named any attr that cannot be cut.
                    let event = || "a HEADER_ATTR record".to_string();
                    let cut = attr_compat::shrink_record(rec, e, self.attrs_for, &event)?;
                    if cut.is_some() {
                        let own = e.u32(rec, 12).unwrap_or(0) as usize;
                        self.attrs_cut = self.attrs_cut.max(Some(own));
                    }
                    cut
                }
                rt::HEADER_BUILD_ID if size % 8 != 0 => {
                    let padded = size.next_multiple_of(8);
                    u16::try_from(padded).ok().map(|p| {
                        let mut v = rec.to_vec();
                        v.resize(padded, 0);
                        v[6..8].copy_from_slice(&e.put_u16(p));
                        self.fixes.build_ids += 1;
                        v
                    })
                }
                rt::HEADER_FEATURE if is_end_marker(rec, e) => {
                    self.fixes
                        .end_markers
                        .insert(FeatureRecord::parse(rec, e).map_or(0, |f| f.id));
                    Some(Vec::new())
                }
                _ => None,
            };
            match fixed {
                Some(v) => {
                    self.write(&bytes[clean_from..at])?;
                    self.write(&v)?;
                    self.write(&bytes[at + size..at + total])?;
                    clean_from = at + total;
                }
                // A HEADER_BUILD_ID record too long to pad (the engine counts the
                // other kinds perf 7.3 checks).
                None if size % 8 != 0 && f.header.kind == rt::HEADER_BUILD_ID => {
                    self.fixes.unaligned += 1
                }
                None => {}
            }
        }
        self.write(&bytes[clean_from..])
    }

    /// HEADER_BUILD_ID records for the decisions whose IDs the stream does not carry.
    fn id_records(&mut self, new: &[Decision]) -> Vec<u8> {
        let mut out = Vec::new();
        for d in new {
            if let Some(id) = d.id_for_stream() {
                build_id_record(&mut out, self.e, d.cpumode(), &id, d.group.name.as_bytes());
                self.report.ids_new += 1;
            }
        }
        out
    }

    /// The header of a file-format input as stream records, then its data section.
    fn write_file_input(
        &mut self,
        input: &PerfInput,
        new: &[Decision],
        facts: &Facts<'_>,
    ) -> Result<()> {
        let recs = self.file_head(input, new, facts)?;
        self.write(&recs)?;
        let src = &input.data_files[0];
        let (start, end) = (src.range.offset, src.range.offset + src.range.size);
        let mut at = start;
        while at < end {
            let n = (end - at).min(crate::input::WINDOW_BYTES);
            let win = src.window(at, n)?;
            if self.splices.is_empty() {
                self.write(&win)?;
            } else {
                let mut v = Vec::with_capacity(win.len() + 32 * self.splices.len());
                splice_into(&mut v, at, &win, &self.splices);
                self.write(&v)?;
            }
            at += n;
        }
        Ok(())
    }

    /// Bytes written as they are (`--convert-callchain` writes a file input's
    /// records itself, after [`StreamSink::file_head`]).
    pub(crate) fn write_raw(&mut self, b: &[u8]) -> Result<()> {
        self.write(b)
    }

    /// The header of a file-format input as stream records (HEADER_ATTR,
    /// HEADER_FEATURE, HEADER_TRACING_DATA, HEADER_BUILD_ID), to be written before
    /// its data section.
    pub(crate) fn file_head(
        &mut self,
        input: &PerfInput,
        new: &[Decision],
        facts: &Facts<'_>,
    ) -> Result<Vec<u8>> {
        let mut recs = Vec::new();
        self.push_attr_records(&mut recs, input)?;
        let tracing = self.push_feature_records(&mut recs, input);
        // No end-of-features marker: see `is_end_marker`.
        if let Some(t) = tracing {
            // perf pads tracing data to 8 bytes and announces the padded size.
            let padded = t.len().next_multiple_of(8);
            push_header(&mut recs, self.e, rt::HEADER_TRACING_DATA, 16);
            recs.extend_from_slice(&self.e.put_u32(padded as u32));
            recs.extend_from_slice(&[0u8; 4]);
            recs.extend_from_slice(&t);
            recs.resize(recs.len() + padded - t.len(), 0);
        }
        // The input's own table, then the new IDs.
        self.push_table_records(&mut recs, input, facts);
        let ids = self.id_records(new);
        recs.extend_from_slice(&ids);
        Ok(recs)
    }

    /// HEADER_ATTR records of a file-format input: the attr as the file holds it
    /// (cut to the `--attrs-for` size), then its ids.
    fn push_attr_records(&mut self, recs: &mut Vec<u8>, input: &PerfInput) -> Result<()> {
        let e = self.e;
        let h = &input.header;
        let src = &input.data_files[0];
        let raw = src.read_at(h.attrs.offset, h.attrs.size)?;
        let attr_len = (h.attr_size - 16) as usize;
        let names = if self.attrs_for == AttrsFor::Verbatim {
            Vec::new()
        } else {
            input
                .feature(attr_compat::FEAT_EVENT_DESC)
                .map(|p| attr_compat::parse_event_desc(&p, e))
                .unwrap_or_default()
        };
        for (i, (entry, a)) in raw
            .chunks_exact(h.attr_size as usize)
            .zip(&input.attrs)
            .enumerate()
        {
            let attr = &entry[..attr_len];
            let event = || attr_compat::describe(i, names.get(i).map(String::as_str), attr, e);
            let cut = attr_compat::shrink(attr, e, self.attrs_for, &event)
                .map_err(|err| err.in_file(&input.header_path))?;
            if cut.is_some() {
                self.attrs_cut = self.attrs_cut.max(Some(attr_len));
            }
            let attr = cut.as_deref().unwrap_or(attr);
            let size = 8 + attr.len() + 8 * a.ids.len();
            let size = u16::try_from(size).map_err(|_| {
                Error::unsupported(format!(
                    "event {i} has {} sample ids, more than a HEADER_ATTR record holds",
                    a.ids.len()
                ))
                .in_file(&input.header_path)
            })?;
            push_header(recs, e, rt::HEADER_ATTR, size);
            recs.extend_from_slice(attr);
            for id in &a.ids {
                recs.extend_from_slice(&e.put_u64(*id));
            }
        }
        Ok(())
    }

    /// HEADER_FEATURE for each feature of a file-format input that fits a record;
    /// returns the tracing data, which gets its own record (the table becomes
    /// records of its own too, [`StreamSink::push_table_records`]).
    fn push_feature_records(&mut self, recs: &mut Vec<u8>, input: &PerfInput) -> Option<Vec<u8>> {
        let e = self.e;
        let mut tracing = None;
        for (bit, _) in &input.features {
            if *bit == FEAT_BUILD_ID {
                continue;
            }
            let Some(p) = input.feature(*bit) else {
                continue;
            };
            if *bit == FEAT_TRACING_DATA {
                tracing = Some(p);
                continue;
            }
            match u16::try_from(16 + p.len()) {
                Ok(size) => {
                    push_header(recs, e, rt::HEADER_FEATURE, size);
                    recs.extend_from_slice(&e.put_u64(*bit as u64));
                    recs.extend_from_slice(&p);
                }
                Err(_) => self.report.notes.push(format!(
                    "feature {bit} ({} bytes) is larger than a stream record holds; it is left out of the stream",
                    p.len()
                )),
            }
        }
        tracing
    }

    /// The BUILD_ID table of a file-format input as HEADER_BUILD_ID records, but the
    /// entries whose claim is contradicted.
    fn push_table_records(&mut self, recs: &mut Vec<u8>, input: &PerfInput, facts: &Facts<'_>) {
        let e = self.e;
        let Some(table) = input
            .header
            .has_feature(FEAT_BUILD_ID)
            .then(|| input.feature(FEAT_BUILD_ID))
            .flatten()
        else {
            return;
        };
        let mut dropped = 0;
        for entry in crate::format::buildid::parse_build_id_table(&table, e).entries {
            // An entry whose claim is contradicted is not passed on.
            if !facts.passes_on(&entry) {
                dropped += 1;
                continue;
            }
            build_id_record(
                recs,
                e,
                entry.cpumode,
                &entry.build_id,
                entry.filename.as_bytes(),
            );
        }
        if dropped > 0 {
            self.report.notes.push(super::table::dropped_note(dropped));
        }
    }
}

fn push_header(out: &mut Vec<u8>, e: Endian, kind: u32, size: u16) {
    out.extend_from_slice(&e.put_u32(kind));
    out.extend_from_slice(&e.put_u16(0));
    out.extend_from_slice(&e.put_u16(size));
}

/// Where the HEADER_ATTR, HEADER_FEATURE and HEADER_BUILD_ID records of `bytes` (whole
/// records) start: a walk of every record header, for a batch whose records moved.
fn user_record_positions(bytes: &[u8], e: Endian) -> Vec<usize> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while at < bytes.len() {
        let Ok(Some(f)) = crate::format::walk::frame(&bytes[at..], e, at as u64) else {
            break;
        };
        if matches!(
            f.header.kind,
            rt::HEADER_ATTR | rt::HEADER_FEATURE | rt::HEADER_BUILD_ID
        ) {
            out.push(at);
        }
        match usize::try_from(f.total()) {
            Ok(t) if t > 0 => at += t,
            _ => break,
        }
    }
    out
}

/// Whether `rec` (a HEADER_FEATURE record) is an end-of-features marker: a feature
/// ID from 32 on without payload. perf writes its `HEADER_LAST_FEATURE` there, and
/// other versions misread it (measured with perf 6.1, 6.12 and 7.3):
/// * perf 6's marker is 32, which perf 7 reads as an empty CPU_DOMAIN_INFO section
///   ("Invalid HEADER_CPU_DOMAIN_INFO: section too small (0) for 2 CPUs");
/// * perf 7's is 35, on which perf 6.1's and 6.12's `perf report` stop ("failed:
///   wrong feature ID: 35", "failed to process sample": no report at all).
///
/// Without a marker all three read the stream, `perf report --header-only`
/// included; the marker only lets `perf report --header-only` stop early and
/// `--group` force its leader once the features are in. So pdinject writes none and
/// leaves the input's out. A feature without payload carries nothing to lose.
fn is_end_marker(rec: &[u8], e: Endian) -> bool {
    FeatureRecord::parse(rec, e).is_some_and(|f| f.payload.is_empty() && f.id >= 32)
}

/// Appends a HEADER_BUILD_ID record for `name` in the modern form (the same bytes as
/// a table entry, typed as a record; no sample-id trailer, which perf 6.1 does not
/// expect). False when the name is too long for a record.
pub(crate) fn build_id_record(
    out: &mut Vec<u8>,
    e: Endian,
    cpumode: u16,
    id: &BuildId,
    name: &[u8],
) -> bool {
    let at = out.len();
    if !encode_table_entry(out, e, cpumode, id, name) {
        return false;
    }
    out[at..at + 4].copy_from_slice(&e.put_u32(rt::HEADER_BUILD_ID));
    true
}

impl Sink for StreamSink<'_> {
    fn begin(&mut self, begin: &Begin<'_>, _: &Arc<AtomicBool>) -> Result<()> {
        match begin {
            Begin::Stream { header, endian } => {
                self.e = *endian;
                self.pending = Some(header.to_vec());
                Ok(())
            }
            Begin::File(input) => {
                let host = if cfg!(target_endian = "big") {
                    Endian::Big
                } else {
                    Endian::Little
                };
                if input.is_dir {
                    return Err(Error::Usage(format!(
                        "{}: a perf record --threads directory cannot be written as a stream; give an output directory",
                        input.path.display()
                    )));
                }
                if input.header.endian != host {
                    return Err(Error::unsupported(
                        "a file in the other byte order cannot be written as a stream (perf reads streams in the host's order only); give an output file",
                    )
                    .in_file(&input.header_path));
                }
                self.e = host;
                self.pending = Some(encode_pipe_header(host).to_vec());
                Ok(())
            }
        }
    }

    fn batch(&mut self, batch: &Batch<'_>, facts: &Facts<'_>) -> Result<()> {
        match batch {
            Batch::File { input, new } => self.write_file_input(input, new, facts),
            Batch::Bytes { bytes, new, offset } => {
                self.check_attrs(facts)?;
                let recs = self.id_records(new);
                let at = if recs.is_empty() {
                    bytes.len()
                } else {
                    first_sampleish(bytes, self.e)
                };
                let (head, tail) = bytes.split_at(at);
                self.pass_on(head, *offset, facts)?;
                self.write(&recs)?;
                self.pass_on(tail, offset + at as u64, facts)
            }
        }
    }

    fn finish(&mut self, facts: &Facts<'_>) -> Result<SinkReport> {
        if let Some(h) = self.pending.take() {
            self.w.write_all(&h).map_err(|e| Error::io(&self.out, e))?;
        }
        self.w.flush().map_err(|e| Error::io(&self.out, e))?;
        if let (Some(from), Some(to)) = (self.attrs_cut, self.attrs_for.size()) {
            self.report
                .notes
                .push(attr_compat::note(from, to, self.attrs_for));
        }
        let f = &self.fixes;
        if f.build_ids > 0 {
            self.report.notes.push(format!(
                "{} HEADER_BUILD_ID record(s) of the input padded to a multiple of 8 bytes (perf 7.3 refuses others)",
                f.build_ids
            ));
        }
        if !f.end_markers.is_empty() {
            let ids: Vec<String> = f.end_markers.iter().map(u64::to_string).collect();
            self.report.notes.push(format!(
                "the input's end-of-features marker (HEADER_FEATURE {}) left out: each perf but the one that wrote it fails or warns on it",
                ids.join(", ")
            ));
        }
        if f.contradicted > 0 {
            self.report
                .notes
                .push(super::table::dropped_note(f.contradicted));
        }
        let unaligned = f.unaligned + facts.unaligned_records;
        if unaligned > 0 {
            self.report.notes.push(format!(
                "{unaligned} record(s) of the input have a size that is not a multiple of 8 and were passed on as they are (perf 7.3 refuses such streams)"
            ));
        }
        Ok(std::mem::take(&mut self.report))
    }
}
