//! The identify stage: for each distinct hit DSO, find its build ID from the sources in
//! order, or say why there is none. Every answer carries its provenance.
//!
//! Sources, in order: build-ID MMAP2 records (they name the exact mapping); the
//! input's own table and HEADER_BUILD_ID records; `--known-build-ids`; the ELF note of
//! a file proven to be the mapped one; the kernel, module and vdso notes of this host
//! when the recording is proven to be of this host and boot.

pub mod archive;
pub mod cache;
pub mod debuginfod;
pub mod elf;
pub mod host;
pub mod memo;

use crate::format::buildid::{BuildId, BuildIdTable, TableEntry};
use crate::format::record::FileIdent;
use crate::model::{DsoId, DsoKind, Model};
pub use elf::{Reason, RecordingStart, Refusal};
use host::HostInfo;
use rayon::prelude::*;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

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
}

/// The DSOs of one build-ID table entry: one name in one address space.
#[derive(Clone, Debug)]
pub struct Group {
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
    pub fn is_code(&self, model: &Model) -> bool {
        self.kind != DsoKind::User
            || self.dsos.iter().any(|&d| {
                model
                    .dsos
                    .get(d as usize)
                    .is_some_and(|d| !d.exec_maps.is_empty())
            })
    }
}

/// The answer for one group.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// The ID, if one is known for certain.
    pub build_id: Option<BuildId>,
    /// Where it came from.
    pub source: Option<Source>,
    /// Why there is none.
    pub reason: Option<Reason>,
    /// Words for the user.
    pub detail: Option<String>,
    /// The input's table already lists this name (its entry is kept verbatim).
    pub in_input_table: bool,
    /// The file the ID was read from, still open ([`Source::Elf`], [`Source::Symfs`]):
    /// the build-ID cache links or copies this very file, never the path again.
    pub file: Option<Arc<File>>,
}

impl Outcome {
    fn found(id: BuildId, source: Source) -> Self {
        Outcome {
            build_id: Some(id),
            source: Some(source),
            ..Default::default()
        }
    }
    fn refused((reason, detail): Refusal) -> Self {
        Outcome {
            reason: Some(reason),
            detail: Some(detail),
            ..Default::default()
        }
    }
}

/// Whether the recording's host, and its kernel, are this machine's.
#[derive(Clone, Debug)]
pub struct HostTrust {
    /// Local files may be opened (same hostname and kernel release), or the reason
    /// every local file is refused for (another host; a recording nothing dates).
    pub local: Result<(), Refusal>,
    /// The kernel, modules and vdso of this boot are the recorded ones.
    pub kernel: Result<(), Refusal>,
}

impl HostTrust {
    /// Decides from the recording's HOSTNAME, OSRELEASE and kernel reference map.
    pub fn decide(
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
pub struct Evidence<'a> {
    /// The input's BUILD_ID table.
    pub table: &'a BuildIdTable,
    /// HEADER_BUILD_ID records in the input's data.
    pub stream: &'a [TableEntry],
    /// `--known-build-ids`.
    pub known: &'a [(BuildId, String)],
    /// Host trust.
    pub trust: &'a HostTrust,
    /// When the recording ran.
    pub times: RecordingStart,
    /// `--symfs`: user DSOs are read under this sysroot instead of `/`.
    pub symfs: Option<&'a Path>,
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
pub fn identify(groups: &[Group], model: &Model, ev: &Evidence<'_>) -> Vec<Outcome> {
    let kernel_id = std::sync::OnceLock::new();
    let vdso_id = std::sync::OnceLock::new();
    // Proven files stay open for the build-ID cache, within half the descriptor limit;
    // past it a DSO's file is closed and the cache reopens the path, caching it only
    // if its note carries the same ID.
    let budget = open_file_budget();
    let kept = std::sync::atomic::AtomicUsize::new(0);
    groups
        .par_iter()
        .map(|g| {
            let mut o = identify_one(g, model, ev, &kernel_id, &vdso_id);
            if o.file.is_some() && kept.fetch_add(1, std::sync::atomic::Ordering::Relaxed) >= budget
            {
                o.file = None;
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

    if let Some(e) = ev
        .table
        .entries
        .iter()
        .find(|e| e.filename == g.name && same_space(e, g.kind))
    {
        let mut o = Outcome::found(e.build_id, Source::InputTable);
        o.in_input_table = true;
        if ambiguous {
            o.detail = Some(
                "mapped from several files during the recording; the input's own entry is kept"
                    .into(),
            );
        }
        return o;
    }
    if ambiguous {
        let what = if ids.len() > 1 {
            format!(
                "build IDs {}",
                ids.iter()
                    .map(|b| b.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        } else {
            let mut v: Vec<String> = inodes
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
        };
        return Outcome::refused((
            Reason::Ambiguous,
            format!(
                "this path was mapped from different files during the recording ({what}); a path-keyed table cannot tell them apart"
            ),
        ));
    }
    if let Some(&id) = ids.first() {
        return Outcome::found(id, Source::Mmap2);
    }
    if let Some(e) = ev
        .stream
        .iter()
        .find(|e| e.filename == g.name && same_space(e, g.kind))
    {
        return Outcome::found(e.build_id, Source::InputTable);
    }
    if let Some((id, _)) = ev.known.iter().find(|(_, p)| *p == g.name) {
        return Outcome::found(*id, Source::Known);
    }
    match g.kind {
        DsoKind::User => {
            if g.name.ends_with(" (deleted)") {
                return Outcome::refused((
                    Reason::Deleted,
                    "the file was already deleted when it was mapped".into(),
                ));
            }
            let mut maps = crate::model::ExecMaps::default();
            for d in &dsos {
                maps.merge(&d.exec_maps);
            }
            maps.maps.sort_unstable();
            if let Some(root) = ev.symfs {
                // A sysroot speaks for any host: the recording's own files, copied.
                let path = cache::under_root(root, &g.name);
                return match elf::prove_in_sysroot(&path, &maps, &ev.times) {
                    Ok(p) => {
                        let mut o = Outcome::found(p.build_id, Source::Symfs);
                        o.file = Some(p.file);
                        o
                    }
                    Err((r, d)) => Outcome::refused((r, format!("{} (in --symfs)", d))),
                };
            }
            if let Err(why) = &ev.trust.local {
                return Outcome::refused(why.clone());
            }
            let ident = inodes.first().map(|i| **i).unwrap_or(FileIdent::None);
            match elf::prove_and_read(Path::new(&g.name), &ident, &maps, &ev.times) {
                Ok(p) => {
                    let mut o = Outcome::found(p.build_id, Source::Elf);
                    o.file = Some(p.file);
                    o
                }
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
