//! The proof's types: what a proof of a DSO's build ID is made of and what it
//! answers. Where an ID came from ([`Source`]), why there is none ([`Reason`],
//! [`Refusal`]), when the recording was made ([`RecordingStart`]), what a file's
//! inode says of its changes ([`FileTimes`], [`Place`]) and what excuses a moved
//! ctime ([`CtimeEvidence`], [`Voucher`]), a proven file ([`Proven`]),
//! and the answer for one group ([`Outcome`]) with a contradicted claim's fate
//! ([`Contradiction`], [`Verdict`]). The rules that produce them live in
//! [`super::elf`] (a file) and [`super`] (a group).

use crate::format::buildid::BuildId;
use crate::format::record::FileIdent;
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;

/// Why a file gives no ID.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reason {
    /// The file changed since the recording (other inode/device/generation, modified).
    Stale,
    /// The path was mapped from two different files during the recording.
    Ambiguous,
    /// No file at the path.
    Missing,
    /// The file exists but cannot be read.
    Unreadable,
    /// The file has no build-ID note.
    NoNote,
    /// The recording was made on another host or kernel; no local file is trusted.
    OtherHost,
    /// Not a regular file.
    NotRegular,
    /// Nothing says when the recording was made (a replayed stream), so no local file
    /// can be shown unchanged since.
    Undated,
    /// The mapping was of a file already deleted at recording time.
    Deleted,
    /// Something pdinject does not handle (said in the detail).
    Unsupported,
    /// The input claims this DSO's ID for another file too (or this boot's notes
    /// contradict it), and nothing proves which is right.
    ConflictingClaim,
    /// The file's inode changed after the recording started (ctime; its mtime is
    /// older) and nothing shows its bytes did not: a link, chmod, chown or rename
    /// leaves that trace, and so does a rewrite in place with its times set back. The
    /// file may well be the recorded one; it is not known to be (see
    /// [`super::vouch`] for what excuses it).
    CtimeMoved,
}

/// A failed proof: the reason and a sentence for the user.
pub(crate) type Refusal = (Reason, String);

/// The recording's start in wall-clock ns since the epoch, or why it is not known.
/// "Unknown" refuses every local file ([`Reason::Undated`]); there is no value that
/// skips the staleness check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum RecordingStart {
    /// Samples may have been taken from this moment on: files modified after it are stale.
    Known(i128),
    /// Nothing dates the recording (a replayed stream): no local file can be shown
    /// unchanged since, so none is used.
    Unknown(String),
}

/// Where an ID came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Source {
    /// A build-ID MMAP2 record of the recording.
    Mmap2,
    /// The input's BUILD_ID table or its HEADER_BUILD_ID records.
    InputTable,
    /// `--known-build-ids`.
    Known,
    /// The ELF note of the file, proven to be the recorded one.
    Elf,
    /// `/sys/kernel/notes` of this host, proven to be the recorded kernel.
    KernelNotes,
    /// `/sys/module/NAME/notes` of this host.
    ModuleNotes,
    /// This host's vdso image.
    Vdso,
    /// The ELF note of a file under `--symfs`, not modified since the recording
    /// started (no device/inode proof applies to a sysroot copy).
    Symfs,
    /// The image `--jit` wrote from the process's jitdump.
    Jit,
    /// Read from the mapped inode while a process of a live recording mapped it
    /// (`--live`, issue 32: the live module).
    Live,
}

/// Whether local files may be opened for a proof at all (the recording is of this
/// host, and dated).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LocalFiles {
    /// They may: each is still proven to be the recorded one.
    Trusted,
    /// None is opened.
    Refused,
}

impl LocalFiles {
    /// From host trust's verdict on local files.
    pub(crate) fn of<E>(local: &Result<(), E>) -> LocalFiles {
        match local {
            Ok(()) => LocalFiles::Trusted,
            Err(_) => LocalFiles::Refused,
        }
    }
}

/// The answer for one group: an ID with its provenance, or the reason there is none.
#[derive(Clone, Debug)]
pub(crate) enum Outcome {
    /// An ID known for certain.
    Found(Found),
    /// No ID, and why.
    Refused(Refused),
}

/// An ID known for certain, and where it came from.
#[derive(Clone, Debug)]
pub(crate) struct Found {
    /// The ID.
    pub build_id: BuildId,
    /// Where it came from.
    pub source: Source,
    /// Words for the user, when there is more to say than the source.
    pub detail: Option<String>,
    /// Whether the input's table already lists this name.
    pub table: InTable,
    /// The file the ID was read from, still open ([`Source::Elf`], [`Source::Symfs`]):
    /// the build-ID cache links or copies this very file, never the path again.
    pub file: Option<Arc<File>>,
    /// The input's claim for this DSO was contradicted, and what became of it.
    pub contradiction: Option<Contradiction>,
}

impl Found {
    /// `id` from `source`, nothing more to say.
    pub(crate) fn of(build_id: BuildId, source: Source) -> Found {
        Found {
            build_id,
            source,
            detail: None,
            table: InTable::Absent,
            file: None,
            contradiction: None,
        }
    }
}

/// Whether the input's table lists a found ID's name already.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum InTable {
    /// Its entry is kept verbatim; none is added.
    Listed,
    /// Not listed: an entry is added.
    #[default]
    Absent,
}

/// No ID, and why.
#[derive(Clone, Debug)]
pub(crate) struct Refused {
    /// Why there is none.
    pub reason: Reason,
    /// Words for the user.
    pub detail: String,
    /// The input's claim for this DSO was contradicted, and refused.
    pub contradiction: Option<Contradiction>,
}

impl Outcome {
    /// `id` from `source`, nothing more to say.
    pub(crate) fn found(build_id: BuildId, source: Source) -> Self {
        Outcome::Found(Found::of(build_id, source))
    }

    /// No ID, for `reason`.
    pub(crate) fn refused((reason, detail): Refusal) -> Self {
        Outcome::Refused(Refused {
            reason,
            detail,
            contradiction: None,
        })
    }

    /// The ID, if one is known for certain.
    pub(crate) fn build_id(&self) -> Option<BuildId> {
        match self {
            Outcome::Found(f) => Some(f.build_id),
            Outcome::Refused(_) => None,
        }
    }

    /// Where the ID came from.
    pub(crate) fn source(&self) -> Option<Source> {
        match self {
            Outcome::Found(f) => Some(f.source),
            Outcome::Refused(_) => None,
        }
    }

    /// Why there is no ID.
    pub(crate) fn reason(&self) -> Option<Reason> {
        match self {
            Outcome::Found(_) => None,
            Outcome::Refused(r) => Some(r.reason),
        }
    }

    /// Words for the user.
    pub(crate) fn detail(&self) -> Option<&str> {
        match self {
            Outcome::Found(f) => f.detail.as_deref(),
            Outcome::Refused(r) => Some(&r.detail),
        }
    }

    /// The input's table already lists this name (its entry is kept verbatim).
    pub(crate) fn in_input_table(&self) -> bool {
        matches!(self, Outcome::Found(f) if f.table == InTable::Listed)
    }

    /// The open file the ID was read from.
    pub(crate) fn file(&self) -> Option<&Arc<File>> {
        match self {
            Outcome::Found(f) => f.file.as_ref(),
            Outcome::Refused(_) => None,
        }
    }

    /// The input's contradicted claim for this DSO, and what became of it.
    pub(crate) fn contradiction(&self) -> Option<&Contradiction> {
        match self {
            Outcome::Found(f) => f.contradiction.as_ref(),
            Outcome::Refused(r) => r.contradiction.as_ref(),
        }
    }

    /// The same answer with `file`, the file its ID was read from, open (the build-ID
    /// cache links or copies it).
    pub(crate) fn with_file(self, file: File) -> Self {
        match self {
            Outcome::Found(f) => Outcome::Found(Found {
                file: Some(Arc::new(file)),
                ..f
            }),
            r => r,
        }
    }

    /// The same answer with its file closed (a descriptor must not outlive the batch).
    pub(crate) fn without_file(self) -> Self {
        match self {
            Outcome::Found(f) => Outcome::Found(Found { file: None, ..f }),
            r => r,
        }
    }
}

/// What became of a contradicted claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// A proof (the file proven unchanged since the recording, this boot's notes)
    /// gives the claimed ID: it is kept.
    Confirmed,
    /// A proof gives another ID: that one is written, the claim nowhere.
    Corrected,
    /// Nothing proves either way: no ID ([`Reason::ConflictingClaim`]).
    Refused,
}

/// An ID the input claims for a DSO that the input contradicts (it claims the same
/// ID for another file) or that this boot's kernel or module notes contradict.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Contradiction {
    /// The contradicted ID.
    pub claimed: BuildId,
    /// Other DSOs the input claims it for, sorted, at most [`NAMED_CLAIMANTS`]
    /// (empty when this boot's notes contradict it).
    pub others: Vec<String>,
    /// How many other DSOs claim it.
    pub others_total: usize,
    /// The input's own build-ID MMAP2 records carry it (they are passed on as they
    /// are: records stay byte for byte).
    pub in_records: bool,
    /// What became of the claim.
    pub verdict: Verdict,
}

/// Other claimants named in a [`Contradiction`] (the perf 6.17 bug makes every
/// module claim one ID: a hundred names per module would say nothing more).
pub(crate) const NAMED_CLAIMANTS: usize = 8;

/// A local file proven to be the one a recording mapped, still open (so what is read
/// next, and what the build-ID cache links or copies, comes from the file that was
/// checked, not whatever the path names later).
#[derive(Clone, Debug)]
pub(crate) struct Proven {
    /// Its build ID.
    pub build_id: BuildId,
    /// The open file.
    pub file: Arc<File>,
    /// `(st_dev, st_ino)`: the same file reached by two paths is the same key.
    pub key: (u64, u64),
    /// What excused a ctime after the recording's start, if anything was needed
    /// (kept so a table loaded from the file can be judged again against an earlier
    /// start: `resolve::unwind::UnwindTables::still_proven`).
    pub ctime: CtimeEvidence,
}

/// A record, made elsewhere, that a file's bytes have been what they are now since
/// `since` (ns since the epoch).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Voucher {
    /// The file is known unchanged from this moment on.
    pub since: i128,
    /// Who says so, in words (for the refusal when `since` is too late).
    pub what: String,
}

/// What a proof knows beyond a file's inode when its ctime moved after the start.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct CtimeEvidence {
    /// A record that the bytes are unchanged since some time.
    pub voucher: Option<Voucher>,
    /// `--trust-same-layout` was given.
    pub same_layout: bool,
}

/// What a file's inode says about when it changed (ns since the epoch), as the proof
/// read it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct FileTimes {
    /// Last modification of its bytes (settable: `touch -d`, `cp -p`).
    pub mtime: i128,
    /// Last change of the inode (bytes, links, mode, owner, times); not settable.
    pub ctime: i128,
    /// Creation of the inode, when the filesystem reports it (statx); not settable.
    pub btime: Option<i128>,
}

impl FileTimes {
    /// The times in `meta` (std reads it with statx, which gives the birth time).
    pub(crate) fn of(meta: &std::fs::Metadata) -> FileTimes {
        let ns = |s: i64, n: i64| s as i128 * 1_000_000_000 + n as i128;
        let btime = meta
            .created()
            .ok()
            .map(|t| match t.duration_since(std::time::UNIX_EPOCH) {
                Ok(d) => d.as_nanos() as i128,
                Err(e) => -(e.duration().as_nanos() as i128),
            });
        FileTimes {
            mtime: ns(meta.mtime(), meta.mtime_nsec()),
            ctime: ns(meta.ctime(), meta.ctime_nsec()),
            btime,
        }
    }
}

/// Which file a proof is about: what its inode's times can show.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Place {
    /// On this machine, the inode the records named (device, inode and, when both
    /// sides know it, generation checked).
    RecordedInode,
    /// On this machine; the records name no inode (MMAP records, build-ID MMAP2).
    Local,
    /// Under `--symfs`: a copy, whose ctime and birth time are the copy's own.
    Sysroot,
}

impl Place {
    /// The place of a local file mapped with `ident` (once its inode is checked).
    pub(crate) fn of(ident: &FileIdent) -> Place {
        match ident {
            FileIdent::Inode { .. } => Place::RecordedInode,
            FileIdent::None | FileIdent::BuildId(_) => Place::Local,
        }
    }
}
