//! The batch memo: each distinct DSO file is proven and its build ID read once per
//! batch, however many recordings map it.
//!
//! A memo entry is keyed by what the file is right now — device, inode, size, mtime and
//! ctime from a fresh `stat` at every lookup — so a file that is rewritten, replaced or
//! touched mid-batch gets a new key and is read again, never served from the memo.
//! Within one file state the proof's answer still depends on the recording (the inode
//! it mapped, its executable mappings, and whether the file's mtime/ctime/birth time
//! fall before or after the recording's start), so those are part of the entry's key
//! too.
//!
//! Only [`prove_and_read`] uses the memo, through one call at its top ([`lookup`]),
//! when the run hands it one (`engine::Handles`: a batch shares one across its
//! inputs, a single run owns one); without one every proof reads its file.
//!
//! Assumption this relies on (checked by the unit test below only for today's proof):
//! the proof's use of the recording's start time is a comparison with the file's mtime,
//! ctime and birth time, and, once the ctime is after the start, with the time of what
//! excuses that ([`super::vouch`]): a file in that state is keyed also by whether its
//! voucher (looked up here, kept per file state by the vouchers) is from before the
//! start, and by the [`Vouchers`] consulted. If the proof ever compares with a slack,
//! the time class below must use the same.

use super::elf::{CtimeEvidence, Proven, RecordingStart, Refusal, Vouchers};
use crate::format::buildid::BuildId;
use crate::format::record::FileIdent;
use crate::model::ExecMaps;
use std::cmp::Ordering as CmpOrdering;
use std::collections::HashMap;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// What a file is right now: `(st_dev, st_ino, size, mtime ns, ctime ns)`.
type FileKey = (u64, u64, u64, i128, i128);

/// One proof's inputs for one file state.
#[derive(Clone, PartialEq, Eq, Hash)]
struct ProofKey {
    path: PathBuf,
    file: FileKey,
    /// The recorded identity, as comparable numbers (`None` without an inode).
    ident: Option<(u32, u32, u64, u64)>,
    maps: ExecMaps,
    /// How the file's mtime, ctime and birth time (if known) compare with the
    /// recording's start.
    times: Option<(CmpOrdering, CmpOrdering, Option<CmpOrdering>)>,
    /// When the ctime is after the start: what may excuse it, and whether a voucher
    /// was found and is from before the start.
    ctime_moved: Option<(Vouchers, Option<bool>)>,
}

/// A memoised answer: the ID and what excused a moved ctime (the open file is not
/// kept; each hit opens it anew and checks it is still the same file) or the refusal.
type Answer = Result<(BuildId, CtimeEvidence), Refusal>;

/// The memo of one run or batch: the run opens it (`engine::Handles`) and hands it to the proofs.
#[derive(Default)]
pub(crate) struct Memo {
    proofs: Mutex<HashMap<ProofKey, Arc<OnceLock<Option<Answer>>>>>,
    files: Mutex<std::collections::HashSet<FileKey>>,
    files_read: AtomicU64,
    proofs_run: AtomicU64,
    hits: AtomicU64,
}

/// Counters of a memo.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct MemoStats {
    /// Distinct DSO files (device, inode, size, times) opened and read.
    pub dso_files_read: u64,
    /// Proofs run (more than files when recordings differ in what they say of a file).
    pub proofs_run: u64,
    /// Lookups answered from the memo.
    pub memo_hits: u64,
}

impl Memo {
    /// A new, empty memo.
    pub(crate) fn new() -> Memo {
        Memo::default()
    }

    /// Its counters so far.
    pub(crate) fn stats(&self) -> MemoStats {
        MemoStats {
            dso_files_read: self.files_read.load(Ordering::Relaxed),
            proofs_run: self.proofs_run.load(Ordering::Relaxed),
            memo_hits: self.hits.load(Ordering::Relaxed),
        }
    }
}

impl std::fmt::Debug for Memo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Memo")
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

fn file_key(m: &std::fs::Metadata) -> FileKey {
    (
        m.dev(),
        m.ino(),
        m.len(),
        m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128,
        m.ctime() as i128 * 1_000_000_000 + m.ctime_nsec() as i128,
    )
}

fn open(path: &Path) -> std::io::Result<std::fs::File> {
    // The same flags as the proof: a FIFO planted at a DSO path must not block.
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
}

/// Opens `path` and proves it is the file the recording mapped, then reads its ID.
///
/// Evidence, strongest first: inode (and generation when both sides know it) and
/// device equal to the record's; not modified since the recording started (mtime),
/// and not created since (birth time, when the filesystem keeps one); a PT_LOAD
/// segment at each recorded executable file offset. A ctime after the start with an
/// older mtime is what a link, unlink, rename, chmod or chown leaves (perf and
/// pdinject hard-link every DSO into ~/.debug, and emptying that cache unlinks them)
/// and also what a rewrite in place with its times set back leaves (`cp -p`,
/// `rsync --inplace -t`), even one that keeps every code page where it was: such a
/// file is accepted only with a record made elsewhere that its bytes did not change
/// since before the start ([`super::vouch`]: dpkg's, pdinject's own cache link), or
/// under `--trust-same-layout` (see [`super::elf::judge`]).
pub(crate) fn prove_and_read(
    path: &Path,
    ident: &FileIdent,
    exec_maps: &ExecMaps,
    start: &RecordingStart,
    memo: Option<&Memo>,
    vouchers: &Vouchers,
) -> Result<Proven, Refusal> {
    // A run (a batch) proves each file once (the memo re-checks the file is the same).
    if let Some(r) = memo.and_then(|m| lookup(m, path, ident, exec_maps, start, vouchers)) {
        return r;
    }
    super::elf::prove(path, Some(ident), exec_maps, start, vouchers)
}

/// The hook at the top of the proof. `None`: the file cannot be keyed (missing, not
/// regular): prove as usual.
pub(crate) fn lookup(
    memo: &Memo,
    path: &Path,
    ident: &FileIdent,
    exec_maps: &ExecMaps,
    times: &RecordingStart,
    vouchers: &Vouchers,
) -> Option<Result<Proven, Refusal>> {
    // An undated recording is refused by the proof before any file is opened.
    let RecordingStart::Known(start) = *times else {
        return None;
    };
    let meta = std::fs::metadata(path).ok().filter(|m| m.is_file())?;
    let file = file_key(&meta);
    let key = ProofKey {
        path: path.to_path_buf(),
        file,
        ident: match *ident {
            FileIdent::Inode {
                maj,
                min,
                ino,
                generation,
            } => Some((maj, min, ino, generation)),
            _ => None,
        },
        maps: exec_maps.clone(),
        times: Some((
            file.3.cmp(&start),
            file.4.cmp(&start),
            super::elf::FileTimes::of(&meta)
                .btime
                .map(|b| b.cmp(&start)),
        )),
        ctime_moved: (file.4 > start).then(|| {
            (
                vouchers.clone(),
                voucher_before(path, &meta, vouchers, start),
            )
        }),
    };
    let cell = {
        let mut proofs = memo.proofs.lock().ok()?;
        proofs.entry(key).or_default().clone()
    };
    let mut mine = None;
    // Only one thread proves a key; the others wait for its answer.
    let answer = cell.get_or_init(|| {
        // The proof itself, not prove_and_read (whose first step is this lookup).
        let r = super::elf::prove(path, Some(ident), exec_maps, times, vouchers);
        memo.proofs_run.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut files) = memo.files.lock()
            && files.insert(file)
        {
            memo.files_read.fetch_add(1, Ordering::Relaxed);
        }
        // Keep the answer only if the file the proof read is the file keyed above:
        // one replaced between the stat and the proof's open must not be memoised
        // under the old key.
        let still = match &r {
            Ok(p) => p.file.metadata().ok().map(|m| file_key(&m)) == Some(file),
            Err(_) => std::fs::metadata(path).ok().map(|m| file_key(&m)) == Some(file),
        };
        let a = still.then(|| {
            r.as_ref()
                .map(|p| (p.build_id, p.ctime.clone()))
                .map_err(Clone::clone)
        });
        mine = Some(r);
        a
    });
    if let Some(r) = mine {
        return Some(r);
    }
    let answer = answer.clone()?;
    memo.hits.fetch_add(1, Ordering::Relaxed);
    match answer {
        Err(refusal) => Some(Err(refusal)),
        Ok((build_id, ctime)) => {
            // Hand out the file as it is now, and only if it is still the one proven.
            let f = open(path).ok()?;
            let m = f.metadata().ok()?;
            if file_key(&m) != file {
                return None;
            }
            Some(Ok(Proven {
                build_id,
                file: std::sync::Arc::new(f),
                key: (m.dev(), m.ino()),
                ctime,
            }))
        }
    }
}

/// Whether the voucher for the file at `path` (`meta` its stat) is from before
/// `start` (`None`: no voucher, or the file cannot be read: the proof says why).
fn voucher_before(
    path: &Path,
    meta: &std::fs::Metadata,
    vouchers: &Vouchers,
    start: i128,
) -> Option<bool> {
    let (f, m) = super::elf::open_regular(path).ok()?;
    if (m.dev(), m.ino()) != (meta.dev(), meta.ino()) {
        return None;
    }
    let id = super::elf::read_build_id(&f).ok();
    let e = vouchers.evidence(&f, &m, path, id);
    e.voucher.map(|v| v.since <= start)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buildid::Reason;
    use std::io::Write;

    /// A tiny ELF with a build-ID note, built by hand: enough for `object`.
    fn elf_with_id(id: &[u8; 20]) -> Vec<u8> {
        // ELF64 LE header + one PT_NOTE program header + the note.
        let mut v = vec![0u8; 64 + 56];
        v[..4].copy_from_slice(b"\x7fELF");
        v[4] = 2; // 64-bit
        v[5] = 1; // little endian
        v[6] = 1;
        v[16..18].copy_from_slice(&3u16.to_le_bytes()); // ET_DYN
        v[18..20].copy_from_slice(&62u16.to_le_bytes()); // x86_64
        v[20..24].copy_from_slice(&1u32.to_le_bytes());
        v[32..40].copy_from_slice(&64u64.to_le_bytes()); // e_phoff
        v[52..54].copy_from_slice(&64u16.to_le_bytes());
        v[54..56].copy_from_slice(&56u16.to_le_bytes());
        v[56..58].copy_from_slice(&1u16.to_le_bytes()); // e_phnum
        v[58..60].copy_from_slice(&64u16.to_le_bytes());
        let note_off = v.len() as u64;
        let mut note = Vec::new();
        note.extend_from_slice(&4u32.to_le_bytes());
        note.extend_from_slice(&20u32.to_le_bytes());
        note.extend_from_slice(&3u32.to_le_bytes());
        note.extend_from_slice(b"GNU\0");
        note.extend_from_slice(id);
        let ph = 64;
        v[ph..ph + 4].copy_from_slice(&4u32.to_le_bytes()); // PT_NOTE
        v[ph + 8..ph + 16].copy_from_slice(&note_off.to_le_bytes());
        v[ph + 32..ph + 40].copy_from_slice(&(note.len() as u64).to_le_bytes());
        v[ph + 40..ph + 48].copy_from_slice(&(note.len() as u64).to_le_bytes());
        v[ph + 48..ph + 56].copy_from_slice(&4u64.to_le_bytes());
        v.extend_from_slice(&note);
        v
    }

    /// An undated recording refuses every local file before opening anything: the
    /// proof cannot be skipped, for IDs or for unwind tables (both go through here).
    #[test]
    fn an_unknown_start_refuses_before_opening() {
        let unknown = RecordingStart::Unknown("nothing dates it".into());
        let r = prove_and_read(
            Path::new("/nonexistent/lib.so"),
            &FileIdent::None,
            &ExecMaps::default(),
            &unknown,
            None,
            &Vouchers::default(),
        );
        assert_eq!(r.err().map(|e| e.0), Some(Reason::Undated));
        let r = prove_and_read(
            Path::new("/nonexistent/lib.so"),
            &FileIdent::None,
            &ExecMaps::default(),
            &RecordingStart::Known(0),
            None,
            &Vouchers::default(),
        );
        assert_eq!(r.err().map(|e| e.0), Some(Reason::Missing));
    }

    #[test]
    fn read_once_and_never_stale() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("libx.so");
        std::fs::write(&p, elf_with_id(&[0xaa; 20])).unwrap();
        let memo = Memo::new();
        // Times never make a file stale here.
        let t = RecordingStart::Known(i128::MAX);
        let prove = |p: &Path| {
            prove_and_read(
                p,
                &FileIdent::None,
                &ExecMaps::default(),
                &t,
                Some(&memo),
                &Vouchers::default(),
            )
        };
        for _ in 0..3 {
            assert_eq!(prove(&p).unwrap().build_id.to_string(), "aa".repeat(20));
        }
        let s = memo.stats();
        assert_eq!((s.dso_files_read, s.memo_hits), (1, 2));
        // Rewritten in place (same inode, same size): the new ID, never the memo's.
        std::thread::sleep(std::time::Duration::from_millis(10));
        let mut f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
        f.write_all(&elf_with_id(&[0xbb; 20])).unwrap();
        drop(f);
        assert_eq!(prove(&p).unwrap().build_id.to_string(), "bb".repeat(20));
        assert_eq!(memo.stats().dso_files_read, 2);
    }
}
