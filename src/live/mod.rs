//! Live capture (issue 32): while pdinject reads a stream that `perf record` is
//! writing now on this host and boot, each new file-backed executable mapping of a
//! live process is read through the process itself as its record arrives: its
//! build ID comes from the very inode that was mapped (`/proc/PID/map_files`), so a
//! deploy by rename, a deleted binary or a container that exits before the
//! recording ends no longer loses the file. The file goes into the build-ID cache
//! (and the symbol store), once per build ID.
//!
//! The narrow interface: [`Capture::offer`] takes a mapping record as it arrives
//! (on the reader's thread, never waiting: a bounded queue, what is dropped is
//! counted); a worker thread proves each mapping, a second one fills the cache;
//! [`Capture::lookup`] answers, for one file identity of the recording (device,
//! inode, generation; or a build ID), the ID every recorded mapping of it had, or
//! why it cannot say. [`stream::LiveStream`] is the stream side: it tells a live
//! stream of this host and boot and feeds the records to a [`Capture`].
//!
//! What a captured ID rests on (docs/live.md, "Why a captured ID is right"):
//!
//! * **The inode.** map_files opens the inode mapped at exactly `START-END` in the
//!   process now; its device, inode and (where the filesystem answers
//!   FS_IOC_GETVERSION and the record has one) generation must be the record's. The
//!   fallback, `/proc/PID/root/PATH`, opens whatever the path names now, and the
//!   same check refuses another file.
//! * **The process.** What matters is the inode, not the process: a reused pid
//!   that maps the same inode at the same addresses maps the same bytes. A process
//!   that started after the mapping (its start time in `/proc/PID/stat` later than
//!   the record's time can be) is refused as another process all the same.
//! * **The bytes since the mapping.** The file's times are judged by the proof's
//!   own rules ([`crate::buildid::elf::judge`]: modified after the mapping → refused;
//!   changed (ctime) with an older mtime → only with the recorded layout) against a
//!   *lower bound* of the mapping's time: the process's start (a mapping happens
//!   after its process started), or the record's time on perf's clock moved onto
//!   the monotonic clock by bounds the stream itself gives (see [`Clock`]).
//! * **Every mapping of the file.** An ID speaks for a file identity only when a
//!   stat of the file after the last of its mapping records arrived shows it
//!   unchanged since the earliest of them (the cache's own hard link moves the
//!   ctime: its link record, issue 29, vouches for that and for nothing else), and no capture of
//!   it found it changed or found another ID.

mod procfs;
pub(crate) use procfs::perf_clock_offset;
pub(crate) mod stream;
mod worker;

pub(crate) use stream::LiveStream;

use crate::buildid::cache::BuildIdCache;
use crate::buildid::elf::Segment;
use crate::buildid::store::SymbolStore;
use crate::buildid::{FileTimes, Reason, Refusal};
use crate::format::buildid::BuildId;
use crate::format::record::FileIdent;
use crate::model::ExecMaps;
use std::collections::HashMap;
use std::fs::File;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// `--live`: whether mappings are captured while the stream is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum LiveChoice {
    /// Never (the library's default).
    #[default]
    Off,
    /// When the input is a stream being recorded now on this host and boot (the
    /// command line's default).
    Auto,
    /// On any stream input, without the proof that it is of this host and boot (each
    /// mapping's own checks still apply).
    On,
}

/// Captured bytes a run may copy into the cache and the store (`--live-budget`).
pub(crate) const DEFAULT_BUDGET: u64 = 1 << 30;
/// The command line's spelling of [`DEFAULT_BUDGET`].
pub const DEFAULT_BUDGET_ARG: &str = "1G";
/// Mapping records waiting for the worker at most; more are dropped and counted.
pub(crate) const QUEUE: usize = 4096;
/// Files waiting for the cache at most (each holds a descriptor; at most a quarter
/// of the open-file limit).
pub(crate) const FILL_QUEUE: usize = 1024;
/// Files the capture keeps open to stat them again when more of their mappings
/// arrive (later mappings of a file whose processes are gone are then still
/// covered).
pub(crate) const FILES_KEPT: usize = 128;
/// Distinct files (identities) the capture tracks; mappings of more are not
/// captured (counted).
pub(crate) const MAX_FILES: usize = 65536;
/// What the capture keeps of the files it tracks, in estimated bytes (each file's
/// entry [`ENTRY_COST`], each distinct name three times its length): past it,
/// mappings of new files are not captured (counted with those past [`MAX_FILES`]).
pub(crate) const MEMORY: u64 = 32 << 20;
/// Estimated bytes of one tracked file's entry (its segments, mappings, times).
pub(crate) const ENTRY_COST: u64 = 512;
/// Loadable segments a captured file may have (ELF files have a few).
pub(crate) const MAX_LOADS: usize = 64;
/// How long identify waits for the worker to catch up with the records arrived.
pub(crate) const SETTLE: Duration = Duration::from_secs(2);

/// What a capture may write and hold.
#[derive(Clone, Debug)]
pub struct LiveConfig {
    /// The build-ID cache to put captured files in.
    pub cache: Option<BuildIdCache>,
    /// The symbol store to put them in (`--symbol-store`).
    pub store: Option<SymbolStore>,
    /// Bytes copied into the cache and the store at most (hard links are free).
    pub byte_budget: u64,
    /// Queue length (mapping records).
    pub queue: usize,
    /// Files kept open.
    pub files_kept: usize,
    /// Read through `/proc/PID/root/PATH` only, as without the privilege for
    /// map_files (tests).
    pub root_only: bool,
    /// The clock of the records' times.
    pub perf_clock: PerfClock,
}

/// The clock of a recording's times: perf's default, or the one `perf record -k`
/// chose (`attr.use_clockid`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum PerfClock {
    /// The kernel's local clock (perf's default): measured against the monotonic
    /// clock, and bounded by the stream.
    #[default]
    Local,
    /// CLOCK_MONOTONIC (`-k mono`): the records' times are the monotonic clock's.
    Monotonic,
    /// Another clock (`-k realtime`, `-k boottime`, ...): bounded by the stream only.
    Other,
}

impl Default for LiveConfig {
    fn default() -> Self {
        LiveConfig {
            cache: None,
            store: None,
            byte_budget: DEFAULT_BUDGET,
            queue: QUEUE,
            files_kept: FILES_KEPT,
            root_only: false,
            perf_clock: PerfClock::Local,
        }
    }
}

/// One mapping record as it arrives, the fields of PERF_RECORD_MMAP2 (or MMAP).
#[derive(Clone, Copy, Debug)]
pub struct MapArrival<'a> {
    /// Process.
    pub pid: u32,
    /// Thread.
    pub tid: u32,
    /// Start address.
    pub start: u64,
    /// Length.
    pub len: u64,
    /// File offset.
    pub pgoff: u64,
    /// Device, inode and generation, or the build ID of a build-ID MMAP2.
    pub ident: FileIdent,
    /// PROT_* bits.
    pub prot: u32,
    /// MAP_* flags.
    pub flags: u32,
    /// The path.
    pub filename: &'a [u8],
    /// The record's time on perf's clock (`None`: no time, as perf's synthesized
    /// records of processes running before the recording have).
    pub time: Option<u64>,
    /// `header.misc & CPUMODE_MASK`.
    pub cpumode: u16,
}

/// What [`Capture::offer`] did with a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Offered {
    /// Queued for the worker.
    Queued,
    /// Not a file-backed executable user mapping with an identity (kernel, anonymous,
    /// data, vdso, an MMAP without inode): nothing to capture.
    Skipped,
    /// The queue was full: dropped and counted.
    Dropped,
    /// More distinct files than [`MAX_FILES`]: not tracked, counted.
    Untracked,
}

/// What the capture can say of one file identity.
#[derive(Clone, Debug)]
pub enum LiveAnswer {
    /// The ID every recorded mapping of it had, and the captured file (while kept).
    Proven {
        /// Its ID.
        build_id: BuildId,
        /// The file (open) when still kept.
        file: Option<Arc<File>>,
        /// How it was read, for the report.
        detail: String,
    },
    /// Why not.
    Unproven(Refusal),
}

/// A file identity as the records give it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Key {
    /// Device, inode, generation (0: unknown).
    Inode(u32, u32, u64, u64),
    /// A build-ID MMAP2: the kernel read the note; the capture keeps the file.
    Id(BuildId),
}

impl Key {
    fn of(ident: &FileIdent) -> Option<Key> {
        match *ident {
            FileIdent::Inode {
                maj,
                min,
                ino,
                generation,
            } => Some(Key::Inode(maj, min, ino, generation)),
            FileIdent::BuildId(b) => Some(Key::Id(b)),
            FileIdent::None => None,
        }
    }
}

/// One mapping record for the worker.
#[derive(Debug)]
pub(crate) struct Job {
    pub key: Key,
    pub pid: u32,
    pub start: u64,
    pub end: u64,
    pub pgoff: u64,
    pub time: Option<u64>,
    /// Monotonic ns when it arrived.
    pub arrival: i128,
    /// Its arrival number (1, 2, ...).
    pub seq: u64,
    pub name: Arc<str>,
    pub raw_name: Arc<[u8]>,
}

/// What the capture knows of one file identity.
#[derive(Debug, Default)]
pub(crate) struct Entry {
    /// The first name it was mapped under.
    pub name: Option<Arc<str>>,
    // --- the records (reader side) ---
    /// Its mapping records: how many arrived, the last's number, how many wait.
    pub arrived: Arrivals,
    /// Its executable mappings, for the layout rule.
    pub maps: ExecMaps,
    /// Records whose mapping time has no lower bound of their own (dropped, or their
    /// process was gone).
    pub unowned: Unowned,
    // --- what the worker found ---
    /// The smallest lower bound (monotonic ns) of the mapping times of records whose
    /// process was found.
    pub lb_owned: Option<i128>,
    /// Its ID, as read from the inode.
    pub id: Option<BuildId>,
    pub loads: Vec<Segment>,
    pub size: u64,
    /// Times of the latest stat, and the arrival number every record up to which
    /// arrived before that stat.
    pub times: Option<FileTimes>,
    pub stat_seq: u64,
    /// The file, while kept.
    pub file: Option<Arc<File>>,
    /// A capture found it changed since a mapping, another ID, or another file:
    /// nothing it captured speaks for it.
    pub taint: Option<Refusal>,
    /// Mappings read through the process.
    pub captured: u32,
    /// Why the last attempt failed (a process gone, with how late its record was).
    pub last_failure: Option<String>,
    /// The file went to the filler.
    pub filled: bool,
}

/// The mapping records of one file identity, as they arrive.
#[derive(Debug, Default)]
pub(crate) struct Arrivals {
    /// Mapping records arrived.
    pub records: u32,
    /// Arrival number of the last.
    pub seq_max: u64,
    /// Records queued and not yet proven.
    pub pending: u32,
}

/// Records of one identity whose mapping time has no lower bound of their own: the
/// smallest of their times, and how many have no time.
#[derive(Debug, Default)]
pub(crate) struct Unowned {
    pub t: Option<u64>,
    pub untimed: u32,
}

/// Counts for the summary.
#[derive(Debug, Default)]
pub(crate) struct Counts {
    pub offered: AtomicU64,
    pub captured: AtomicU64,
    pub stat_only: AtomicU64,
    pub exited: AtomicU64,
    pub reused: AtomicU64,
    pub changed: AtomicU64,
    pub mismatched: AtomicU64,
    pub unreadable: AtomicU64,
    pub dropped: AtomicU64,
    pub untracked: AtomicU64,
    /// What the filler did with each captured file.
    pub fills: FillCounts,
    pub bytes: AtomicU64,
    pub over_budget: AtomicU64,
    pub fill_dropped: AtomicU64,
}

/// The filler's counts: files added to, already in, or failed for the cache and the
/// store.
#[derive(Debug, Default)]
pub(crate) struct FillCounts {
    pub cache_added: AtomicU64,
    pub cache_present: AtomicU64,
    pub cache_failed: AtomicU64,
    pub store_added: AtomicU64,
    pub store_present: AtomicU64,
    pub store_failed: AtomicU64,
}

/// perf's clock against the monotonic clock: `d = monotonic - perf clock` lies in
/// `[low, high]`. perf's default clock is the kernel's local clock, close to but
/// not the monotonic clock (2.2 ms apart after an hour here, and drifting). Three
/// sources of bounds:
///
/// * measured ([`procfs::perf_clock_offset`]: an event of pdinject's own records a
///   mapping between two reads of the monotonic clock; microseconds wide), again
///   every [`RECALIBRATE`], widened by 1 ms and 100 ppm of its age for the drift;
/// * `high`: a record arrives after its time, so `d <= arrival - T` for every
///   record (the smallest so far);
/// * `low`: a mapping happens after its process started, so `d >= start - T` for
///   every captured process (the largest).
#[derive(Debug)]
pub(crate) struct Clock {
    low: AtomicI64,
    high: AtomicI64,
    /// The last measurement: (low, high, when on the monotonic clock), or `None`
    /// when it was not permitted (not tried again).
    measured: Mutex<Option<Option<(i128, i128, i128)>>>,
}

/// How often the clock offset is measured again.
pub(crate) const RECALIBRATE: Duration = Duration::from_secs(10);

impl Default for Clock {
    fn default() -> Self {
        Clock {
            low: AtomicI64::new(i64::MIN),
            high: AtomicI64::new(i64::MAX),
            measured: Mutex::new(None),
        }
    }
}

impl Clock {
    fn clamp(v: i128) -> i64 {
        v.clamp(i64::MIN as i128 + 1, i64::MAX as i128 - 1) as i64
    }

    /// Measures the offset when the last measurement is older than
    /// [`RECALIBRATE`] (the worker calls it before each job); for a recording on
    /// the monotonic clock, the offset is 0.
    pub(crate) fn calibrate(&self, clock: PerfClock) {
        let Ok(mut m) = self.measured.lock() else {
            return;
        };
        match clock {
            PerfClock::Local => {}
            PerfClock::Monotonic => {
                *m = Some(Some((0, 0, procfs::mono_ns())));
                return;
            }
            PerfClock::Other => {
                *m = Some(None);
                return;
            }
        }
        let now = procfs::mono_ns();
        match *m {
            Some(None) => {}
            Some(Some((_, _, at))) if now - at < RECALIBRATE.as_nanos() as i128 => {}
            _ => {
                *m = Some(procfs::perf_clock_offset().map(|(lo, hi)| (lo, hi, now)));
            }
        }
    }

    /// Whether the offset is measured (not only bounded by the stream).
    pub(crate) fn is_measured(&self) -> bool {
        matches!(self.measured.lock().map(|m| *m), Ok(Some(Some(_))))
    }

    /// The measured bounds, widened for their age.
    fn measured(&self) -> Option<(i128, i128)> {
        let (lo, hi, at) = (*self.measured.lock().ok()?)??;
        if (lo, hi) == (0, 0) {
            // The monotonic clock itself.
            return Some((0, 0));
        }
        let widen = 1_000_000 + (procfs::mono_ns() - at).max(0) / 10_000;
        Some((lo - widen, hi + widen))
    }

    /// A record with time `t` arrived at monotonic `arrival`.
    pub(crate) fn arrived(&self, t: u64, arrival: i128) {
        self.high
            .fetch_min(Self::clamp(arrival - t as i128), Ordering::Relaxed);
    }

    /// The process that made a mapping at `t` started at monotonic `start` or later.
    pub(crate) fn started(&self, t: u64, start: i128) {
        self.low
            .fetch_max(Self::clamp(start - t as i128), Ordering::Relaxed);
    }

    pub(crate) fn high(&self) -> Option<i128> {
        let h = self.high.load(Ordering::Relaxed);
        let stream = (h != i64::MAX).then_some(h as i128);
        match (stream, self.measured()) {
            (Some(s), Some((_, m))) => Some(s.min(m)),
            (s, m) => s.or(m.map(|m| m.1)),
        }
    }

    /// The lower bound, never above the upper one (a lower bound above it would
    /// come from a process that is not the mapper: not trusted).
    pub(crate) fn low(&self) -> Option<i128> {
        let l = self.low.load(Ordering::Relaxed);
        let stream = (l != i64::MIN).then_some(l as i128);
        let low = match (stream, self.measured()) {
            (Some(s), Some((m, _))) => Some(s.max(m)),
            (s, m) => s.or(m.map(|m| m.0)),
        }?;
        match self.high() {
            Some(h) if low > h => Some(h),
            _ => Some(low),
        }
    }
}

/// What worker and reader share.
pub(crate) struct Shared {
    pub cfg: LiveConfig,
    pub entries: Mutex<HashMap<Key, Entry>>,
    /// Which entry holds a file with this ID (for the cache of claimed IDs).
    pub by_id: Mutex<HashMap<BuildId, Key>>,
    /// IDs this capture added to the cache and to the store.
    pub added: Mutex<(
        std::collections::HashSet<BuildId>,
        std::collections::HashSet<BuildId>,
    )>,
    pub counts: Counts,
    pub clock: Clock,
    /// Mapping records arrived (their arrival numbers), queued, and proven.
    pub arrived: AtomicU64,
    pub sent: AtomicU64,
    pub done: Mutex<u64>,
    pub done_cv: Condvar,
    /// map_files was refused: files are read through the process's root.
    pub root_only: AtomicBool,
    /// The run ends without its output (an error): what is queued is dropped.
    pub stop: AtomicBool,
    pub kept: AtomicU64,
    /// Lateness of records (arrival - T) in ns, the first [`LAGS_KEPT`].
    pub lags: Mutex<Vec<i64>>,
    /// How late records of exited processes were, at least (ns).
    pub exited_late: Mutex<Vec<i64>>,
}

/// Record lateness values kept for the summary.
const LAGS_KEPT: usize = 1 << 16;

/// The live capture of one stream: a worker proving mappings, one filling the cache.
pub struct Capture {
    shared: Arc<Shared>,
    tx: Option<SyncSender<Job>>,
    threads: Vec<std::thread::JoinHandle<()>>,
    names: HashMap<Vec<u8>, Name>,
    /// Estimated bytes kept ([`MEMORY`]).
    kept_bytes: u64,
}

/// A recorded path as text (messages, the cache's directory) and as bytes (the
/// process's root).
type Name = (Arc<str>, Arc<[u8]>);

impl std::fmt::Debug for Capture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Capture").finish_non_exhaustive()
    }
}

impl Capture {
    /// Starts the workers. Fails only when no thread can be started.
    pub fn start(cfg: LiveConfig) -> std::io::Result<Capture> {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Job>(cfg.queue.max(1));
        let nofile = procfs::raise_nofile();
        let fill_queue = FILL_QUEUE.min((nofile / 4) as usize).max(1);
        let (ftx, frx) = std::sync::mpsc::sync_channel(fill_queue);
        let shared = Arc::new(Shared {
            root_only: AtomicBool::new(cfg.root_only),
            stop: AtomicBool::new(false),
            cfg,
            entries: Mutex::new(HashMap::new()),
            by_id: Mutex::new(HashMap::new()),
            added: Mutex::new(Default::default()),
            counts: Counts::default(),
            clock: Clock::default(),
            arrived: AtomicU64::new(0),
            sent: AtomicU64::new(0),
            done: Mutex::new(0),
            done_cv: Condvar::new(),
            kept: AtomicU64::new(0),
            lags: Mutex::new(Vec::new()),
            exited_late: Mutex::new(Vec::new()),
        });
        let s = shared.clone();
        let prover = std::thread::Builder::new()
            .name("pdinject-live".into())
            .spawn(move || worker::prover(&s, rx, ftx))?;
        let s = shared.clone();
        let filler = std::thread::Builder::new()
            .name("pdinject-live-cache".into())
            .spawn(move || worker::filler(&s, frx))?;
        Ok(Capture {
            shared,
            tx: Some(tx),
            threads: vec![prover, filler],
            names: HashMap::new(),
            kept_bytes: 0,
        })
    }

    /// Takes one mapping record as it arrives. Never waits: a full queue drops the
    /// record (counted; its file may still be proven by the records around it).
    pub fn offer(&mut self, m: &MapArrival<'_>) -> Offered {
        use crate::format::record::{PROT_EXEC, misc};
        if m.cpumode != misc::USER || m.prot & PROT_EXEC == 0 || m.len == 0 {
            return Offered::Skipped;
        }
        let Some(key) = Key::of(&m.ident) else {
            return Offered::Skipped;
        };
        if !matches!(
            crate::model::classify(m.filename, m.cpumode, m.flags),
            Some((crate::model::DsoKind::User, _))
        ) {
            return Offered::Skipped;
        }
        let Some(end) = m.start.checked_add(m.len) else {
            return Offered::Skipped;
        };
        let (name, raw_name) = self.name(m.filename);
        let over = self.kept_bytes + ENTRY_COST > MEMORY;
        let sh = &self.shared;
        let arrival = procfs::mono_ns();
        if let Some(t) = m.time {
            sh.clock.arrived(t, arrival);
            if let Ok(mut l) = sh.lags.lock()
                && l.len() < LAGS_KEPT
            {
                l.push(Clock::clamp(arrival - t as i128));
            }
        }
        sh.counts.offered.fetch_add(1, Ordering::Relaxed);
        let seq = {
            let Ok(mut entries) = sh.entries.lock() else {
                return Offered::Untracked;
            };
            if !entries.contains_key(&key) {
                if entries.len() >= MAX_FILES || over {
                    sh.counts.untracked.fetch_add(1, Ordering::Relaxed);
                    return Offered::Untracked;
                }
                self.kept_bytes += ENTRY_COST;
            }
            // The arrival number is taken under the lock the worker reads entries
            // with: a stat that read `arrived` after it follows this arrival.
            let seq = sh.arrived.fetch_add(1, Ordering::SeqCst) + 1;
            let e = entries.entry(key).or_default();
            e.name.get_or_insert_with(|| name.clone());
            e.arrived.records += 1;
            e.arrived.seq_max = seq;
            e.maps.add(m.pgoff, m.len);
            e.arrived.pending += 1;
            seq
        };
        let job = Job {
            key,
            pid: m.pid,
            start: m.start,
            end,
            pgoff: m.pgoff,
            time: m.time,
            arrival,
            seq,
            name,
            raw_name,
        };
        let tx = self.tx.as_ref().expect("open until finish");
        match tx.try_send(job) {
            Ok(()) => {
                sh.sent.fetch_add(1, Ordering::SeqCst);
                Offered::Queued
            }
            Err(TrySendError::Full(job) | TrySendError::Disconnected(job)) => {
                sh.counts.dropped.fetch_add(1, Ordering::Relaxed);
                if let Ok(mut entries) = sh.entries.lock()
                    && let Some(e) = entries.get_mut(&job.key)
                {
                    e.arrived.pending -= 1;
                    unowned(e, job.time);
                }
                Offered::Dropped
            }
        }
    }

    /// Interned names (a library is mapped by every process under one name).
    fn name(&mut self, raw: &[u8]) -> Name {
        if let Some(n) = self.names.get(raw) {
            return n.clone();
        }
        let s: Arc<str> = String::from_utf8_lossy(raw).into();
        let r: Arc<[u8]> = raw.into();
        let cost = 3 * raw.len() as u64 + 64;
        if self.kept_bytes + cost <= MEMORY {
            self.kept_bytes += cost;
            self.names.insert(raw.to_vec(), (s.clone(), r.clone()));
        }
        (s, r)
    }

    /// Waits until the worker has proven every record queued so far, at most
    /// `timeout`; true when it has.
    pub fn settle(&self, timeout: Duration) -> bool {
        let sh = &self.shared;
        let want = sh.sent.load(Ordering::SeqCst);
        let Ok(done) = sh.done.lock() else {
            return false;
        };
        match sh.done_cv.wait_timeout_while(done, timeout, |d| *d < want) {
            Ok((d, _)) => *d >= want,
            Err(_) => false,
        }
    }

    /// What the capture can say of the file the records identify as `ident`: the ID
    /// every mapping record of it had; why it cannot; or `None` when it was never
    /// offered a mapping of it.
    pub fn lookup(&self, ident: &FileIdent) -> Option<LiveAnswer> {
        let key = Key::of(ident)?;
        let sh = &self.shared;
        let mut entries = sh.entries.lock().ok()?;
        let e = entries.get_mut(&key)?;
        Some(match judge_entry(sh, &key, e) {
            Ok((build_id, detail)) => LiveAnswer::Proven {
                build_id,
                file: e.file.clone(),
                detail,
            },
            Err(r) => LiveAnswer::Unproven(r),
        })
    }

    /// A captured file whose note carries `id`, while it is kept open (for the
    /// build-ID cache of an ID the recording itself gives).
    pub(crate) fn file_with(&self, id: &BuildId) -> Option<Arc<File>> {
        let key = *self.shared.by_id.lock().ok()?.get(id)?;
        let entries = self.shared.entries.lock().ok()?;
        let e = entries.get(&key)?;
        (e.id == Some(*id) && e.taint.is_none())
            .then(|| e.file.clone())
            .flatten()
    }

    /// Whether this capture added `id` to the build-ID cache (`store`: to the
    /// symbol store): the run's own entry, though the cache stage finds it present.
    pub(crate) fn added(&self, id: &BuildId, store: bool) -> bool {
        self.shared
            .added
            .lock()
            .is_ok_and(|a| if store { &a.1 } else { &a.0 }.contains(id))
    }

    /// The counts so far.
    pub fn summary(&self) -> LiveSummary {
        summarize(&self.shared)
    }

    /// Closes the queue, lets the workers finish what is queued (the cache too) and
    /// returns the counts.
    pub fn finish(mut self) -> LiveSummary {
        self.tx = None;
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        summarize(&self.shared)
    }
}

impl Drop for Capture {
    /// Dropped without [`Capture::finish`] (the run failed): the workers drop what
    /// is queued instead of proving and caching it.
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        self.tx = None;
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl crate::buildid::Captured for Capture {
    fn settle(&self) {
        Capture::settle(self, SETTLE);
    }

    /// The ID of a user DSO whose files (one model DSO per file identity: `dsos`)
    /// were captured while they were mapped, before `prove` (the proof of the file
    /// at the path now) is asked; when the capture cannot speak for every one of
    /// them, `prove`'s answer, with why not added to a refusal.
    fn prove_first(
        &self,
        dsos: &[&crate::model::Dso],
        prove: &mut dyn FnMut() -> crate::buildid::Outcome,
    ) -> crate::buildid::Outcome {
        use crate::buildid::{Found, Outcome, Source};
        let mut id = None;
        let mut file = None;
        let mut why = None;
        for d in dsos {
            match self.lookup(&d.ident) {
                // A file the capture never saw: the proof of the path speaks.
                None => return prove(),
                Some(LiveAnswer::Unproven((_, w))) => {
                    why.get_or_insert(w);
                }
                Some(LiveAnswer::Proven {
                    build_id, file: f, ..
                }) => {
                    if id.is_some_and(|i| i != build_id) {
                        why.get_or_insert_with(|| {
                            "its files were captured with different build IDs".to_string()
                        });
                    }
                    id = Some(build_id);
                    file = file.or(f);
                }
            }
        }
        match (id, why) {
            (Some(build_id), None) => Outcome::Found(Found {
                file,
                ..Found::of(build_id, Source::Live)
            }),
            (_, why) => match prove() {
                Outcome::Refused(mut r) => {
                    if let Some(w) = why {
                        r.detail = format!("{}; live capture: {w}", r.detail);
                    }
                    Outcome::Refused(r)
                }
                o => o,
            },
        }
    }

    fn file_with(&self, id: &BuildId) -> Option<Arc<File>> {
        Capture::file_with(self, id)
    }
}

/// A record of `e` whose mapping time has no lower bound of its own.
pub(crate) fn unowned(e: &mut Entry, t: Option<u64>) {
    match t {
        Some(t) => e.unowned.t = Some(e.unowned.t.map_or(t, |u| u.min(t))),
        None => e.unowned.untimed += 1,
    }
}

/// Monotonic ns to wall-clock ns, by the offset of the two clocks now.
pub(crate) fn mono_to_wall(mono: i128) -> i128 {
    mono + (procfs::wall_ns() - procfs::mono_ns())
}

/// What excuses a ctime moved after a mapping: only pdinject's own link of the file
/// into the capture's cache (its link record, issue 29). A rename, an unlink or a
/// rewrite with its times set back look alike to a stat, so nothing else does, and a
/// file renamed or deleted before its record arrived gets no ID.
pub(crate) fn own_link_evidence(
    sh: &Shared,
    file: &std::fs::File,
    meta: &std::fs::Metadata,
    id: BuildId,
) -> crate::buildid::vouch::CtimeEvidence {
    let Some(cache) = &sh.cfg.cache else {
        return Default::default();
    };
    let vouchers = crate::buildid::vouch::Vouchers {
        dpkg: None,
        cache: Some(cache.dir.clone()),
        same_layout: false,
        remember: crate::buildid::vouch::Remember::Nothing,
    };
    vouchers.evidence(file, meta, std::path::Path::new(""), Some(id))
}

/// Whether what was captured of `e` speaks for every recorded mapping of it.
fn judge_entry(sh: &Shared, key: &Key, e: &mut Entry) -> Result<(BuildId, String), Refusal> {
    let unproven = |why: String| Err((Reason::Unsupported, why));
    if let Some(t) = &e.taint {
        return Err(t.clone());
    }
    let Some(id) = e.id else {
        return unproven(match &e.last_failure {
            Some(w) => w.clone(),
            None if e.arrived.pending > 0 => "its mappings were not captured yet".into(),
            None => "no mapping of it could be captured".into(),
        });
    };
    if e.arrived.pending > 0 {
        return unproven(format!(
            "{} of its mapping records were not captured yet",
            e.arrived.pending
        ));
    }
    // A build-ID MMAP2: the record names the ID; the capture only kept the file.
    if matches!(key, Key::Id(_)) {
        return Ok((id, "the mapped file's note carries the record's ID".into()));
    }
    // Every record arrived before a stat: stat the kept file now if needed.
    if e.stat_seq < e.arrived.seq_max {
        if let Some(f) = e.file.clone() {
            let snap = sh.arrived.load(Ordering::SeqCst);
            match f.metadata() {
                Ok(m) => {
                    e.times = Some(FileTimes::of(&m));
                    e.stat_seq = snap;
                }
                Err(err) => return unproven(format!("cannot stat the captured file: {err}")),
            }
        } else {
            return unproven(
                "mappings of it arrived after its last capture, and no process still maps it to show it unchanged"
                    .into(),
            );
        }
    }
    if e.unowned.untimed > 0 {
        return unproven(format!(
            "{} of its mappings were made by processes gone before they could be read, and their records carry no time",
            e.unowned.untimed
        ));
    }
    let low = sh.clock.low();
    let unowned_lb = match (e.unowned.t, low) {
        (None, _) => None,
        (Some(t), Some(d)) => Some(t as i128 + d),
        (Some(_), None) => {
            return unproven(
                "a mapping of it was made by a process gone before it could be read, and nothing yet ties perf's clock to this one's"
                    .into(),
            );
        }
    };
    let lb = match (e.lb_owned, unowned_lb) {
        (Some(a), Some(b)) => a.min(b),
        (Some(a), None) | (None, Some(a)) => a,
        (None, None) => return unproven("no mapping of it has a known time".into()),
    };
    let Some(times) = e.times else {
        return unproven("the captured file was never stat'ed".into());
    };
    let start = mono_to_wall(lb) - procfs::file_time_slack_ns();
    let evidence = match e.file.as_deref().map(|f| (f, f.metadata())) {
        Some((f, Ok(m))) => own_link_evidence(sh, f, &m, id),
        _ => Default::default(),
    };
    crate::buildid::elf::judge(
        &times,
        &e.loads,
        &e.maps,
        start,
        crate::buildid::Place::RecordedInode,
        &evidence,
    )
    .map_err(|(r, d)| (r, format!("captured while mapped, but {d}")))?;
    let via = if sh.root_only.load(Ordering::Relaxed) {
        "/proc/PID/root"
    } else {
        "/proc/PID/map_files"
    };
    Ok((
        id,
        format!(
            "read from the mapped inode through {via} while {} process{} mapped it",
            e.captured,
            if e.captured == 1 { "" } else { "es" }
        ),
    ))
}

/// What the live capture did (the summary's line and the JSON report, where the parts
/// below are written as fields of the summary itself).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct LiveSummary {
    /// How files were read: `map_files` or `root` (`/proc/PID/root/PATH`).
    pub via: &'static str,
    /// perf's clock was measured against the monotonic clock (else only bounded by
    /// the stream and the processes' start times).
    pub clock_measured: bool,
    /// File-backed executable user mapping records offered.
    pub offered: u64,
    /// Mappings read through their process.
    pub captured: u64,
    /// Mappings of files already captured, checked by a stat.
    pub stat_only: u64,
    /// Distinct files with an ID.
    pub files: u64,
    /// Mappings whose process was gone when its record arrived.
    pub exited: u64,
    /// How late those records arrived at least, in ms: smallest, median, largest.
    pub exited_late_ms: Option<[f64; 3]>,
    /// Mappings refused or not read, by why.
    #[serde(flatten)]
    pub refused: LiveRefusals,
    /// How late mapping records arrived (arrival minus their time, less the least
    /// such difference, which absorbs the offset of perf's clock), in ms: median,
    /// 90th percentile, largest.
    pub record_late_ms: Option<[f64; 3]>,
    /// What went into the build-ID cache and the symbol store.
    #[serde(flatten)]
    pub filled: LiveFills,
}

/// Mappings refused or not read, by why.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct LiveRefusals {
    /// Mappings refused: a process that started after the mapping (pid reused).
    pub reused: u64,
    /// Mappings refused: the file was written after the mapping.
    pub changed: u64,
    /// Mappings refused: the open file is not the recorded inode or ID.
    pub mismatched: u64,
    /// Mappings that could not be read for another reason.
    pub unreadable: u64,
    /// Records dropped because the queue was full.
    pub dropped: u64,
    /// Records of files beyond the tracked limit.
    pub untracked: u64,
}

/// What went into the build-ID cache and the symbol store.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct LiveFills {
    /// Build-ID cache entries added, already present, failed.
    pub cache_added: u64,
    /// Already in the cache (one stat).
    pub cache_present: u64,
    /// Could not be added.
    pub cache_failed: u64,
    /// Symbol store entries added.
    pub store_added: u64,
    /// Already in the store.
    pub store_present: u64,
    /// Could not be stored.
    pub store_failed: u64,
    /// Bytes copied (hard links cost none).
    pub bytes_copied: u64,
    /// Files not cached or stored: over the byte budget.
    pub over_budget: u64,
    /// Files not cached: the cache's queue was full.
    pub fill_dropped: u64,
}

fn summarize(sh: &Shared) -> LiveSummary {
    let c = &sh.counts;
    let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let files = sh
        .entries
        .lock()
        .map(|e| e.values().filter(|e| e.id.is_some()).count() as u64)
        .unwrap_or(0);
    let ms = |v: i64| v as f64 / 1e6;
    let exited_late_ms = sh.exited_late.lock().ok().and_then(|v| {
        let mut v = v.clone();
        v.sort_unstable();
        (!v.is_empty()).then(|| [ms(v[0]), ms(v[v.len() / 2]), ms(v[v.len() - 1])])
    });
    let record_late_ms = sh.lags.lock().ok().and_then(|v| {
        let mut v = v.clone();
        v.sort_unstable();
        let base = *v.first()?;
        let at = |q: f64| ms(v[((v.len() - 1) as f64 * q) as usize] - base);
        Some([at(0.5), at(0.9), at(1.0)])
    });
    LiveSummary {
        via: if sh.root_only.load(Ordering::Relaxed) {
            "root"
        } else {
            "map_files"
        },
        clock_measured: sh.clock.is_measured(),
        offered: g(&c.offered),
        captured: g(&c.captured),
        stat_only: g(&c.stat_only),
        files,
        exited: g(&c.exited),
        exited_late_ms,
        refused: LiveRefusals {
            reused: g(&c.reused),
            changed: g(&c.changed),
            mismatched: g(&c.mismatched),
            unreadable: g(&c.unreadable),
            dropped: g(&c.dropped),
            untracked: g(&c.untracked),
        },
        record_late_ms,
        filled: LiveFills {
            cache_added: g(&c.fills.cache_added),
            cache_present: g(&c.fills.cache_present),
            cache_failed: g(&c.fills.cache_failed),
            store_added: g(&c.fills.store_added),
            store_present: g(&c.fills.store_present),
            store_failed: g(&c.fills.store_failed),
            bytes_copied: g(&c.bytes),
            over_budget: g(&c.over_budget),
            fill_dropped: g(&c.fill_dropped),
        },
    }
}

impl LiveSummary {
    /// The summary's line.
    pub(crate) fn line(&self) -> String {
        let mut s = format!(
            "live capture (through {}): {} of {} executable mappings read ({} more checked by a stat), {} files",
            if self.via == "root" {
                "/proc/PID/root/PATH: /proc/PID/map_files is not permitted (CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE), so a deleted or replaced file cannot be read"
            } else {
                "/proc/PID/map_files"
            },
            self.captured,
            self.offered,
            self.stat_only,
            self.files
        );
        if self.exited > 0 {
            s += &format!(
                "; {} mappings of processes gone before their record arrived",
                self.exited
            );
            if let Some([a, m, b]) = self.exited_late_ms {
                s += &format!(" (records {a:.0}-{b:.0} ms late at least, median {m:.0})");
            }
        }
        for (n, what) in [
            (
                self.refused.reused,
                "refused as another process (pid reused)",
            ),
            (
                self.refused.changed,
                "refused: the file was written after the mapping",
            ),
            (self.refused.mismatched, "refused: not the recorded file"),
            (
                self.refused.unreadable,
                "unreadable or without a build-ID note",
            ),
            (self.refused.dropped, "dropped (queue full)"),
            (
                self.refused.untracked,
                "of files beyond what the capture tracks (65,536 files, 32 MiB)",
            ),
        ] {
            if n > 0 {
                s += &format!("; {n} {what}");
            }
        }
        s += &format!(
            "; cache: {} added, {} present",
            self.filled.cache_added, self.filled.cache_present
        );
        if self.filled.cache_failed > 0 {
            s += &format!(", {} failed", self.filled.cache_failed);
        }
        if self.filled.store_added + self.filled.store_present + self.filled.store_failed > 0 {
            s += &format!(
                "; store: {} added, {} present",
                self.filled.store_added, self.filled.store_present
            );
        }
        s += &format!(", {} copied", human(self.filled.bytes_copied));
        if self.filled.over_budget > 0 {
            s += &format!(
                "; {} files over the byte budget (--live-budget)",
                self.filled.over_budget
            );
        }
        if self.filled.fill_dropped > 0 {
            s += &format!(
                "; {} files not cached (queue full)",
                self.filled.fill_dropped
            );
        }
        s
    }
}

fn human(b: u64) -> String {
    if b >= 1 << 20 {
        format!("{:.1} MB", b as f64 / (1 << 20) as f64)
    } else if b >= 1 << 10 {
        format!("{:.1} KB", b as f64 / 1024.0)
    } else {
        format!("{b} bytes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_bounds_hold_each_other() {
        let c = Clock::default();
        assert_eq!((c.low(), c.high()), (None, None));
        c.arrived(1_000, 5_000);
        c.arrived(2_000, 5_500);
        assert_eq!(c.high(), Some(3_500));
        c.started(1_000, 2_000);
        assert_eq!(c.low(), Some(1_000));
        // A "start" after the record's time plus the upper bound is not trusted.
        c.started(1_000, 9_000);
        assert_eq!(c.low(), Some(3_500));
    }

    #[test]
    fn only_file_backed_executable_user_mappings_are_queued() {
        use crate::format::record::misc;
        let mut c = Capture::start(LiveConfig::default()).unwrap();
        let ino = FileIdent::Inode {
            maj: 8,
            min: 1,
            ino: 42,
            generation: 0,
        };
        let m = MapArrival {
            pid: u32::MAX - 7,
            tid: 1,
            start: 0x1000,
            len: 0x1000,
            pgoff: 0,
            ident: ino,
            prot: 5,
            flags: 2,
            filename: b"/lib/x.so",
            time: Some(1),
            cpumode: misc::USER,
        };
        let skipped = [
            MapArrival { prot: 1, ..m },
            MapArrival {
                cpumode: misc::KERNEL,
                ..m
            },
            MapArrival {
                filename: b"//anon",
                ..m
            },
            MapArrival {
                filename: b"[vdso]",
                ..m
            },
            MapArrival {
                ident: FileIdent::None,
                ..m
            },
            MapArrival { len: 0, ..m },
        ];
        for s in &skipped {
            assert_eq!(c.offer(s), Offered::Skipped, "{s:?}");
        }
        assert_eq!(c.offer(&m), Offered::Queued);
        assert!(c.settle(Duration::from_secs(5)));
        // No such process: nothing proven, and it says why.
        match c.lookup(&ino) {
            Some(LiveAnswer::Unproven((_, why))) => assert!(why.contains("exited"), "{why}"),
            other => panic!("{other:?}"),
        }
        let s = c.finish();
        assert_eq!((s.offered, s.exited, s.captured), (1, 1, 0));
    }
}
