//! perf's build-ID cache (`~/.debug`, perf-format.md §5): after identify, every DSO
//! that got an ID is added the way `perf inject -b` adds it, so that `perf report`
//! finds the file by ID on this machine (the vdso has no other place to be found)
//! and, through `--archive`, on another.
//!
//! Layout (perf's, checked against `perf --buildid-dir DIR inject -b`):
//! `PATH/ID/elf` (hard link, else copy), `PATH/ID/debug` (the separate debug file of
//! /usr/lib/debug/.build-id), `PATH/ID/probes` (SDT probe cache; empty for files
//! without SDT notes), `[kernel.kallsyms]/ID/kallsyms` (copy of /proc/kallsyms),
//! `[vdso]/ID/vdso` (+ empty `probes`), and `.build-id/xx/rest -> ../../PATH/ID`.
//!
//! Every name is created under a temporary name and renamed into place without
//! replacing (renameat2 RENAME_NOREPLACE), files before the `.build-id` link that
//! makes perf look at them: concurrent runs and a kill at any moment leave only
//! complete entries (at worst a stray `.NAME.pdinject-*.tmp` file perf ignores).
//! The file linked or copied is the open file whose note was read (the proven one),
//! through /proc/self/fd, never the path opened again. Each hard link of a DSO is
//! recorded in the cache's link record (`.pdinject-links`, see [`super::vouch`]).

use super::elf::{open_regular, read_build_id};
use super::{Group, HostTrust, Outcome, Source, host};
use crate::format::buildid::BuildId;
use crate::model::DsoKind;
use rayon::prelude::*;
use std::ffi::CString;
use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Where and how to fill the cache.
#[derive(Clone, Debug, Default)]
pub struct BuildIdCache {
    /// The cache directory (perf's buildid_dir).
    pub dir: PathBuf,
    /// `--symfs`: files (and separate debug files) are looked up under this root.
    pub symfs: Option<PathBuf>,
    /// debuginfod servers (`--debuginfod`, `DEBUGINFOD_URLS`) for IDs whose file is
    /// not on this machine.
    pub debuginfod: Vec<String>,
}

impl BuildIdCache {
    /// perf's choice of the cache directory: `--buildid-dir`, else `buildid.dir` of
    /// perfconfig ($HOME/.perfconfig over /etc/perfconfig), else `$HOME/.debug`.
    pub fn locate(flag: Option<&Path>) -> Result<PathBuf, String> {
        if let Some(d) = flag {
            return Ok(d.to_path_buf());
        }
        let home = std::env::var_os("HOME").map(PathBuf::from);
        let dir = crate::perfconfig::value("buildid", "dir");
        if let Some(v) = dir {
            return Ok(match (v.strip_prefix("~/"), &home) {
                (Some(rest), Some(h)) => h.join(rest),
                _ => PathBuf::from(v),
            });
        }
        // Without HOME perf uses `.debug` in the current directory; so does pdinject.
        Ok(home.map_or_else(|| PathBuf::from(".debug"), |h| h.join(".debug")))
    }
}

/// What happened to one DSO's cache entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CacheState {
    /// Added by this run.
    Added,
    /// Already in the cache: nothing copied.
    Present,
    /// Fetched from a debuginfod server by this run.
    Fetched,
    /// Not in the cache (the detail says why).
    NotCached,
}

/// The cache outcome of one group.
#[derive(Clone, Debug)]
pub(crate) struct CacheResult {
    /// Name of the DSO.
    pub name: String,
    /// Kernel space (the table's address space).
    pub kernel_space: bool,
    /// What happened.
    pub state: CacheState,
    /// The entry's directory relative to the cache (`usr/lib/libc.so.6/ID`).
    pub entry: Option<String>,
    /// Why not, or what failed.
    pub detail: Option<String>,
}

/// What [`fill`] did, one result per group that had an ID.
#[derive(Clone, Debug, Default)]
pub(crate) struct CacheSummary {
    /// Per group with an ID.
    pub results: Vec<CacheResult>,
}

/// Run totals of the build-ID cache (in the report).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct CacheTotals {
    /// The cache directory.
    pub dir: String,
    /// Entries added.
    pub added: usize,
    /// Entries already present.
    pub present: usize,
    /// Entries fetched from debuginfod.
    pub fetched: usize,
    /// DSOs with an ID that are not in the cache.
    pub not_cached: usize,
}

impl CacheTotals {
    /// The totals of the cache at `dir` from what happened to each DSO's entry.
    pub(crate) fn of(
        dir: &Path,
        states: impl IntoIterator<Item = Option<CacheState>>,
    ) -> CacheTotals {
        let mut t = CacheTotals {
            dir: dir.display().to_string(),
            ..CacheTotals::default()
        };
        for s in states {
            match s {
                Some(CacheState::Added) => t.added += 1,
                Some(CacheState::Present) => t.present += 1,
                Some(CacheState::Fetched) => t.fetched += 1,
                Some(CacheState::NotCached) => t.not_cached += 1,
                None => {}
            }
        }
        t
    }
}

/// Whether a DSO's cache detail says the cache itself cannot be written: worth a
/// note for the whole run (the per-DSO details say the rest: other builds, other
/// boots, files not here).
pub(crate) fn is_unwritable(detail: &str) -> bool {
    detail.starts_with("cannot create") || detail.starts_with("cannot write")
}

/// /proc/kallsyms read ahead, beside the stages ([`prefetch_kallsyms`]).
static KALLSYMS: std::sync::Mutex<Option<std::thread::JoinHandle<std::io::Result<Vec<u8>>>>> =
    std::sync::Mutex::new(None);

/// Starts reading /proc/kallsyms on a thread of its own when this kernel's entry is
/// missing from `cache`: the kernel generates its 5 MB in 30–60 ms of CPU, which
/// then overlaps scan and resolve instead of adding to the run. Called only for a
/// recording that names this host and kernel release (the entry is written only if
/// the recording is then proven to be of this boot).
pub(crate) fn prefetch_kallsyms(cache: &BuildIdCache) {
    let Some(id) = host::kernel_build_id() else {
        return;
    };
    let entry = cache
        .dir
        .join("[kernel.kallsyms]")
        .join(id.to_string())
        .join("kallsyms");
    if exists(&entry) {
        return;
    }
    if let Ok(mut slot) = KALLSYMS.lock()
        && slot.is_none()
    {
        *slot = Some(std::thread::spawn(|| std::fs::read("/proc/kallsyms")));
    }
}

/// /proc/kallsyms: what [`prefetch_kallsyms`] read, or read now.
fn kallsyms() -> std::io::Result<Vec<u8>> {
    let ahead = KALLSYMS.lock().ok().and_then(|mut s| s.take());
    match ahead.map(std::thread::JoinHandle::join) {
        Some(Ok(r)) => r,
        _ => std::fs::read("/proc/kallsyms"),
    }
}

/// Adds every group with an ID to the cache, in parallel on the current rayon pool.
pub(crate) fn fill(
    cache: &BuildIdCache,
    groups: &[Group],
    outcomes: &[Outcome],
    trust: &HostTrust,
) -> CacheSummary {
    let results = groups
        .par_iter()
        .zip(outcomes.par_iter())
        .filter_map(|(g, o)| {
            let id = o.build_id()?;
            let r = add(cache, g, o, id, trust);
            let (state, entry, detail) = match r {
                Ok((state, entry)) => (state, Some(entry), None),
                Err(why) => (CacheState::NotCached, None, Some(why)),
            };
            Some(CacheResult {
                name: g.name.clone(),
                kernel_space: g.kind.is_kernel_space(),
                state,
                entry,
                detail,
            })
        })
        .collect();
    CacheSummary { results }
}

/// `root` + an absolute recorded path.
pub(crate) fn under_root(root: &Path, name: &str) -> PathBuf {
    root.join(name.trim_start_matches('/'))
}

/// The hex of an ID split as perf's `.build-id/xx/rest` link.
fn link_name(id: &BuildId) -> PathBuf {
    let hex = id.to_string();
    let (a, b) = hex.split_at(2.min(hex.len()));
    Path::new(".build-id").join(a).join(b)
}

/// A recorded path as a directory name inside the cache: absolute, without `.` or
/// `..` components (a recording must not make pdinject write outside the cache).
fn cache_rel(name: &str) -> Result<PathBuf, String> {
    let p = Path::new(name);
    if !p.is_absolute() {
        return Err(format!("'{name}' is not an absolute path"));
    }
    let mut rel = PathBuf::new();
    for c in p.components() {
        match c {
            Component::RootDir => {}
            Component::Normal(n) => rel.push(n),
            _ => return Err(format!("'{name}' has . or .. components")),
        }
    }
    if rel.as_os_str().is_empty() {
        return Err(format!("'{name}' names no file"));
    }
    Ok(rel)
}

/// Where a DSO's entry goes and what it holds.
enum Content {
    /// An open ELF file (its note read and equal to the ID): linked or copied.
    File(Arc<File>),
    /// Bytes made here (kallsyms, the vdso image, a debuginfod download).
    Bytes(Vec<u8>, u32),
}

fn add(
    cache: &BuildIdCache,
    g: &Group,
    o: &Outcome,
    id: BuildId,
    trust: &HostTrust,
) -> Result<(CacheState, String), String> {
    let hex = id.to_string();
    if hex.len() < 4 {
        // .build-id/xx/rest needs a rest; perf's shortest accepted ID is longer.
        return Err(format!("build ID {hex} is too short for the cache"));
    }
    let e = Entry {
        cache,
        g,
        o,
        id,
        hex,
    };
    match g.kind {
        DsoKind::Kernel => e.kernel(trust),
        DsoKind::Vdso => e.vdso(trust),
        DsoKind::Module | DsoKind::User => e.file(),
    }
}

/// One DSO's cache entry being added: what each kind's way of adding it reads.
struct Entry<'a> {
    cache: &'a BuildIdCache,
    g: &'a Group,
    o: &'a Outcome,
    id: BuildId,
    hex: String,
}

impl Entry<'_> {
    fn kernel(&self, trust: &HostTrust) -> Result<(CacheState, String), String> {
        let (cache, g, id) = (self.cache, self.g, self.id);
        if g.name != "[kernel.kallsyms]" {
            return Err(format!("{} is not this host's kernel image", g.name));
        }
        let this_boot = self.o.source() == Some(Source::KernelNotes)
            || (trust.kernel.is_ok() && host::kernel_build_id() == Some(id));
        if !this_boot {
            return Err(
                "the recorded kernel is not proven to be this boot's: its /proc/kallsyms would be wrong"
                    .into(),
            );
        }
        let rel = PathBuf::from("[kernel.kallsyms]").join(&self.hex);
        let dir = cache.dir.join(&rel);
        let target = dir.join("kallsyms");
        let state = if exists(&target) {
            CacheState::Present
        } else {
            let data = kallsyms().map_err(|e| format!("cannot read /proc/kallsyms: {e}"))?;
            mkdir(&dir)?;
            place(&target, &Content::Bytes(data, 0o755))?
        };
        self.linked(state, rel)
    }

    fn vdso(&self, trust: &HostTrust) -> Result<(CacheState, String), String> {
        let (cache, g, id) = (self.cache, self.g, self.id);
        if g.name != "[vdso]" {
            return Err(format!("{} images are not cached", g.name));
        }
        let this_boot = self.o.source() == Some(Source::Vdso)
            || (trust.kernel.is_ok() && host::vdso_build_id() == Some(id));
        if !this_boot && cache.debuginfod.is_empty() {
            return Err(
                "the recording is not proven to be of this host and boot: this process's vdso may differ"
                    .into(),
            );
        }
        let rel = PathBuf::from("[vdso]").join(&self.hex);
        let dir = cache.dir.join(&rel);
        let target = dir.join("vdso");
        let state = if exists(&target) {
            CacheState::Present
        } else if !this_boot {
            // Another boot's vdso: the image a symbol store holds for the ID
            // (docs/store.md), checked to carry it.
            let data = super::debuginfod::fetch(&cache.debuginfod, &id).map_err(|e| {
                format!("the recording is not of this boot and its vdso image could not be fetched: debuginfod: {e}")
            })?;
            mkdir(&dir)?;
            place(&target, &Content::Bytes(data, 0o600))?;
            CacheState::Fetched
        } else {
            let img = host::vdso_image().ok_or("cannot read this process's vdso")?;
            // The image written is the one whose ID is checked here.
            if super::elf::build_id_of_image(img).ok() != Some(id) {
                return Err("this process's vdso has another build ID".into());
            }
            mkdir(&dir)?;
            // perf writes the image with mkstemp (0600) and links it.
            place(&target, &Content::Bytes(img.to_vec(), 0o600))?
        };
        probes(&dir, None)?;
        self.linked(state, rel)
    }

    /// A user DSO's or module's entry.
    fn file(&self) -> Result<(CacheState, String), String> {
        let (cache, g, id) = (self.cache, self.g, self.id);
        let module = g.kind == DsoKind::Module;
        let rel = cache_rel(&self.entry_name()?)?.join(&self.hex);
        let dir = cache.dir.join(&rel);
        let target = dir.join("elf");
        let (state, file_for_probes) = if exists(&target) {
            (CacheState::Present, None)
        } else {
            self.place_elf(&dir, &target, module)?
        };
        if !module && !g.name.ends_with(".ko") {
            debug_file(cache, &id, &dir)?;
            if state == CacheState::Fetched {
                super::store::fetch_debug_into_cache(&cache.debuginfod, &id, &target, &dir)
                    .map(|data| place(&dir.join("debug"), &Content::Bytes(data, 0o644)))
                    .transpose()?;
            }
        }
        if !exists(&dir.join("probes")) {
            let f = match file_for_probes {
                Some(f) => Some(f),
                None => open_regular(&target).ok().map(|(f, _)| Arc::new(f)),
            };
            probes(&dir, f.as_deref())?;
        }
        self.linked(state, rel)
    }

    /// The recorded path the entry's directory is named by.
    fn entry_name(&self) -> Result<String, String> {
        let g = self.g;
        if !g.name.starts_with('/') {
            Err(format!(
                "'{}' names no file (perf caches files by path)",
                g.name
            ))
        } else if self.cache.symfs.is_some() {
            // The recorded path: this machine's symlinks say nothing about the
            // sysroot's.
            Ok(g.name.clone())
        } else {
            // perf names the entry by the path's realpath on this machine.
            Ok(std::fs::canonicalize(&g.name)
                .ok()
                .and_then(|p| p.to_str().map(String::from))
                .unwrap_or_else(|| g.name.clone()))
        }
    }

    /// Puts the ELF file at `target` in the new entry `dir`: the file found, else one
    /// fetched. Also the file found, open, for the probes.
    fn place_elf(
        &self,
        dir: &Path,
        target: &Path,
        module: bool,
    ) -> Result<(CacheState, Option<Arc<File>>), String> {
        let (cache, id) = (self.cache, self.id);
        let (content, fetched) = match find_file(cache, self.g, self.o, id) {
            Ok(f) => (Content::File(f), false),
            Err(why) if cache.debuginfod.is_empty() || module => return Err(why),
            Err(why) => {
                let data = super::debuginfod::fetch(&cache.debuginfod, &id)
                    .map_err(|e| format!("{why}; debuginfod: {e}"))?;
                (Content::Bytes(data, 0o755), true)
            }
        };
        mkdir(dir)?;
        let placed = match &content {
            // A hard link moves the file's ctime: the link record says it was
            // this link (what lets a later run prove the file; vouch.rs).
            Content::File(f) => {
                super::vouch::record_link(&cache.dir, f, id, || place(target, &content))?
            }
            Content::Bytes(..) => place(target, &content)?,
        };
        let state = if fetched { CacheState::Fetched } else { placed };
        match content {
            Content::File(f) => Ok((state, Some(f))),
            Content::Bytes(..) => Ok((state, None)),
        }
    }

    /// Links the entry at `rel` under the ID's name; the result [`add`] returns.
    fn linked(&self, state: CacheState, rel: PathBuf) -> Result<(CacheState, String), String> {
        link(self.cache, &self.id, &rel)?;
        Ok((state, rel.display().to_string()))
    }
}

/// The file holding `id` for a user DSO or module: the proven file, else the file at
/// the path (under `--symfs` when given) if its note carries exactly this ID.
fn find_file(
    cache: &BuildIdCache,
    g: &Group,
    o: &Outcome,
    id: BuildId,
) -> Result<Arc<File>, String> {
    if let Some(f) = o.file() {
        return Ok(f.clone());
    }
    let path = match &cache.symfs {
        Some(root) => under_root(root, &g.name),
        None => PathBuf::from(&g.name),
    };
    let (f, _) = open_regular(&path).map_err(|(_, d)| format!("{}: {d}", path.display()))?;
    let found = if g.name.ends_with(".ko.zst") {
        // perf caches a compressed module as it is (it decompresses when reading);
        // its ID is checked on the decompressed image.
        compressed_module_id(&f)
    } else if [".ko.xz", ".ko.gz"].iter().any(|s| g.name.ends_with(s)) {
        return Err(format!(
            "{}: xz/gzip-compressed modules are not read, so their ID cannot be checked",
            path.display()
        ));
    } else {
        read_build_id(&f)
    };
    match found {
        Ok(found) if found == id => Ok(Arc::new(f)),
        Ok(found) => Err(format!(
            "{} has build ID {found}, not the recorded {id}: the recorded file is not on this machine",
            path.display()
        )),
        Err((_, d)) => Err(format!("{}: {d}", path.display())),
    }
}

/// The build ID of a zstd-compressed module (at most 256 MiB decompressed).
fn compressed_module_id(f: &File) -> Result<BuildId, (super::Reason, String)> {
    use std::io::Read;
    let unreadable = |e: String| (super::Reason::Unreadable, e);
    let mut dec = zstd::stream::read::Decoder::new(f).map_err(|e| unreadable(e.to_string()))?;
    let mut image = Vec::new();
    (&mut dec)
        .take(256 << 20)
        .read_to_end(&mut image)
        .map_err(|e| unreadable(format!("cannot decompress: {e}")))?;
    super::elf::build_id_of_image(&image)
}

/// Links `/usr/lib/debug/.build-id/xx/rest.debug` (under --symfs when given) as
/// `debug`, as perf does, when it exists and carries the ID.
fn debug_file(cache: &BuildIdCache, id: &BuildId, dir: &Path) -> Result<(), String> {
    let target = dir.join("debug");
    if exists(&target) {
        return Ok(());
    }
    let hex = id.to_string();
    if hex.len() < 3 {
        return Ok(());
    }
    let rel = format!("usr/lib/debug/.build-id/{}/{}.debug", &hex[..2], &hex[2..]);
    let path = match &cache.symfs {
        Some(root) => root.join(&rel),
        None => Path::new("/").join(&rel),
    };
    let Ok((f, _)) = open_regular(&path) else {
        return Ok(());
    };
    if read_build_id(&f).ok() != Some(*id) {
        return Ok(());
    }
    place(&target, &Content::File(Arc::new(f))).map(|_| ())
}

/// The `probes` file: perf's SDT probe cache, empty for a file without SDT notes.
/// A file with SDT notes gets none (pdinject does not write perf's probe lines;
/// `perf probe` makes them when asked, and report does not read them).
fn probes(dir: &Path, file: Option<&File>) -> Result<(), String> {
    let target = dir.join("probes");
    if exists(&target) {
        return Ok(());
    }
    if let Some(f) = file {
        let rc = super::elf::reader(f);
        if let Ok(elf) = super::elf::Elf::parse(&rc)
            && elf.section(b".note.stapsdt").is_some()
        {
            return Ok(());
        }
    }
    place(&target, &Content::Bytes(Vec::new(), 0o644)).map(|_| ())
}

/// `.build-id/xx/rest -> ../../REL`, unless a link is there already.
fn link(cache: &BuildIdCache, id: &BuildId, rel: &Path) -> Result<(), String> {
    let name = cache.dir.join(link_name(id));
    if std::fs::symlink_metadata(&name).is_ok() {
        return Ok(());
    }
    let parent = name.parent().ok_or("no link directory")?;
    mkdir(parent)?;
    let tmp = tmp_name(&name);
    let target = Path::new("../..").join(rel);
    std::os::unix::fs::symlink(&target, &tmp)
        .map_err(|e| format!("cannot create {}: {e}", tmp.display()))?;
    commit(&tmp, &name).map(|_| ())
}

fn exists(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_ok()
}

/// `mkdir -p` with perf's mode (0755, less the umask). An entry directory that is a
/// regular file is perf's pre-2016 layout, which perf removes when it adds the ID.
fn mkdir(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::DirBuilderExt;
    if std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_file()) {
        let _ = std::fs::remove_file(dir);
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)
        .map_err(|e| format!("cannot create {}: {e}", dir.display()))
}

fn tmp_name(target: &Path) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let base = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    target.with_file_name(format!(
        ".{base}.pdinject-{}-{}.tmp",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ))
}

/// Removes the temp files a killed run left for `target`: their process is gone and
/// they are over ten minutes old (a process of another PID namespace sharing the
/// cache may have the same number; its file is young).
fn remove_stale_temps(target: &Path) {
    let (Some(dir), Some(base)) = (target.parent(), target.file_name()) else {
        return;
    };
    let prefix = format!(".{}.pdinject-", base.to_string_lossy());
    let Ok(list) = std::fs::read_dir(dir) else {
        return;
    };
    for e in list.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        let Some(rest) = name.strip_prefix(&prefix) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<i32>().ok()) else {
            continue;
        };
        // SAFETY: signal 0 only asks whether the process exists.
        let alive = unsafe { libc::kill(pid, 0) } == 0
            || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
        let old = e
            .metadata()
            .ok()
            .and_then(|m| m.modified().ok())
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|d| d.as_secs() > 600);
        if !alive && old {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

fn cstr(p: &Path) -> Result<CString, String> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| format!("{} has a NUL byte", p.display()))
}

/// Test hook for the crash-safety test: `PDINJECT_TEST_CACHE_ABORT=N` ends the
/// process with SIGKILL right before its N-th commit (a temp file written, not yet
/// renamed), the state a `kill -9` can leave at any moment. Built only with the
/// `test-hooks` feature (`cargo test` turns it on; a release build lacks it).
#[cfg(feature = "test-hooks")]
fn crash_point() {
    static AT: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    static DONE: AtomicU64 = AtomicU64::new(0);
    if let Some(n) = *AT.get_or_init(|| {
        std::env::var("PDINJECT_TEST_CACHE_ABORT")
            .ok()
            .and_then(|v| v.parse().ok())
    }) && DONE.fetch_add(1, Ordering::SeqCst) + 1 == n
    {
        // SAFETY: kill(2) on our own pid.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    }
}

#[cfg(not(feature = "test-hooks"))]
fn crash_point() {}

/// Moves `tmp` to `target` unless `target` exists (another run won: its entry is
/// complete too, and this one is dropped). Added when this run's copy went in.
fn commit(tmp: &Path, target: &Path) -> Result<CacheState, String> {
    crash_point();
    let (a, b) = (cstr(tmp)?, cstr(target)?);
    // SAFETY: two NUL-terminated paths.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if r == 0 {
        return Ok(CacheState::Added);
    }
    let e = std::io::Error::last_os_error();
    let res = match e.raw_os_error() {
        Some(libc::EEXIST) => Ok(CacheState::Present),
        // A filesystem without RENAME_NOREPLACE: link(2) never replaces either.
        Some(libc::EINVAL) => match std::fs::hard_link(tmp, target) {
            Ok(()) => Ok(CacheState::Added),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(CacheState::Present),
            Err(e) => Err(format!("cannot create {}: {e}", target.display())),
        },
        _ => Err(format!("cannot create {}: {e}", target.display())),
    };
    let _ = std::fs::remove_file(tmp);
    res
}

/// Writes `content` under a temp name next to `target` and commits it.
fn place(target: &Path, content: &Content) -> Result<CacheState, String> {
    remove_stale_temps(target);
    let tmp = tmp_name(target);
    // A run killed by SIGINT, SIGTERM or SIGHUP removes it (a SIGKILL leaves it to a
    // later run's sweep).
    let slot = crate::signals::watch(&tmp, false);
    let made = match content {
        Content::File(f) => link_fd(f, &tmp).or_else(|_| copy_fd(f, &tmp)),
        Content::Bytes(data, mode) => write_new(&tmp, *mode, |w| w.write_all(data)),
    };
    let r = match made {
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(format!("cannot write {}: {e}", tmp.display()))
        }
        Ok(()) => {
            crate::signals::hooks::pause("cache");
            commit(&tmp, target)
        }
    };
    if let Some(slot) = slot {
        crate::signals::unwatch(slot);
    }
    r
}

/// A hard link to the open file itself (perf's choice: no copy, same inode),
/// through /proc/self/fd so that the path is not looked up again.
fn link_fd(f: &File, tmp: &Path) -> std::io::Result<()> {
    let src = CString::new(format!("/proc/self/fd/{}", f.as_raw_fd()))
        .map_err(|_| std::io::Error::other("fd path"))?;
    let dst = CString::new(tmp.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
    // SAFETY: two NUL-terminated paths.
    let r = unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            src.as_ptr(),
            libc::AT_FDCWD,
            dst.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// A copy of the open file's bytes (another filesystem, or hard links refused),
/// read at explicit offsets so the file position of other readers is untouched.
fn copy_fd(f: &File, tmp: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let len = f.metadata()?.len();
    write_new(tmp, 0o755, |w| {
        let mut buf = vec![0u8; 1 << 20];
        let mut off = 0u64;
        while off < len {
            let n = f.read_at(&mut buf, off)?;
            if n == 0 {
                break;
            }
            w.write_all(&buf[..n])?;
            off += n as u64;
        }
        Ok(())
    })
}

fn write_new(
    tmp: &Path,
    mode: u32,
    fill: impl FnOnce(&mut std::io::BufWriter<&File>) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(tmp)?;
    {
        let mut w = std::io::BufWriter::with_capacity(1 << 20, &f);
        fill(&mut w)?;
        w.flush()?;
    }
    // The mode perf gives, whatever the umask.
    f.set_permissions(std::fs::Permissions::from_mode(mode))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zstd_module_id_is_read_from_the_decompressed_image() {
        let exe = File::open("/proc/self/exe").unwrap();
        // Linux toolchains link with --build-id; without one there is nothing to
        // compare, and the test says so instead of passing.
        let id = read_build_id(&exe).expect("this test binary has a build ID");
        let data = std::fs::read("/proc/self/exe").unwrap();
        let z = zstd::encode_all(&data[..], 1).unwrap();
        let p = std::env::temp_dir().join(format!("pdinject-zst-{}.ko.zst", std::process::id()));
        std::fs::write(&p, z).unwrap();
        let f = File::open(&p).unwrap();
        assert_eq!(compressed_module_id(&f).ok(), Some(id));
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn relative_names() {
        assert_eq!(
            cache_rel("/usr/lib/x.so").unwrap(),
            PathBuf::from("usr/lib/x.so")
        );
        assert!(cache_rel("/usr/../etc/x").is_err());
        assert!(cache_rel("x").is_err());
        assert!(cache_rel("/").is_err());
    }
}
