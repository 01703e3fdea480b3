//! A file input's records converted by the resolve itself ([`crate::resolve::Tap`]):
//! each chunk's converted bytes go to an unnamed temp file beside the output as the
//! chunk is done, in any order, and the sink copies them into the output in file
//! order. So each stack dump is read and unwound once (by the resolve, which counts
//! its hits from the same frames), and no more than one chunk's output per worker is
//! held in memory, whatever the size of the input.

use super::{Bufs, Converter, Counts, How};
use crate::format::walk::{Chunk, Rec};
use crate::resolve::unwind::{Frame, Outcome, Worker};
use crate::resolve::{ChunkTap, Tap};
use crate::{Error, Result};
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
    counts: Counts,
}

/// The spill: converted chunks, written as they are done.
#[derive(Debug)]
pub struct Spill {
    file: File,
    path: PathBuf,
    /// The spill's length, and its parts (a chunk converted again replaces its part:
    /// batches resolved beside the scan may be resolved again at its end).
    parts: Mutex<(u64, Vec<Part>)>,
}

impl Spill {
    /// An empty spill in `dir` (the output's directory: the spill is about 2-3 % of a
    /// DWARF input, and a temp directory on tmpfs would hold it in memory). Unnamed
    /// where the filesystem can (`O_TMPFILE`), else named and unlinked at once: a
    /// crash leaves nothing behind.
    pub(crate) fn new_in(dir: &Path) -> Result<Spill> {
        let file = tmpfile(dir).map_err(|e| Error::io(dir, e))?;
        Ok(Spill {
            file,
            path: dir.join("(unnamed --convert-callchain spill)"),
            parts: Mutex::new((0, Vec::new())),
        })
    }

    fn put(&self, c: &Chunk, bytes: &[u8], counts: Counts) -> Result<()> {
        let len = bytes.len() as u64;
        let at = {
            let mut g = self.lock()?;
            let at = g.0;
            g.0 += len;
            at
        };
        self.file
            .write_all_at(bytes, at)
            .map_err(|e| Error::io(&self.path, e))?;
        let mut g = self.lock()?;
        g.1.retain(|p| p.start != c.start);
        g.1.push(Part {
            start: c.start,
            end: c.end,
            at,
            len,
            counts,
        });
        Ok(())
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, (u64, Vec<Part>)>> {
        self.parts
            .lock()
            .map_err(|_| Error::Internal("a conversion worker panicked".into()))
    }

    /// Hands the converted records of `[from, to)` to `emit` in file order. The
    /// resolve's chunks tile the data; a range no part holds (which would go out
    /// unconverted, its attr saying it has no stack dumps) is an internal error.
    /// Returns what the conversion did.
    pub(crate) fn emit(
        &self,
        (from, to): (u64, u64),
        emit: &mut dyn FnMut(&[u8]) -> Result<()>,
    ) -> Result<Counts> {
        let mut parts = self.lock()?.1.clone();
        parts.sort_by_key(|p| p.start);
        let mut total = Counts::default();
        let mut pos = from;
        let mut buf = vec![0u8; 1 << 20];
        for p in &parts {
            if p.start != pos || p.end > to {
                return Err(Error::Internal(format!(
                    "conversion: the chunks converted do not tile the data (chunk {}..{}, expected one at {pos})",
                    p.start, p.end
                )));
            }
            let mut done = 0;
            while done < p.len {
                let n = (p.len - done).min(buf.len() as u64) as usize;
                self.file
                    .read_exact_at(&mut buf[..n], p.at + done)
                    .map_err(|e| Error::io(&self.path, e))?;
                emit(&buf[..n])?;
                done += n as u64;
            }
            total.merge(&p.counts);
            pos = p.end;
        }
        if pos != to {
            return Err(Error::Internal(format!(
                "conversion: the chunks converted end at {pos}, the data at {to}"
            )));
        }
        Ok(total)
    }
}

/// An unnamed file in `dir`: `O_TMPFILE`, or a fresh name unlinked at once.
fn tmpfile(dir: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let unnamed = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_TMPFILE)
        .mode(0o600)
        .open(dir);
    match unnamed {
        Ok(f) => Ok(f),
        Err(_) => {
            let mut n = 0u32;
            loop {
                let p = dir.join(format!(".pdi-spill-{}-{n}", std::process::id()));
                match std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&p)
                {
                    Ok(f) => {
                        std::fs::remove_file(&p)?;
                        return Ok(f);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 1000 => n += 1,
                    Err(e) => return Err(e),
                }
            }
        }
    }
}

/// The conversion as a [`Tap`] of the resolve, into a [`Spill`].
pub(crate) struct SpillTap<'a> {
    conv: Converter<'a>,
    spill: &'a Spill,
}

impl<'a> SpillTap<'a> {
    /// Converts the records of `attrs`, unwound as `how` says, into `spill`; Err when
    /// this host may not unwind them ([`Converter::with`]).
    pub(crate) fn new(
        spill: &'a Spill,
        how: How<'a, '_>,
        attrs: &[crate::format::attr::Attr],
        e: crate::format::Endian,
    ) -> Result<Self> {
        Ok(SpillTap {
            conv: Converter::with(how, attrs, e, &[])?,
            spill,
        })
    }
}

impl Tap for SpillTap<'_> {
    fn chunk<'t>(&'t self, c: &Chunk) -> Box<dyn ChunkTap + 't> {
        Box::new(ChunkSpill {
            tap: self,
            chunk: c.clone(),
            out: Vec::with_capacity(((c.end - c.start) / 16) as usize),
            counts: Counts::default(),
            bufs: Bufs::default(),
        })
    }
}

struct ChunkSpill<'t, 'a> {
    tap: &'t SpillTap<'a>,
    chunk: Chunk,
    out: Vec<u8>,
    counts: Counts,
    bufs: Bufs,
}

impl ChunkTap for ChunkSpill<'_, '_> {
    fn record(
        &mut self,
        r: &Rec<'_>,
        w: Option<&mut Worker>,
        frames: &mut Vec<Frame>,
    ) -> Result<Option<Outcome>> {
        let o = self
            .tap
            .conv
            .record(r, &mut self.out, &mut self.counts, w, &mut self.bufs)?;
        // The resolve counts its hits from the same frames.
        std::mem::swap(frames, &mut self.bufs.frames);
        Ok(o)
    }

    fn done(self: Box<Self>) -> Result<()> {
        self.tap.spill.put(&self.chunk, &self.out, self.counts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(start: u64, end: u64) -> Chunk {
        Chunk {
            file: 0,
            start,
            end,
            first_seq: 0,
        }
    }

    fn emitted(spill: &Spill, range: (u64, u64)) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        spill.emit(range, &mut |b| {
            out.extend_from_slice(b);
            Ok(())
        })?;
        Ok(out)
    }

    /// Chunks done in any order come out in file order, a chunk converted again
    /// replaces its first conversion, and a chunk that is missing is an error, never
    /// a range passed on unconverted.
    #[test]
    fn parts_come_out_in_file_order_and_must_tile_the_data() {
        let dir = tempfile::tempdir().unwrap();
        let spill = Spill::new_in(dir.path()).unwrap();
        // Unnamed: nothing in the directory.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        let n = Counts {
            samples: 1,
            ..Counts::default()
        };
        spill.put(&chunk(20, 30), b"cc", n.clone()).unwrap();
        spill.put(&chunk(0, 10), b"a", n.clone()).unwrap();
        spill.put(&chunk(10, 20), b"stale", n.clone()).unwrap();
        spill.put(&chunk(10, 20), b"bbb", n.clone()).unwrap();
        assert_eq!(emitted(&spill, (0, 30)).unwrap(), b"abbbcc");
        let mut counts = Counts::default();
        spill
            .emit((0, 30), &mut |_| Ok(()))
            .map(|c| counts = c)
            .unwrap();
        assert_eq!(counts.samples, 3);
        // The data goes on past the last chunk, or starts before the first.
        assert!(emitted(&spill, (0, 40)).is_err());
        let gap = Spill::new_in(dir.path()).unwrap();
        gap.put(&chunk(0, 10), b"a", n.clone()).unwrap();
        gap.put(&chunk(20, 30), b"c", n).unwrap();
        assert!(emitted(&gap, (0, 30)).is_err());
    }
}
