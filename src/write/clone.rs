//! Copies that share or move blocks instead of bytes where the filesystem allows:
//! a reflink (`FICLONE`: btrfs, XFS, bcachefs, OCFS2 share the extents, so a copy of
//! any size takes no time and no space until one side changes), and ranged copies
//! at different offsets (`copy_file_range`, else `pread`/`pwrite` in large steps).

use crate::{Error, Result};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;

/// `FICLONE` = `_IOW(0x94, 9, int)` (linux/fs.h).
const FICLONE: libc::c_ulong = 0x4004_9409;

/// Makes `dst` a reflink of `src` cut to `len` bytes. False (and `dst` untouched or
/// emptied) when the filesystem cannot: different filesystems, ext4, tmpfs, or a
/// kernel without the ioctl; the caller copies instead.
pub fn reflink(src: &File, dst: &File, len: u64) -> bool {
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

/// Copies `len` bytes from `src` at `from` to `dst` at `to` (offsets need not be
/// aligned or equal): copy_file_range in the kernel, else 1 MB reads and writes.
pub fn copy_range(src: &File, mut from: u64, dst: &File, mut to: u64, len: u64) -> Result<()> {
    let io = |e| Error::io("", e);
    let end = from + len;
    let mut kernel = true;
    while from < end {
        let step = (end - from).min(64 << 20) as usize;
        if kernel {
            let mut off_in = from as libc::loff_t;
            let mut off_out = to as libc::loff_t;
            // SAFETY: both descriptors are open; the offsets are ours.
            let n = unsafe {
                libc::copy_file_range(
                    src.as_raw_fd(),
                    &mut off_in,
                    dst.as_raw_fd(),
                    &mut off_out,
                    step,
                    0,
                )
            };
            if n > 0 {
                from += n as u64;
                to += n as u64;
                continue;
            }
            let err = std::io::Error::last_os_error();
            match (n, err.raw_os_error()) {
                (_, Some(libc::EINTR)) => continue,
                (0, _) => {
                    return Err(io(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "input shrank while copying",
                    )));
                }
                _ => kernel = false,
            }
            continue;
        }
        let mut buf = vec![0u8; step.min(1 << 20)];
        src.read_exact_at(&mut buf, from).map_err(io)?;
        dst.write_all_at(&buf, to).map_err(io)?;
        from += buf.len() as u64;
        to += buf.len() as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_range_shifts_bytes() {
        let dir = std::env::temp_dir().join(format!("pdinject-clone-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (a, b) = (dir.join("a"), dir.join("b"));
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&a, &data).unwrap();
        std::fs::write(&b, b"").unwrap();
        let src = File::open(&a).unwrap();
        let dst = std::fs::OpenOptions::new().write(true).open(&b).unwrap();
        copy_range(&src, 10, &dst, 42, 99_000).unwrap();
        let got = std::fs::read(&b).unwrap();
        assert_eq!(&got[42..], &data[10..99_010]);
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
