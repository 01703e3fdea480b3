//! A `perf record -z` recording without its compression: each COMPRESSED record
//! replaced by the records it holds. `--jit` puts the jitdumps' records between the
//! recording's own by time, which compressed data cannot take; so, as `perf inject`
//! does, a compressed recording comes out of `--jit` uncompressed. Every other
//! record is copied byte for byte, with its out-of-band payload (AUX data).

use super::Layout;
use crate::format::Endian;
use crate::format::record::{out_of_band_len, rt};
use crate::format::walk::Walker;
use crate::input::{Backing, DataFile};
use crate::{Error, Result};
use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Bytes of the recording read at a time.
const WINDOW: u64 = 64 << 20;

/// Writes `src` (laid out as `l`) to `out` with its compressed records expanded.
pub(super) fn decompress(src: &Path, l: &Layout, out: &Path) -> Result<()> {
    let io = |e| Error::io(out, e);
    let e = l.endian;
    let (from, to) = l.data;
    // What precedes the data: the file header and attrs, or a stream's pipe header.
    crate::write::copy_prefix(src, out, from, &std::sync::atomic::AtomicBool::new(false))?;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(out)
        .map_err(io)?;
    f.set_len(from).map_err(io)?;
    let mut w = BufWriter::with_capacity(1 << 20, &f);
    (&f).seek(SeekFrom::Start(from)).map_err(io)?;
    let backing = File::open(src).map_err(|e| Error::io(src, e))?;
    let df = DataFile::new(
        src.to_path_buf(),
        Backing::File(backing),
        crate::format::header::Section {
            offset: from,
            size: to - from,
        },
    );
    let size = expand(&df, l.endian, &mut w, out)?;
    w.flush().map_err(io)?;
    drop(w);
    if !l.stream {
        // The feature sections after the new data; the header's data size.
        let input = crate::input::PerfInput::open(src)?;
        crate::write::write_tail_at(&input, out, None, from + size)?;
        f.write_all_at(&e.put_u64(size), 48).map_err(io)?;
    }
    Ok(())
}

/// Writes the records of `df` to `w` (a file at `out`) with its compressed records
/// expanded; returns the bytes written.
pub(super) fn expand(df: &DataFile, e: Endian, w: &mut impl Write, out: &Path) -> Result<u64> {
    let (from, to) = (df.range.offset, df.range.offset + df.range.size);
    let mut size = 0u64;
    let mut walker = Walker::new(e, 0);
    let mut failed = None;
    walker
        .walk(
            df,
            from,
            to,
            WINDOW,
            &mut |r| {
                if matches!(r.header.kind, rt::COMPRESSED | rt::COMPRESSED2) {
                    return Ok(());
                }
                let oob = out_of_band_len(&r.header, r.bytes.get(8..).unwrap_or(&[]), e)
                    .unwrap_or(0);
                if r.inner && oob > 0 {
                    return Err(Error::unsupported(
                        "--jit: a compressed record holds a record with out-of-band data (AUX), which perf never writes",
                    ));
                }
                w.write_all(r.bytes).map_err(|err| {
                    failed = Some(Error::io(out, err));
                    Error::Stopped
                })?;
                size += r.bytes.len() as u64;
                if oob > 0 {
                    let payload = df.window(r.offset + r.bytes.len() as u64, oob)?;
                    w.write_all(&payload).map_err(|err| {
                        failed = Some(Error::io(out, err));
                        Error::Stopped
                    })?;
                    size += oob;
                }
                Ok(())
            },
            &mut |_, _| Ok(()),
        )
        .map_err(|err| failed.take().unwrap_or(err).in_file(&df.path))?;
    Ok(size)
}
