//! What a run is asked to do: the mode, the build IDs the user knows, the worker
//! count, the output's form, unwinding and progress reporting. Filled in by the
//! command line (or any other caller of the library); read by the driver, the engine
//! and the sinks. Imports only `format` (IDs), `buildid` (the cache to fill, the
//! vouchers), `live` (its choice) and `limits`.

use crate::error::{Error, Result};
use std::time::Duration;

// The types of the configuration's fields, named here so a caller can fill them in.
pub use crate::{
    buildid::cache::BuildIdCache,
    buildid::vouch::{Remember, Vouchers},
    format::buildid::BuildId,
    live::LiveChoice,
};

/// Which DSOs get build IDs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Mode {
    /// DSOs touched by samples (`-b`, `--buildids`).
    #[default]
    Hit,
    /// Every DSO mapped as code (`--buildid-all`).
    All,
}

/// The form in which the output carries the IDs it gains. Which output (a file, a
/// stream, the input itself) is the driver's `driver::Output`; any form
/// goes with any output. A conversion of the samples (coming) is a choice of its own
/// beside this one, not a third form.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Form {
    /// perf's own: a BUILD_ID table in a file, HEADER_BUILD_ID records in a stream.
    #[default]
    Table,
    /// Besides, the mapping records of DSOs with a decided ID are written in
    /// build-ID form (`--mmap2-buildids` with [`Mode::Hit`], `--mmap2-buildid-all`
    /// with [`Mode::All`]); see `sink::mmap2`.
    Mmap2,
}

/// `--unwind`: how user stacks (`--call-graph dwarf` samples) are walked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum UnwindChoice {
    /// DWARF when the samples carry user stacks, else nothing.
    #[default]
    Auto,
    /// Never.
    None,
    /// Frame pointers only.
    Fp,
    /// DWARF CFI (frame pointers where CFI is missing).
    Dwarf,
}

pub use crate::format::attr_compat::AttrsFor;

/// `--jit`: whether jitdumps are turned into images and mapping records first
/// (`jit`, which the driver runs before the engine).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum JitChoice {
    /// Jitdump markers stay as they are (the default).
    #[default]
    Off,
    /// Inject, as `perf inject --jit`, with the mapping records `JitMaps` says.
    Inject(JitMaps),
}

/// `--jit-maps`: which code loads get a mapping record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum JitMaps {
    /// The loads some sample's address lies in at its time (IP, callchain, branch
    /// stack): every sample names the code it names with all of them (a load no
    /// sample lies in changes no lookup), and what the run keeps and does follows the
    /// samples, not the jitdump's size (docs/jit.md).
    #[default]
    Touched,
    /// Every load, as `perf inject --jit` writes them (`perf report --mmaps` and
    /// `perf script --show-mmap-events` list each).
    Every,
}

/// Progress callback: `(stage, done, total)` in bytes.
pub type ProgressFn = std::sync::Arc<dyn Fn(&str, u64, u64) + Send + Sync>;

/// Default per-sample unwinding budget (see docs/unwinding.md for the measurement).
pub(crate) const DEFAULT_UNWIND_BUDGET: Duration = Duration::from_millis(1);
/// Default frame cap: perf's own PERF_MAX_STACK_DEPTH is 127; deeper DWARF stacks exist.
pub const DEFAULT_MAX_FRAMES: usize = 512;

/// Options of a run: configuration only (paths, choices, figures). What a run opens
/// from them (the symbol store, the memo of proofs) it opens itself, at its start
/// (`engine::Handles`), so a caller cannot hand a run a handle of another's.
///
/// Open on purpose: callers fill it as `Options { .., ..Options::default() }`, a form
/// a new field (with its default) does not break and `#[non_exhaustive]` would forbid
/// outside the crate.
#[derive(Clone)]
pub struct Options {
    /// Hit or all.
    pub mode: Mode,
    /// `--known-build-ids`.
    pub known: Vec<(BuildId, String)>,
    /// Worker threads (default: all cores).
    pub jobs: Option<usize>,
    /// Progress reporting.
    pub progress: Option<ProgressFn>,
    /// How user stacks are walked, and how long and deep.
    pub unwind: Unwinding,
    /// perf's build-ID cache to fill (`None`: `--no-buildid-cache`, and the library
    /// default).
    pub cache: Option<BuildIdCache>,
    /// `--symbol-store`: the directory of the build-ID symbol store to fill
    /// (docs/store.md), opened (and made) when the run starts.
    pub store: Option<std::path::PathBuf>,
    /// `--symfs`: user DSOs are read under this sysroot.
    pub symfs: Option<std::path::PathBuf>,
    /// How the output carries the IDs.
    pub form: Form,
    /// How far the resolve runs beside the scan, and what a stream may keep.
    pub memory: Memory,
    /// `--attrs-for`: the attr size of the output (default: the input's).
    pub attrs_for: AttrsFor,
    /// `--convert-callchain`: DWARF stack dumps become callchains (`convert`).
    pub callchains: Callchains,
    /// `--jit`: jitdumps become images and mapping records (`jit`).
    pub jit: JitChoice,
    /// `--aslr`: addresses moved to a layout that gives away none of the recorded
    /// machine's (`aslr`, docs/aslr.md).
    pub addresses: Addresses,
    /// What may excuse a DSO's ctime moved after the recording started: dpkg's
    /// database (`--dpkg-admindir`), pdinject's cache links, `--trust-same-layout`
    /// (docs/guarantees.md).
    pub vouchers: Vouchers,
    /// `--live`, `--live-budget`: capture mapped files while a live stream is read
    /// (issue 32, `live`; the library's default is off).
    pub live: Live,
}

/// `--unwind`, `--unwind-budget`, `--unwind-max-frames`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unwinding {
    /// How user stacks are walked.
    pub how: UnwindChoice,
    /// Time allowed to unwind one sample.
    pub budget: Duration,
    /// Frames walked at most per sample.
    pub max_frames: usize,
}

impl Default for Unwinding {
    fn default() -> Self {
        Unwinding {
            how: UnwindChoice::Auto,
            budget: DEFAULT_UNWIND_BUDGET,
            max_frames: DEFAULT_MAX_FRAMES,
        }
    }
}

/// What the run may hold of the input at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Memory {
    /// A file is resolved while it is scanned, a batch each time the scan has gone
    /// this many bytes further and the previous batch is done (`None`: after the
    /// whole scan, as one batch). Results are the same either way (`engine::Beside`).
    pub resolve_ahead: Option<u64>,
    /// Bytes a stream may keep across its batches (`--stream-memory`; see
    /// [`crate::limits::StreamKept`]).
    pub stream: u64,
}

impl Default for Memory {
    fn default() -> Self {
        Memory {
            resolve_ahead: Some(DEFAULT_RESOLVE_AHEAD),
            stream: crate::limits::DEFAULT_STREAM_MEMORY,
        }
    }
}

/// `--live` and what the capture may copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Live {
    /// Whether mappings are captured while the stream is read.
    pub choice: LiveChoice,
    /// `--live-budget`: bytes the live capture may copy.
    pub budget: u64,
}

impl Default for Live {
    fn default() -> Self {
        Live {
            choice: crate::live::LiveChoice::Off,
            budget: crate::live::DEFAULT_BUDGET,
        }
    }
}

/// What the output's samples carry of user stacks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Callchains {
    /// As recorded (the stack dumps stay).
    #[default]
    AsRecorded,
    /// `--convert-callchain`: each DWARF stack dump unwound into the callchain, and
    /// the dumps dropped.
    Converted,
}

/// What the output's addresses are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Addresses {
    /// As recorded.
    #[default]
    AsRecorded,
    /// `--aslr`: every mapping moved to perf 7.3's deterministic layout, every
    /// address that names a place in the recorded machine's memory remapped or
    /// removed (docs/aslr.md).
    Remapped,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            mode: Mode::Hit,
            known: Vec::new(),
            jobs: None,
            progress: None,
            unwind: Unwinding::default(),
            cache: None,
            store: None,
            symfs: None,
            form: Form::Table,
            memory: Memory::default(),
            attrs_for: AttrsFor::Verbatim,
            callchains: Callchains::AsRecorded,
            jit: JitChoice::Off,
            addresses: Addresses::AsRecorded,
            vouchers: crate::buildid::vouch::Vouchers::default(),
            live: Live::default(),
        }
    }
}

/// Bytes a file's scan goes on at least before the records behind it are resolved
/// beside it (see [`Memory::resolve_ahead`]). Below a few hundred MB the scan takes
/// milliseconds and the pool is better used mapping its windows (on dwarf-med, 146 MB,
/// resolving beside the scan measured no faster on 2 cores); on GB-sized files it
/// takes a fifth of the run.
pub(crate) const DEFAULT_RESOLVE_AHEAD: u64 = 256 << 20;

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("mode", &self.mode)
            .field("known", &self.known)
            .field("jobs", &self.jobs)
            .field("unwind", &self.unwind)
            .field("cache", &self.cache)
            .field("store", &self.store)
            .field("symfs", &self.symfs)
            .field("form", &self.form)
            .field("memory", &self.memory)
            .field("attrs_for", &self.attrs_for)
            .field("callchains", &self.callchains)
            .field("jit", &self.jit)
            .field("addresses", &self.addresses)
            .field("vouchers", &self.vouchers)
            .field("live", &self.live)
            .finish_non_exhaustive()
    }
}

impl Options {
    /// What may excuse a moved ctime in this run: [`Options::vouchers`], with the
    /// link record of the cache this run fills when they name none (a library caller
    /// that fills a cache proves again what its own links moved).
    pub(crate) fn effective_vouchers(&self) -> crate::buildid::vouch::Vouchers {
        let mut v = self.vouchers.clone();
        if v.cache.is_none() {
            v.cache = self.cache.as_ref().map(|c| c.dir.clone());
        }
        // A run that writes the cache (not -N) notes there what dpkg vouched for.
        if let Some(c) = &self.cache
            && v.cache.as_ref() == Some(&c.dir)
        {
            v.remember = crate::buildid::vouch::Remember::InLinkRecord;
        }
        v
    }

    /// Reports progress of `stage`, if anyone listens.
    pub(crate) fn progress(&self, stage: &str, done: u64, total: u64) {
        if let Some(p) = &self.progress {
            p(stage, done, total)
        }
    }

    /// The worker pool: `jobs` threads, all cores by default.
    pub(crate) fn pool(&self) -> Result<rayon::ThreadPool> {
        let jobs = self
            .jobs
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
            .max(1);
        rayon::ThreadPoolBuilder::new()
            .num_threads(jobs)
            .build()
            .map_err(|e| Error::Internal(format!("cannot start {jobs} worker threads: {e}")))
    }
}

/// Parses `--known-build-ids='HEX PATH,HEX PATH'`.
pub fn parse_known(s: &str) -> Result<Vec<(BuildId, String)>> {
    let mut out = Vec::new();
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (hex, path) = item.split_once(char::is_whitespace).ok_or_else(|| {
            Error::Usage(format!("--known-build-ids: '{item}' is not 'HEX PATH'"))
        })?;
        let id = BuildId::from_hex(hex).ok_or_else(|| {
            Error::Usage(format!(
                "--known-build-ids: '{hex}' is not an even-length hex build ID of at most 40 digits"
            ))
        })?;
        out.push((id, path.trim().to_string()));
    }
    Ok(out)
}
