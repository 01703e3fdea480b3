//! The write stage for file output: everything before the end of the data section is
//! copied verbatim (kernel side, with copy_file_range, while the other stages run);
//! then the feature table is rebuilt with BUILD_ID merged in and every other feature
//! copied byte for byte. Output goes to a temp file renamed over the target on
//! success, so an error never leaves a partial output.

pub mod clone;
pub mod inplace;

use crate::format::header::{FEAT_BUILD_ID, FileHeader};
use crate::input::PerfInput;
use crate::{Error, Result};
use std::fs::File;
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// A temp file or directory beside the output, removed on drop unless committed.
pub struct TempOutput {
    /// The temp path.
    pub path: PathBuf,
    /// Where it goes on success.
    pub target: PathBuf,
    is_dir: bool,
    committed: bool,
}

impl TempOutput {
    /// Creates the temp file (or directory) for `target`.
    pub fn create(target: &Path, is_dir: bool) -> Result<TempOutput> {
        let dir = match target.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name = target
            .file_name()
            .ok_or_else(|| {
                Error::Usage(format!("{}: output is not a file name", target.display()))
            })?
            .to_string_lossy()
            .into_owned();
        let path = dir.join(format!(".{name}.pdinject-{}.tmp", std::process::id()));
        let _ = if is_dir {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        let r = if is_dir {
            std::fs::create_dir(&path)
        } else {
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
                .map(|_| ())
        };
        r.map_err(|source| Error::Output {
            path: target.to_path_buf(),
            source,
        })?;
        if !is_dir {
            interrupt::watch(&path);
        }
        Ok(TempOutput {
            path,
            target: target.to_path_buf(),
            is_dir,
            committed: false,
        })
    }

    /// The file to write the header file into.
    pub fn header_file_path(&self) -> PathBuf {
        if self.is_dir {
            self.path.join("data")
        } else {
            self.path.clone()
        }
    }

    /// Moves the finished output into place.
    pub fn commit(mut self) -> Result<()> {
        if self.is_dir && self.target.is_dir() {
            // Replace an earlier output directory only if it is a perf.data directory.
            if !self.target.join("data").is_file() {
                return Err(Error::Usage(format!(
                    "{}: exists and is not a perf.data directory; not replacing it",
                    self.target.display()
                )));
            }
            std::fs::remove_dir_all(&self.target).map_err(|e| Error::io(&self.target, e))?;
        }
        std::fs::rename(&self.path, &self.target).map_err(|source| Error::Output {
            path: self.target.clone(),
            source,
        })?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for TempOutput {
    fn drop(&mut self) {
        interrupt::unwatch();
        if !self.committed {
            let _ = if self.is_dir {
                std::fs::remove_dir_all(&self.path)
            } else {
                std::fs::remove_file(&self.path)
            };
        }
    }
}

const COPY_STEP: u64 = 64 << 20;

/// Copies below this size go through the page cache; above it, direct I/O first.
const DIRECT_MIN: u64 = 32 << 20;

/// Copies the page-aligned start of `src` to `dst` with O_DIRECT writes straight from a
/// read-only map of the input: the input's cached pages go to the device without
/// being copied into new page-cache pages, which on a large file is what the time
/// goes into (measured here: 4.7 GB in 3 s this way, 10–15 s with copy_file_range).
/// Returns how many bytes it copied; 0 when the filesystem refuses O_DIRECT.
fn copy_direct(i: &File, dst: &Path, len: u64, cancel: &AtomicBool) -> Result<u64> {
    use std::os::unix::fs::OpenOptionsExt;
    let Ok(o) = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(dst)
    else {
        return Ok(0);
    };
    // tmpfs takes O_DIRECT but copies like a buffered write, page fault by page
    // fault from the map: the ordinary copy is faster there.
    if is_tmpfs(&o) {
        return Ok(0);
    }
    let aligned = len - len % 4096;
    let mut done = 0u64;
    while done < aligned {
        if cancel.load(Ordering::Relaxed) {
            return Ok(done);
        }
        let step = (aligned - done).min(COPY_STEP);
        // SAFETY: read-only map of a range inside the input; a concurrent truncation
        // makes write() fail with EFAULT rather than fault this process.
        let map = match unsafe {
            memmap2::MmapOptions::new()
                .offset(done)
                .len(step as usize)
                .populate()
                .map(i)
        } {
            Ok(m) => m,
            Err(_) => return Ok(done),
        };
        match o.write_at(&map, done) {
            Ok(n) if n > 0 && (n as u64).is_multiple_of(4096) => done += n as u64,
            // EINVAL and friends: this filesystem or device does not take direct
            // writes (or a short write left the offset unaligned); the caller
            // continues with ordinary copies from `done`.
            _ => return Ok(done),
        }
    }
    Ok(done)
}

pub(crate) fn is_tmpfs(f: &File) -> bool {
    use std::os::fd::AsRawFd;
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    // SAFETY: fstatfs fills the struct on success.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    unsafe { libc::fstatfs(f.as_raw_fd(), &mut st) == 0 && st.f_type as i64 == TMPFS_MAGIC }
}

/// Copies `len` bytes from the start of `src` to the start of `dst` inside the kernel
/// (direct I/O for large copies, else copy_file_range, else sendfile, else
/// read/write), in steps so a cancelled run stops early.
pub fn copy_prefix(src: &Path, dst: &Path, len: u64, cancel: &AtomicBool) -> Result<()> {
    use std::os::fd::AsRawFd;
    let i = File::open(src).map_err(|e| Error::io(src, e))?;
    let o = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(dst)
        .map_err(|e| Error::io(dst, e))?;
    // perf.data can hold secrets (paths, command lines, stacks): keep the input's mode.
    if let Ok(m) = i.metadata() {
        let _ = o.set_permissions(m.permissions());
    }
    if clone::reflink(&i, &o, len) {
        return Ok(());
    }
    let (fi, fo) = (i.as_raw_fd(), o.as_raw_fd());
    let mut done = if len >= DIRECT_MIN {
        copy_direct(&i, dst, len, cancel)?
    } else {
        0
    };
    let mut method = 0u8; // 0 copy_file_range, 1 sendfile, 2 read/write
    while done < len {
        if cancel.load(Ordering::Relaxed) {
            return Ok(());
        }
        let step = (len - done).min(COPY_STEP) as usize;
        let n: isize = match method {
            0 => {
                let mut off_in = done as libc::loff_t;
                let mut off_out = done as libc::loff_t;
                // SAFETY: both fds are open; the offsets are ours.
                unsafe { libc::copy_file_range(fi, &mut off_in, fo, &mut off_out, step, 0) }
            }
            1 => {
                let mut off_in = done as libc::off_t;
                // SAFETY: as above; sendfile writes at the output's file position.
                unsafe {
                    if libc::lseek(fo, done as libc::off_t, libc::SEEK_SET) < 0 {
                        -1
                    } else {
                        libc::sendfile(fo, fi, &mut off_in, step)
                    }
                }
            }
            _ => {
                let mut buf = vec![0u8; step.min(1 << 20)];
                let n = i.read_at(&mut buf, done).map_err(|e| Error::io(src, e))?;
                o.write_all_at(&buf[..n], done)
                    .map_err(|e| Error::io(dst, e))?;
                n as isize
            }
        };
        if n < 0 {
            let err = std::io::Error::last_os_error();
            match err.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(
                    libc::EXDEV | libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP | libc::EBADF,
                ) if method < 2 => {
                    method += 1;
                    continue;
                }
                _ => return Err(Error::io(dst, err)),
            }
        }
        if n == 0 {
            return Err(Error::io(
                src,
                std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "input shrank while copying",
                ),
            ));
        }
        done += n as u64;
    }
    Ok(())
}

/// Writes the feature table and payloads after the copied data, relocating any attrs
/// or ids that lived there, and patches the header. `build_id_payload` replaces the
/// BUILD_ID section (which is then set in the bitmap).
pub fn write_tail(
    input: &PerfInput,
    out_path: &Path,
    build_id_payload: Option<&[u8]>,
) -> Result<()> {
    let h: &FileHeader = &input.header;
    let e = h.endian;
    let src = &input.data_files[0];
    let io = |err| Error::io(out_path, err);
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .open(out_path)
        .map_err(io)?;
    let data_end = h.feature_table_offset();
    let mut features = h.features;
    if build_id_payload.is_some() {
        features[0] |= 1 << FEAT_BUILD_ID;
    }
    let bits: Vec<u32> = (0..256u32)
        .filter(|&b| features[(b / 64) as usize] & (1 << (b % 64)) != 0)
        .collect();
    out.set_len(data_end).map_err(io)?;
    out.seek(SeekFrom::Start(data_end)).map_err(io)?;
    let mut w = std::io::BufWriter::new(&mut out);
    let mut pos = data_end + 16 * bits.len() as u64;
    let mut payloads = Vec::with_capacity(bits.len());
    for &bit in &bits {
        let payload = if bit == FEAT_BUILD_ID && build_id_payload.is_some() {
            build_id_payload.map(|p| p.to_vec()).unwrap_or_default()
        } else {
            let (_, s) = input
                .features
                .iter()
                .find(|(b, _)| *b == bit)
                .ok_or_else(|| Error::format(data_end, format!("feature {bit} has no section")))?;
            src.read_at(s.offset, s.size)?
        };
        w.write_all(&e.put_u64(pos)).map_err(io)?;
        w.write_all(&e.put_u64(payload.len() as u64)).map_err(io)?;
        pos += payload.len() as u64;
        payloads.push(payload);
    }
    for p in &payloads {
        w.write_all(p).map_err(io)?;
    }
    // Attrs and ids that sat after the data (perf 6.12's pipe-to-file layout) move
    // after the new features; their offsets are patched, their bytes are not touched.
    let mut attrs_off = h.attrs.offset;
    let mut attrs_raw = src.read_at(h.attrs.offset, h.attrs.size)?;
    let attr_len = (h.attr_size - 16) as usize;
    let mut ids_patched = false;
    for entry in attrs_raw.chunks_exact_mut(h.attr_size as usize) {
        let ids_off = e.u64(entry, attr_len).unwrap_or(0);
        let ids_size = e.u64(entry, attr_len + 8).unwrap_or(0);
        if ids_size > 0 && ids_off >= data_end {
            let ids = src.read_at(ids_off, ids_size)?;
            w.write_all(&ids).map_err(io)?;
            entry[attr_len..attr_len + 8].copy_from_slice(&e.put_u64(pos));
            pos += ids_size;
            ids_patched = true;
        }
    }
    if h.attrs.offset >= data_end {
        w.write_all(&attrs_raw).map_err(io)?;
        attrs_off = pos;
    }
    w.flush().map_err(io)?;
    drop(w);
    if ids_patched && h.attrs.offset < data_end {
        out.write_all_at(&attrs_raw, h.attrs.offset).map_err(io)?;
    }
    out.write_all_at(&h.encode_bitmap(&features), 72)
        .map_err(io)?;
    out.write_all_at(&e.put_u64(attrs_off), 24).map_err(io)?;
    if h.data_size_repaired {
        out.write_all_at(&e.put_u64(h.data.size), 48).map_err(io)?;
    }
    Ok(())
}

/// Removing the temp output when the process is interrupted (Ctrl-C, SIGTERM,
/// SIGHUP), so that not even a hidden partial file is left behind. The handler only
/// calls async-signal-safe functions: unlink, signal, raise.
pub mod interrupt {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;
    use std::sync::atomic::{AtomicPtr, Ordering};

    static PENDING: AtomicPtr<libc::c_char> = AtomicPtr::new(std::ptr::null_mut());

    extern "C" fn on_signal(sig: libc::c_int) {
        let p = PENDING.swap(std::ptr::null_mut(), Ordering::SeqCst);
        // SAFETY: `p` came from CString::into_raw and is never freed while set;
        // unlink, signal and raise are async-signal-safe.
        unsafe {
            if !p.is_null() {
                libc::unlink(p);
            }
            libc::signal(sig, libc::SIG_DFL);
            libc::raise(sig);
        }
    }

    /// Installs the handler (the binary calls this once at start).
    pub fn install() {
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            // SAFETY: installing a handler that only does async-signal-safe work.
            unsafe {
                libc::signal(sig, on_signal as *const () as libc::sighandler_t);
            }
        }
    }

    pub(super) fn watch(path: &Path) {
        if let Ok(c) = CString::new(path.as_os_str().as_bytes()) {
            let old = PENDING.swap(c.into_raw(), Ordering::SeqCst);
            free(old);
        }
    }

    pub(super) fn unwatch() {
        free(PENDING.swap(std::ptr::null_mut(), Ordering::SeqCst));
    }

    fn free(p: *mut libc::c_char) {
        if !p.is_null() {
            // SAFETY: only pointers from CString::into_raw are stored.
            drop(unsafe { CString::from_raw(p) });
        }
    }
}
