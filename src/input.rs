//! Opening a perf.data (file or `perf record --threads` directory) and reading it in
//! windows. Only the header, attrs and features are read eagerly; the data section is
//! mapped a window at a time so memory does not grow with the file.

use crate::error::{Error, Result};
use crate::format::attr::{Attr, read_attrs};
use crate::format::header::{FEAT_DIR_FORMAT, FileHeader, Section};
use std::fs::File;
use std::ops::Deref;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Window of a data file mapped at once by the scan.
pub(crate) const WINDOW_BYTES: u64 = 64 << 20;

/// Where a data stream's bytes live.
#[derive(Debug)]
pub(crate) enum Backing {
    /// A file on disk, mapped in windows.
    File(File),
    /// Bytes in memory (tests, fuzzing, batches of a pipe), holding the stream's bytes
    /// from the offset given.
    Mem(Arc<Vec<u8>>, u64),
}

/// One record stream: the data section of the header file, or a `data.N` file of a
/// directory-format recording.
#[derive(Debug)]
pub(crate) struct DataFile {
    /// Its path (for messages).
    pub path: PathBuf,
    /// Its bytes.
    pub backing: Backing,
    /// The byte range holding records.
    pub range: Section,
    /// A window the scan mapped and kept for the resolve (see [`Spread::keep`]).
    kept: std::sync::Mutex<Option<Kept>>,
}

/// A map of a data file kept between the scan and the resolve.
struct Kept {
    /// The file offset of the map's first byte.
    at: u64,
    map: Arc<memmap2::Mmap>,
}

impl std::fmt::Debug for Kept {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Kept({:#x}, {} bytes)", self.at, self.map.len())
    }
}

/// A mapped or borrowed window of a data file.
pub(crate) enum Window {
    /// `map[a..b]` of a memory map of part of a file (the map may be shared with the
    /// windows lent from it).
    Map(Arc<memmap2::Mmap>, usize, usize),
    /// A range of an in-memory buffer.
    Mem(Arc<Vec<u8>>, usize, usize),
}

impl Deref for Window {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Window::Map(m, a, b) => &m[*a..*b],
            Window::Mem(v, a, b) => &v[*a..*b],
        }
    }
}

impl crate::format::walk::Windows for DataFile {
    type Window = Window;
    fn window(&self, offset: u64, len: u64) -> Result<Window> {
        DataFile::window(self, offset, len)
    }
    fn file(&self) -> Option<&Path> {
        Some(&self.path)
    }
}

impl DataFile {
    /// The records of `backing` in `range`.
    pub(crate) fn new(path: PathBuf, backing: Backing, range: Section) -> Self {
        DataFile {
            path,
            backing,
            range,
            kept: std::sync::Mutex::new(None),
        }
    }

    /// The window the scan kept, no longer lent: the resolve is done with it, and it is
    /// unmapped when the last holder drops it.
    pub(crate) fn take_kept(&self) -> Option<Arc<memmap2::Mmap>> {
        self.kept.lock().ok()?.take().map(|k| k.map)
    }

    /// `len` bytes at `offset` lent from the kept map, when it holds them all.
    fn lent(&self, offset: u64, len: u64) -> Option<Window> {
        let k = self.kept.lock().ok()?;
        let k = k.as_ref()?;
        let a = usize::try_from(offset.checked_sub(k.at)?).ok()?;
        let b = a.checked_add(usize::try_from(len).ok()?)?;
        (b <= k.map.len()).then(|| Window::Map(k.map.clone(), a, b))
    }

    /// Maps `len` bytes at `offset` (which the caller keeps within the file), every
    /// page at once: one bulk fault instead of one per page, which is faster even
    /// for the scan that reads only record headers (4.7 GB of DWARF samples: 1.4 s
    /// populated, 2.8 s faulted page by page).
    pub(crate) fn window(&self, offset: u64, len: u64) -> Result<Window> {
        self.window_with(offset, len, None)
    }

    /// [`DataFile::window`]; with a `pool`, the pages are mapped by every thread of it
    /// at once. For the scan, which reads little of each page, mapping them is most
    /// of the work (the kernel's, one page table entry at a time); one thread would
    /// leave the other cores idle while it does that.
    fn window_with(
        &self,
        offset: u64,
        len: u64,
        pool: Option<&rayon::ThreadPool>,
    ) -> Result<Window> {
        if let Some(w) = self.lent(offset, len) {
            return Ok(w);
        }
        match &self.backing {
            Backing::Mem(v, base) => {
                let a = offset
                    .checked_sub(*base)
                    .and_then(|a| usize::try_from(a).ok())
                    .ok_or_else(|| Error::format(offset, "offset outside the data"))?;
                let b = a
                    .checked_add(len as usize)
                    .filter(|&b| b <= v.len())
                    .ok_or_else(|| Error::format(offset, "window outside the data"))?;
                Ok(Window::Mem(v.clone(), a, b))
            }
            Backing::File(f) => {
                if len == 0 {
                    return Ok(Window::Mem(Arc::new(Vec::new()), 0, 0));
                }
                let page = page_size();
                let aligned = offset - offset % page;
                let skip = (offset - aligned) as usize;
                // SAFETY: the map is read-only. A file truncated by another process
                // while mapped would fault; perf.data inputs are finished files, and
                // the bytes are only read through bounds-checked accessors.
                let total = skip + len as usize;
                let parts = pool.map_or(1, |p| p.current_num_threads()).max(1);
                let mut opts = memmap2::MmapOptions::new();
                opts.offset(aligned).len(total);
                if parts == 1 || total < SPREAD_MIN {
                    opts.populate();
                }
                let map = unsafe { opts.map(f) }.map_err(|e| Error::io(&self.path, e))?;
                if let Some(pool) = pool.filter(|_| parts > 1 && total >= SPREAD_MIN) {
                    let step = total.div_ceil(parts).next_multiple_of(page as usize);
                    pool.install(|| {
                        rayon::scope(|s| {
                            for start in (0..total).step_by(step) {
                                let map = &map;
                                s.spawn(move |_| {
                                    // Advice only: a kernel without MADV_POPULATE_READ
                                    // (before 5.14) faults the pages in as they are read.
                                    let _ = map.advise_range(
                                        memmap2::Advice::PopulateRead,
                                        start,
                                        step.min(total - start),
                                    );
                                });
                            }
                        })
                    });
                }
                Ok(Window::Map(Arc::new(map), skip, total))
            }
        }
    }

    /// Reads `len` bytes at `offset` into a buffer.
    pub(crate) fn read_at(&self, offset: u64, len: u64) -> Result<Vec<u8>> {
        read_exact_at(&self.backing, &self.path, offset, len)
    }
}

fn read_exact_at(backing: &Backing, path: &Path, offset: u64, len: u64) -> Result<Vec<u8>> {
    match backing {
        Backing::Mem(v, base) => {
            let a = offset.saturating_sub(*base) as usize;
            v.get(a..a.saturating_add(len as usize))
                .map(|s| s.to_vec())
                .ok_or_else(|| {
                    Error::format(
                        offset,
                        format!("{len} bytes at this offset are outside the file"),
                    )
                })
        }
        Backing::File(f) => {
            let flen = f.metadata().map_err(|e| Error::io(path, e))?.len();
            if offset.checked_add(len).is_none_or(|end| end > flen) {
                return Err(Error::format(
                    offset,
                    format!("{len} bytes at this offset are outside the file ({flen} bytes)"),
                ));
            }
            let mut buf = vec![0u8; len as usize];
            f.read_exact_at(&mut buf, offset)
                .map_err(|e| Error::io(path, e))?;
            Ok(buf)
        }
    }
}

/// Windows smaller than this are mapped by one thread (spreading costs a few
/// microseconds of hand-over).
const SPREAD_MIN: usize = 4 << 20;

/// A data file whose windows are mapped by all threads of a pool
/// (`DataFile::window_with`), when it has one.
pub(crate) struct Spread<'a> {
    /// The file.
    pub file: &'a DataFile,
    /// The threads (`None`: the calling thread maps and unmaps, as
    /// [`DataFile::window`]; for a pool that is busy with other work).
    pub pool: Option<&'a rayon::ThreadPool>,
    /// Keep each window mapped after the scan is done with it, until
    /// [`DataFile::take_kept`], and lend the resolve its ranges: the kernel then fills
    /// the page tables of those pages once, not twice. The caller bounds what that
    /// keeps (it is resident memory).
    pub keep: bool,
}

impl crate::format::walk::Windows for Spread<'_> {
    type Window = Window;
    fn file(&self) -> Option<&Path> {
        Some(&self.file.path)
    }
    fn window(&self, offset: u64, len: u64) -> Result<Window> {
        let w = self.file.window_with(offset, len, self.pool)?;
        // `offset` is byte `a` of the map (page alignment, or where a lent window
        // starts in the kept map).
        if let (true, Window::Map(map, a, _)) = (self.keep, &w)
            && let Ok(mut k) = self.file.kept.lock()
        {
            *k = Some(Kept {
                at: offset - *a as u64,
                map: map.clone(),
            });
        }
        Ok(w)
    }
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 { p as u64 } else { 4096 }
}

/// An opened perf.data.
#[derive(Debug)]
pub(crate) struct PerfInput {
    /// The path the user gave.
    pub path: PathBuf,
    /// The file holding the header (`path`, or `path/data` for a directory).
    pub header_path: PathBuf,
    /// True for a `perf record --threads` directory.
    pub is_dir: bool,
    /// The parsed header.
    pub header: FileHeader,
    /// The events.
    pub attrs: Vec<Attr>,
    /// Feature sections by bit, in ascending bit order.
    pub features: Vec<(u32, Section)>,
    /// Record streams: the header file's data section first, then `data.N` files.
    pub data_files: Vec<DataFile>,
    /// Length of the header file.
    pub file_len: u64,
    /// Modification time of the header file in ns since the epoch (end of recording).
    pub mtime_ns: Option<i128>,
    /// `data.N` entries of a directory that are not regular files, skipped as perf
    /// skips them.
    pub skipped: Vec<PathBuf>,
}

/// Opens `path` for reading without blocking on a FIFO or device (the caller checks
/// the type of what it got before reading).
fn open_nonblocking(path: &Path) -> Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| Error::io(path, e))
}

impl PerfInput {
    /// The ids section of each attr entry, as the header's attrs section gives them
    /// (read again from the file: for writers that must know what lies where).
    pub(crate) fn ids_sections(&self) -> Result<Vec<Section>> {
        let h = &self.header;
        let Some(entry_len) = usize::try_from(h.attr_size).ok().filter(|&n| n >= 16) else {
            return Ok(Vec::new());
        };
        let raw = self.data_files[0].read_at(h.attrs.offset, h.attrs.size)?;
        let at = entry_len - 16;
        Ok(raw
            .chunks_exact(entry_len)
            .map(|entry| Section {
                offset: h.endian.u64(entry, at).unwrap_or(0),
                size: h.endian.u64(entry, at + 8).unwrap_or(0),
            })
            .collect())
    }

    /// Opens a perf.data file or directory.
    pub(crate) fn open(path: &Path) -> Result<PerfInput> {
        let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
        let is_dir = meta.is_dir();
        if !is_dir && !meta.is_file() {
            // Checked before any open: opening a device or FIFO can block or act.
            return Err(Error::unsupported("input is not a regular file").in_file(path));
        }
        let header_path = if is_dir {
            path.join("data")
        } else {
            path.to_path_buf()
        };
        let file = open_nonblocking(&header_path)?;
        let fmeta = file.metadata().map_err(|e| Error::io(&header_path, e))?;
        if !fmeta.is_file() {
            return Err(Error::unsupported("input is not a regular file").in_file(&header_path));
        }
        let mtime_ns = {
            use std::os::unix::fs::MetadataExt;
            Some(fmeta.mtime() as i128 * 1_000_000_000 + fmeta.mtime_nsec() as i128)
        };
        // A truncation while mapped raises SIGBUS: its handler names this input.
        crate::signals::input_opened(path);
        let mut input = Self::from_backing(path, &header_path, Backing::File(file), fmeta.len())
            .map_err(|e| e.in_file(&header_path))?;
        input.is_dir = is_dir;
        input.mtime_ns = mtime_ns;
        if is_dir {
            input.add_dir_files(path)?;
        }
        Ok(input)
    }

    /// Builds an input over bytes in memory (no directory support).
    pub(crate) fn from_bytes(name: &Path, bytes: Vec<u8>) -> Result<PerfInput> {
        let len = bytes.len() as u64;
        Self::from_backing(name, name, Backing::Mem(Arc::new(bytes), 0), len)
    }

    fn from_backing(
        path: &Path,
        header_path: &Path,
        backing: Backing,
        file_len: u64,
    ) -> Result<PerfInput> {
        let head = read_exact_at(&backing, header_path, 0, 104.min(file_len))?;
        let header = FileHeader::parse(&head, file_len)?;
        let e = header.endian;
        let attrs_raw = read_exact_at(
            &backing,
            header_path,
            header.attrs.offset,
            header.attrs.size,
        )?;
        let attrs = read_attrs(&header, &attrs_raw, |off, size| {
            read_exact_at(&backing, header_path, off, size)
        })?;
        // The feature table sits right after the data section.
        let nfeat = header
            .features
            .iter()
            .map(|w| w.count_ones() as u64)
            .sum::<u64>();
        let table_off = header.feature_table_offset();
        let mut features = Vec::new();
        if nfeat > 0 {
            let table =
                read_exact_at(&backing, header_path, table_off, nfeat * 16).map_err(|_| {
                    Error::format(
                        table_off,
                        format!("feature table of {nfeat} sections is outside the file"),
                    )
                })?;
            for (i, bit) in header.feature_bits().enumerate() {
                let s = Section {
                    offset: e.u64(&table, i * 16).unwrap_or(0),
                    size: e.u64(&table, i * 16 + 8).unwrap_or(0),
                };
                if s.end().is_none_or(|end| end > file_len) {
                    return Err(Error::format(
                        table_off + i as u64 * 16,
                        format!(
                            "feature {bit} section [{:#x}, +{:#x}) is outside the file ({file_len} bytes)",
                            s.offset, s.size
                        ),
                    ));
                }
                // Limits policy: feature sections live after the feature table, where
                // perf writes them. One inside the header, attrs or data would be
                // written twice (once as those bytes, once as the feature): 256
                // features pointing at the whole file made a 256-fold output.
                let tail = table_off + nfeat * 16;
                if s.size > 0 && s.offset < tail {
                    return Err(Error::format(
                        table_off + i as u64 * 16,
                        format!(
                            "feature {bit} section [{:#x}, +{:#x}) lies before the end of the feature table ({tail:#x}); perf writes feature sections after it (see \"Limits\" in docs/guarantees.md)",
                            s.offset, s.size
                        ),
                    ));
                }
                features.push((bit, s));
            }
            // Limits policy: feature sections may alias one another only exactly
            // (then they are read and written once); partial overlaps are refused.
            let regions = features
                .iter()
                .enumerate()
                .map(|(i, (bit, s))| {
                    (
                        format!("feature {bit} section"),
                        *s,
                        table_off + i as u64 * 16,
                    )
                })
                .collect();
            crate::format::header::check_disjoint(
                regions,
                crate::format::header::Aliases::Allowed,
            )?;
        }
        let data = DataFile::new(header_path.to_path_buf(), backing, header.data);
        Ok(PerfInput {
            path: path.to_path_buf(),
            header_path: header_path.to_path_buf(),
            is_dir: false,
            header,
            attrs,
            features,
            data_files: vec![data],
            file_len,
            mtime_ns: None,
            skipped: Vec::new(),
        })
    }

    fn add_dir_files(&mut self, dir: &Path) -> Result<()> {
        if !self.header.has_feature(FEAT_DIR_FORMAT) {
            return Err(Error::unsupported("directory has no DIR_FORMAT feature")
                .in_file(&self.header_path));
        }
        let mut names = Vec::new();
        for ent in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
            let ent = ent.map_err(|e| Error::io(dir, e))?;
            let name = ent.file_name().to_string_lossy().into_owned();
            if let Some(n) = name
                .strip_prefix("data.")
                .and_then(|n| n.parse::<u32>().ok())
            {
                names.push((n, ent.path()));
            }
        }
        names.sort();
        for (_, p) in names {
            // perf reads only regular data.N files and skips the rest: so do we, and
            // never open anything else (opening a FIFO blocks; a directory maps as
            // "No such device").
            let regular = std::fs::metadata(&p).is_ok_and(|m| m.is_file());
            if !regular {
                self.skipped.push(p);
                continue;
            }
            let f = open_nonblocking(&p)?;
            let meta = f.metadata().map_err(|e| Error::io(&p, e))?;
            if !meta.is_file() {
                // Replaced between the stat and the open.
                self.skipped.push(p);
                continue;
            }
            let len = meta.len();
            self.data_files.push(DataFile::new(
                p,
                Backing::File(f),
                Section {
                    offset: 0,
                    size: len,
                },
            ));
        }
        Ok(())
    }

    /// The note on `data.N` entries skipped (not regular files), if any.
    pub(crate) fn skipped_note(&self) -> Option<String> {
        (!self.skipped.is_empty()).then(|| {
            format!(
                "skipped {} data.N entries that are not regular files (as perf does): {}",
                self.skipped.len(),
                self.skipped
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })
    }

    /// Reads a feature section's payload.
    pub(crate) fn feature(&self, bit: u32) -> Option<Vec<u8>> {
        let (_, s) = self.features.iter().find(|(b, _)| *b == bit)?;
        self.data_files[0].read_at(s.offset, s.size).ok()
    }

    /// Total bytes of records over all streams (for progress).
    pub(crate) fn data_bytes(&self) -> u64 {
        self.data_files.iter().map(|d| d.range.size).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::walk::Windows;

    /// A window kept by the scan lends the resolve what lies inside it, byte for byte,
    /// and nothing once released; a range reaching past it is mapped anew.
    #[test]
    fn kept_window_lends_its_ranges() {
        let page = page_size() as usize;
        let bytes: Vec<u8> = (0..4 * page).map(|i| (i % 251) as u8).collect();
        let mut tmp = tempfile::NamedTempFile::new().unwrap();
        std::io::Write::write_all(&mut tmp, &bytes).unwrap();
        let f = File::open(tmp.path()).unwrap();
        let (start, len) = (100u64, 2 * page as u64);
        let df = DataFile::new(
            tmp.path().to_path_buf(),
            Backing::File(f),
            Section {
                offset: start,
                size: bytes.len() as u64 - start,
            },
        );
        let scan = Spread {
            file: &df,
            pool: None,
            keep: true,
        };
        let w = scan.window(start, len).unwrap();
        assert_eq!(&w[..], &bytes[100..100 + 2 * page]);
        let Window::Map(kept, ..) = &w else {
            panic!("a file window is a map")
        };
        // Inside: the same map, the right bytes.
        let inner = df.window(start + 10, 300).unwrap();
        match &inner {
            Window::Map(m, ..) => assert!(Arc::ptr_eq(m, kept)),
            Window::Mem(..) => panic!("a file window is a map"),
        }
        assert_eq!(&inner[..], &bytes[110..410]);
        // Past its end: a map of its own.
        let past = df.window(start + len - 8, 16).unwrap();
        match &past {
            Window::Map(m, ..) => assert!(!Arc::ptr_eq(m, kept)),
            Window::Mem(..) => panic!("a file window is a map"),
        }
        assert_eq!(&past[..], &bytes[100 + 2 * page - 8..100 + 2 * page + 8]);
        assert!(df.take_kept().is_some_and(|m| Arc::ptr_eq(&m, kept)));
        match df.window(start + 10, 300).unwrap() {
            Window::Map(m, ..) => assert!(!Arc::ptr_eq(&m, kept)),
            Window::Mem(..) => panic!("a file window is a map"),
        }
    }
}
