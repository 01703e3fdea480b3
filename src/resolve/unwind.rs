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
//! Unwind sections are loaded once per DSO (keyed by its model identity) and shared by
//! every process and worker; each worker keeps its own framehop cache and one unwinder
//! per (process, address-space version), so a process's samples reuse the same module
//! list until a mapping changes. Section data is read into memory (not mapped), so a
//! file changing under us cannot fault the process.

use crate::buildid::RecordingStart;
use crate::buildid::elf::prove_and_read;
use crate::format::Endian;
use crate::model::{DsoId, DsoKind, Key, Model};
use framehop::aarch64::{CacheAarch64, UnwindRegsAarch64, UnwinderAarch64};
use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{ExplicitModuleSectionInfo, FrameAddress, Module, Unwinder};
use object::{Object, ObjectSection, ObjectSegment};
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
}

impl Default for UnwindTables {
    /// No tables yet, and no local file trusted until [`UnwindTables::set_proof`].
    fn default() -> Self {
        UnwindTables {
            per_dso: Vec::new(),
            by_file: Mutex::new(HashMap::new()),
            allow_local: false,
            start: RecordingStart::Unknown("not dated yet".into()),
        }
    }
}

impl UnwindTables {
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
        let proven = prove_and_read(
            Path::new(&dso.name),
            &dso.ident,
            &dso.exec_pgoffs,
            &self.start,
        )
        .ok()?;
        if let Some(t) = self.by_file.lock().ok()?.get(&proven.key) {
            return Some(t.clone());
        }
        // Loaded outside the lock; a second worker racing on the same file keeps the
        // first copy stored.
        let t = Arc::new(load_sections(&proven.file)?);
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

fn load_sections(file: &std::fs::File) -> Option<DsoUnwind> {
    let cache = object::read::ReadCache::new(file);
    let obj = object::File::parse(&cache).ok()?;
    let segments = obj
        .segments()
        .map(|s| (s.file_range().0, s.address()))
        .collect();
    let section = |name: &str, max: u64| -> Option<(Range<u64>, Bytes)> {
        let s = obj.section_by_name(name)?;
        if s.size() > max {
            return None;
        }
        let data = s.uncompressed_data().ok()?.into_owned();
        let n = data.len();
        Some((
            s.address()..s.address() + s.size(),
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
        let le = obj.is_little_endian();
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
    if let Some(s) = obj.section_by_name(".text") {
        info.text_svma = Some(s.address()..s.address() + s.size());
    }
    if let Some(s) = obj.section_by_name(".got") {
        info.got_svma = Some(s.address()..s.address() + s.size());
    }
    Some(DsoUnwind { segments, info })
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

type Modules = HashMap<(DsoId, u64, u64, u64), Module<Bytes>>;

enum ArchState {
    X86 {
        cache: Box<CacheX86_64>,
        unwinders: HashMap<(u32, usize), UnwinderX86_64<Bytes>>,
    },
    Arm {
        cache: Box<CacheAarch64>,
        unwinders: HashMap<(u32, usize), UnwinderAarch64<Bytes>>,
    },
}

/// Per-worker unwinding state.
pub struct Worker {
    arch: ArchState,
    modules: Modules,
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
    /// time for certain.
    fn spent(&self, start: Instant, budget: Duration) -> bool {
        let cpu_at_start_max = self.cpu + start.saturating_duration_since(self.wall);
        thread_cpu_time().saturating_sub(cpu_at_start_max) > budget
    }
}

/// Unwinders kept per worker before the map is cleared (bounds memory on recordings
/// of many short processes).
const MAX_UNWINDERS: usize = 4096;

impl Worker {
    /// Fresh state for `arch`.
    pub fn new(arch: Arch) -> Self {
        let arch = match arch {
            Arch::X86_64 => ArchState::X86 {
                cache: Box::new(CacheX86_64::new()),
                unwinders: HashMap::new(),
            },
            Arch::Aarch64 => ArchState::Arm {
                cache: Box::new(CacheAarch64::new()),
                unwinders: HashMap::new(),
            },
        };
        Worker {
            arch,
            modules: HashMap::new(),
            clock: CpuAnchor::now(),
        }
    }
}

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

/// Unwinds one sample; `on_return` gets the user IP and then each return address
/// (minus one: the address inside the call instruction, which is the caller's).
pub fn unwind(
    cfg: &UnwindConfig,
    model: &Model,
    tables: &UnwindTables,
    w: &mut Worker,
    s: &SampleStack<'_>,
    on_return: &mut dyn FnMut(u64),
) -> Outcome {
    let e = s.e;
    let r = |n| reg(s.regs, s.regs_mask, n, e);
    let Worker {
        arch,
        modules,
        clock,
    } = w;
    clock.tick();
    let mut job = Job {
        cfg,
        model,
        tables,
        modules,
        s,
        clock,
        on_return,
    };
    match arch {
        ArchState::X86 { cache, unwinders } => {
            let (Some(ip), Some(sp), Some(bp)) = (r(X86_IP), r(X86_SP), r(X86_BP)) else {
                return Outcome::default();
            };
            let regs = UnwindRegsX86_64::new(ip, sp, bp);
            job.run(unwinders, cache, UnwinderX86_64::new, ip, regs, sp)
        }
        ArchState::Arm { cache, unwinders } => {
            let (Some(pc), Some(lr), Some(sp), Some(fp)) =
                (r(ARM_PC), r(ARM_LR), r(ARM_SP), r(ARM_FP))
            else {
                return Outcome::default();
            };
            let regs = UnwindRegsAarch64::new(lr, sp, fp);
            job.run(unwinders, cache, UnwinderAarch64::new, pc, regs, sp)
        }
    }
}

/// One sample's unwind, apart from the architecture's own state.
struct Job<'j, 's> {
    cfg: &'j UnwindConfig,
    model: &'j Model,
    tables: &'j UnwindTables,
    modules: &'j mut Modules,
    s: &'j SampleStack<'s>,
    clock: &'j CpuAnchor,
    on_return: &'j mut dyn FnMut(u64),
}

impl Job<'_, '_> {
    /// Walks from `pc` with the architecture's unwinder for the sample's process.
    fn run<U>(
        &mut self,
        unwinders: &mut HashMap<(u32, usize), U>,
        cache: &mut U::Cache,
        new: fn() -> U,
        pc: u64,
        regs: U::UnwindRegs,
        sp: u64,
    ) -> Outcome
    where
        U: Unwinder<Module = Module<Bytes>>,
    {
        let u = unwinder_for(
            unwinders,
            self.modules,
            self.cfg,
            self.model,
            self.tables,
            self.s,
            new,
        );
        walk(
            u,
            cache,
            pc,
            regs,
            sp,
            self.s,
            self.cfg,
            self.clock,
            self.on_return,
        )
    }
}

/// The worker's unwinder for the sample's process as of its key, built on first use.
fn unwinder_for<'u, U>(
    unwinders: &'u mut HashMap<(u32, usize), U>,
    modules: &mut Modules,
    cfg: &UnwindConfig,
    model: &Model,
    tables: &UnwindTables,
    s: &SampleStack<'_>,
    new: fn() -> U,
) -> &'u U
where
    U: Unwinder<Module = Module<Bytes>>,
{
    let k = (s.pid, model.version(s.pid, s.key));
    if !unwinders.contains_key(&k) && unwinders.len() >= MAX_UNWINDERS {
        unwinders.clear();
        modules.clear();
    }
    unwinders.entry(k).or_insert_with(|| {
        let mut u = new();
        if cfg.mode == UnwindMode::Dwarf {
            for m in model.address_space(s.pid, s.key) {
                let Some(d) = m.dso.filter(|_| m.exec) else {
                    continue;
                };
                let Some(t) = tables.get(model, d) else {
                    continue;
                };
                // The segment holding the mapped file offset gives the load bias.
                let Some(&(p_offset, p_vaddr)) = t
                    .segments
                    .iter()
                    .filter(|(o, _)| *o <= m.pgoff.saturating_add(0xffff))
                    .min_by_key(|(o, _)| o.abs_diff(m.pgoff))
                else {
                    continue;
                };
                let svma_at_start = p_vaddr.wrapping_add(m.pgoff).wrapping_sub(p_offset);
                let bias = m.start.wrapping_sub(svma_at_start);
                let module = modules
                    .entry((d, m.start, m.end, bias))
                    .or_insert_with(|| {
                        Module::new(
                            model.dsos[d as usize].name.clone(),
                            m.start..m.end,
                            bias,
                            t.info.clone(),
                        )
                    })
                    .clone();
                u.add_module(module);
            }
        }
        u
    })
}

/// How often the clock is read, in frames.
const CLOCK_EVERY: usize = 8;

#[allow(clippy::too_many_arguments)]
fn walk<U: Unwinder>(
    u: &U,
    cache: &mut U::Cache,
    pc: u64,
    regs: U::UnwindRegs,
    sp: u64,
    s: &SampleStack<'_>,
    cfg: &UnwindConfig,
    clock: &CpuAnchor,
    on_return: &mut dyn FnMut(u64),
) -> Outcome {
    let (stack, e) = (s.stack, s.e);
    let mut read_stack = |addr: u64| -> Result<u64, ()> {
        let off = addr.checked_sub(sp).ok_or(())?;
        let off = usize::try_from(off).map_err(|_| ())?;
        e.u64(stack, off).ok_or(())
    };
    let start = Instant::now();
    let mut out = Outcome::default();
    let mut it = u.iter_frames(pc, regs, cache, &mut read_stack);
    let mut n = 0usize;
    // Errors are normal at the end of a stack: keep what was found.
    while let Ok(Some(frame)) = it.next() {
        n += 1;
        // The first frame is the user IP from the registers: for samples taken in the
        // kernel it is the only record of where user space was.
        on_return(frame.address_for_lookup());
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
            && clock.spent(start, cfg.budget)
        {
            out.over_budget = true;
            break;
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
