//! The capture's two threads: the prover reads each queued mapping through its
//! process and records what it found in the file's [`Entry`]; the filler puts each
//! new file into the build-ID cache and the symbol store, once per build ID, within
//! the byte budget.

use super::procfs::{self, OpenError};
use super::{Entry, Job, Key, Shared, mono_to_wall, unowned};
use crate::buildid::elf::{Elf, Segment, judge, reader};
use crate::buildid::proof::{Found, Outcome};
use crate::buildid::{FileTimes, Group, HostTrust, Place, Reason, Refusal, Source};
use crate::format::buildid::BuildId;
use crate::model::{DsoKind, ExecMaps};
use std::collections::HashSet;
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};

/// A file for the cache.
pub(crate) struct Fill {
    name: Arc<str>,
    id: BuildId,
    file: Arc<File>,
    size: u64,
    nlink: u64,
    dev: u64,
}

/// What one job found.
enum Found1 {
    /// The file was captured before: a stat of the kept file (or none needed), and
    /// the lower bound of this mapping's time when its process was read.
    Checked {
        own: Option<i128>,
        stat: Option<(FileTimes, u64)>,
    },
    /// Read through the process.
    Captured(Box<Captured>),
    /// The process or the mapping was gone.
    Gone { why: String, late: Option<i64> },
    /// Refused: counted under `what`.
    Refused { what: Count, why: String },
}

struct Captured {
    own: i128,
    times: FileTimes,
    snap: u64,
    /// The ID and segments, when read (not when the same file was read before).
    read: Option<(BuildId, Vec<Segment>)>,
    size: u64,
    file: Arc<File>,
    nlink: u64,
    dev: u64,
    judged: Result<(), Refusal>,
}

#[derive(Clone, Copy)]
enum Count {
    Reused,
    Mismatched,
    Unreadable,
}

/// Proves the queued mappings, one at a time, until the queue closes.
pub(crate) fn prover(sh: &Shared, rx: Receiver<Job>, ftx: SyncSender<Fill>) {
    use std::panic::{AssertUnwindSafe, catch_unwind};
    while let Ok(job) = rx.recv() {
        // A failure here costs this mapping its capture, never the run (the worker
        // goes on, and the job still counts as done for those waiting on it).
        let _ = catch_unwind(AssertUnwindSafe(|| {
            if sh.stop.load(Ordering::Relaxed) {
                return;
            }
            sh.clock.calibrate(sh.cfg.perf_clock);
            let found = prove(sh, &job);
            record(sh, &job, found, &ftx);
        }));
        if let Ok(mut d) = sh.done.lock() {
            *d += 1;
        }
        sh.done_cv.notify_all();
    }
}

/// What the entry says before the job: its ID, whether a stat already follows the
/// job's arrival, the kept file, and the size, mtime and segments of the last read.
struct Before {
    known: bool,
    covered: bool,
    kept: Option<Arc<File>>,
    last: Option<(u64, i128, Vec<Segment>, BuildId)>,
}

fn before(sh: &Shared, job: &Job) -> Before {
    let Ok(entries) = sh.entries.lock() else {
        return Before {
            known: false,
            covered: false,
            kept: None,
            last: None,
        };
    };
    let e = entries.get(&job.key);
    let known = e.is_some_and(|e| e.id.is_some() && e.taint.is_none());
    Before {
        known,
        covered: e.is_some_and(|e| e.stat_seq >= job.seq),
        kept: e.and_then(|e| e.file.clone()),
        last: e.and_then(|e| {
            Some((e.size, e.times?.mtime, e.loads.clone(), e.id?))
                .filter(|_| matches!(job.key, Key::Inode(..)))
        }),
    }
}

fn prove(sh: &Shared, job: &Job) -> Found1 {
    let b = before(sh, job);
    let pid = job.pid;
    if b.known && (b.covered || b.kept.is_some()) {
        return checked(sh, job, &b);
    }
    let snap = sh.arrived.load(Ordering::SeqCst);
    let Some(start0) = procfs::start_time(pid) else {
        return gone(sh, job, "its process had exited when its record arrived");
    };
    let own = start0 - procfs::suspended_ns();
    if refuted(sh, job, own) {
        return Found1::Refused {
            what: Count::Reused,
            why: format!(
                "process {pid} started after the mapping: the pid was reused by another process"
            ),
        };
    }
    let file = match open(sh, job) {
        Ok(f) => f,
        Err(f1) => return f1,
    };
    let meta = match file.metadata() {
        Ok(m) if m.is_file() => m,
        Ok(_) => {
            return refused(Count::Mismatched, "the mapped file is not a regular file");
        }
        Err(e) => return refused(Count::Unreadable, &format!("cannot stat it: {e}")),
    };
    if let Err(f1) = same_inode(job, &file, &meta) {
        return f1;
    }
    // The process read before the open is the one read after it.
    if procfs::start_time(pid) != Some(start0) {
        return Found1::Refused {
            what: Count::Reused,
            why: format!("process {pid} ended or changed while its mapping was read"),
        };
    }
    let times = FileTimes::of(&meta);
    let (read, loads) = match &b.last {
        // The same file read before, and its bytes not modified since (size and
        // mtime): its ID and segments stand.
        Some((size, mtime, loads, _)) if *size == meta.len() && *mtime == times.mtime => {
            (None, loads.clone())
        }
        _ => match read_elf(&file) {
            Ok((id, loads)) => (Some((id, loads.clone())), loads),
            Err(why) => return refused(Count::Unreadable, &why),
        },
    };
    let mapped = Mapped {
        file: &file,
        meta: &meta,
        times,
        loads: &loads,
        read: read.as_ref().map(|r| r.0),
        last: b.last.as_ref().map(|l| l.3),
    };
    let judged = judged(sh, job, own, &mapped);
    if judged.is_ok()
        && let Some(t) = job.time
    {
        sh.clock.started(t, own);
    }
    Found1::Captured(Box::new(Captured {
        own,
        times,
        snap,
        read,
        size: meta.len(),
        nlink: meta.nlink(),
        dev: meta.dev(),
        file: Arc::new(file),
        judged,
    }))
}

/// A job whose file is known: a stat covers this mapping. Its process's start helps
/// only while perf's clock is not tied to this one, or for a record without a time.
fn checked(sh: &Shared, job: &Job, b: &Before) -> Found1 {
    let own = if job.time.is_none() || sh.clock.low().is_none() {
        procfs::start_time(job.pid).map(|s| s - procfs::suspended_ns())
    } else {
        None
    };
    let own = own.filter(|&o| !refuted(sh, job, o));
    let stat = match (&b.kept, b.covered) {
        (Some(f), false) => {
            let snap = sh.arrived.load(Ordering::SeqCst);
            f.metadata().ok().map(|m| (FileTimes::of(&m), snap))
        }
        _ => None,
    };
    Found1::Checked { own, stat }
}

/// Whether the file opened for a job keyed by inode is that inode: refused when not.
fn same_inode(job: &Job, file: &File, meta: &std::fs::Metadata) -> Result<(), Found1> {
    let Key::Inode(maj, min, ino, generation) = job.key else {
        return Ok(());
    };
    let (dmaj, dmin) = (libc::major(meta.dev()), libc::minor(meta.dev()));
    if meta.ino() != ino {
        return Err(refused(
            Count::Mismatched,
            &format!(
                "the file read is inode {} on {dmaj}:{dmin}, the record mapped inode {ino} on {maj}:{min}",
                meta.ino()
            ),
        ));
    }
    if (dmaj, dmin) != (maj, min) && !procfs::device_may_differ(file) {
        return Err(refused(
            Count::Mismatched,
            &format!("the file read is on device {dmaj}:{dmin}, the record's on {maj}:{min}"),
        ));
    }
    if generation != 0
        && let Some(g) = procfs::generation(file)
        && g != generation
    {
        return Err(refused(
            Count::Mismatched,
            &format!("inode {ino} is another file now (generation {g}, recorded {generation})"),
        ));
    }
    Ok(())
}

/// The file a job's mapping was read from, as read.
struct Mapped<'a> {
    file: &'a File,
    meta: &'a std::fs::Metadata,
    times: FileTimes,
    loads: &'a [Segment],
    /// The ID read now (none when the same file was read before).
    read: Option<BuildId>,
    /// The ID of the entry's last read.
    last: Option<BuildId>,
}

/// Whether `m` is still the file the job's record mapped; `own` is its process's
/// start at the earliest.
fn judged(sh: &Shared, job: &Job, own: i128, m: &Mapped<'_>) -> Result<(), Refusal> {
    match job.key {
        Key::Id(want) => match m.read {
            Some(id) if id != want => Err((
                Reason::Stale,
                format!("the mapped file's note says {id}, the record {want}: rewritten since"),
            )),
            _ => Ok(()),
        },
        Key::Inode(..) => {
            // The mapping was made after its process started, and after the moment
            // perf's clock puts it at, at the least.
            let lb = lower_bound(sh, job, own);
            let mut maps = ExecMaps::default();
            maps.add(job.pgoff, job.end - job.start);
            judge(
                &m.times,
                m.loads,
                &maps,
                mono_to_wall(lb) - procfs::file_time_slack_ns(),
                Place::RecordedInode,
                // Only pdinject's own link excuses a ctime moved after the mapping
                // (issue 29).
                &match m.read.or(m.last) {
                    Some(id) => super::own_link_evidence(sh, m.file, m.meta, id),
                    None => Default::default(),
                },
            )
        }
    }
}

/// The earliest the job's mapping can have been made: after `own`, its process's
/// start, and after the moment perf's clock puts the record at.
fn lower_bound(sh: &Shared, job: &Job, own: i128) -> i128 {
    match (job.time, sh.clock.low()) {
        (Some(t), Some(d)) => own.max(t as i128 + d),
        _ => own,
    }
}

fn refused(what: Count, why: &str) -> Found1 {
    Found1::Refused {
        what,
        why: why.to_string(),
    }
}

/// The process that is `pid` now started after the mapping: another process.
/// `own` is its start on the monotonic clock at the earliest; the mapping was at
/// most the clock's upper bound after the record's time.
fn refuted(sh: &Shared, job: &Job, own: i128) -> bool {
    match (job.time, sh.clock.high()) {
        (Some(t), Some(h)) => own > t as i128 + h,
        _ => false,
    }
}

/// The job's process or mapping is gone: how late its record was, at least.
fn gone(sh: &Shared, job: &Job, what: &str) -> Found1 {
    let late = match (job.time, sh.clock.high()) {
        (Some(t), Some(h)) => Some((job.arrival - (t as i128 + h)).max(0) as i64),
        _ => None,
    };
    let why = match late {
        Some(l) => format!(
            "{what} (the record came {:.0} ms after the mapping at least)",
            l as f64 / 1e6
        ),
        None => what.to_string(),
    };
    Found1::Gone { why, late }
}

/// Opens the job's mapped file: through map_files, else (without the privilege,
/// said once) through the process's root.
fn open(sh: &Shared, job: &Job) -> Result<File, Found1> {
    if !sh.root_only.load(Ordering::Relaxed) {
        match procfs::open_map_file(job.pid, job.start, job.end) {
            Ok(f) => return Ok(f),
            Err(OpenError::NotPermitted) => {
                sh.root_only.store(true, Ordering::Relaxed);
            }
            Err(OpenError::Gone) => {
                return Err(gone(
                    sh,
                    job,
                    "its mapping was gone when its record arrived (the process exited, exec'd or unmapped it)",
                ));
            }
            Err(OpenError::NotRegular) => {
                return Err(refused(
                    Count::Mismatched,
                    "the mapped file is not a regular file",
                ));
            }
            Err(OpenError::Other(e)) => {
                return Err(refused(Count::Unreadable, &format!("map_files: {e}")));
            }
        }
    }
    const DELETED: &[u8] = b" (deleted)";
    if job.raw_name.ends_with(DELETED) {
        return Err(refused(
            Count::Unreadable,
            "the file was deleted before it was mapped, and reading the mapped inode needs map_files",
        ));
    }
    match procfs::open_in_root(job.pid, &job.raw_name) {
        Ok(f) => Ok(f),
        Err(OpenError::Gone) if procfs::start_time(job.pid).is_none() => Err(gone(
            sh,
            job,
            "its process had exited when its record arrived",
        )),
        Err(OpenError::Gone) => Err(refused(
            Count::Mismatched,
            "no file at its path in the process's root any more (deleted or renamed; reading the mapped inode needs map_files)",
        )),
        Err(OpenError::NotPermitted) => Err(refused(
            Count::Unreadable,
            "not permitted to read the process's root (ptrace access: the same user, or CAP_SYS_PTRACE)",
        )),
        Err(OpenError::NotRegular) => Err(refused(
            Count::Mismatched,
            "the file at its path is not a regular file",
        )),
        Err(OpenError::Other(e)) => Err(refused(Count::Unreadable, &e)),
    }
}

/// The build ID and PT_LOAD segments of an open ELF file.
fn read_elf(f: &File) -> Result<(BuildId, Vec<Segment>), String> {
    let cache = reader(f);
    let elf = Elf::parse(&cache).map_err(|e| format!("not a readable ELF file: {e}"))?;
    let raw = elf
        .build_id()
        .map_err(|e| format!("cannot read its notes: {e}"))?
        .ok_or("it has no build-ID note")?;
    if raw.len() > 20 {
        return Err(format!(
            "its build ID of {} bytes is longer than a perf.data can hold",
            raw.len()
        ));
    }
    let id = BuildId::new(raw, raw.len()).ok_or("its build-ID note is empty")?;
    let loads = elf.loads();
    if loads.len() > super::MAX_LOADS {
        return Err(format!(
            "it has {} loadable segments, more than the {} the capture reads",
            loads.len(),
            super::MAX_LOADS
        ));
    }
    Ok((id, loads))
}

/// Writes what the job found into its file's entry, and sends a new file to the
/// filler.
fn record(sh: &Shared, job: &Job, found: Found1, ftx: &SyncSender<Fill>) {
    let c = &sh.counts;
    let Ok(mut entries) = sh.entries.lock() else {
        return;
    };
    let Some(e) = entries.get_mut(&job.key) else {
        return;
    };
    e.arrived.pending = e.arrived.pending.saturating_sub(1);
    match found {
        Found1::Checked { own, stat } => {
            c.stat_only.fetch_add(1, Ordering::Relaxed);
            bound(sh, job, e, own);
            if let Some((t, snap)) = stat
                && snap >= e.stat_seq
            {
                e.times = Some(t);
                e.stat_seq = snap;
            }
        }
        Found1::Gone { why, late } => {
            c.exited.fetch_add(1, Ordering::Relaxed);
            if let (Some(l), Ok(mut v)) = (late, sh.exited_late.lock())
                && v.len() < super::LAGS_KEPT
            {
                v.push(l);
            }
            bound(sh, job, e, None);
            e.last_failure = Some(why);
        }
        Found1::Refused { what, why } => {
            let n = match what {
                Count::Reused => &c.reused,
                Count::Mismatched => &c.mismatched,
                Count::Unreadable => &c.unreadable,
            };
            n.fetch_add(1, Ordering::Relaxed);
            bound(sh, job, e, None);
            e.last_failure = Some(why);
        }
        Found1::Captured(cap) => record_captured(sh, job, e, cap, ftx),
    }
}

/// Narrows the entry's bounds on its mapping's time by the job's: owned by a process
/// that started at `own` at the earliest, else unowned.
fn bound(sh: &Shared, job: &Job, e: &mut Entry, own: Option<i128>) {
    match own {
        Some(own) => {
            let lb = lower_bound(sh, job, own);
            e.lb_owned = Some(e.lb_owned.map_or(lb, |l| l.min(lb)));
        }
        None => unowned(e, job.time),
    }
}

/// [`record`] of a file read through its process.
fn record_captured(
    sh: &Shared,
    job: &Job,
    e: &mut Entry,
    cap: Box<Captured>,
    ftx: &SyncSender<Fill>,
) {
    let c = &sh.counts;
    c.captured.fetch_add(1, Ordering::Relaxed);
    e.captured += 1;
    bound(sh, job, e, Some(cap.own));
    if let Err((r, d)) = &cap.judged {
        c.changed.fetch_add(1, Ordering::Relaxed);
        e.taint = Some((
            *r,
            format!("process {} mapped it, and it changed since: {d}", job.pid),
        ));
    }
    if let Some((id, loads)) = cap.read {
        if let Some(prev) = e.id
            && prev != id
        {
            e.taint.get_or_insert((
                Reason::Stale,
                format!("captured twice with different build IDs ({prev}, then {id}): rewritten during the recording"),
            ));
        }
        e.id = Some(id);
        e.loads = loads;
    }
    e.size = cap.size;
    if cap.snap >= e.stat_seq {
        e.times = Some(cap.times);
        e.stat_seq = cap.snap;
    }
    if e.file.is_none() && sh.kept.load(Ordering::Relaxed) < sh.cfg.files_kept as u64 {
        sh.kept.fetch_add(1, Ordering::Relaxed);
        e.file = Some(cap.file.clone());
    }
    if let (Some(id), None) = (e.id, &e.taint) {
        if let Ok(mut by) = sh.by_id.lock() {
            by.entry(id).or_insert(job.key);
        }
        if !e.filled && (sh.cfg.cache.is_some() || sh.cfg.store.is_some()) {
            let name = e.name.clone().unwrap_or_else(|| job.name.clone());
            let fill = Fill {
                name,
                id,
                file: cap.file.clone(),
                size: cap.size,
                nlink: cap.nlink,
                dev: cap.dev,
            };
            match ftx.try_send(fill) {
                Ok(()) => e.filled = true,
                Err(TrySendError::Full(_)) => {
                    c.fill_dropped.fetch_add(1, Ordering::Relaxed);
                }
                Err(TrySendError::Disconnected(_)) => {}
            }
        }
    }
}

/// Puts each file into the cache and the store once per build ID, until the queue
/// closes.
pub(crate) fn filler(sh: &Shared, rx: Receiver<Fill>) {
    // cache::fill and store::fill run on a rayon pool: this thread's own.
    let Ok(pool) = rayon::ThreadPoolBuilder::new().num_threads(1).build() else {
        return;
    };
    let trust = HostTrust {
        local: Ok(()),
        kernel: Err((
            Reason::OtherHost,
            "captured files are user files".to_string(),
        )),
    };
    let cache_dev = sh.cfg.cache.as_ref().and_then(|c| {
        c.dir
            .ancestors()
            .find_map(|d| std::fs::metadata(d).ok())
            .map(|m| m.dev())
    });
    let mut done: HashSet<BuildId> = HashSet::new();
    while let Ok(f) = rx.recv() {
        if sh.stop.load(Ordering::Relaxed) || !done.insert(f.id) {
            continue;
        }
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.install(|| fill(sh, &f, cache_dev, &trust))
        }));
    }
}

/// Takes `bytes` from the budget; false when they do not fit.
fn charge(sh: &Shared, bytes: u64) -> bool {
    let b = &sh.counts.bytes;
    let mut cur = b.load(Ordering::Relaxed);
    loop {
        if cur.saturating_add(bytes) > sh.cfg.byte_budget {
            return false;
        }
        match b.compare_exchange(cur, cur + bytes, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return true,
            Err(now) => cur = now,
        }
    }
}

fn fill(sh: &Shared, f: &Fill, cache_dev: Option<u64>, trust: &HostTrust) {
    use crate::buildid::cache::{self, CacheState};
    use crate::buildid::store::{self, StoreState};
    let c = &sh.counts;
    let name = f.name.strip_suffix(" (deleted)").unwrap_or(&f.name);
    let group = Group {
        name: name.to_string(),
        kind: DsoKind::User,
        dsos: Vec::new(),
        hits: 0,
    };
    let outcome = Outcome::Found(Found {
        file: Some(f.file.clone()),
        ..Found::of(f.id, Source::Live)
    });
    let hex = f.id.to_string();
    if let Some(cache) = &sh.cfg.cache
        && hex.len() > 2
    {
        // The one stat an entry already present costs.
        let link = cache.dir.join(".build-id").join(&hex[..2]).join(&hex[2..]);
        if std::fs::symlink_metadata(&link).is_ok() {
            c.fills.cache_present.fetch_add(1, Ordering::Relaxed);
        } else {
            // A hard link costs no bytes; a deleted file or one on another
            // filesystem is copied.
            let cost = if f.nlink == 0 || Some(f.dev) != cache_dev {
                f.size
            } else {
                0
            };
            if !charge(sh, cost) {
                c.over_budget.fetch_add(1, Ordering::Relaxed);
            } else {
                let r = cache::fill(
                    cache,
                    std::slice::from_ref(&group),
                    std::slice::from_ref(&outcome),
                    trust,
                );
                match r.results.first().map(|r| r.state) {
                    Some(CacheState::Added) => {
                        if let Ok(mut a) = sh.added.lock() {
                            a.0.insert(f.id);
                        }
                        c.fills.cache_added.fetch_add(1, Ordering::Relaxed)
                    }
                    Some(CacheState::Present) => {
                        c.bytes.fetch_sub(cost, Ordering::Relaxed);
                        c.fills.cache_present.fetch_add(1, Ordering::Relaxed)
                    }
                    _ => {
                        c.bytes.fetch_sub(cost, Ordering::Relaxed);
                        c.fills.cache_failed.fetch_add(1, Ordering::Relaxed)
                    }
                };
            }
        }
    }
    if let Some(s) = &sh.cfg.store {
        if s.executable_path(&f.id)
            .is_some_and(|p| std::fs::symlink_metadata(p).is_ok())
        {
            c.fills.store_present.fetch_add(1, Ordering::Relaxed);
        } else if !charge(sh, f.size) {
            c.over_budget.fetch_add(1, Ordering::Relaxed);
        } else {
            let r = store::fill(
                s,
                std::slice::from_ref(&group),
                std::slice::from_ref(&outcome),
                trust,
            );
            c.bytes.fetch_sub(f.size, Ordering::Relaxed);
            match r.first() {
                Some(r) if r.state == StoreState::Added => {
                    if let Ok(mut a) = sh.added.lock() {
                        a.1.insert(f.id);
                    }
                    c.bytes.fetch_add(r.bytes, Ordering::Relaxed);
                    c.fills.store_added.fetch_add(1, Ordering::Relaxed);
                }
                Some(r) if r.state == StoreState::Present => {
                    c.fills.store_present.fetch_add(1, Ordering::Relaxed);
                }
                _ => {
                    c.fills.store_failed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}
