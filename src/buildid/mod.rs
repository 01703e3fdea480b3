//! The identify stage: for each distinct hit DSO, find its build ID from the sources in
//! order, or say why there is none. Every answer carries its provenance.
//!
//! Sources, in order: build-ID MMAP2 records (they name the exact mapping); the
//! input's own table and HEADER_BUILD_ID records; `--known-build-ids`; the ELF note of
//! a file proven to be the mapped one; the kernel, module and vdso notes of this host
//! when the recording is proven to be of this host and boot.
//!
//! An ID the input claims (build-ID MMAP2 records, its table, its HEADER_BUILD_ID
//! records) is taken at its word only while nothing contradicts it: perf 6.17 and
//! 6.18 wrote the first module's ID into the synthesized MMAP2 record of every
//! module after it. A claim the input also makes for another file ([`Claims`]), or a
//! kernel or module claim that this boot's notes contradict, is proven the normal way
//! or refused ([`Reason::ConflictingClaim`]); see [`Contradiction`].

pub(crate) mod archive;
pub(crate) mod cache;
pub(crate) mod debuginfod;
pub(crate) mod elf;
mod elf_read;
pub(crate) mod host;
pub(crate) mod memo;
pub(crate) mod proof;
pub(crate) mod store;
pub(crate) mod vouch;

use crate::format::buildid::{BuildId, BuildIdTable, TableEntry};
use crate::format::record::FileIdent;
use crate::model::{Dso, DsoId, DsoKind, Model};
use host::HostInfo;
pub(crate) use proof::{
    Contradiction, FileTimes, Found, InTable, LocalFiles, NAMED_CLAIMANTS, Outcome, Place,
    RecordingStart, Refusal, Refused,
};
pub(crate) use proof::{Reason, Source, Verdict};
use rayon::prelude::*;
use std::collections::{BTreeSet, HashMap};
use std::path::Path;

/// The DSOs of one build-ID table entry: one name in one address space.
#[derive(Clone, Debug)]
pub(crate) struct Group {
    /// Name as written in the table.
    pub name: String,
    /// Kind.
    pub kind: DsoKind,
    /// Every model DSO with this name (more than one identity means trouble).
    pub dsos: Vec<DsoId>,
    /// Samples that touched it.
    pub hits: u64,
}

impl Group {
    /// Mapped as code at least once (a file only ever mapped as data, like a locale
    /// archive, is not a DSO perf lists); kernel-space DSOs and the vdso always are.
    pub(crate) fn is_code(&self, model: &Model) -> bool {
        self.kind != DsoKind::User
            || self.dsos.iter().any(|&d| {
                model
                    .dsos
                    .get(d as usize)
                    .is_some_and(|d| !d.exec_maps.is_empty())
            })
    }
}

/// What one file is, as far as the input can tell: claims of one file under two
/// names (a module as `[name]` and by path, hard links, a bind mount) are one claim.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum FileKey {
    /// A kernel module, by module name.
    Module(String),
    /// A user file the recording identifies by device and inode (one per name).
    Inode(u32, u32, u64),
    /// Only its name, in kernel (true) or user space.
    Name(bool, String),
}

/// The IDs the input claims for more than one file: from build-ID MMAP2 records,
/// its table and its HEADER_BUILD_ID records, host entries only (a guest is another
/// machine). The same name in several processes is one DSO, not a conflict.
#[derive(Clone, Debug, Default)]
pub(crate) struct Claims {
    /// Each contested ID: its claimants, (space, name) with what file they are.
    contested: HashMap<BuildId, Vec<(FileKey, bool, String)>>,
    /// Every claimant of a contested ID: the contested IDs it claims.
    claimants: HashMap<(bool, String), Vec<BuildId>>,
}

/// A contested claim of one DSO: the ID and the other DSOs claiming it.
struct Contest {
    id: BuildId,
    others: Vec<String>,
    total: usize,
}

impl Claims {
    /// Gathers the claims of `model`'s build-ID MMAP2 records, `table` and `stream`.
    pub(crate) fn gather(model: &Model, table: &BuildIdTable, stream: &[TableEntry]) -> Claims {
        let mut by_id: HashMap<BuildId, Vec<(bool, &str)>> = HashMap::new();
        for d in &model.dsos {
            if let FileIdent::BuildId(b) = d.ident {
                by_id
                    .entry(b)
                    .or_default()
                    .push((d.kind.is_kernel_space(), &d.name));
            }
        }
        for e in table.entries.iter().chain(stream) {
            if !is_guest(e) {
                by_id
                    .entry(e.build_id)
                    .or_default()
                    .push((e.is_kernel(), &e.filename));
            }
        }
        by_id.retain(|_, v| {
            v.sort_unstable();
            v.dedup();
            v.len() > 1
        });
        if by_id.is_empty() {
            return Claims::default();
        }
        // Names claiming an ID some other name claims too: what file each one is.
        let names: std::collections::HashSet<(bool, &str)> =
            by_id.values().flatten().copied().collect();
        // (major, minor, inode) of each name's mappings.
        type Inode = (u32, u32, u64);
        let mut inodes: HashMap<(bool, &str), BTreeSet<Inode>> = HashMap::new();
        for d in &model.dsos {
            let k = (d.kind.is_kernel_space(), d.name.as_str());
            if let FileIdent::Inode { maj, min, ino, .. } = d.ident
                && names.contains(&k)
            {
                inodes.entry(k).or_default().insert((maj, min, ino));
            }
        }
        let file_key = |(space, name): (bool, &str)| -> FileKey {
            if space
                && !name.starts_with("[kernel.kallsyms]")
                && let Some(m) = host::module_name(name)
            {
                return FileKey::Module(m);
            }
            match inodes
                .get(&(space, name))
                .filter(|s| s.len() == 1)
                .and_then(|s| s.first())
            {
                Some(&(maj, min, ino)) => FileKey::Inode(maj, min, ino),
                None => FileKey::Name(space, name.to_string()),
            }
        };
        let mut c = Claims::default();
        for (id, v) in by_id {
            let v: Vec<(FileKey, bool, String)> = v
                .into_iter()
                .map(|(sp, n)| (file_key((sp, n)), sp, n.to_string()))
                .collect();
            let files: BTreeSet<&FileKey> = v.iter().map(|x| &x.0).collect();
            if files.len() < 2 {
                continue;
            }
            for (_, sp, n) in &v {
                c.claimants.entry((*sp, n.clone())).or_default().push(id);
            }
            c.contested.insert(id, v);
        }
        c
    }

    /// Whether the input claims, for `name` in this space, an ID it also claims for
    /// another file.
    pub(crate) fn is_contested(&self, kernel_space: bool, name: &str) -> bool {
        self.claimants
            .contains_key(&(kernel_space, name.to_string()))
    }

    /// The first of `ids` (the DSO's own claims, the one taken first) that the input
    /// also claims for another file, and those files' names.
    fn contest(&self, kernel_space: bool, name: &str, ids: &[BuildId]) -> Option<Contest> {
        if self.contested.is_empty() {
            return None;
        }
        ids.iter().find_map(|id| {
            let v = self.contested.get(id)?;
            let own: Vec<&FileKey> = v
                .iter()
                .filter(|x| x.1 == kernel_space && x.2 == name)
                .map(|x| &x.0)
                .collect();
            let others: BTreeSet<&str> = v
                .iter()
                .filter(|x| !own.contains(&&x.0))
                .map(|x| x.2.as_str())
                .collect();
            (!others.is_empty()).then(|| Contest {
                id: *id,
                total: others.len(),
                others: others
                    .into_iter()
                    .take(NAMED_CLAIMANTS)
                    .map(str::to_string)
                    .collect(),
            })
        })
    }
}

fn is_guest(e: &TableEntry) -> bool {
    use crate::format::record::misc;
    matches!(e.cpumode, misc::GUEST_KERNEL | misc::GUEST_USER)
}

/// The user-space IDs the input's table (and a stream's records) and
/// `--known-build-ids` give DSO names (a name given two IDs gets none). A file whose
/// own note carries the ID given for its name
/// is that build, whatever its inode's times: what lets the unwinder read the CFI of
/// a library whose ctime moved because `perf record` linked it into `~/.debug` (the
/// ID itself is the input's, written as it is; see `resolve::unwind::UnwindTables`).
pub(crate) fn claimed_user_ids<'e>(
    entries: impl Iterator<Item = &'e TableEntry>,
    known: &[(BuildId, String)],
) -> std::sync::Arc<HashMap<String, BuildId>> {
    let mut m: HashMap<String, Option<BuildId>> = HashMap::new();
    for e in entries.filter(|e| !is_guest(e) && !e.is_kernel()) {
        m.entry(e.filename.clone())
            .and_modify(|v| {
                if *v != Some(e.build_id) {
                    *v = None;
                }
            })
            .or_insert(Some(e.build_id));
    }
    // The user's word comes first, as it does for IDs.
    for (id, name) in known {
        m.insert(name.clone(), Some(*id));
    }
    std::sync::Arc::new(m.into_iter().filter_map(|(k, v)| Some((k, v?))).collect())
}

/// Whether the recording's host, and its kernel, are this machine's.
#[derive(Clone, Debug)]
pub(crate) struct HostTrust {
    /// Local files may be opened (same hostname and kernel release), or the reason
    /// every local file is refused for (another host; a recording nothing dates).
    pub local: Result<(), Refusal>,
    /// The kernel, modules and vdso of this boot are the recorded ones.
    pub kernel: Result<(), Refusal>,
}

impl HostTrust {
    /// Decides from the recording's HOSTNAME, OSRELEASE and kernel reference map.
    pub(crate) fn decide(
        hostname: Option<&str>,
        release: Option<&str>,
        kernel_ref: Option<(&str, u64)>,
        host: &HostInfo,
    ) -> HostTrust {
        let other = |why: String| (Reason::OtherHost, why);
        let local = match (hostname, release) {
            (Some(h), Some(r)) if h == host.hostname && r == host.release => Ok(()),
            // Files older than OSRELEASE (2011) or rewritten without it: the hostname
            // and the per-file inode proof have to carry the decision.
            (Some(h), None) if h == host.hostname => Ok(()),
            (Some(h), Some(r)) => Err(other(format!(
                "recorded on host '{h}' running {r}; this is '{}' running {}",
                host.hostname, host.release
            ))),
            _ => Err(other(
                "the recording does not say which host it was made on (no HOSTNAME/OSRELEASE)"
                    .into(),
            )),
        };
        let kernel = match (&local, kernel_ref) {
            (Err(e), _) => Err(e.clone()),
            (Ok(()), _) if release.is_none() => Err(other(
                "the recording does not say which kernel it ran (no OSRELEASE)".into(),
            )),
            (Ok(()), None) => Err(other(
                "the recording has no kernel reference map to prove the kernel".into(),
            )),
            (Ok(()), Some((sym, addr))) => match host::kernel_symbol(sym) {
                Some(a) if a == addr => Ok(()),
                Some(a) => Err(other(format!(
                    "recorded kernel {sym} at {addr:#x}, this boot has it at {a:#x}: another boot"
                ))),
                None => Err(other(format!(
                    "cannot read this boot's address of {sym} from /proc/kallsyms to prove the kernel"
                ))),
            },
        };
        HostTrust { local, kernel }
    }
}

/// Everything the identify stage consults.
pub(crate) struct Evidence<'a> {
    /// The input's BUILD_ID table.
    pub table: &'a BuildIdTable,
    /// HEADER_BUILD_ID records in the input's data.
    pub stream: &'a [TableEntry],
    /// `--known-build-ids`.
    pub known: &'a [(BuildId, String)],
    /// Host trust.
    pub trust: &'a HostTrust,
    /// IDs the input claims for more than one file.
    pub claims: &'a Claims,
    /// When the recording ran.
    pub times: RecordingStart,
    /// `--symfs`: user DSOs are read under this sysroot instead of `/`.
    pub symfs: Option<&'a Path>,
    /// The run's memo of file proofs, if it keeps one.
    pub memo: Option<&'a memo::Memo>,
    /// What may excuse a ctime moved after the recording started.
    pub vouchers: &'a vouch::Vouchers,
    /// live capture hook (issue 32): files captured while they were mapped.
    pub live: Option<&'a dyn Captured>,
}

/// live capture hook (issue 32): proofs from files read while a live recording's
/// processes mapped them (implemented by the live capture, a room above this one).
pub(crate) trait Captured: Sync {
    /// Waits (a bounded time) until what arrived so far is proven.
    fn settle(&self);
    /// The answer for a user DSO whose files (one model DSO each) are `dsos`: the
    /// captured ID when the capture speaks for all of them, else `prove`'s (the
    /// file at the path now), with why the capture could not added to a refusal.
    fn prove_first(
        &self,
        dsos: &[&crate::model::Dso],
        prove: &mut dyn FnMut() -> Outcome,
    ) -> Outcome;
    /// A captured file whose note carries `id`, while it is kept open.
    fn file_with(&self, id: &BuildId) -> Option<std::sync::Arc<std::fs::File>>;
}

fn same_space(e: &TableEntry, kind: DsoKind) -> bool {
    use crate::format::record::misc;
    !matches!(e.cpumode, misc::GUEST_KERNEL | misc::GUEST_USER)
        && e.is_kernel() == kind.is_kernel_space()
}

pub(crate) fn inode_conflict(a: &FileIdent, b: &FileIdent) -> bool {
    match (a, b) {
        (
            FileIdent::Inode {
                maj,
                min,
                ino,
                generation: g,
            },
            FileIdent::Inode {
                maj: m2,
                min: n2,
                ino: i2,
                generation: g2,
            },
        ) => (maj, min, ino) != (m2, n2, i2) || (*g != 0 && *g2 != 0 && g != g2),
        _ => false,
    }
}

/// Identifies every group, in parallel on the current rayon pool.
pub(crate) fn identify(groups: &[Group], model: &Model, ev: &Evidence<'_>) -> Vec<Outcome> {
    let kernel_id = std::sync::OnceLock::new();
    let vdso_id = std::sync::OnceLock::new();
    // Proven files stay open for the build-ID cache, within half the descriptor limit;
    // past it a DSO's file is closed and the cache reopens the path, caching it only
    // if its note carries the same ID.
    let budget = open_file_budget();
    let kept = std::sync::atomic::AtomicUsize::new(0);
    // live capture hook (issue 32): what arrived so far is proven before it is asked.
    if let Some(l) = ev.live {
        l.settle();
    }
    groups
        .par_iter()
        .map(|g| {
            let mut o = identify_one(g, model, ev, &kernel_id, &vdso_id);
            // live capture hook (issue 32): an ID the recording gives (a build-ID
            // MMAP2, a claim) is cached from the captured file when its own is gone.
            if let (Outcome::Found(f), Some(l)) = (&mut o, ev.live)
                && f.file.is_none()
                && g.kind == DsoKind::User
            {
                f.file = l.file_with(&f.build_id);
            }
            if o.file().is_some()
                && kept.fetch_add(1, std::sync::atomic::Ordering::Relaxed) >= budget
            {
                o = o.without_file();
            }
            o
        })
        .collect()
}

/// How many proven files may stay open: half the soft RLIMIT_NOFILE, raised first
/// to the hard limit (pdinject uses no select(), so a high limit is safe).
fn open_file_budget() -> usize {
    static BUDGET: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *BUDGET.get_or_init(|| {
        // SAFETY: plain struct filled by getrlimit; setrlimit reads it.
        let mut r: libc::rlimit = unsafe { std::mem::zeroed() };
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
            return 256;
        }
        if r.rlim_cur < r.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: r.rlim_max,
                rlim_max: r.rlim_max,
            };
            if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
                r.rlim_cur = r.rlim_max;
            }
        }
        let cur = usize::try_from(r.rlim_cur).unwrap_or(usize::MAX);
        (cur / 2).clamp(16, 1 << 16)
    })
}

fn identify_one(
    g: &Group,
    model: &Model,
    ev: &Evidence<'_>,
    kernel_id: &std::sync::OnceLock<Option<BuildId>>,
    vdso_id: &std::sync::OnceLock<Option<BuildId>>,
) -> Outcome {
    let dsos: Vec<_> = g.dsos.iter().map(|&d| &model.dsos[d as usize]).collect();
    let rec = Recorded::of(&dsos);
    let (ids, inodes, ambiguous) = (&rec.ids, &rec.inodes, rec.ambiguous);
    // Every ID the input claims for this name, the one taken first at the head.
    let own = |e: &&TableEntry| e.filename == g.name && same_space(e, g.kind);
    let table = ev.table.entries.iter().find(own);
    let streamed = ev.stream.iter().find(own);
    let mut claimed: Vec<BuildId> = table.iter().map(|e| e.build_id).collect();
    claimed.extend(ids);
    claimed.extend(ev.stream.iter().filter(own).map(|e| e.build_id));
    // live capture hook (issue 32): a file captured while it was mapped is proven
    // before the file at the path now.
    let prove = || {
        let mut plain = || prove_group(g, &dsos, inodes, ev, kernel_id, vdso_id);
        match ev.live {
            Some(l) if g.kind == DsoKind::User => l.prove_first(&dsos, &mut plain),
            _ => plain(),
        }
    };
    let claim = |o, ambiguous| check_claim(g, o, &claimed, ids, ambiguous, ev, prove);

    if let Some(e) = table {
        let mut o = Found::of(e.build_id, Source::InputTable);
        o.table = InTable::Listed;
        if ambiguous {
            o.detail = Some(
                "mapped from several files during the recording; the input's own entry is kept"
                    .into(),
            );
        }
        return claim(o, ambiguous);
    }
    if ambiguous {
        let what = rec.what();
        return Outcome::refused((
            Reason::Ambiguous,
            format!(
                "this path was mapped from different files during the recording ({what}); a path-keyed table cannot tell them apart"
            ),
        ));
    }
    if let Some(&id) = ids.first() {
        return claim(Found::of(id, Source::Mmap2), false);
    }
    if let Some(e) = streamed {
        return claim(Found::of(e.build_id, Source::InputTable), false);
    }
    if let Some((id, _)) = ev.known.iter().find(|(_, p)| *p == g.name) {
        return Outcome::found(*id, Source::Known);
    }
    prove()
}

/// What a group's DSOs' records say of the file(s) mapped at its path.
struct Recorded<'m> {
    /// The build IDs the records carry, sorted, each once.
    ids: Vec<BuildId>,
    /// The records' inode identities.
    inodes: Vec<&'m FileIdent>,
    /// Mapped from more than one file.
    ambiguous: bool,
}

impl<'m> Recorded<'m> {
    fn of(dsos: &[&'m Dso]) -> Recorded<'m> {
        let mut ids: Vec<BuildId> = dsos
            .iter()
            .filter_map(|d| match d.ident {
                FileIdent::BuildId(b) => Some(b),
                _ => None,
            })
            .collect();
        ids.sort();
        ids.dedup();
        let inodes: Vec<&FileIdent> = dsos
            .iter()
            .map(|d| &d.ident)
            .filter(|i| matches!(i, FileIdent::Inode { .. }))
            .collect();
        let inode_clash = inodes
            .iter()
            .enumerate()
            .any(|(i, a)| inodes[i + 1..].iter().any(|b| inode_conflict(a, b)));
        let ambiguous = ids.len() > 1 || inode_clash;
        Recorded {
            ids,
            inodes,
            ambiguous,
        }
    }

    /// The different files an ambiguous path was mapped from, in words.
    fn what(&self) -> String {
        if self.ids.len() > 1 {
            return format!(
                "build IDs {}",
                self.ids
                    .iter()
                    .map(|b| b.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        let mut v: Vec<String> = self
            .inodes
            .iter()
            .filter_map(|i| match i {
                FileIdent::Inode {
                    maj,
                    min,
                    ino,
                    generation: 0,
                } => Some(format!("inode {ino} on {maj}:{min}")),
                FileIdent::Inode {
                    maj,
                    min,
                    ino,
                    generation,
                } => Some(format!(
                    "inode {ino} generation {generation} on {maj}:{min}"
                )),
                _ => None,
            })
            .collect();
        v.sort();
        v.dedup();
        v.join(", ")
    }
}

/// A claim `o` of the input (its ID is one of `claimed`, the DSO's claims) checked
/// against the other claimants and, for the kernel and modules of a recording proven
/// to be of this boot, against this boot's notes. Not contradicted: `o` as it is,
/// and no file is opened (a build-ID MMAP2 recording is read without its DSOs).
/// Contradicted: `prove` (the normal proof of the DSO) decides: the same ID keeps
/// the claim, another ID replaces it, no proof refuses it.
fn check_claim(
    g: &Group,
    o: Found,
    claimed: &[BuildId],
    recorded: &[BuildId],
    ambiguous: bool,
    ev: &Evidence<'_>,
    prove: impl FnOnce() -> Outcome,
) -> Outcome {
    let id = o.build_id;
    let space = g.kind.is_kernel_space();
    let Some(c) = ev.claims.contest(space, &g.name, claimed) else {
        if o.source == Source::InputTable && !ambiguous && zero_padded(&id) {
            return check_padded(o, id, prove());
        }
        // Nothing else claims it; the kernel's and a module's ID still meet this
        // boot's notes (perf 6.17/6.18 gave each module after the first the first
        // one's ID).
        if !space || ambiguous || ev.trust.kernel.is_err() {
            return Outcome::Found(o);
        }
        return match prove() {
            Outcome::Found(mut p) if p.build_id != id => {
                let (how, n) = (proof_words(p.source), p.build_id);
                p.detail = Some(format!(
                    "the input claims {id} for it, {how} {n}: the notes are written, the claim nowhere"
                ));
                p.contradiction = Some(Contradiction {
                    claimed: id,
                    others: Vec::new(),
                    others_total: 0,
                    in_records: recorded.contains(&id),
                    verdict: Verdict::Corrected,
                });
                Outcome::Found(p)
            }
            _ => Outcome::Found(o),
        };
    };
    let also = format!(
        "the input claims {} for it and for {}",
        c.id,
        claimant_list(&c.others, c.total)
    );
    let contradiction = |verdict| {
        Some(Contradiction {
            claimed: c.id,
            others: c.others.clone(),
            others_total: c.total,
            in_records: recorded.contains(&c.id),
            verdict,
        })
    };
    let refuse = |why: &str| {
        Outcome::Refused(Refused {
            reason: Reason::ConflictingClaim,
            detail: format!("{also}, and nothing proves which is right ({why})"),
            contradiction: contradiction(Verdict::Refused),
        })
    };
    if ambiguous {
        // No one file to prove: the path was mapped from several.
        return refuse("this path was mapped from several files during the recording");
    }
    match prove() {
        Outcome::Found(p) if p.build_id == id => Outcome::Found(Found {
            detail: Some(format!("{also}; {} {id}: kept", proof_words(p.source))),
            contradiction: contradiction(Verdict::Confirmed),
            file: p.file,
            ..o
        }),
        Outcome::Found(p) => Outcome::Found(Found {
            detail: Some(format!(
                "{also}; {} {}, which is written instead",
                proof_words(p.source),
                p.build_id
            )),
            contradiction: contradiction(Verdict::Corrected),
            ..p
        }),
        Outcome::Refused(r) => refuse(&r.detail),
    }
}

/// A 20-byte ID whose last four bytes are zero: how an entry without
/// PERF_RECORD_MISC_BUILD_ID_SIZE (perf 6.1's `inject -b` writes them so) carries a
/// shorter ID (16 bytes for an MD5 or UUID build ID, 8 for lld's fast one) padded
/// with zeros. perf itself takes the zeros for padding when it compares IDs; its
/// build-ID cache and debuginfod do not, so the padded form finds nothing there. A
/// real 20-byte ID ends in four zero bytes once in 2^32.
fn zero_padded(id: &BuildId) -> bool {
    let b = id.as_bytes();
    b.len() == 20 && b[16..].iter().all(|&x| x == 0)
}

/// An input entry whose ID may be a shorter one padded to 20 bytes
/// ([`zero_padded`]), against the proof `p` of its file. The proven ID written in
/// the modern form when the claim is it padded (or when the proof contradicts the
/// claim outright); the claim as it is when nothing proves the file, as perf reads
/// it.
fn check_padded(o: Found, id: BuildId, p: Outcome) -> Outcome {
    let Outcome::Found(p) = p else {
        return Outcome::Found(o);
    };
    let n = p.build_id;
    if n == id {
        return Outcome::Found(Found { file: p.file, ..o });
    }
    let (short, rest) = id.as_bytes().split_at(n.as_bytes().len().min(20));
    let detail = if short == n.as_bytes() && rest.iter().all(|&x| x == 0) {
        format!(
            "the input's entry is {id}, the {}-byte ID padded with zeros to 20 bytes (an entry without its size); {} {n}, which is written with its size",
            n.as_bytes().len(),
            proof_words(p.source)
        )
    } else {
        format!(
            "the input claims {id} for it; {} {n}, which is written instead",
            proof_words(p.source)
        )
    };
    Outcome::Found(Found {
        detail: Some(detail),
        contradiction: Some(Contradiction {
            claimed: id,
            others: Vec::new(),
            others_total: 0,
            in_records: false,
            verdict: Verdict::Corrected,
        }),
        ..p
    })
}

/// "a, b and 3 more".
fn claimant_list(names: &[String], total: usize) -> String {
    let mut s = names.join(", ");
    if total > names.len() {
        s += &format!(" and {} more", total - names.len());
    }
    s
}

/// How a proof's source says what the ID is, in words.
fn proof_words(source: Source) -> &'static str {
    match source {
        Source::Elf => "its file, proven unchanged since the recording, has",
        Source::Symfs => "its copy under --symfs has",
        Source::KernelNotes => "this boot's /sys/kernel/notes has",
        Source::ModuleNotes => "this boot's module notes have",
        Source::Vdso => "this boot's vdso has",
        _ => "the proof gives",
    }
}

/// The ID of a group proven from a local file (or `--symfs`), or this host's
/// kernel, module or vdso notes; else why not.
fn prove_group(
    g: &Group,
    dsos: &[&crate::model::Dso],
    inodes: &[&FileIdent],
    ev: &Evidence<'_>,
    kernel_id: &std::sync::OnceLock<Option<BuildId>>,
    vdso_id: &std::sync::OnceLock<Option<BuildId>>,
) -> Outcome {
    match g.kind {
        DsoKind::User => {
            if g.name.ends_with(" (deleted)") {
                return Outcome::refused((
                    Reason::Deleted,
                    "the file was already deleted when it was mapped".into(),
                ));
            }
            let mut maps = crate::model::ExecMaps::default();
            for d in dsos {
                maps.merge(&d.exec_maps);
            }
            maps.maps.sort_unstable();
            if let Some(root) = ev.symfs {
                // A sysroot speaks for any host: the recording's own files, copied.
                let path = cache::under_root(root, &g.name);
                return match elf::prove_in_sysroot(&path, &maps, &ev.times) {
                    Ok(p) => Outcome::Found(Found {
                        file: Some(p.file),
                        ..Found::of(p.build_id, Source::Symfs)
                    }),
                    Err((r, d)) => Outcome::refused((r, format!("{} (in --symfs)", d))),
                };
            }
            if let Err(why) = &ev.trust.local {
                return Outcome::refused(why.clone());
            }
            let ident = inodes.first().map(|i| **i).unwrap_or(FileIdent::None);
            match memo::prove_and_read(
                Path::new(&g.name),
                &ident,
                &maps,
                &ev.times,
                ev.memo,
                ev.vouchers,
            ) {
                Ok(p) => Outcome::Found(Found {
                    file: Some(p.file),
                    ..Found::of(p.build_id, Source::Elf)
                }),
                Err(r) => Outcome::refused(r),
            }
        }
        DsoKind::Kernel => match &ev.trust.kernel {
            Err(why) => Outcome::refused(why.clone()),
            Ok(()) => match kernel_id.get_or_init(host::kernel_build_id) {
                Some(id) => Outcome::found(*id, Source::KernelNotes),
                None => {
                    Outcome::refused((Reason::Unreadable, "cannot read /sys/kernel/notes".into()))
                }
            },
        },
        DsoKind::Module => match &ev.trust.kernel {
            Err(why) => Outcome::refused(why.clone()),
            Ok(()) => match host::module_name(&g.name) {
                None => {
                    Outcome::refused((Reason::Unsupported, "cannot tell the module's name".into()))
                }
                Some(n) => match host::module_build_id(&n) {
                    Some(id) => Outcome::found(id, Source::ModuleNotes),
                    None => Outcome::refused((
                        Reason::Missing,
                        format!("module {n} is not loaded now (/sys/module/{n}/notes)"),
                    )),
                },
            },
        },
        DsoKind::Vdso => match &ev.trust.kernel {
            Err(why) => Outcome::refused(why.clone()),
            Ok(()) if g.name != "[vdso]" => Outcome::refused((
                Reason::Unsupported,
                format!("{} images of this kernel are not read", g.name),
            )),
            Ok(()) => match vdso_id.get_or_init(host::vdso_build_id) {
                Some(id) => Outcome::found(*id, Source::Vdso),
                None => {
                    Outcome::refused((Reason::Unreadable, "cannot read this process's vdso".into()))
                }
            },
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::record::{Mmap, misc};
    use crate::model::ModelBuilder;

    fn id(n: u8) -> BuildId {
        BuildId::new(&[n; 20], 20).expect("non-zero")
    }

    fn inode(ino: u64) -> FileIdent {
        FileIdent::Inode {
            maj: 8,
            min: 1,
            ino,
            generation: 0,
        }
    }

    /// A model of `(pid, cpumode, name, ident)` mappings.
    fn model(maps: &[(u32, u16, &str, FileIdent)]) -> Model {
        let mut b = ModelBuilder::new();
        for (i, (pid, cpumode, name, ident)) in maps.iter().enumerate() {
            let m = Mmap {
                pid: *pid,
                tid: *pid,
                start: 0x1000 * (i as u64 + 1),
                len: 0x1000,
                pgoff: 0,
                ident: *ident,
                prot: 5,
                flags: 2,
                filename: name.as_bytes(),
            };
            b.mmap(crate::model::Key::new(i as u64, i as u64), *cpumode, &m)
                .expect("within budget");
        }
        b.build()
    }

    fn entry(cpumode: u16, name: &str, id: BuildId) -> TableEntry {
        TableEntry {
            cpumode,
            build_id: id,
            filename: name.into(),
        }
    }

    #[test]
    fn one_file_under_several_names_or_processes_is_not_a_conflict() {
        let m = model(&[
            // One library in two processes.
            (1, misc::USER, "/lib/a.so", FileIdent::BuildId(id(1))),
            (2, misc::USER, "/lib/a.so", FileIdent::BuildId(id(1))),
            // One inode under two names (a hard link, a bind mount).
            (1, misc::USER, "/usr/lib/b.so", inode(7)),
            (2, misc::USER, "/lib/b.so", inode(7)),
        ]);
        let table = BuildIdTable {
            entries: vec![
                entry(misc::USER, "/usr/lib/b.so", id(2)),
                entry(misc::USER, "/lib/b.so", id(2)),
                // A module by name and by path.
                entry(misc::KERNEL, "[nf_tables]", id(3)),
                entry(misc::KERNEL, "/lib/modules/6.1/nf-tables.ko.xz", id(3)),
                // A guest is another machine.
                entry(misc::GUEST_USER, "/lib/a.so", id(2)),
            ],
            ..Default::default()
        };
        let c = Claims::gather(&m, &table, &[]);
        assert!(c.contested.is_empty(), "{c:?}");
    }

    #[test]
    fn two_files_claiming_one_id_are_contested() {
        let m = model(&[
            (1, misc::USER, "/p/plug1.so", FileIdent::BuildId(id(1))),
            (1, misc::USER, "/p/plug2.so", FileIdent::BuildId(id(1))),
            (1, misc::USER, "/p/other.so", FileIdent::BuildId(id(9))),
            // Two inodes, one ID: two files.
            (1, misc::USER, "/x/c.so", inode(1)),
            (1, misc::USER, "/y/c.so", inode(2)),
        ]);
        let table = BuildIdTable {
            entries: vec![
                entry(misc::USER, "/x/c.so", id(4)),
                entry(misc::USER, "/y/c.so", id(4)),
            ],
            ..Default::default()
        };
        let stream = [
            entry(misc::KERNEL, "[mod_a]", id(5)),
            entry(misc::KERNEL, "[mod_b]", id(5)),
        ];
        let c = Claims::gather(&m, &table, &stream);
        let others = |space, name: &str, i| {
            c.contest(space, name, &[id(i)])
                .map(|x| x.others)
                .unwrap_or_default()
        };
        assert_eq!(others(false, "/p/plug2.so", 1), ["/p/plug1.so"]);
        assert_eq!(others(false, "/p/plug1.so", 1), ["/p/plug2.so"]);
        assert!(others(false, "/p/other.so", 9).is_empty());
        assert!(!c.is_contested(false, "/p/other.so"));
        assert_eq!(others(false, "/x/c.so", 4), ["/y/c.so"]);
        assert_eq!(others(true, "[mod_b]", 5), ["[mod_a]"]);
        assert!(c.is_contested(true, "[mod_a]"));
        // Only the contested one of a DSO's claims counts.
        let x = c.contest(false, "/p/plug2.so", &[id(8), id(1)]).unwrap();
        assert_eq!((x.id, x.total), (id(1), 1));
    }

    #[test]
    fn a_zero_padded_entry_gives_way_to_its_proven_short_id() {
        let short = BuildId::from_hex("11223344556677889900aabbccddeeff").expect("hex");
        let padded = BuildId::from_hex(&format!("{short}00000000")).expect("hex");
        assert!(zero_padded(&padded) && !zero_padded(&short) && !zero_padded(&id(1)));
        let claim = Found::of(padded, Source::InputTable);
        // Proven: the short ID, with its size; the input's entry is not passed on.
        let o = check_padded(claim.clone(), padded, Outcome::found(short, Source::Elf));
        assert_eq!((o.build_id(), o.source()), (Some(short), Some(Source::Elf)));
        let c = o.contradiction().expect("the padded entry is replaced");
        assert_eq!((c.claimed, c.verdict), (padded, Verdict::Corrected));
        // Nothing proves the file: the claim as the input makes it.
        let none = Outcome::refused((Reason::OtherHost, "elsewhere".into()));
        let o = check_padded(claim.clone(), padded, none);
        assert_eq!(o.build_id(), Some(padded));
        assert!(o.contradiction().is_none());
        // A proof of the padded ID itself keeps it.
        let o = check_padded(claim, padded, Outcome::found(padded, Source::Elf));
        assert!(o.build_id() == Some(padded) && o.contradiction().is_none());
    }

    #[test]
    fn a_long_list_of_claimants_is_cut() {
        let names: Vec<String> = (0..20).map(|i| format!("[mod_{i:02}]")).collect();
        let stream: Vec<TableEntry> = names
            .iter()
            .map(|n| entry(misc::KERNEL, n, id(1)))
            .collect();
        let c = Claims::gather(&model(&[]), &BuildIdTable::default(), &stream);
        let x = c.contest(true, "[mod_00]", &[id(1)]).unwrap();
        assert_eq!(x.total, 19);
        assert_eq!(x.others.len(), NAMED_CLAIMANTS);
        assert_eq!(
            claimant_list(&x.others, x.total),
            "[mod_01], [mod_02], [mod_03], [mod_04], [mod_05], [mod_06], [mod_07], [mod_08] and 11 more"
        );
    }
}
