//! The write stage for file output: everything before the end of the data section is
//! copied verbatim (kernel side, with copy_file_range, while the other stages run);
//! then the feature table is rebuilt with BUILD_ID merged in and every other feature
//! copied byte for byte. Output goes to a temp file renamed over the target on
//! success, so an error never leaves a partial output.

pub(crate) mod clone;
pub(crate) mod fit;
pub(crate) mod inplace;

use crate::error::{Error, Result};
use crate::format::header::{FEAT_BUILD_ID, FileHeader};
use crate::input::PerfInput;
use std::fs::File;
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// A temp file or directory beside the output, removed on drop unless committed (and
/// by the signal handlers of [`crate::signals`] when the run is killed).
pub(crate) struct TempOutput {
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
pub(crate) const NEW_FILE_MODE: u32 = 0o600;

/// The name of a temp output beside its target: `.pdi-PID-N.tmp` (short whatever the
/// target's name).
pub fn temp_name(pid: u32, n: u32) -> String {
    format!(".pdi-{pid}-{n}.tmp")
}

/// The PID in a [`temp_name`], if `name` is one.
pub(crate) fn temp_name_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(".pdi-")?.strip_suffix(".tmp")?;
    let (pid, n) = rest.split_once('-')?;
    n.parse::<u32>().ok()?;
    pid.parse().ok()
}

impl TempOutput {
    /// Creates the temp file (or directory) for `target`, mode 0600 (0700).
    pub(crate) fn create(target: &Path, is_dir: bool) -> Result<TempOutput> {
        Self::create_with_mode(target, is_dir, None)
    }

    /// Creates the temp file (or directory) for `target` with `mode` (the input's;
    /// `None`: 0600, perf's mode for new data files).
    ///
    /// Refuses a target that exists and is not a regular file (or, for a directory
    /// output, a directory): a character device or a FIFO is never replaced, so
    /// `pdinject in.data /dev/null` cannot replace /dev/null even as root.
    pub(crate) fn create_with_mode(
        target: &Path,
        is_dir: bool,
        mode: Option<u32>,
    ) -> Result<TempOutput> {
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
        let slot = crate::signals::watch(&path, is_dir);
        Ok(TempOutput {
            path,
            target: target.to_path_buf(),
            is_dir,
            committed: false,
            slot,
        })
    }

    /// The file to write the header file into.
    pub(crate) fn header_file_path(&self) -> PathBuf {
        if self.is_dir {
            self.path.join("data")
        } else {
            self.path.clone()
        }
    }

    /// Moves the finished output into place.
    pub(crate) fn commit(mut self) -> Result<()> {
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
            crate::signals::unwatch(slot);
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
pub(crate) fn copy_prefix(src: &Path, dst: &Path, len: u64, cancel: &AtomicBool) -> Result<()> {
    use std::os::fd::AsRawFd;
    let i = File::open(src).map_err(|e| Error::io(src, e))?;
    crate::signals::hooks::before_part(dst);
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
pub(crate) fn write_tail(
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
pub(crate) fn write_tail_at(
    input: &PerfInput,
    out_path: &Path,
    build_id_payload: Option<&[u8]>,
    out_end: u64,
) -> Result<()> {
    write_tail_shaped(
        input,
        out_path,
        build_id_payload,
        out_end,
        TailShape::AsInput,
    )
}

/// Which of the input's feature sections a tail carries.
#[derive(Clone, Copy, Debug)]
pub(crate) enum TailShape {
    /// All of them.
    AsInput,
    /// Each as the function gives it back (`--aslr`: the recorded machine's addresses
    /// go); `None` leaves the section out.
    Edited(fn(u32, Vec<u8>) -> Option<Vec<u8>>),
}

/// The feature sections `shape` rewrites (its bits cleared in `features` where it
/// leaves one out); the build-ID table is left to the caller when it writes a new one.
fn shaped(
    input: &PerfInput,
    shape: TailShape,
    new_table: bool,
    features: &mut [u64; 4],
) -> Result<Vec<(u32, Vec<u8>)>> {
    let mut edited = Vec::new();
    match shape {
        TailShape::AsInput => {}
        TailShape::Edited(edit) => {
            for (bit, s) in &input.features {
                if *bit == FEAT_BUILD_ID && new_table {
                    continue;
                }
                match edit(*bit, input.data_files[0].read_at(s.offset, s.size)?) {
                    Some(p) => edited.push((*bit, p)),
                    None => features[(*bit / 64) as usize] &= !(1 << (*bit % 64)),
                }
            }
        }
    }
    Ok(edited)
}

/// [`write_tail_at`] with the feature sections `shape` keeps.
pub(crate) fn write_tail_shaped(
    input: &PerfInput,
    out_path: &Path,
    build_id_payload: Option<&[u8]>,
    out_end: u64,
    shape: TailShape,
) -> Result<()> {
    let h: &FileHeader = &input.header;
    let e = h.endian;
    let io = |err| Error::io(out_path, err);
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .open(out_path)
        .map_err(io)?;
    let data_end = h.feature_table_offset();
    let mut features = h.features;
    let edited = shaped(input, shape, build_id_payload.is_some(), &mut features)?;
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
    let sections = Sections {
        input,
        build_id_payload,
        edited: &edited,
    };
    let payloads = sections.write_table(&mut w, &bits, &mut pos, &io)?;
    for p in &payloads {
        w.write_all(p).map_err(io)?;
    }
    let MovedAttrs {
        raw: attrs_raw,
        offset: attrs_off,
        ids_patched,
    } = move_attrs(input, &mut w, &mut pos, &io)?;
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

/// Where a tail's feature sections come from: the new build-ID table, a section
/// [`shaped`] rewrote, else the input's own.
struct Sections<'a> {
    input: &'a PerfInput,
    build_id_payload: Option<&'a [u8]>,
    edited: &'a [(u32, Vec<u8>)],
}

impl Sections<'_> {
    /// Writes the feature table of `bits` to `w`, the sections laid out from `*pos`
    /// on (moved past them); returns their bytes, in order.
    fn write_table(
        &self,
        w: &mut impl Write,
        bits: &[u32],
        pos: &mut u64,
        io: &dyn Fn(std::io::Error) -> Error,
    ) -> Result<Vec<Vec<u8>>> {
        let h = &self.input.header;
        let (e, data_end) = (h.endian, h.feature_table_offset());
        let mut payloads = Vec::with_capacity(bits.len());
        // Sections that alias one another exactly (the limits policy refuses partial
        // overlaps) are read and written once; their table entries share the offset, so
        // the output never holds more than the input's bytes plus the new table.
        let mut written: Vec<(crate::format::header::Section, u64, u64)> = Vec::new();
        for &bit in bits {
            let (at, len) = if bit == FEAT_BUILD_ID && self.build_id_payload.is_some() {
                let p = self
                    .build_id_payload
                    .map(|p| p.to_vec())
                    .unwrap_or_default();
                let r = (*pos, p.len() as u64);
                *pos += p.len() as u64;
                payloads.push(p);
                r
            } else if let Some((_, p)) = self.edited.iter().find(|(b, _)| *b == bit) {
                let r = (*pos, p.len() as u64);
                *pos += p.len() as u64;
                payloads.push(p.clone());
                r
            } else {
                let (_, s) = self
                    .input
                    .features
                    .iter()
                    .find(|(b, _)| *b == bit)
                    .ok_or_else(|| {
                        Error::format(data_end, format!("feature {bit} has no section"))
                    })?;
                if let Some(&(_, at, len)) = written.iter().find(|(w, _, _)| w == s) {
                    (at, len)
                } else {
                    let p = self.input.data_files[0].read_at(s.offset, s.size)?;
                    let r = (*pos, p.len() as u64);
                    written.push((*s, *pos, r.1));
                    *pos += p.len() as u64;
                    payloads.push(p);
                    r
                }
            };
            w.write_all(&e.put_u64(at)).map_err(io)?;
            w.write_all(&e.put_u64(len)).map_err(io)?;
        }
        Ok(payloads)
    }
}

/// The input's attrs section as the output holds it.
struct MovedAttrs {
    raw: Vec<u8>,
    /// Where the output's attrs section starts.
    offset: u64,
    /// Some ids moved: `raw` differs from the input's.
    ids_patched: bool,
}

/// Attrs and ids that sat after the data (perf 6.12's pipe-to-file layout) move
/// after the new features, written to `w` from `*pos` on; their offsets are patched,
/// their bytes are not touched.
fn move_attrs(
    input: &PerfInput,
    w: &mut impl Write,
    pos: &mut u64,
    io: &dyn Fn(std::io::Error) -> Error,
) -> Result<MovedAttrs> {
    let h = &input.header;
    let (e, data_end, src) = (h.endian, h.feature_table_offset(), &input.data_files[0]);
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
            entry[attr_len..attr_len + 8].copy_from_slice(&e.put_u64(*pos));
            *pos += ids_size;
            ids_patched = true;
        }
    }
    if h.attrs.offset >= data_end {
        w.write_all(&attrs_raw).map_err(io)?;
        attrs_off = *pos;
    }
    Ok(MovedAttrs {
        raw: attrs_raw,
        offset: attrs_off,
        ids_patched,
    })
}
