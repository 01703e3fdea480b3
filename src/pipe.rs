//! Pipe mode: `perf record -B -o - | pdinject --buildids - - | perf report -i -`.
//!
//! The file pipeline's stages, run as a stream. Whole records are read into a batch;
//! the scan feeds the batch into the growing model and cuts it into chunks where
//! compressed data is at a clean point; the chunks are resolved on the rayon pool
//! against a snapshot of the model; the DSOs hit for the first time are identified;
//! and the batch is written with a HEADER_BUILD_ID record for each new ID, placed
//! before the batch's first sample so perf knows the ID before any sample needs it.
//! Memory holds one batch and the model. A pipe has no header table: IDs travel as
//! records only, and every input record is passed through byte for byte.

use crate::buildid::{
    self, Evidence, Group, HostTrust, Outcome, RecordingTimes, Source, host::HostInfo,
};
use crate::format::Endian;
use crate::format::attr::{Attr, st};
use crate::format::feature::{BuildIdTable, parse_clock_data, parse_string};
use crate::format::header::{FEAT_ARCH, FEAT_CLOCK_DATA, FEAT_HOSTNAME, FEAT_OSRELEASE};
use crate::format::record::{RecordHeader, TrailerLayout, out_of_band_len, rt};
use crate::inject::{Mode, Options};
use crate::input::{Backing, DataFile};
use crate::model::ModelBuilder;
use crate::report::{DsoReport, Report};
use crate::resolve::unwind::{UnwindConfig, UnwindTables};
use crate::resolve::{Hits, Resolver};
use crate::scan::{Chunk, Rec, ScanOutput, Walker, on_record};
use crate::write::TempOutput;
use crate::write::stream::build_id_record;
use crate::{Error, Result};
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{BufWriter, IsTerminal, Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

/// Size of `struct perf_pipe_file_header`.
pub const PIPE_HEADER_SIZE: usize = 16;
/// Bytes read before a batch is resolved and written.
pub const BATCH_BYTES: usize = 64 << 20;
/// Target size of a resolve chunk within a batch.
const CHUNK_BYTES: u64 = 1 << 20;
/// Window of a regular file mapped at once by the first pass.
const DRY_WINDOW: u64 = 16 << 20;
/// Bytes read from the input at a time.
const READ_BLOCK: u64 = 4 << 20;
/// Largest out-of-band payload (AUXTRACE, TRACING_DATA) accepted in a stream.
const MAX_PAYLOAD: u64 = 1 << 30;
/// perf's `HEADER_LAST_FEATURE` terminator of the HEADER_FEATURE records.
const FEAT_TERMINATOR: u64 = 32;

/// The byte order of a pipe header, or None when `head` is not one (perf decides by
/// the header's size field being 16, also for regular files).
pub fn pipe_header(head: &[u8]) -> Option<Endian> {
    let e = match head.get(..8)? {
        b"PERFILE2" => Endian::Little,
        b"2ELIFREP" => Endian::Big,
        _ => return None,
    };
    (e.u64(head, 8)? == PIPE_HEADER_SIZE as u64).then_some(e)
}

/// True when `path` (not `-`) is a regular file in pipe format.
pub fn is_pipe_file(path: &Path) -> bool {
    let mut head = [0u8; PIPE_HEADER_SIZE];
    File::open(path)
        .and_then(|mut f| f.read_exact(&mut head))
        .is_ok()
        && pipe_header(&head).is_some()
}

/// Pipe mode from any reader to any writer. The input is taken as a live stream:
/// dated by perf's clock against this boot's monotonic clock, or, when they are far
/// apart (a replay), trusting no local file. `name` names the input in messages.
pub fn process(r: &mut dyn Read, w: &mut dyn Write, name: &Path, opts: &Options) -> Result<Report> {
    process_in_batches(r, w, name, opts, BATCH_BYTES)
}

/// [`process`] with batches of `batch` bytes (tests drive many small batches through
/// the carry-over from one batch to the next).
#[doc(hidden)]
pub fn process_in_batches(
    r: &mut dyn Read,
    w: &mut dyn Write,
    name: &Path,
    opts: &Options,
    batch: usize,
) -> Result<Report> {
    let pool = crate::inject::pool(opts.jobs)?;
    let mut s = Stream::new(
        name,
        opts,
        &pool,
        None,
        Target::Out(Box::new(w)),
        PathBuf::from("<output>"),
    );
    s.batch = batch.max(1);
    s.run(r)?;
    let mut report = s.finish()?;
    report.pipe = true;
    Ok(report)
}

/// Reads a pipe-format file through to its end without writing anything: Ok when
/// every record parses (what a reader of pdinject's pipe output may rely on).
pub fn validate(path: &Path) -> Result<()> {
    let opts = Options {
        jobs: Some(1),
        ..Options::default()
    };
    let pool = crate::inject::pool(opts.jobs)?;
    let mut f = File::open(path).map_err(|e| Error::io(path, e))?;
    let mut s = Stream::new(path, &opts, &pool, None, Target::Dry, PathBuf::new());
    s.run(&mut f)
}

/// When the recording ended, as far as the input can tell.
#[derive(Clone, Copy, Debug)]
enum End {
    /// A regular file: its mtime (ns since the epoch).
    File(i128),
    /// A live stream: now.
    Live,
}

fn is_dash(p: &Path) -> bool {
    p.as_os_str() == "-"
}

/// Runs pipe mode from `input` to `output`; either may be `-` (stdin, stdout). The
/// input must be in pipe format (`perf record -o -`); the output is too.
pub fn run(input: &Path, output: &Path, opts: &Options) -> Result<Report> {
    if !is_dash(input)
        && !is_dash(output)
        && (input == output || crate::inject::same_file(input, output))
    {
        return Err(Error::Usage(format!(
            "{}: output would overwrite the input; write to another file",
            output.display()
        )));
    }
    let in_name = if is_dash(input) {
        PathBuf::from("<stdin>")
    } else {
        input.to_path_buf()
    };
    let mut file = if is_dash(input) {
        use std::os::fd::AsFd;
        let fd = std::io::stdin()
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| Error::io(&in_name, e))?;
        File::from(fd)
    } else {
        // Hook (hostile input): a truncation while mapped names this input (SIGBUS).
        crate::write::interrupt::input_opened(input);
        File::open(input).map_err(|e| Error::io(input, e))?
    };
    let meta = file.metadata().map_err(|e| Error::io(&in_name, e))?;
    if meta.is_dir() {
        return Err(Error::Usage(format!(
            "{}: a directory recording cannot be read as a stream; give an output file",
            in_name.display()
        )));
    }
    let end = if meta.is_file() {
        use std::os::unix::fs::MetadataExt;
        End::File(meta.mtime() as i128 * 1_000_000_000 + meta.mtime_nsec() as i128)
    } else {
        End::Live
    };
    let pool = crate::inject::pool(opts.jobs)?;
    let pool = &pool;

    // A regular file is read twice: first for the span of its times, so that the
    // recording's start (its mtime minus the span) is known before any file is judged.
    let start_ns = match end {
        End::File(mtime) => {
            let first = file.stream_position().unwrap_or(0);
            let mut dry = Stream::new(&in_name, opts, pool, None, Target::Dry, PathBuf::new());
            dry.scan_mapped(&file, first, meta.len())?;
            Some(dry.start_from(mtime))
        }
        End::Live => None,
    };

    // stdout, or a temp file renamed over the output on success.
    let (writer, out_name, tmp): (Box<dyn Write>, PathBuf, Option<TempOutput>) = if is_dash(output)
    {
        if std::io::stdout().is_terminal() {
            return Err(Error::Usage(
                "refusing to write perf data to a terminal; redirect or pipe the output".into(),
            ));
        }
        let out = std::io::stdout().lock();
        (Box::new(out), PathBuf::from("<stdout>"), None)
    } else {
        // Hook (hostile input): the output's mode follows a file input's; 0600 from stdin.
        let mode = {
            use std::os::unix::fs::PermissionsExt;
            meta.is_file().then(|| meta.permissions().mode() & 0o7777)
        };
        let tmp = TempOutput::create_with_mode(output, false, mode)?;
        let w = std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&tmp.path)
            .map_err(|e| Error::io(&tmp.path, e))?;
        (Box::new(w), tmp.path.clone(), Some(tmp))
    };
    let mut s = Stream::new(
        &in_name,
        opts,
        pool,
        start_ns,
        Target::Out(Box::new(BufWriter::with_capacity(1 << 20, writer))),
        out_name.clone(),
    );
    s.total = meta.is_file().then_some(meta.len());
    let mut report = s
        .run(&mut file)
        .and_then(|()| s.finish())
        .map_err(|e| e.for_output(&out_name, output))?;
    drop(s);
    if let Some(tmp) = tmp {
        tmp.commit()?;
    }
    report.pipe = true;
    report.input = input.display().to_string();
    report.output = output.display().to_string();
    report.jobs = pool.current_num_threads();
    Ok(report)
}

/// Where a stream's records go.
enum Target<'w> {
    /// Nowhere: the first pass over a regular file, for its times.
    Dry,
    /// To a writer.
    Out(Box<dyn Write + 'w>),
}

/// One DSO name decided: its report entry.
struct Decided {
    report: DsoReport,
    dsos: Vec<u32>,
    /// The path was mapped from another file after the decision.
    later_file: bool,
}

/// The state of one pass over a stream.
struct Stream<'a, 'w> {
    name: PathBuf,
    opts: &'a Options,
    pool: &'a rayon::ThreadPool,
    /// Bytes of new records that make a batch.
    batch: usize,
    target: Target<'w>,
    /// The output's name in messages (the temp file, so errors name the real output).
    out_name: PathBuf,
    e: Endian,
    attrs: Vec<Attr>,
    features: HashMap<u64, Vec<u8>>,
    trailer: Option<TrailerLayout>,
    time_mode: Option<bool>,
    builder: ModelBuilder,
    scan: ScanOutput,
    walker: Walker,
    /// Bytes read and not yet written, starting at stream offset `base`.
    pending: Vec<u8>,
    base: u64,
    /// Bytes of `pending` already scanned.
    scanned: usize,
    /// Bytes of `pending` that hold whole records (the rest is a record still arriving).
    parsed: usize,
    /// Chunks of `pending` ready to resolve, and where the next one starts.
    /// Clean points at least CHUNK_BYTES apart after `base`: (offset, seq).
    cuts: Vec<(u64, u64)>,
    /// `seq` of the record at `base`.
    base_seq: u64,
    /// The last point at which compressed data is clean: (offset, seq).
    clean: (u64, u64),
    /// Clean points after the last two FINISHED_ROUND records, older first.
    rounds: [Option<(u64, u64)>; 2],
    /// Start of the recording in wall-clock ns, when known before the pass.
    start_ns: Option<i128>,
    /// Smallest and largest sample time seen by the scan.
    sample_times: Option<(u64, u64)>,
    /// Wall-clock ns when this pass began.
    began_ns: i128,
    /// Why local files were not trusted for some batch (an undated replay).
    undated: Option<String>,
    /// Things the user should know.
    notes: Vec<String>,
    /// Size of a regular file being read (for progress).
    total: Option<u64>,
    trust: Option<HostTrust>,
    host: Option<HostInfo>,
    unwind: Option<Option<UnwindConfig>>,
    tables: Option<UnwindTables>,
    decided: BTreeMap<(bool, String), Decided>,
    hits: Hits,
    t_resolve: Duration,
    t_identify: Duration,
}

impl<'a, 'w> Stream<'a, 'w> {
    fn new(
        name: &Path,
        opts: &'a Options,
        pool: &'a rayon::ThreadPool,
        start_ns: Option<i128>,
        target: Target<'w>,
        out_name: PathBuf,
    ) -> Self {
        Stream {
            name: name.to_path_buf(),
            opts,
            pool,
            batch: BATCH_BYTES,
            target,
            out_name,
            e: Endian::Little,
            attrs: Vec::new(),
            features: HashMap::new(),
            trailer: None,
            time_mode: None,
            builder: ModelBuilder::new(),
            scan: ScanOutput::default(),
            walker: Walker::new(Endian::Little, 0),
            pending: Vec::new(),
            base: PIPE_HEADER_SIZE as u64,
            scanned: 0,
            parsed: 0,
            cuts: Vec::new(),
            base_seq: 0,
            clean: (PIPE_HEADER_SIZE as u64, 0),
            rounds: [None, None],
            start_ns,
            sample_times: None,
            began_ns: wall_ns(),
            undated: None,
            notes: Vec::new(),
            total: None,
            trust: None,
            host: None,
            unwind: None,
            tables: None,
            decided: BTreeMap::new(),
            hits: Hits::default(),
            t_resolve: Duration::ZERO,
            t_identify: Duration::ZERO,
        }
    }

    fn err(&self, offset: u64, what: impl Into<String>) -> Error {
        Error::format(offset, what).in_file(&self.name)
    }

    fn write(&mut self, bytes: &[u8]) -> Result<()> {
        match &mut self.target {
            Target::Dry => Ok(()),
            Target::Out(w) => w.write_all(bytes).map_err(|e| Error::io(&self.out_name, e)),
        }
    }

    /// Takes the byte order from the pipe header read at `at`.
    fn start(&mut self, head: &[u8], at: u64) -> Result<()> {
        self.e = pipe_header(head).ok_or_else(|| {
            self.err(
                at,
                "not a pipe-format perf.data (perf record -o -); give a file-format perf.data by path, with an output file",
            )
        })?;
        self.walker = Walker::new(self.e, 0);
        Ok(())
    }

    /// The whole pass: header, then batches until the end of the stream.
    fn run(&mut self, r: &mut dyn Read) -> Result<()> {
        let mut head = [0u8; PIPE_HEADER_SIZE];
        let mut got = 0;
        while got < head.len() {
            match r.read(&mut head[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::io(&self.name, e)),
            }
        }
        self.start(&head, 0)?;
        self.write(&head)?;
        loop {
            let eof = self.fill(r)?;
            self.scan_pending(eof)?;
            self.flush_batch(eof)?;
            if eof {
                return Ok(());
            }
        }
    }

    /// The first pass over a regular file: the scan alone, over a map of the file in
    /// windows (record headers and times are touched, nothing is copied).
    fn scan_mapped(&mut self, file: &File, first: u64, len: u64) -> Result<()> {
        let mut head = [0u8; PIPE_HEADER_SIZE];
        std::os::unix::fs::FileExt::read_exact_at(file, &mut head, first)
            .map_err(|_| self.err(first, "not a pipe-format perf.data (too short)"))?;
        self.start(&head, first)?;
        let start = first + PIPE_HEADER_SIZE as u64;
        self.base = start;
        let df = DataFile {
            path: self.name.clone(),
            backing: Backing::File(file.try_clone().map_err(|e| Error::io(&self.name, e))?),
            range: crate::format::header::Section {
                offset: start,
                size: len.saturating_sub(start),
            },
        };
        self.scan_range(&df, start, len.max(start), DRY_WINDOW)
    }

    /// Reads until a batch of whole records is ready; true at the end of the stream.
    fn fill(&mut self, r: &mut dyn Read) -> Result<bool> {
        loop {
            self.parse_complete()?;
            if self.parsed - self.scanned >= self.batch {
                return Ok(false);
            }
            // Straight into the batch's spare capacity: no intermediate buffer, no
            // zeroing.
            let got = (&mut *r)
                .take(READ_BLOCK)
                .read_to_end(&mut self.pending)
                .map_err(|e| Error::io(&self.name, e))?;
            if got == 0 {
                if self.parsed < self.pending.len() {
                    let at = self.base + self.parsed as u64;
                    let what = match RecordHeader::parse(&self.pending[self.parsed..], self.e) {
                        Some(h) => format!(
                            "the stream ends inside a record of type {} and size {}",
                            h.kind, h.size
                        ),
                        None => "the stream ends inside a record header".into(),
                    };
                    return Err(self.err(at, what));
                }
                return Ok(true);
            }
        }
    }

    /// Advances `parsed` over the whole records (out-of-band payloads included) that
    /// `pending` holds.
    fn parse_complete(&mut self) -> Result<()> {
        loop {
            let rest = &self.pending[self.parsed..];
            let Some(h) = RecordHeader::parse(rest, self.e) else {
                return Ok(());
            };
            let at = self.base + self.parsed as u64;
            let size = h.size as usize;
            if size < 8 {
                return Err(self.err(
                    at,
                    format!(
                        "record of type {} has size {size}, smaller than its header",
                        h.kind
                    ),
                ));
            }
            if rest.len() < size {
                return Ok(());
            }
            let oob = out_of_band_len(&h, &rest[..size], self.e)
                .ok_or_else(|| self.err(at, "truncated out-of-band size"))?;
            if oob > MAX_PAYLOAD {
                return Err(self.err(
                    at,
                    format!(
                        "record of type {} announces {oob} payload bytes (more than {MAX_PAYLOAD})",
                        h.kind
                    ),
                ));
            }
            let total = size as u64 + oob;
            if (rest.len() as u64) < total {
                return Ok(());
            }
            self.parsed += total as usize;
        }
    }

    /// Scans the bytes read since the last scan: model, attrs, features, chunks.
    fn scan_pending(&mut self, eof: bool) -> Result<()> {
        let data = Arc::new(std::mem::take(&mut self.pending));
        let df = DataFile {
            path: self.name.clone(),
            backing: Backing::Mem(data.clone(), self.base),
            range: crate::format::header::Section {
                offset: self.base,
                size: data.len() as u64,
            },
        };
        let from = self.base + self.scanned as u64;
        let end = self.base + self.parsed as u64;
        let r = self.scan_range(&df, from, end, u64::MAX);
        drop(df);
        self.pending = Arc::try_unwrap(data).unwrap_or_else(|a| a.as_ref().clone());
        r?;
        self.scanned = self.parsed;
        if eof {
            self.clean = (end, self.walker.seq);
        }
        Ok(())
    }

    /// Where the bytes that may be resolved now end: (offset, seq). perf writes each
    /// CPU's buffer in turn, so a mapping can follow in the stream a sample that
    /// needs it; but a record after a FINISHED_ROUND is never older than everything
    /// before the round before it. Up to the second-to-last round, every mapping a
    /// sample needs has been read. Streams without rounds (one buffer, or old perf)
    /// resolve up to the last clean point, as does a carry grown past 4 batches.
    fn safe_end(&self, eof: bool) -> (u64, u64) {
        if eof {
            return self.clean;
        }
        match self.rounds {
            [Some(r), _] if r.0 > self.base => r,
            // Rounds come, but not two since the last flush: wait for the next one.
            [_, Some(_)] if self.pending.len() < 4 * self.batch => (self.base, self.base_seq),
            _ => self.clean,
        }
    }

    fn scan_range(&mut self, df: &DataFile, from: u64, end: u64, window: u64) -> Result<()> {
        let e = self.e;
        let Stream {
            attrs,
            features,
            trailer,
            time_mode,
            builder,
            scan,
            walker,
            cuts,
            base,
            clean,
            rounds,
            name,
            sample_times,
            ..
        } = self;
        // Hook (limits policy): the model may grow with the stream's bytes.
        builder.account_input(end.saturating_sub(from));
        // The record just walked was a FINISHED_ROUND (read by `after`).
        let at_round = std::cell::Cell::new(false);
        let mut on_rec = |r: &Rec<'_>| -> Result<()> {
            scan.records += 1;
            at_round.set(r.header.kind == rt::FINISHED_ROUND && !r.inner);
            match r.header.kind {
                rt::HEADER_ATTR => {
                    let body = r.bytes.get(8..).unwrap_or_default();
                    let mut a = Attr::parse(body, e, e == Endian::Big).ok_or_else(|| {
                        Error::format(r.offset, "HEADER_ATTR record holds no valid attr")
                    })?;
                    let ids_at = a.size as usize;
                    a.ids = body
                        .get(ids_at..)
                        .unwrap_or_default()
                        .chunks_exact(8)
                        .filter_map(|c| e.u64(c, 0))
                        .collect();
                    attrs.push(a);
                    if trailer.is_none() {
                        *trailer = Some(TrailerLayout::new(
                            attrs[0].sample_type,
                            attrs[0].sample_id_all(),
                        ));
                    }
                    Ok(())
                }
                rt::HEADER_FEATURE => {
                    let id = e.u64(r.bytes, 8).ok_or_else(|| {
                        Error::format(r.offset, "HEADER_FEATURE record is truncated")
                    })?;
                    if id != FEAT_TERMINATOR && features.len() < 256 {
                        features.insert(id, r.bytes[16..].to_vec());
                    }
                    Ok(())
                }
                rt::SAMPLE => {
                    scan.samples += 1;
                    let t = attrs
                        .first()
                        .and_then(|a| sample_time(r.bytes, e, a.sample_type))
                        .filter(|&t| t != 0);
                    if let Some(t) = t {
                        let (lo, hi) = sample_times.get_or_insert((t, t));
                        *lo = (*lo).min(t);
                        *hi = (*hi).max(t);
                    }
                    if attrs.is_empty() {
                        return Err(Error::format(
                            r.offset,
                            "SAMPLE record before any HEADER_ATTR",
                        ));
                    }
                    Ok(())
                }
                kind => {
                    let Some(t) = trailer.as_ref() else {
                        if matches!(
                            kind,
                            rt::SAMPLE | rt::MMAP | rt::MMAP2 | rt::COMM | rt::FORK
                        ) {
                            return Err(Error::format(
                                r.offset,
                                format!("record of type {kind} before any HEADER_ATTR"),
                            ));
                        }
                        return Ok(());
                    };
                    let tm = *time_mode.get_or_insert_with(|| {
                        attrs.iter().all(|a| a.sample_type & st::TIME != 0)
                            && attrs[0].sample_id_all()
                    });
                    on_record(r, e, t, tm, builder, scan).map_err(|err| match err {
                        Error::Format {
                            file: None, what, ..
                        } if r.inner => {
                            Error::format(r.offset, format!("in compressed data: {what}"))
                        }
                        other => other,
                    })
                }
            }
        };
        let mut after = |w: &Walker, next: u64| -> Result<()> {
            if w.is_clean() {
                *clean = (next, w.seq);
                let last = cuts.last().map_or(*base, |c| c.0);
                if next - last >= CHUNK_BYTES {
                    cuts.push((next, w.seq));
                }
                if at_round.get() {
                    *rounds = [rounds[1], Some((next, w.seq))];
                }
            }
            Ok(())
        };
        walker
            .walk(df, from, end, window, &mut on_rec, &mut after)
            .map_err(|err| err.in_file(name))
    }

    /// Resolves the ready chunks, identifies DSOs hit for the first time, and writes
    /// the ready bytes with the new build-ID records; keeps the rest for later.
    fn flush_batch(&mut self, eof: bool) -> Result<()> {
        let (upto, upto_seq) = self.safe_end(eof);
        if upto <= self.base {
            if self.pending.len() > 16 * self.batch {
                return Err(self.err(
                    self.base,
                    format!(
                        "compressed data runs for more than {} MB without reaching a record boundary",
                        (16 * self.batch) >> 20
                    ),
                ));
            }
            return Ok(());
        }
        let mut chunks = Vec::new();
        let (mut start, mut seq) = (self.base, self.base_seq);
        for &(off, s) in self.cuts.iter().filter(|c| c.0 < upto) {
            chunks.push(Chunk {
                file: 0,
                start,
                end: off,
                first_seq: seq,
            });
            (start, seq) = (off, s);
        }
        chunks.push(Chunk {
            file: 0,
            start,
            end: upto,
            first_seq: seq,
        });
        self.cuts.retain(|c| c.0 > upto);
        let mut records = Vec::new();
        if !matches!(self.target, Target::Dry) && !self.attrs.is_empty() {
            let data = Arc::new(std::mem::take(&mut self.pending));
            let files = [DataFile {
                path: self.name.clone(),
                backing: Backing::Mem(data.clone(), self.base),
                range: crate::format::header::Section {
                    offset: self.base,
                    size: data.len() as u64,
                },
            }];
            let r = self.resolve_and_identify(&files, &chunks, &mut records);
            drop(files);
            self.pending = Arc::try_unwrap(data).unwrap_or_else(|a| a.as_ref().clone());
            r?;
        }
        let n = (upto - self.base) as usize;
        let insert_at = if records.is_empty() {
            n
        } else {
            first_sampleish(&self.pending[..n], self.e)
        };
        let pending = std::mem::take(&mut self.pending);
        let r = self
            .write(&pending[..insert_at])
            .and_then(|()| self.write(&records))
            .and_then(|()| self.write(&pending[insert_at..n]));
        self.pending = pending;
        r?;
        self.pending.drain(..n);
        if let (Some(p), Some(total)) = (&self.opts.progress, self.total) {
            p("stream", upto, total);
        }
        self.base = upto;
        self.base_seq = upto_seq;
        self.scanned -= n;
        self.parsed -= n;
        Ok(())
    }

    fn resolve_and_identify(
        &mut self,
        files: &[DataFile],
        chunks: &[Chunk],
        records: &mut Vec<u8>,
    ) -> Result<()> {
        let model = self.builder.snapshot();
        let (times, undated) = match self.times() {
            Ok(t) => (t, None),
            Err(why) => (RecordingTimes::default(), Some(why)),
        };
        let time_mode = self.time_mode.unwrap_or(false);
        if self.unwind.is_none() {
            let arch = self
                .features
                .get(&(FEAT_ARCH as u64))
                .and_then(|p| parse_string(p, self.e));
            let cfg = crate::inject::unwind_config(self.opts, &self.attrs, arch.as_deref())
                .unwrap_or_else(|note| {
                    self.notes.push(note);
                    None
                });
            self.unwind = Some(cfg);
        }
        let unwind = self.unwind.flatten();
        let mut trust = self.trust().clone();
        let trust_before = trust.clone();
        if let Some(why) = undated {
            trust.local = Err(why.clone());
            self.undated.get_or_insert(why);
        }
        let tables = self
            .tables
            .get_or_insert_with(|| UnwindTables::new(&model, trust.local.is_ok(), times));
        tables.grow(&model);
        tables.set_times(times);

        let t = Instant::now();
        let mut resolver = Resolver::new(&model, &self.attrs, time_mode, self.e);
        if let Some(cfg) = unwind {
            resolver = resolver.with_unwinding(cfg, &*tables);
        }
        let hits = self
            .pool
            .install(|| resolver.run(files, chunks, &|_| {}, &AtomicBool::new(false)))?;
        drop(resolver);
        self.t_resolve += t.elapsed();

        // Names not decided yet that this batch touched (every code DSO with
        // --buildid-all or AUX data).
        let all_hit = self.opts.mode == Mode::All || self.scan.has_aux;
        let mut groups: BTreeMap<(bool, String), Group> = BTreeMap::new();
        for (i, d) in model.dsos.iter().enumerate() {
            let key = (d.kind.is_kernel_space(), d.name.clone());
            if let Some(dec) = self.decided.get_mut(&key) {
                if !dec.dsos.contains(&(i as u32)) {
                    // The record already written named the first file; perf keeps a
                    // mapping of another inode apart, without that ID.
                    dec.later_file |= dec
                        .dsos
                        .iter()
                        .any(|&o| buildid::inode_conflict(&model.dsos[o as usize].ident, &d.ident));
                    dec.dsos.push(i as u32);
                }
                continue;
            }
            let g = groups.entry(key).or_insert_with(|| Group {
                name: d.name.clone(),
                kind: d.kind,
                dsos: Vec::new(),
                hits: 0,
            });
            g.dsos.push(i as u32);
            g.hits += hits.per_dso.get(i).copied().unwrap_or(0);
        }
        let groups: Vec<Group> = groups
            .into_values()
            .filter(|g| g.hits > 0 || (all_hit && g.is_code(&model)))
            .collect();
        self.hits.merge(hits);
        if groups.is_empty() {
            return Ok(());
        }
        let t = Instant::now();
        let table = BuildIdTable::default();
        let ev = Evidence {
            table: &table,
            stream: &self.scan.stream_build_ids,
            known: &self.opts.known,
            trust: &trust,
            times,
        };
        let mut outcomes = self
            .pool
            .install(|| buildid::identify(&groups, &model, &ev));
        if self.undated.is_some() && trust_before.local.is_ok() {
            for o in &mut outcomes {
                if o.reason == Some(buildid::Reason::OtherHost) {
                    o.reason = Some(buildid::Reason::Undated);
                }
            }
        }
        self.t_identify += t.elapsed();
        for (g, o) in groups.into_iter().zip(outcomes) {
            let o = self.emit(records, &g, o);
            self.decided.insert(
                (g.kind.is_kernel_space(), g.name.clone()),
                Decided {
                    report: DsoReport {
                        path: g.name.clone(),
                        kind: g.kind,
                        hits: 0,
                        build_id: o.build_id.map(|b| b.to_string()),
                        source: o.source,
                        reason: o.reason,
                        detail: o.detail,
                    },
                    dsos: g.dsos,
                    later_file: false,
                },
            );
        }
        Ok(())
    }

    /// Appends the HEADER_BUILD_ID record for a decided group, unless perf already has
    /// the ID from the stream itself (a build-ID MMAP2 or an earlier record).
    fn emit(&self, records: &mut Vec<u8>, g: &Group, o: Outcome) -> Outcome {
        let Some(id) = o.build_id else { return o };
        if matches!(o.source, Some(Source::Mmap2 | Source::InputTable)) {
            return o;
        }
        let cpumode = g.kind.build_id_cpumode();
        if !build_id_record(records, self.e, cpumode, &id, g.name.as_bytes()) {
            return Outcome {
                reason: Some(buildid::Reason::Unsupported),
                detail: Some("the name is too long for a build-ID record".into()),
                ..Outcome::default()
            };
        }
        o
    }

    /// Host trust, decided once the stream's features and kernel map are in.
    fn trust(&mut self) -> &HostTrust {
        if self.trust.is_none() {
            let host = self.host.get_or_insert_with(HostInfo::detect);
            let s = |bit: u32| {
                self.features
                    .get(&(bit as u64))
                    .and_then(|p| parse_string(p, self.e))
            };
            let (hostname, release) = (s(FEAT_HOSTNAME), s(FEAT_OSRELEASE));
            let kref = self
                .builder
                .kernel_ref
                .as_ref()
                .map(|(s, a)| (s.as_str(), *a));
            self.trust = Some(HostTrust::decide(
                hostname.as_deref(),
                release.as_deref(),
                kref,
                host,
            ));
        }
        self.trust.as_ref().unwrap_or_else(|| unreachable!())
    }

    /// Smallest and largest time of the records and samples seen so far.
    fn time_range(&self) -> (Option<u64>, Option<u64>) {
        let (smin, smax) = self.sample_times.unzip();
        (
            [self.scan.min_time, smin].into_iter().flatten().min(),
            [self.scan.max_time, smax].into_iter().flatten().max(),
        )
    }

    /// The start CLOCK_DATA gives (perf's clock and the wall clock read together).
    fn clock_data_start(&self, min: Option<u64>) -> Option<i128> {
        let cd = self
            .features
            .get(&(FEAT_CLOCK_DATA as u64))
            .and_then(|p| parse_clock_data(p, self.e))?;
        Some(cd.wall_ns as i128 + min? as i128 - cd.clock_ns as i128)
    }

    /// The start of a regular file's recording: CLOCK_DATA, else its mtime (the end
    /// of the recording) minus the span of its times.
    fn start_from(&self, mtime_ns: i128) -> i128 {
        let (min, max) = self.time_range();
        if let Some(s) = self.clock_data_start(min) {
            return s;
        }
        let span = match (min, max) {
            (Some(a), Some(b)) => b.saturating_sub(a) as i128,
            _ => 0,
        };
        mtime_ns - span
    }

    /// The recording's start, or why it cannot be known. A regular file's is known
    /// from the first pass. A live stream's times are perf's clock, which is this
    /// boot's monotonic clock: when the newest time is close to the monotonic clock
    /// now, the recording is running now and its start maps onto the wall clock. A
    /// stream whose times are far from now is a replay (`cat old.data |`): nothing
    /// dates it, so no local file can be shown unchanged since.
    fn times(&self) -> std::result::Result<RecordingTimes, String> {
        let known = |s| Ok(RecordingTimes { start_ns: Some(s) });
        if let Some(s) = self.start_ns {
            return known(s);
        }
        let (min, max) = self.time_range();
        if let Some(s) = self.clock_data_start(min) {
            return known(s);
        }
        let (Some(min), Some(max)) = (min, max) else {
            // No times at all: a live stream began with this process.
            return known(self.began_ns);
        };
        let (mono, wall) = (monotonic_ns(), wall_ns());
        let lag = mono - max as i128;
        if (-5_000_000_000..=60_000_000_000).contains(&lag) {
            known(wall - (mono - min as i128))
        } else {
            Err(format!(
                "the stream's newest time ({:.3} s) is not this boot's clock now ({:.3} s): a replayed recording, and nothing says when it was made; give its file by path (its mtime dates it)",
                max as f64 / 1e9,
                mono as f64 / 1e9
            ))
        }
    }

    /// Flushes the output and builds the report.
    fn finish(&mut self) -> Result<Report> {
        if let Target::Out(w) = &mut self.target {
            w.flush().map_err(|e| Error::io(&self.out_name, e))?;
        }
        let mut r = Report {
            records: self.scan.records,
            samples: self.hits.samples,
            guest_samples: self.hits.guest_samples,
            unmapped_addresses: self.hits.unmapped,
            unknown_event_samples: self.hits.unknown_event,
            compressed_records: self.scan.compressed,
            time_ordered: self.time_mode.unwrap_or(false),
            aux_all_hit: self.scan.has_aux,
            unwound_samples: self.hits.unwound_samples,
            unwound_frames: self.hits.unwound_frames,
            over_budget_samples: self.hits.over_budget,
            frame_capped_samples: self.hits.frame_capped,
            unwind_budget_us: self.unwind.flatten().map(|c| c.budget.as_secs_f64() * 1e6),
            timings_ms: [("resolve", self.t_resolve), ("identify", self.t_identify)]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.as_secs_f64() * 1e3))
                .collect(),
            notes: std::mem::take(&mut self.notes),
            ..Report::default()
        };
        if let Some(why) = &self.undated {
            r.notes.push(format!("no local file is trusted: {why}"));
        } else if let Some(t) = &self.trust {
            if let Err(why) = &t.local {
                r.notes.push(format!("no local file is trusted: {why}"));
            } else if let Err(why) = &t.kernel {
                r.notes.push(format!(
                    "kernel, modules and vdso of this host are not used: {why}"
                ));
            }
        }
        for d in std::mem::take(&mut self.decided).into_values() {
            let mut rep = d.report;
            if d.later_file && rep.build_id.is_some() {
                rep.detail = Some(
                    "mapped from another file later in the stream: the ID names the first one; the later file's samples have none"
                        .into(),
                );
            }
            rep.hits = d
                .dsos
                .iter()
                .map(|&i| self.hits.per_dso.get(i as usize).copied().unwrap_or(0))
                .sum();
            r.dsos_hit += 1;
            if rep.build_id.is_some() {
                r.ids_written += 1;
                if !matches!(rep.source, Some(Source::Mmap2 | Source::InputTable)) {
                    r.ids_new += 1;
                }
            } else {
                r.ids_missing += 1;
            }
            r.dsos.push(rep);
        }
        Ok(r)
    }
}

/// Offset of the first record in `bytes` that may hold a sample (a SAMPLE, or
/// compressed data), or `bytes.len()`: new build-ID records go there.
fn first_sampleish(bytes: &[u8], e: Endian) -> usize {
    let mut at = 0usize;
    while let Some(h) = bytes.get(at..).and_then(|b| RecordHeader::parse(b, e)) {
        if matches!(h.kind, rt::SAMPLE | rt::COMPRESSED | rt::COMPRESSED2) {
            return at;
        }
        let oob = out_of_band_len(&h, &bytes[at..], e).unwrap_or(0);
        let Some(next) = (h.size as u64)
            .checked_add(oob)
            .and_then(|n| usize::try_from(n).ok())
            .and_then(|n| at.checked_add(n))
            .filter(|&n| n > at)
        else {
            break;
        };
        at = next;
    }
    bytes.len()
}

/// A sample's time: after IDENTIFIER, IP and TID in perf's fixed sample layout.
fn sample_time(rec: &[u8], e: Endian, sample_type: u64) -> Option<u64> {
    if sample_type & st::TIME == 0 {
        return None;
    }
    let before = [st::IDENTIFIER, st::IP, st::TID]
        .iter()
        .filter(|&&b| sample_type & b != 0)
        .count();
    e.u64(rec, 8 + 8 * before)
}

fn wall_ns() -> i128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128)
}

/// CLOCK_MONOTONIC in ns: perf's default clock on this boot.
fn monotonic_ns() -> i128 {
    // SAFETY: clock_gettime writes the timespec.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) } != 0 {
        return 0;
    }
    ts.tv_sec as i128 * 1_000_000_000 + ts.tv_nsec as i128
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(kind: u32, size: u16) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&kind.to_le_bytes());
        v.extend_from_slice(&0u16.to_le_bytes());
        v.extend_from_slice(&size.to_le_bytes());
        v.resize(size as usize, 0);
        v
    }

    #[test]
    fn pipe_headers() {
        let mut h = b"PERFILE2".to_vec();
        h.extend_from_slice(&16u64.to_le_bytes());
        assert_eq!(pipe_header(&h), Some(Endian::Little));
        let mut be = b"2ELIFREP".to_vec();
        be.extend_from_slice(&16u64.to_be_bytes());
        assert_eq!(pipe_header(&be), Some(Endian::Big));
        h[8] = 104;
        assert_eq!(pipe_header(&h), None, "a file header is not a pipe header");
        assert_eq!(pipe_header(b"PERFILE2"), None);
    }

    #[test]
    fn records_go_before_the_first_record_that_may_hold_samples() {
        let mut b = rec(rt::HEADER_ATTR, 16);
        b.extend(rec(rt::MMAP2, 24));
        let at = b.len();
        b.extend(rec(rt::COMPRESSED, 32));
        b.extend(rec(rt::SAMPLE, 16));
        assert_eq!(first_sampleish(&b, Endian::Little), at);
        let only_maps = rec(rt::MMAP2, 24);
        assert_eq!(first_sampleish(&only_maps, Endian::Little), only_maps.len());
        // A zero size ends the walk instead of looping.
        let mut bad = rec(rt::MMAP2, 24);
        bad.extend_from_slice(&[1, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(first_sampleish(&bad, Endian::Little), bad.len());
    }

    #[test]
    fn sample_time_follows_identifier_ip_and_tid() {
        let mut r = vec![0u8; 8];
        for v in [7u64, 0x1000, 42, 123_456] {
            r.extend_from_slice(&v.to_le_bytes());
        }
        let t = st::IDENTIFIER | st::IP | st::TID | st::TIME;
        assert_eq!(sample_time(&r, Endian::Little, t), Some(123_456));
        assert_eq!(sample_time(&r, Endian::Little, st::IP), None);
    }
}
