//! The resolve stage: rayon workers take chunks, decode their samples and turn sample
//! IPs, callchain entries, branch-stack ends and DWARF-unwound return addresses into
//! DSO hits against the model at the sample's time. Results merge in chunk order, so
//! output never depends on the number of threads.

pub mod callchain;
mod cfi;
pub mod unwind;

use crate::format::Endian;
use crate::format::attr::Attr;
use crate::format::record::{CallchainDeferred, TrailerLayout, misc, rt};
use crate::format::sample::{SampleLayout, sample_id, u64s};
use crate::format::walk::{Chunk, Rec, Walker};
use crate::input::DataFile;
use crate::model::{DsoId, KERNEL_PID, Key, MapEntry, Model, Seen, Space};
use crate::{Error, Result};
use rayon::prelude::*;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use unwind::{Frame, Outcome, SampleStack, UnwindConfig, UnwindMode, UnwindTables};

/// Another pass that walks each chunk together with the resolve, so that the records
/// are read and the user stacks unwound once for both: `--convert-callchain`'s
/// converter ([`crate::convert`]) writes each chunk converted while the resolve counts
/// its hits from the same frames.
pub trait Tap: Sync {
    /// The pass over one chunk, handed every record of it in order.
    fn chunk<'t>(&'t self, c: &Chunk) -> Box<dyn ChunkTap + 't>;
}

/// [`Tap`]'s pass over one chunk.
pub trait ChunkTap {
    /// Takes record `r`. For a sample whose user stack it unwound, it leaves the frames
    /// in `frames` and returns the outcome: the resolve counts those, and unwinds no
    /// sample itself when there is a tap.
    fn record(
        &mut self,
        r: &Rec<'_>,
        w: Option<&mut unwind::Worker>,
        frames: &mut Vec<Frame>,
    ) -> Result<Option<Outcome>>;
    /// The chunk's records are all taken.
    fn done(self: Box<Self>) -> Result<()>;
}

/// How the resolve gets a sample's user stack: unwinds it, or takes what a [`Tap`]
/// unwound (nothing when the tap did not unwind it).
enum Stack<'f> {
    Unwind,
    Tapped(Option<(&'f [Frame], Outcome)>),
}

/// What the workers need besides the chunk.
pub struct Resolver<'a> {
    model: &'a Model,
    layouts: Vec<SampleLayout>,
    regs_masks: Vec<u64>,
    id_to_attr: HashMap<u64, usize>,
    sample_type0: u64,
    /// The sample-id trailer of non-sample records (the first attr's, as perf reads
    /// it): a deferred user callchain's pid and time.
    trailer: TrailerLayout,
    time_mode: bool,
    e: Endian,
    unwind: Option<(UnwindConfig, &'a UnwindTables)>,
}

/// Per-chunk (and, merged, per-run) counts.
#[derive(Clone, Debug, Default)]
pub struct Hits {
    /// Samples touching each DSO, indexed by [`DsoId`].
    pub per_dso: Vec<u64>,
    /// Samples decoded.
    pub samples: u64,
    /// Samples of guest machines (not modelled).
    pub guest_samples: u64,
    /// Addresses (IPs, callchain entries, branch ends) that fell in no mapping.
    pub unmapped: u64,
    /// Samples whose event could not be identified.
    pub unknown_event: u64,
    /// Samples whose user stack was unwound.
    pub unwound_samples: u64,
    /// Return addresses found by unwinding.
    pub unwound_frames: u64,
    /// Samples whose unwinding ran out of time (their DSOs found so far are kept).
    pub over_budget: u64,
    /// Samples whose unwinding reached the frame cap.
    pub frame_capped: u64,
    /// Smallest and largest non-zero sample time.
    pub min_time: Option<u64>,
    /// See `min_time`.
    pub max_time: Option<u64>,
}

impl Hits {
    fn new(n: usize) -> Self {
        Hits {
            per_dso: vec![0; n],
            ..Hits::default()
        }
    }

    /// Adds `o` (a later chunk or batch) to these counts.
    pub fn merge(&mut self, o: Hits) {
        if self.per_dso.len() < o.per_dso.len() {
            self.per_dso.resize(o.per_dso.len(), 0);
        }
        for (a, b) in self.per_dso.iter_mut().zip(o.per_dso) {
            *a += b;
        }
        self.samples += o.samples;
        self.guest_samples += o.guest_samples;
        self.unmapped += o.unmapped;
        self.unknown_event += o.unknown_event;
        self.unwound_samples += o.unwound_samples;
        self.unwound_frames += o.unwound_frames;
        self.over_budget += o.over_budget;
        self.frame_capped += o.frame_capped;
        self.min_time = [self.min_time, o.min_time].into_iter().flatten().min();
        self.max_time = [self.max_time, o.max_time].into_iter().flatten().max();
    }
}

/// Slots of [`Scratch::seen`].
const SEEN_SLOTS: usize = 256;

/// Scratch reused for every sample of a chunk.
struct Scratch<'m> {
    touched: Vec<DsoId>,
    last: Option<(u32, MapEntry)>,
    /// Mappings found by earlier samples of the chunk, each with the keys over which
    /// its process sees it unchanged, by address: the next sample in the same code
    /// is answered without a search (a JIT's process has tens of thousands of
    /// mappings, and a search of them was most of a resolve).
    seen: Vec<Option<(u32, MapEntry, Seen)>>,
    /// The sample's address spaces (kernel, process), found once per sample.
    spaces: [Option<(u32, Option<Space<'m>>)>; 2],
}

impl<'m> Scratch<'m> {
    /// Forgets the previous sample.
    fn reset(&mut self) {
        self.touched.clear();
        self.last = None;
        self.spaces = [None, None];
    }

    /// The address space `pid` of the current sample (at `key`).
    #[inline]
    fn space(&mut self, model: &'m Model, pid: u32, key: Key) -> Option<Space<'m>> {
        for (p, sp) in self.spaces.iter().flatten() {
            if *p == pid {
                return *sp;
            }
        }
        let sp = model.space(pid, key);
        let slot = if self.spaces[0].is_none() { 0 } else { 1 };
        self.spaces[slot] = Some((pid, sp));
        sp
    }

    /// Looks `addr` up in `space` at `key` and marks its DSO; the last mapping found
    /// answers first, since neighbouring entries of one sample share DSOs.
    #[inline]
    fn look(&mut self, model: &'m Model, space: u32, addr: u64, key: Key, unmapped: &mut u64) {
        let slot = (addr >> 6) as usize % SEEN_SLOTS;
        let m = match self.last {
            Some((sp, m)) if sp == space && m.start <= addr && addr < m.end => m,
            _ => match self.seen.get(slot).copied().flatten() {
                Some((sp, m, seen))
                    if sp == space && m.start <= addr && addr < m.end && seen.holds(key) =>
                {
                    self.last = Some((space, m));
                    m
                }
                _ => match self
                    .space(model, space, key)
                    .and_then(|s| s.lookup_seen(addr))
                {
                    Some((m, seen)) => {
                        self.last = Some((space, m));
                        if let (Some(seen), Some(s)) = (seen, self.seen.get_mut(slot)) {
                            *s = Some((space, m, seen));
                        }
                        m
                    }
                    None => {
                        *unmapped += 1;
                        return;
                    }
                },
            },
        };
        // Only code counts: an address in a data mapping (a locale archive, a
        // library's .data) is a stray stack word, not a frame of that file.
        if let Some(d) = m.dso.filter(|_| m.exec) {
            self.touch(d);
        }
    }

    /// Marks DSO `d` as touched by the current sample.
    #[inline]
    fn touch(&mut self, d: DsoId) {
        if !self.touched.contains(&d) {
            self.touched.push(d);
        }
    }
}

impl<'a> Resolver<'a> {
    /// Prepares sample layouts and the id → event table.
    pub fn new(model: &'a Model, attrs: &[Attr], time_mode: bool, e: Endian) -> Self {
        let mut id_to_attr = HashMap::new();
        for (i, a) in attrs.iter().enumerate() {
            for &id in &a.ids {
                id_to_attr.entry(id).or_insert(i);
            }
        }
        Resolver {
            model,
            layouts: attrs.iter().map(SampleLayout::new).collect(),
            regs_masks: attrs.iter().map(|a| a.sample_regs_user).collect(),
            id_to_attr,
            sample_type0: attrs[0].sample_type,
            trailer: TrailerLayout::new(attrs[0].sample_type, attrs[0].sample_id_all()),
            time_mode,
            e,
            unwind: None,
        }
    }

    /// Also unwind user stacks of samples that carry them.
    pub fn with_unwinding(mut self, cfg: UnwindConfig, tables: &'a UnwindTables) -> Self {
        if cfg.mode != UnwindMode::None {
            self.unwind = Some((cfg, tables));
        }
        self
    }

    /// Resolves every chunk on the current rayon pool and merges in chunk order;
    /// chunks not begun when `stop` turns true end the run with [`Error::Stopped`].
    /// With a `tap`, each chunk's records go through it too (see [`Tap`]).
    pub fn run(
        &self,
        files: &[DataFile],
        chunks: &[Chunk],
        progress: &(dyn Fn(u64) + Sync),
        stop: &AtomicBool,
        tap: Option<&dyn Tap>,
    ) -> Result<Hits> {
        let workers = unwind::WorkerSlots::new(rayon::current_num_threads());
        let arch = self.unwind.map(|(cfg, tables)| (cfg.arch, tables));
        let results: Vec<Result<Hits>> = chunks
            .par_iter()
            .map(|c| {
                if stop.load(Ordering::Relaxed) {
                    return Err(Error::Stopped);
                }
                let r = workers.with(arch, |w| self.chunk(files, c, w, tap));
                progress(c.end - c.start);
                r
            })
            .collect();
        if let Some((_, tables)) = self.unwind {
            workers.park_all(tables);
        }
        let mut total = Hits::new(self.model.dsos.len());
        for r in results {
            total.merge(r?);
        }
        Ok(total)
    }

    /// Resolves one chunk (its records handed to `tap` too, when there is one).
    pub fn chunk(
        &self,
        files: &[DataFile],
        c: &Chunk,
        mut w: Option<&mut unwind::Worker>,
        tap: Option<&dyn Tap>,
    ) -> Result<Hits> {
        let df = files
            .get(c.file)
            .ok_or_else(|| Error::Internal("chunk of an unknown data file".into()))?;
        let mut hits = Hits::new(self.model.dsos.len());
        let mut sc = Scratch {
            touched: Vec::with_capacity(64),
            last: None,
            seen: vec![None; SEEN_SLOTS],
            spaces: [None, None],
        };
        let mut walker = Walker::new(self.e, c.first_seq);
        let mut tap = tap.map(|t| t.chunk(c));
        let mut frames = Vec::new();
        let mut on_rec = |r: &Rec<'_>| -> Result<()> {
            let stack = match &mut tap {
                Some(t) => {
                    let o = t.record(r, w.as_deref_mut(), &mut frames)?;
                    Stack::Tapped(o.map(|o| (frames.as_slice(), o)))
                }
                None => Stack::Unwind,
            };
            match r.header.kind {
                rt::SAMPLE => self.sample(r, &mut hits, &mut sc, w.as_deref_mut(), stack)?,
                rt::CALLCHAIN_DEFERRED => self.deferred(r, &mut hits, &mut sc)?,
                _ => {}
            }
            Ok(())
        };
        walker
            .walk(
                df,
                c.start,
                c.end,
                // Limits policy: a chunk is mapped a bounded window at a time.
                (c.end - c.start).min(crate::limits::MAX_RESOLVE_WINDOW),
                &mut on_rec,
                &mut |_, _| Ok(()),
            )
            .map_err(|e| e.in_file(&df.path))?;
        if let Some(t) = tap {
            t.done()?;
        }
        Ok(hits)
    }

    /// A PERF_RECORD_CALLCHAIN_DEFERRED record: the user part of the callchains of
    /// earlier samples of its thread (`--call-graph fp,defer`), whose own chains end
    /// at PERF_CONTEXT_USER_DEFERRED. Its addresses are looked up in the address
    /// space of the process its trailer names, at its own time: the user code the
    /// samples ran is that process's at that moment, whichever samples perf joins it
    /// to (by tid, then cookie). Its DSOs count as touched by one sample.
    fn deferred(&self, r: &Rec<'_>, hits: &mut Hits, sc: &mut Scratch<'a>) -> Result<()> {
        let e = self.e;
        let d = CallchainDeferred::parse(r.bytes, e, self.trailer.size).ok_or_else(|| {
            Error::format(
                r.offset,
                format!(
                    "{}CALLCHAIN_DEFERRED record of size {}: its addresses do not fit in it",
                    if r.inner { "compressed " } else { "" },
                    r.bytes.len()
                ),
            )
        })?;
        if matches!(r.header.cpumode(), misc::GUEST_KERNEL | misc::GUEST_USER) {
            return Ok(());
        }
        let id = self.trailer.read(r.bytes, e);
        // Without sample_id_all nothing names the process: nothing to look up in
        // (perf joins such a record to no sample either).
        let Some(pid) = id.pid else {
            return Ok(());
        };
        if let Some(t) = id.time.filter(|&t| t != 0) {
            hits.min_time = Some(hits.min_time.map_or(t, |m| m.min(t)));
            hits.max_time = Some(hits.max_time.map_or(t, |m| m.max(t)));
        }
        let key = Key::new(
            if self.time_mode {
                id.time.unwrap_or(0)
            } else {
                0
            },
            r.seq,
        );
        sc.reset();
        for ip in u64s(d.ips, e).filter(|&ip| ip < callchain::CONTEXT_MAX) {
            sc.look(self.model, pid, ip, key, &mut hits.unmapped);
        }
        for &d in &sc.touched {
            if let Some(h) = hits.per_dso.get_mut(d as usize) {
                *h += 1;
            }
        }
        Ok(())
    }

    fn sample(
        &self,
        r: &Rec<'_>,
        hits: &mut Hits,
        sc: &mut Scratch<'a>,
        w: Option<&mut unwind::Worker>,
        stack: Stack<'_>,
    ) -> Result<()> {
        let e = self.e;
        prefetch_after(r.bytes);
        let ai = if self.layouts.len() == 1 {
            0
        } else {
            match sample_id(r.bytes, e, self.sample_type0).and_then(|id| self.id_to_attr.get(&id)) {
                Some(&i) => i,
                None => {
                    hits.unknown_event += 1;
                    return Ok(());
                }
            }
        };
        let s = self.layouts[ai].decode(r.bytes, e).map_err(|err| {
            Error::format(
                r.offset,
                format!(
                    "{}SAMPLE record of size {}: {} (at byte {})",
                    if r.inner { "compressed " } else { "" },
                    r.bytes.len(),
                    err.what,
                    err.at
                ),
            )
        })?;
        hits.samples += 1;
        if let Some(t) = s.time.filter(|&t| t != 0) {
            hits.min_time = Some(hits.min_time.map_or(t, |m| m.min(t)));
            hits.max_time = Some(hits.max_time.map_or(t, |m| m.max(t)));
        }
        let cpumode = r.header.cpumode();
        if matches!(cpumode, misc::GUEST_KERNEL | misc::GUEST_USER) {
            hits.guest_samples += 1;
            return Ok(());
        }
        let key = Key::new(
            if self.time_mode {
                s.time.unwrap_or(0)
            } else {
                0
            },
            r.seq,
        );
        let pid = s.pid;
        let model = self.model;
        sc.reset();
        if let Some(ip) = s.ip {
            match (cpumode, pid) {
                (misc::KERNEL, _) => sc.look(model, KERNEL_PID, ip, key, &mut hits.unmapped),
                (misc::USER, Some(pid)) => sc.look(model, pid, ip, key, &mut hits.unmapped),
                _ => {}
            }
        }
        if !s.callchain.is_empty() {
            callchain::walk(u64s(s.callchain, e), |space, addr| match (space, pid) {
                (callchain::Space::Kernel, _) => {
                    sc.look(model, KERNEL_PID, addr, key, &mut hits.unmapped)
                }
                (callchain::Space::User, Some(pid)) => {
                    sc.look(model, pid, addr, key, &mut hits.unmapped)
                }
                _ => {}
            });
        }
        for entry in s.branches.chunks_exact(24) {
            for addr in [e.u64(entry, 0), e.u64(entry, 8)]
                .into_iter()
                .flatten()
                .filter(|&a| a != 0)
            {
                // Branch entries carry no cpumode; the kernel lives in the upper half.
                let space = match pid {
                    Some(p) if addr >> 63 == 0 => p,
                    _ => KERNEL_PID,
                };
                sc.look(model, space, addr, key, &mut hits.unmapped);
            }
        }
        if let (Some((cfg, tables)), Some(w), Some(pid)) = (self.unwind, w, pid)
            && s.regs_abi != 0
            && !s.stack_user.is_empty()
        {
            let mut on_frame = |f: Frame| match f {
                Frame::Dso(d) => sc.touch(d),
                Frame::Address(addr) => sc.look(model, pid, addr, key, &mut hits.unmapped),
            };
            let o = match stack {
                Stack::Unwind => {
                    let stack = SampleStack {
                        pid,
                        key,
                        regs_mask: self.regs_masks[ai],
                        regs: s.regs_user,
                        stack: s.stack_user,
                        e,
                    };
                    Some(unwind::unwind(
                        &cfg,
                        model,
                        tables,
                        w,
                        &stack,
                        &mut on_frame,
                    ))
                }
                Stack::Tapped(Some((frames, o))) => {
                    frames.iter().for_each(|&f| on_frame(f));
                    Some(o)
                }
                Stack::Tapped(None) => None,
            };
            if let Some(o) = o {
                hits.unwound_samples += 1;
                hits.unwound_frames += o.frames as u64;
                hits.over_budget += u64::from(o.over_budget);
                hits.frame_capped += u64::from(o.frame_capped);
            }
        }
        for &d in &sc.touched {
            if let Some(h) = hits.per_dso.get_mut(d as usize) {
                *h += 1;
            }
        }
        Ok(())
    }
}

/// Bytes after a record that [`prefetch_after`] asks the CPU for: the next sample's
/// header, registers and the top of its stack.
const PREFETCH_BYTES: usize = 1024;

/// Starts loading the record after `rec` into the cache while this one is worked on.
/// Samples of `--call-graph dwarf` are kilobytes apart, too far for the hardware
/// prefetcher, and each began with cache misses on its header and its stack's top
/// (5 % of the resolve's CPU on dwarf-med).
fn prefetch_after(rec: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        // Only addresses are computed (wrapping, never dereferenced): a prefetch of
        // an address past the window, or unmapped, does nothing.
        let next = rec.as_ptr().wrapping_add(rec.len());
        for off in (0..PREFETCH_BYTES).step_by(64) {
            // SAFETY: a prefetch reads nothing the program sees and cannot fault.
            unsafe {
                std::arch::x86_64::_mm_prefetch(
                    next.wrapping_add(off).cast::<i8>(),
                    std::arch::x86_64::_MM_HINT_T0,
                );
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = rec;
}
