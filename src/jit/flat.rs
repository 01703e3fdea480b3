//! A `perf record --threads` directory (a header file `data` and one `data.N` per
//! recording thread) as one single-file recording, so that `--jit` can put its
//! records between the recording's own by time. The files' records are merged by
//! time, each file's order kept (a file interleaves several CPUs' buffers, so its
//! times are not sorted: the merge takes the file whose next record is oldest, and
//! a record without a time sorts with the one before it). The recording has no
//! rounds (perf record --threads writes no FINISHED_ROUND): perf sorts all of a
//! directory's records by time, and sorts the merged file's the same way; a round
//! of one file would be a wrong promise about the others', so one is dropped.
//!
//! perf inject --jit (6.1 and 7.3) writes a directory whose one `data` file has no
//! samples (measured: perf report and perf script show none); pdinject's output is
//! the one file. Compressed files (`-z`) are expanded first, as `--jit` writes every
//! compressed recording.

use super::{IO_BUF, Layout, Records, plain, record_time, scratch_beside};
use crate::format::header::Section;
use crate::format::record::{TrailerLayout, rt};
use crate::input::{Backing, DataFile, PerfInput};
use crate::write::{TailShape, copy_prefix, write_tail_shaped};
use crate::{Error, Result};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Read-ahead per file of the directory (many CPUs' files, little memory).
const SOURCE_BUF: usize = 256 << 10;

/// What flattening did, for the report's notes.
pub(super) struct Flattened {
    /// Record files merged (the header file's data counts as one).
    pub files: usize,
    /// Whether compressed records were expanded.
    pub expanded: bool,
    /// The note on `data.N` entries skipped, if any.
    pub skipped: Option<String>,
}

/// Writes the records of directory recording `dir` to `out` as one file; scratch
/// files (compressed data expanded) go beside `scratch`.
pub(super) fn flatten(dir: &Path, out: &Path, scratch: &Path) -> Result<Flattened> {
    let input = PerfInput::open(dir)?;
    let l = super::input_layout(&input, dir)?;
    let from = l.data.0;
    copy_prefix(
        &input.header_path,
        out,
        from,
        &std::sync::atomic::AtomicBool::new(false),
    )?;
    let io = |e| Error::io(out, e);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(out)
        .map_err(io)?;
    let mut expanded = false;
    let size = match merge(&input.data_files, &l, &f, from, out)? {
        Some(n) => n,
        None => {
            // perf record -z --threads: each file's records expanded to a scratch file
            // (unlinked at once), then merged.
            expanded = true;
            let mut plains = Vec::new();
            for df in &input.data_files {
                let t = scratch_beside(scratch).map_err(io)?;
                let mut w = BufWriter::with_capacity(IO_BUF, &t);
                let n = plain::expand(df, l.endian, &mut w, out)?;
                w.flush().map_err(io)?;
                drop(w);
                plains.push(DataFile::new(
                    df.path.clone(),
                    Backing::File(t),
                    Section { offset: 0, size: n },
                ));
            }
            merge(&plains, &l, &f, from, out)?.ok_or_else(|| {
                Error::Internal("--jit: compressed records after expanding them".into())
            })?
        }
    };
    write_tail_shaped(&input, out, None, from + size, TailShape::OneFile)?;
    f.write_all_at(&l.endian.put_u64(size), 48).map_err(io)?;
    Ok(Flattened {
        files: input.data_files.len(),
        expanded,
        skipped: input.skipped_note(),
    })
}

/// One file being merged: its reader and its next record's time and payload length.
struct Source<'a> {
    df: &'a DataFile,
    recs: Records<BufReader<File>>,
    time: u64,
    extra: u64,
}

/// What a source's next record is.
enum Next {
    Record,
    Compressed,
    End,
}

impl Source<'_> {
    fn advance(
        &mut self,
        l: &Layout,
        trailer: &TrailerLayout,
        ids: &HashMap<u64, usize>,
    ) -> Result<Next> {
        loop {
            let Some((_, extra)) = self.recs.next(&self.df.path)? else {
                return Ok(Next::End);
            };
            let kind = crate::format::record::RecordHeader::parse(&self.recs.buf, l.endian)
                .map(|h| h.kind)
                .unwrap_or(0);
            match kind {
                rt::COMPRESSED | rt::COMPRESSED2 => return Ok(Next::Compressed),
                rt::FINISHED_ROUND => continue,
                _ => {}
            }
            if let Some(t) = record_time(&self.recs.buf, l, trailer, ids) {
                self.time = t;
            }
            self.extra = extra;
            return Ok(Next::Record);
        }
    }
}

/// Writes the records of `files` merged by time to `f` from offset `from`; returns
/// their length, or `None` when a file holds compressed records (nothing useful
/// written then).
fn merge(files: &[DataFile], l: &Layout, f: &File, from: u64, out: &Path) -> Result<Option<u64>> {
    let io = |e| Error::io(out, e);
    f.set_len(from).map_err(io)?;
    let mut w = BufWriter::with_capacity(IO_BUF, f);
    w.seek(SeekFrom::Start(from)).map_err(io)?;
    let ids = l.ids();
    let trailer = l.trailer();
    let mut sources = Vec::with_capacity(files.len());
    // Oldest first; of equal times, the earlier file (the header file's records,
    // synthesized at the start, before the CPUs').
    let mut heap = BinaryHeap::new();
    for (i, df) in files.iter().enumerate() {
        let Backing::File(file) = &df.backing else {
            return Err(Error::Internal(
                "--jit: a directory's file is not on disk".into(),
            ));
        };
        let file = file.try_clone().map_err(|e| Error::io(&df.path, e))?;
        let mut r = BufReader::with_capacity(SOURCE_BUF, file);
        r.seek(SeekFrom::Start(df.range.offset))
            .map_err(|e| Error::io(&df.path, e))?;
        let mut s = Source {
            df,
            recs: Records {
                r,
                at: df.range.offset,
                to: df.range.offset + df.range.size,
                e: l.endian,
                buf: Vec::new(),
            },
            time: 0,
            extra: 0,
        };
        match s.advance(l, &trailer, &ids)? {
            Next::Record => heap.push(Reverse((s.time, i))),
            Next::Compressed => return Ok(None),
            Next::End => {}
        }
        sources.push(s);
    }
    let mut size = 0u64;
    while let Some(Reverse((_, i))) = heap.pop() {
        let s = &mut sources[i];
        w.write_all(&s.recs.buf).map_err(io)?;
        size += s.recs.buf.len() as u64;
        if s.extra > 0 {
            let n = std::io::copy(&mut (&mut s.recs.r).take(s.extra), &mut w).map_err(io)?;
            if n < s.extra {
                return Err(Error::format(
                    s.recs.at - s.extra + n,
                    "the data ends inside a record's out-of-band payload",
                )
                .in_file(&s.df.path));
            }
            size += n;
        }
        match s.advance(l, &trailer, &ids)? {
            Next::Record => heap.push(Reverse((s.time, i))),
            Next::Compressed => return Ok(None),
            Next::End => {}
        }
    }
    w.flush().map_err(io)?;
    Ok(Some(size))
}
