//! Resolving compressed data. perf keeps one zstd frame open for the whole recording
//! (`ZSTD_flushStream` per ring-buffer push, never the end of a frame), so no point
//! inside compressed data is one a second decompressor could start from: the scan's
//! chunks would be one chunk the size of the data. Instead one walker decompresses
//! the range in order (going on across a stream's batches) and copies each sample
//! into plain chunks of about [`CHUNK_BYTES`]; every other record becomes an 8-byte
//! placeholder, so records keep the numbers the scan gave them. Groups of chunks are
//! resolved in parallel as they fill: memory holds one group, whatever the file.

use super::CHUNK_BYTES;
use crate::error::{Error, Result};
use crate::format::Endian;
use crate::format::header::Section;
use crate::format::record::rt;
use crate::format::walk::{Chunk, Walker};
use crate::input::{Backing, DataFile};
use crate::resolve::{Hits, Resolver};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

/// The type of a placeholder record (not one perf defines; never a SAMPLE).
const PLACEHOLDER: u32 = u32::MAX;

/// Window of a data file read at once.
const WINDOW: u64 = 64 << 20;

/// Resolves the contiguous `chunks` (per data file) through `walker`, flattened.
pub(super) fn resolve(
    pool: &rayon::ThreadPool,
    resolver: &Resolver<'_>,
    walker: &mut Walker,
    files: &[DataFile],
    chunks: &[Chunk],
    stop: &AtomicBool,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<Hits> {
    let group = 2 * pool.current_num_threads().max(1);
    let mut total = Hits::default();
    let mut start = 0;
    while start < chunks.len() {
        // The chunks of one data file, in order.
        let fi = chunks[start].file;
        let end = chunks[start..]
            .iter()
            .position(|c| c.file != fi)
            .map_or(chunks.len(), |n| start + n);
        let (from, to) = (chunks[start].start, chunks[end - 1].end);
        let df = files
            .get(fi)
            .ok_or_else(|| Error::Internal("chunk of an unknown data file".into()))?;
        if walker.seq != chunks[start].first_seq {
            *walker = Walker::new(walker.endian(), chunks[start].first_seq);
        } else if start > 0 {
            // The next file of a directory, numbered on from the last: a zstd stream
            // of its own (a stream's batches, one file, go on in the same walker).
            walker.begin_file();
        }
        let flat = std::cell::RefCell::new(Flat::new(walker.seq, from, walker.endian()));
        let mut ready: Vec<(Arc<Vec<u8>>, u64, u64)> = Vec::new();
        let mut done_to = from;
        let mut resolve_ready =
            |ready: &mut Vec<(Arc<Vec<u8>>, u64, u64)>, upto: u64| -> Result<()> {
                if ready.is_empty() {
                    return Ok(());
                }
                let files: Vec<DataFile> = ready
                    .iter()
                    .map(|(b, _, at)| {
                        DataFile::new(
                            df.path.clone(),
                            Backing::Mem(b.clone(), *at),
                            Section {
                                offset: *at,
                                size: b.len() as u64,
                            },
                        )
                    })
                    .collect();
                let cs: Vec<Chunk> = ready
                    .iter()
                    .enumerate()
                    .map(|(i, (b, seq, at))| Chunk {
                        file: i,
                        start: *at,
                        end: *at + b.len() as u64,
                        first_seq: *seq,
                    })
                    .collect();
                let hits = pool.install(|| resolver.run(&files, &cs, &|_| {}, stop, None))?;
                total.merge(hits);
                progress(upto - done_to);
                done_to = upto;
                ready.clear();
                Ok(())
            };
        walker
            .walk(
                df,
                from,
                to,
                WINDOW,
                &mut |r| {
                    flat.borrow_mut().push(r.header.kind, r.bytes, r.offset);
                    Ok(())
                },
                &mut |_, next| {
                    let mut f = flat.borrow_mut();
                    if f.buf.len() as u64 >= CHUNK_BYTES {
                        ready.push(f.take(next));
                        if ready.len() >= group {
                            // The resolve's own error ends the walk as it is.
                            resolve_ready(&mut ready, next)?;
                        }
                    }
                    Ok(())
                },
            )
            .map_err(|e| e.in_file(&df.path))?;
        let mut f = flat.into_inner();
        if !f.buf.is_empty() {
            ready.push(f.take(to));
        }
        resolve_ready(&mut ready, to)?;
        start = end;
    }
    Ok(total)
}

/// Plain records being collected.
struct Flat {
    buf: Vec<u8>,
    /// Number of the first record in `buf`.
    seq: u64,
    /// Offset of the outer record the first record of `buf` came from.
    at: u64,
    count: u64,
    placeholder: [u8; 8],
}

impl Flat {
    fn new(seq: u64, at: u64, e: Endian) -> Self {
        let mut placeholder = [0u8; 8];
        placeholder[..4].copy_from_slice(&e.put_u32(PLACEHOLDER));
        placeholder[6..].copy_from_slice(&e.put_u16(8));
        Flat {
            buf: Vec::with_capacity(CHUNK_BYTES as usize + (1 << 16)),
            seq,
            at,
            count: 0,
            placeholder,
        }
    }

    /// Takes a record: a sample whole, anything else as a placeholder.
    fn push(&mut self, kind: u32, bytes: &[u8], offset: u64) {
        if self.count == 0 {
            self.at = offset;
        }
        self.count += 1;
        // A deferred user callchain is resolved as a sample is.
        if kind == rt::SAMPLE || kind == rt::CALLCHAIN_DEFERRED {
            self.buf.extend_from_slice(bytes);
        } else {
            self.buf.extend_from_slice(&self.placeholder);
        }
    }

    /// The chunk collected so far; the next starts after it.
    fn take(&mut self, next: u64) -> (Arc<Vec<u8>>, u64, u64) {
        let b = std::mem::replace(
            &mut self.buf,
            Vec::with_capacity(CHUNK_BYTES as usize + (1 << 16)),
        );
        let out = (Arc::new(b), self.seq, self.at);
        self.seq += self.count;
        self.count = 0;
        self.at = next;
        out
    }
}
