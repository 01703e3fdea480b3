//! `--symbol-store DIR`: a build-ID symbol store for a fleet (docs/store.md). Every
//! DSO a run proves goes into DIR once per build ID, laid out as
//! `DIR/.build-id/xx/rest` (the file itself: what `debuginfod -F DIR` serves as
//! `/buildid/ID/executable`) and `DIR/.build-id/xx/rest.debug` (its separate debug
//! info, served as `/buildid/ID/debuginfo`). debuginfod classifies the files it scans
//! by content, not by name (measured with elfutils 0.188: an unstripped file is
//! served as both, a stripped one as executable, an `--only-keep-debug` file as
//! debuginfo, a vdso image as executable, a `.ko` (ET_REL) only as debuginfo and
//! only when it has debug sections, a compressed `.ko.zst`/`.ko.xz` not at all); the
//! names are the ones gdb's `debug-file-directory` and elfutils' own
//! `/usr/lib/debug/.build-id` use, so the same tree also works for them.
//!
//! What goes in: the very file that was proven (the open descriptor, as the
//! build-ID cache uses it), else the file at the recorded path when its own note
//! carries exactly the ID; a `.ko.zst` module decompressed (debuginfod reads no
//! compressed ELF); this boot's vdso image; this boot's kernel image when the host
//! has a `vmlinux` carrying the ID at one of perf's places. Debug info: the file
//! itself when it has `.debug_info`, else `/usr/lib/debug/.build-id/xx/rest.debug`,
//! else the `.gnu_debuglink` file whose CRC32 matches, each only if its note carries
//! the ID. Nothing is looked for beyond the DSOs the run proved.
//!
//! Many writers (the tasks of a job array on one shared filesystem): each file is
//! written to an unnamed temp file in its final directory (`O_TMPFILE`; where the
//! filesystem has none, a named one in `DIR/.tmp`), checked (its note carries the
//! ID, the source did not change while copied), fsynced, and only then linked under
//! its final name with `link(2)`, which never replaces: one writer wins, the others
//! find it present. The debug file is committed before the executable, so an
//! executable present means the ID is done (one `stat` for an ID already stored).
//! A writer killed at any moment leaves no final name that is not whole: an unnamed
//! temp file vanishes with its process; a named one is removed by a later run once
//! it is older than [`STALE_TEMP`].

use super::elf::{Elf, open_regular, pread_new, read_build_id, reader};
use super::{Group, HostTrust, Outcome, Source, host};
use crate::format::buildid::BuildId;
use crate::model::DsoKind;
use rayon::prelude::*;
use std::collections::HashSet;
use std::ffi::CString;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::time::Duration;

/// Named temp files (filesystems without `O_TMPFILE`) older than this are taken for
/// a killed writer's and removed. A live writer's file is at most minutes old (it is
/// written in one go); a writer stopped for longer finds its file gone, stores
/// nothing for that ID and says so, and a later run stores it.
pub(crate) const STALE_TEMP: Duration = Duration::from_secs(3600);

/// DSOs not stored that a batch's totals name (the count covers them all).
pub(crate) const NAMED_NOT_STORED: usize = 100;

/// Lines of DSOs not stored a human summary prints (the report names them all).
pub const PRINTED_NOT_STORED: usize = 10;

/// The largest decompressed `.ko.zst` module read (as the build-ID cache).
const MAX_MODULE: u64 = 256 << 20;

/// perf's places for a kernel image (`vmlinux_path__init`), `%s` the release; the
/// bare `vmlinux` of the current directory is left out (it says nothing of this
/// boot).
const VMLINUX_PLACES: [&str; 6] = [
    "/boot/vmlinux",
    "/boot/vmlinux-%s",
    "/usr/lib/debug/boot/vmlinux-%s",
    "/lib/modules/%s/build/vmlinux",
    "/usr/lib/debug/lib/modules/%s/vmlinux",
    "/usr/lib/debug/boot/vmlinux-%s.debug",
];

/// The store a run fills. Clones share what the process has stored already, so a
/// batch asks the filesystem about each ID once.
#[derive(Clone, Debug)]
pub struct SymbolStore {
    /// The store's root.
    pub dir: PathBuf,
    /// `--symfs`: files (and their debug files) are read under this root.
    pub symfs: Option<PathBuf>,
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    /// IDs this process found stored or stored itself (their executable is there).
    done: Mutex<HashSet<BuildId>>,
    /// Stale named temp files are swept once per process.
    swept: Once,
}

impl SymbolStore {
    /// A store at `dir`, created when missing (the first array task makes it).
    pub(crate) fn new(dir: &Path, symfs: Option<PathBuf>) -> Result<SymbolStore, String> {
        mkdir(dir)?;
        if !dir.is_dir() {
            return Err(format!("{}: not a directory", dir.display()));
        }
        Ok(SymbolStore {
            dir: dir.to_path_buf(),
            symfs,
            shared: Arc::new(Shared {
                done: Mutex::new(HashSet::new()),
                swept: Once::new(),
            }),
        })
    }

    /// `DIR/.build-id/xx/rest` for `id` (`None` for an ID too short to split).
    pub(crate) fn executable_path(&self, id: &BuildId) -> Option<PathBuf> {
        let hex = id.to_string();
        if hex.len() < 4 {
            return None;
        }
        let (a, b) = hex.split_at(2);
        Some(self.dir.join(".build-id").join(a).join(b))
    }
}

/// What happened to one DSO in the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum StoreState {
    /// Stored by this run.
    Added,
    /// In the store already (another run, another task, or earlier in this batch).
    Present,
    /// Not in the store (the detail says why).
    NotStored,
}

/// Where the store's debug info for an ID is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DebugInfo {
    /// The stored file has its own `.debug_info` (debuginfod serves it for both).
    InFile,
    /// A separate debug file, stored by this run as `rest.debug`.
    Added,
    /// A separate debug file was stored already.
    Present,
    /// This host has none for the ID.
    None,
}

/// The store outcome of one DSO with an ID.
#[derive(Clone, Debug)]
pub(crate) struct StoreResult {
    /// Name of the DSO.
    pub name: String,
    /// Kernel space (the table's address space).
    pub kernel_space: bool,
    /// Its ID.
    pub build_id: BuildId,
    /// What happened.
    pub state: StoreState,
    /// Its debug info (this run's finding; `None` when not stored or found present).
    pub debuginfo: Option<DebugInfo>,
    /// Bytes this run wrote for it.
    pub bytes: u64,
    /// Why not stored, or where the debug info came from.
    pub detail: Option<String>,
}

/// One DSO that could not be stored (in the run totals).
#[derive(Clone, Debug, serde::Serialize)]
pub struct NotStored {
    /// The DSO.
    pub path: String,
    /// Its ID.
    pub build_id: String,
    /// Why.
    pub why: String,
}

/// Run totals of the symbol store (in the report).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct StoreTotals {
    /// The store's root.
    pub dir: String,
    /// IDs stored by this run.
    pub added: usize,
    /// IDs found stored.
    pub present: usize,
    /// Separate debug files stored by this run.
    pub debuginfo_added: usize,
    /// Bytes written by this run.
    pub bytes_added: u64,
    /// DSOs with an ID that are not in the store.
    pub not_stored: usize,
    /// Each of them, with the reason.
    pub not_stored_dsos: Vec<NotStored>,
}

impl StoreTotals {
    /// Totals over one run's results.
    pub(crate) fn of<'a>(dir: &Path, results: impl IntoIterator<Item = &'a StoreResult>) -> Self {
        let mut t = StoreTotals {
            dir: dir.display().to_string(),
            ..StoreTotals::default()
        };
        for r in results {
            t.add(r);
        }
        t
    }

    fn add(&mut self, r: &StoreResult) {
        match r.state {
            StoreState::Added => self.added += 1,
            StoreState::Present => self.present += 1,
            StoreState::NotStored => {
                self.not_stored += 1;
                self.not_stored_dsos.push(NotStored {
                    path: r.name.clone(),
                    build_id: r.build_id.to_string(),
                    why: r.detail.clone().unwrap_or_default(),
                });
            }
        }
        if r.debuginfo == Some(DebugInfo::Added) {
            self.debuginfo_added += 1;
        }
        self.bytes_added += r.bytes;
    }

    /// Adds another run's totals (a batch's sum): the counts add up; a DSO not stored
    /// is named once, and at most [`NAMED_NOT_STORED`] are named (a batch over other
    /// hosts' recordings could name every DSO of the fleet).
    pub(crate) fn merge(&mut self, o: &StoreTotals) {
        self.added += o.added;
        self.present += o.present;
        self.debuginfo_added += o.debuginfo_added;
        self.bytes_added += o.bytes_added;
        self.not_stored += o.not_stored;
        for n in &o.not_stored_dsos {
            if self.not_stored_dsos.len() < NAMED_NOT_STORED
                && !self
                    .not_stored_dsos
                    .iter()
                    .any(|m| m.path == n.path && m.build_id == n.build_id)
            {
                self.not_stored_dsos.push(n.clone());
            }
        }
    }
}

/// Stores every group with an ID, in parallel on the current rayon pool.
pub(crate) fn fill(
    store: &SymbolStore,
    groups: &[Group],
    outcomes: &[Outcome],
    trust: &HostTrust,
) -> Vec<StoreResult> {
    groups
        .par_iter()
        .zip(outcomes.par_iter())
        .filter_map(|(g, o)| {
            let Outcome::Found(f) = o else {
                return None;
            };
            let p = Proof {
                id: f.build_id,
                source: f.source,
                file: f.file.as_ref(),
            };
            let id = p.id;
            let mut r = StoreResult {
                name: g.name.clone(),
                kernel_space: g.kind.is_kernel_space(),
                build_id: id,
                state: StoreState::NotStored,
                debuginfo: None,
                bytes: 0,
                detail: None,
            };
            match add(store, g, &p, trust, &mut r) {
                Ok(state) => r.state = state,
                Err(why) => {
                    r.state = StoreState::NotStored;
                    r.detail = Some(why);
                }
            }
            Some(r)
        })
        .collect()
}

/// What the store takes of one group's outcome: the ID, where it came from, and
/// the proven file when it is still open.
struct Proof<'a> {
    id: BuildId,
    source: Source,
    file: Option<&'a Arc<File>>,
}

/// What a stored file is made from.
enum Content {
    /// An open file whose note carries the ID.
    File(Arc<File>),
    /// Bytes whose note carries the ID (the vdso image, a decompressed module).
    Bytes(Vec<u8>),
}

fn add(
    store: &SymbolStore,
    g: &Group,
    p: &Proof,
    trust: &HostTrust,
    r: &mut StoreResult,
) -> Result<StoreState, String> {
    let id = p.id;
    let exe = store
        .executable_path(&id)
        .ok_or_else(|| format!("build ID {id} is too short for the store"))?;
    if store.shared.done.lock().is_ok_and(|d| d.contains(&id)) {
        return Ok(StoreState::Present);
    }
    // The one stat an ID already stored costs.
    if std::fs::symlink_metadata(&exe).is_ok() {
        remember(store, id);
        return Ok(StoreState::Present);
    }
    let (content, debug) = match g.kind {
        DsoKind::Kernel => (kernel_image(g, p, trust)?, None),
        DsoKind::Vdso => (vdso_image(g, p, trust)?, None),
        DsoKind::Module | DsoKind::User => {
            let c = dso_file(store, g, p)?;
            let debug = match &c {
                Content::File(f) => Some(f.clone()),
                Content::Bytes(_) => None,
            };
            (c, debug)
        }
    };
    let has_debug_info = match &content {
        Content::File(f) => {
            let rc = reader(f);
            Elf::parse(&rc).is_ok_and(|e| has_dwarf(&e))
        }
        Content::Bytes(b) => Elf::parse(&b[..]).is_ok_and(|e| has_dwarf(&e)),
    };
    let dir = exe.parent().ok_or("no store directory")?.to_path_buf();
    mkdir(&dir)?;
    sweep(store);
    // Debug info first: an executable present means the ID is complete.
    if has_debug_info {
        r.debuginfo = Some(DebugInfo::InFile);
    } else if let Some(f) = debug {
        match debug_file(store, g, &f, &id) {
            Some((dbg, from)) => {
                let target = exe.with_file_name(format!(
                    "{}.debug",
                    exe.file_name()
                        .map(|n| n.to_string_lossy())
                        .unwrap_or_default()
                ));
                let (state, bytes) = publish(store, &target, &Content::File(Arc::new(dbg)), &id)
                    .map_err(|e| format!("debug file {from}: {e}"))?;
                r.bytes += bytes;
                r.debuginfo = Some(if state == StoreState::Added {
                    DebugInfo::Added
                } else {
                    DebugInfo::Present
                });
                r.detail = Some(format!("debug info from {from}"));
            }
            None => r.debuginfo = Some(DebugInfo::None),
        }
    } else {
        r.debuginfo = Some(DebugInfo::None);
    }
    let (state, bytes) = publish(store, &exe, &content, &id)?;
    r.bytes += bytes;
    remember(store, id);
    Ok(state)
}

fn remember(store: &SymbolStore, id: BuildId) {
    if let Ok(mut d) = store.shared.done.lock() {
        d.insert(id);
    }
}

/// A non-empty `.debug_info` in the file (compressed counts: debuginfod and gdb read
/// it).
fn has_dwarf<'d, R: object::ReadRef<'d>>(e: &Elf<'d, R>) -> bool {
    e.section(b".debug_info")
        .is_some_and(|s| s.size > 0 && s.offset.is_some())
}

/// The analysis side of a store (`--debuginfod`): after the executable of `id` was
/// fetched into the build-ID cache as `exe`, its separate debug info, for perf to
/// read as the entry's `debug` file (perf finds a stripped file's symbols there).
/// `None` when the entry has one, the executable has its own `.debug_info`, or no
/// server has any (a stripped file without debug info is still symbolised from its
/// `.dynsym`).
pub(crate) fn fetch_debug_into_cache(
    servers: &[String],
    id: &BuildId,
    exe: &Path,
    dir: &Path,
) -> Option<Vec<u8>> {
    if std::fs::symlink_metadata(dir.join("debug")).is_ok() {
        return None;
    }
    let (f, _) = open_regular(exe).ok()?;
    let rc = reader(&f);
    if Elf::parse(&rc).is_ok_and(|e| has_dwarf(&e)) {
        return None;
    }
    super::debuginfod::fetch_debuginfo(servers, id).ok()
}

/// This boot's kernel image, when the host has a `vmlinux` carrying the ID.
fn kernel_image(g: &Group, p: &Proof, trust: &HostTrust) -> Result<Content, String> {
    let id = p.id;
    if g.name != "[kernel.kallsyms]" {
        return Err(format!("{} is not this host's kernel image", g.name));
    }
    let this_boot = p.source == Source::KernelNotes
        || (trust.kernel.is_ok() && host::kernel_build_id() == Some(id));
    if !this_boot {
        return Err("the recorded kernel is not proven to be this boot's".into());
    }
    let release = host::HostInfo::detect().release;
    for place in VMLINUX_PLACES {
        let p = PathBuf::from(place.replace("%s", &release));
        if let Ok((f, _)) = open_regular(&p)
            && read_build_id(&f).ok() == Some(id)
        {
            return Ok(Content::File(Arc::new(f)));
        }
    }
    Err(format!(
        "no vmlinux with this build ID on this host (looked where perf looks: /boot, /usr/lib/debug/boot, /lib/modules/{release}/build, /usr/lib/debug/lib/modules/{release}); its kallsyms, in the build-ID cache, is no file debuginfod serves"
    ))
}

/// This boot's vdso image, checked to carry the ID.
fn vdso_image(g: &Group, p: &Proof, trust: &HostTrust) -> Result<Content, String> {
    let id = p.id;
    if g.name != "[vdso]" {
        return Err(format!(
            "{}: only this process's own [vdso] image can be written",
            g.name
        ));
    }
    let this_boot =
        p.source == Source::Vdso || (trust.kernel.is_ok() && host::vdso_build_id() == Some(id));
    if !this_boot {
        return Err(
            "the recording is not proven to be of this host and boot: this process's vdso may differ"
                .into(),
        );
    }
    let img = host::vdso_image().ok_or("cannot read this process's vdso")?;
    if super::elf::build_id_of_image(img).ok() != Some(id) {
        return Err("this process's vdso has another build ID".into());
    }
    Ok(Content::Bytes(img.to_vec()))
}

/// `root` + an absolute recorded path.
fn under(root: Option<&Path>, name: &str) -> PathBuf {
    match root {
        Some(r) => r.join(name.trim_start_matches('/')),
        None => PathBuf::from(name),
    }
}

/// A user DSO's or module's file: the proven one, else the file at the path whose
/// note carries the ID.
fn dso_file(store: &SymbolStore, g: &Group, p: &Proof) -> Result<Content, String> {
    let id = p.id;
    if !g.name.starts_with('/') {
        return Err(format!("'{}' names no file", g.name));
    }
    if let Some(f) = p.file {
        return Ok(Content::File(f.clone()));
    }
    let path = under(store.symfs.as_deref(), &g.name);
    let (f, _) = open_regular(&path).map_err(|(_, d)| format!("{}: {d}", path.display()))?;
    if g.name.ends_with(".ko.zst") {
        // debuginfod reads no compressed ELF file: the image is stored.
        use std::io::Read;
        let mut dec =
            zstd::stream::read::Decoder::new(&f).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut image = Vec::new();
        (&mut dec)
            .take(MAX_MODULE)
            .read_to_end(&mut image)
            .map_err(|e| format!("{}: cannot decompress: {e}", path.display()))?;
        return match super::elf::build_id_of_image(&image) {
            Ok(found) if found == id => Ok(Content::Bytes(image)),
            Ok(found) => Err(format!(
                "{} has build ID {found}, not {id}: the recorded module is not on this machine",
                path.display()
            )),
            Err((_, d)) => Err(format!("{}: {d}", path.display())),
        };
    }
    if [".ko.xz", ".ko.gz"].iter().any(|s| g.name.ends_with(s)) {
        return Err(format!(
            "{}: xz/gzip-compressed modules are not read, so their ID cannot be checked",
            path.display()
        ));
    }
    match read_build_id(&f) {
        Ok(found) if found == id => Ok(Content::File(Arc::new(f))),
        Ok(found) => Err(format!(
            "{} has build ID {found}, not {id}: the recorded file is not on this machine",
            path.display()
        )),
        Err((_, d)) => Err(format!("{}: {d}", path.display())),
    }
}

/// The separate debug file of a stripped DSO: `/usr/lib/debug/.build-id/xx/rest.debug`,
/// else the `.gnu_debuglink` file (beside the DSO, in its `.debug` folder, or under
/// `/usr/lib/debug`) whose CRC32 is the link's; either only if its note carries the
/// ID (debuginfod finds files by that note). Returns the open file and where it was.
fn debug_file(store: &SymbolStore, g: &Group, f: &File, id: &BuildId) -> Option<(File, String)> {
    let root = store.symfs.as_deref();
    let hex = id.to_string();
    let by_id = under(
        root,
        &format!("/usr/lib/debug/.build-id/{}/{}.debug", &hex[..2], &hex[2..]),
    );
    if let Ok((d, _)) = open_regular(&by_id)
        && read_build_id(&d).ok() == Some(*id)
    {
        return Some((d, by_id.display().to_string()));
    }
    let (name, crc) = debuglink(f)?;
    // The folder of the file itself: the open descriptor's path here (no lookup of
    // the recorded path's symlinks again), the recorded one under --symfs.
    let dir = match root {
        Some(_) => Path::new(&g.name).parent()?.to_path_buf(),
        None => std::fs::read_link(format!("/proc/self/fd/{}", f.as_raw_fd()))
            .ok()
            .and_then(|p| p.parent().map(Path::to_path_buf))
            .or_else(|| Path::new(&g.name).parent().map(Path::to_path_buf))?,
    };
    let d = dir.to_string_lossy();
    for cand in [
        format!("{d}/{name}"),
        format!("{d}/.debug/{name}"),
        format!("/usr/lib/debug{d}/{name}"),
    ] {
        let p = under(root, &cand);
        let Ok((file, _)) = open_regular(&p) else {
            continue;
        };
        if crc32_of(&file) == Some(crc) && read_build_id(&file).ok() == Some(*id) {
            return Some((
                file,
                format!("{} (.gnu_debuglink, CRC checked)", p.display()),
            ));
        }
    }
    None
}

/// The `.gnu_debuglink` section: a file name (no `/`) and the CRC32 of that file.
fn debuglink(f: &File) -> Option<(String, u32)> {
    let rc = reader(f);
    let elf = Elf::parse(&rc).ok()?;
    let s = elf.section(b".gnu_debuglink")?;
    if s.size < 8 || s.size > 4096 || s.compressed {
        return None;
    }
    let data = pread_new(f, s.offset?, s.size as usize)?;
    let end = data.iter().position(|&b| b == 0)?;
    let name = std::str::from_utf8(&data[..end]).ok()?;
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return None;
    }
    let at = (end + 1).next_multiple_of(4);
    let raw: [u8; 4] = data.get(at..at + 4)?.try_into().ok()?;
    let crc = if elf.is_little_endian() {
        u32::from_le_bytes(raw)
    } else {
        u32::from_be_bytes(raw)
    };
    Some((name.to_string(), crc))
}

/// CRC-32 (IEEE 802.3, as zlib's `crc32` and `.gnu_debuglink`) of a whole file.
fn crc32_of(f: &File) -> Option<u32> {
    use std::os::unix::fs::FileExt;
    let mut crc = !0u32;
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0u64;
    loop {
        let n = f.read_at(&mut buf, off).ok()?;
        if n == 0 {
            break;
        }
        crc = crc32_update(crc, &buf[..n]);
        off += n as u64;
    }
    Some(!crc)
}

fn crc32_update(mut crc: u32, data: &[u8]) -> u32 {
    static TABLE: std::sync::OnceLock<[u32; 256]> = std::sync::OnceLock::new();
    let t = TABLE.get_or_init(|| {
        let mut t = [0u32; 256];
        for (i, e) in t.iter_mut().enumerate() {
            let mut c = i as u32;
            for _ in 0..8 {
                c = if c & 1 != 0 {
                    0xedb8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
            }
            *e = c;
        }
        t
    });
    for &b in data {
        crc = t[((crc ^ b as u32) & 0xff) as usize] ^ (crc >> 8);
    }
    crc
}

/// `mkdir -p` (0755 less the umask).
fn mkdir(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)
        .map_err(|e| format!("cannot create {}: {e}", dir.display()))
}

/// The folder of named temp files.
fn tmp_dir(store: &SymbolStore) -> PathBuf {
    store.dir.join(".tmp")
}

/// Removes named temp files older than [`STALE_TEMP`], once per process.
fn sweep(store: &SymbolStore) {
    store.shared.swept.call_once(|| {
        let Ok(list) = std::fs::read_dir(tmp_dir(store)) else {
            return;
        };
        for e in list.flatten() {
            let old = e
                .metadata()
                .ok()
                .and_then(|m| m.modified().ok())
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|d| d > STALE_TEMP);
            if old && e.file_name().to_string_lossy().ends_with(".tmp") {
                let _ = std::fs::remove_file(e.path());
            }
        }
    });
}

/// A temp file being written: unnamed (`O_TMPFILE`) or named in `DIR/.tmp`.
struct Temp {
    file: File,
    name: Option<PathBuf>,
    /// The signal handlers' slot of a named one (removed when the run is killed).
    slot: Option<usize>,
}

impl Drop for Temp {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            crate::signals::unwatch(slot);
        }
        if let Some(n) = &self.name {
            let _ = std::fs::remove_file(n);
        }
    }
}

fn cstr(p: &Path) -> Result<CString, String> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| format!("{} has a NUL byte", p.display()))
}

/// An unnamed file in `dir`, else a named one in `DIR/.tmp`.
fn temp(store: &SymbolStore, dir: &Path) -> Result<Temp, String> {
    if !test_hook_named_temps() {
        let c = cstr(dir)?;
        // SAFETY: a NUL-terminated path; the descriptor returned is owned below.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_TMPFILE | libc::O_WRONLY, 0o444) };
        if fd >= 0 {
            // SAFETY: a descriptor just opened and owned by nobody else.
            let file = unsafe { File::from_raw_fd(fd) };
            return Ok(Temp {
                file,
                name: None,
                slot: None,
            });
        }
        // EOPNOTSUPP, EISDIR (kernel without it), EINVAL: named temp files.
    }
    static N: AtomicU64 = AtomicU64::new(0);
    let t = tmp_dir(store);
    mkdir(&t)?;
    let host = host::HostInfo::detect().hostname.replace('/', "_");
    let name = t.join(format!(
        "{host}-{}-{}.pdinject.tmp",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o444)
        .open(&name)
        .map_err(|e| format!("cannot create {}: {e}", name.display()))?;
    let slot = crate::signals::watch(&name, false);
    Ok(Temp {
        file,
        name: Some(name),
        slot,
    })
}

/// Writes `content` to a temp file, checks it, and links it as `target` unless
/// `target` exists. Returns the state and the bytes written.
fn publish(
    store: &SymbolStore,
    target: &Path,
    content: &Content,
    id: &BuildId,
) -> Result<(StoreState, u64), String> {
    let dir = target.parent().ok_or("no store directory")?;
    let tmp = temp(store, dir)?;
    let err = |e: std::io::Error| format!("cannot write {}: {e}", target.display());
    let len = match content {
        Content::File(f) => {
            let before = f.metadata().map_err(err)?;
            copy(f, &tmp.file, before.len()).map_err(err)?;
            // A file changed while it was copied is not stored (its note is checked
            // below too, but other bytes could have changed).
            let after = f.metadata().map_err(err)?;
            if (after.len(), after.mtime(), after.mtime_nsec())
                != (before.len(), before.mtime(), before.mtime_nsec())
            {
                return Err(format!(
                    "{}: the file changed while it was copied",
                    target.display()
                ));
            }
            before.len()
        }
        Content::Bytes(b) => {
            use std::os::unix::fs::FileExt;
            let half = b.len() / 2;
            tmp.file.write_all_at(&b[..half], 0).map_err(err)?;
            crash_point();
            tmp.file
                .write_all_at(&b[half..], half as u64)
                .map_err(err)?;
            b.len() as u64
        }
    };
    // What is linked is what was checked: the temp file's own note.
    let check = File::open(format!("/proc/self/fd/{}", tmp.file.as_raw_fd()))
        .ok()
        .and_then(|f| read_build_id(&f).ok());
    let check = match check {
        Some(c) => Some(c),
        // /proc not mounted: the named temp file can be opened by its name.
        None => tmp
            .name
            .as_ref()
            .and_then(|n| File::open(n).ok())
            .and_then(|f| read_build_id(&f).ok()),
    };
    if check != Some(*id) {
        return Err(format!(
            "{}: the copy does not carry build ID {id}",
            target.display()
        ));
    }
    tmp.file
        .set_permissions(std::fs::Permissions::from_mode(0o444))
        .map_err(err)?;
    tmp.file.sync_all().map_err(err)?;
    crash_point();
    let state = commit(&tmp, target)?;
    Ok((state, if state == StoreState::Added { len } else { 0 }))
}

/// Links the temp file as `target`; `link(2)` never replaces, so a target made by
/// another writer meanwhile wins (it is whole too) and this copy is dropped.
fn commit(tmp: &Temp, target: &Path) -> Result<StoreState, String> {
    let to = cstr(target)?;
    let from = match &tmp.name {
        Some(n) => cstr(n)?,
        None => CString::new(format!("/proc/self/fd/{}", tmp.file.as_raw_fd()))
            .map_err(|_| "fd path".to_string())?,
    };
    // SAFETY: two NUL-terminated paths.
    let r = unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    };
    if r == 0 {
        return Ok(StoreState::Added);
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EEXIST) => Ok(StoreState::Present),
        _ => Err(format!("cannot create {}: {e}", target.display())),
    }
}

/// Copies `len` bytes of `from` (at explicit offsets: other readers' file position is
/// untouched) into `to`, in two halves with the crash hook between them.
fn copy(from: &File, to: &File, len: u64) -> std::io::Result<()> {
    let half = len / 2;
    copy_range(from, to, 0, half)?;
    crash_point();
    copy_range(from, to, half, len)
}

fn copy_range(from: &File, to: &File, start: u64, end: u64) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let mut off = start;
    // copy_file_range first: a reflink or server-side copy where the filesystem
    // has one (Btrfs, XFS, NFS 4.2), else an in-kernel copy.
    while off < end {
        let mut in_off = off as libc::loff_t;
        let mut out_off = off as libc::loff_t;
        let want = (end - off).min(1 << 30) as usize;
        // SAFETY: two open descriptors and offsets owned here.
        let n = unsafe {
            libc::copy_file_range(
                from.as_raw_fd(),
                &mut in_off,
                to.as_raw_fd(),
                &mut out_off,
                want,
                0,
            )
        };
        if n > 0 {
            off += n as u64;
            continue;
        }
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the file is shorter than it was",
            ));
        }
        // EXDEV (older kernels), ENOSYS, EINVAL, EOPNOTSUPP: read and write.
        break;
    }
    let mut buf = vec![0u8; (end - off).min(1 << 20) as usize];
    while off < end {
        let want = ((end - off) as usize).min(buf.len());
        let n = from.read_at(&mut buf[..want], off)?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the file is shorter than it was",
            ));
        }
        to.write_all_at(&buf[..n], off)?;
        off += n as u64;
    }
    Ok(())
}

/// Test hook: `PDINJECT_TEST_STORE_NAMED_TEMPS=1` uses named temp files as on a
/// filesystem without `O_TMPFILE` (NFS), so that path is tested on any machine.
/// Built only with the `test-hooks` feature (`cargo test` turns it on).
#[cfg(feature = "test-hooks")]
fn test_hook_named_temps() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("PDINJECT_TEST_STORE_NAMED_TEMPS").is_some())
}

#[cfg(not(feature = "test-hooks"))]
fn test_hook_named_temps() -> bool {
    false
}

/// Test hook for the crash-safety test: `PDINJECT_TEST_STORE_ABORT=N` ends the
/// process with SIGKILL at its N-th crash point (half a file copied; a file whole
/// and synced, not yet linked), the states a `kill -9` can leave. Built only with
/// the `test-hooks` feature.
#[cfg(not(feature = "test-hooks"))]
fn crash_point() {}

#[cfg(feature = "test-hooks")]
fn crash_point() {
    static AT: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    static DONE: AtomicU64 = AtomicU64::new(0);
    if let Some(n) = *AT.get_or_init(|| {
        std::env::var("PDINJECT_TEST_STORE_ABORT")
            .ok()
            .and_then(|v| v.parse().ok())
    }) && DONE.fetch_add(1, Ordering::SeqCst) + 1 == n
    {
        // SAFETY: kill(2) on our own pid.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_is_zlibs() {
        assert_eq!(!crc32_update(!0, b"123456789"), 0xcbf4_3926);
        assert_eq!(!crc32_update(!0, b""), 0);
    }

    #[test]
    fn batch_totals_name_each_dso_not_stored_once() {
        let id = BuildId::from_hex("aabbccdd").unwrap();
        let r = StoreResult {
            name: "[kernel.kallsyms]".into(),
            kernel_space: true,
            build_id: id,
            state: StoreState::NotStored,
            debuginfo: None,
            bytes: 0,
            detail: Some("no vmlinux".into()),
        };
        let a = StoreTotals::of(Path::new("/s"), [&r]);
        let mut t = a.clone();
        t.merge(&a);
        assert_eq!((t.not_stored, t.not_stored_dsos.len()), (2, 1));
    }
}
