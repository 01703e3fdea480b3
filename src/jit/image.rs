//! One ELF image holding every code load of a jitdump, written as the dump is read.
//!
//! perf's `inject --jit` writes one image per code load (`jitted-PID-N.so`: the code
//! at file offset and address 0x80, one symbol, its lines and unwinding tables) and
//! maps each with pgoff 0x80. perf resolves a sample by its map alone (file offset =
//! ip - start + pgoff, then the symbol at that offset, since `.text`'s address equals
//! its offset), so one image can hold them all: each load at its own offset, mapped
//! by its own MMAP2 record whose pgoff is that offset (see docs/jit.md).
//!
//! Layout: ELF header, one PT_LOAD, `.text` from 0x80 (each load 16-byte aligned: its
//! code, zeros to 8 bytes, and the unwinding tables the JIT maps behind it, so a
//! record's length is perf's), then `.symtab` (one global function per load),
//! `.strtab`, `.shstrtab`, the build-ID note and, when the dump has DEBUG_INFO,
//! `.debug_line` (one sequence per load, ended at its last row as perf's genelf_debug
//! ends it; the source files in the header's table), `.debug_abbrev` and
//! `.debug_info` (one unit naming the line program and nothing else, as perf's: a unit
//! with an address range made perf 6.12 and 7.3 (libdw) give a line to addresses
//! before the first row and after the last row of a load, where perf's images have none).
//!
//! Memory: the code goes straight to the image (through a thread that hashes and
//! writes it, for a shared image); symbols, names and line programs go to unlinked
//! temp files beside it and are copied in at the end, so a dump of any size is
//! written in a few buffers. The build ID is the SHA-1 of the SHA-1 of `.text` and
//! the SHA-1 of the symbols, names and lines (and of the image's name and layout):
//! the same dump gives the same bytes and the same ID.

use super::sha1::Sha1;
use crate::format::buildid::BuildId;
use std::fs::File;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// Where `.text` starts in a shared image: after the ELF header and two program
/// headers (PT_LOAD and PT_NOTE, which readers that look for the build ID in segments
/// need), rounded up.
pub(crate) const TEXT_OFFSET: u64 = 0xc0;
/// Where it starts in a single-load image: perf's GEN_ELF_TEXT_OFFSET, after one
/// program header. perf 7.3's DWARF unwinder (libdw) lost the frames of JIT code
/// in single-load images with the shared layout (a PT_NOTE, `.text` at 0xc0); with
/// perf's own it unwinds them as through perf's images.
pub(crate) const SINGLE_TEXT_OFFSET: u64 = 0x80;
/// Alignment of each load in `.text`.
const LOAD_ALIGN: u64 = 16;
/// Largest string table and line program (their offsets are 32-bit).
const MAX_TABLE: u64 = u32::MAX as u64 - (1 << 20);
/// Names this writer's layout in the build ID: change it with the layout.
const LAYOUT_VERSION: &[u8] = b"pdinject jit image 2";
/// Bytes of source file names held for the line program's header (beyond it, lines
/// of further files are left out, with a note).
const MAX_FILE_TABLE: usize = 64 << 20;
/// Buffer of each temp stream.
const BUF: usize = 256 << 10;
/// Padding.
static ZEROS: [u8; 4096] = [0; 4096];

#[cfg(target_arch = "aarch64")]
const EM_HOST: u16 = 183;
#[cfg(target_arch = "x86")]
const EM_HOST: u16 = 3;
#[cfg(not(any(target_arch = "aarch64", target_arch = "x86")))]
const EM_HOST: u16 = 62;

/// Where one load went in the image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Placed {
    /// File offset (and address) of the code: the MMAP2's pgoff.
    pub offset: u64,
    /// Bytes perf maps for it: the code, or the code to 8 bytes and the unwinding
    /// tables the JIT maps behind it (perf's `ALIGN_8(csize) + mapped_size`).
    pub len: u64,
}

/// Where an image puts each load, without writing it: the rule [`ImageWriter::add`]
/// places loads by. It lets the list of
/// records be written before the image, which then holds only the loads the chosen
/// records map (at offsets of their own, which the records are given on the way out).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shelf {
    end: u64,
}

impl Default for Shelf {
    fn default() -> Self {
        Shelf { end: TEXT_OFFSET }
    }
}

impl Shelf {
    /// A shelf whose next load goes at `offset` (16-byte aligned).
    pub(crate) fn at(offset: u64) -> Shelf {
        Shelf { end: offset }
    }

    /// The place of a load of `csize` bytes of code with `mapped` bytes of tables
    /// mapped behind it (0: none).
    pub(crate) fn place(&mut self, csize: u64, mapped: u64) -> Placed {
        let offset = self.end.next_multiple_of(LOAD_ALIGN);
        let len = if mapped > 0 {
            csize.next_multiple_of(8) + mapped
        } else {
            csize
        };
        self.end = offset + len;
        Placed { offset, len }
    }
}

/// Unwinding tables of a load, as the jitdump gives them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tables<'a> {
    /// `.eh_frame` then `.eh_frame_hdr`.
    pub data: &'a [u8],
    /// Size of `.eh_frame_hdr` (the tail of `data`).
    pub hdr_size: u64,
    /// Bytes the JIT maps behind the code (0: none).
    pub mapped: u64,
}

impl Tables<'_> {
    /// Bytes mapped behind the code that the image holds: what the JIT says it maps,
    /// at most the tables it gave (a dump claiming more would have the image written
    /// with zeros without end; V8 maps exactly its tables).
    pub(crate) fn mapped(&self) -> u64 {
        self.mapped.min(self.data.len() as u64)
    }
}

/// What an image holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Every load of a dump, each at its own offset.
    Shared,
    /// One load with its unwinding tables as sections (`.eh_frame`, `.eh_frame_hdr`
    /// behind the code), perf's own layout: perf's DWARF unwinder finds a DSO's
    /// `.eh_frame_hdr` once per DSO and reads its table through the sample's map,
    /// so only an image of one load can carry a load's tables.
    Single,
}

/// A load's source lines as the dump gives them: the entries of the DEBUG_INFO
/// record before it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DebugLines<'a> {
    /// The entries.
    pub raw: &'a [u8],
    /// How many the record says there are.
    pub count: u64,
    /// Written in the other byte order.
    pub swapped: bool,
    /// The load's address (entries give absolute addresses).
    pub code_addr: u64,
}

/// A source line of a load, relative to its code.
struct Line<'a> {
    /// Offset in the code.
    at: u64,
    /// Line number.
    line: u32,
    /// File name (`None`: the previous one).
    file: Option<&'a [u8]>,
}

impl<'a> DebugLines<'a> {
    fn iter(self) -> impl Iterator<Item = Line<'a>> {
        let code_addr = self.code_addr;
        crate::format::jitdump::lines(self.raw, self.count, self.swapped).filter_map(move |x| {
            Some(Line {
                at: x.addr.checked_sub(code_addr)?,
                line: x.lineno,
                file: x.name,
            })
        })
    }
}

fn io_err(path: &Path, e: std::io::Error) -> crate::Error {
    crate::Error::io(path, e)
}

/// An unlinked temp file beside the image.
fn scratch(dir: &Path, tag: &str) -> crate::Result<File> {
    for n in 0..100u32 {
        let p = dir.join(format!(".pdi-jit-{}-{n}.{tag}", std::process::id()));
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
            Err(e) => return Err(io_err(&p, e)),
        }
    }
    Err(crate::Error::Internal(format!(
        "cannot create a temp file in {}",
        dir.display()
    )))
}

/// Bytes a table stream holds in memory before it moves to a file ([`Spill`]).
const SPILL: usize = 1 << 20;

/// A table on its way into the image: in memory up to [`SPILL`] bytes, past that in
/// an unlinked temp file beside the image, so that a small image costs no files of
/// its own (each file made and removed beside the dump cost ext4 an inode search)
/// and a large one a few buffers.
struct Spill {
    dir: PathBuf,
    tag: &'static str,
    mem: Vec<u8>,
    file: Option<BufWriter<File>>,
}

impl Spill {
    fn new(dir: &Path, tag: &'static str) -> Spill {
        Spill {
            dir: dir.to_path_buf(),
            tag,
            mem: Vec::new(),
            file: None,
        }
    }

    /// Appends the table to `out`; returns its length.
    fn copy_into(self, out: &mut impl Write) -> std::io::Result<u64> {
        match self.file {
            None => {
                out.write_all(&self.mem)?;
                Ok(self.mem.len() as u64)
            }
            Some(f) => {
                let mut f = f.into_inner().map_err(|e| e.into_error())?;
                f.seek(SeekFrom::Start(0))?;
                std::io::copy(&mut (&mut f).take(u64::MAX), out)
            }
        }
    }
}

impl Write for Spill {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if self.file.is_none() && self.mem.len() + b.len() > SPILL {
            let f = scratch(&self.dir, self.tag).map_err(std::io::Error::other)?;
            let mut f = BufWriter::with_capacity(BUF, f);
            f.write_all(&std::mem::take(&mut self.mem))?;
            self.file = Some(f);
        }
        match &mut self.file {
            Some(f) => f.write(b),
            None => {
                self.mem.extend_from_slice(b);
                Ok(b.len())
            }
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.as_mut().map_or(Ok(()), |f| f.flush())
    }
}

fn uleb(out: &mut Vec<u8>, mut v: u64) {
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

fn sleb(out: &mut Vec<u8>, mut v: i64) {
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        let done = (v == 0 && b & 0x40 == 0) || (v == -1 && b & 0x40 != 0);
        out.push(if done { b } else { b | 0x80 });
        if done {
            return;
        }
    }
}

/// Bytes handed to a worker thread at a time ([`Batches`]).
const BATCH: usize = 1 << 20;
/// Batches on their way to it (the memory it may hold back).
const QUEUE: usize = 4;

/// Bytes handed to a thread of its own in batches of about [`BATCH`], which it
/// folds one by one into its state `S` (stopping at its first error `E`); at most
/// [`QUEUE`] batches wait, and their buffers come back for reuse.
struct Batches<S, E> {
    /// The batch being filled.
    batch: Vec<u8>,
    to: std::sync::mpsc::SyncSender<Vec<u8>>,
    /// Batches done with, their buffers to reuse.
    back: std::sync::mpsc::Receiver<Vec<u8>>,
    /// Taken when it is joined.
    worker: Option<std::thread::JoinHandle<Result<S, E>>>,
}

impl<S: Send + 'static, E: Send + 'static> Batches<S, E> {
    /// Starts thread `name` with state `s`.
    fn spawn(
        name: &str,
        s: S,
        mut step: impl FnMut(&mut S, &[u8]) -> Result<(), E> + Send + 'static,
    ) -> std::io::Result<Self> {
        let (to, from) = std::sync::mpsc::sync_channel::<Vec<u8>>(QUEUE);
        let (give_back, back) = std::sync::mpsc::channel::<Vec<u8>>();
        let worker = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let mut s = s;
                for mut b in from {
                    // On an error the thread stops: the next send fails, the join
                    // says why.
                    step(&mut s, &b)?;
                    b.clear();
                    let _ = give_back.send(b);
                }
                Ok(s)
            })?;
        Ok(Batches {
            batch: Vec::with_capacity(BATCH),
            to,
            back,
            worker: Some(worker),
        })
    }

    /// Hands the batch over once it is full. Err: the thread stopped, with its own
    /// error (a full disk, say), or `None` if it failed otherwise.
    fn send_full(&mut self) -> Result<(), Option<E>> {
        if self.batch.len() < BATCH {
            return Ok(());
        }
        let next = self
            .back
            .try_recv()
            .unwrap_or_else(|_| Vec::with_capacity(BATCH));
        if self
            .to
            .send(std::mem::replace(&mut self.batch, next))
            .is_ok()
        {
            return Ok(());
        }
        match self.worker.take().map(|w| w.join()) {
            Some(Ok(Err(e))) => Err(Some(e)),
            _ => Err(None),
        }
    }

    /// The state once every batch is folded in; Err as [`Batches::send_full`].
    fn finish(self) -> Result<S, Option<E>> {
        let Batches {
            batch, to, worker, ..
        } = self;
        if !batch.is_empty() {
            let _ = to.send(batch);
        }
        drop(to);
        match worker.map(|w| w.join()) {
            Some(Ok(r)) => r.map_err(Some),
            _ => Err(None),
        }
    }
}

/// `.text` on its way into the image, with its SHA-1: for a shared image (tens of
/// megabytes) a thread of its own hashes and writes it while the next loads are read
/// and laid out (the hashing and the writes were half of a `--jit` run's image
/// stage on one core); an image of one load writes and hashes in line.
enum Text {
    Inline { out: BufWriter<File>, hash: Sha1 },
    Thread(Batches<(File, Sha1), std::io::Error>),
}

/// Why the thread writing `.text` stopped, when it gave no error of its own.
fn text_stopped(e: Option<std::io::Error>) -> std::io::Error {
    e.unwrap_or_else(|| std::io::Error::other("the image's writing thread stopped"))
}

impl Text {
    fn new(out: File, kind: Kind) -> Text {
        let inline = |out| Text::Inline {
            out: BufWriter::with_capacity(BUF, out),
            hash: Sha1::new(),
        };
        if kind == Kind::Single {
            return inline(out);
        }
        let Ok(spare) = out.try_clone() else {
            return inline(out);
        };
        let step = |(out, hash): &mut (File, Sha1), b: &[u8]| {
            hash.update(b);
            out.write_all(b)
        };
        match Batches::spawn("pdinject-jit-text", (out, Sha1::new()), step) {
            Ok(b) => Text::Thread(b),
            // No thread to be had: written in line.
            Err(_) => inline(spare),
        }
    }

    fn put(&mut self, b: &[u8]) -> std::io::Result<()> {
        match self {
            Text::Inline { out, hash } => {
                hash.update(b);
                out.write_all(b)
            }
            Text::Thread(t) => {
                t.batch.extend_from_slice(b);
                t.send_full().map_err(text_stopped)
            }
        }
    }

    /// The image file with all of `.text` in it, and `.text`'s SHA-1.
    fn finish(self) -> std::io::Result<(File, Sha1)> {
        match self {
            Text::Inline { out, hash } => Ok((out.into_inner().map_err(|e| e.into_error())?, hash)),
            Text::Thread(t) => t.finish().map_err(text_stopped),
        }
    }
}

/// One load for the tables: where its code went, its name and its lines.
struct Job<'a> {
    offset: u64,
    csize: u64,
    name: &'a [u8],
    lines: Option<DebugLines<'a>>,
}

impl<'a> Job<'a> {
    /// Appends the job to `b` (the tables thread's batch).
    fn encode(&self, b: &mut Vec<u8>) {
        b.extend_from_slice(&self.offset.to_le_bytes());
        b.extend_from_slice(&self.csize.to_le_bytes());
        b.extend_from_slice(&(self.name.len() as u64).to_le_bytes());
        b.extend_from_slice(self.name);
        match self.lines {
            None => b.push(0),
            Some(l) => {
                b.push(1 + u8::from(l.swapped));
                b.extend_from_slice(&l.code_addr.to_le_bytes());
                b.extend_from_slice(&l.count.to_le_bytes());
                b.extend_from_slice(&(l.raw.len() as u64).to_le_bytes());
                b.extend_from_slice(l.raw);
            }
        }
    }

    /// The job at the start of `b` and the bytes after it; `None` when `b` does not
    /// hold one (never, from [`Job::encode`]).
    fn decode(b: &'a [u8]) -> Option<(Job<'a>, &'a [u8])> {
        let u64at = |b: &[u8], at: usize| -> Option<u64> {
            Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
        };
        let offset = u64at(b, 0)?;
        let csize = u64at(b, 8)?;
        let n = usize::try_from(u64at(b, 16)?).ok()?;
        let name = b.get(24..24 + n)?;
        let mut rest = b.get(24 + n..)?;
        let tag = *rest.first()?;
        let lines = if tag == 0 {
            rest = rest.get(1..)?;
            None
        } else {
            let code_addr = u64at(rest, 1)?;
            let count = u64at(rest, 9)?;
            let len = usize::try_from(u64at(rest, 17)?).ok()?;
            let raw = rest.get(25..25 + len)?;
            rest = rest.get(25 + len..)?;
            Some(DebugLines {
                raw,
                count,
                swapped: tag == 2,
                code_addr,
            })
        };
        Some((
            Job {
                offset,
                csize,
                name,
                lines,
            },
            rest,
        ))
    }
}

/// The tables on their way: for a shared image a thread of its own lays out the
/// symbols and turns the dump's line entries into line programs (hundreds of
/// thousands for a node dump: the larger part of the image stage on one core)
/// while the reading thread goes on; an image of one load lays them out in line.
/// Either way the tables come out the same.
enum TableSink {
    Inline(Box<Tabler>),
    Thread(Batches<Tabler, crate::Error>),
}

/// Why the tables thread stopped, when it gave no error of its own.
fn tables_stopped(e: Option<crate::Error>) -> crate::Error {
    e.unwrap_or_else(|| crate::Error::Internal("the image's tables thread stopped".into()))
}

impl TableSink {
    fn new(t: Tabler, kind: Kind) -> crate::Result<TableSink> {
        if kind == Kind::Single {
            return Ok(TableSink::Inline(Box::new(t)));
        }
        let tmp = t.tmp.clone();
        let step = |t: &mut Tabler, mut rest: &[u8]| -> crate::Result<()> {
            while !rest.is_empty() {
                let (job, next) = Job::decode(rest).ok_or_else(|| {
                    crate::Error::Internal("a JIT image's table job cut short".into())
                })?;
                t.add(&job)?;
                rest = next;
            }
            Ok(())
        };
        Batches::spawn("pdinject-jit-tables", t, step)
            .map(TableSink::Thread)
            .map_err(|e| io_err(&tmp, e))
    }

    fn put(&mut self, job: &Job<'_>) -> crate::Result<()> {
        match self {
            TableSink::Inline(t) => t.add(job),
            TableSink::Thread(b) => {
                job.encode(&mut b.batch);
                b.send_full().map_err(tables_stopped)
            }
        }
    }

    /// The tables, every job laid out.
    fn finish(self) -> crate::Result<Tabler> {
        match self {
            TableSink::Inline(t) => Ok(*t),
            TableSink::Thread(b) => b.finish().map_err(tables_stopped),
        }
    }
}

/// The image being written.
pub(crate) struct ImageWriter {
    /// The final path.
    pub path: PathBuf,
    tmp: PathBuf,
    /// `.text`, written and hashed as it comes.
    text: Option<Text>,
    /// Symbols, names and lines, laid out as they come.
    tables: Option<TableSink>,
    text_end: u64,
    finished: bool,
    kind: Kind,
    /// End of the last load's code.
    code_end: u64,
    /// `.eh_frame` and `.eh_frame_hdr` (offset, size) of a [`Kind::Single`] image.
    eh: Option<[(u64, u64); 2]>,
}

/// A finished image.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Done {
    /// Its build ID.
    pub id: BuildId,
    /// Loads whose name or lines no longer fit the 32-bit tables.
    pub dropped_tables: u64,
}

/// The symbol table, string table and line programs of an image, each in memory or
/// an unlinked temp file until the image is finished ([`Spill`]), with their SHA-1.
struct Tabler {
    /// The image's temp path (for messages).
    tmp: PathBuf,
    syms: Spill,
    strs: Spill,
    lines: Spill,
    /// The SHA-1 of the symbols, names and lines, in the order they come.
    hash: Sha1,
    nsyms: u64,
    strs_len: u64,
    lines_len: u64,
    /// Source files by name, numbered from 1 in the line program's header.
    files: std::collections::HashMap<Vec<u8>, u64>,
    /// The header's file table (name, NUL, directory, time and size 0).
    file_names: Vec<u8>,
    /// The last file name met and its number (0: none yet).
    last_file: (Vec<u8>, u64),
    /// A load's line program, its buffer reused.
    prog: Vec<u8>,
    /// Loads whose name or lines no longer fit the 32-bit tables.
    dropped: u64,
}

impl ImageWriter {
    /// Starts the image at `path` (written to a temp name beside it, renamed by
    /// [`ImageWriter::finish`]).
    pub(crate) fn create(path: &Path, kind: Kind) -> crate::Result<Self> {
        let dir = path.parent().unwrap_or(Path::new("."));
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = dir.join(format!(".{name}.pdinject-{}.tmp", std::process::id()));
        let f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .map_err(|e| io_err(&tmp, e))?;
        // Headers are written last, over zeros.
        let text_at = match kind {
            Kind::Shared => TEXT_OFFSET,
            Kind::Single => SINGLE_TEXT_OFFSET,
        };
        f.set_len(text_at).map_err(|e| io_err(&tmp, e))?;
        let mut f = f;
        f.seek(SeekFrom::Start(text_at))
            .map_err(|e| io_err(&tmp, e))?;
        let text = Text::new(f, kind);
        let mut strs = Spill::new(dir, "str");
        strs.write_all(&[0]).map_err(|e| io_err(&tmp, e))?;
        let tabler = Tabler {
            tmp: tmp.clone(),
            syms: Spill::new(dir, "sym"),
            strs,
            lines: Spill::new(dir, "line"),
            hash: Sha1::new(),
            nsyms: 0,
            strs_len: 1,
            lines_len: 0,
            files: std::collections::HashMap::new(),
            file_names: Vec::new(),
            last_file: (Vec::new(), 0),
            prog: Vec::new(),
            dropped: 0,
        };
        Ok(ImageWriter {
            path: path.to_path_buf(),
            text: Some(text),
            tables: Some(TableSink::new(tabler, kind)?),
            tmp,
            text_end: text_at,
            finished: false,
            kind,
            code_end: text_at,
            eh: None,
        })
    }

    fn put_text(&mut self, b: &[u8]) -> crate::Result<()> {
        if let Some(t) = &mut self.text {
            t.put(b).map_err(|e| io_err(&self.tmp, e))?;
        }
        self.text_end += b.len() as u64;
        Ok(())
    }

    /// Adds one load: its code, the unwinding tables mapped behind it (`mapped` bytes
    /// of `unwinding`, zero-padded), its symbol and its lines.
    pub(crate) fn add(
        &mut self,
        name: &[u8],
        code: &[u8],
        unwinding: Option<Tables<'_>>,
        lines: Option<DebugLines<'_>>,
    ) -> crate::Result<Placed> {
        let csize = code.len() as u64;
        // Where the load goes and what a record maps of it: the shelf's rule, so
        // that a list written before its image names the same places.
        let placed = Shelf::at(self.text_end).place(csize, unwinding.map_or(0, |t| t.mapped()));
        let offset = placed.offset;
        self.put_text(&ZEROS[..(offset - self.text_end) as usize])?;
        self.put_text(code)?;
        self.code_end = offset + csize;
        let single = self.kind == Kind::Single;
        if let Some(t) = unwinding.filter(|u| u.mapped() > 0 || single) {
            let aligned = csize.next_multiple_of(8);
            self.put_text(&ZEROS[..(aligned - csize) as usize])?;
            // A shared image keeps what the JIT maps behind the code (the bytes a
            // record covers); a single one the whole tables, as sections.
            let take = if single {
                t.data.len()
            } else {
                t.mapped() as usize
            };
            let eh_at = self.text_end;
            self.put_text(&t.data[..take])?;
            if single {
                let hdr = t.hdr_size.min(take as u64);
                let eh_size = take as u64 - hdr;
                self.eh = Some([(eh_at, eh_size), (eh_at + eh_size, hdr)]);
            }
        }
        let job = Job {
            offset,
            csize,
            name,
            lines,
        };
        match &mut self.tables {
            Some(t) => t.put(&job)?,
            None => {
                return Err(crate::Error::Internal(
                    "a JIT image's tables are gone".into(),
                ));
            }
        }
        Ok(placed)
    }

    /// Writes the tables and headers, syncs nothing (perf does not either; the
    /// output's own commit is what makes a run durable), renames the image into
    /// place, and returns its build ID.
    pub(crate) fn finish(mut self) -> crate::Result<Done> {
        self.finished = true;
        let path = self.path.clone();
        let tmp = self.tmp.clone();
        let text_end = self.text_end;
        // A single load's .text is its code; its tables follow as their own sections.
        let text_size = match self.kind {
            Kind::Single => self.code_end - SINGLE_TEXT_OFFSET,
            Kind::Shared => text_end - TEXT_OFFSET,
        };
        let eh = self.eh;
        let twice = || crate::Error::Internal("a JIT image finished twice".into());
        let r = (|| {
            let t = self.tables.take().ok_or_else(twice)?.finish()?;
            let (out, text_hash) = self
                .text
                .take()
                .ok_or_else(twice)?
                .finish()
                .map_err(|e| io_err(&tmp, e))?;
            let mut tables = t.hash;
            tables.update(&t.file_names);
            // The ID hashes the two digests: `.text` and the tables are hashed apart, so
            // that one can be hashed beside the other.
            let mut hash = Sha1::new();
            hash.update(&text_hash.finish());
            hash.update(&tables.finish());
            let id = Self::write_tables(
                &path,
                &tmp,
                out,
                t.syms,
                t.strs,
                t.lines,
                hash,
                text_end,
                t.nsyms,
                t.strs_len,
                t.lines_len,
                &t.file_names,
                text_size,
                eh,
                self.kind,
            )?;
            Ok(Done {
                id,
                dropped_tables: t.dropped,
            })
        })();
        if r.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        r
    }

    #[allow(clippy::too_many_arguments)]
    fn write_tables(
        path: &Path,
        tmp: &Path,
        out: File,
        syms: Spill,
        strs: Spill,
        lines: Spill,
        hash: Sha1,
        text_end: u64,
        nsyms: u64,
        strs_len: u64,
        lines_len: u64,
        files: &[u8],
        text_size: u64,
        eh: Option<[(u64, u64); 2]>,
        kind: Kind,
    ) -> crate::Result<BuildId> {
        let (text_at, phnum) = match kind {
            Kind::Shared => (TEXT_OFFSET, 2u16),
            Kind::Single => (SINGLE_TEXT_OFFSET, 1u16),
        };
        let e = |err| io_err(tmp, err);
        // The image names itself (`.comment`), so that two processes whose JITs wrote
        // the same code get two IDs, not one ID claimed for two paths.
        let mut name_note = b"pdinject --jit: ".to_vec();
        name_note.extend_from_slice(
            path.file_name()
                .map(|n| n.as_encoded_bytes())
                .unwrap_or_default(),
        );
        name_note.push(0);
        let mut hash = hash;
        hash.update(&name_note);
        // And the layout, so that an image laid out differently (another kind, or
        // another version of this writer) never shares an ID with this one.
        hash.update(LAYOUT_VERSION);
        hash.update(&[kind as u8]);
        for v in [text_at, text_size, text_end] {
            hash.update(&v.to_le_bytes());
        }
        for (at, size) in eh.into_iter().flatten() {
            hash.update(&at.to_le_bytes());
            hash.update(&size.to_le_bytes());
        }
        let id_bytes = hash.finish();
        let id = BuildId::new(&id_bytes, 20)
            .ok_or_else(|| crate::Error::Internal("a 20-byte build ID".into()))?;
        let mut out = out;
        out.seek(SeekFrom::Start(text_end)).map_err(e)?;
        let mut out = BufWriter::with_capacity(BUF, out);
        let mut at = text_end;
        let align = |out: &mut BufWriter<File>, at: &mut u64, a: u64| -> std::io::Result<()> {
            let n = at.next_multiple_of(a) - *at;
            out.write_all(&vec![0u8; n as usize])?;
            *at += n;
            Ok(())
        };
        let copy = |out: &mut BufWriter<File>, src: Spill| src.copy_into(out);
        // .symtab: the null symbol, then one per load.
        align(&mut out, &mut at, 8).map_err(e)?;
        let symtab = at;
        out.write_all(&[0u8; 24]).map_err(e)?;
        let n = copy(&mut out, syms).map_err(e)?;
        at += 24 + n;
        let strtab = at;
        let n = copy(&mut out, strs).map_err(e)?;
        at += n;
        let _ = strs_len;
        let shstr: &[u8] = b"\0.text\0.shstrtab\0.symtab\0.strtab\0.note.gnu.build-id\0.debug_line\0.debug_info\0.debug_abbrev\0.eh_frame\0.eh_frame_hdr\0.comment\0";
        let name_of = |s: &str| -> u32 {
            let needle = format!("\0{s}\0");
            shstr
                .windows(needle.len())
                .position(|w| w == needle.as_bytes())
                .map_or(0, |p| p as u32 + 1)
        };
        let shstrtab = at;
        out.write_all(shstr).map_err(e)?;
        at += shstr.len() as u64;
        let comment = at;
        out.write_all(&name_note).map_err(e)?;
        at += name_note.len() as u64;
        align(&mut out, &mut at, 4).map_err(e)?;
        let note = at;
        let mut nb = Vec::with_capacity(36);
        nb.extend_from_slice(&4u32.to_le_bytes());
        nb.extend_from_slice(&20u32.to_le_bytes());
        nb.extend_from_slice(&3u32.to_le_bytes());
        nb.extend_from_slice(b"GNU\0");
        nb.extend_from_slice(&id_bytes);
        out.write_all(&nb).map_err(e)?;
        at += nb.len() as u64;
        let mut debug = None;
        if lines_len > 0 {
            let line = at;
            let mut h = Vec::with_capacity(30 + files.len());
            let header_len = 19 + files.len() as u64;
            h.extend_from_slice(&((6 + header_len + lines_len) as u32).to_le_bytes());
            h.extend_from_slice(&2u16.to_le_bytes());
            h.extend_from_slice(&(header_len as u32).to_le_bytes());
            // min_inst_length, default_is_stmt, line_base, line_range, opcode_base.
            h.extend_from_slice(&[1, 1, (-5i8) as u8, 14, 13]);
            h.extend_from_slice(&[0, 1, 1, 1, 1, 0, 0, 0, 1, 0, 0, 1]);
            // No include directories; the files.
            h.push(0);
            h.extend_from_slice(files);
            h.push(0);
            out.write_all(&h).map_err(e)?;
            let n = copy(&mut out, lines).map_err(e)?;
            at += h.len() as u64 + n;
            let abbrev = at;
            let ab: [u8; 8] = [1, 0x11, 0, 0x10, 0x06, 0, 0, 0];
            out.write_all(&ab).map_err(e)?;
            at += ab.len() as u64;
            let info = at;
            let mut i = Vec::with_capacity(32);
            i.extend_from_slice(&12u32.to_le_bytes());
            i.extend_from_slice(&2u16.to_le_bytes());
            i.extend_from_slice(&0u32.to_le_bytes());
            i.push(8);
            i.push(1);
            i.extend_from_slice(&0u32.to_le_bytes());
            out.write_all(&i).map_err(e)?;
            at += i.len() as u64;
            debug = Some((
                line,
                h.len() as u64 + lines_len,
                abbrev,
                ab.len() as u64,
                info,
                i.len() as u64,
            ));
        }
        align(&mut out, &mut at, 8).map_err(e)?;
        let shoff = at;
        // Section headers.
        let mut sh = Vec::new();
        let mut shdr = |name: u32,
                        kind: u32,
                        flags: u64,
                        addr: u64,
                        off: u64,
                        size: u64,
                        link: u32,
                        info: u32,
                        align: u64,
                        entsize: u64| {
            sh.extend_from_slice(&name.to_le_bytes());
            sh.extend_from_slice(&kind.to_le_bytes());
            sh.extend_from_slice(&flags.to_le_bytes());
            sh.extend_from_slice(&addr.to_le_bytes());
            sh.extend_from_slice(&off.to_le_bytes());
            sh.extend_from_slice(&size.to_le_bytes());
            sh.extend_from_slice(&link.to_le_bytes());
            sh.extend_from_slice(&info.to_le_bytes());
            sh.extend_from_slice(&align.to_le_bytes());
            sh.extend_from_slice(&entsize.to_le_bytes());
        };
        shdr(0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
        // .text: address = offset, so a symbol's value is its file offset.
        shdr(
            name_of(".text"),
            1,
            6,
            text_at,
            text_at,
            text_size,
            0,
            0,
            16,
            0,
        );
        shdr(
            name_of(".shstrtab"),
            3,
            0,
            0,
            shstrtab,
            shstr.len() as u64,
            0,
            0,
            1,
            0,
        );
        shdr(
            name_of(".symtab"),
            2,
            0,
            0,
            symtab,
            24 * (nsyms + 1),
            4,
            1,
            8,
            24,
        );
        shdr(
            name_of(".strtab"),
            3,
            0,
            0,
            strtab,
            symtab_gap(strtab, shstrtab),
            0,
            0,
            1,
            0,
        );
        shdr(name_of(".note.gnu.build-id"), 7, 2, 0, note, 36, 0, 0, 4, 0);
        if let Some((line, line_len, abbrev, abbrev_len, info, info_len)) = debug {
            shdr(name_of(".debug_line"), 1, 0, 0, line, line_len, 0, 0, 1, 0);
            shdr(name_of(".debug_info"), 1, 0, 0, info, info_len, 0, 0, 1, 0);
            shdr(
                name_of(".debug_abbrev"),
                1,
                0,
                0,
                abbrev,
                abbrev_len,
                0,
                0,
                1,
                0,
            );
        }
        if let Some([(eh_at, eh_size), (hdr_at, hdr_size)]) = eh {
            shdr(
                name_of(".eh_frame"),
                1,
                2,
                eh_at,
                eh_at,
                eh_size,
                0,
                0,
                8,
                0,
            );
            shdr(
                name_of(".eh_frame_hdr"),
                1,
                2,
                hdr_at,
                hdr_at,
                hdr_size,
                0,
                0,
                4,
                0,
            );
        }
        shdr(
            name_of(".comment"),
            1,
            0x30,
            0,
            comment,
            name_note.len() as u64,
            0,
            0,
            1,
            1,
        );
        let shnum = sh.len() as u64 / 64;
        out.write_all(&sh).map_err(e)?;
        let f = out.into_inner().map_err(|err| e(err.into_error()))?;
        // ELF header, PT_LOAD (.text, read and execute) and PT_NOTE.
        let mut h = Vec::with_capacity(text_at as usize);
        h.extend_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1, 1, 0]);
        h.extend_from_slice(&[0u8; 8]);
        h.extend_from_slice(&3u16.to_le_bytes()); // ET_DYN
        h.extend_from_slice(&EM_HOST.to_le_bytes());
        h.extend_from_slice(&1u32.to_le_bytes());
        h.extend_from_slice(&text_at.to_le_bytes()); // entry
        h.extend_from_slice(&64u64.to_le_bytes()); // phoff
        h.extend_from_slice(&shoff.to_le_bytes());
        h.extend_from_slice(&0u32.to_le_bytes());
        h.extend_from_slice(&64u16.to_le_bytes());
        h.extend_from_slice(&56u16.to_le_bytes());
        h.extend_from_slice(&phnum.to_le_bytes());
        h.extend_from_slice(&64u16.to_le_bytes());
        h.extend_from_slice(&(shnum as u16).to_le_bytes());
        h.extend_from_slice(&2u16.to_le_bytes()); // .shstrtab
        h.extend_from_slice(&1u32.to_le_bytes()); // PT_LOAD
        h.extend_from_slice(&5u32.to_le_bytes()); // R + X
        h.extend_from_slice(&text_at.to_le_bytes());
        h.extend_from_slice(&text_at.to_le_bytes());
        h.extend_from_slice(&text_at.to_le_bytes());
        h.extend_from_slice(&text_size.to_le_bytes());
        h.extend_from_slice(&text_size.to_le_bytes());
        h.extend_from_slice(&8u64.to_le_bytes());
        if phnum > 1 {
            h.extend_from_slice(&4u32.to_le_bytes()); // PT_NOTE: the build ID
            h.extend_from_slice(&4u32.to_le_bytes());
            h.extend_from_slice(&note.to_le_bytes());
            h.extend_from_slice(&note.to_le_bytes());
            h.extend_from_slice(&note.to_le_bytes());
            h.extend_from_slice(&36u64.to_le_bytes());
            h.extend_from_slice(&36u64.to_le_bytes());
            h.extend_from_slice(&4u64.to_le_bytes());
        }
        use std::os::unix::fs::FileExt;
        f.write_all_at(&h, 0).map_err(e)?;
        drop(f);
        // An image already at the path (a rerun, or an older process with this pid)
        // is unlinked first: renamed over, ext4 (auto_da_alloc) writes the new image's
        // blocks out at once, 25 ms of a 24 MB image, which a rename to a free name
        // leaves to the page cache. The window without an image at the path is what
        // a first run has; the old image, if it was needed, is in the build-ID cache.
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => return Err(io_err(path, err)),
        }
        std::fs::rename(tmp, path).map_err(|err| io_err(path, err))?;
        Ok(id)
    }
}

impl Tabler {
    /// Lays out one load's symbol, name and lines.
    fn add(&mut self, job: &Job<'_>) -> crate::Result<()> {
        let (offset, csize, name) = (job.offset, job.csize, job.name);
        // The symbol: name offset, global function in .text (section 1).
        let name = if name.is_empty() {
            b"[jit]" as &[u8]
        } else {
            name
        };
        let name_at = if self.strs_len + (name.len() as u64) < MAX_TABLE {
            let at = self.strs_len;
            self.strs
                .write_all(name)
                .map_err(|e| io_err(&self.tmp, e))?;
            self.strs
                .write_all(&[0])
                .map_err(|e| io_err(&self.tmp, e))?;
            self.hash.update(name);
            self.strs_len += name.len() as u64 + 1;
            at
        } else {
            self.dropped += 1;
            0
        };
        let mut sym = [0u8; 24];
        sym[0..4].copy_from_slice(&(name_at as u32).to_le_bytes());
        sym[4] = 0x12; // STB_GLOBAL, STT_FUNC
        sym[6..8].copy_from_slice(&1u16.to_le_bytes());
        sym[8..16].copy_from_slice(&offset.to_le_bytes());
        sym[16..24].copy_from_slice(&csize.to_le_bytes());
        self.syms
            .write_all(&sym)
            .map_err(|e| io_err(&self.tmp, e))?;
        self.hash.update(&sym);
        self.nsyms += 1;
        match job.lines {
            Some(l) => self.add_lines(offset, csize, l.iter()),
            None => Ok(()),
        }
    }

    /// One line-program sequence for the load at `offset` (as genelf_debug writes it:
    /// the address set once, then line and address advances, the file set where the
    /// name changes).
    fn add_lines<'a>(
        &mut self,
        offset: u64,
        csize: u64,
        lines: impl Iterator<Item = Line<'a>>,
    ) -> crate::Result<()> {
        let mut p = std::mem::take(&mut self.prog);
        p.clear();
        let mut last_at = 0u64;
        let mut last_line = 1i64;
        // The file number the rows are in (0: none yet).
        let mut file = 0u64;
        let mut rows = 0;
        for l in lines {
            // Rows go forward in a sequence and stay inside the code.
            if l.at >= csize || (rows > 0 && l.at < last_at) {
                continue;
            }
            if rows == 0 {
                p.extend_from_slice(&[0, 9, 2]);
                p.extend_from_slice(&offset.to_le_bytes());
            }
            if let Some(f) = l.file
                && (file == 0 || self.last_file.0 != f)
            {
                // Files go into the header's table, each name once: defining them in
                // the program (DW_LNE_define_file, as genelf_debug does) gave binutils'
                // reader garbage names once a program defined thousands. The last name
                // is compared before any is hashed: a load's rows, and a run of loads,
                // are mostly in one file.
                let known = if self.last_file.1 > 0 && self.last_file.0 == f {
                    Some(self.last_file.1)
                } else {
                    self.files.get(f).copied()
                };
                let n = match known {
                    Some(n) => n,
                    None if self.file_names.len() + f.len() + 4 <= MAX_FILE_TABLE => {
                        self.file_names.extend_from_slice(f);
                        self.file_names.extend_from_slice(&[0, 0, 0, 0]);
                        let n = self.files.len() as u64 + 1;
                        self.files.insert(f.to_vec(), n);
                        n
                    }
                    None => {
                        self.dropped += 1;
                        break;
                    }
                };
                p.push(4);
                uleb(&mut p, n);
                file = n;
                if self.last_file.0 != f {
                    self.last_file.0.clear();
                    self.last_file.0.extend_from_slice(f);
                    self.last_file.1 = n;
                }
            }
            if file == 0 {
                // Lines with no file yet name none perf could show.
                continue;
            }
            if i64::from(l.line) != last_line {
                p.push(3);
                sleb(&mut p, i64::from(l.line) - last_line);
                last_line = i64::from(l.line);
            }
            if l.at != last_at {
                p.push(2);
                uleb(&mut p, l.at - last_at);
                last_at = l.at;
            }
            p.push(1); // DW_LNS_copy
            rows += 1;
        }
        if rows == 0 {
            self.prog = p;
            return Ok(());
        }
        // The sequence ends at its last row, as genelf_debug ends it: code after the
        // last line the JIT gave has no line (perf shows none there either).
        p.extend_from_slice(&[0, 1, 1]); // DW_LNE_end_sequence
        if self.lines_len + p.len() as u64 > MAX_TABLE - MAX_FILE_TABLE as u64 {
            self.dropped += 1;
            self.prog = p;
            return Ok(());
        }
        self.lines.write_all(&p).map_err(|e| io_err(&self.tmp, e))?;
        self.hash.update(&p);
        self.lines_len += p.len() as u64;
        self.prog = p;
        Ok(())
    }
}

impl Drop for ImageWriter {
    /// An image not finished leaves nothing behind.
    fn drop(&mut self) {
        if !self.finished {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

fn symtab_gap(strtab: u64, shstrtab: u64) -> u64 {
    shstrtab - strtab
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shelf puts each load where the writer puts it, with and without tables
    /// mapped behind the code (and with more claimed mapped than given), so that a
    /// list written before its image names the offsets the image will have.
    #[test]
    fn a_shelf_places_loads_as_the_writer_does() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = ImageWriter::create(&dir.path().join("x.so"), Kind::Shared).unwrap();
        let mut shelf = Shelf::default();
        let code = [0x90u8; 100];
        let data = [1u8; 64];
        let mut x = 7u64;
        for i in 0..200u64 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            let csize = 1 + (x >> 40) as usize % code.len();
            let mapped = match i % 4 {
                0 => None,
                1 => Some(0),
                2 => Some(24 + (x >> 50) % 40),
                _ => Some(1 << 40),
            };
            let tables = mapped.map(|m| Tables {
                data: &data,
                hdr_size: 8,
                mapped: m,
            });
            let want = shelf.place(csize as u64, tables.map_or(0, |t| t.mapped()));
            let got = w.add(b"f", &code[..csize], tables, None).unwrap();
            assert_eq!(got, want, "load {i}");
            assert_eq!(
                Shelf::at(got.offset).place(csize as u64, tables.map_or(0, |t| t.mapped())),
                got
            );
        }
        w.finish().unwrap();
    }

    /// The tables thread reads back every job as it was put: a batch of jobs with and
    /// without lines, in either byte order, decodes to the same fields in order.
    #[test]
    fn jobs_decode_as_encoded() {
        let raw = [7u8; 40];
        let jobs = [
            Job {
                offset: 0xc0,
                csize: 12,
                name: b"JS:*f0",
                lines: None,
            },
            Job {
                offset: 0xd0,
                csize: 300,
                name: b"",
                lines: Some(DebugLines {
                    raw: &raw,
                    count: 2,
                    swapped: false,
                    code_addr: 0x7f00_0000_1000,
                }),
            },
            Job {
                offset: 0x200,
                csize: 1,
                name: b"py::f:<x>",
                lines: Some(DebugLines {
                    raw: &raw[..3],
                    count: 9,
                    swapped: true,
                    code_addr: 1,
                }),
            },
        ];
        let mut b = Vec::new();
        for j in &jobs {
            j.encode(&mut b);
        }
        let mut rest: &[u8] = &b;
        for j in &jobs {
            let (got, next) = Job::decode(rest).expect("a job");
            assert_eq!(
                (got.offset, got.csize, got.name),
                (j.offset, j.csize, j.name)
            );
            let fields = |l: Option<DebugLines<'_>>| {
                l.map(|l| (l.raw.to_vec(), l.count, l.swapped, l.code_addr))
            };
            assert_eq!(fields(got.lines), fields(j.lines));
            rest = next;
        }
        assert!(rest.is_empty());
        // A batch cut inside a job is not a job.
        assert!(Job::decode(&b[..b.len() - 1]).is_some());
        assert!(Job::decode(&b[..10]).is_none());
    }
}
