//! The records the resolve converts ([`crate::resolve::Rewrite`]): each chunk's
//! converted bytes go to the spill as the chunk is done, in any order, and the sink
//! takes them in data order. A file input spills into an unnamed temp file beside
//! the output (about 2-3 % of a DWARF input; no more than one chunk's output per
//! worker is held in memory, whatever the input's size); a stream's batch spills into
//! memory and is taken whole before the next batch is resolved.
//!
//! Each part keeps its chunk's first record number: the converter writes one record
//! for each it takes, so a sink that edits the data (build-ID mapping records,
//! `--jit`'s records) walks a part's records by the numbers the scan gave them.

use super::{Converter, Counts};
use crate::error::{Error, Result};
use crate::format::walk::{Chunk, Rec};
use crate::resolve::{ChunkRewrite, Decoded, Rewrite};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// One chunk's converted bytes in the spill.
#[derive(Clone, Debug)]
struct Part {
    /// The chunk's input range.
    start: u64,
    end: u64,
    /// Where its output lies in the spill, and its length.
    at: u64,
    len: u64,
    /// The number of the chunk's first record.
    first_seq: u64,
    counts: Counts,
}

/// Where the spilled bytes are kept.
#[derive(Debug)]
enum Backing {
    /// An unnamed temp file (a file input).
    File(File, PathBuf),
    /// Memory (a stream's batch).
    Memory(Mutex<Vec<u8>>),
}

/// The spill: converted chunks, written as they are done.
#[derive(Debug)]
pub(crate) struct Spill {
    backing: Backing,
    /// The spill's length, and its parts (a chunk converted again replaces its part:
    /// batches resolved beside the scan may be resolved again at its end).
    parts: Mutex<(u64, Vec<Part>)>,
}

impl Spill {
    /// An empty spill in `dir` (the output's directory: a temp directory on tmpfs
    /// would hold it in memory), unnamed, so a crash leaves nothing behind.
    pub(crate) fn new_in(dir: &Path) -> Result<Spill> {
        let file = tempfile::tempfile_in(dir).map_err(|e| Error::io(dir, e))?;
        Ok(Self::with(Backing::File(
            file,
            dir.join("(unnamed --convert-callchain spill)"),
        )))
    }

    /// An empty spill in memory, for one batch at a time.
    pub(crate) fn in_memory() -> Spill {
        Self::with(Backing::Memory(Mutex::new(Vec::new())))
    }

    fn with(backing: Backing) -> Spill {
        Spill {
            backing,
            parts: Mutex::new((0, Vec::new())),
        }
    }

    fn put(&self, c: &Chunk, bytes: &[u8], counts: Counts) -> Result<()> {
        let len = bytes.len() as u64;
        let at = match &self.backing {
            Backing::File(file, path) => {
                let at = {
                    let mut g = self.lock()?;
                    let at = g.0;
                    g.0 += len;
                    at
                };
                file.write_all_at(bytes, at)
                    .map_err(|e| Error::io(path, e))?;
                at
            }
            Backing::Memory(m) => {
                let mut buf = m.lock().map_err(|_| poisoned())?;
                let at = buf.len() as u64;
                buf.extend_from_slice(bytes);
                at
            }
        };
        let mut g = self.lock()?;
        g.1.retain(|p| p.start != c.start);
        g.1.push(Part {
            start: c.start,
            end: c.end,
            at,
            len,
            first_seq: c.first_seq,
            counts,
        });
        Ok(())
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, (u64, Vec<Part>)>> {
        self.parts.lock().map_err(|_| poisoned())
    }

    fn read(&self, p: &Part, from: u64, buf: &mut [u8]) -> Result<()> {
        match &self.backing {
            Backing::File(file, path) => file
                .read_exact_at(buf, p.at + from)
                .map_err(|e| Error::io(path, e)),
            Backing::Memory(m) => {
                let all = m.lock().map_err(|_| poisoned())?;
                let a = (p.at + from) as usize;
                let src = all
                    .get(a..a + buf.len())
                    .ok_or_else(|| Error::Internal("conversion: a part beyond its spill".into()))?;
                buf.copy_from_slice(src);
                Ok(())
            }
        }
    }

    /// Hands the converted records of `[from, to)` to `each` in data order, a part
    /// (one chunk's records) at a time with the number of its first record. The
    /// resolve's chunks tile the data; a range no part holds (which would go out
    /// unconverted, its attr saying it has no stack dumps) is an internal error.
    /// Returns what the conversion did. The parts taken leave a spill in memory
    /// (the next batch's).
    pub(crate) fn take(
        &self,
        (from, to): (u64, u64),
        each: &mut dyn FnMut(&[u8], u64) -> Result<()>,
    ) -> Result<Counts> {
        let mut parts: Vec<Part> = {
            let mut g = self.lock()?;
            let (taken, kept) = g.1.drain(..).partition(|p| p.start >= from && p.end <= to);
            g.1 = kept;
            taken
        };
        parts.sort_by_key(|p| p.start);
        let mut total = Counts::default();
        let mut pos = from;
        let mut buf = Vec::new();
        for p in &parts {
            if p.start != pos {
                return Err(Error::Internal(format!(
                    "conversion: the chunks converted do not tile the data (chunk {}..{}, expected one at {pos})",
                    p.start, p.end
                )));
            }
            buf.resize(p.len as usize, 0);
            self.read(p, 0, &mut buf)?;
            each(&buf, p.first_seq)?;
            total.merge(&p.counts);
            pos = p.end;
        }
        if pos != to {
            return Err(Error::Internal(format!(
                "conversion: the chunks converted end at {pos}, the data at {to}"
            )));
        }
        if let Backing::Memory(m) = &self.backing
            && self.lock()?.1.is_empty()
        {
            m.lock().map_err(|_| poisoned())?.clear();
        }
        Ok(total)
    }
}

fn poisoned() -> Error {
    Error::Internal("a conversion worker panicked".into())
}

/// The conversion as a [`Rewrite`] of the resolve, into a [`Spill`].
pub(crate) struct SpillTap<'a> {
    conv: Converter<'a>,
    spill: &'a Spill,
}

impl<'a> SpillTap<'a> {
    /// Converts with `conv` into `spill`.
    pub(crate) fn new(spill: &'a Spill, conv: Converter<'a>) -> Self {
        SpillTap { conv, spill }
    }
}

impl Rewrite for SpillTap<'_> {
    fn wants_frames(&self) -> bool {
        true
    }

    fn chunk<'t>(&'t self, c: &Chunk) -> Box<dyn ChunkRewrite + 't> {
        Box::new(ChunkSpill {
            tap: self,
            chunk: c.clone(),
            out: Vec::with_capacity(((c.end - c.start) / 16) as usize),
            counts: Counts::default(),
            chain: Vec::new(),
        })
    }
}

struct ChunkSpill<'t, 'a> {
    tap: &'t SpillTap<'a>,
    chunk: Chunk,
    out: Vec<u8>,
    counts: Counts,
    chain: Vec<u64>,
}

impl ChunkRewrite for ChunkSpill<'_, '_> {
    fn record(&mut self, r: &Rec<'_>, s: Option<&Decoded<'_, '_>>) -> Result<()> {
        self.tap
            .conv
            .record(r, s, &mut self.out, &mut self.counts, &mut self.chain)
    }

    fn done(self: Box<Self>) -> Result<()> {
        let ChunkSpill {
            tap,
            chunk,
            out,
            counts,
            ..
        } = *self;
        tap.spill.put(&chunk, &out, counts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(start: u64, end: u64, first_seq: u64) -> Chunk {
        Chunk {
            file: 0,
            start,
            end,
            first_seq,
        }
    }

    fn taken(spill: &Spill, range: (u64, u64)) -> Result<(Vec<u8>, Vec<u64>)> {
        let (mut out, mut seqs) = (Vec::new(), Vec::new());
        spill.take(range, &mut |b, seq| {
            out.extend_from_slice(b);
            seqs.push(seq);
            Ok(())
        })?;
        Ok((out, seqs))
    }

    /// Chunks done in any order come out in data order with their first record
    /// numbers, a chunk converted again replaces its first conversion, and a chunk
    /// that is missing is an error, never a range passed on unconverted.
    #[test]
    fn parts_come_out_in_data_order_and_must_tile_the_data() {
        let dir = tempfile::tempdir().unwrap();
        for spill in [Spill::new_in(dir.path()).unwrap(), Spill::in_memory()] {
            // Unnamed: nothing in the directory.
            assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
            let n = Counts {
                samples: 1,
                ..Counts::default()
            };
            spill.put(&chunk(20, 30, 7), b"cc", n.clone()).unwrap();
            spill.put(&chunk(0, 10, 0), b"a", n.clone()).unwrap();
            spill.put(&chunk(10, 20, 3), b"stale", n.clone()).unwrap();
            spill.put(&chunk(10, 20, 3), b"bbbb", n.clone()).unwrap();
            let (got, seqs) = taken(&spill, (0, 30)).unwrap();
            assert_eq!(got, b"abbbbcc");
            assert_eq!(seqs, [0, 3, 7]);
        }
        let spill = Spill::in_memory();
        let n = Counts::default();
        spill.put(&chunk(0, 10, 0), b"a", n.clone()).unwrap();
        // The data goes on past the last chunk.
        assert!(taken(&spill, (0, 40)).is_err());
        let gap = Spill::in_memory();
        gap.put(&chunk(0, 10, 0), b"a", n.clone()).unwrap();
        gap.put(&chunk(20, 30, 9), b"c", n).unwrap();
        assert!(taken(&gap, (0, 30)).is_err());
    }
}
