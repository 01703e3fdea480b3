//! The write stage for file output: everything before the end of the data section is
//! copied verbatim (kernel side, with copy_file_range, while the other stages run);
//! then the feature table is rebuilt with BUILD_ID merged in and every other feature
//! copied byte for byte. Output goes to a temp file renamed over the target on
//! success, so an error never leaves a partial output.

pub mod clone;
pub mod fit;
pub mod inplace;

use crate::format::header::{FEAT_BUILD_ID, FileHeader};
use crate::input::PerfInput;
use crate::{Error, Result};
use std::fs::File;
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// A temp file or directory beside the output, removed on drop unless committed (and
/// by the signal handlers of [`interrupt`] when the run is killed).
pub struct TempOutput {
    /// The temp path.
    pub path: PathBuf,
    /// Where it goes on success.
    pub target: PathBuf,
    is_dir: bool,
    committed: bool,
    slot: Option<usize>,
}

/// Mode of new output files: perf writes its data files 0600 (they hold paths,
/// command lines and stacks).
pub const NEW_FILE_MODE: u32 = 0o600;

/// The name of a temp output beside its target: `.pdi-PID-N.tmp` (short whatever the
/// target's name).
pub fn temp_name(pid: u32, n: u32) -> String {
    format!(".pdi-{pid}-{n}.tmp")
}

/// The PID in a [`temp_name`], if `name` is one.
pub fn temp_name_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(".pdi-")?.strip_suffix(".tmp")?;
    let (pid, n) = rest.split_once('-')?;
    n.parse::<u32>().ok()?;
    pid.parse().ok()
}

impl TempOutput {
    /// Creates the temp file (or directory) for `target`, mode 0600 (0700).
    pub fn create(target: &Path, is_dir: bool) -> Result<TempOutput> {
        Self::create_with_mode(target, is_dir, None)
    }

    /// Creates the temp file (or directory) for `target` with `mode` (the input's;
    /// `None`: 0600, perf's mode for new data files).
    ///
    /// Refuses a target that exists and is not a regular file (or, for a directory
    /// output, a directory): a character device or a FIFO is never replaced, so
    /// `pdinject in.data /dev/null` cannot replace /dev/null even as root.
    pub fn create_with_mode(target: &Path, is_dir: bool, mode: Option<u32>) -> Result<TempOutput> {
        use std::os::unix::fs::{DirBuilderExt, FileTypeExt, OpenOptionsExt};
        if let Ok(m) = std::fs::metadata(target) {
            let ft = m.file_type();
            let ok = if is_dir { ft.is_dir() } else { ft.is_file() };
            if !ok {
                let kind = if ft.is_char_device() {
                    "a character device"
                } else if ft.is_block_device() {
                    "a block device"
                } else if ft.is_fifo() {
                    "a FIFO"
                } else if ft.is_socket() {
                    "a socket"
                } else if ft.is_dir() {
                    "a directory"
                } else {
                    "not a regular file"
                };
                return Err(Error::Usage(format!(
                    "{}: the output exists and is {kind}; not replacing it (give a regular file, or - for stdout)",
                    target.display()
                )));
            }
        }
        let dir = match target.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        if target.file_name().is_none() {
            return Err(Error::Usage(format!(
                "{}: output is not a file name",
                target.display()
            )));
        }
        // Short, whatever the target's name: a valid 255-byte name must still get a
        // temp name (NAME_MAX is 255 bytes).
        static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(temp_name(std::process::id(), n));
        let _ = if is_dir {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        let r = if is_dir {
            std::fs::DirBuilder::new()
                .mode(mode.unwrap_or(0o700))
                .create(&path)
        } else {
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(mode.unwrap_or(NEW_FILE_MODE))
                .open(&path)
                .map(|f| {
                    // The umask may have taken bits away; the input's mode is the rule.
                    if let Some(m) = mode {
                        use std::os::unix::fs::PermissionsExt;
                        let _ = f.set_permissions(std::fs::Permissions::from_mode(m));
                    }
                })
        };
        r.map_err(|source| Error::Output {
            path: target.to_path_buf(),
            source,
        })?;
        let slot = interrupt::watch(&path, is_dir);
        Ok(TempOutput {
            path,
            target: target.to_path_buf(),
            is_dir,
            committed: false,
            slot,
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
        if let Some(slot) = self.slot.take() {
            interrupt::unwatch(slot);
        }
        if !self.committed {
            let _ = if self.is_dir {
                std::fs::remove_dir_all(&self.path)
            } else {
                std::fs::remove_file(&self.path)
            };
        }
    }
}

/// Bytes of the input the copy beside the stages maps at a time.
pub(crate) const COPY_STEP: u64 = 64 << 20;

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
    write_tail_at(
        input,
        out_path,
        build_id_payload,
        input.header.feature_table_offset(),
    )
}

/// [`write_tail`] after data that ends at `out_end` in the output (a conversion
/// shrinks the data section); sections of the input are judged by where its own
/// data ends.
pub fn write_tail_at(
    input: &PerfInput,
    out_path: &Path,
    build_id_payload: Option<&[u8]>,
    out_end: u64,
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
    out.set_len(out_end).map_err(io)?;
    out.seek(SeekFrom::Start(out_end)).map_err(io)?;
    let mut w = std::io::BufWriter::new(&mut out);
    let mut pos = out_end + 16 * bits.len() as u64;
    let mut payloads = Vec::with_capacity(bits.len());
    // Sections that alias one another exactly (the limits policy refuses partial
    // overlaps) are read and written once; their table entries share the offset, so
    // the output never holds more than the input's bytes plus the new table.
    let mut written: Vec<(crate::format::header::Section, u64, u64)> = Vec::new();
    for &bit in &bits {
        let (at, len) = if bit == FEAT_BUILD_ID && build_id_payload.is_some() {
            let p = build_id_payload.map(|p| p.to_vec()).unwrap_or_default();
            let r = (pos, p.len() as u64);
            pos += p.len() as u64;
            payloads.push(p);
            r
        } else {
            let (_, s) = input
                .features
                .iter()
                .find(|(b, _)| *b == bit)
                .ok_or_else(|| Error::format(data_end, format!("feature {bit} has no section")))?;
            if let Some(&(_, at, len)) = written.iter().find(|(w, _, _)| w == s) {
                (at, len)
            } else {
                let p = src.read_at(s.offset, s.size)?;
                let r = (pos, p.len() as u64);
                written.push((*s, pos, r.1));
                pos += p.len() as u64;
                payloads.push(p);
                r
            }
        };
        w.write_all(&e.put_u64(at)).map_err(io)?;
        w.write_all(&e.put_u64(len)).map_err(io)?;
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

/// Removing every temp output when the process is killed by a signal (SIGINT, SIGTERM,
/// SIGHUP, SIGQUIT, SIGXFSZ), so that not even a hidden partial file or directory is
/// left behind; and on SIGBUS (the input was truncated while mapped) the same, then
/// "input FILE changed size while being read" and exit status 1.
///
/// The handlers only do async-signal-safe things: open, getdents64, unlinkat, rmdir,
/// close, unlink, write, sigaction, raise, _exit. SIGPIPE is left ignored (Rust's
/// default): a closed stdout is an EPIPE error, and the error path removes the temps.
pub mod interrupt {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;
    use std::sync::atomic::{AtomicPtr, Ordering};

    /// Temp outputs alive at once (output, report; a few more for library users).
    const SLOTS: usize = 16;

    #[allow(clippy::declare_interior_mutable_const)]
    const NULL: AtomicPtr<libc::c_char> = AtomicPtr::new(std::ptr::null_mut());
    /// Watched paths; bit 0 of a pointer (always clear in an allocation's address)
    /// marks a directory.
    static PENDING: [AtomicPtr<libc::c_char>; SLOTS] = [NULL; SLOTS];
    /// The SIGBUS message, prepared when the input is opened.
    static BUS_MESSAGE: AtomicPtr<libc::c_char> = AtomicPtr::new(std::ptr::null_mut());

    /// Removes every watched temp output (async-signal-safe).
    fn remove_all() {
        for slot in PENDING.iter() {
            let tagged = slot.swap(std::ptr::null_mut(), Ordering::SeqCst);
            if tagged.is_null() {
                continue;
            }
            let dir = tagged as usize & 1 != 0;
            let p = (tagged as usize & !1) as *const libc::c_char;
            // SAFETY: `p` came from CString::into_raw and is never freed once taken
            // here (the handler leaks it); the calls are async-signal-safe.
            unsafe {
                if dir {
                    remove_dir(p);
                } else {
                    libc::unlink(p);
                }
            }
        }
    }

    /// Empties and removes a temp directory with raw system calls (readdir and
    /// remove_dir_all allocate, which a signal handler must not).
    ///
    /// # Safety
    /// `path` is a NUL-terminated path.
    unsafe fn remove_dir(path: *const libc::c_char) {
        // SAFETY: raw system calls on a buffer on this stack.
        unsafe {
            let fd = libc::open(path, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC);
            if fd >= 0 {
                let mut buf = [0u8; 4096];
                // Read the directory to its end, then again while a pass removed
                // something (removal under an open listing may skip entries); a
                // bounded number of passes, so a handler can never spin.
                let mut removed = false;
                let mut passes = 0;
                loop {
                    let n = libc::syscall(libc::SYS_getdents64, fd, buf.as_mut_ptr(), buf.len());
                    if n <= 0 {
                        if n == 0 && removed && passes < 16 {
                            libc::lseek(fd, 0, libc::SEEK_SET);
                            removed = false;
                            passes += 1;
                            continue;
                        }
                        break;
                    }
                    let mut off = 0usize;
                    while off + 19 < n as usize {
                        // struct linux_dirent64: u64 ino, i64 off, u16 reclen, u8 type, name.
                        let reclen = u16::from_ne_bytes([buf[off + 16], buf[off + 17]]) as usize;
                        if reclen == 0 {
                            break;
                        }
                        let name = buf.as_ptr().add(off + 19) as *const libc::c_char;
                        let dot = *name == b'.' as libc::c_char
                            && (*name.add(1) == 0
                                || (*name.add(1) == b'.' as libc::c_char && *name.add(2) == 0));
                        if !dot && libc::unlinkat(fd, name, 0) == 0 {
                            removed = true;
                        }
                        off += reclen;
                    }
                }
                libc::close(fd);
            }
            libc::rmdir(path);
        }
    }

    extern "C" fn on_signal(sig: libc::c_int) {
        remove_all();
        // SAFETY: sigaction-free reset and raise are async-signal-safe.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            libc::raise(sig);
        }
    }

    extern "C" fn on_bus(_sig: libc::c_int) {
        remove_all();
        let m = BUS_MESSAGE.load(Ordering::SeqCst);
        // SAFETY: `m` is null or a CString that is never freed; write and _exit are
        // async-signal-safe.
        unsafe {
            if m.is_null() {
                const M: &[u8] = b"pdinject: the input changed size while being read\n";
                libc::write(2, M.as_ptr().cast(), M.len());
            } else {
                libc::write(2, m.cast(), libc::strlen(m));
            }
            libc::_exit(1);
        }
    }

    /// Installs the handlers (the binary calls this once at start).
    pub fn install() {
        for sig in [
            libc::SIGINT,
            libc::SIGTERM,
            libc::SIGHUP,
            libc::SIGQUIT,
            libc::SIGXFSZ,
        ] {
            set(sig, on_signal as *const () as libc::sighandler_t);
        }
        set(libc::SIGBUS, on_bus as *const () as libc::sighandler_t);
    }

    fn set(sig: libc::c_int, handler: libc::sighandler_t) {
        // SAFETY: a zeroed sigaction with a handler that only does async-signal-safe work.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = handler;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }

    /// Names the input in the SIGBUS message (called when the input is opened).
    pub fn input_opened(path: &Path) {
        let msg = format!(
            "pdinject: input {} changed size while being read\n",
            path.display()
        );
        if let Ok(c) = CString::new(msg) {
            // The old message is leaked: a handler may be reading it.
            BUS_MESSAGE.store(c.into_raw(), Ordering::SeqCst);
        }
    }

    /// Watches a temp path; the slot is given back with [`unwatch`].
    pub(crate) fn watch(path: &Path, is_dir: bool) -> Option<usize> {
        let c = CString::new(path.as_os_str().as_bytes()).ok()?.into_raw();
        if c as usize & 1 != 0 {
            free(c);
            return None;
        }
        let tagged = (c as usize | is_dir as usize) as *mut libc::c_char;
        for (i, slot) in PENDING.iter().enumerate() {
            if slot
                .compare_exchange(
                    std::ptr::null_mut(),
                    tagged,
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                )
                .is_ok()
            {
                return Some(i);
            }
        }
        free(c);
        None
    }

    /// Stops watching (the temp was committed or removed by its owner).
    pub(crate) fn unwatch(slot: usize) {
        if let Some(p) = PENDING.get(slot) {
            let tagged = p.swap(std::ptr::null_mut(), Ordering::SeqCst);
            free((tagged as usize & !1) as *mut libc::c_char);
        }
    }

    fn free(p: *mut libc::c_char) {
        if !p.is_null() {
            // SAFETY: only pointers from CString::into_raw are stored.
            drop(unsafe { CString::from_raw(p) });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// The forked children see every watched path: one test at a time.
    static ONE: Mutex<()> = Mutex::new(());

    /// Forks; the child runs `child` (async-signal-safe calls only: the test harness
    /// has other threads) and must not return. Returns the child's wait status.
    fn in_child(child: impl FnOnce()) -> libc::c_int {
        // SAFETY: fork; the child only makes async-signal-safe calls, then _exit.
        unsafe {
            let pid = libc::fork();
            assert!(pid >= 0, "fork failed");
            if pid == 0 {
                child();
                libc::_exit(99);
            }
            let mut st = 0;
            assert_eq!(libc::waitpid(pid, &mut st, 0), pid);
            st
        }
    }

    #[test]
    fn a_signal_removes_temp_files_and_directories() {
        let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
        let dir = tempfile::tempdir().unwrap();
        let out_dir = TempOutput::create(&dir.path().join("out.data"), true).unwrap();
        for i in 0..300 {
            std::fs::write(out_dir.path.join(format!("data.{i}")), b"x").unwrap();
        }
        let out_file = TempOutput::create(&dir.path().join("out2.data"), false).unwrap();
        let st = in_child(|| {
            interrupt::install();
            // SAFETY: raise is async-signal-safe.
            unsafe { libc::raise(libc::SIGTERM) };
        });
        assert!(
            libc::WIFSIGNALED(st) && libc::WTERMSIG(st) == libc::SIGTERM,
            "{st:#x}"
        );
        assert!(!out_dir.path.exists(), "temp directory left");
        assert!(!out_file.path.exists(), "temp file left");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn sigbus_from_a_truncated_input_cleans_up_and_says_so() {
        use std::os::fd::AsRawFd;
        let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("in.data");
        std::fs::write(&input, vec![7u8; 3 * 4096]).unwrap();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&input)
            .unwrap();
        // SAFETY: a read-only map of our own file, truncated only in the child.
        let map = unsafe { memmap2::Mmap::map(&f).unwrap() };
        interrupt::input_opened(&input);
        let out = TempOutput::create(&dir.path().join("out.data"), false).unwrap();
        let err = dir.path().join("stderr");
        let errf = std::fs::File::create(&err).unwrap();
        let (fd, efd, p) = (f.as_raw_fd(), errf.as_raw_fd(), map.as_ptr());
        let st = in_child(|| {
            interrupt::install();
            // SAFETY: dup2, ftruncate and a volatile read of the map are
            // async-signal-safe; the read past the new end raises SIGBUS.
            unsafe {
                libc::dup2(efd, 2);
                libc::ftruncate(fd, 0);
                std::ptr::read_volatile(p.add(2 * 4096));
            }
        });
        assert!(libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 1, "{st:#x}");
        assert!(!out.path.exists(), "temp file left");
        let msg = std::fs::read_to_string(&err).unwrap();
        assert!(
            msg.contains("changed size while being read") && msg.contains("in.data"),
            "{msg}"
        );
    }
}
