//! The one engine: scan → model → resolve → identify, over a sequence of batches.
//!
//! A mapped file is one batch that ends at its end ([`file`](mod@file)); a stream is
//! many, read batch after batch ([`stream`]). Each input form has one entry
//! ([`file::process_file`], [`stream::process_stream`]) that runs all its stages
//! here.
//! The engine does not know which sink the bytes go to: after each batch it hands a
//! [`Consumer`] (the driver's adapter over the sink) the bytes that are final and
//! the DSOs whose IDs those bytes need first.
//! Everything that decides an ID lives here once: the scan of records into the model,
//! dating the recording, whether this host may speak for it, the unwind
//! configuration, grouping DSOs into table entries, and the counts of the report.
//! The driver (`driver`) opens the input, picks the sink and calls the entry of the
//! input's form. The engine imports no sink and nothing of the driver.
//!
//! Imports: `resolve`, `buildid`, `model`, `input`, `format`, `limits`, `options`,
//! `report`.

mod ahead;
pub(crate) mod dating;
mod decide;
pub(crate) mod file;
mod flat;
mod header;
pub(crate) mod rounds;
pub(crate) mod stream;

pub(crate) use ahead::Beside;
use decide::batch_trust;
pub(crate) use header::Metadata;

use crate::buildid::memo::Memo;
use crate::buildid::store::SymbolStore;
use crate::buildid::{self, Evidence, Group, HostTrust, Outcome, Reason, host::HostInfo};
use crate::error::{Error, Result};
use crate::format::Endian;
use crate::format::attr::{Attr, st};
use crate::format::buildid::parse_build_id_entry;
use crate::format::buildid::{BuildId, TableEntry, encode_table_entry};
use crate::format::record::{
    Comm, FeatureRecord, Fork, TrailerLayout, misc, mmap_fixed, parse_mmap, rt,
};
use crate::format::walk::{Chunk, Rec, Walker, Windows};
use crate::input::{DataFile, PerfInput};
use crate::limits::StreamKept;
use crate::model::{DsoId, DsoKind, Key, Model, ModelBuilder};
use crate::options::{Mode, Options};
use crate::report::SinkReport;
use crate::report::{ClaimReport, DsoReport, Report};
use crate::resolve::unwind::{UnwindConfig, UnwindTables};
use crate::resolve::{Hits, Resolver};
use dating::{Dating, RecordingStart, Span};
pub(crate) use rounds::Ending;
pub(crate) use rounds::Point;
use rounds::{Follows, Rounds};
use std::collections::{BTreeMap, HashSet};
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Target size of a resolve chunk: small enough to spread a batch over the cores,
/// large enough that per-chunk work (a walker, a hit vector) does not count.
pub(crate) const CHUNK_BYTES: u64 = 4 << 20;

/// Events a stream may declare (perf record opens one per event, not per CPU).
pub(crate) const MAX_STREAM_ATTRS: usize = 1024;

/// Distinct HEADER_BUILD_ID records a stream may carry (one per DSO it touched).
pub(crate) const MAX_STREAM_BUILD_IDS: usize = 65536;

/// Whether the engine may look outside the input (host identity, local files).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Host {
    /// This machine's files, kernel and vdso may speak for the recording once it is
    /// proven to be of this host.
    Consult,
    /// Nothing outside the input is read (validation, fuzzing).
    Closed,
}

/// What every input of a run shares: the options, the worker pool, what the run
/// opened, and whether the host may be consulted. Copied into each engine (a batch
/// of many inputs shares one).
#[derive(Clone, Copy)]
pub(crate) struct Context<'a> {
    /// What the run is asked to do.
    pub opts: &'a Options,
    /// The worker pool.
    pub pool: &'a rayon::ThreadPool,
    /// What the run opened from its options.
    pub handles: &'a Handles,
    /// Whether the host may speak for recordings.
    pub host: Host,
}

/// What a run opens from its [`Options`] when it starts: the symbol store it fills
/// and the memo of file proofs. A batch opens them once for all its inputs, so every
/// input proves through the one memo and the store sweeps its temp files once.
#[derive(Debug)]
pub(crate) struct Handles {
    /// The memo of file proofs: one proof per DSO file, which the unwind tables
    /// and the identify stage both ask for (the memo is exact: keyed by what the file
    /// is now and what the recording says of it).
    pub memo: Arc<Memo>,
    /// `--symbol-store`, opened (made when missing).
    pub store: Option<SymbolStore>,
}

/// Whether a run could open what `opts` names (a symbol store that cannot be made is
/// a usage error): what `batch` checks before any input.
pub fn check_handles(opts: &Options) -> Result<()> {
    Handles::open(opts).map(|_| ())
}

impl Handles {
    /// Opens what `opts` names; a symbol store that cannot be made is a usage error,
    /// as the flag that named it.
    pub(crate) fn open(opts: &Options) -> Result<Handles> {
        let store = match &opts.store {
            Some(d) => Some(
                SymbolStore::new(d, opts.symfs.clone())
                    .map_err(|e| Error::Usage(format!("--symbol-store: {e}")))?,
            ),
            None => None,
        };
        Ok(Handles {
            memo: Arc::new(Memo::new()),
            store,
        })
    }
}

/// What takes the engine's results as a run goes: the driver's adapter over a sink
/// (the engine imports none). A file input is started, handed over as one batch and
/// finished; a stream is started, handed over batch after batch, and finished. The
/// engine is lent with each batch for what the sink reads of it.
pub(crate) trait Consumer {
    /// Before the first batch of a file-format input. Work started beside the stages
    /// (the copy of a file's data) sets `stop` when it fails, which ends the stages at
    /// their next chunk.
    fn start_file(&mut self, input: &PerfInput, stop: &Arc<AtomicBool>) -> Result<()>;
    /// Before the first batch of a stream: its pipe `header` and byte order; `stop`
    /// as for [`Consumer::start_file`].
    fn start_stream(&mut self, header: &[u8], e: Endian, stop: &Arc<AtomicBool>) -> Result<()>;
    /// A file-format input, resolved whole (one batch), with every decision.
    fn file_batch(
        &mut self,
        engine: &Engine<'_>,
        input: &PerfInput,
        new: &[Decision],
    ) -> Result<()>;
    /// Bytes of a stream at `offset`, final, with the DSOs they touch first (perf
    /// must know their IDs before them).
    fn bytes_batch(
        &mut self,
        engine: &Engine<'_>,
        bytes: &[u8],
        offset: u64,
        new: &[Decision],
    ) -> Result<()>;
    /// After the last batch.
    fn finish(&mut self, engine: &Engine<'_>) -> Result<SinkReport>;
    /// Bytes of the input that work beside the stages keeps mapped at a time: the
    /// scan keeps less for the resolve ([`file::KEEP_BYTES`]).
    fn mapped_beside(&self) -> u64;
    /// Where a file input's `--convert-callchain` spill goes (the resolve converts
    /// into it); `None`: nothing is converted.
    fn spill_dir(&self) -> Option<PathBuf>;
    /// The run failed: stop what runs beside the stages. Returns that work's own
    /// error when it failed first (it explains why the stages stopped).
    fn abort(&mut self) -> Option<Error>;
}

/// What the scan counts and collects besides the model.
#[derive(Debug, Default)]
pub(crate) struct ScanOutput {
    /// HEADER_BUILD_ID records found in the data (a stream's, or an earlier injection's).
    pub stream_build_ids: Vec<TableEntry>,
    /// AUX area data is present (Intel PT, CoreSight, SPE, ...): every mapped DSO counts.
    pub has_aux: bool,
    /// Records seen (outer and inner).
    pub records: u64,
    /// SAMPLE records seen.
    pub samples: u64,
    /// COMPRESSED records seen.
    pub compressed: u64,
}

/// A mapping record of the input, outside compressed data: where it is and the DSO
/// it names (what a sink that rewrites MMAP2 records needs, without a second pass).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MappingRecord {
    /// Index of the data file (0 for a stream, or the header file's data section).
    pub file: usize,
    /// Offset of the record.
    pub offset: u64,
    /// Its number in the input (what a sink that edits the data goes by).
    pub seq: u64,
    /// The DSO it maps.
    pub dso: DsoId,
}

/// One table entry decided: the DSOs behind one name in one address space, and the
/// answer for them.
#[derive(Clone, Debug)]
pub(crate) struct Decision {
    /// The group (name, kind, DSOs, hits when decided).
    pub group: Group,
    /// The answer.
    pub outcome: Outcome,
    /// The path was mapped from another file after the decision (streams).
    pub later_file: bool,
    /// What happened to its build-ID cache entry (when a cache is filled).
    pub cache: Option<buildid::cache::CacheResult>,
    /// What happened to it in the symbol store (`--symbol-store`).
    pub store: Option<buildid::store::StoreResult>,
}

impl Decision {
    /// The ID a table entry must be added for: any ID the input's own table lacks.
    pub(crate) fn id_for_table(&self) -> Option<BuildId> {
        (!self.outcome.in_input_table())
            .then_some(self.outcome.build_id())
            .flatten()
    }

    /// The ID a stream record must be added for: one perf is not told by the input
    /// itself (its table, its build-ID MMAP2 records, its HEADER_BUILD_ID records).
    pub(crate) fn id_for_stream(&self) -> Option<BuildId> {
        use buildid::Source::{InputTable, Mmap2};
        if matches!(self.outcome.source(), Some(InputTable | Mmap2)) {
            return None;
        }
        self.id_for_table()
    }

    /// The ID came from the input itself (its table or records): not new.
    pub(crate) fn came_from_input(&self) -> bool {
        self.outcome.in_input_table() || self.outcome.source() == Some(buildid::Source::InputTable)
    }

    /// The cpumode of its table entry or record.
    pub(crate) fn cpumode(&self) -> u16 {
        self.group.kind.build_id_cpumode()
    }
}

/// Where chunk boundaries fall in one data file, and how far it may be resolved.
#[derive(Debug)]
pub(crate) struct Cuts {
    file: usize,
    /// Where the unresolved part starts.
    base: Point,
    /// Clean points at least CHUNK_BYTES apart after `base`.
    points: Vec<Point>,
    /// Clean points and rounds.
    pub rounds: Rounds,
}

impl Cuts {
    /// Cuts for data file `file` whose records start at `start`.
    pub(crate) fn new(file: usize, start: Point) -> Self {
        Cuts {
            file,
            base: start,
            points: Vec::new(),
            rounds: Rounds::new(start),
        }
    }

    /// Where the unresolved part starts.
    pub(crate) fn base(&self) -> Point {
        self.base
    }

    /// A record ended at `next`; `b` says whether a chunk may start there and what
    /// the record was. True when a chunk boundary was placed.
    /// Every record boundary may end a batch (compressed data is resolved through one
    /// decompressor that goes on across batches); only clean ones start chunks.
    fn after(&mut self, next: Point, b: Boundary) -> bool {
        self.rounds.clean(next, b.follows);
        if b.start == ChunkStart::Never {
            return false;
        }
        let last = self.points.last().map_or(self.base.offset, |p| p.offset);
        if next.offset - last >= CHUNK_BYTES {
            self.points.push(next);
            return true;
        }
        false
    }

    /// The chunks from the base up to `upto` (a clean point); the base moves there.
    pub(crate) fn take(&mut self, upto: Point) -> Vec<Chunk> {
        let mut chunks = Vec::new();
        if upto.offset <= self.base.offset {
            return chunks;
        }
        let mut from = self.base;
        for &p in self.points.iter().filter(|p| p.offset < upto.offset) {
            chunks.push(self.chunk(from, p));
            from = p;
        }
        chunks.push(self.chunk(from, upto));
        self.points.retain(|p| p.offset > upto.offset);
        self.base = upto;
        chunks
    }

    fn chunk(&self, from: Point, to: Point) -> Chunk {
        Chunk {
            file: self.file,
            start: from.offset,
            end: to.offset,
            first_seq: from.seq,
        }
    }
}

/// What the scan tells [`Cuts::after`] of a record boundary.
#[derive(Clone, Copy, Debug)]
struct Boundary {
    /// Whether a chunk may start there.
    start: ChunkStart,
    /// What the record that ends there was.
    follows: Follows,
}

/// Whether a chunk may start at a record boundary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ChunkStart {
    /// A clean point: no compressed frame or inner record is half-way.
    May,
    /// Inside compressed data.
    Never,
}

/// The engine's state over one input.
pub(crate) struct Engine<'a> {
    /// The run's options, pool and handles.
    cx: Context<'a>,
    origin: Origin,
    /// The input's name in messages.
    name: PathBuf,
    e: Endian,
    head: Head,
    walker: Walker,
    builder: ModelBuilder,
    scan: ScanOutput,
    res: Resolved,
    /// Mapping records outside compressed data, in input order.
    mappings: Vec<MappingRecord>,
    /// The data file being scanned.
    file: usize,
    said: Said,
    budget: Budget,
    stages: Stages,
    /// The number of the first record of each data file scanned.
    first_seqs: Vec<u64>,
}

/// What the input says of itself: a file's header, or a stream's header records as they arrive.
struct Head {
    attrs: Vec<Attr>,
    /// The bodies of a stream's HEADER_ATTR records (attr, then ids), for a file
    /// written from the stream.
    attr_records: Vec<Vec<u8>>,
    /// Attrs and features arrive as records (a stream), not in a header.
    from_records: bool,
    /// Feature payloads of HEADER_FEATURE records, by feature bit.
    stream_features: BTreeMap<u32, Vec<u8>>,
    meta: Option<Metadata>,
    trailer: Option<TrailerLayout>,
    time_mode: Option<bool>,
    /// HEADER_BUILD_ID records already taken (a stream may repeat them).
    seen_ids: HashSet<(u16, BuildId, String)>,
    /// Offsets of a stream's HEADER_ATTR, HEADER_FEATURE and HEADER_BUILD_ID records
    /// outside compressed data, not yet written: the stream sink repairs or leaves
    /// out some of them and passes the rest of a batch on without walking it (the
    /// batch is cold by then; walking every record header cost a twentieth of a
    /// stream run).
    user_records: Vec<u64>,
    /// A stream's records whose size is not a multiple of 8 (perf 7.3 refuses
    /// them), HEADER_FEATURE and COMPRESSED records aside (perf 7.3 reads those).
    unaligned: u64,
}

/// The resolve beside the scan: its hits, decisions and the state it keeps between batches.
struct Resolved {
    /// Hits of batches resolved ahead of the scan (see [`Beside`]).
    prior: Option<Hits>,
    /// Batches resolved ahead of the scan and kept; whether they were thrown away.
    ahead_stat: (u64, bool),
    decided: BTreeMap<(bool, String), Decision>,
    /// IDs the input claims for more than one file, as of the last resolve.
    claims: buildid::Claims,
    hits: Hits,
    /// A stream's decompressor on the resolve side: compressed data has no clean
    /// point (perf keeps one zstd frame open for the whole recording), so it is
    /// resolved in order, batch after batch, through one decompressor.
    flat_walker: Option<Walker>,
    tables: Option<UnwindTables>,
    unwind: Option<Option<UnwindConfig>>,
}

/// Where and when the input was recorded, and what that lets the run trust.
struct Origin {
    host: Host,
    trust: Option<HostTrust>,
    dating: Dating,
    span: Span,
}

/// What the run tells: notes and timings.
struct Said {
    notes: Vec<String>,
    timings: BTreeMap<&'static str, Duration>,
}

/// What a stream keeps across its batches (`--stream-memory`), and the most it kept; the
/// output's part is the sink's, told through [`Engine::check_output_kept`].
struct Budget {
    /// What a stream keeps across its batches (`--stream-memory`), and the most it
    /// kept; the output's part is the sink's, told through
    /// [`Engine::check_output_kept`].
    kept: StreamKept,
    kept_peak: AtomicU64,
    output_kept: AtomicU64,
}

/// The stages a mode adds to the one pass: conversion, JIT, ASLR, live capture.
struct Stages {
    /// Where the resolve writes the records it converts, when it converts them
    /// (`--convert-callchain`, [`Engine::convert_into`]).
    spill: Option<std::sync::Arc<crate::convert::Spill>>,
    /// `--jit`: the stage that reads jitdumps into the model and chooses the records
    /// the sink splices in (`jit`), and those records once chosen.
    jit: Option<crate::jit::Stage>,
    splices: Option<crate::jit::Splices>,
    /// `--aslr`: the layout's events, as the scan meets them.
    aslr: Option<crate::aslr::Recorder>,
    // live capture hook (issue 32): the stream's capture, fed by the stream's
    // reading ([`stream`]) as records are read, consulted by identify.
    live: Option<crate::live::LiveStream>,
}

impl<'a> Engine<'a> {
    /// An engine for a file-format input whose attrs and metadata come from its header.
    pub(crate) fn for_file(
        cx: Context<'a>,
        name: &Path,
        e: Endian,
        attrs: Vec<Attr>,
        meta: Metadata,
        dating: Dating,
    ) -> Self {
        let mut s = Self::new(cx, name, e, dating);
        if let Some(c) = &cx.opts.cache
            && cx.host == Host::Consult
        {
            let host = HostInfo::detect();
            if meta.hostname.as_deref() == Some(host.hostname.as_str())
                && meta.release.as_deref() == Some(host.release.as_str())
            {
                buildid::cache::prefetch_kallsyms(c);
            }
        }
        s.head.trailer = attrs
            .first()
            .map(|a| TrailerLayout::new(a.sample_type, a.sample_id_all()));
        s.head.attrs = attrs;
        s.head.meta = Some(meta);
        s
    }

    /// An engine for a stream, whose attrs and features arrive as records.
    pub(crate) fn for_stream(cx: Context<'a>, name: &Path, e: Endian, dating: Dating) -> Self {
        let mut s = Self::new(cx, name, e, dating);
        s.head.from_records = true;
        s
    }

    fn new(cx: Context<'a>, name: &Path, e: Endian, dating: Dating) -> Self {
        Engine {
            cx,
            origin: Origin {
                host: cx.host,
                trust: None,
                dating,
                span: Span::default(),
            },
            name: name.to_path_buf(),
            e,
            head: Head {
                attrs: Vec::new(),
                attr_records: Vec::new(),
                from_records: false,
                stream_features: BTreeMap::new(),
                meta: None,
                trailer: None,
                time_mode: None,
                seen_ids: HashSet::new(),
                user_records: Vec::new(),
                unaligned: 0,
            },
            walker: Walker::new(e, 0),
            builder: ModelBuilder::new(),
            scan: ScanOutput::default(),
            res: Resolved {
                prior: None,
                ahead_stat: (0, false),
                decided: BTreeMap::new(),
                claims: buildid::Claims::default(),
                hits: Hits::default(),
                flat_walker: None,
                tables: None,
                unwind: None,
            },
            mappings: Vec::new(),
            file: 0,
            said: Said {
                notes: Vec::new(),
                timings: BTreeMap::new(),
            },
            budget: Budget {
                kept: StreamKept::default(),
                kept_peak: AtomicU64::new(0),
                output_kept: AtomicU64::new(0),
            },
            stages: Stages {
                spill: None,
                jit: match cx.opts.jit {
                    crate::options::JitChoice::Inject(maps) => Some(crate::jit::Stage::new(maps)),
                    crate::options::JitChoice::Off => None,
                },
                splices: None,
                aslr: (cx.opts.addresses == crate::options::Addresses::Remapped)
                    .then(crate::aslr::Recorder::new),
                live: None,
            },
            first_seqs: Vec::new(),
        }
    }

    // live capture hook (issue 32): the stream's reading ([`stream`]) gives a live
    // stream its capture and feeds it the records as they are read.
    /// The stream's live capture.
    pub(crate) fn set_live(&mut self, live: Option<crate::live::LiveStream>) {
        self.stages.live = live;
    }

    /// The live capture, to feed records to.
    pub(crate) fn live_mut(&mut self) -> Option<&mut crate::live::LiveStream> {
        self.stages.live.as_mut()
    }

    /// The live capture, while it captures.
    pub(crate) fn live_capture(&self) -> Option<&crate::live::Capture> {
        self.stages.live.as_ref().and_then(|l| l.capture())
    }

    /// `--convert-callchain`: the resolve converts each chunk into `spill`, which the
    /// sink writes (see `convert`).
    pub(crate) fn convert_into(&mut self, spill: std::sync::Arc<crate::convert::Spill>) {
        self.stages.spill = Some(spill);
    }

    /// The spill the resolve converts into, if any.
    pub(crate) fn spill(&self) -> Option<&crate::convert::Spill> {
        self.stages.spill.as_deref()
    }

    /// `--jit`: the records to splice into the data, once chosen.
    pub(crate) fn splices(&self) -> Option<&crate::jit::Splices> {
        self.stages.splices.as_ref()
    }

    /// Whether the data may change (`--jit`, `--aslr`): a file is then resolved after
    /// its whole scan, once the jitdumps are read into the model and the mappings laid
    /// out.
    pub(crate) fn edits_data(&self) -> bool {
        self.stages.jit.is_some() || self.stages.aslr.is_some()
    }

    /// `--aslr`: the layout of the mappings resolved so far.
    pub(crate) fn layout(&self) -> Option<&crate::aslr::layout::Layout> {
        self.stages.aslr.as_ref().and_then(|a| a.laid())
    }

    /// Whether samples are resolved by time (else by record number alone).
    pub(crate) fn time_mode(&self) -> bool {
        self.head.time_mode.unwrap_or(false)
    }

    /// The input's name in messages.
    pub(crate) fn name(&self) -> &Path {
        &self.name
    }

    /// The input's byte order.
    pub(crate) fn endian(&self) -> Endian {
        self.e
    }

    /// The events so far.
    pub(crate) fn attrs(&self) -> &[Attr] {
        &self.head.attrs
    }

    /// The bodies of a stream's HEADER_ATTR records (attr bytes, then u64 ids).
    pub(crate) fn attr_records(&self) -> &[Vec<u8>] {
        &self.head.attr_records
    }

    /// Feature payloads a stream carried in HEADER_FEATURE records, by bit.
    pub(crate) fn stream_features(&self) -> &BTreeMap<u32, Vec<u8>> {
        &self.head.stream_features
    }

    /// The mapping records outside compressed data, in input order.
    pub(crate) fn mapping_records(&self) -> &[MappingRecord] {
        &self.mappings
    }

    /// The mapping records before `offset` are written: a stream forgets them (a
    /// stream's sinks look only at the records of the batch they write), so what it
    /// keeps does not grow with its length.
    pub(crate) fn forget_mappings_before(&mut self, offset: u64) {
        let n = self.mappings.partition_point(|m| m.offset < offset);
        self.mappings.drain(..n);
        let n = self.head.user_records.partition_point(|&o| o < offset);
        self.head.user_records.drain(..n);
    }

    /// Offsets of a stream's HEADER_ATTR, HEADER_FEATURE and HEADER_BUILD_ID records
    /// outside compressed data not yet written, ascending.
    pub(crate) fn user_records(&self) -> &[u64] {
        &self.head.user_records
    }

    /// A stream's records whose size is not a multiple of 8, but HEADER_FEATURE and
    /// COMPRESSED ones (which perf 7.3 reads unaligned).
    pub(crate) fn unaligned_records(&self) -> u64 {
        self.head.unaligned
    }

    /// A stream's budget (`--stream-memory`): what it keeps across batches after the
    /// record at `offset` grew it. Files are held to the model's own rule instead.
    fn check_kept(&mut self, offset: u64) -> Result<()> {
        if !self.head.from_records {
            return Ok(());
        }
        self.budget.kept.model = self.builder.used();
        self.budget.kept.output = self.budget.output_kept.load(Ordering::Relaxed);
        self.budget
            .kept_peak
            .fetch_max(self.budget.kept.total(), Ordering::Relaxed);
        self.budget
            .kept
            .check(self.cx.opts.memory.stream)
            .map_err(|over| over.at(offset))
    }

    /// What a stream keeps across batches, the output's part included.
    fn kept_total(&self) -> u64 {
        StreamKept {
            output: self.budget.output_kept.load(Ordering::Relaxed),
            ..self.budget.kept
        }
        .total()
    }

    /// Bytes of records a stream may carry to its next batch: its budget less what
    /// it keeps.
    pub(crate) fn stream_room(&self) -> u64 {
        self.cx.opts.memory.stream.saturating_sub(self.kept_total())
    }

    /// A stream carries `bytes` of records to its next batch (the report's figure
    /// of what it kept counts them).
    pub(crate) fn note_carried(&self, bytes: u64) {
        self.budget
            .kept_peak
            .fetch_max(self.kept_total().saturating_add(bytes), Ordering::Relaxed);
    }

    /// A sink that keeps `bytes` of a stream's records for the end of its output (a
    /// file's build-ID table and tracing data) checks them, with everything the
    /// stream keeps, against its budget; `offset` is the record that grew them.
    pub(crate) fn check_output_kept(&self, bytes: u64, offset: u64) -> Result<()> {
        self.budget.output_kept.store(bytes, Ordering::Relaxed);
        let kept = StreamKept {
            output: bytes,
            ..self.budget.kept
        };
        self.budget
            .kept_peak
            .fetch_max(kept.total(), Ordering::Relaxed);
        kept.check(self.cx.opts.memory.stream)
            .map_err(|over| over.at(offset).in_file(&self.name))
    }

    /// COMPRESSED records seen so far (their inner mapping records are not in
    /// [`Engine::mapping_records`]).
    pub(crate) fn compressed_records(&self) -> u64 {
        self.scan.compressed
    }

    /// Every decision so far, by address space (kernel or not) and name.
    pub(crate) fn decided(&self) -> &BTreeMap<(bool, String), Decision> {
        &self.res.decided
    }

    /// The number the scan gives the next record.
    pub(crate) fn next_seq(&self) -> u64 {
        self.walker.seq
    }

    /// The scan goes on in another data file of a directory ([`Walker::begin_file`]).
    pub(crate) fn begin_file(&mut self) {
        self.walker.begin_file();
        self.first_seqs.push(self.walker.seq);
    }

    /// The number of the first record of each data file scanned.
    pub(crate) fn first_seqs(&self) -> &[u64] {
        &self.first_seqs
    }

    /// What the run is asked to do.
    pub(crate) fn opts(&self) -> &Options {
        self.cx.opts
    }

    /// What the run opened.
    pub(crate) fn handles(&self) -> &Handles {
        self.cx.handles
    }

    /// Whether an entry of the input's table (or a HEADER_BUILD_ID record of the
    /// input, written into a table or turned into a record) may be passed on: not
    /// when its DSO's claim was contradicted and not confirmed (the decided ID, if
    /// any, is written as a new entry), nor when its ID is one the input claims for
    /// another file too and no decision proved it (a DSO nothing touched).
    pub(crate) fn passes_on(&self, e: &TableEntry) -> bool {
        use crate::format::record::misc::{GUEST_KERNEL, GUEST_USER};
        if matches!(e.cpumode, GUEST_KERNEL | GUEST_USER) {
            return true;
        }
        let key = (e.is_kernel(), e.filename.clone());
        match self.res.decided.get(&key) {
            Some(d) => d
                .outcome
                .contradiction()
                .is_none_or(|c| c.verdict == buildid::Verdict::Confirmed),
            None => !self.res.claims.is_contested(key.0, &key.1),
        }
    }

    /// Adds `d` to the time of `stage` in the report.
    pub(crate) fn add_time(&mut self, stage: &'static str, d: Duration) {
        *self.said.timings.entry(stage).or_default() += d;
    }

    /// Scans `src[from..end)`, `window` bytes at a time: model events, attrs and
    /// features of a stream, counts, times, and chunk boundaries into `cuts`. When
    /// `stop` turns true the scan ends at the next chunk boundary with
    /// [`Error::Stopped`]; `progress` gets the offset reached at each boundary.
    pub(crate) fn scan<W: Windows + ?Sized>(
        &mut self,
        src: &W,
        range: std::ops::Range<u64>,
        window: u64,
        cuts: &mut Cuts,
        stop: &AtomicBool,
        progress: &dyn Fn(u64),
    ) -> Result<()> {
        self.scan_until(src, range, window, cuts, stop, progress, &|_| false)
            .map(|_| ())
    }

    /// [`Engine::scan`] that stops at the first chunk boundary where `pause` says so
    /// (given its offset) and returns that point; `None` when the range was scanned
    /// to its end. The scan goes on from the point by a new call.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn scan_until<W: Windows + ?Sized>(
        &mut self,
        src: &W,
        range: std::ops::Range<u64>,
        window: u64,
        cuts: &mut Cuts,
        stop: &AtomicBool,
        progress: &dyn Fn(u64),
        pause: &dyn Fn(u64) -> bool,
    ) -> Result<Option<Point>> {
        let t = Instant::now();
        self.file = cuts.file;
        // Limits policy: the model may grow with the input, not beyond.
        self.builder
            .account_input(range.end.saturating_sub(range.start));
        let mut walker = std::mem::replace(&mut self.walker, Walker::new(self.e, 0));
        let follows = std::cell::Cell::new(Follows::Record);
        let r = walker.walk_until(
            src,
            range.start,
            range.end,
            window,
            &mut |r| {
                follows.set(if r.header.kind == rt::FINISHED_ROUND && !r.inner {
                    Follows::Round
                } else {
                    Follows::Record
                });
                self.on_record(r).map_err(|err| match err {
                    Error::Format {
                        file: None, what, ..
                    } if r.inner => Error::format(r.offset, format!("in compressed data: {what}")),
                    other => other,
                })
            },
            &mut |w, next| {
                let b = Boundary {
                    start: if w.is_clean() {
                        ChunkStart::May
                    } else {
                        ChunkStart::Never
                    },
                    follows: follows.get(),
                };
                if cuts.after(Point::new(next, w.seq), b) {
                    progress(next);
                    if stop.load(Ordering::Relaxed) {
                        return Err(Error::Stopped);
                    }
                    if next < range.end && pause(next) {
                        // A pause, not an error: the caller goes on from here.
                        return Ok(ControlFlow::Break(Point::new(next, w.seq)));
                    }
                }
                Ok(ControlFlow::Continue(()))
            },
        );
        self.walker = walker;
        self.add_time("scan", t.elapsed());
        match r {
            Ok(ControlFlow::Break(p)) => Ok(Some(p)),
            Ok(ControlFlow::Continue(())) => Ok(None),
            Err(e) => Err(e.in_file(src.file().unwrap_or(&self.name))),
        }
    }

    /// One record of the scan.
    fn on_record(&mut self, r: &Rec<'_>) -> Result<()> {
        self.scan.records += 1;
        let kind = r.header.kind;
        if self.head.from_records && !r.inner {
            self.note_stream_record(r);
        }
        match kind {
            rt::HEADER_ATTR if self.head.from_records => return self.attr_record(r),
            rt::HEADER_FEATURE if self.head.from_records => return self.feature_record(r),
            rt::HEADER_BUILD_ID => return self.build_id_record(r),
            rt::AUX | rt::AUXTRACE | rt::AUXTRACE_INFO => self.scan.has_aux = true,
            rt::COMPRESSED | rt::COMPRESSED2 => {
                self.scan.compressed += 1;
                return Ok(());
            }
            _ => {}
        }
        if self.stages.aslr.is_some()
            && matches!(kind, rt::EXIT | crate::aslr::remap::kind::KSYMBOL)
        {
            return self.aslr_record(r);
        }
        if kind >= rt::USER_START
            || !matches!(
                kind,
                rt::SAMPLE | rt::MMAP | rt::MMAP2 | rt::COMM | rt::FORK
            )
        {
            return Ok(());
        }
        self.model_record(r)
    }

    /// A stream's record outside compressed data: where the stream sink finds the
    /// records it repairs, and the count of those perf 7.3 refuses.
    fn note_stream_record(&mut self, r: &Rec<'_>) {
        let kind = r.header.kind;
        if matches!(
            kind,
            rt::HEADER_ATTR | rt::HEADER_FEATURE | rt::HEADER_BUILD_ID
        ) && self.head.user_records.last().is_none_or(|&l| l < r.offset)
        {
            self.head.user_records.push(r.offset);
        }
        if !r.header.size.is_multiple_of(8)
            && !matches!(
                kind,
                rt::HEADER_FEATURE | rt::COMPRESSED | rt::COMPRESSED2 | rt::HEADER_BUILD_ID
            )
        {
            self.head.unaligned += 1;
        }
    }

    /// A stream's HEADER_FEATURE: one feature's payload.
    fn feature_record(&mut self, r: &Rec<'_>) -> Result<()> {
        let f = FeatureRecord::parse(r.bytes, self.e)
            .ok_or_else(|| Error::format(r.offset, "HEADER_FEATURE record is truncated"))?;
        let id = f.id;
        // A feature is kept by its payload: the end-of-features marker has none,
        // whichever perf wrote it (32 before perf 7, 35 since; 32 is a feature
        // in 7.x). See sink::stream for why outputs carry no marker.
        if !f.payload.is_empty() && id < 256 {
            let payload = f.payload.to_vec();
            self.budget.kept.features += payload.len() as u64;
            if let Some(old) = self.head.stream_features.insert(id as u32, payload) {
                self.budget.kept.features -= old.len() as u64;
            }
            return self.check_kept(r.offset);
        }
        Ok(())
    }

    /// A HEADER_BUILD_ID record (a stream's, or an earlier injection's): a claim.
    fn build_id_record(&mut self, r: &Rec<'_>) -> Result<()> {
        let Some(entry) = parse_build_id_entry(&r.header, r.bytes) else {
            return Ok(());
        };
        // perf keeps the first ID it is told for a name; repeats add nothing.
        let name = String::from_utf8_lossy(entry.filename).into_owned();
        if !self
            .head
            .seen_ids
            .insert((entry.cpumode, entry.build_id, name.clone()))
        {
            return Ok(());
        }
        if self.scan.stream_build_ids.len() >= MAX_STREAM_BUILD_IDS {
            return Err(Error::format(
                r.offset,
                format!("more than {MAX_STREAM_BUILD_IDS} distinct HEADER_BUILD_ID records"),
            ));
        }
        // The name is held twice: the entry and the set of those seen.
        self.budget.kept.build_ids += 2 * name.len() as u64 + crate::limits::STREAM_ID_COST;
        self.scan.stream_build_ids.push(TableEntry {
            cpumode: entry.cpumode,
            build_id: entry.build_id,
            filename: name,
        });
        self.check_kept(r.offset)
    }

    /// A SAMPLE, MMAP, MMAP2, COMM or FORK record: the model and the span of times.
    /// `--aslr`: an EXIT or KSYMBOL record, an event of the layout only.
    fn aslr_record(&mut self, r: &Rec<'_>) -> Result<()> {
        let (Some(trailer), Some(a)) = (self.head.trailer, self.stages.aslr.as_mut()) else {
            return Ok(());
        };
        let time_mode = self.head.time_mode.unwrap_or(false);
        let sid = trailer.read(r.bytes, self.e);
        let at = Stamp {
            time_mode,
            seq: r.seq,
        };
        if r.header.kind == rt::EXIT {
            if let Some(f) = Fork::parse(r.bytes, self.e) {
                a.task(r.offset, at.key(sid.time.or(f.time)), rt::EXIT, &f);
            }
        } else {
            a.ksymbol(r.offset, at.key(sid.time), r.bytes, self.e);
        }
        Ok(())
    }

    fn model_record(&mut self, r: &Rec<'_>) -> Result<()> {
        let kind = r.header.kind;
        let (Some(trailer), Some(first)) = (self.head.trailer, self.head.attrs.first()) else {
            return Err(Error::format(
                r.offset,
                format!("record of type {kind} before any HEADER_ATTR"),
            ));
        };
        let sample_type = first.sample_type;
        let time_mode = *self.head.time_mode.get_or_insert_with(|| {
            self.head
                .attrs
                .iter()
                .all(|a| a.sample_type & st::TIME != 0)
                && self.head.attrs[0].sample_id_all()
        });
        let at = Stamp {
            time_mode,
            seq: r.seq,
        };
        match kind {
            rt::SAMPLE => {
                self.scan.samples += 1;
                if let Some(t) = crate::format::sample::sample_time(r.bytes, self.e, sample_type) {
                    self.origin.span.note(t);
                }
                return Ok(());
            }
            rt::MMAP | rt::MMAP2 => self.mmap_record(r, trailer, at)?,
            rt::COMM => self.comm_record(r, trailer, at)?,
            _ => self.fork_record(r, trailer, at)?,
        }
        self.check_kept(r.offset)
    }

    /// An MMAP or MMAP2 record: a mapping of the model, and where it is.
    fn mmap_record(&mut self, r: &Rec<'_>, trailer: TrailerLayout, at: Stamp) -> Result<()> {
        let (e, kind) = (self.e, r.header.kind);
        let fixed = mmap_fixed(kind);
        let body_end = r
            .bytes
            .len()
            .checked_sub(trailer.size)
            .filter(|&b| b >= fixed)
            .ok_or_else(|| {
                Error::format(
                    r.offset,
                    format!(
                        "{} record of size {} is shorter than its header says",
                        if kind == rt::MMAP { "MMAP" } else { "MMAP2" },
                        r.bytes.len()
                    ),
                )
            })?;
        let sid = trailer.read(r.bytes, e);
        if let Some(t) = sid.time {
            self.origin.span.note(t);
        }
        let dso = match parse_mmap(&r.header, r.bytes, body_end, e) {
            Some(m) => {
                if let Some(j) = &mut self.stages.jit {
                    j.mapping(r.seq, r.header.cpumode(), &m, sid.time);
                }
                if let Some(a) = &mut self.stages.aslr {
                    a.mapping(r.offset, at.key(sid.time), r.header.cpumode(), &m);
                }
                self.builder
                    .mmap(at.key(sid.time), r.header.cpumode(), &m)
                    .map_err(|l| l.at(r.offset))?
            }
            None => None,
        };
        if let Some(dso) = dso
            && !r.inner
        {
            self.mappings.push(MappingRecord {
                file: self.file,
                offset: r.offset,
                seq: r.seq,
                dso,
            });
        }
        Ok(())
    }

    /// A COMM record: an exec starts a new address space.
    fn comm_record(&mut self, r: &Rec<'_>, trailer: TrailerLayout, at: Stamp) -> Result<()> {
        if r.header.misc & misc::COMM_EXEC == 0 {
            return Ok(());
        }
        let e = self.e;
        let sid = trailer.read(r.bytes, e);
        if let Some(t) = sid.time {
            self.origin.span.note(t);
        }
        let pid = Comm::parse(r.bytes, e)
            .ok_or_else(|| Error::format(r.offset, "COMM record is truncated"))?
            .pid;
        self.builder
            .exec(at.key(sid.time), pid)
            .map_err(|l| l.at(r.offset))
    }

    /// A FORK record: the child shares or copies its parent's address space.
    fn fork_record(&mut self, r: &Rec<'_>, trailer: TrailerLayout, at: Stamp) -> Result<()> {
        let e = self.e;
        // FORK: pid, ppid, tid, ptid, time.
        let Some(Fork {
            pid, ppid, time, ..
        }) = Fork::parse(r.bytes, e)
        else {
            return Err(Error::format(r.offset, "FORK record is truncated"));
        };
        let t = trailer.read(r.bytes, e).time.or(time);
        if let Some(t) = t {
            self.origin.span.note(t);
        }
        if let (Some(a), Some(f)) = (&mut self.stages.aslr, Fork::parse(r.bytes, e)) {
            a.task(r.offset, at.key(t), rt::FORK, &f);
        }
        self.builder
            .fork(at.key(t), pid, ppid)
            .map_err(|l| l.at(r.offset))
    }

    /// A stream's HEADER_ATTR: one event and its sample ids.
    fn attr_record(&mut self, r: &Rec<'_>) -> Result<()> {
        let e = self.e;
        let body = r.bytes.get(8..).unwrap_or_default();
        let mut a = Attr::parse(body, e, e == Endian::Big)
            .ok_or_else(|| Error::format(r.offset, "HEADER_ATTR record holds no valid attr"))?;
        a.ids = body
            .get(a.size as usize..)
            .unwrap_or_default()
            .chunks_exact(8)
            .filter_map(|c| e.u64(c, 0))
            .collect();
        if self.head.attrs.len() >= MAX_STREAM_ATTRS {
            return Err(Error::format(
                r.offset,
                format!("more than {MAX_STREAM_ATTRS} HEADER_ATTR records"),
            ));
        }
        if self.head.trailer.is_none() {
            self.head.trailer = Some(TrailerLayout::new(a.sample_type, a.sample_id_all()));
        }
        self.budget.kept.attrs +=
            (body.len() + 8 * a.ids.len()) as u64 + crate::limits::STREAM_ATTR_COST;
        self.head.attrs.push(a);
        self.head.attr_records.push(body.to_vec());
        self.check_kept(r.offset)
    }

    /// `--jit`, once the input is scanned: the jitdumps its markers name are read
    /// into the model (`jit::Stage::read`).
    fn read_jitdumps(&mut self, last: bool) -> Result<()> {
        let Some(mut j) = self.stages.jit.take() else {
            return Ok(());
        };
        let t = Instant::now();
        let meta = self.metadata();
        let keep_all = if self.scan.has_aux {
            Some("the recording has AUX data (a decoder walks the code)")
        } else if self
            .head
            .attrs
            .iter()
            .any(|a| a.sample_type & st::ADDR != 0)
        {
            Some("the recording has data addresses (perf mem names them by the mappings)")
        } else {
            None
        };
        let rec = crate::jit::Recording {
            attrs: &self.head.attrs,
            hostname: meta.hostname.as_deref(),
            end_time: self.origin.span.max.unwrap_or(0),
            keep_all,
        };
        let r = j.read(&rec, &mut self.builder, self.cx.pool, last);
        self.stages.jit = Some(j);
        self.add_time("jit-dumps", t.elapsed());
        r.map_err(|e| e.in_file(&self.name))
    }

    /// Resolves `chunks` of `files` against the model so far (all of it when the
    /// input has ended), then identifies the DSOs decided for the first time; returns
    /// those decisions, which the sink must make known before the resolved bytes.
    pub(crate) fn resolve(
        &mut self,
        files: &[DataFile],
        chunks: &[Chunk],
        ending: Ending,
        stop: &AtomicBool,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<Vec<Decision>> {
        if self.head.attrs.is_empty() {
            // Nothing can have been sampled or mapped without an event.
            return Ok(Vec::new());
        }
        // A file's jitdumps are read once it is scanned; a stream's on from batch to
        // batch.
        if ending == Ending::Ended || self.head.from_records {
            self.read_jitdumps(ending == Ending::Ended)?;
        }
        let t = Instant::now();
        let model = std::sync::Arc::new(match ending {
            Ending::Ended => std::mem::take(&mut self.builder).build(),
            Ending::MoreToCome => self.builder.snapshot(),
        });
        self.add_time("model", t.elapsed());
        let meta = self.metadata();
        let start = self.start();
        let trust = self.effective_trust(&meta, model.kernel_ref.as_ref(), &start);
        let batch = BatchInputs {
            model: &model,
            meta: &meta,
            trust: &trust,
            start: &start,
        };
        let hits = self.resolve_hits(&batch, files, chunks, stop, progress)?;
        if let Some(a) = &mut self.stages.aslr {
            // A file's mappings are laid out at once; a stream's up to the batch's end.
            let upto = match self.head.from_records {
                true => chunks.iter().map(|c| c.end).max().unwrap_or(0),
                false => u64::MAX,
            };
            a.layout(upto).map_err(|k| {
                Error::unsupported(format!(
                    "--aslr: the stream's mapping records go back in time across its rounds (at {} ns), so no layout keeps perf's order; save the stream and give it by path",
                    k.time
                ))
                .in_file(&self.name)
            })?;
        }
        if let Some(j) = &mut self.stages.jit {
            let t = Instant::now();
            j.resolved(&hits.offsets, hits.max_time);
            let ended = ending == Ending::Ended;
            if ended {
                j.choose(self.cx.pool);
            }
            let stream = self.head.from_records.then_some(ended);
            let splices = j.splices(self.e, &self.head.attrs, stream);
            if !splices.inserts.is_empty() && self.scan.compressed > 0 {
                j.notes.push(
                    "--jit: the recording's compressed records (perf record -z) are written expanded, as perf inject writes them: the JIT records go between them by time".into(),
                );
            }
            self.stages.splices = Some(splices);
            self.add_time("jit-images", t.elapsed());
        }
        let (groups, fresh) = self.undecided_groups(&model, hits);
        self.res.claims = buildid::Claims::gather(&model, &meta.table, &self.scan.stream_build_ids);
        let groups = self.with_contested(groups);
        if groups.is_empty() {
            return Ok(Vec::new());
        }
        let outcomes = self.identify(&batch, &groups);
        Ok(self.decide(&trust, groups, outcomes, fresh))
    }

    /// Walks the samples of `chunks` (and their user stacks when unwinding) against
    /// the batch's model: the hits per DSO, those of batches resolved ahead included.
    fn resolve_hits(
        &mut self,
        batch: &BatchInputs<'_>,
        files: &[DataFile],
        chunks: &[Chunk],
        stop: &AtomicBool,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<Hits> {
        let model = batch.model;
        let unwind = self.unwind_config(batch.meta);
        let time_mode = self.head.time_mode.unwrap_or(false);
        let t = Instant::now();
        let (memo, vouchers) = (&self.cx.handles.memo, self.cx.opts.effective_vouchers());
        let tables = self
            .res
            .tables
            .get_or_insert_with(|| UnwindTables::new(Some(memo.clone()), vouchers));
        tables.grow(model);
        // Unwind tables obey the proof the IDs obey, batch by batch.
        tables.set_proof(
            buildid::LocalFiles::of(&batch.trust.local),
            batch.start.clone(),
        );
        // A stream's HEADER_BUILD_ID records claim as a file's table does.
        tables.set_claimed(buildid::claimed_user_ids(
            batch
                .meta
                .table
                .entries
                .iter()
                .chain(&self.scan.stream_build_ids),
            &self.cx.opts.known,
        ));
        let mut resolver = Resolver::new(model, &self.head.attrs, time_mode, self.e);
        if let Some(cfg) = unwind {
            resolver = resolver.with_unwinding(cfg, &*tables);
        }
        if let Some(j) = &self.stages.jit {
            resolver = resolver.with_offsets(&j.offset_dsos());
        }
        let local = batch.trust.local.clone().err().map(|(_, why)| why);
        let tap = match &self.stages.spill {
            Some(spill) if self.scan.compressed == 0 => {
                let conv = crate::convert::Converter::new(
                    model,
                    unwind,
                    local.as_deref(),
                    &self.head.attrs,
                    self.e,
                )
                .map_err(|e| e.in_file(&self.name))?;
                Some(crate::convert::SpillTap::new(spill, conv))
            }
            _ => None,
        };
        let hits = if self.scan.compressed > 0 {
            let mut w = match self.res.flat_walker.take() {
                Some(w) if self.head.from_records => w,
                _ => Walker::new(self.e, chunks.first().map_or(0, |c| c.first_seq)),
            };
            let r = flat::resolve(
                self.cx.pool,
                &resolver,
                &mut w,
                files,
                chunks,
                stop,
                progress,
            );
            self.res.flat_walker = Some(w);
            r?
        } else {
            let tap = tap.as_ref().map(|t| t as &dyn crate::resolve::Rewrite);
            self.cx
                .pool
                .install(|| resolver.run(files, chunks, progress, stop, tap))?
        };
        drop(tap);
        drop(resolver);
        self.add_time("resolve", t.elapsed());
        let mut hits = hits;
        if let Some(prior) = self.res.prior.take() {
            hits.merge(prior);
        }
        Ok(hits)
    }

    /// The DSOs of `model` not decided yet, grouped by (address space, name) into one
    /// table entry each, those listed only (see below); a decided name gains the
    /// batch's new DSOs of that name. The hits count into the report. Returns the
    /// groups and how many there are.
    fn undecided_groups(&mut self, model: &Model, hits: Hits) -> (Vec<Group>, usize) {
        let all_hit = self.cx.opts.mode == Mode::All || self.scan.has_aux;
        let mut groups: BTreeMap<(bool, String), Group> = BTreeMap::new();
        for (i, d) in model.dsos.iter().enumerate() {
            let key = (d.kind.is_kernel_space(), d.name.clone());
            let id = i as DsoId;
            if let Some(dec) = self.res.decided.get_mut(&key) {
                if !dec.group.dsos.contains(&id) {
                    // The entry already written named the first file; perf keeps a
                    // mapping of another inode apart, without that ID.
                    dec.later_file |=
                        dec.group.dsos.iter().any(|&o| {
                            buildid::inode_conflict(&model.dsos[o as usize].ident, &d.ident)
                        });
                    dec.group.dsos.push(id);
                }
                continue;
            }
            let g = groups.entry(key).or_insert_with(|| Group {
                name: d.name.clone(),
                kind: d.kind,
                dsos: Vec::new(),
                hits: 0,
            });
            g.dsos.push(id);
            g.hits += hits.per_dso.get(i).copied().unwrap_or(0);
        }
        self.res.hits.merge(hits);
        // Listed: what samples touched; every DSO mapped as code with --buildid-all or
        // AUX data; and the vdso, which perf always lists.
        let groups: Vec<Group> = groups
            .into_values()
            .filter(|g| g.hits > 0 || g.kind == DsoKind::Vdso || (all_hit && g.is_code(model)))
            .collect();
        let fresh = groups.len();
        (groups, fresh)
    }

    /// `groups` and, after them, the decided DSOs whose claim is contested now.
    fn with_contested(&self, mut groups: Vec<Group>) -> Vec<Group> {
        // A stream's later records can contradict a claim taken in an earlier batch:
        // that DSO is decided again (its entry in a file output is written at the
        // end; a stream output gets a record for a proven ID from here on).
        groups.extend(
            self.res
                .decided
                .values()
                .filter(|d| {
                    d.outcome.contradiction().is_none()
                        && matches!(
                            d.outcome.source(),
                            Some(buildid::Source::Mmap2 | buildid::Source::InputTable)
                        )
                        && self
                            .res
                            .claims
                            .is_contested(d.group.kind.is_kernel_space(), &d.group.name)
                })
                .map(|d| d.group.clone()),
        );
        groups
    }

    /// The answer for each of `groups`, by the evidence of the batch.
    fn identify(&mut self, batch: &BatchInputs<'_>, groups: &[Group]) -> Vec<Outcome> {
        let t = Instant::now();
        let vouchers = self.cx.opts.effective_vouchers();
        let ev = Evidence {
            table: &batch.meta.table,
            stream: &self.scan.stream_build_ids,
            known: &self.cx.opts.known,
            trust: batch.trust,
            claims: &self.res.claims,
            times: batch.start.clone(),
            symfs: self.cx.opts.symfs.as_deref(),
            memo: Some(&self.cx.handles.memo),
            vouchers: &vouchers,
            // live capture hook (issue 32)
            live: self.live_capture().map(|c| c as &dyn buildid::Captured),
        };
        // The JIT images are answered by the stage that wrote them, and only the
        // rest are proven: an image written by this run has a ctime after the
        // recording's start, whose proof would look for an excuse in dpkg's whole
        // database for nothing (300 M instructions of a 23 M run on node).
        let jit: Vec<Option<Outcome>> = groups
            .iter()
            .map(|g| {
                let j = self.stages.jit.as_ref()?;
                g.dsos.iter().find_map(|&d| j.outcome(d))
            })
            .collect();
        // Copies of the groups only when the JIT stage answered some.
        let asked: std::borrow::Cow<'_, [Group]> = match jit.iter().all(Option::is_none) {
            true => groups.into(),
            false => groups
                .iter()
                .zip(&jit)
                .filter(|(_, j)| j.is_none())
                .map(|(g, _)| g.clone())
                .collect(),
        };
        let mut proven = self
            .cx
            .pool
            .install(|| buildid::identify(&asked, batch.model, &ev))
            .into_iter();
        // An ID no table entry or record can carry is refused before anything uses
        // it (the cache included).
        let outcomes: Vec<Outcome> = groups
            .iter()
            .zip(jit)
            .map(|(g, j)| {
                // identify answers each group asked, in order.
                let o = j.or_else(|| proven.next()).unwrap_or_else(|| {
                    Outcome::refused((buildid::Reason::Unreadable, "not proven".into()))
                });
                encodable(g, o, self.e)
            })
            .collect();
        self.add_time("identify", t.elapsed());
        outcomes
    }

    /// Records the answers: the first `fresh` of `groups` are new decisions (their
    /// files go into the build-ID cache), the rest decided again when contradicted.
    /// Returns the decisions the sink must make known.
    fn decide(
        &mut self,
        trust: &HostTrust,
        mut groups: Vec<Group>,
        mut outcomes: Vec<Outcome>,
        fresh: usize,
    ) -> Vec<Decision> {
        let again: Vec<_> = groups
            .split_off(fresh)
            .into_iter()
            .zip(outcomes.split_off(fresh))
            .collect();
        // perf's build-ID cache, beside any sink: the very files just proven.
        let t = Instant::now();
        let mut cached = match &self.cx.opts.cache {
            Some(c) => {
                self.cx
                    .pool
                    .install(|| buildid::cache::fill(c, &groups, &outcomes, trust))
                    .results
            }
            None => Vec::new(),
        };
        self.add_time("cache", t.elapsed());
        // live capture hook (issue 32): an entry the capture added during this run is
        // this run's, though the cache stage finds it there.
        if let Some(l) = self.live_capture() {
            use buildid::cache::CacheState;
            for r in cached.iter_mut().filter(|r| r.state == CacheState::Present) {
                let id = groups
                    .iter()
                    .zip(&outcomes)
                    .find(|(g, _)| g.name == r.name && g.kind.is_kernel_space() == r.kernel_space)
                    .and_then(|(_, o)| o.build_id());
                if id.is_some_and(|id| l.added(&id, false)) {
                    r.state = CacheState::Added;
                }
            }
        }
        // The symbol store, from the same open files (docs/store.md).
        let mut stored = Vec::new();
        if let Some(s) = &self.cx.handles.store {
            let t = Instant::now();
            stored = self
                .cx
                .pool
                .install(|| buildid::store::fill(s, &groups, &outcomes, trust));
            // live capture hook (issue 32): the same for the store.
            if let Some(l) = self.live_capture() {
                use buildid::store::StoreState;
                for r in stored.iter_mut().filter(|r| r.state == StoreState::Present) {
                    if l.added(&r.build_id, true) {
                        r.state = StoreState::Added;
                    }
                }
            }
            self.add_time("store", t.elapsed());
        }
        let mut new = Vec::with_capacity(groups.len() + again.len());
        for (group, outcome) in again {
            let key = (group.kind.is_kernel_space(), group.name.clone());
            if outcome.contradiction().is_some()
                && let Some(d) = self.res.decided.get_mut(&key)
            {
                d.outcome = outcome.without_file();
                new.push(d.clone());
            }
        }
        for (group, outcome) in groups.into_iter().zip(outcomes) {
            let space = group.kind.is_kernel_space();
            let cache = cached
                .iter()
                .position(|r| r.name == group.name && r.kernel_space == space)
                .map(|i| cached.swap_remove(i));
            let store = stored
                .iter()
                .position(|r| r.name == group.name && r.kernel_space == space)
                .map(|i| stored.swap_remove(i));
            // The proven file was needed for the cache only: no descriptor outlives
            // the batch.
            let outcome = outcome.without_file();
            let d = Decision {
                outcome,
                group,
                later_file: false,
                cache,
                store,
            };
            // The name is held twice: the key and the group.
            self.budget.kept.decisions +=
                2 * d.group.name.len() as u64 + crate::limits::STREAM_DECISION_COST;
            self.res.decided.insert(
                (d.group.kind.is_kernel_space(), d.group.name.clone()),
                d.clone(),
            );
            new.push(d);
        }
        new
    }

    /// The report of a run whose batches ended in `r`. On an error, work beside the
    /// stages is stopped; when it failed first (a full disk), its error explains why
    /// the stages stopped.
    fn conclude(
        self,
        r: Result<SinkReport>,
        out: &mut dyn Consumer,
        stop: &AtomicBool,
    ) -> Result<Report> {
        match r {
            Ok(sr) => {
                let jobs = self.cx.pool.current_num_threads();
                Ok(self.finish(sr, jobs))
            }
            Err(err) => {
                stop.store(true, Ordering::Relaxed);
                match (out.abort(), err) {
                    (Some(first), Error::Stopped) => Err(first),
                    (_, err) => Err(err),
                }
            }
        }
    }

    /// The report: counts, notes and one line per decided DSO. `sink` says how many
    /// entries the output gained and what the user should know about it.
    pub(crate) fn finish(mut self, sink: SinkReport, jobs: usize) -> Report {
        let mut r = self.counts(&sink, jobs);
        // live capture hook (issue 32): its summary line and counts.
        if let Some(l) = self.stages.live.take() {
            let (summary, notes) = l.finish();
            r.modes.live = summary;
            self.said.notes.extend(notes);
        }
        r.notes.append(&mut self.said.notes);
        if let Some(j) = &mut self.stages.jit {
            r.notes.append(&mut j.notes);
        }
        let meta = self.head.meta.take().unwrap_or_default();
        if meta.table.legacy {
            r.notes.push(
                "the input's build-ID table uses the pre-2010 layout; no entries are added to it"
                    .into(),
            );
        }
        if let Some(note) = self.trust_note() {
            r.notes.push(note);
        }
        r.notes.extend(sink.notes);
        let in_records = self.dso_lines(&mut r);
        r.ids.ids_written = r.ids.ids_written.saturating_sub(sink.ids_lost);
        if in_records > 0 {
            // Records pass through byte for byte (samples and mappings as recorded);
            // what pdinject writes is the table and its own records.
            r.notes.push(format!(
                "the input's own build-ID MMAP2 records of {in_records} DSO(s) carry a contradicted ID; they are passed on unchanged (pdinject never rewrites a record in build-ID form); the table entries and build-ID records pdinject writes say what was decided"
            ));
        }
        r
    }

    /// The report's counts and times, without notes or DSO lines.
    fn counts(&self, sink: &SinkReport, jobs: usize) -> Report {
        let hits = &self.res.hits;
        let modes = crate::report::Modes {
            in_place: sink.in_place.clone(),
            convert: sink.convert.clone(),
            aslr: sink.aslr.clone(),
            ..Default::default()
        };
        Report {
            reading: crate::report::Reading {
                records: self.scan.records,
                samples: hits.samples,
                guest_samples: hits.guest_samples,
                unmapped_addresses: hits.unmapped,
                unknown_event_samples: hits.unknown_event,
                compressed_records: self.scan.compressed,
                time_ordered: self.head.time_mode.unwrap_or(false),
                aux_all_hit: self.scan.has_aux,
            },
            unwinding: crate::report::Unwinding {
                unwound_samples: hits.unwound_samples,
                unwound_frames: hits.unwound_frames,
                over_budget_samples: hits.over_budget,
                frame_capped_samples: hits.frame_capped,
                // None in conversion mode, where no time budget applies (docs/convert.md).
                unwind_budget_us: self
                    .res
                    .unwind
                    .flatten()
                    .filter(|c| c.budget != Duration::MAX)
                    .map(|c| c.budget.as_secs_f64() * 1e6),
            },
            ids: crate::report::IdCounts {
                ids_new: sink.ids_new,
                ..Default::default()
            },
            modes,
            run: crate::report::RunFigures {
                stream_kept_bytes: self
                    .head
                    .from_records
                    .then(|| self.budget.kept_peak.load(Ordering::Relaxed)),
                resolved_beside_scan: self.res.ahead_stat.0,
                resolved_again: self.res.ahead_stat.1,
                timings_ms: self
                    .said
                    .timings
                    .iter()
                    .chain(sink.timings.iter())
                    .map(|(k, v)| (k.to_string(), v.as_secs_f64() * 1e3))
                    .collect(),
                jobs,
                verbose_timings: false,
            },
            ..Report::default()
        }
    }

    /// Why this host's files were not used, when they were not (the report's note).
    fn trust_note(&self) -> Option<String> {
        let undated = match self.start() {
            RecordingStart::Unknown(why) => Some(why),
            RecordingStart::Known(_) => None,
        };
        match (&self.origin.trust, undated) {
            (Some(t), _) if t.local.is_err() => match &t.local {
                Err((_, why)) => Some(format!("no local file is trusted: {why}")),
                Ok(()) => None,
            },
            (Some(_), Some(why)) => Some(format!("no local file is trusted: {why}")),
            (Some(t), None) => match &t.kernel {
                Err((_, why)) => Some(format!(
                    "kernel, modules and vdso of this host are not used: {why}"
                )),
                Ok(()) => None,
            },
            (None, _) => None,
        }
    }

    /// One line per decided DSO into `r`, with the counts of IDs written and
    /// missing. Returns how many DSOs' contradicted IDs the input's own build-ID MMAP2
    /// records carry.
    fn dso_lines(&mut self, r: &mut Report) -> usize {
        let mut in_records = 0;
        r.store = self.cx.handles.store.as_ref().map(|st| {
            buildid::store::StoreTotals::of(
                &st.dir,
                self.res.decided.values().filter_map(|d| d.store.as_ref()),
            )
        });
        for d in std::mem::take(&mut self.res.decided).into_values() {
            let o = d.outcome;
            let detail = if d.later_file && o.build_id().is_some() {
                Some(
                    "mapped from another file later in the stream: the ID names the first one; the later file's samples have none"
                        .into(),
                )
            } else {
                o.detail().map(str::to_string)
            };
            let hits = d
                .group
                .dsos
                .iter()
                .map(|&i| self.res.hits.per_dso.get(i as usize).copied().unwrap_or(0))
                .sum();
            r.ids.dsos_hit += 1;
            if o.build_id().is_some() {
                r.ids.ids_written += 1;
            } else {
                r.ids.ids_missing += 1;
            }
            let (stored, store_debuginfo, store_detail) = match &d.store {
                Some(s) => (Some(s.state), s.debuginfo, s.detail.clone()),
                None => (None, None, None),
            };
            let (cached, cache_entry, cache_detail) = match d.cache {
                Some(c) => (Some(c.state), c.entry, c.detail),
                None => (None, None, None),
            };
            if o.contradiction()
                .is_some_and(|c| c.verdict != buildid::Verdict::Confirmed && c.in_records)
            {
                in_records += 1;
            }
            r.dsos.push(DsoReport {
                claim: o.contradiction().map(ClaimReport::from),
                path: d.group.name,
                kind: d.group.kind,
                hits,
                build_id: o.build_id().map(|b| b.to_string()),
                source: o.source(),
                reason: o.reason(),
                detail,
                cached,
                cache_entry,
                cache_detail,
                stored,
                store_debuginfo,
                store_detail,
            });
        }
        in_records
    }
}

/// An outcome whose ID cannot be written as a table entry or record (a name longer
/// than a record can hold) becomes a refusal: what perf cannot read is never written.
fn encodable(g: &Group, o: Outcome, e: Endian) -> Outcome {
    let Some(id) = o.build_id() else { return o };
    if encode_table_entry(
        &mut Vec::new(),
        e,
        g.kind.build_id_cpumode(),
        &id,
        g.name.as_bytes(),
    ) {
        return o;
    }
    Outcome::refused((
        Reason::Unsupported,
        format!(
            "the name is {} bytes; perf reads at most {} (PATH_MAX) and would crash on it",
            g.name.len(),
            crate::limits::MAX_DSO_NAME
        ),
    ))
}

/// Where a model event falls: its time when the recording is time-ordered, and its
/// record's number (which orders events of one time, or all of them otherwise).
#[derive(Clone, Copy)]
struct Stamp {
    time_mode: bool,
    seq: u64,
}

impl Stamp {
    /// The model's key for an event at time `t` (a record's own or its sample id's).
    fn key(self, t: Option<u64>) -> Key {
        Key::new(if self.time_mode { t.unwrap_or(0) } else { 0 }, self.seq)
    }
}

/// What one batch is resolved and decided against.
struct BatchInputs<'b> {
    model: &'b std::sync::Arc<Model>,
    meta: &'b Metadata,
    trust: &'b HostTrust,
    start: &'b RecordingStart,
}

/// Bytes of progress counted across the resolve workers.
pub(crate) struct Counter<'p> {
    done: AtomicU64,
    total: u64,
    stage: &'static str,
    opts: &'p Options,
}

impl<'p> Counter<'p> {
    pub(crate) fn new(opts: &'p Options, stage: &'static str, total: u64) -> Self {
        Counter {
            done: AtomicU64::new(0),
            total,
            stage,
            opts,
        }
    }

    pub(crate) fn add(&self, n: u64) {
        let d = self.done.fetch_add(n, Ordering::Relaxed) + n;
        self.opts.progress(self.stage, d, self.total);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_undated_batch_refuses_local_files_and_keeps_other_reasons() {
        let boot = (Reason::OtherHost, "another boot".to_string());
        let t = HostTrust {
            local: Ok(()),
            kernel: Err(boot.clone()),
        };
        let undated = RecordingStart::Unknown("a replay".into());
        let b = batch_trust(t.clone(), &undated);
        assert_eq!(b.local, Err((Reason::Undated, "a replay".to_string())));
        assert_eq!(
            b.kernel,
            Err(boot.clone()),
            "another boot stays another boot"
        );
        let dated = batch_trust(t, &RecordingStart::Known(1));
        assert_eq!(dated.local, Ok(()));
        let other = HostTrust {
            local: Err(boot.clone()),
            kernel: Err(boot.clone()),
        };
        assert_eq!(batch_trust(other, &undated).local, Err(boot));
    }

    #[test]
    fn cuts_split_at_chunk_points_and_the_safe_end() {
        const CLEAN: Boundary = Boundary {
            start: ChunkStart::May,
            follows: Follows::Record,
        };
        const UNCLEAN: Boundary = Boundary {
            start: ChunkStart::Never,
            follows: Follows::Record,
        };
        let mut c = Cuts::new(0, Point::new(16, 0));
        assert!(!c.after(Point::new(100, 1), CLEAN));
        assert!(c.after(Point::new(16 + CHUNK_BYTES, 9), CLEAN));
        assert!(
            !c.after(Point::new(16 + CHUNK_BYTES + 8, 10), UNCLEAN),
            "unclean"
        );
        assert!(c.after(Point::new(16 + 2 * CHUNK_BYTES, 20), CLEAN));
        let chunks = c.take(Point::new(16 + CHUNK_BYTES + 100, 12));
        assert_eq!(chunks.len(), 2);
        assert_eq!((chunks[0].start, chunks[0].end), (16, 16 + CHUNK_BYTES));
        assert_eq!(chunks[1].first_seq, 9);
        assert_eq!(c.base(), Point::new(16 + CHUNK_BYTES + 100, 12));
        let rest = c.take(Point::new(16 + 2 * CHUNK_BYTES, 20));
        assert_eq!(rest.len(), 1);
        assert_eq!(rest[0].first_seq, 12);
        assert!(c.take(Point::new(16, 0)).is_empty(), "never backwards");
    }
}
