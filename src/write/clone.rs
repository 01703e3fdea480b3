//! Copies that share or move blocks instead of bytes where the filesystem allows:
//! a reflink (`FICLONE`: btrfs, XFS, bcachefs, OCFS2 share the extents, so a copy of
//! any size takes no time and no space until one side changes), and bytes written
//! at other offsets than they were read from (direct I/O where it can).

use crate::error::{Error, Result};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;

/// `FICLONE` = `_IOW(0x94, 9, int)` (linux/fs.h).
const FICLONE: libc::c_ulong = 0x4004_9409;

/// Makes `dst` a reflink of `src` cut to `len` bytes. False (and `dst` untouched or
/// emptied) when the filesystem cannot: different filesystems, ext4, tmpfs, or a
/// kernel without the ioctl; the caller copies instead.
pub(crate) fn reflink(src: &File, dst: &File, len: u64) -> bool {
    // SAFETY: FICLONE takes the source descriptor as its argument; both are open.
    let r = unsafe { libc::ioctl(dst.as_raw_fd(), FICLONE as _, src.as_raw_fd()) };
    if r != 0 {
        return false;
    }
    // The clone is the whole input; what follows the copied prefix is rewritten by
    // the caller, so the clone is cut there (its extents stay shared).
    if dst.set_len(len).is_err() {
        let _ = dst.set_len(0);
        return false;
    }
    true
}

/// One part of an output range: bytes of the source file, or bytes in memory.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Piece<'a> {
    /// `len` bytes of the source at `at`.
    Src {
        /// Offset in the source.
        at: u64,
        /// Bytes.
        len: u64,
    },
    /// These bytes.
    Bytes(&'a [u8]),
}

impl Piece<'_> {
    fn len(&self) -> u64 {
        match self {
            Piece::Src { len, .. } => *len,
            Piece::Bytes(b) => b.len() as u64,
        }
    }
}

const BLOCK: u64 = 4096;
const STEP: usize = 16 << 20;

/// Fills `buf` with the output bytes at `out` (relative to the start of `pieces`).
fn fill(
    (src, name): (&File, &std::path::Path),
    pieces: &[Piece<'_>],
    starts: &[u64],
    out: u64,
    buf: &mut [u8],
) -> Result<()> {
    let end = out + buf.len() as u64;
    let mut i = starts.partition_point(|&s| s <= out).saturating_sub(1);
    let mut pos = out;
    while pos < end && i < pieces.len() {
        let (start, p) = (starts[i], pieces[i]);
        let from = pos - start;
        let n = (p.len() - from).min(end - pos) as usize;
        let dst = &mut buf[(pos - out) as usize..(pos - out) as usize + n];
        match p {
            Piece::Src { at, .. } => src
                .read_exact_at(dst, at + from)
                .map_err(|e| Error::io(name, e))?,
            Piece::Bytes(b) => dst.copy_from_slice(&b[from as usize..from as usize + n]),
        }
        pos += n as u64;
        i += 1;
    }
    Ok(())
}

/// Writes `pieces` (of `src`, named for messages), one after the other, into `dst`
/// from offset `at`. Whole 4 KiB
/// blocks go out with O_DIRECT from an aligned buffer read from the (cached)
/// source, so the output's pages are not copied into the page cache a second time
/// (the direct copy of [`super::copy_prefix`], for bytes that moved); the unaligned
/// ends, and everything where O_DIRECT is refused (tmpfs), are ordinary writes.
pub(crate) fn write_pieces(
    src: (&File, &std::path::Path),
    dst: &std::path::Path,
    at: u64,
    pieces: &[Piece<'_>],
) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let io = |e| Error::io(dst, e);
    let mut starts = Vec::with_capacity(pieces.len());
    let mut total = 0u64;
    for p in pieces {
        starts.push(total);
        total += p.len();
    }
    let end = at + total;
    let buffered = std::fs::OpenOptions::new()
        .write(true)
        .open(dst)
        .map_err(io)?;
    let plain = |from: u64, to: u64| -> Result<()> {
        let mut pos = from;
        while pos < to {
            let n = (to - pos).min(STEP as u64) as usize;
            let mut buf = vec![0u8; n];
            fill(src, pieces, &starts, pos - at, &mut buf)?;
            buffered.write_all_at(&buf, pos).map_err(io)?;
            pos += n as u64;
        }
        Ok(())
    };
    let a = at.next_multiple_of(BLOCK);
    let b = end - end % BLOCK;
    let direct = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(dst)
        .ok()
        .filter(|f| !super::is_tmpfs(f));
    let Some(direct) = direct.filter(|_| a < b) else {
        return plain(at, end);
    };
    plain(at, a)?;
    let mut raw = vec![0u8; STEP + BLOCK as usize];
    let skip = raw.as_ptr().align_offset(BLOCK as usize);
    let buf = &mut raw[skip..skip + STEP];
    let mut pos = a;
    while pos < b {
        let n = (b - pos).min(STEP as u64) as usize;
        fill(src, pieces, &starts, pos - at, &mut buf[..n])?;
        match direct.write_at(&buf[..n], pos) {
            Ok(w) if w == n => pos += n as u64,
            // A short or refused direct write: the rest goes the ordinary way.
            _ => break,
        }
    }
    plain(pos, end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_land_shifted_whatever_the_alignment() {
        let dir = std::env::temp_dir().join(format!("pdinject-clone-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (a, b) = (dir.join("a"), dir.join("b"));
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&a, &data).unwrap();
        let src = File::open(&a).unwrap();
        for at in [0u64, 10, 4096, 5000] {
            std::fs::write(&b, vec![7u8; at as usize]).unwrap();
            let pieces = [
                Piece::Src { at: 3, len: 5000 },
                Piece::Bytes(b"0123456789abcdef0123456789abcdef"),
                Piece::Src {
                    at: 5003,
                    len: 290_000,
                },
                Piece::Bytes(b"end"),
            ];
            write_pieces((&src, &a), &b, at, &pieces).unwrap();
            let got = std::fs::read(&b).unwrap();
            let mut want = vec![7u8; at as usize];
            want.extend_from_slice(&data[3..5003]);
            want.extend_from_slice(b"0123456789abcdef0123456789abcdef");
            want.extend_from_slice(&data[5003..295_003]);
            want.extend_from_slice(b"end");
            assert!(got == want, "at {at}");
        }
        // A reflink either works or leaves the copy to the caller.
        let dst2 = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.join("c"))
            .unwrap();
        if reflink(&src, &dst2, 500) {
            assert_eq!(std::fs::read(dir.join("c")).unwrap(), &data[..500]);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
