//! `--jit`: JIT code named like any DSO (perf's `inject -j, --jit`, docs/jit.md).
//!
//! A JIT that writes a jitdump (`jit-PID.dump`) maps it once, executable, so that
//! perf records the mapping as a marker. For each marker of a process in the
//! recording, each code load (and move) that samples touch ([`touched`]; every one
//! with `--jit-maps all`) becomes one MMAP2 record in build-ID form, and the loads
//! they map go into ONE ELF image beside the dump (`jit-PID.so`, each load at its
//! own offset, [`image`]): start = the code's address, pgoff = its offset in the
//! image, at the load's time. The dump is read twice: once for the records (and
//! where each load's records lie), then, once the choice is made, for the kept
//! loads alone ([`write_image`]).
//! perf resolves a sample by the map that covers it at the sample's time and replaces
//! overlapped maps as later ones arrive, so code moved or freed and its address
//! reused maps each sample to the code there at its time. As perf does, the
//! marker mmap is dropped, and so are anonymous maps (`//anon`, `[anon:`, `/memfd:`)
//! of the process after it (they would cover the JIT code again).
//!
//! The records go into the data where their time belongs: before the first record
//! (in file order) whose time is not earlier (see docs/jit.md for why that is as
//! safe as the recording itself under perf's round rule). Every other record is
//! copied byte for byte. The result is an intermediate recording (a temp file beside
//! the output) that the normal run then reads: the engine meets the images like any
//! DSO, puts their IDs in the table and perf's build-ID cache, and any mode
//! (`--mmap2-buildid-all`, streams, batch) works on it unchanged.
//!
//! Refused with a note (the dump left out, its marker kept, never a wrong symbol): a
//! recording from another host, one not recorded with `perf record -k 1`
//! (CLOCK_MONOTONIC, the jitdump's clock) or without sample-id trailers, a dump that
//! is missing, not a jitdump, of another process, changed between its two reads,
//! written with TSC timestamps or in the other byte order. Records written after the
//! recording's end (the JIT went on) are left out. A dump cut short is used up
//! to the cut; from the cut on, its code ranges are covered by anonymous maps so that
//! a sample after it never takes the name of code that may have been replaced.

mod flat;
pub(crate) mod image;
mod plain;
mod runs;
pub(crate) mod sha1;
#[cfg(test)]
mod tests;
mod touched;

use crate::format::Endian;
use crate::format::attr::{Attr, st};
use crate::format::buildid::BuildId;
use crate::format::header::{FEAT_HOSTNAME, FileHeader, PIPE_HEADER_SIZE, pipe_header};
use crate::format::jitdump::{self, JitdumpError, Reader, Record};
use crate::format::record::{RecordHeader, TrailerLayout, misc, out_of_band_len, parse_mmap, rt};
use crate::format::sample::{sample_id, sample_time};
use crate::options::JitMaps;
use crate::write::TempOutput;
use crate::{Error, Result};
use std::collections::{BinaryHeap, HashMap};
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// CLOCK_MONOTONIC, the clock of jitdump timestamps.
const CLOCK_MONOTONIC: u32 = 1;
/// attr flag bit `use_clockid`.
const USE_CLOCKID: u64 = 1 << 25;
/// Buffer for reading the recording and writing the intermediate.
const IO_BUF: usize = 128 << 10;
/// Buffer per dump's record list during the merge (many processes, little memory).
const LIST_BUF: usize = 64 << 10;
/// Code indexes remembered for CODE_MOVE records (V8 and CPython write none; a move
/// of an index beyond this many is left out with a note).
const MAX_INDEXES: usize = 2 << 20;
/// prot of the records: read and execute (samply keeps only executable maps).
const PROT_RX: u32 = 5;
/// flags of the records: MAP_PRIVATE.
const MAP_PRIVATE: u32 = 2;

/// Where each code index's load went (its record's number in the list), for
/// CODE_MOVE records: a list while no move has come (V8 and CPython write none, and
/// 50,000 inserts into a map were 5% of a run), a map from the first move on.
#[derive(Default)]
struct Indexes {
    list: Vec<(u64, u64)>,
    map: Option<HashMap<u64, u64>>,
}

impl Indexes {
    fn len(&self) -> usize {
        self.map.as_ref().map_or(self.list.len(), HashMap::len)
    }

    fn insert(&mut self, index: u64, rec: u64) {
        match &mut self.map {
            Some(m) => {
                m.insert(index, rec);
            }
            None => self.list.push((index, rec)),
        }
    }

    /// The record of the newest load of `index`.
    fn get(&mut self, index: u64) -> Option<u64> {
        let list = &mut self.list;
        self.map
            .get_or_insert_with(|| list.drain(..).collect())
            .get(&index)
            .copied()
    }
}

/// One mapping to insert, as written to a dump's list (56 bytes each; the pid is
/// the dump's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct MapRec {
    time: u64,
    tid: u32,
    start: u64,
    len: u64,
    /// Offset in the image; `u64::MAX`: an anonymous cover (dump cut short).
    pgoff: u64,
    /// The image: 0 the shared one, n the n-th single-load one.
    img: u64,
    /// The load's records in the dump: from offset `at`, `size` bytes (its lines and
    /// tables, then the load itself; `u32::MAX`: that or more), so that an image
    /// written later reads only the loads it holds.
    at: u64,
    size: u32,
}

impl MapRec {
    const SIZE: usize = 56;
    fn encode(&self) -> [u8; 56] {
        let mut b = [0u8; 56];
        b[0..8].copy_from_slice(&self.time.to_le_bytes());
        b[8..12].copy_from_slice(&self.tid.to_le_bytes());
        b[12..16].copy_from_slice(&self.size.to_le_bytes());
        b[16..24].copy_from_slice(&self.start.to_le_bytes());
        b[24..32].copy_from_slice(&self.len.to_le_bytes());
        b[32..40].copy_from_slice(&self.pgoff.to_le_bytes());
        b[40..48].copy_from_slice(&self.img.to_le_bytes());
        b[48..56].copy_from_slice(&self.at.to_le_bytes());
        b
    }
    fn decode(b: &[u8; 56]) -> MapRec {
        let u64at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
        let u32at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap_or([0; 4]));
        MapRec {
            time: u64at(0),
            tid: u32at(8),
            size: u32at(12),
            start: u64at(16),
            len: u64at(24),
            pgoff: u64at(32),
            img: u64at(40),
            at: u64at(48),
        }
    }
}

/// The recording's shape, as far as the pass needs it.
struct Layout {
    endian: Endian,
    /// Stream (pipe format) or file format.
    stream: bool,
    /// Where the records are.
    data: (u64, u64),
    attrs: Vec<Attr>,
    /// `(use_clockid, clockid)` of each attr.
    clocks: Vec<(bool, u32)>,
    hostname: Option<String>,
}

impl Layout {
    /// Each sample id's attr (its index in `attrs`).
    fn ids(&self) -> HashMap<u64, usize> {
        let mut ids = HashMap::new();
        for (i, a) in self.attrs.iter().enumerate() {
            for &id in &a.ids {
                ids.insert(id, i);
            }
        }
        ids
    }

    fn trailer(&self) -> TrailerLayout {
        self.attrs
            .first()
            .map(|a| TrailerLayout::new(a.sample_type, a.sample_id_all()))
            .unwrap_or_default()
    }
}

/// A marker mapping met in the data.
#[derive(Clone, Debug)]
struct Marker {
    offset: u64,
    pid: u32,
    time: Option<u64>,
    path: Vec<u8>,
}

/// An anonymous mapping, dropped when it follows a processed marker of its process.
#[derive(Clone, Copy, Debug)]
struct Anon {
    offset: u64,
    pid: u32,
    time: Option<u64>,
}

/// One processed dump.
struct Dump {
    marker: Marker,
    /// The shared image and its ID.
    image: PathBuf,
    id: Option<BuildId>,
    /// Single-load images (loads with CFI in a DWARF-unwound recording): their
    /// paths' code index and their IDs.
    singles: Vec<(u64, BuildId)>,
    list: File,
    count: u64,
    /// What its list's records cover (its cut's covers repeat its loads' ranges).
    extent: Extent,
    /// Its shared image, when it waits for the choice.
    pending: Option<Pending>,
    /// Where the loads of an image written after the choice went.
    placement: Option<Placement>,
}

/// What the records of a dump's list cover, noted as they are written.
#[derive(Clone, Copy, Debug)]
struct Extent {
    /// The lowest start and the highest end.
    lo: u64,
    hi: u64,
    /// The earliest time, and the latest so far.
    first: u64,
    last: u64,
    /// Whether the times never go down (a JIT whose threads take the time before
    /// the dump's lock writes some records late: Java's agent).
    sorted: bool,
}

impl Default for Extent {
    fn default() -> Self {
        Extent {
            lo: u64::MAX,
            hi: 0,
            first: u64::MAX,
            last: 0,
            sorted: true,
        }
    }
}

impl Extent {
    fn add(&mut self, r: &MapRec) {
        self.lo = self.lo.min(r.start);
        self.hi = self.hi.max(r.start.saturating_add(r.len));
        self.first = self.first.min(r.time);
        self.sorted &= r.time >= self.last;
        self.last = self.last.max(r.time);
    }
}

impl Dump {
    /// The jitdump's path, as its marker names it.
    fn marker_path(&self) -> PathBuf {
        use std::os::unix::ffi::OsStrExt;
        PathBuf::from(std::ffi::OsStr::from_bytes(&self.marker.path))
    }

    /// Where a record's load is in the shared image: its offset there, given its
    /// list's (shelf) offset; `None`: not in the image (never, for a kept record).
    fn image_offset(&self, pgoff: u64) -> Option<u64> {
        match &self.placement {
            None => Some(pgoff),
            Some(p) => p
                .shelf
                .binary_search(&pgoff)
                .ok()
                .and_then(|i| p.image.get(i).copied()),
        }
    }

    /// The image of a record: its path and ID.
    fn image_of(&self, img: u64) -> Option<(PathBuf, BuildId)> {
        if img == 0 {
            return Some((self.image.clone(), self.id?));
        }
        let (index, id) = *self.singles.get(usize::try_from(img - 1).ok()?)?;
        Some((single_path(&self.image, self.marker.pid, index), id))
    }
}

/// The image of one load: perf's name, `jitted-PID-INDEX.so` beside the dump (it
/// replaces perf inject's image of that load, if there is one). The name matters:
/// perf 7.3's libdw unwinder places `/tmp/jitted-*` images at their map's start
/// (perf's images start their code at 0x80, so start - pgoff would overlap the code
/// before them); under another name the frames of CPython's trampolines were lost.
fn single_path(shared: &Path, pid: u32, index: u64) -> PathBuf {
    shared.with_file_name(format!("jitted-{pid}-{index}.so"))
}

/// What the pass did (for the report's notes).
#[derive(Debug, Default)]
pub(crate) struct JitSummary {
    /// Notes for the report.
    pub notes: Vec<String>,
    /// Images written.
    pub images: Vec<PathBuf>,
    /// Wall time of the pass's stages (`jit-scan`, `jit-images`, `jit-merge`).
    pub timings: Vec<(&'static str, std::time::Duration)>,
}

/// The recording with the JIT records in it, ready for the normal run.
pub(crate) struct Prepared {
    /// The intermediate recording (removed when this is dropped).
    tmp: Option<TempOutput>,
    /// What happened.
    pub summary: JitSummary,
}

impl Prepared {
    /// The path the normal run reads: the intermediate, or the input itself when no
    /// dump was injected.
    pub(crate) fn input<'a>(&'a self, original: &'a Path) -> &'a Path {
        self.tmp.as_ref().map_or(original, |t| t.path.as_path())
    }
}

fn is_anon_name(name: &[u8]) -> bool {
    name.starts_with(b"//anon") || name.starts_with(b"[anon:") || name.starts_with(b"/memfd:")
}

/// A sequential reader of the records of `[from, to)`.
struct Records<R: Read> {
    r: R,
    at: u64,
    to: u64,
    e: Endian,
    buf: Vec<u8>,
}

impl Records<BufReader<File>> {
    /// The records of `l`'s data in the file at `path`.
    fn open(path: &Path, l: &Layout) -> Result<Self> {
        Self::open_range(path, l, l.data.0, l.data.1)
    }

    /// The records of `l`'s data from offset `from` (a record's) to `to`.
    fn open_range(path: &Path, l: &Layout, from: u64, to: u64) -> Result<Self> {
        let f = File::open(path).map_err(|e| Error::io(path, e))?;
        let mut r = BufReader::with_capacity(IO_BUF, f);
        r.seek(SeekFrom::Start(from))
            .map_err(|e| Error::io(path, e))?;
        Ok(Records {
            r,
            at: from,
            to,
            e: l.endian,
            buf: Vec::new(),
        })
    }
}

impl<R: Read> Records<R> {
    /// The next record (header and body, without an out-of-band payload, whose
    /// length comes second); `None` at the end.
    fn next(&mut self, name: &Path) -> Result<Option<(u64, u64)>> {
        if self.at >= self.to {
            return Ok(None);
        }
        let at = self.at;
        self.buf.resize(8, 0);
        self.r
            .read_exact(&mut self.buf)
            .map_err(|_| Error::format(at, "the data ends inside a record header").in_file(name))?;
        let h = RecordHeader::parse(&self.buf, self.e)
            .ok_or_else(|| Error::format(at, "record header").in_file(name))?;
        if (h.size as usize) < 8 {
            return Err(Error::format(
                at,
                format!("record of type {} has size {}", h.kind, h.size),
            )
            .in_file(name));
        }
        self.buf.resize(h.size as usize, 0);
        self.r.read_exact(&mut self.buf[8..]).map_err(|_| {
            Error::format(
                at,
                format!("the data ends inside a record of type {}", h.kind),
            )
            .in_file(name)
        })?;
        let extra = out_of_band_len(&h, &self.buf[8..], self.e).unwrap_or(0);
        match (h.size as u64)
            .checked_add(extra)
            .and_then(|n| at.checked_add(n))
        {
            Some(end) if end <= self.to => self.at = end,
            _ => {
                return Err(Error::format(
                    at,
                    format!(
                        "record of type {} and size {} runs past the end of the data ({:#x})",
                        h.kind, h.size, self.to
                    ),
                )
                .in_file(name));
            }
        }
        Ok(Some((at, extra)))
    }
}

/// The index in `l.attrs` of sample `rec`'s event (by its sample id, which the first
/// event's layout locates, as perf reads it).
fn sample_attr(rec: &[u8], l: &Layout, ids: &HashMap<u64, usize>) -> Option<usize> {
    if l.attrs.len() == 1 {
        return Some(0);
    }
    let t = l.attrs.first()?.sample_type;
    ids.get(&sample_id(rec, l.endian, t)?).copied()
}

/// The time of record `rec`: a sample's from its event's layout, any other's from
/// its sample-id trailer (the first event's layout, as perf reads it).
fn record_time(
    rec: &[u8],
    l: &Layout,
    trailer: &TrailerLayout,
    ids: &HashMap<u64, usize>,
) -> Option<u64> {
    let h = RecordHeader::parse(rec, l.endian)?;
    if h.kind == rt::SAMPLE {
        let attr = l.attrs.get(sample_attr(rec, l, ids)?)?;
        return sample_time(rec, l.endian, attr.sample_type);
    }
    if h.kind >= rt::USER_START {
        return None;
    }
    trailer.read(rec, l.endian).time
}

fn attr_clock(raw: &[u8], e: Endian, a: &Attr) -> (bool, u32) {
    let clockid = if a.size >= 96 {
        e.u32(raw, 92).unwrap_or(0)
    } else {
        0
    };
    (a.flags & USE_CLOCKID != 0, clockid)
}

/// Reads the layout of a file-format recording.
fn file_layout(path: &Path) -> Result<Layout> {
    input_layout(&crate::input::PerfInput::open(path)?, path)
}

/// The layout of an opened recording (of a directory: its header file's).
fn input_layout(input: &crate::input::PerfInput, path: &Path) -> Result<Layout> {
    let h = &input.header;
    let f = File::open(&input.header_path).map_err(|e| Error::io(path, e))?;
    let mut clocks = Vec::new();
    for (i, a) in input.attrs.iter().enumerate() {
        let mut raw = vec![0u8; h.attr_size.min(4096) as usize];
        let _ = f.read_exact_at(&mut raw, h.attrs.offset + i as u64 * h.attr_size);
        clocks.push(attr_clock(&raw, h.endian, a));
    }
    let hostname = input
        .feature(FEAT_HOSTNAME)
        .and_then(|p| crate::format::feature::parse_string(&p, h.endian));
    let df = &input.data_files[0];
    Ok(Layout {
        endian: h.endian,
        stream: false,
        data: (df.range.offset, df.range.offset + df.range.size),
        attrs: input.attrs.clone(),
        clocks,
        hostname,
    })
}

/// What pass 1 found: the markers, the anonymous maps, the newest record time, and
/// records that cut the data into [`SPLITS`] parts of about one size.
type Scanned = (Vec<Marker>, Vec<Anon>, u64, Vec<u64>);

/// Parts of about one size the scan notes record offsets for (the choice's pass
/// over the recording runs on as many cores as there are, up to this many).
const SPLITS: u64 = 8;

/// Pass 1: markers, anonymous maps and (for a stream) attrs and hostname. `None`
/// when the recording holds compressed records (it is then expanded first, see
/// [`plain`]).
fn scan(path: &Path, l: &mut Layout) -> Result<Option<Scanned>> {
    let mut recs = Records::open(path, l)?;
    let mut markers = Vec::new();
    let mut anons = Vec::new();
    let mut ids = l.ids();
    let mut trailer = l.trailer();
    let mut end_time = 0u64;
    let mut splits = Vec::new();
    let (from, len) = (l.data.0, l.data.1.saturating_sub(l.data.0));
    while let Some((at, extra)) = recs.next(path)? {
        while (splits.len() as u64) < SPLITS - 1
            && at - from >= len / SPLITS * (splits.len() as u64 + 1)
        {
            splits.push(at);
        }
        let rec = &recs.buf;
        let e = l.endian;
        let Some(h) = RecordHeader::parse(rec, e) else {
            continue;
        };
        if let Some(t) = record_time(rec, l, &trailer, &ids) {
            end_time = end_time.max(t);
        }
        match h.kind {
            rt::COMPRESSED | rt::COMPRESSED2 => return Ok(None),
            rt::HEADER_ATTR if l.stream => {
                let size = e.u32(rec, 12).unwrap_or(0) as usize;
                let raw = rec.get(8..8 + size.max(64)).unwrap_or(&[]);
                if let Some(mut a) = Attr::parse(raw, e, false) {
                    let mut o = 8 + a.size as usize;
                    while let Some(id) = e.u64(rec, o) {
                        a.ids.push(id);
                        ids.insert(id, l.attrs.len());
                        o += 8;
                    }
                    l.clocks.push(attr_clock(raw, e, &a));
                    l.attrs.push(a);
                    trailer = l.trailer();
                }
            }
            rt::HEADER_FEATURE if l.stream && e.u64(rec, 8) == Some(FEAT_HOSTNAME as u64) => {
                l.hostname = rec
                    .get(16..)
                    .and_then(|p| crate::format::feature::parse_string(p, e));
            }
            rt::MMAP | rt::MMAP2 => {
                let body_end = rec.len() - trailer.size.min(rec.len());
                if let Some(m) = parse_mmap(&h, rec, body_end, e) {
                    let time = trailer.read(rec, e).time;
                    if jitdump::marker_pid(m.filename).is_some_and(|p| p == m.pid) {
                        markers.push(Marker {
                            offset: at,
                            pid: m.pid,
                            time,
                            path: m.filename.to_vec(),
                        });
                    } else if is_anon_name(m.filename) {
                        anons.push(Anon {
                            offset: at,
                            pid: m.pid,
                            time,
                        });
                    }
                }
            }
            _ => {}
        }
        if extra > 0 {
            std::io::copy(&mut (&mut recs.r).take(extra), &mut std::io::sink())
                .map_err(|e| Error::io(path, e))?;
        }
    }
    Ok(Some((markers, anons, end_time, splits)))
}

/// The layout of the recording at `path` (its first bytes `head`, its length `len`).
fn layout(path: &Path, head: &[u8; 16], len: u64) -> Result<Layout> {
    Ok(match pipe_header(head) {
        Some(e) => Layout {
            endian: e,
            stream: true,
            data: (PIPE_HEADER_SIZE, len),
            attrs: Vec::new(),
            clocks: Vec::new(),
            hostname: None,
        },
        None => file_layout(path)?,
    })
}

/// Turns `input` (file or saved stream; stdin is spooled first) into a recording
/// with every usable jitdump's records in it, written beside `output`.
pub(crate) fn prepare(
    input: &Path,
    output: &Path,
    maps: JitMaps,
    pool: &rayon::ThreadPool,
) -> Result<Prepared> {
    let dash = |p: &Path| p.as_os_str() == "-";
    let dir = |p: &Path| -> PathBuf {
        match p.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        }
    };
    // Temp files go beside the output (or the input, for stdout), never to a tmpfs
    // /tmp: the intermediate is as large as the recording.
    let place = if !dash(output) {
        dir(output).join("jit")
    } else if !dash(input) {
        dir(input).join("jit")
    } else {
        PathBuf::from("jit")
    };
    let mut spool = None;
    let source: PathBuf = if dash(input) {
        // The jitdumps are complete only when the recording is: a stream is read to
        // its end before anything is written.
        let t = TempOutput::create(&place, false)?;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(&t.path)
            .map_err(|e| Error::io(&t.path, e))?;
        std::io::copy(&mut std::io::stdin().lock(), &mut f).map_err(|e| Error::io("<stdin>", e))?;
        let p = t.path.clone();
        spool = Some(t);
        p
    } else {
        input.to_path_buf()
    };
    let name = if dash(input) {
        Path::new("<stdin>")
    } else {
        input
    };
    let mut summary = JitSummary::default();
    let mut meta = std::fs::metadata(&source).map_err(|e| Error::io(name, e))?;
    // What the intermediate is dated like and takes the mode of: the recording's
    // header file (the engine dates a recording by it).
    let dated = if meta.is_dir() {
        std::fs::metadata(source.join("data")).map_err(|e| Error::io(name, e))?
    } else {
        meta.clone()
    };
    let mut flat = None;
    let source = if meta.is_dir() {
        // perf record --threads: the directory's files merged into one first.
        let t = std::time::Instant::now();
        let tmp = TempOutput::create(&place, false)?;
        let done = flat::flatten(&source, &tmp.path, &place)?;
        summary.notes.push(format!(
            "--jit: the directory's {} record files are written as one recording, merged by time{} (perf reads it as it reads the directory; perf inject --jit's output of a directory has no samples)",
            done.files,
            if done.expanded {
                ", their compressed records expanded"
            } else {
                ""
            }
        ));
        summary.notes.extend(done.skipped);
        summary.timings.push(("jit-flatten", t.elapsed()));
        like_recording(&tmp.path, &dated, true);
        let p = tmp.path.clone();
        meta = std::fs::metadata(&p).map_err(|e| Error::io(&p, e))?;
        flat = Some(tmp);
        p
    } else {
        source
    };
    let mut head = [0u8; 16];
    if meta.is_file() {
        File::open(&source)
            .and_then(|f| f.read_exact_at(&mut head, 0))
            .map_err(|e| Error::io(name, e))?;
    }
    let t = std::time::Instant::now();
    let mut l = layout(&source, &head, meta.len())?;
    let mut plain = None;
    let (markers, anons, end_time, splits) = match scan(&source, &mut l)
        .map_err(|e| rename_err(e, &source, name))?
    {
        Some(s) => s,
        None => {
            // perf record -z: expanded into a temp beside the output first.
            let t = TempOutput::create(&place, false)?;
            plain::decompress(&source, &l, &t.path).map_err(|e| rename_err(e, &source, name))?;
            let len = std::fs::metadata(&t.path)
                .map_err(|e| Error::io(&t.path, e))?
                .len();
            l = layout(&t.path, &head, len)?;
            let s = scan(&t.path, &mut l)
                .map_err(|e| rename_err(e, &t.path, name))?
                .ok_or_else(|| {
                    Error::Internal("--jit: compressed records after expanding them".into())
                })?;
            plain = Some(t);
            s
        }
    };
    let source = plain.as_ref().map_or(source, |t| t.path.clone());
    summary.timings.push(("jit-scan", t.elapsed()));
    if markers.is_empty() {
        summary.notes.push(
            "--jit: no jitdump marker (an executable mapping of a jit-PID.dump by its process) in the recording; nothing injected".into(),
        );
        return Ok(Prepared {
            tmp: flat.or(spool),
            summary,
        });
    }
    let t = std::time::Instant::now();
    // With every load mapped, each image is written as its dump is read; otherwise
    // once the choice says which loads it must hold.
    let writing = match maps {
        JitMaps::Touched => Writing::Later,
        JitMaps::Every => Writing::Now,
    };
    let mut dumps = make_dumps(pool, &l, &markers, end_time, writing, &mut summary)?;
    summary.timings.push(("jit-dumps", t.elapsed()));
    if dumps.is_empty() {
        return Ok(Prepared {
            tmp: flat.or(spool),
            summary,
        });
    }
    let mut kept = match maps {
        JitMaps::Touched => {
            let t = std::time::Instant::now();
            let c = touched::choose(&source, &l, &dumps, &splits, pool)
                .map_err(|e| rename_err(e, &source, name))?;
            summary.notes.extend(c.notes);
            summary.timings.push(("jit-touched", t.elapsed()));
            c.kept
        }
        JitMaps::Every => dumps.iter().map(|_| None).collect(),
    };
    if dumps.iter().any(|d| d.pending.is_some()) {
        let t = std::time::Instant::now();
        write_images(pool, end_time, &mut dumps, &mut kept, &mut summary);
        summary.timings.push(("jit-images", t.elapsed()));
    }
    let t = std::time::Instant::now();
    let out = TempOutput::create(&place, false)?;
    write_merged(&source, &out.path, &l, &dumps, kept, &anons)
        .map_err(|e| rename_err(e, &source, name))?;
    summary.timings.push(("jit-merge", t.elapsed()));
    like_recording(&out.path, &dated, !dash(input));
    for d in &dumps {
        if d.id.is_some() {
            summary.images.push(d.image.clone());
        }
    }
    if plain.is_some() {
        summary.notes.push(
            "--jit: the recording's compressed records (perf record -z) are written expanded, as perf inject writes them: the JIT records go between them by time".into(),
        );
    }
    drop(plain);
    drop(flat);
    drop(spool);
    Ok(Prepared {
        tmp: Some(out),
        summary,
    })
}

/// Dates the intermediate at `path` like the recording (`dated` is its header file's
/// metadata): the engine dates a recording by its file, and a DSO changed after the
/// recording must still look so. With `mode`, its permissions follow the recording's.
fn like_recording(path: &Path, dated: &std::fs::Metadata, mode: bool) {
    if let Ok(m) = dated.modified() {
        let _ = File::options()
            .write(true)
            .open(path)
            .and_then(|f| f.set_modified(m));
    }
    if mode {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(
            path,
            std::fs::Permissions::from_mode(dated.permissions().mode() & 0o7777),
        );
    }
}

fn rename_err(e: Error, tmp: &Path, name: &Path) -> Error {
    match e {
        Error::Format {
            file: Some(f),
            offset,
            what,
        } if f == tmp => Error::Format {
            file: Some(name.to_path_buf()),
            offset,
            what,
        },
        Error::Unsupported {
            file: Some(f),
            what,
        } if f == tmp => Error::Unsupported {
            file: Some(name.to_path_buf()),
            what,
        },
        e => e,
    }
}

/// Decides which markers' dumps are used, and writes their images and lists (each
/// process's on a core of its own).
fn make_dumps(
    pool: &rayon::ThreadPool,
    l: &Layout,
    markers: &[Marker],
    end_time: u64,
    writing: Writing,
    summary: &mut JitSummary,
) -> Result<Vec<Dump>> {
    let shown = |m: &Marker| String::from_utf8_lossy(&m.path).into_owned();
    let host = crate::buildid::host::HostInfo::detect();
    if let Some(h) = &l.hostname
        && *h != host.hostname
    {
        for m in markers {
            summary.notes.push(format!(
                "--jit: {} left out: the recording was made on host '{h}', this is '{}' (a jitdump here is not that process's)",
                shown(m),
                host.hostname
            ));
        }
        return Ok(Vec::new());
    }
    if l.hostname.is_none() {
        summary.notes.push(
            "--jit: jitdumps left out: the recording does not say which host it was made on".into(),
        );
        return Ok(Vec::new());
    }
    let trailer = l.trailer();
    if trailer.time_at.is_none() || trailer.tid_at.is_none() {
        summary.notes.push(
            "--jit: jitdumps left out: the recording's records carry no time and pid (sample_id_all with TID and TIME), so a code load cannot be placed at its time".into(),
        );
        return Ok(Vec::new());
    }
    if l.clocks.is_empty() || l.clocks.iter().any(|&(u, c)| !u || c != CLOCK_MONOTONIC) {
        summary.notes.push(
            "--jit: jitdumps left out: the recording was not made with perf record -k 1 (CLOCK_MONOTONIC, the clock of jitdump times), so code loads cannot be placed in time".into(),
        );
        return Ok(Vec::new());
    }
    let mut unique: Vec<&Marker> = Vec::new();
    for m in markers {
        if !unique.iter().any(|u| u.pid == m.pid && u.path == m.path) {
            unique.push(m);
        }
    }
    // Each process's dump on a core of its own. Two dumps of one pid would write
    // per-load images of the same names (`jitted-PID-N.so`): those go one by one.
    let distinct = unique
        .iter()
        .enumerate()
        .all(|(i, m)| unique[..i].iter().all(|u| u.pid != m.pid));
    let made: Vec<_> = if distinct {
        pool.install(|| {
            use rayon::prelude::*;
            unique
                .par_iter()
                .map(|m| make_dump(m, l, end_time, writing))
                .collect()
        })
    } else {
        unique
            .iter()
            .map(|m| make_dump(m, l, end_time, writing))
            .collect()
    };
    let mut dumps: Vec<Dump> = Vec::new();
    for (m, r) in unique.iter().zip(made) {
        match r {
            Ok((d, notes)) => {
                summary.notes.extend(notes);
                dumps.push(d);
            }
            Err(why) => summary
                .notes
                .push(format!("--jit: {} left out: {why}", shown(m))),
        }
    }
    Ok(dumps)
}

fn scratch_beside(path: &Path) -> std::io::Result<File> {
    let dir = path.parent().unwrap_or(Path::new("."));
    for n in 0..100u32 {
        let p = dir.join(format!(".pdi-jit-{}-{n}.list", std::process::id()));
        match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&p)
        {
            Ok(f) => {
                let _ = std::fs::remove_file(&p);
                return Ok(f);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(std::io::Error::other("no temp name"))
}

/// A load of a dump, with the lines and unwinding tables of the records before it
/// (perf attaches them to the next load).
struct Loaded<'a> {
    time: u64,
    /// Its records in the dump: from offset `at` (the first record after the load
    /// before it), `size` bytes up to its end.
    at: u64,
    size: u64,
    load: jitdump::CodeLoad<'a>,
    /// Its lines and tables (a walk for [`Want::Heads`] gives neither).
    lines: Option<image::DebugLines<'a>>,
    tables: Option<image::Tables<'a>>,
    /// What its tables map behind the code ([`image::Tables::mapped`]), in both.
    mapped: u64,
}

impl Loaded<'_> {
    /// Where a shelf of every load puts it.
    fn place(&self, shelf: &mut image::Shelf) -> image::Placed {
        shelf.place(self.load.code.len() as u64, self.mapped)
    }
}

/// What a walk's loads come with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Want {
    /// Where they go alone: the first read of a dump whose image is written later
    /// places loads and copies no line or table (a copy of each load's lines was a
    /// tenth of node's first read).
    Heads,
    /// Their lines and tables too, for an image.
    Bytes,
}

/// What a walk over a dump meets.
enum Step<'a> {
    Load(Loaded<'a>),
    Move { time: u64, mv: jitdump::CodeMove },
}

/// How a walk over a dump ended.
struct Walked {
    /// Offset of the first record not walked (a second walk stops there: a JIT still
    /// writing the dump adds records behind it).
    stop: u64,
    /// Why it ended before the dump's end, if it did.
    cut: Option<JitdumpError>,
    /// The latest time met.
    last_time: u64,
    /// Of the loads' times, addresses and sizes, to tell that a second walk met the
    /// loads the first one did.
    fingerprint: u64,
    /// Records written after the recording's end, left out.
    late: u64,
}

/// Walks `r`'s records up to offset `stop`, giving `each` every load (with code)
/// and move of the recording's time (up to `end_time`: a JIT that goes on after the
/// recording writes more, and a later process with the same pid rewrites the dump
/// from its start). Err: why the dump is left out.
fn walk<R: Read>(
    r: &mut Reader<R>,
    end_time: u64,
    stop: u64,
    want: Want,
    mut each: impl FnMut(Step<'_>) -> std::result::Result<(), String>,
) -> std::result::Result<Walked, String> {
    let swapped = r.header.swapped;
    // The last DEBUG_INFO's entries (its buffer reused: most loads of a JIT with
    // line tables have one) and whether they still wait for their load.
    let mut debug: Vec<u8> = Vec::new();
    let mut debug_waits = false;
    let mut debug_count = 0u64;
    let mut unwind: Option<(Vec<u8>, u64, u64)> = None;
    let mut last_time = 0u64;
    let mut fingerprint = 0u64;
    let mut cut = None;
    let mut late = 0u64;
    // Where the records of the next load begin.
    let mut group = r.offset();
    while r.offset() < stop {
        let entry = match r.next_entry() {
            Ok(Some(e)) => e,
            Ok(None) => break,
            Err(e) => {
                cut = Some(e);
                break;
            }
        };
        if entry.time > end_time {
            // No sample sees it (the header's own timestamp is the JIT's choice of
            // clock: V8 and CPython write wall-clock microseconds; records are
            // CLOCK_MONOTONIC). A thread that took its time before the dump's lock
            // may still write an earlier one after it: the walk goes on. A late load
            // still takes the lines and tables before it (perf gives them to the
            // next load in the dump), so that no later load gets them.
            late += 1;
            if let Record::Load(load) = &entry.record
                && !load.code.is_empty()
            {
                debug_waits = false;
                unwind = None;
            }
            continue;
        }
        last_time = last_time.max(entry.time);
        match entry.record {
            Record::Debug { count, raw, .. } => {
                debug.clear();
                if want == Want::Bytes {
                    debug.extend_from_slice(raw);
                }
                debug_waits = true;
                debug_count = count;
            }
            Record::Unwinding(u) => {
                let tables = image::Tables {
                    data: u.data,
                    hdr_size: u.eh_frame_hdr_size,
                    mapped: u.mapped_size,
                };
                let data = match want {
                    Want::Bytes => u.data.to_vec(),
                    Want::Heads => Vec::new(),
                };
                unwind = Some((data, u.eh_frame_hdr_size, tables.mapped()));
            }
            Record::Load(load) => {
                if load.code.is_empty() {
                    continue;
                }
                let code_addr = load.code_addr;
                let lines = (std::mem::take(&mut debug_waits) && want == Want::Bytes).then_some(
                    image::DebugLines {
                        raw: &debug,
                        count: debug_count,
                        swapped,
                        code_addr,
                    },
                );
                // Tables keep their clamped mapped size (the same bound again).
                let u = unwind.take();
                let mapped = u.as_ref().map_or(0, |&(_, _, m)| m);
                let tables = u
                    .as_ref()
                    .filter(|_| want == Want::Bytes)
                    .map(|(d, hdr, mapped)| image::Tables {
                        data: d,
                        hdr_size: *hdr,
                        mapped: *mapped,
                    });
                for v in [entry.time, code_addr, load.code.len() as u64] {
                    fingerprint =
                        (fingerprint.rotate_left(5) ^ v).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                }
                let end = entry.offset + entry.size;
                let at = std::mem::replace(&mut group, end);
                each(Step::Load(Loaded {
                    time: entry.time,
                    at,
                    size: end - at,
                    load,
                    lines,
                    tables,
                    mapped,
                }))?;
            }
            Record::Move(mv) => each(Step::Move {
                time: entry.time,
                mv,
            })?,
            Record::Close | Record::Unknown(_) => {}
        }
    }
    Ok(Walked {
        stop: r.offset(),
        cut,
        last_time,
        fingerprint,
        late,
    })
}

/// When a dump's shared image is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Writing {
    /// As the dump is read, with every load (`--jit-maps all`).
    Now,
    /// Once the records are chosen, with the loads they map ([`write_images`]); until
    /// then the list's offsets are those of a shelf of every load.
    Later,
}

/// A dump whose image waits for the choice ([`Writing::Later`]).
struct Pending {
    /// The dump's header.
    header: jitdump::Header,
    /// Where the first walk stopped, and what it met.
    stop: u64,
    fingerprint: u64,
    loads: u64,
    moves: u64,
}

/// Where the loads of an image written later went: the shelf offsets of the loads
/// it holds, sorted, and each one's offset in the image. `None` in [`Dump`]: the
/// image holds every load at its shelf offset.
struct Placement {
    shelf: Vec<u64>,
    image: Vec<u64>,
}

/// Reads one dump into its list of records and, unless it is written later, its
/// image. Err: why it is left out.
fn make_dump(
    m: &Marker,
    l: &Layout,
    end_time: u64,
    writing: Writing,
) -> std::result::Result<(Dump, Vec<String>), String> {
    // Where stacks are unwound (DWARF user stacks), every load keeps an image of its
    // own, perf's layout: perf's libdw unwinder reports each DSO's ELF to libdw at
    // its map's start - pgoff, so the loads of one shared image would be the same
    // ELF at as many overlapping places, which libdw refuses, and the unwinding
    // stops at the first JIT frame (measured: node, 3,136 of 4,135 chains cut). An
    // image of one load also gives perf its one .eh_frame_hdr where there is CFI.
    let per_load = l.attrs.iter().any(|a| a.sample_type & st::STACK_USER != 0);
    let writing = if per_load { Writing::Now } else { writing };
    use std::os::unix::ffi::OsStrExt;
    let path = PathBuf::from(std::ffi::OsStr::from_bytes(&m.path));
    let mut r = open_dump(&path, m)?;
    let stem = path
        .file_name()
        .map(|n| n.to_string_lossy().trim_end_matches(".dump").to_string())
        .unwrap_or_else(|| format!("jit-{}", m.pid));
    let image_path = path.with_file_name(format!("{stem}.so"));
    let fail = |e: Error| format!("cannot write its image: {e}");
    let mut img = match writing {
        Writing::Now => {
            Some(image::ImageWriter::create(&image_path, image::Kind::Shared).map_err(fail)?)
        }
        Writing::Later => None,
    };
    let mut shelf = image::Shelf::default();
    let mut shared_loads = 0u64;
    let mut dropped_tables = 0u64;
    let mut singles: Vec<(u64, BuildId)> = Vec::new();
    let list = scratch_beside(&image_path).map_err(|e| format!("cannot write beside it: {e}"))?;
    let mut lw = BufWriter::with_capacity(IO_BUF, list);
    let beside = |e: std::io::Error| format!("cannot write beside it: {e}");
    let mut notes = Vec::new();
    let mut indexes = Indexes::default();
    let (mut loads, mut moves, mut lost_moves) = (0u64, 0u64, 0u64);
    let mut count = 0u64;
    let mut extent = Extent::default();
    // Loads placed now need no line or table; loads written now, all of them.
    let want = match img {
        None if !per_load => Want::Heads,
        _ => Want::Bytes,
    };
    let walked = walk(&mut r, end_time, u64::MAX, want, |step| {
        let rec = match step {
            Step::Load(x) => {
                let (placed, which) = if per_load {
                    let sp = single_path(&image_path, m.pid, x.load.code_index);
                    let mut one =
                        image::ImageWriter::create(&sp, image::Kind::Single).map_err(fail)?;
                    let placed = one
                        .add(x.load.name, x.load.code, x.tables, x.lines)
                        .map_err(fail)?;
                    let done = one.finish().map_err(fail)?;
                    dropped_tables += done.dropped_tables;
                    singles.push((x.load.code_index, done.id));
                    (placed, singles.len() as u64)
                } else {
                    shared_loads += 1;
                    let placed = match &mut img {
                        Some(img) => img
                            .add(x.load.name, x.load.code, x.tables, x.lines)
                            .map_err(fail)?,
                        None => x.place(&mut shelf),
                    };
                    (placed, 0)
                };
                if indexes.len() < MAX_INDEXES {
                    indexes.insert(x.load.code_index, count);
                }
                loads += 1;
                MapRec {
                    time: x.time,
                    tid: x.load.tid,
                    start: x.load.code_addr,
                    len: placed.len,
                    pgoff: placed.offset,
                    img: which,
                    at: x.at,
                    // A load whose records run long (many records between it and the
                    // one before) is found by reading the dump again from its start,
                    // not held whole.
                    size: u32::try_from(x.size)
                        .ok()
                        .filter(|&n| u64::from(n) <= READ_RUN)
                        .unwrap_or(u32::MAX),
                }
            }
            Step::Move { time, mv } => {
                let Some(n) = indexes.get(mv.code_index) else {
                    lost_moves += 1;
                    return Ok(());
                };
                let load = written_rec(&lw, count, n).map_err(beside)?;
                moves += 1;
                MapRec {
                    time,
                    tid: mv.tid,
                    start: mv.new_code_addr,
                    len: mv.code_size.min(load.len).max(1),
                    ..load
                }
            }
        };
        extent.add(&rec);
        count += 1;
        lw.write_all(&rec.encode()).map_err(beside)
    })?;
    let shown = path.display();
    if let Some(c) = &walked.cut {
        // From the cut on, code may have been loaded where older code was: every range
        // loaded so far is covered by an anonymous map at the cut's time.
        let t = match c {
            JitdumpError::Truncated { time: Some(t), .. } => (*t).max(walked.last_time),
            _ => walked.last_time,
        }
        .saturating_add(1);
        lw.flush().map_err(beside)?;
        let f = lw.get_ref().try_clone().map_err(beside)?;
        // The covers go behind the records they repeat, which are read back from
        // the flushed part of the file.
        read_list(&f, count, beside, |_, rec| {
            let cover = MapRec {
                time: t,
                pgoff: u64::MAX,
                ..rec
            };
            lw.write_all(&cover.encode()).map_err(beside)
        })?;
        count *= 2;
        notes.push(format!(
            "--jit: {shown} is cut short ({c}): its {loads} code loads before the cut are used; samples in JIT code from {t} ns on show as [unknown] (code loaded after the cut is not in the dump, and must not take an older load's name)"
        ));
    }
    if walked.late > 0 {
        notes.push(if loads == 0 {
            format!(
                "--jit: {shown}: no code load of it was written before the recording's end ({} records after it: a later process with the same pid rewrote it, or the JIT loaded its code after the recording)",
                walked.late
            )
        } else {
            format!(
                "--jit: {shown}: {} records written after the recording's end left out (the JIT went on after the recording)",
                walked.late
            )
        });
    }
    if lost_moves > 0 {
        notes.push(format!(
            "--jit: {shown}: {lost_moves} code moves name a load not in the dump; left out"
        ));
    }
    // An image no load went to is not written.
    let id = match img {
        Some(img) if shared_loads > 0 => {
            let done = img.finish().map_err(fail)?;
            dropped_tables += done.dropped_tables;
            Some(done.id)
        }
        _ => None,
    };
    if dropped_tables > 0 {
        notes.push(dropped_note(&shown, dropped_tables));
    }
    let list = lw.into_inner().map_err(|e| beside(e.into_error()))?;
    if !extent.sorted {
        // The merge releases each list's records in list order, one waiting at a
        // time: a record behind a later one would be written after records of later
        // times, past rounds perf has already flushed. Sorted by time (stable: list
        // order breaks ties), the list is in the order the engine keys it.
        sort_list(&list, count, &image_path).map_err(beside)?;
    }
    let pending = (writing == Writing::Later && shared_loads > 0).then_some(Pending {
        header: r.header,
        stop: walked.stop,
        fingerprint: walked.fingerprint,
        loads,
        moves,
    });
    if pending.is_none() {
        let mut into = Vec::new();
        if let Some(id) = id {
            into.push(format!("{} (build ID {id})", image_path.display()));
        }
        if !singles.is_empty() {
            into.push(format!(
                "{} images of one load each (jitted-{}-N.so: a recording with DWARF stacks, one image per load as perf's DWARF unwinding needs)",
                singles.len(),
                m.pid
            ));
        }
        notes.push(format!(
            "--jit: {shown}: {loads} code loads{} into {}; {count} MMAP2 records",
            moves_said(moves),
            into.join(" and ")
        ));
    }
    Ok((
        Dump {
            marker: m.clone(),
            image: image_path,
            id,
            singles,
            list,
            count,
            extent,
            pending,
            placement: None,
        },
        notes,
    ))
}

/// Records of a list read at once.
const LIST_CHUNK: usize = 4096;

/// The first `count` records of `list`, with their numbers, to `each` (read
/// [`LIST_CHUNK`] at a time; a read's error through `io`).
fn read_list<E>(
    list: &File,
    count: u64,
    io: impl Fn(std::io::Error) -> E,
    mut each: impl FnMut(u64, MapRec) -> std::result::Result<(), E>,
) -> std::result::Result<(), E> {
    let mut buf = vec![0u8; LIST_CHUNK.min(count as usize) * MapRec::SIZE];
    let mut at = 0u64;
    while at < count {
        let n = (count - at).min(LIST_CHUNK as u64) as usize;
        let b = &mut buf[..n * MapRec::SIZE];
        list.read_exact_at(b, at * MapRec::SIZE as u64)
            .map_err(&io)?;
        for (j, c) in b.as_chunks::<{ MapRec::SIZE }>().0.iter().enumerate() {
            each(at + j as u64, MapRec::decode(c))?;
        }
        at += n as u64;
    }
    Ok(())
}

/// Record `n` of the `count` a list being written through `lw` holds (in its buffer
/// still, or in the file).
fn written_rec(lw: &BufWriter<File>, count: u64, n: u64) -> std::io::Result<MapRec> {
    let size = MapRec::SIZE as u64;
    let buffered = lw.buffer();
    let flushed = (count * size).saturating_sub(buffered.len() as u64);
    let mut b = [0u8; MapRec::SIZE];
    let at = n * size;
    match at.checked_sub(flushed) {
        Some(i) => {
            let i = i as usize;
            let got = buffered
                .get(i..i + MapRec::SIZE)
                .ok_or_else(|| std::io::Error::other("a list record past its end"))?;
            b.copy_from_slice(got);
        }
        None => lw.get_ref().read_exact_at(&mut b, at)?,
    }
    Ok(MapRec::decode(&b))
}

fn moves_said(moves: u64) -> String {
    if moves > 0 {
        format!(" and {moves} moves")
    } else {
        String::new()
    }
}

fn dropped_note(shown: &std::path::Display<'_>, dropped: u64) -> String {
    format!(
        "--jit: {shown}: {dropped} loads without a name or lines (the image's 32-bit tables are full)"
    )
}

/// The jitdump of marker `m` at `path`, its header read and checked. Err: why it is
/// left out.
fn open_dump(path: &Path, m: &Marker) -> std::result::Result<Reader<File>, String> {
    let f = File::open(path).map_err(|e| format!("cannot open it: {e}"))?;
    let r = Reader::read_ahead(f).map_err(|e| e.to_string())?;
    let h = r.header;
    if h.swapped {
        return Err("written in the other byte order (not read yet)".into());
    }
    if h.flags & jitdump::FLAG_ARCH_TIMESTAMP != 0 {
        return Err("its times are TSC counts (JITDUMP_FLAGS_ARCH_TIMESTAMP), not read yet".into());
    }
    if h.pid != m.pid {
        return Err(format!(
            "it was written by process {}, the marker is process {}'s",
            h.pid, m.pid
        ));
    }
    Ok(r)
}

/// Shelf offsets an image written later holds at most one by one ([`Placement`]:
/// 16 bytes each); past them it holds every load.
const MAX_PLACED: usize = 1 << 20;

/// Writes the images that waited for the choice (each process's on a core of its
/// own), with the loads that `kept`'s records map; a dump that can no longer be
/// read as it was is left out (with its choice), with a note.
fn write_images(
    pool: &rayon::ThreadPool,
    end_time: u64,
    dumps: &mut Vec<Dump>,
    kept: &mut Vec<Option<Vec<bool>>>,
    summary: &mut JitSummary,
) {
    let done: Vec<std::result::Result<Vec<String>, String>> = pool.install(|| {
        use rayon::prelude::*;
        dumps
            .par_iter_mut()
            .zip(kept.par_iter())
            .map(|(d, k)| match d.pending.take() {
                Some(p) => write_image(d, &p, k.as_deref(), end_time),
                None => Ok(Vec::new()),
            })
            .collect()
    });
    let keep: Vec<bool> = done
        .into_iter()
        .map(|r| match r {
            Ok(notes) => {
                summary.notes.extend(notes);
                true
            }
            Err(why) => {
                summary.notes.push(why);
                false
            }
        })
        .collect();
    let mut flags = keep.iter();
    dumps.retain(|_| flags.next().copied().unwrap_or(true));
    let mut flags = keep.iter();
    kept.retain(|_| flags.next().copied().unwrap_or(true));
}

/// A load an image written later holds: its shelf offset, its records in the dump
/// (`at`, `size`) and the most bytes a kept record maps of it.
#[derive(Clone, Copy)]
struct Wanted {
    shelf: u64,
    at: u64,
    size: u32,
    len: u64,
}

/// Bytes of the dump read at once for the loads an image holds (runs of loads
/// whose records follow one another are read together).
const READ_RUN: u64 = 1 << 20;
/// Bytes between two wanted loads' records read with them rather than by a read of
/// their own (a read costs about what copying 5 KB does on this machine).
const READ_GAP: u64 = 4 << 10;

/// Writes dump `d`'s image with the loads its kept records map (`None`: all).
fn write_image(
    d: &mut Dump,
    p: &Pending,
    kept: Option<&[bool]>,
    end_time: u64,
) -> std::result::Result<Vec<String>, String> {
    let path = d.marker_path();
    let shown = path.display();
    let left_out = |why: String| format!("--jit: {shown} left out: {why}");
    let wanted = wanted(d, p, kept).map_err(|e| left_out(format!("cannot read its list: {e}")))?;
    let fail = |e: Error| left_out(format!("cannot write its image: {e}"));
    let changed = || {
        left_out(
            "it changed between its two reads (a later process with the same pid rewrote it)"
                .into(),
        )
    };
    let mut img = image::ImageWriter::create(&d.image, image::Kind::Shared).map_err(fail)?;
    let mut placed = Vec::with_capacity(wanted.as_ref().map_or(0, Vec::len));
    match &wanted {
        None => {
            // Every load, each at its shelf offset: the dump read again up to where
            // the first read stopped, and checked to be the same.
            let mut r = open_dump(&path, &d.marker).map_err(left_out)?;
            let mut shelf = image::Shelf::default();
            let mut loads = 0u64;
            let mut moved = false;
            let walked = walk(&mut r, end_time, p.stop, Want::Bytes, |step| {
                if let Step::Load(x) = step {
                    loads += 1;
                    let s = x.place(&mut shelf);
                    let at = img
                        .add(x.load.name, x.load.code, x.tables, x.lines)
                        .map_err(fail)?;
                    moved |= at != s;
                }
                Ok(())
            })
            .map_err(left_out)?;
            if moved || loads != p.loads || walked.fingerprint != p.fingerprint {
                return Err(changed());
            }
        }
        Some(w) => {
            // Only the loads wanted: their records read where the first read found
            // them, a window of near neighbours at once (a read per load was 6,000
            // reads and 40 % of node's image stage), each run of neighbours in it
            // walked alone; the bytes between runs are read, not walked.
            let f = File::open(&path).map_err(|e| left_out(format!("cannot open it: {e}")))?;
            let mut buf = Vec::new();
            let end_of = |x: &Wanted| x.at + u64::from(x.size);
            let mut i = 0;
            while i < w.len() {
                let from = w[i].at;
                let mut to = end_of(&w[i]);
                let mut j = i + 1;
                while j < w.len()
                    && w[j].at >= to
                    && w[j].at - to <= READ_GAP
                    && end_of(&w[j]) - from <= READ_RUN
                {
                    to = end_of(&w[j]);
                    j += 1;
                }
                buf.resize((to - from) as usize, 0);
                f.read_exact_at(&mut buf, from).map_err(|_| changed())?;
                let mut a = i;
                while a < j {
                    let mut b = a + 1;
                    let mut run_end = end_of(&w[a]);
                    while b < j && w[b].at == run_end {
                        run_end = end_of(&w[b]);
                        b += 1;
                    }
                    let run = &buf[(w[a].at - from) as usize..(run_end - from) as usize];
                    let mut r = Reader::records(run, p.header, w[a].at, run.len());
                    let mut k = a;
                    let walked = walk(&mut r, end_time, run_end, Want::Bytes, |step| {
                        let Step::Load(x) = step else {
                            return Ok(());
                        };
                        let want = w[..b].get(k).filter(|want| {
                            want.at == x.at
                                && x.place(&mut image::Shelf::at(want.shelf)).len >= want.len
                        });
                        if want.is_none() {
                            return Err(changed());
                        }
                        k += 1;
                        let at = img
                            .add(x.load.name, x.load.code, x.tables, x.lines)
                            .map_err(fail)?;
                        placed.push(at.offset);
                        Ok(())
                    })?;
                    if k != b || walked.cut.is_some() {
                        return Err(changed());
                    }
                    a = b;
                }
                i = j;
            }
        }
    }
    let done = img.finish().map_err(fail)?;
    d.id = Some(done.id);
    let mut notes = Vec::new();
    if done.dropped_tables > 0 {
        notes.push(dropped_note(&shown, done.dropped_tables));
    }
    let held = wanted.as_ref().map_or(p.loads, |v| v.len() as u64);
    notes.push(format!(
        "--jit: {shown}: {held} code loads{} into {} (build ID {}){}",
        moves_said(p.moves),
        d.image.display(),
        done.id,
        if held == p.loads {
            String::new()
        } else {
            format!(
                ": the loads samples touch, of {} (with --jit-maps all, every one)",
                p.loads
            )
        },
    ));
    d.placement = wanted.map(|w| Placement {
        shelf: w.iter().map(|x| x.shelf).collect(),
        image: placed,
    });
    Ok(notes)
}

/// The loads dump `d`'s kept records map, by shelf offset (the dump's order); `None`:
/// every load, or more than are held one by one, or one whose records are too long
/// to be read apart.
fn wanted(d: &Dump, p: &Pending, kept: Option<&[bool]>) -> std::io::Result<Option<Vec<Wanted>>> {
    let tidy = |v: &mut Vec<Wanted>| {
        // A load's moves map it too: one entry per load, with the most it maps.
        v.sort_unstable_by_key(|w| (w.shelf, std::cmp::Reverse(w.len)));
        v.dedup_by_key(|w| w.shelf);
        v.len() <= MAX_PLACED && (v.len() as u64) < p.loads
    };
    // None once the image must hold every load.
    let mut v: Option<Vec<Wanted>> = Some(Vec::new());
    read_list(
        &d.list,
        d.count,
        |e| e,
        |k, r| {
            let Some(w) = &mut v else {
                return Ok(());
            };
            let kept = kept.is_none_or(|kept| kept.get(k as usize).copied().unwrap_or(true));
            if r.pgoff == u64::MAX || !kept {
                return Ok(());
            }
            w.push(Wanted {
                shelf: r.pgoff,
                at: r.at,
                size: r.size,
                len: r.len,
            });
            if r.size == u32::MAX || (w.len() > 2 * MAX_PLACED && !tidy(w)) {
                v = None;
            }
            Ok(())
        },
    )?;
    Ok(v.and_then(|mut w| tidy(&mut w).then_some(w)))
}

/// Records of a list sorted in memory at once (28 MB of records, 56 MB while they
/// are sorted); a longer list is sorted in runs of this many on a scratch file and
/// merged back.
const SORT_RUN: u64 = 1 << 19;

/// Sorts the `count` records of a dump's list by time, in place (stable); `beside`
/// is where a scratch file may go.
fn sort_list(list: &File, count: u64, beside: &Path) -> std::io::Result<()> {
    sort_list_in_runs(list, count, SORT_RUN, || scratch_beside(beside))
}

/// [`sort_list`] with runs of `run` records (a scratch file from `scratch` when
/// there is more than one).
fn sort_list_in_runs(
    list: &File,
    count: u64,
    run: u64,
    scratch: impl FnOnce() -> std::io::Result<File>,
) -> std::io::Result<()> {
    const SIZE: u64 = MapRec::SIZE as u64;
    let sorted_run = |from: u64, n: u64| -> std::io::Result<Vec<u8>> {
        let len = usize::try_from(n * SIZE).map_err(std::io::Error::other)?;
        let mut b = vec![0u8; len];
        list.read_exact_at(&mut b, from * SIZE)?;
        let mut recs: Vec<MapRec> = b
            .as_chunks::<{ MapRec::SIZE }>()
            .0
            .iter()
            .map(MapRec::decode)
            .collect();
        recs.sort_by_key(|r| r.time);
        for (c, r) in b
            .as_chunks_mut::<{ MapRec::SIZE }>()
            .0
            .iter_mut()
            .zip(&recs)
        {
            *c = r.encode();
        }
        Ok(b)
    };
    if count <= run {
        return list.write_all_at(&sorted_run(0, count)?, 0);
    }
    // Runs sorted onto the scratch file at the list's own offsets, then merged back
    // (ties: the earlier run first, so the sort stays stable).
    let tmp = scratch()?;
    let runs: Vec<(u64, u64)> = (0..count.div_ceil(run))
        .map(|i| (i * run, run.min(count - i * run)))
        .collect();
    for &(from, n) in &runs {
        tmp.write_all_at(&sorted_run(from, n)?, from * SIZE)?;
    }
    let runs: Vec<(u64, u64)> = runs.iter().map(|&(from, n)| (from * SIZE, n)).collect();
    let mut merged =
        runs::Merge::new(&tmp, &runs, |r: &[u8; MapRec::SIZE]| MapRec::decode(r).time)?;
    let mut out = BufWriter::with_capacity(IO_BUF, list.try_clone()?);
    out.seek(SeekFrom::Start(0))?;
    while let Some(r) = merged.next()? {
        out.write_all(&r)?;
    }
    out.flush()
}

/// An MMAP2 record in build-ID form for `r` of `d`'s image (or an anonymous cover).
fn encode_record(r: &MapRec, d: &Dump, l: &Layout, trailer: &TrailerLayout, b: &mut Vec<u8>) {
    let e = l.endian;
    b.clear();
    // The shared image's path is borrowed: one record per load, 50,000 a dump.
    let single;
    let mut pgoff = r.pgoff;
    let image: Option<(&[u8], BuildId)> = match r.pgoff {
        u64::MAX => None,
        // A load the image does not hold maps nothing: an anonymous cover, never
        // another load's name.
        _ if r.img == 0 => d.id.zip(d.image_offset(r.pgoff)).map(|(id, at)| {
            pgoff = at;
            (d.image.as_os_str().as_encoded_bytes(), id)
        }),
        _ => {
            single = d.image_of(r.img);
            single
                .as_ref()
                .map(|(p, id)| (p.as_os_str().as_encoded_bytes(), *id))
        }
    };
    let name: &[u8] = image.map_or(b"//anon", |(p, _)| p);
    let cover = image.is_none();
    let name_len = (name.len() + 1).next_multiple_of(8);
    let size = 8 + 64 + name_len + trailer.size;
    b.extend_from_slice(&e.put_u32(rt::MMAP2));
    let m = misc::USER | if cover { 0 } else { misc::MMAP_BUILD_ID };
    b.extend_from_slice(&e.put_u16(m));
    b.extend_from_slice(&e.put_u16(size as u16));
    b.extend_from_slice(&e.put_u32(d.marker.pid));
    b.extend_from_slice(&e.put_u32(r.tid));
    b.extend_from_slice(&e.put_u64(r.start));
    b.extend_from_slice(&e.put_u64(r.len));
    b.extend_from_slice(&e.put_u64(if cover { 0 } else { pgoff }));
    match image {
        None => {
            b.extend_from_slice(&[0u8; 24]);
            b.extend_from_slice(&e.put_u32(PROT_RX));
            b.extend_from_slice(&e.put_u32(MAP_PRIVATE | 0x20));
        }
        Some((_, id)) => {
            let id = id.as_bytes();
            b.push(id.len() as u8);
            b.extend_from_slice(&[0, 0, 0]);
            let mut padded = [0u8; 20];
            padded[..id.len().min(20)].copy_from_slice(&id[..id.len().min(20)]);
            b.extend_from_slice(&padded);
            b.extend_from_slice(&e.put_u32(PROT_RX));
            b.extend_from_slice(&e.put_u32(MAP_PRIVATE));
        }
    }
    b.extend_from_slice(name);
    b.resize(8 + 64 + name_len, 0);
    let t = b.len();
    b.resize(t + trailer.size, 0);
    if let Some(o) = trailer.tid_at {
        b[t + o..t + o + 4].copy_from_slice(&e.put_u32(d.marker.pid));
        b[t + o + 4..t + o + 8].copy_from_slice(&e.put_u32(r.tid));
    }
    if let Some(o) = trailer.time_at {
        b[t + o..t + o + 8].copy_from_slice(&e.put_u64(r.time));
    }
}

/// A dump's list being merged.
struct ListReader {
    r: BufReader<File>,
    left: u64,
    /// Which records to give (`None`: all), by their number in the list.
    kept: Option<Vec<bool>>,
    n: usize,
}

impl ListReader {
    fn next(&mut self) -> Option<MapRec> {
        loop {
            if self.left == 0 {
                return None;
            }
            let mut b = [0u8; MapRec::SIZE];
            self.r.read_exact(&mut b).ok()?;
            self.left -= 1;
            self.n += 1;
            let kept = self
                .kept
                .as_ref()
                .is_none_or(|k| k.get(self.n - 1).copied().unwrap_or(true));
            if kept {
                return Some(MapRec::decode(&b));
            }
        }
    }
}

/// Pass 2: the recording again, with the dumps' records merged in by time, markers
/// and the anonymous maps after them dropped, every other byte copied.
fn write_merged(
    src: &Path,
    out: &Path,
    l: &Layout,
    dumps: &[Dump],
    kept: Vec<Option<Vec<bool>>>,
    anons: &[Anon],
) -> Result<()> {
    let e = l.endian;
    let trailer = l.trailer();
    let io_out = |err| Error::io(out, err);
    let f = File::open(src).map_err(|e| Error::io(src, e))?;
    let total = f.metadata().map_err(|e| Error::io(src, e))?.len();
    let mut r = BufReader::with_capacity(IO_BUF, f);
    let mut w = BufWriter::with_capacity(
        IO_BUF,
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .truncate(true)
            .open(out)
            .map_err(io_out)?,
    );
    // Everything before the records, as it is.
    std::io::copy(&mut (&mut r).take(l.data.0), &mut w).map_err(io_out)?;
    let ids = l.ids();
    let mut lists: Vec<Option<ListReader>> = Vec::with_capacity(dumps.len());
    debug_assert_eq!(kept.len(), dumps.len());
    for (d, kept) in dumps.iter().zip(kept) {
        let mut f = d.list.try_clone().map_err(|e| Error::io(&d.image, e))?;
        f.seek(SeekFrom::Start(0))
            .map_err(|e| Error::io(&d.image, e))?;
        lists.push(Some(ListReader {
            r: BufReader::with_capacity(LIST_BUF, f),
            left: d.count,
            kept,
            n: 0,
        }));
    }
    let marker_at: HashMap<u64, usize> = dumps
        .iter()
        .enumerate()
        .map(|(i, d)| (d.marker.offset, i))
        .collect();
    // Anonymous maps of a dump's process after its marker go (perf's jit_process).
    let drop_anon: std::collections::HashSet<u64> = anons
        .iter()
        .filter(|a| {
            dumps.iter().any(|d| {
                d.marker.pid == a.pid
                    && match (a.time, d.marker.time) {
                        (Some(t), Some(mt)) => t >= mt,
                        _ => a.offset > d.marker.offset,
                    }
            })
        })
        .map(|a| a.offset)
        .collect();
    // Released lists' heads, earliest first (ties: dump order, then list order).
    let mut heap: BinaryHeap<std::cmp::Reverse<(u64, usize, u64)>> = BinaryHeap::new();
    let mut heads: Vec<Option<MapRec>> = vec![None; dumps.len()];
    let mut seq = 0u64;
    let push_head = |i: usize,
                     lists: &mut Vec<Option<ListReader>>,
                     heads: &mut Vec<Option<MapRec>>,
                     heap: &mut BinaryHeap<_>,
                     seq: &mut u64| {
        if let Some(Some(lr)) = lists.get_mut(i)
            && let Some(rec) = lr.next()
        {
            heads[i] = Some(rec);
            *seq += 1;
            heap.push(std::cmp::Reverse((rec.time, i, *seq)));
        }
    };
    let mut recs = Records {
        r,
        at: l.data.0,
        to: l.data.1,
        e,
        buf: Vec::new(),
    };
    let mut written = 0u64;
    let mut rec_buf = Vec::new();
    let mut emit = |upto: Option<u64>,
                    heap: &mut BinaryHeap<std::cmp::Reverse<(u64, usize, u64)>>,
                    heads: &mut Vec<Option<MapRec>>,
                    lists: &mut Vec<Option<ListReader>>,
                    w: &mut BufWriter<File>,
                    written: &mut u64,
                    seq: &mut u64|
     -> std::io::Result<()> {
        while let Some(std::cmp::Reverse((t, i, _))) = heap.peek().copied() {
            if upto.is_some_and(|u| t > u) {
                break;
            }
            heap.pop();
            if let Some(rec) = heads[i].take() {
                encode_record(&rec, &dumps[i], l, &trailer, &mut rec_buf);
                w.write_all(&rec_buf)?;
                *written += rec_buf.len() as u64;
            }
            if let Some(Some(lr)) = lists.get_mut(i)
                && let Some(rec) = lr.next()
            {
                heads[i] = Some(rec);
                *seq += 1;
                heap.push(std::cmp::Reverse((rec.time, i, *seq)));
            }
        }
        Ok(())
    };
    while let Some((at, extra)) = recs.next(src)? {
        if let Some(&i) = marker_at.get(&at) {
            // The marker goes; its dump's records start here.
            push_head(i, &mut lists, &mut heads, &mut heap, &mut seq);
        } else if drop_anon.contains(&at) {
        } else {
            let t = record_time(&recs.buf, l, &trailer, &ids);
            if t.is_some() {
                emit(
                    t,
                    &mut heap,
                    &mut heads,
                    &mut lists,
                    &mut w,
                    &mut written,
                    &mut seq,
                )
                .map_err(io_out)?;
            }
            w.write_all(&recs.buf).map_err(io_out)?;
            written += recs.buf.len() as u64;
            if extra > 0 {
                let n = std::io::copy(&mut (&mut recs.r).take(extra), &mut w).map_err(io_out)?;
                written += n;
            }
            continue;
        }
        if extra > 0 {
            std::io::copy(&mut (&mut recs.r).take(extra), &mut std::io::sink()).map_err(io_out)?;
        }
    }
    emit(
        None,
        &mut heap,
        &mut heads,
        &mut lists,
        &mut w,
        &mut written,
        &mut seq,
    )
    .map_err(io_out)?;
    // What follows the records (a file's feature sections), as it is.
    let mut r = recs.r;
    let tail_from = l.data.1;
    r.seek(SeekFrom::Start(tail_from))
        .map_err(|e| Error::io(src, e))?;
    std::io::copy(&mut (&mut r).take(total.saturating_sub(tail_from)), &mut w).map_err(io_out)?;
    let f = w.into_inner().map_err(|err| io_out(err.into_error()))?;
    if !l.stream {
        fix_file_header(src, &f, out, l, written)?;
    }
    Ok(())
}

/// A file-format intermediate: its data size and every offset past the data follow
/// the data's new size (feature sections; attrs and ids written after the data).
fn fix_file_header(src: &Path, f: &File, out: &Path, l: &Layout, new_size: u64) -> Result<()> {
    let io_out = |err| Error::io(out, err);
    let e = l.endian;
    let old_end = l.data.1;
    let delta = new_size as i128 - (l.data.1 - l.data.0) as i128;
    let shift = |v: u64| -> u64 {
        if v >= old_end {
            (v as i128 + delta) as u64
        } else {
            v
        }
    };
    let len = f.metadata().map_err(io_out)?.len();
    let mut head = vec![0u8; 104.min(len as usize)];
    f.read_exact_at(&mut head, 0).map_err(io_out)?;
    let h = FileHeader::parse(&head, len).map_err(|e| e.in_file(src))?;
    head[48..56].copy_from_slice(&e.put_u64(new_size));
    let attrs_off = shift(h.attrs.offset);
    head[24..32].copy_from_slice(&e.put_u64(attrs_off));
    f.write_all_at(&head, 0).map_err(io_out)?;
    // Each attr's ids section.
    if h.attr_size >= 16 {
        let mut attrs = vec![0u8; h.attrs.size as usize];
        f.read_exact_at(&mut attrs, attrs_off).map_err(io_out)?;
        let idat = h.attr_size as usize - 16;
        for a in attrs.chunks_exact_mut(h.attr_size as usize) {
            if let Some(v) = e.u64(a, idat) {
                a[idat..idat + 8].copy_from_slice(&e.put_u64(shift(v)));
            }
        }
        f.write_all_at(&attrs, attrs_off).map_err(io_out)?;
    }
    // The feature table after the data.
    let table = shift(old_end);
    let n = h.feature_bits().count();
    let mut t = vec![0u8; 16 * n];
    f.read_exact_at(&mut t, table).map_err(io_out)?;
    for i in 0..n {
        if let Some(v) = e.u64(&t, 16 * i) {
            t[16 * i..16 * i + 8].copy_from_slice(&e.put_u64(shift(v)));
        }
    }
    f.write_all_at(&t, table).map_err(io_out)?;
    Ok(())
}

/// Adds the pass's notes to a run's report and names the original input.
pub(crate) fn conclude(p: &Prepared, report: &mut crate::report::Report) {
    report.notes.extend(p.summary.notes.iter().cloned());
    for (stage, d) in &p.summary.timings {
        report
            .timings_ms
            .insert((*stage).to_string(), d.as_secs_f64() * 1e3);
    }
}
