//! DWARF unwinding of the user stacks that `perf record --call-graph dwarf` copies into
//! samples (PERF_SAMPLE_REGS_USER + PERF_SAMPLE_STACK_USER), with framehop.
//!
//! Why framehop rather than a hand-written gimli loop: it already evaluates CFI from
//! `.eh_frame` (indexed by `.eh_frame_hdr`) and `.debug_frame`, caches the rule per
//! address (a direct-mapped cache that makes repeated return addresses nearly free),
//! analyses x86_64 epilogues and falls back to frame pointers where CFI is missing,
//! while recovering only the registers return addresses need. A gimli loop would redo
//! all of that for no measurable gain.
//!
//! Unwind sections are loaded once per DSO (keyed by its model identity), when a walk
//! first reaches it, and shared by every process and worker. Each worker unwinds in
//! one address space of DSO images shared by all processes (see [`Worker`]), so the
//! rule found for a return address in libc serves every process that maps libc.
//! Section data is read into memory (not mapped), so a file changing under us cannot
//! fault the process.

use super::cfi::{self, EhFrameRules};
use crate::buildid::RecordingStart;
use crate::buildid::elf::{
    FileTimes, Place, Segment, judge, open_regular, prove_and_read, read_build_id,
};
use crate::format::Endian;
use crate::model::{Dso, DsoId, DsoKind, Key, MapEntry, Model, lay_over};
use framehop::aarch64::{CacheAarch64, UnwindRegsAarch64, UnwinderAarch64};
use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{ExplicitModuleSectionInfo, FrameAddress, Module, Unwinder};
use std::collections::HashMap;
use std::ops::{Deref, Range};
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How user stacks are walked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum UnwindMode {
    /// Not at all.
    None,
    /// Frame pointers only (no unwind tables are read).
    Fp,
    /// DWARF CFI, frame pointers where CFI is missing.
    #[default]
    Dwarf,
}

/// CPU architecture of the recording (from the ARCH feature).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// x86_64.
    X86_64,
    /// aarch64 / arm64.
    Aarch64,
}

impl Arch {
    /// Maps perf's ARCH string (`uname -m`).
    pub fn from_perf(s: &str) -> Option<Arch> {
        match s {
            "x86_64" => Some(Arch::X86_64),
            "aarch64" | "arm64" => Some(Arch::Aarch64),
            _ => None,
        }
    }
}

/// Unwinding settings.
#[derive(Clone, Copy, Debug)]
pub struct UnwindConfig {
    /// Mode.
    pub mode: UnwindMode,
    /// Architecture.
    pub arch: Arch,
    /// Time allowed per sample.
    pub budget: Duration,
    /// Frames walked at most per sample.
    pub max_frames: usize,
}

/// Section data shared between modules: a range of a reference-counted buffer.
#[derive(Clone, Default)]
pub struct Bytes(Arc<Vec<u8>>, Range<usize>);

impl Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0[self.1.clone()]
    }
}

/// The unwind sections of one DSO file and the segments that place them in memory.
pub struct DsoUnwind {
    /// `(p_offset, p_vaddr)` of each PT_LOAD segment.
    segments: Vec<(u64, u64)>,
    info: ExplicitModuleSectionInfo<Bytes>,
    /// x86_64 rules from `.eh_frame`, made when an x86_64 worker first meets the DSO
    /// and shared by all (see [`cfi`]).
    rules: OnceLock<Option<Arc<EhFrameRules>>>,
    /// The file's times when it was proven and its PT_LOAD segments (see
    /// [`UnwindTables::still_proven`]).
    proven: FileTimes,
    loads: Vec<Segment>,
    /// Proven by its build ID alone (see [`UnwindTables::load`]): its times do not
    /// matter.
    by_id: bool,
}

/// Unwind information for every DSO, loaded on first use by whichever worker needs it.
pub struct UnwindTables {
    per_dso: Vec<OnceLock<Option<Arc<DsoUnwind>>>>,
    /// Loaded tables by `(st_dev, st_ino)`: a file reached by several paths (merged
    /// /usr, symlinks, hard links) or mapped under several identities is read once.
    by_file: Mutex<HashMap<(u64, u64), Arc<DsoUnwind>>>,
    /// Local files may be read (the recording is of this host) and when it started:
    /// the proof the IDs obey, set for each batch.
    allow_local: bool,
    start: RecordingStart,
    /// Workers between two runs over these tables: their images and rule caches stay
    /// right (image addresses depend on the DSO only), so a later batch starts warm.
    idle: Mutex<Vec<Worker>>,
}

impl Default for UnwindTables {
    /// No tables yet, and no local file trusted until [`UnwindTables::set_proof`].
    fn default() -> Self {
        UnwindTables {
            per_dso: Vec::new(),
            by_file: Mutex::new(HashMap::new()),
            allow_local: false,
            start: RecordingStart::Unknown("not dated yet".into()),
            idle: Mutex::new(Vec::new()),
        }
    }
}

impl UnwindTables {
    /// A worker for `arch` for a run sharing `shared`: one parked by an earlier run
    /// over these tables, or a new one.
    pub fn worker(&self, arch: Arch, shared: &Arc<Shared>) -> Worker {
        let parked = self.idle.lock().ok().and_then(|mut v| {
            let i = v.iter().position(|w| w.arch() == arch)?;
            Some(v.swap_remove(i))
        });
        match parked {
            Some(mut w) => {
                w.shared = shared.clone();
                w
            }
            None => Worker::sharing(arch, shared.clone()),
        }
    }

    /// Parks `w` for the next run over these tables.
    pub fn park(&self, w: Worker) {
        if let Ok(mut v) = self.idle.lock() {
            v.push(w);
        }
    }

    /// Makes room for DSOs a growing model (pipe mode) added since; tables already
    /// loaded are kept.
    pub fn grow(&mut self, model: &Model) {
        let n = model.dsos.len();
        if self.per_dso.len() < n {
            self.per_dso.resize_with(n, OnceLock::new);
        }
    }

    /// Sets the proof for the DSOs loaded from now on: whether local files may be
    /// read at all, and the recording's start (an unknown start loads nothing, as it
    /// gives no ID). Tables loaded before keep the proof they were loaded under.
    pub fn set_proof(&mut self, allow_local: bool, start: RecordingStart) {
        self.allow_local = allow_local;
        self.start = start;
    }

    /// Whether every table loaded so far would still be loaded under `start` and with
    /// the executable offsets `dsos` now record: tables loaded while a file was being
    /// scanned were proven against the recording's start as far as the scan had seen
    /// it (later than the real one, never earlier) and the offsets mapped so far. The
    /// rules are those of [`prove_and_read`], on what it read.
    pub fn still_proven(&self, dsos: &[Dso], start: &RecordingStart) -> bool {
        let RecordingStart::Known(start) = *start else {
            return self
                .per_dso
                .iter()
                .all(|t| !matches!(t.get(), Some(Some(_))));
        };
        self.per_dso.iter().zip(dsos).all(|(t, dso)| {
            let Some(Some(t)) = t.get() else {
                return true;
            };
            t.by_id
                || judge(
                    &t.proven,
                    &t.loads,
                    &dso.exec_maps,
                    start,
                    Place::of(&dso.ident),
                )
                .is_ok()
        })
    }

    fn get(&self, model: &Model, d: DsoId) -> Option<&Arc<DsoUnwind>> {
        self.per_dso
            .get(d as usize)?
            .get_or_init(|| self.load(model, d))
            .as_ref()
    }

    fn load(&self, model: &Model, d: DsoId) -> Option<Arc<DsoUnwind>> {
        let dso = model.dsos.get(d as usize)?;
        if !self.allow_local || dso.kind != DsoKind::User {
            return None;
        }
        // Unwind only with a file proven to be the one mapped: wrong CFI would walk
        // into wrong callers.
        let (proven, by_id) = match prove_and_read(
            Path::new(&dso.name),
            &dso.ident,
            &dso.exec_maps,
            &self.start,
        ) {
            Ok(p) => (p, false),
            // A mapping the kernel named by its build ID (perf 6.17 on records them
            // so): a file with that very ID is the one mapped, whatever its times say
            // (a hard link into a build-ID cache moves a library's ctime, and without
            // an inode in the record the proof by times refuses it).
            Err(_) => match &dso.ident {
                crate::format::record::FileIdent::BuildId(id) => {
                    let (file, meta) = open_regular(Path::new(&dso.name)).ok()?;
                    if read_build_id(&file).ok()? != *id {
                        return None;
                    }
                    use std::os::unix::fs::MetadataExt;
                    let key = (meta.dev(), meta.ino());
                    (
                        crate::buildid::elf::Proven {
                            build_id: *id,
                            file: Arc::new(file),
                            key,
                        },
                        true,
                    )
                }
                _ => return None,
            },
        };
        if let Some(t) = self.by_file.lock().ok()?.get(&proven.key) {
            return Some(t.clone());
        }
        // Loaded outside the lock; a second worker racing on the same file keeps the
        // first copy stored.
        let meta = proven.file.metadata().ok()?;
        let mut t = load_sections(&proven.file, FileTimes::of(&meta))?;
        t.by_id = by_id;
        let t = Arc::new(t);
        Some(
            self.by_file
                .lock()
                .ok()?
                .entry(proven.key)
                .or_insert(t)
                .clone(),
        )
    }
}

fn load_sections(file: &std::fs::File, proven: FileTimes) -> Option<DsoUnwind> {
    let cache = crate::buildid::elf::reader(file);
    let elf = crate::buildid::elf::Elf::parse(&cache).ok()?;
    let segments = elf.load_segments();
    let loads = elf.loads();
    let section = |name: &str, max: u64| -> Option<(Range<u64>, Bytes)> {
        let s = elf.section(name.as_bytes())?;
        // Compressed CFI is not read (object, without its compression feature, did
        // not either).
        if s.size > max || s.compressed {
            return None;
        }
        // Read straight into their buffer: through the ReadCache they were zeroed,
        // read, then copied again. A section without bytes in the file is empty.
        let data = match s.offset {
            Some(at) => crate::buildid::elf::pread_new(file, at, usize::try_from(s.size).ok()?)?,
            None => Vec::new(),
        };
        let n = data.len();
        Some((
            s.address..s.address.checked_add(s.size)?,
            Bytes(Arc::new(data), 0..n),
        ))
    };
    let mut info = ExplicitModuleSectionInfo::<Bytes> {
        base_svma: 0,
        ..Default::default()
    };
    if let Some((r, b)) = section(".eh_frame", u64::MAX) {
        info.eh_frame_svma = Some(r);
        info.eh_frame = Some(b);
    }
    if let Some((r, b)) = section(".eh_frame_hdr", u64::MAX) {
        info.eh_frame_hdr_svma = Some(r);
        info.eh_frame_hdr = Some(b);
    }
    if let Some((_, b)) = section(".debug_frame", u64::MAX) {
        // framehop reads one CFI section: .eh_frame when present. A library built
        // without unwind tables but with -g has its CFI in .debug_frame, and its
        // .eh_frame only covers the few functions of the crt objects linked in.
        let le = elf.is_little_endian();
        let eh_fdes = info
            .eh_frame
            .as_deref()
            .map_or(0, |d| count_fdes(d, le, false));
        if count_fdes(&b, le, true) > eh_fdes {
            info.eh_frame = None;
            info.eh_frame_svma = None;
            info.eh_frame_hdr = None;
            info.eh_frame_hdr_svma = None;
        }
        info.debug_frame = Some(b);
    }
    // .text is left out: framehop reads instructions only for mach-O compact unwind,
    // and reading cc1's 25 MB of code would cost more than all its samples.
    if let Some(s) = elf.section(b".text") {
        info.text_svma = Some(s.address..s.address.wrapping_add(s.size));
    }
    if let Some(s) = elf.section(b".got") {
        info.got_svma = Some(s.address..s.address.wrapping_add(s.size));
    }
    Some(DsoUnwind {
        segments,
        info,
        rules: OnceLock::new(),
        proven,
        loads,
        by_id: false,
    })
}

/// Counts the FDEs of a CFI section by walking its entry lengths (a CIE has id 0 in
/// `.eh_frame` and 0xffffffff in `.debug_frame`).
fn count_fdes(data: &[u8], little: bool, debug_frame: bool) -> usize {
    let e = if little { Endian::Little } else { Endian::Big };
    let (mut off, mut n) = (0usize, 0usize);
    while let Some(len) = e.u32(data, off) {
        if len == 0 {
            if debug_frame {
                off += 4;
                continue;
            }
            break; // .eh_frame terminator
        }
        let (len, id_at, wide) = if len == u32::MAX {
            match e.u64(data, off + 4) {
                Some(l) => (l, off + 12, true),
                None => break,
            }
        } else {
            (len as u64, off + 4, false)
        };
        let id = if wide && debug_frame {
            e.u64(data, id_at)
        } else {
            e.u32(data, id_at).map(u64::from)
        };
        let cie = match id {
            Some(id) if debug_frame => id == if wide { u64::MAX } else { u32::MAX as u64 },
            Some(id) => id == 0,
            None => break,
        };
        n += usize::from(!cie);
        match usize::try_from(len).ok().and_then(|l| id_at.checked_add(l)) {
            Some(next) if next > off => off = next,
            _ => break,
        }
    }
    n
}

/// What unwinding one sample did.
#[derive(Clone, Copy, Debug, Default)]
pub struct Outcome {
    /// Return addresses found.
    pub frames: usize,
    /// The time budget ran out before the stack did.
    pub over_budget: bool,
    /// The frame cap was reached.
    pub frame_capped: bool,
}

/// Where each DSO's image lies in the one address space the unwinder sees (see
/// [`Worker`]): DSO `d` at `IMAGE_BASE + d * IMAGE_SLOT`, above any user address
/// (x86_64 with 5-level paging and aarch64 with 52-bit VAs stay below 2^57).
const IMAGE_BASE: u64 = 1 << 62;
/// Room for one image; framehop looks addresses up as 32-bit offsets from a module's
/// base, so no image it can use is larger.
const IMAGE_SLOT: u64 = 1 << 32;

/// The address of `svma` in DSO `d`'s image slot.
fn image_addr(d: DsoId, svma: u64) -> Option<u64> {
    if svma >= IMAGE_SLOT {
        return None;
    }
    IMAGE_BASE
        .checked_add(u64::from(d).checked_mul(IMAGE_SLOT)?)?
        .checked_add(svma)
}

/// A word that no mapping moved, kept out of the image slots: a stray stack word (or
/// a kernel address) there would otherwise be taken for code of the DSO whose slot
/// it falls in. In its place is an address that is nothing in any process either,
/// as the word was.
fn outside_images(word: u64) -> u64 {
    if word >= IMAGE_BASE { NOWHERE } else { word }
}

/// Where [`outside_images`] puts stray words: above every user address space and
/// below the slots.
const NOWHERE: u64 = IMAGE_BASE - (1 << 20);

/// The DSO whose image slot holds `addr`, if any.
fn image_dso(addr: u64) -> Option<DsoId> {
    DsoId::try_from(addr.checked_sub(IMAGE_BASE)? / IMAGE_SLOT).ok()
}

/// One frame an unwind found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Frame {
    /// Inside an executable mapping of this DSO (an image the unwinder knows).
    Dso(DsoId),
    /// An address of the process that no known image holds (anonymous or JIT code, a
    /// DSO without unwind tables, or nothing): to be looked up in the process.
    Address(u64),
}

/// The unwinders and rule caches of one architecture.
///
/// One unwinder per image, each with that one module: framehop empties its caches
/// (a new "modules generation") whenever a module is added to an unwinder, and a
/// frame's rule depends only on the module holding its address, so images added one
/// at a time would otherwise throw away every rule found so far each time.
struct ImageUnwinders<U: Unwinder> {
    new: fn() -> U,
    /// By DSO; `None` where no image was added.
    images: Vec<Option<U>>,
    /// For addresses outside every image: no module, so framehop's fallback (frame
    /// pointers on x86_64, the frame record on aarch64).
    outside: U,
    /// framehop's rule cache is direct-mapped with 509 entries, which the return
    /// addresses of a busy recording overflow. Each frame's lookup address picks one
    /// of [`CACHES`] caches by its bits above the slot, which makes one direct-mapped
    /// cache of `CACHES * 509` entries.
    caches: Box<[U::Cache]>,
    /// By DSO: the rules [`cfi`] works out for its image (x86_64 only; `None`: framehop
    /// does all), and what they said of the addresses met, direct-mapped.
    rules: Vec<Option<Arc<EhFrameRules>>>,
    found: Box<[(u64, cfi::Found)]>,
}

/// Rule caches per worker (see [`ImageUnwinders`]); about 8 KB each.
const CACHES: u64 = 16;
/// Entries of one framehop rule cache.
const CACHE_ENTRIES: u64 = 509;

impl<U: Unwinder<Module = Module<Bytes>>> ImageUnwinders<U> {
    fn new(new: fn() -> U, cache: fn() -> U::Cache) -> Self {
        ImageUnwinders {
            new,
            images: Vec::new(),
            outside: new(),
            caches: (0..CACHES).map(|_| cache()).collect(),
            rules: Vec::new(),
            // Address 0 is in no image: an empty slot.
            found: vec![(0, cfi::Found::Framehop); (CACHES * CACHE_ENTRIES) as usize].into(),
        }
    }

    /// Adds the image of DSO `d` at its slot, with the rules of its CFI when this
    /// architecture has them.
    fn add(&mut self, d: DsoId, module: Module<Bytes>, rules: Option<Arc<EhFrameRules>>) {
        let i = d as usize;
        if self.images.len() <= i {
            self.images.resize_with(i + 1, || None);
            self.rules.resize_with(i + 1, || None);
        }
        let mut u = (self.new)();
        u.add_module(module);
        self.images[i] = Some(u);
        self.rules[i] = rules;
    }

    /// Unwinds one frame: by the rule [`cfi`] works out for its address where there is
    /// one, else with the unwinder of its image and the cache that holds the rule for
    /// its address. Returns the caller's return address; `None` at the end of the stack or where
    /// the walk cannot go on.
    fn step<F>(
        &mut self,
        frame: FrameAddress,
        regs: &mut U::UnwindRegs,
        read_stack: &mut F,
    ) -> Option<u64>
    where
        F: FnMut(u64) -> Result<u64, ()>,
        U::UnwindRegs: OwnRules,
    {
        let at = frame.address_for_lookup();
        let d = image_dso(at);
        if let Some(d) = d
            && let Some(Some(rules)) = self.rules.get(d as usize)
        {
            let slot = (at % self.found.len() as u64) as usize;
            let found = match self.found.get(slot) {
                Some(&(a, f)) if a == at => f,
                _ => {
                    let f =
                        image_addr(d, 0).map_or(cfi::Found::Framehop, |base| rules.find(at - base));
                    if let Some(e) = self.found.get_mut(slot) {
                        *e = (at, f);
                    }
                    f
                }
            };
            if let cfi::Found::Rule(rule) = found
                && let Some(r) =
                    U::UnwindRegs::exec(rule, !frame.is_return_address(), regs, read_stack)
            {
                return r.ok().flatten();
            }
        }
        let u = d
            .and_then(|d| self.images.get(d as usize)?.as_ref())
            .unwrap_or(&self.outside);
        let i = (at / CACHE_ENTRIES % CACHES) as usize;
        u.unwind_frame(frame, regs, &mut self.caches[i], read_stack)
            .ok()
            .flatten()
    }
}

/// Registers of an architecture whose rules [`cfi`] works out and executes (x86_64);
/// framehop does all the work for the others.
trait OwnRules: Sized {
    /// [`cfi::exec`], or `None` for an architecture without rules of its own.
    fn exec<F>(
        _rule: cfi::Rule,
        _first: bool,
        _regs: &mut Self,
        _read_stack: &mut F,
    ) -> Option<Result<Option<u64>, ()>>
    where
        F: FnMut(u64) -> Result<u64, ()>,
    {
        None
    }
}

impl OwnRules for UnwindRegsX86_64 {
    fn exec<F>(
        rule: cfi::Rule,
        first: bool,
        regs: &mut Self,
        read_stack: &mut F,
    ) -> Option<Result<Option<u64>, ()>>
    where
        F: FnMut(u64) -> Result<u64, ()>,
    {
        Some(cfi::exec(rule, first, regs, read_stack))
    }
}

impl OwnRules for UnwindRegsAarch64 {}

enum ArchState {
    X86(ImageUnwinders<UnwinderX86_64<Bytes>>),
    Arm(ImageUnwinders<UnwinderAarch64<Bytes>>),
}

/// A DSO as far as one worker's unwinder knows it.
#[derive(Clone)]
enum Image {
    /// Not met yet.
    Unseen,
    /// No unwind tables (not provable, not a user file, or unreadable).
    None,
    /// Added to the unwinder at its slot.
    Known(Arc<DsoUnwind>),
}

/// Per-worker unwinding state.
///
/// The unwinder works in one address space shared by every process: each DSO's
/// image lies at its own slot, and a sample's code addresses (its IP, and each word
/// read from its stack that falls in an executable mapping of its process) are moved
/// there before framehop sees them. framehop caches unwind rules by address, so
/// unwinding in each process's own addresses (ASLR puts every library elsewhere)
/// started each process, and each new mapping of it, with a cold cache: on a
/// recording of many short processes a fifth of all frames missed and evaluated CFI
/// again. In image addresses the rule for a return address in libc is found once per
/// worker. Modules are added only when a DSO is first met, so the cache is
/// invalidated at most once per DSO.
pub struct Worker {
    arch: ArchState,
    images: Vec<Image>,
    /// What the workers of one run share.
    shared: Arc<Shared>,
    /// A sample's frames with their process addresses (kept for its buffer).
    frames: Vec<(Frame, u64)>,
    /// [`ToImage`]'s buffer.
    shifts: Vec<Option<Option<u64>>>,
    clock: CpuAnchor,
}

/// A recent reading of the thread's CPU time beside the wall clock. Reading the CPU
/// clock is a system call (about a microsecond here, 15 % of the whole resolve stage
/// when done per sample), so a sample's own CPU start is never read: it is at most the
/// anchor's CPU time plus the wall time since the anchor (a thread cannot run longer
/// than the clock), which bounds the CPU a sample has used from below. The anchor is
/// renewed every [`ANCHOR_EVERY`] samples so the bound stays tight when the worker
/// was preempted earlier.
struct CpuAnchor {
    wall: Instant,
    cpu: Duration,
    samples: u32,
}

/// Samples between two readings of the CPU clock.
const ANCHOR_EVERY: u32 = 64;

impl CpuAnchor {
    fn now() -> Self {
        CpuAnchor {
            wall: Instant::now(),
            cpu: thread_cpu_time(),
            samples: 0,
        }
    }

    /// Called once per sample before its wall clock starts.
    fn tick(&mut self) {
        self.samples += 1;
        if self.samples >= ANCHOR_EVERY {
            *self = CpuAnchor::now();
        }
    }

    /// True when the sample that began at `start` has used more than `budget` of CPU
    /// time for certain. `first_check` is the sample's CPU clock at its first check
    /// that could not tell: after time off the CPU since the anchor (another process
    /// ran, a lock was waited for) the anchor's bound stays loose for the rest of the
    /// window, and the CPU used since that check is then the sample's lower bound.
    fn spent(&self, start: Instant, first_check: &mut Option<Duration>, budget: Duration) -> bool {
        let now = thread_cpu_time();
        let cpu_at_start_max = self.cpu + start.saturating_duration_since(self.wall);
        let used = now
            .saturating_sub(cpu_at_start_max)
            .max(first_check.map_or(Duration::ZERO, |c| now.saturating_sub(c)));
        if used > budget {
            return true;
        }
        first_check.get_or_insert(now);
        false
    }
}

/// Process versions whose mappings the workers keep before they forget them all
/// (bounds memory on recordings of many short processes).
const MAX_PROCESS_VERSIONS: usize = 4096;

/// What the unwinding workers of one resolve run share: the executable file
/// mappings of each process version met (see [`ToImage`]), listed once for all.
#[derive(Default)]
pub struct Shared {
    exec_maps: Mutex<ExecMaps>,
}

#[derive(Default)]
struct ExecMaps {
    /// By process and version.
    versions: HashMap<(u32, usize), Arc<[MapEntry]>>,
    /// The newest version of each process listed so far.
    newest: HashMap<u32, (usize, Arc<[MapEntry]>)>,
}

/// The executable file mappings of an address space.
fn exec_only(maps: Vec<MapEntry>) -> Arc<[MapEntry]> {
    maps.into_iter()
        .filter(|m| m.exec && m.dso.is_some())
        .collect()
}

impl Worker {
    /// Fresh state for `arch`.
    pub fn new(arch: Arch) -> Self {
        Worker::sharing(arch, Arc::default())
    }

    /// Fresh state for `arch`, sharing `shared` with the run's other workers.
    pub fn sharing(arch: Arch, shared: Arc<Shared>) -> Self {
        let arch = match arch {
            Arch::X86_64 => {
                ArchState::X86(ImageUnwinders::new(UnwinderX86_64::new, CacheX86_64::new))
            }
            Arch::Aarch64 => {
                ArchState::Arm(ImageUnwinders::new(UnwinderAarch64::new, CacheAarch64::new))
            }
        };
        Worker {
            arch,
            images: Vec::new(),
            shared,
            frames: Vec::new(),
            shifts: Vec::new(),
            clock: CpuAnchor::now(),
        }
    }

    fn arch(&self) -> Arch {
        match self.arch {
            ArchState::X86(_) => Arch::X86_64,
            ArchState::Arm(_) => Arch::Aarch64,
        }
    }

    /// The executable file mappings of the sample's process as of the sample (none
    /// when unwinding by frame pointers only: addresses then stay the process's).
    fn exec_maps(&self, cfg: &UnwindConfig, model: &Model, s: &SampleStack) -> Arc<[MapEntry]> {
        if cfg.mode != UnwindMode::Dwarf {
            return Arc::from([]);
        }
        let v = model.version(s.pid, s.key);
        let Ok(mut t) = self.shared.exec_maps.lock() else {
            return exec_only(model.address_space(s.pid, s.key));
        };
        if let Some(m) = t.versions.get(&(s.pid, v)) {
            return m.clone();
        }
        // The newest version listed before, with the mappings made since laid over
        // it: a process that maps one more library is not listed again whole.
        let maps: Arc<[MapEntry]> = match t.newest.get(&s.pid) {
            Some((v0, m0)) if *v0 < v => match model.mappings_between(s.pid, *v0, v) {
                Some(new) => {
                    let mut maps = m0.to_vec();
                    for m in new {
                        lay_over(&mut maps, m, |m| m.exec && m.dso.is_some());
                    }
                    maps.into()
                }
                None => exec_only(model.address_space(s.pid, s.key)),
            },
            _ => exec_only(model.address_space(s.pid, s.key)),
        };
        if t.versions.len() >= MAX_PROCESS_VERSIONS {
            t.versions.clear();
            t.newest.clear();
        }
        t.versions.insert((s.pid, v), maps.clone());
        if t.newest.get(&s.pid).is_none_or(|(v0, _)| *v0 < v) {
            t.newest.insert(s.pid, (v, maps.clone()));
        }
        maps
    }

    /// Adds DSO `d`'s image, with its unwind tables when it has any.
    fn meet(&mut self, model: &Model, tables: &UnwindTables, d: DsoId) {
        let i = d as usize;
        if self.images.len() <= i {
            self.images.resize(i + 1, Image::Unseen);
        }
        if !matches!(self.images[i], Image::Unseen) {
            return;
        }
        let (Some(t), Some(base), Some(dso)) =
            (tables.get(model, d), image_addr(d, 0), model.dsos.get(i))
        else {
            self.images[i] = Image::None;
            return;
        };
        let slot = base..base + IMAGE_SLOT;
        let name = dso.name.clone();
        let module = Module::new(name, slot, base, t.info.clone());
        match &mut self.arch {
            ArchState::X86(a) => {
                let rules = t
                    .rules
                    .get_or_init(|| EhFrameRules::new(&t.info).map(Arc::new))
                    .clone();
                a.add(d, module, rules)
            }
            ArchState::Arm(a) => a.add(d, module, None),
        }
        self.images[i] = Image::Known(t.clone());
    }
}

impl DsoUnwind {
    /// Load bias of mapping `m` of this file: its address minus the file's address.
    fn bias(&self, m: &MapEntry) -> Option<u64> {
        // The segment holding the mapped file offset gives the load bias.
        let &(p_offset, p_vaddr) = self
            .segments
            .iter()
            .filter(|(o, _)| *o <= m.pgoff.saturating_add(0xffff))
            .min_by_key(|(o, _)| o.abs_diff(m.pgoff))?;
        let svma_at_start = p_vaddr.wrapping_add(m.pgoff).wrapping_sub(p_offset);
        Some(m.start.wrapping_sub(svma_at_start))
    }
}

/// Moves a process's code addresses into image addresses: the translation between
/// the sample's process and the worker's one address space.
struct ToImage<'a> {
    /// The process's executable file mappings, sorted.
    maps: &'a [MapEntry],
    images: &'a [Image],
    /// The sample's stack copy: words pointing into it are not code, and are the most
    /// common words read (saved frame pointers).
    stack: Range<u64>,
    /// The last mapping that answered, with the shift into its image (`None`: not
    /// moved).
    last: Option<(u64, u64, Option<u64>)>,
    /// The shift of each mapping once worked out (by index in `maps`; the outer
    /// `None`: not yet). A walk reads a handful of mappings over and over.
    shifts: &'a mut Vec<Option<Option<u64>>>,
    /// DSOs met in executable mappings that the worker has no image of yet.
    unseen: Vec<DsoId>,
}

impl<'a> ToImage<'a> {
    /// Moves addresses of the process mapped as `maps` (sorted) with the images the
    /// worker has; `shifts` is a buffer to reuse.
    fn new(
        maps: &'a [MapEntry],
        images: &'a [Image],
        stack: Range<u64>,
        shifts: &'a mut Vec<Option<Option<u64>>>,
    ) -> Self {
        shifts.clear();
        shifts.resize(maps.len(), None);
        ToImage {
            maps,
            images,
            stack,
            last: None,
            shifts,
            unseen: Vec::new(),
        }
    }

    /// The instruction pointer `ip` in image addresses.
    fn ip(&mut self, ip: u64) -> u64 {
        self.moved(ip, ip)
    }

    /// A word that may be a return address, in image addresses. The mapping of the
    /// call instruction before it decides (framehop looks return addresses up one
    /// byte back): a return address at the very start of a mapping belongs to what
    /// lies before it.
    fn word(&mut self, v: u64) -> u64 {
        self.moved(v, v.wrapping_sub(1))
    }

    /// `addr` moved by the shift of the mapping that holds `at`.
    fn moved(&mut self, addr: u64, at: u64) -> u64 {
        if addr >= IMAGE_BASE {
            return outside_images(addr);
        }
        if self.stack.contains(&at) {
            return addr;
        }
        if let Some((start, end, shift)) = self.last
            && start <= at
            && at < end
        {
            return shift.map_or(addr, |s| addr.wrapping_add(s));
        }
        // Saved frame pointers into the stack beyond the copy are most of the words
        // read that are not code: above every mapping.
        if self.maps.last().is_none_or(|m| at >= m.end) {
            return addr;
        }
        let i = self.maps.partition_point(|m| m.start <= at);
        let Some(j) = i.checked_sub(1) else {
            return addr;
        };
        let Some(m) = self.maps.get(j).filter(|m| at < m.end) else {
            return addr;
        };
        let shift = match self.shifts.get(j) {
            Some(Some(shift)) => *shift,
            _ => {
                let shift = self.shift(m);
                if let Some(slot) = self.shifts.get_mut(j) {
                    *slot = Some(shift);
                }
                shift
            }
        };
        self.last = Some((m.start, m.end, shift));
        shift.map_or(addr, |s| addr.wrapping_add(s))
    }

    /// The process address of image address `at`: moved back by the shift of the
    /// mapping of its DSO that moved it (the shift of every mapping met is kept).
    fn back(&self, at: u64) -> Option<u64> {
        let d = image_dso(at)?;
        self.maps
            .iter()
            .zip(self.shifts.iter())
            .filter(|(m, _)| m.dso == Some(d))
            .find_map(|(m, shift)| {
                let p = at.wrapping_sub((*shift)??);
                (m.start <= p && p < m.end).then_some(p)
            })
    }

    /// The shift that moves all of mapping `m` into its DSO's image slot, if the
    /// worker knows the image and the whole mapping fits the slot.
    fn shift(&mut self, m: &MapEntry) -> Option<u64> {
        let d = m.dso?;
        let t = match self.images.get(d as usize) {
            Some(Image::Known(t)) => t,
            Some(Image::None) => return None,
            Some(Image::Unseen) | None => {
                if !self.unseen.contains(&d) {
                    self.unseen.push(d);
                }
                return None;
            }
        };
        let image_start = image_addr(d, m.start.wrapping_sub(t.bias(m)?))?;
        let shift = image_start.wrapping_sub(m.start);
        (image_dso(m.end.wrapping_sub(1).wrapping_add(shift)) == Some(d)).then_some(shift)
    }
}

/// The lowest user stack pointer unwound: Linux never maps the first page
/// (`vm.mmap_min_addr` is at least 4096), and user space ends below 2^57 (x86_64
/// with 5-level paging; aarch64 stops at 2^52). A sample saying its stack is
/// elsewhere says nothing true, and framehop computes `cfa - 8` unchecked: fuzzing
/// found the overflow with SP 0 and with SP 2^64 - 1 (`rsp + 8` wrapping to 7).
const MIN_USER_SP: u64 = 4096;
/// One past the highest user stack pointer unwound (see [`MIN_USER_SP`]).
const END_USER_SP: u64 = 1 << 57;

/// Perf register numbers (arch/*/include/uapi/asm/perf_regs.h).
const X86_BP: u32 = 6;
const X86_SP: u32 = 7;
const X86_IP: u32 = 8;
const ARM_FP: u32 = 29;
const ARM_LR: u32 = 30;
const ARM_SP: u32 = 31;
const ARM_PC: u32 = 32;

/// Reads register `reg` from a sample's user registers (stored in mask-bit order).
fn reg(regs: &[u8], mask: u64, reg: u32, e: Endian) -> Option<u64> {
    if mask & (1 << reg) == 0 {
        return None;
    }
    let idx = (mask & ((1u64 << reg) - 1)).count_ones() as usize;
    e.u64(regs, idx * 8)
}

/// The inputs of one sample's unwind.
pub struct SampleStack<'a> {
    /// Process.
    pub pid: u32,
    /// Model key of the sample.
    pub key: Key,
    /// `attr.sample_regs_user`.
    pub regs_mask: u64,
    /// Register values.
    pub regs: &'a [u8],
    /// The valid part of the stack copy, starting at the user SP.
    pub stack: &'a [u8],
    /// Byte order of the file.
    pub e: Endian,
}

/// Unwinds one sample; `on_frame` gets the user IP's frame and then each return
/// address's (minus one: the address inside the call instruction, which is the
/// caller's).
pub fn unwind(
    cfg: &UnwindConfig,
    model: &Model,
    tables: &UnwindTables,
    w: &mut Worker,
    s: &SampleStack<'_>,
    on_frame: &mut dyn FnMut(Frame),
) -> Outcome {
    unwind_at(cfg, model, tables, w, s, &mut |f, _| on_frame(f))
}

/// [`unwind`], each frame with its address in the process (the IP; a return address
/// minus one), as `--convert-callchain` writes it: the image address the unwinder
/// worked in moved back by the shift of the mapping it came from.
pub fn unwind_at(
    cfg: &UnwindConfig,
    model: &Model,
    tables: &UnwindTables,
    w: &mut Worker,
    s: &SampleStack<'_>,
    on_frame: &mut dyn FnMut(Frame, u64),
) -> Outcome {
    w.clock.tick();
    let maps = w.exec_maps(cfg, model, s);
    // DSOs are given to the unwinder when a walk first reaches one of them; the walk
    // is then done again with their images (at most once per DSO and worker).
    // Frames are held until the last walk, so a walk done again counts nothing twice.
    let mut frames = std::mem::take(&mut w.frames);
    loop {
        frames.clear();
        let (o, unseen) = walk_sample(cfg, w, s, &maps, &mut |f, a| frames.push((f, a)));
        if unseen.is_empty() || cfg.mode != UnwindMode::Dwarf {
            for &(f, a) in &frames {
                on_frame(f, a);
            }
            w.frames = frames;
            return o;
        }
        for d in unseen {
            w.meet(model, tables, d);
        }
    }
}

/// One walk of a sample's stack with the images the worker has; also returns the
/// DSOs it met that have no image yet.
fn walk_sample(
    cfg: &UnwindConfig,
    w: &mut Worker,
    s: &SampleStack<'_>,
    maps: &[MapEntry],
    on_frame: &mut dyn FnMut(Frame, u64),
) -> (Outcome, Vec<DsoId>) {
    let e = s.e;
    let r = |n| reg(s.regs, s.regs_mask, n, e);
    let Worker {
        arch,
        images,
        clock,
        shifts,
        ..
    } = w;
    let mut to_image = ToImage::new(maps, images, 0..0, shifts);
    let mut on_address = |a: u64, p: u64| {
        on_frame(
            match image_dso(a) {
                Some(d) => Frame::Dso(d),
                None => Frame::Address(a),
            },
            p,
        )
    };
    let o = match arch {
        ArchState::X86(a) => {
            let (Some(ip), Some(sp @ MIN_USER_SP..END_USER_SP), Some(bp)) =
                (r(X86_IP), r(X86_SP), r(X86_BP))
            else {
                return (Outcome::default(), Vec::new());
            };
            to_image.stack = sp..sp.saturating_add(s.stack.len() as u64);
            let ip = to_image.ip(ip);
            // Like every stack word: a frame pointer in the slots is nothing (and
            // cannot wrap a CFA computed from it below zero).
            let regs = UnwindRegsX86_64::new(ip, sp, outside_images(bp));
            walk(
                a,
                ip,
                regs,
                sp,
                s,
                cfg,
                clock,
                &mut to_image,
                &mut on_address,
            )
        }
        ArchState::Arm(a) => {
            let (Some(pc), Some(lr), Some(sp @ MIN_USER_SP..END_USER_SP), Some(fp)) =
                (r(ARM_PC), r(ARM_LR), r(ARM_SP), r(ARM_FP))
            else {
                return (Outcome::default(), Vec::new());
            };
            to_image.stack = sp..sp.saturating_add(s.stack.len() as u64);
            let (pc, lr) = (to_image.ip(pc), to_image.word(lr));
            let regs = UnwindRegsAarch64::new(lr, sp, outside_images(fp));
            walk(
                a,
                pc,
                regs,
                sp,
                s,
                cfg,
                clock,
                &mut to_image,
                &mut on_address,
            )
        }
    };
    (o, to_image.unseen)
}

/// How often the clock is read, in frames.
const CLOCK_EVERY: usize = 8;

#[allow(clippy::too_many_arguments)]
fn walk<U: Unwinder<Module = Module<Bytes>>>(
    a: &mut ImageUnwinders<U>,
    pc: u64,
    regs: U::UnwindRegs,
    sp: u64,
    s: &SampleStack<'_>,
    cfg: &UnwindConfig,
    clock: &CpuAnchor,
    to_image: &mut ToImage<'_>,
    on_return: &mut dyn FnMut(u64, u64),
) -> Outcome
where
    U::UnwindRegs: OwnRules,
{
    let (stack, e) = (s.stack, s.e);
    let start = Instant::now();
    let mut out = Outcome::default();
    let mut regs = regs;
    let mut frame = FrameAddress::InstructionPointer(pc);
    let mut n = 0usize;
    let mut first_check = None;
    // framehop's UnwindIterator, with the cache picked per frame. Errors are normal
    // at the end of a stack: keep what was found.
    loop {
        n += 1;
        // The first frame is the user IP from the registers: for samples taken in the
        // kernel it is the only record of where user space was.
        let at = frame.address_for_lookup();
        // An address no image holds was never moved; one in an image goes back by
        // its mapping's shift (0 where that cannot be told: no such frame is written).
        on_return(
            at,
            if image_dso(at).is_some() {
                to_image.back(at).unwrap_or(0)
            } else {
                at
            },
        );
        if let FrameAddress::ReturnAddress(_) = frame {
            out.frames += 1;
        }
        if n >= cfg.max_frames {
            out.frame_capped = true;
            break;
        }
        // The wall clock is cheap (vDSO); only when it says the budget is spent is the
        // thread's CPU time asked, so a worker preempted by another process is not
        // charged for the time it did not run.
        if n.is_multiple_of(CLOCK_EVERY)
            && start.elapsed() > cfg.budget
            && clock.spent(start, &mut first_check, cfg.budget)
        {
            out.over_budget = true;
            break;
        }
        // Every word read may be a return address: moved to its image like the IP.
        let mut read_stack = |addr: u64| -> Result<u64, ()> {
            let off = addr.checked_sub(sp).ok_or(())?;
            let off = usize::try_from(off).map_err(|_| ())?;
            e.u64(stack, off).map(|v| to_image.word(v)).ok_or(())
        };
        match a
            .step(frame, &mut regs, &mut read_stack)
            .and_then(FrameAddress::from_return_address)
        {
            Some(ra) => frame = ra,
            None => break,
        }
    }
    out
}

/// CPU time consumed by the calling thread.
fn thread_cpu_time() -> Duration {
    // SAFETY: clock_gettime writes the timespec.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rules [`cfi`] works out and executes unwind every address of real
    /// libraries as framehop does on its own: the same return address (or end) and
    /// the same registers after, for the first frame and for return addresses, on
    /// stacks of varied words. framehop is the oracle.
    #[test]
    fn own_rules_unwind_as_framehop_does() {
        let files = [
            "/lib/x86_64-linux-gnu/libc.so.6",
            "/lib/x86_64-linux-gnu/libm.so.6",
            "/proc/self/exe",
        ];
        let (mut checked, mut own) = (0u64, 0u64);
        for path in files {
            let Ok(f) = std::fs::File::open(path) else {
                continue;
            };
            let Some(t) = load_sections(&f, FileTimes::default()) else {
                continue;
            };
            let Some(rules) = EhFrameRules::new(&t.info) else {
                continue;
            };
            let text = t.info.text_svma.clone().expect("a library has .text");
            let base = 0x10_0000_0000u64;
            let module = Module::new(
                path.to_string(),
                base..base + IMAGE_SLOT,
                base,
                t.info.clone(),
            );
            let mut u: UnwinderX86_64<Bytes> = UnwinderX86_64::new();
            u.add_module(module);
            let mut cache = CacheX86_64::new();
            let sp = 0x7ff0_0000_1000u64;
            // Stack words: return-address-like, frame-pointer-like and zero.
            let word = |a: u64| -> u64 {
                match (a / 8) % 5 {
                    0 => base + text.start + (a % 4093),
                    1 => a + 0x40,
                    2 => 0,
                    3 => a.wrapping_sub(0x30),
                    _ => base + text.start + (a % 97),
                }
            };
            let read = |a: u64| -> Result<u64, ()> {
                if (sp..sp + 2048).contains(&a) && a.is_multiple_of(8) {
                    Ok(word(a))
                } else {
                    Err(())
                }
            };
            let step = ((text.end - text.start) / 20_000).max(1) | 1;
            for svma in (text.start..text.end).step_by(step as usize) {
                for (first, bp) in [
                    (true, sp + 0x40),
                    (false, sp + 0x40),
                    (false, sp - 8),
                    (true, 0),
                ] {
                    let frame = if first {
                        FrameAddress::from_instruction_pointer(base + svma)
                    } else {
                        FrameAddress::from_return_address(base + svma + 1).expect("nonzero")
                    };
                    let mut theirs = UnwindRegsX86_64::new(base + svma, sp, bp);
                    let expected = u
                        .unwind_frame(frame, &mut theirs, &mut cache, &mut read.clone())
                        .ok()
                        .flatten();
                    let mut ours = UnwindRegsX86_64::new(base + svma, sp, bp);
                    let got = match rules.find(frame.address_for_lookup() - base) {
                        cfi::Found::Rule(r) => {
                            own += 1;
                            cfi::exec(r, first, &mut ours, &mut read.clone())
                                .ok()
                                .flatten()
                        }
                        cfi::Found::Framehop => u
                            .unwind_frame(frame, &mut ours, &mut cache, &mut read.clone())
                            .ok()
                            .flatten(),
                    };
                    assert_eq!(got, expected, "{path} {svma:#x} first={first} bp={bp:#x}");
                    if expected.is_some() {
                        assert_eq!(
                            (ours.ip(), ours.sp(), ours.bp()),
                            (theirs.ip(), theirs.sp(), theirs.bp()),
                            "{path} {svma:#x} first={first} bp={bp:#x}"
                        );
                    }
                    checked += 1;
                }
            }
        }
        assert!(checked > 10_000, "only {checked} frames compared");
        assert!(
            own * 10 > checked * 9,
            "only {own} of {checked} by the own rules"
        );
    }

    fn exec_map(start: u64, end: u64, dso: DsoId) -> MapEntry {
        MapEntry {
            start,
            end,
            pgoff: 0,
            dso: Some(dso),
            exec: true,
        }
    }

    #[test]
    fn code_addresses_move_to_their_image_and_stray_words_nowhere() {
        let known = Image::Known(Arc::new(DsoUnwind {
            segments: vec![(0, 0)],
            info: ExplicitModuleSectionInfo::default(),
            rules: OnceLock::new(),
            proven: FileTimes::default(),
            loads: Vec::new(),
            by_id: false,
        }));
        // DSO 1 mapped at 0x1000..0x3000 (file offset 0 at address 0x1000), DSO 2
        // right after it, DSO 3 not met by the worker yet.
        let maps = [
            exec_map(0x1000, 0x3000, 1),
            exec_map(0x3000, 0x4000, 2),
            exec_map(0x8000, 0x9000, 3),
        ];
        let images = [Image::None, known.clone(), known, Image::Unseen];
        let mut shifts = Vec::new();
        let mut t = ToImage::new(&maps, &images, 0x7000..0x7100, &mut shifts);
        let image = |d, svma| image_addr(d, svma).unwrap();
        assert_eq!(t.ip(0x1010), image(1, 0x10));
        assert_eq!(image_dso(t.ip(0x2fff)), Some(1));
        // A return address is its call's: one at the start of DSO 2 returns into
        // code of DSO 1 (moved as DSO 1's, one past its end), one at its end into
        // DSO 2.
        assert_eq!(t.word(0x3000), image(1, 0x2000));
        assert_eq!(t.word(0x4000), image(2, 0x1000));
        // Stack words, unmapped words and words of unmet DSOs stay; an unmet DSO is
        // noted for the next walk.
        assert_eq!(t.word(0x7008), 0x7008);
        assert_eq!(t.word(0x5000), 0x5000);
        assert_eq!(t.word(0x8010), 0x8010);
        assert_eq!(t.unseen, vec![3]);
        // A word that is already in the slots (a stray value, a kernel address) is
        // never taken for code there.
        for stray in [image(1, 0x10), u64::MAX, 0xffff_ffff_8100_0000] {
            assert_eq!(t.word(stray), NOWHERE);
            assert_eq!(image_dso(NOWHERE), None);
        }
    }

    #[test]
    fn tables_loaded_early_are_checked_against_the_whole_recording() {
        // A table proven while the scan thought the recording started later, and
        // with fewer executable mappings seen, is kept only if the final start and
        // mappings would have let it be loaded too.
        let t = |mtime, ctime, btime| DsoUnwind {
            segments: vec![(0, 0), (0x1000, 0x1000)],
            info: ExplicitModuleSectionInfo::default(),
            rules: OnceLock::new(),
            proven: FileTimes {
                mtime,
                ctime,
                btime,
            },
            loads: vec![
                Segment {
                    filesz: 0x490,
                    memsz: 0x490,
                    ..Segment::default()
                },
                Segment {
                    offset: 0x1000,
                    vaddr: 0x1000,
                    filesz: 0x189,
                    memsz: 0x189,
                    exec: true,
                },
            ],
            by_id: false,
        };
        let tables = |d: DsoUnwind| UnwindTables {
            per_dso: vec![OnceLock::from(Some(Arc::new(d))), OnceLock::from(None)],
            ..UnwindTables::default()
        };
        let inode = crate::format::record::FileIdent::Inode {
            maj: 8,
            min: 1,
            ino: 42,
            generation: 0,
        };
        let dso = |ident, maps: &[(u64, u64)]| {
            let mut exec_maps = crate::model::ExecMaps::default();
            for &(o, l) in maps {
                exec_maps.add(o, l);
            }
            Dso {
                name: "/lib/x.so".into(),
                kind: DsoKind::User,
                ident,
                exec_maps,
            }
        };
        let at = |ns| RecordingStart::Known(ns);
        let two = |m: &[(u64, u64)]| vec![dso(inode, m), dso(inode, &[(0x5000, 0x1000)])];
        let text = [(0x1000, 0x1000)];
        assert!(tables(t(100, 100, None)).still_proven(&two(&text), &at(150)));
        // Modified after the real start.
        assert!(!tables(t(100, 100, None)).still_proven(&two(&text), &at(99)));
        // Created after it (its mtime set back).
        assert!(!tables(t(100, 120, Some(120))).still_proven(&two(&text), &at(110)));
        // Changed after it: not stale when the recorded mapping is the file's text
        // segment exactly (a link, a chmod), stale when it is not (rewritten), or
        // when the records name no inode.
        assert!(tables(t(100, 120, Some(90))).still_proven(&two(&text), &at(110)));
        assert!(!tables(t(100, 120, None)).still_proven(&two(&[(0x1000, 0x2000)]), &at(110)));
        let no_inode = vec![
            dso(crate::format::record::FileIdent::None, &text),
            dso(inode, &[]),
        ];
        assert!(!tables(t(100, 120, None)).still_proven(&no_inode, &at(110)));
        // An offset mapped later that no segment holds.
        let far = [(0x1000, 0x1000), (0x9_0000, 0x1000)];
        assert!(!tables(t(100, 100, None)).still_proven(&two(&far), &at(150)));
        // Undated at the end: nothing loaded may stay.
        let undated = RecordingStart::Unknown("x".into());
        assert!(!tables(t(100, 100, None)).still_proven(&two(&text), &undated));
        assert!(UnwindTables::default().still_proven(&[], &undated));
    }

    #[test]
    fn a_stack_outside_user_space_is_not_walked() {
        // What fuzzing found: SP 0 or 2^64 - 1 let framehop compute `cfa - 8` below
        // zero.
        let mask: u64 = (1 << X86_BP) | (1 << X86_SP) | (1 << X86_IP);
        let (model, tables) = (Model::default(), UnwindTables::default());
        let cfg = UnwindConfig {
            mode: UnwindMode::Dwarf,
            arch: Arch::X86_64,
            budget: Duration::from_millis(1),
            max_frames: 512,
        };
        let mut w = Worker::new(Arch::X86_64);
        for (sp, walked) in [
            (0u64, false),
            (4088, false),
            (u64::MAX, false),
            (1 << 57, false),
            (0x7ffc_0000, true),
        ] {
            let regs: Vec<u8> = [0u64, sp, 0x40_1000]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect();
            let s = SampleStack {
                pid: 1,
                key: (0, 0),
                regs_mask: mask,
                regs: &regs,
                stack: &[0; 16],
                e: Endian::Little,
            };
            let mut frames = 0;
            unwind(&cfg, &model, &tables, &mut w, &s, &mut |_| frames += 1);
            assert_eq!(frames > 0, walked, "sp {sp:#x}");
        }
    }

    #[test]
    fn registers_by_mask_position() {
        let mask = (1 << X86_BP) | (1 << X86_SP) | (1 << X86_IP);
        let regs: Vec<u8> = [10u64, 20, 30]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(reg(&regs, mask, X86_BP, Endian::Little), Some(10));
        assert_eq!(reg(&regs, mask, X86_IP, Endian::Little), Some(30));
        assert_eq!(reg(&regs, mask, 0, Endian::Little), None);
    }
}
