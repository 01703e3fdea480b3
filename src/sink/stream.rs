//! Stream output (`perf record -o -` format): every input record passed through,
//! and a HEADER_BUILD_ID record (modern form) for each new ID placed before the
//! batch's first record that may hold a sample, so perf knows the ID before any
//! sample needs it. From a file-format input the header becomes records first:
//! HEADER_ATTR for each event, HEADER_FEATURE for each feature a record can hold,
//! HEADER_TRACING_DATA, and the input's table as HEADER_BUILD_ID records.

use super::{Batch, Begin, Sink, SinkReport};
use crate::engine::{Decision, Engine, FEAT_TERMINATOR};
use crate::format::Endian;
use crate::format::buildid::{BuildId, encode_table_entry};
use crate::format::header::{FEAT_BUILD_ID, encode_pipe_header};
use crate::format::record::rt;
use crate::format::walk::first_sampleish;
use crate::input::PerfInput;
use crate::{Error, Result};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

/// Feature bit of TRACING_DATA (tracepoint formats).
const FEAT_TRACING_DATA: u32 = 1;

/// Writes a stream to any writer.
pub struct StreamSink<'w> {
    w: Box<dyn Write + 'w>,
    out: PathBuf,
    e: Endian,
    report: SinkReport,
    /// Records of a file input's data replaced on the way (build-ID MMAP2 sink).
    splices: Vec<super::mmap2::Splice>,
}

impl<'w> StreamSink<'w> {
    /// A sink writing to `w`; `out` names it in messages.
    pub fn new(w: Box<dyn Write + 'w>, out: &Path) -> Self {
        StreamSink {
            w,
            out: out.to_path_buf(),
            e: Endian::Little,
            report: SinkReport::default(),
            splices: Vec::new(),
        }
    }

    /// Records of a file input's data section to replace as it is written (sorted).
    pub fn set_splices(&mut self, splices: Vec<super::mmap2::Splice>) {
        self.splices = splices;
    }

    fn write(&mut self, b: &[u8]) -> Result<()> {
        self.w.write_all(b).map_err(|e| Error::io(&self.out, e))
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
    fn write_file_input(&mut self, input: &PerfInput, new: &[Decision]) -> Result<()> {
        let e = self.e;
        let h = &input.header;
        let src = &input.data_files[0];
        let mut recs = Vec::new();
        // HEADER_ATTR: the attr as the file holds it, then its ids.
        let raw = src.read_at(h.attrs.offset, h.attrs.size)?;
        let attr_len = (h.attr_size - 16) as usize;
        for (i, (entry, a)) in raw
            .chunks_exact(h.attr_size as usize)
            .zip(&input.attrs)
            .enumerate()
        {
            let size = 8 + attr_len + 8 * a.ids.len();
            let size = u16::try_from(size).map_err(|_| {
                Error::unsupported(format!(
                    "event {i} has {} sample ids, more than a HEADER_ATTR record holds",
                    a.ids.len()
                ))
                .in_file(&input.header_path)
            })?;
            push_header(&mut recs, e, rt::HEADER_ATTR, size);
            recs.extend_from_slice(&entry[..attr_len]);
            for id in &a.ids {
                recs.extend_from_slice(&e.put_u64(*id));
            }
        }
        // HEADER_FEATURE for each feature that fits a record; the table becomes
        // records, tracing data its own record.
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
                    push_header(&mut recs, e, rt::HEADER_FEATURE, size);
                    recs.extend_from_slice(&e.put_u64(*bit as u64));
                    recs.extend_from_slice(&p);
                }
                Err(_) => self.report.notes.push(format!(
                    "feature {bit} ({} bytes) is larger than a stream record holds; it is left out of the stream",
                    p.len()
                )),
            }
        }
        push_header(&mut recs, e, rt::HEADER_FEATURE, 16);
        recs.extend_from_slice(&e.put_u64(FEAT_TERMINATOR));
        if let Some(t) = tracing {
            // perf pads tracing data to 8 bytes and announces the padded size.
            let padded = t.len().next_multiple_of(8);
            push_header(&mut recs, e, rt::HEADER_TRACING_DATA, 16);
            recs.extend_from_slice(&e.put_u32(padded as u32));
            recs.extend_from_slice(&[0u8; 4]);
            recs.extend_from_slice(&t);
            recs.resize(recs.len() + padded - t.len(), 0);
        }
        // The input's own table, then the new IDs.
        if let Some(table) = h
            .has_feature(FEAT_BUILD_ID)
            .then(|| input.feature(FEAT_BUILD_ID))
            .flatten()
        {
            for entry in crate::format::buildid::parse_build_id_table(&table, e).entries {
                build_id_record(
                    &mut recs,
                    e,
                    entry.cpumode,
                    &entry.build_id,
                    entry.filename.as_bytes(),
                );
            }
        }
        let ids = self.id_records(new);
        recs.extend_from_slice(&ids);
        self.write(&recs)?;
        let (start, end) = (src.range.offset, src.range.offset + src.range.size);
        let mut at = start;
        while at < end {
            let n = (end - at).min(crate::engine::source::WINDOW_BYTES);
            let win = src.window(at, n)?;
            if self.splices.is_empty() {
                self.write(&win)?;
            } else {
                let mut v = Vec::with_capacity(win.len() + 32 * self.splices.len());
                super::mmap2::splice_into(&mut v, at, &win, &self.splices);
                self.write(&v)?;
            }
            at += n;
        }
        Ok(())
    }
}

fn push_header(out: &mut Vec<u8>, e: Endian, kind: u32, size: u16) {
    out.extend_from_slice(&e.put_u32(kind));
    out.extend_from_slice(&e.put_u16(0));
    out.extend_from_slice(&e.put_u16(size));
}

/// Appends a HEADER_BUILD_ID record for `name` in the modern form (the same bytes as
/// a table entry, typed as a record; no sample-id trailer, which perf 6.1 does not
/// expect). False when the name is too long for a record.
pub fn build_id_record(
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
                self.write(header)
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
                self.write(&encode_pipe_header(host))
            }
        }
    }

    fn batch(&mut self, batch: &Batch<'_>, _: &Engine<'_>) -> Result<()> {
        match batch {
            Batch::File { input, new } => self.write_file_input(input, new),
            Batch::Bytes { bytes, new, .. } => {
                let recs = self.id_records(new);
                let at = if recs.is_empty() {
                    bytes.len()
                } else {
                    first_sampleish(bytes, self.e)
                };
                self.write(&bytes[..at])?;
                self.write(&recs)?;
                self.write(&bytes[at..])
            }
        }
    }

    fn finish(&mut self, _: &Engine<'_>) -> Result<SinkReport> {
        self.w.flush().map_err(|e| Error::io(&self.out, e))?;
        Ok(std::mem::take(&mut self.report))
    }
}
