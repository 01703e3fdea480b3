//! `--in-place`: the input itself is changed, only where it changes, and a kill at any
//! moment leaves a file that perf reads in the old or the new state, or one that the
//! next pdinject run restores (docs/in-place.md).
//!
//! The plan of a run is a list of [`Change`]s: bytes appended past the old end of the
//! file (a new BUILD_ID payload, feature payloads moved out of the way of a grown
//! feature table) and bytes overwritten inside it (mapping records in build-ID form,
//! the feature table's entries or the whole feature tail rewritten over itself
//! ([`crate::write::fit`]), the header's feature bitmap). Before the first byte of
//! the file changes, an undo journal beside it (`.NAME.pdinject-journal`) is written
//! and made durable: the file's old length, modification time and identity, and the
//! old bytes of every range to be overwritten (the old tail included), sealed by a
//! checksum. Then:
//!
//! 1. appends, then fsync: the old state is intact (perf ignores bytes past what the
//!    header and the feature table point at);
//! 2. mapping records, one write each: every intermediate file is one perf reads
//!    (each record is whole in one form or the other);
//! 3. the switch: the feature table (or the new tail over the old one), then the
//!    header's bitmap; between them the file is neither state and the journal
//!    restores it. When the table already had a BUILD_ID section and it is
//!    appended, the switch is one 16-byte write of its offset and size: old, then
//!    new, never anything between;
//! 4. the modification time is set back (pdinject dates a recording by it), fsync,
//!    and the journal is removed (a power cut that loses the removal makes the next
//!    run undo the finished run: the old state, whole).
//!
//! A run that finds a journal restores first: old bytes written back, the file cut
//! to its old length, its time set back, then the journal removed. Restoring is
//! idempotent, so a kill during it is undone by the next run too. A journal that is
//! cut short or fails its checksum was being written when the run died, before the
//! file was touched: it is removed.
//!
//! `PDINJECT_CRASH_AT=N` (a test hook, documented in docs/in-place.md, built only with
//! the `test-hooks` feature that `cargo test` turns on) kills the process
//! with SIGKILL right after its Nth step (a write, fsync, truncate, unlink or time
//! change of the file, its journal or the directory); it never changes what is
//! written. The kill-point test walks N from 1 until a run finishes.

use crate::error::{Error, Result};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

const MAGIC: &[u8; 8] = b"PDIJRNL1";

/// One change to the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Change {
    /// Where.
    pub offset: u64,
    /// The new bytes.
    pub bytes: Vec<u8>,
}

/// What an in-place run writes, in the order it is written.
#[derive(Clone, Debug, Default)]
pub(crate) struct Plan {
    /// Bytes at or past the old end of the file.
    pub appends: Vec<Change>,
    /// Overwrites that each leave a file perf reads (whole mapping records).
    pub records: Vec<Change>,
    /// Overwrites that switch the file to the new state (feature table, header).
    pub switch: Vec<Change>,
}

impl Plan {
    /// Nothing to write.
    pub(crate) fn is_empty(&self) -> bool {
        self.appends.is_empty() && self.records.is_empty() && self.switch.is_empty()
    }
}

static STEPS: AtomicU64 = AtomicU64::new(0);

/// The step `PDINJECT_CRASH_AT` names; a build without the `test-hooks` feature (any
/// `cargo build --release`) has no hook and never reads the variable.
#[cfg(feature = "test-hooks")]
fn crash_at() -> Option<u64> {
    static AT: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *AT.get_or_init(|| {
        std::env::var("PDINJECT_CRASH_AT")
            .ok()
            .and_then(|v| v.trim().parse().ok())
    })
}

#[cfg(not(feature = "test-hooks"))]
fn crash_at() -> Option<u64> {
    None
}

/// One durable step done: the test hook may kill the process here.
fn step() {
    let n = STEPS.fetch_add(1, Ordering::SeqCst) + 1;
    if crash_at() == Some(n) {
        // SAFETY: kill(2) on our own pid; SIGKILL cannot be caught: exactly what a
        // `kill -9` from outside does at this point.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
    }
}

/// The journal beside `target`.
pub(crate) fn journal_path(target: &Path) -> PathBuf {
    let dir = parent(target);
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    dir.join(format!(".{name}.pdinject-journal"))
}

fn parent(p: &Path) -> PathBuf {
    match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

fn sync_dir(target: &Path) -> Result<()> {
    let d = parent(target);
    File::open(&d)
        .and_then(|f| f.sync_all())
        .map_err(|e| Error::io(&d, e))?;
    step();
    Ok(())
}

/// FNV-1a, 64 bits: enough to tell a journal cut short from a whole one.
fn checksum(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| {
        (h ^ x as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The journal's contents.
#[derive(Debug, PartialEq, Eq)]
struct Journal {
    old_len: u64,
    mtime: (i64, i64),
    atime: (i64, i64),
    dev: u64,
    ino: u64,
    /// Old bytes by offset (all inside `old_len`).
    regions: Vec<(u64, Vec<u8>)>,
}

impl Journal {
    /// The parts written one at a time (each a step).
    fn encode(&self) -> Vec<Vec<u8>> {
        let mut head = MAGIC.to_vec();
        for v in [
            self.old_len,
            self.mtime.0 as u64,
            self.mtime.1 as u64,
            self.atime.0 as u64,
            self.atime.1 as u64,
            self.dev,
            self.ino,
            self.regions.len() as u64,
        ] {
            head.extend_from_slice(&v.to_le_bytes());
        }
        let mut parts = vec![head];
        for (off, b) in &self.regions {
            let mut p = Vec::with_capacity(16 + b.len());
            p.extend_from_slice(&off.to_le_bytes());
            p.extend_from_slice(&(b.len() as u64).to_le_bytes());
            p.extend_from_slice(b);
            parts.push(p);
        }
        let sum = checksum(&parts.concat());
        parts.push(sum.to_le_bytes().to_vec());
        parts
    }

    /// None when cut short or damaged.
    fn decode(b: &[u8]) -> Option<Journal> {
        let body = b.get(..b.len().checked_sub(8)?)?;
        let sum = u64::from_le_bytes(b.get(body.len()..)?.try_into().ok()?);
        if checksum(body) != sum || body.get(..8)? != MAGIC {
            return None;
        }
        let u = |at: usize| -> Option<u64> {
            Some(u64::from_le_bytes(body.get(at..at + 8)?.try_into().ok()?))
        };
        let n = u(64)?;
        let mut at = 72usize;
        let mut regions = Vec::new();
        for _ in 0..n {
            let off = u(at)?;
            let len = usize::try_from(u(at + 8)?).ok()?;
            let bytes = body.get(at + 16..(at + 16).checked_add(len)?)?.to_vec();
            regions.push((off, bytes));
            at += 16 + len;
        }
        (at == body.len()).then_some(Journal {
            old_len: u(8)?,
            mtime: (u(16)? as i64, u(24)? as i64),
            atime: (u(32)? as i64, u(40)? as i64),
            dev: u(48)?,
            ino: u(56)?,
            regions,
        })
    }
}

fn set_times(f: &File, path: &Path, atime: (i64, i64), mtime: (i64, i64)) -> Result<()> {
    use std::os::fd::AsRawFd;
    let ts = [
        libc::timespec {
            tv_sec: atime.0 as libc::time_t,
            tv_nsec: atime.1 as _,
        },
        libc::timespec {
            tv_sec: mtime.0 as libc::time_t,
            tv_nsec: mtime.1 as _,
        },
    ];
    // SAFETY: futimens with an open descriptor and two valid timespecs.
    if unsafe { libc::futimens(f.as_raw_fd(), ts.as_ptr()) } != 0 {
        return Err(Error::io(path, std::io::Error::last_os_error()));
    }
    step();
    Ok(())
}

/// Restores `target` from a journal an interrupted run left; true when it did.
/// A journal cut short (the run died writing it, before the file changed) is
/// removed. A journal of another file, or a file shorter than the journal says it
/// was, is an error: something else has changed the file since.
pub(crate) fn recover(target: &Path) -> Result<bool> {
    let jp = journal_path(target);
    let raw = match std::fs::read(&jp) {
        Ok(r) => r,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(Error::io(&jp, e)),
    };
    let Some(j) = Journal::decode(&raw) else {
        std::fs::remove_file(&jp).map_err(|e| Error::io(&jp, e))?;
        step();
        sync_dir(target)?;
        return Ok(false);
    };
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(target)
        .map_err(|e| Error::io(target, e))?;
    let m = f.metadata().map_err(|e| Error::io(target, e))?;
    if (m.dev(), m.ino()) != (j.dev, j.ino) || m.len() < j.old_len {
        return Err(Error::unsupported(format!(
            "{} is the undo journal of an interrupted in-place run, but the file has been replaced or cut since ({} bytes, the journal says {}); restore it from a copy and remove the journal",
            jp.display(),
            m.len(),
            j.old_len
        ))
        .in_file(target));
    }
    if m.len() > j.old_len {
        f.set_len(j.old_len).map_err(|e| Error::io(target, e))?;
        step();
    }
    for (off, b) in &j.regions {
        f.write_all_at(b, *off).map_err(|e| Error::io(target, e))?;
        step();
    }
    f.sync_all().map_err(|e| Error::io(target, e))?;
    step();
    set_times(&f, target, j.atime, j.mtime)?;
    std::fs::remove_file(&jp).map_err(|e| Error::io(&jp, e))?;
    step();
    sync_dir(target)?;
    Ok(true)
}

/// True when `target` has an interrupted in-place run's journal beside it.
pub(crate) fn has_journal(target: &Path) -> bool {
    std::fs::symlink_metadata(journal_path(target)).is_ok()
}

/// Applies `plan` to `target` (see the module documentation for the order).
pub(crate) fn apply(target: &Path, plan: &Plan) -> Result<()> {
    if plan.is_empty() {
        return Ok(());
    }
    let io = |e| Error::io(target, e);
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(target)
        .map_err(io)?;
    let m = f.metadata().map_err(io)?;
    let old_len = m.len();
    if let Some(c) = plan.appends.iter().find(|c| c.offset < old_len) {
        return Err(Error::Internal(format!(
            "in-place append at {} inside the file ({old_len} bytes)",
            c.offset
        )));
    }
    let mut regions = Vec::new();
    for c in plan.records.iter().chain(&plan.switch) {
        let end = (c.offset + c.bytes.len() as u64).min(old_len);
        if c.offset < end {
            let mut b = vec![0u8; (end - c.offset) as usize];
            f.read_exact_at(&mut b, c.offset).map_err(io)?;
            regions.push((c.offset, b));
        }
    }
    let j = Journal {
        old_len,
        mtime: (m.mtime(), m.mtime_nsec()),
        atime: (m.atime(), m.atime_nsec()),
        dev: m.dev(),
        ino: m.ino(),
        regions,
    };
    let jp = journal_path(target);
    // From the journal to its removal a signal waits (SIGKILL cannot: the journal is
    // for that): a Ctrl-C leaves the file whole and no journal behind.
    let _whole = crate::signals::defer();
    let r = write_journaled(target, &f, &jp, &j, plan);
    if r.is_err() {
        // An error (a full disk, an I/O error) is not a crash: the file goes back to
        // its old state now rather than waiting for the next run. A journal that did
        // not become whole is removed by the same call; nothing was changed then.
        let _ = recover(target);
    }
    r
}

/// The steps of [`apply`] from the journal on: the journal, durable; the appends;
/// the records and the switch; the journal removed.
fn write_journaled(
    target: &Path,
    f: &std::fs::File,
    jp: &Path,
    j: &Journal,
    plan: &Plan,
) -> Result<()> {
    let io = |e| Error::io(target, e);
    {
        let mut jf = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(jp)
            .map_err(|e| Error::io(jp, e))?;
        for part in j.encode() {
            jf.write_all(&part).map_err(|e| Error::io(jp, e))?;
            step();
        }
        // fdatasync also makes the new file's size durable (needed to read it back).
        jf.sync_data().map_err(|e| Error::io(jp, e))?;
        step();
    }
    sync_dir(target)?;
    crate::signals::hooks::pause("in-place");
    for c in &plan.appends {
        f.write_all_at(&c.bytes, c.offset).map_err(io)?;
        step();
    }
    if !plan.appends.is_empty() {
        // The barrier that keeps a power cut from persisting the switch without
        // the bytes it points at (a kill alone would not need it).
        f.sync_data().map_err(io)?;
        step();
    }
    for c in plan.records.iter().chain(&plan.switch) {
        f.write_all_at(&c.bytes, c.offset).map_err(io)?;
        step();
    }
    set_times(f, target, j.atime, j.mtime)?;
    // The new state is durable before the journal that could undo it goes.
    f.sync_all().map_err(io)?;
    step();
    // No directory sync after: a power cut that loses the unlink leaves a journal
    // that the next run uses to undo this finished run, which is the old state, whole.
    std::fs::remove_file(jp).map_err(|e| Error::io(jp, e))?;
    step();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journal_round_trip_and_torn_journals() {
        let j = Journal {
            old_len: 1234,
            mtime: (1_700_000_000, 5),
            atime: (1_700_000_001, 6),
            dev: 7,
            ino: 8,
            regions: vec![(72, vec![1, 2, 3]), (1000, vec![9; 40])],
        };
        let all = j.encode().concat();
        assert_eq!(Journal::decode(&all), Some(j));
        for cut in 0..all.len() {
            assert_eq!(Journal::decode(&all[..cut]), None, "cut at {cut}");
        }
        let mut bad = all.clone();
        bad[80] ^= 1;
        assert_eq!(Journal::decode(&bad), None);
    }
}
