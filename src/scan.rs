//! The scan: one sequential pass over record headers. It decides chunk boundaries,
//! feeds the model (MMAP/MMAP2/COMM-exec/FORK), collects build-ID records, and looks
//! into COMPRESSED records through the same walker the resolve workers use, so both
//! number records identically.

use crate::format::Endian;
use crate::format::compressed::{InnerError, InnerStream, payload};
use crate::format::record::{
    RecordHeader, TrailerLayout, misc, out_of_band_len, parse_build_id_entry, parse_mmap, rt,
};
use crate::input::{DataFile, PerfInput};
use crate::model::{Key, ModelBuilder};
use crate::{Error, Result};
use std::sync::atomic::{AtomicBool, Ordering};

/// Window of the data section mapped at once by the scan.
pub const WINDOW_BYTES: u64 = 64 << 20;
/// Target size of a resolve chunk.
pub const CHUNK_BYTES: u64 = 4 << 20;

/// A record handed to a walker callback.
#[derive(Clone, Copy, Debug)]
pub struct Rec<'a> {
    /// File offset of the record (for inner records: of the COMPRESSED record).
    pub offset: u64,
    /// True for records decoded from compressed data.
    pub inner: bool,
    /// Sequential number of the record in the whole input.
    pub seq: u64,
    /// Its header.
    pub header: RecordHeader,
    /// Its bytes, header included.
    pub bytes: &'a [u8],
}

/// A contiguous range of one data file that a worker resolves on its own.
#[derive(Clone, Debug)]
pub struct Chunk {
    /// Index into [`PerfInput::data_files`].
    pub file: usize,
    /// First byte.
    pub start: u64,
    /// One past the last byte.
    pub end: u64,
    /// `seq` of the first record.
    pub first_seq: u64,
}

/// Walks records of `df` in `[start, end)` in windows, decompressing COMPRESSED records.
pub struct Walker {
    e: Endian,
    inner: Option<InnerStream>,
    /// The `seq` the next record gets.
    pub seq: u64,
}

impl Walker {
    /// A walker whose first record gets `first_seq`.
    pub fn new(e: Endian, first_seq: u64) -> Self {
        Walker {
            e,
            inner: None,
            seq: first_seq,
        }
    }

    /// True when a chunk may begin at the next record.
    pub fn is_clean(&self) -> bool {
        self.inner.as_ref().is_none_or(|i| i.is_clean())
    }

    /// Calls `f` for every record (outer and inner) of `df[start..end)`; `after` is
    /// called after each outer record with the offset following it.
    pub fn walk(
        &mut self,
        df: &DataFile,
        start: u64,
        end: u64,
        window: u64,
        f: &mut dyn FnMut(&Rec<'_>) -> Result<()>,
        after: &mut dyn FnMut(&Walker, u64) -> Result<()>,
    ) -> Result<()> {
        let e = self.e;
        let mut pos = start;
        while pos < end {
            let wlen = (end - pos).min(window.max(1 << 16));
            let win = df.window(pos, wlen)?;
            let buf: &[u8] = &win;
            let mut local = 0usize;
            loop {
                let off = pos + local as u64;
                if off >= end {
                    pos = off;
                    break;
                }
                let rest = &buf[local..];
                if rest.len() < 8 {
                    if off + 8 > end {
                        return Err(Error::format(
                            off,
                            format!(
                                "{} bytes of a truncated record header at the end of the data",
                                end - off
                            ),
                        ));
                    }
                    pos = off;
                    break;
                }
                let h = RecordHeader::parse(rest, e)
                    .ok_or_else(|| Error::format(off, "truncated record header"))?;
                let size = h.size as usize;
                if size < 8 {
                    return Err(Error::format(
                        off,
                        format!(
                            "record of type {} has size {size}, smaller than its header",
                            h.kind
                        ),
                    ));
                }
                if size > rest.len() {
                    if off + size as u64 > end {
                        return Err(Error::format(
                            off,
                            format!(
                                "record of type {} and size {size} runs past the end of the data ({:#x})",
                                h.kind, end
                            ),
                        ));
                    }
                    pos = off;
                    break;
                }
                let bytes = &rest[..size];
                self.record(off, h, bytes, f)?;
                let oob = out_of_band_len(&h, bytes, e)
                    .ok_or_else(|| Error::format(off, "truncated out-of-band size"))?;
                let next = off
                    .checked_add(size as u64)
                    .and_then(|n| n.checked_add(oob))
                    .filter(|&n| n <= end)
                    .ok_or_else(|| {
                        Error::format(off, format!("record of type {} announces {oob} payload bytes past the end of the data", h.kind))
                    })?;
                after(self, next)?;
                if next - pos > buf.len() as u64 {
                    pos = next;
                    break;
                }
                local = (next - pos) as usize;
                if local == buf.len() {
                    pos = next;
                    break;
                }
            }
        }
        Ok(())
    }

    fn record(
        &mut self,
        off: u64,
        h: RecordHeader,
        bytes: &[u8],
        f: &mut dyn FnMut(&Rec<'_>) -> Result<()>,
    ) -> Result<()> {
        let seq = self.seq;
        self.seq += 1;
        f(&Rec {
            offset: off,
            inner: false,
            seq,
            header: h,
            bytes,
        })?;
        if h.kind == rt::COMPRESSED || h.kind == rt::COMPRESSED2 {
            let data = payload(&h, bytes, self.e).ok_or_else(|| {
                Error::format(off, "COMPRESSED2 record's data size exceeds the record")
            })?;
            if self.inner.is_none() {
                self.inner = Some(
                    InnerStream::new(self.e)
                        .map_err(|e| Error::format(off, format!("zstd: {e}")))?,
                );
            }
            let inner = self
                .inner
                .as_mut()
                .ok_or_else(|| Error::format(off, "zstd state"))?;
            let seqr = &mut self.seq;
            let mut err = None;
            let r = inner.feed(data, |ih, irec| {
                let s = *seqr;
                *seqr += 1;
                if ih.kind == rt::COMPRESSED || ih.kind == rt::COMPRESSED2 {
                    return Err(InnerError::BadRecord(
                        "compressed record inside compressed data",
                    ));
                }
                f(&Rec {
                    offset: off,
                    inner: true,
                    seq: s,
                    header: ih,
                    bytes: irec,
                })
                .map_err(|e| {
                    err = Some(e);
                    InnerError::BadRecord("")
                })
            });
            if let Some(e) = err {
                return Err(e);
            }
            r.map_err(|e| match e {
                InnerError::Zstd(m) => Error::format(off, format!("compressed record: zstd: {m}")),
                InnerError::BadRecord(m) => Error::format(off, format!("compressed record: {m}")),
            })?;
        }
        Ok(())
    }
}

/// What the scan learned.
#[derive(Debug, Default)]
pub struct ScanOutput {
    /// Chunks covering every data file.
    pub chunks: Vec<Chunk>,
    /// HEADER_BUILD_ID records found in the data (from an earlier injection).
    pub stream_build_ids: Vec<crate::format::feature::TableEntry>,
    /// AUX area data is present (Intel PT, CoreSight, SPE, ...).
    pub has_aux: bool,
    /// Records seen (outer and inner).
    pub records: u64,
    /// SAMPLE records seen.
    pub samples: u64,
    /// COMPRESSED records seen.
    pub compressed: u64,
    /// Smallest and largest non-zero time among mapping records.
    pub min_time: Option<u64>,
    /// See `min_time`.
    pub max_time: Option<u64>,
}

/// Scans the whole input into a model builder; `progress` gets bytes done. When `stop`
/// turns true the scan ends at the next chunk boundary with [`Error::Stopped`].
pub fn scan(
    input: &PerfInput,
    time_mode: bool,
    builder: &mut ModelBuilder,
    progress: &dyn Fn(u64),
    stop: &AtomicBool,
) -> Result<ScanOutput> {
    let e = input.header.endian;
    let first = &input.attrs[0];
    let trailer = TrailerLayout::new(first.sample_type, first.sample_id_all());
    let mut out = ScanOutput::default();
    let mut walker = Walker::new(e, 0);
    // Limits policy: the model may grow with the input, not beyond.
    builder.account_input(input.data_bytes());
    let mut done = 0u64;
    for (fi, df) in input.data_files.iter().enumerate() {
        let (start, end) = (df.range.offset, df.range.offset + df.range.size);
        let mut chunk_start = start;
        let mut chunk_seq = walker.seq;
        let mut chunks = Vec::new();
        let mut on_rec = |r: &Rec<'_>| -> Result<()> {
            out.records += 1;
            on_record(r, e, &trailer, time_mode, builder, &mut out).map_err(|err| match err {
                Error::Format {
                    file: None, what, ..
                } if r.inner => Error::format(r.offset, format!("in compressed data: {what}")),
                other => other,
            })
        };
        let mut after = |w: &Walker, next: u64| -> Result<()> {
            if next - chunk_start >= CHUNK_BYTES && w.is_clean() {
                chunks.push(Chunk {
                    file: fi,
                    start: chunk_start,
                    end: next,
                    first_seq: chunk_seq,
                });
                progress(done + next - start);
                if stop.load(Ordering::Relaxed) {
                    return Err(Error::Stopped);
                }
                chunk_start = next;
                chunk_seq = w.seq;
            }
            Ok(())
        };
        walker
            .walk(df, start, end, WINDOW_BYTES, &mut on_rec, &mut after)
            .map_err(|err| err.in_file(&df.path))?;
        if chunk_start < end {
            chunks.push(Chunk {
                file: fi,
                start: chunk_start,
                end,
                first_seq: chunk_seq,
            });
        }
        out.chunks.extend(chunks);
        done += end - start;
        progress(done);
    }
    Ok(out)
}

/// Feeds one record to the model and the scan's findings (shared with pipe mode).
pub(crate) fn on_record(
    r: &Rec<'_>,
    e: Endian,
    trailer: &TrailerLayout,
    time_mode: bool,
    builder: &mut ModelBuilder,
    out: &mut ScanOutput,
) -> Result<()> {
    let h = &r.header;
    let key = |t: Option<u64>| -> Key { (if time_mode { t.unwrap_or(0) } else { 0 }, r.seq) };
    let mut note_time = |t: Option<u64>| {
        if let Some(t) = t.filter(|&t| t != 0) {
            out.min_time = Some(out.min_time.map_or(t, |m| m.min(t)));
            out.max_time = Some(out.max_time.map_or(t, |m| m.max(t)));
        }
    };
    match h.kind {
        rt::SAMPLE => out.samples += 1,
        rt::MMAP | rt::MMAP2 => {
            let fixed = if h.kind == rt::MMAP { 40 } else { 72 };
            let body_end = r
                .bytes
                .len()
                .checked_sub(trailer.size)
                .filter(|&b| b >= fixed)
                .ok_or_else(|| {
                    Error::format(
                        r.offset,
                        format!(
                            "{} record of size {} is shorter than its header says",
                            if h.kind == rt::MMAP { "MMAP" } else { "MMAP2" },
                            r.bytes.len()
                        ),
                    )
                })?;
            let sid = trailer.read(r.bytes, e);
            note_time(sid.time);
            if let Some(m) = parse_mmap(h, r.bytes, body_end, e) {
                builder
                    .mmap(key(sid.time), h.cpumode(), &m)
                    .map_err(|l| l.at(r.offset))?;
            }
        }
        rt::COMM if h.misc & misc::COMM_EXEC != 0 => {
            let sid = trailer.read(r.bytes, e);
            note_time(sid.time);
            let pid = e
                .u32(r.bytes, 8)
                .ok_or_else(|| Error::format(r.offset, "COMM record is truncated"))?;
            builder
                .exec(key(sid.time), pid)
                .map_err(|l| l.at(r.offset))?;
        }
        rt::FORK => {
            let pid = e.u32(r.bytes, 8);
            let ppid = e.u32(r.bytes, 12);
            let time = e.u64(r.bytes, 24);
            let (Some(pid), Some(ppid)) = (pid, ppid) else {
                return Err(Error::format(r.offset, "FORK record is truncated"));
            };
            let t = trailer.read(r.bytes, e).time.or(time);
            note_time(t);
            builder
                .fork(key(t), pid, ppid)
                .map_err(|l| l.at(r.offset))?;
        }
        rt::HEADER_BUILD_ID => {
            if let Some(entry) = parse_build_id_entry(h, r.bytes) {
                out.stream_build_ids
                    .push(crate::format::feature::TableEntry {
                        cpumode: entry.cpumode,
                        pid: entry.pid,
                        build_id: entry.build_id,
                        filename: String::from_utf8_lossy(entry.filename).into_owned(),
                    });
            }
        }
        rt::AUX | rt::AUXTRACE | rt::AUXTRACE_INFO => out.has_aux = true,
        rt::COMPRESSED | rt::COMPRESSED2 => out.compressed += 1,
        _ => {}
    }
    Ok(())
}
